//! NVTX ranges: Peregrine's GPU stages by name on Nsight Systems' and Nsight Compute's
//! timelines ("jpeg decode", "letterbox kernel", "session run", "output copy").
//!
//! Loaded at run time like the rest of CUDA, and only when a profiler listens: NVIDIA's
//! tools announce themselves through `NVTX_INJECTION64_PATH`, so without it the library is
//! never opened and [`range`] costs one load of an initialised `OnceLock` and a branch.
//! With it, `libnvToolsExt.so.1` (CUDA's NVTX v2 library, which hands every call to the
//! injected profiler) is opened once; a missing library leaves ranges off, logged once.
//!
//! Ranges are per thread (push and pop), so a [`Range`] is a guard that cannot leave the
//! thread that opened it.

use std::ffi::{c_char, c_int, CStr, OsStr};
use std::marker::PhantomData;
use std::sync::OnceLock;

use libloading::Library;

/// The environment variable NVIDIA's profilers set to inject themselves into NVTX.
const INJECTION_ENV: &str = "NVTX_INJECTION64_PATH";
const LIBRARIES: &[&str] = &["libnvToolsExt.so.1", "libnvToolsExt.so"];

/// The two entry points ranges need.
#[derive(Debug)]
pub struct Api {
    push: unsafe extern "C" fn(*const c_char) -> c_int,
    pop: unsafe extern "C" fn() -> c_int,
    _lib: Option<Library>,
}

/// Opens NVTX when `injection` (the variable's value) names a profiler and one of
/// `libraries` loads; `None` otherwise.
pub fn load(injection: Option<&OsStr>, libraries: &[&str]) -> Option<Api> {
    injection.filter(|v| !v.is_empty())?;
    let lib = libraries.iter().find_map(|name| {
        // SAFETY: loading NVTX runs its initialisers, which only read the environment.
        unsafe { Library::new(name) }.ok()
    });
    let Some(lib) = lib else {
        tracing::info!(
            libraries = ?libraries,
            "a profiler is attached ({INJECTION_ENV}) but no NVTX library loads: Peregrine's stages will not be named"
        );
        return None;
    };
    // SAFETY: the symbols' types are those nvToolsExt.h declares.
    let api = unsafe {
        let push = *lib
            .get::<unsafe extern "C" fn(*const c_char) -> c_int>(b"nvtxRangePushA\0")
            .ok()?;
        let pop = *lib
            .get::<unsafe extern "C" fn() -> c_int>(b"nvtxRangePop\0")
            .ok()?;
        Api {
            push,
            pop,
            _lib: Some(lib),
        }
    };
    tracing::info!("NVTX ranges on: Peregrine's GPU stages are named on the profiler's timeline");
    Some(api)
}

fn api() -> Option<&'static Api> {
    static API: OnceLock<Option<Api>> = OnceLock::new();
    API.get_or_init(|| load(std::env::var_os(INJECTION_ENV).as_deref(), LIBRARIES))
        .as_ref()
}

/// An open NVTX range, closed when dropped, on the thread that opened it.
#[must_use = "the range closes when the guard is dropped"]
pub struct Range {
    api: Option<&'static Api>,
    /// Push and pop pair up per thread: the guard stays on its thread.
    _not_send: PhantomData<*const ()>,
}

/// Opens a range named `name` until the guard is dropped; nothing when no profiler listens.
#[inline]
pub fn range(name: &'static CStr) -> Range {
    range_on(api(), name)
}

fn range_on(api: Option<&'static Api>, name: &'static CStr) -> Range {
    if let Some(api) = api {
        // SAFETY: `name` is a NUL-terminated string that lives forever.
        unsafe { (api.push)(name.as_ptr()) };
    }
    Range {
        api,
        _not_send: PhantomData,
    }
}

impl Drop for Range {
    #[inline]
    fn drop(&mut self) {
        if let Some(api) = self.api {
            // SAFETY: pops the range this guard pushed on this same thread.
            unsafe { (api.pop)() };
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::*;

    thread_local! {
        static CALLS: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
    }

    unsafe extern "C" fn push(name: *const c_char) -> c_int {
        // SAFETY: `range_on` passes a NUL-terminated string.
        let name = unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned();
        CALLS.with(|c| c.borrow_mut().push(format!("push {name}")));
        0
    }

    unsafe extern "C" fn pop() -> c_int {
        CALLS.with(|c| c.borrow_mut().push("pop".into()));
        0
    }

    static RECORDER: Api = Api {
        push,
        pop,
        _lib: None,
    };

    #[test]
    fn without_a_profiler_or_a_library_nothing_loads() {
        assert!(
            load(None, LIBRARIES).is_none(),
            "no profiler: the library is not even opened"
        );
        assert!(load(Some(OsStr::new("")), LIBRARIES).is_none());
        let attached = Some(OsStr::new("/opt/nsight/libToolsInjection64.so"));
        assert!(load(attached, &["libperegrine-no-such-nvtx.so.1"]).is_none());
        // The guard of an absent NVTX does nothing, and the process-wide one is absent in
        // tests (no profiler).
        drop(range_on(None, c"nothing"));
        if std::env::var_os(INJECTION_ENV).is_none() {
            assert!(api().is_none());
        }
        drop(range(c"also nothing"));
    }

    #[test]
    fn guards_nest_and_close_in_reverse_order() {
        {
            let _batch = range_on(Some(&RECORDER), c"session run");
            {
                let _decode = range_on(Some(&RECORDER), c"jpeg decode");
                let _letterbox = range_on(Some(&RECORDER), c"letterbox kernel");
            }
            let _copy = range_on(Some(&RECORDER), c"output copy");
        }
        let calls = CALLS.with(|c| c.take());
        assert_eq!(
            calls,
            [
                "push session run",
                "push jpeg decode",
                "push letterbox kernel",
                "pop",
                "pop",
                "push output copy",
                "pop",
                "pop",
            ]
        );
    }
}
