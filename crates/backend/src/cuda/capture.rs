//! CUDA graph captures beside other threads' CUDA work.
//!
//! ONNX Runtime captures a session's CUDA graph inside one of its runs (the third on a
//! thread: two ordinary runs first, so that its memory arena has grown to size), in CUDA's
//! *global* capture mode. While one thread captures in that mode, a "potentially unsafe"
//! CUDA call (`cudaMalloc`, a synchronous copy, a stream synchronisation) from any other
//! thread that is itself in the default, global, interaction mode is refused and
//! invalidates the capture. With several model instances, one instance's capture met the
//! others' runs and failed, which is why `--cuda-graph` used to work with one instance only.
//!
//! Two things make captures safe beside other work:
//! - every thread that calls CUDA through Peregrine (model instance threads, the threads
//!   that build and drop sessions, the GPU decoders) switches its own interaction mode to
//!   *thread-local* once ([`isolate_this_thread`], `cuThreadExchangeStreamCaptureMode`):
//!   such a thread ignores other threads' captures and is never refused because of them,
//!   while its own captures stay protected against its own unsafe calls;
//! - captures take turns ([`CaptureTurns`]): the runs of a session up to and including the
//!   capturing one hold a process-wide lock, so two instances' captures never overlap.
//!
//! Nothing is linked: the driver is opened at run time, and where it is missing (a CPU
//! machine) [`isolate_this_thread`] does nothing.

use std::cell::Cell;
use std::ffi::c_int;
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};

use libloading::Library;

/// `CU_STREAM_CAPTURE_MODE_THREAD_LOCAL`.
const MODE_THREAD_LOCAL: c_int = 1;

type ExchangeMode = unsafe extern "C" fn(*mut c_int) -> c_int;

/// The driver and its `cuThreadExchangeStreamCaptureMode`, or `None` without a driver.
static EXCHANGE: OnceLock<Option<(Library, ExchangeMode)>> = OnceLock::new();

fn exchange_mode() -> Option<ExchangeMode> {
    EXCHANGE
        .get_or_init(|| {
            // SAFETY: loading the CUDA driver runs its initialisers, which is what it is for.
            let lib = unsafe { Library::new("libcuda.so.1") }.ok()?;
            // SAFETY: the symbols' types are the ones cuda.h declares.
            let init: unsafe extern "C" fn(u32) -> c_int = *unsafe { lib.get(b"cuInit\0") }.ok()?;
            // SAFETY: as above.
            let f: ExchangeMode = *unsafe { lib.get(b"cuThreadExchangeStreamCaptureMode\0") }.ok()?;
            // The driver refuses every call before cuInit (CUDA_ERROR_NOT_INITIALIZED), and
            // the first thread to get here may be building the first session. cuInit is
            // idempotent; ONNX Runtime calls it too.
            // SAFETY: plain call, flags must be 0.
            if unsafe { init(0) } != 0 {
                return None;
            }
            Some((lib, f))
        })
        .as_ref()
        .map(|(_, f)| *f)
}

thread_local! {
    static ISOLATED: Cell<bool> = const { Cell::new(false) };
}

/// Puts the calling thread in CUDA's thread-local capture interaction mode, once per
/// thread, so that another thread's graph capture neither refuses this thread's CUDA calls
/// nor is invalidated by them. Cheap after the first call on a thread; does nothing where
/// there is no CUDA driver.
pub fn isolate_this_thread() {
    ISOLATED.with(|done| {
        if done.replace(true) {
            return;
        }
        let Some(exchange) = exchange_mode() else {
            return;
        };
        let mut mode = MODE_THREAD_LOCAL;
        // SAFETY: writes the thread's previous mode into `mode`; no other effect.
        let code = unsafe { exchange(&mut mode) };
        if code != 0 {
            tracing::warn!(
                code,
                "cuThreadExchangeStreamCaptureMode failed; CUDA graph captures on other threads may fail"
            );
        }
    });
}

/// Runs a session makes before its CUDA graph is captured, the capturing run included
/// (ONNX Runtime's CUDA provider: two ordinary runs, then the capture).
pub const RUNS_UNTIL_CAPTURED: u32 = 3;

/// Serialises every session's capturing runs in the process.
static CAPTURE_LOCK: Mutex<()> = Mutex::new(());

/// Which of a session's runs must take the process-wide capture turn: the first
/// [`RUNS_UNTIL_CAPTURED`] when it captures a CUDA graph, none otherwise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaptureTurns {
    left: u32,
}

impl CaptureTurns {
    pub fn new(captures_graph: bool) -> Self {
        Self {
            left: if captures_graph { RUNS_UNTIL_CAPTURED } else { 0 },
        }
    }

    /// Whether the next run must hold the capture lock; counts that run.
    pub fn next_run_needs_turn(&mut self) -> bool {
        if self.left == 0 {
            return false;
        }
        self.left -= 1;
        true
    }

    /// Takes the capture lock for the next run if it needs it; held until dropped.
    pub fn take(&mut self) -> Option<MutexGuard<'static, ()>> {
        self.next_run_needs_turn()
            .then(|| CAPTURE_LOCK.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Runs until the session costs what it will cost from now on: through the capture and
    /// one replay with a graph, two ordinary runs without.
    pub fn warm_up_runs(captures_graph: bool) -> usize {
        if captures_graph {
            RUNS_UNTIL_CAPTURED as usize + 1
        } else {
            2
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_graph_session_takes_the_turn_for_its_runs_up_to_the_capture_only() {
        let mut turns = CaptureTurns::new(true);
        let needs: Vec<bool> = (0..5).map(|_| turns.next_run_needs_turn()).collect();
        assert_eq!(needs, [true, true, true, false, false]);
        let mut plain = CaptureTurns::new(false);
        assert!(!plain.next_run_needs_turn());
        assert!(plain.take().is_none());
    }

    #[test]
    fn warm_up_reaches_a_replay_with_a_graph() {
        assert_eq!(CaptureTurns::warm_up_runs(true), 4);
        assert_eq!(CaptureTurns::warm_up_runs(false), 2);
    }

    #[test]
    fn turns_are_exclusive_across_threads() {
        // While one session holds its turn, another thread cannot take one.
        let mut a = CaptureTurns::new(true);
        let held = a.take().expect("a graph session's first run takes the turn");
        let blocked = std::thread::spawn(|| CAPTURE_LOCK.try_lock().is_err())
            .join()
            .unwrap();
        assert!(blocked);
        drop(held);
        let free = std::thread::spawn(|| CAPTURE_LOCK.try_lock().is_ok())
            .join()
            .unwrap();
        assert!(free);
    }

    #[test]
    fn isolating_a_thread_without_a_driver_does_nothing_and_is_idempotent() {
        // On CI there is no libcuda: nothing to call, no panic. On a GPU machine the first
        // call switches the mode and the second is a no-op.
        isolate_this_thread();
        isolate_this_thread();
        assert!(ISOLATED.with(Cell::get));
    }
}
