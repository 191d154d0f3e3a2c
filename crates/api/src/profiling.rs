//! Live CPU profiles of the running server: `GET /debug/pprof/profile?seconds=N&format=svg|pprof`
//! (admin scope), with the `pprof` crate's sampling profiler.
//!
//! Nothing runs until a profile is asked for: the profiler's SIGPROF timer and handler
//! exist only while a [`pprof::ProfilerGuard`] lives, that is for the N seconds of one
//! request; the rest of the time the cost is an `Option` in the state. The endpoint is off
//! unless the server enables it (`--profiling`); one profile runs at a time, since the
//! process has one profiling timer.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use crate::{ApiError, AppState};

/// The longest profile one request may take.
pub const MAX_SECONDS: u64 = 60;
/// Samples a second: 99 rather than 100, so that sampling does not run in lockstep with
/// work that wakes every 10 ms (the common choice of Go's and Linux's profilers).
const FREQUENCY_HZ: i32 = 99;

/// Why a profile was not taken.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    #[error("profiling is off on this server: start it with --profiling true (PEREGRINE_PROFILING, or [profiling] enabled = true)")]
    Disabled,
    #[error("seconds must be a whole number from 1 to {MAX_SECONDS}, not {0:?}")]
    BadSeconds(String),
    #[error("format must be svg (a flamegraph) or pprof (protobuf for `go tool pprof`), not {0:?}")]
    BadFormat(String),
    #[error("a profile is already being recorded: one runs at a time; retry when it ends")]
    Busy,
    #[error("profiling failed: {0}")]
    Failed(String),
}

/// The server's profiler: present when profiling is enabled.
#[derive(Debug, Default)]
pub struct Profiler {
    busy: AtomicBool,
}

/// Marks the profiler busy for as long as it lives.
struct Running<'a>(&'a AtomicBool);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Svg,
    Pprof,
}

/// A validated request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProfileRequest {
    pub duration: Duration,
    pub format: Format,
}

#[derive(Debug, Deserialize)]
pub struct ProfileQuery {
    seconds: Option<String>,
    format: Option<String>,
}

impl ProfileQuery {
    /// Seconds default to 10 and formats to svg; anything else is refused with a reason.
    pub fn validate(&self) -> Result<ProfileRequest, ProfileError> {
        let seconds = match self.seconds.as_deref() {
            None => 10,
            Some(s) => s
                .parse::<u64>()
                .ok()
                .filter(|n| (1..=MAX_SECONDS).contains(n))
                .ok_or_else(|| ProfileError::BadSeconds(s.to_string()))?,
        };
        let format = match self.format.as_deref() {
            None | Some("svg") => Format::Svg,
            Some("pprof" | "proto") => Format::Pprof,
            Some(other) => return Err(ProfileError::BadFormat(other.to_string())),
        };
        Ok(ProfileRequest {
            duration: Duration::from_secs(seconds),
            format,
        })
    }
}

impl Profiler {
    /// Records the whole process for the request's duration and renders the report. A
    /// client that goes away ends the profile early: the guard is dropped with the future.
    pub async fn record(&self, request: ProfileRequest) -> Result<Vec<u8>, ProfileError> {
        if self.busy.swap(true, Ordering::AcqRel) {
            return Err(ProfileError::Busy);
        }
        let _running = Running(&self.busy);
        let guard = pprof::ProfilerGuardBuilder::default()
            .frequency(FREQUENCY_HZ)
            // Unwinding from a signal handler through these can deadlock (they hold locks
            // the unwinder takes, or are the unwinder).
            .blocklist(&["libc", "libgcc", "pthread", "vdso"])
            .build()
            .map_err(|e| ProfileError::Failed(e.to_string()))?;
        tracing::info!(seconds = request.duration.as_secs(), format = ?request.format, "CPU profile started");
        tokio::time::sleep(request.duration).await;
        // Symbolising and rendering take a while: off the runtime's workers.
        let rendered = tokio::task::spawn_blocking(move || render(&guard, request.format))
            .await
            .map_err(|e| ProfileError::Failed(e.to_string()))?;
        tracing::info!(seconds = request.duration.as_secs(), "CPU profile done");
        rendered
    }
}

fn render(guard: &pprof::ProfilerGuard<'_>, format: Format) -> Result<Vec<u8>, ProfileError> {
    let failed = |e: pprof::Error| ProfileError::Failed(e.to_string());
    let report = guard.report().build().map_err(failed)?;
    let mut out = Vec::new();
    match format {
        Format::Svg => report.flamegraph(&mut out).map_err(failed)?,
        Format::Pprof => {
            use pprof::protos::Message;
            let profile = report.pprof().map_err(failed)?;
            out = profile
                .write_to_bytes()
                .map_err(|e| ProfileError::Failed(e.to_string()))?;
        }
    }
    Ok(out)
}

/// `GET /debug/pprof/profile`.
pub(crate) async fn profile(
    State(state): State<AppState>,
    Query(query): Query<ProfileQuery>,
) -> Result<Response, ApiError> {
    let profiler: Arc<Profiler> = state.profiler.clone().ok_or(ProfileError::Disabled)?;
    let request = query.validate()?;
    let body = profiler.record(request).await?;
    let content_type = match request.format {
        Format::Svg => "image/svg+xml",
        Format::Pprof => "application/octet-stream",
    };
    Ok(([(header::CONTENT_TYPE, content_type)], body).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(seconds: Option<&str>, format: Option<&str>) -> Result<ProfileRequest, ProfileError> {
        ProfileQuery {
            seconds: seconds.map(str::to_string),
            format: format.map(str::to_string),
        }
        .validate()
    }

    #[test]
    fn requests_are_bounded_and_bad_ones_say_why() {
        assert_eq!(
            query(None, None).unwrap(),
            ProfileRequest {
                duration: Duration::from_secs(10),
                format: Format::Svg
            }
        );
        assert_eq!(query(Some("3"), Some("pprof")).unwrap().format, Format::Pprof);
        assert_eq!(query(Some("60"), None).unwrap().duration, Duration::from_secs(60));
        for bad in ["0", "61", "-1", "2.5", "ten", ""] {
            let e = query(Some(bad), None).unwrap_err();
            assert!(matches!(e, ProfileError::BadSeconds(_)), "{bad:?}");
            assert!(e.to_string().contains("from 1 to 60"), "{e}");
        }
        assert!(matches!(
            query(None, Some("png")),
            Err(ProfileError::BadFormat(_))
        ));
    }

    #[tokio::test]
    async fn a_second_profile_is_refused_while_one_runs() {
        let profiler = Arc::new(Profiler::default());
        let request = query(Some("1"), Some("pprof")).unwrap();
        let first = tokio::spawn({
            let p = profiler.clone();
            async move { p.record(request).await }
        });
        // The first holds the profiler from its first poll on.
        while !profiler.busy.load(Ordering::Acquire) {
            tokio::task::yield_now().await;
        }
        assert!(matches!(profiler.record(request).await, Err(ProfileError::Busy)));
        let profile = first.await.unwrap().unwrap();
        assert!(!profile.is_empty());
        assert!(!profiler.busy.load(Ordering::Acquire), "free again once done");
    }
}
