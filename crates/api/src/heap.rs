//! `GET /debug/pprof/heap` (admin scope, with profiling enabled): the process's heap as
//! glibc's allocator sees it, from `mallinfo2`.
//!
//! The cheap summary there is: every allocation in the process goes through glibc's
//! `malloc` (Rust's, ONNX Runtime's C++ arena, the decoders'), so its totals cover what a
//! Rust-only allocator profile would miss, at the price of having no allocation sites. It
//! walks each arena's free lists under its lock (some milliseconds on a fragmented heap):
//! on the blocking pool, and only when asked.

use axum::extract::State;
use axum::Json;
use serde::Serialize;

use crate::profiling::ProfileError;
use crate::{ApiError, AppState};

/// glibc's totals over every arena, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct HeapSummary {
    pub allocator: &'static str,
    /// Allocated and not freed: heap chunks in use plus mapped blocks.
    pub in_use_bytes: u64,
    /// Obtained from the system with `brk`/arena heaps (in use or free).
    pub heap_bytes: u64,
    /// Blocks too large for the heap, each its own mapping (`M_MMAP_THRESHOLD`).
    pub mmapped_bytes: u64,
    /// Free inside the heap: kept by the allocator, not returned to the system.
    pub free_bytes: u64,
    /// Free at the top of the main heap, which `malloc_trim` would return.
    pub releasable_bytes: u64,
    /// Free chunks: many small ones mean fragmentation.
    pub free_chunks: u64,
}

impl HeapSummary {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    pub fn now() -> Option<Self> {
        // SAFETY: mallinfo2 takes each arena's lock and only reads the allocator's state.
        let m = unsafe { libc::mallinfo2() };
        let b = |n: usize| n as u64;
        Some(Self {
            allocator: "glibc",
            in_use_bytes: b(m.uordblks) + b(m.hblkhd),
            heap_bytes: b(m.arena),
            mmapped_bytes: b(m.hblkhd),
            free_bytes: b(m.fordblks),
            releasable_bytes: b(m.keepcost),
            free_chunks: b(m.ordblks),
        })
    }

    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    pub fn now() -> Option<Self> {
        None
    }
}

/// `GET /debug/pprof/heap`.
pub(crate) async fn heap(State(state): State<AppState>) -> Result<Json<HeapSummary>, ApiError> {
    state.profiler.as_ref().ok_or(ProfileError::Disabled)?;
    tokio::task::spawn_blocking(HeapSummary::now)
        .await
        .map_err(|e| ProfileError::Failed(e.to_string()))?
        .map(Json)
        .ok_or_else(|| ProfileError::Failed("no heap summary: the allocator is not glibc's".into()).into())
}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    use super::*;

    #[test]
    fn the_summary_sees_a_large_allocation() {
        let before = HeapSummary::now().unwrap();
        let block = vec![1u8; 64 << 20];
        let during = HeapSummary::now().unwrap();
        assert!(
            during.in_use_bytes >= before.in_use_bytes + (60 << 20),
            "{before:?} -> {during:?}"
        );
        assert_eq!(during.allocator, "glibc");
        drop(block);
    }
}
