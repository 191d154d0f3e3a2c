//! Shutdown in two steps, so that load balancers see it. When draining starts, the
//! listeners stay open: requests already admitted run to the end, new ones are answered
//! 503 at once, readiness answers 503, and every response says `Connection: close`. Only
//! when the last admitted request is answered do the listeners close.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use peregrine_engine::RequestError;
use tokio::sync::Notify;

use crate::body::discard_body;
use crate::{ApiError, AppState};

/// Whether the server is draining, and how many requests it is still answering.
#[derive(Debug, Default)]
pub struct Drain {
    draining: AtomicBool,
    in_flight: AtomicUsize,
    /// Woken whenever the last request in flight finishes while draining.
    idle: Notify,
}

/// One request being answered; dropping it counts the request out.
#[derive(Debug)]
pub struct InFlight(Arc<Drain>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let before = self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
        if before == 1 && self.0.is_draining() {
            self.0.idle.notify_waiters();
        }
    }
}

impl Drain {
    /// Starts draining: from now on [`Drain::enter`] refuses.
    pub fn start(&self) {
        self.draining.store(true, Ordering::SeqCst);
        if self.in_flight.load(Ordering::SeqCst) == 0 {
            self.idle.notify_waiters();
        }
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// Requests being answered now.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// Counts a new request in, unless draining has started.
    pub fn enter(self: &Arc<Self>) -> Option<InFlight> {
        // Counted in before the check: `start` then either sees this request in flight,
        // or this request sees the drain and leaves.
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        let guard = InFlight(self.clone());
        (!self.is_draining()).then_some(guard)
    }

    /// Resolves once draining has started and no request is left in flight.
    pub async fn finished(&self) {
        loop {
            let idle = self.idle.notified();
            tokio::pin!(idle);
            idle.as_mut().enable();
            if self.is_draining() && self.in_flight() == 0 {
                return;
            }
            idle.await;
        }
    }
}

/// Routes that answer while draining without counting as work: load balancers and
/// scrapers must keep reaching them until the listener closes.
fn is_probe(path: &str) -> bool {
    matches!(
        path,
        "/health/live" | "/health/ready" | "/v2/health/live" | "/v2/health/ready" | "/metrics"
    )
}

/// The HTTP side of [`Drain`]: counts requests in and out, refuses new ones while
/// draining, and adds `Connection: close` to every response sent while draining.
pub async fn gate(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let drain = &state.drain;
    let mut response = if is_probe(request.uri().path()) {
        next.run(request).await
    } else {
        match drain.enter() {
            Some(_in_flight) => next.run(request).await,
            None => {
                let (parts, body) = request.into_parts();
                discard_body(body, &parts.headers, &state.config);
                ApiError::from(RequestError::ShuttingDown).into_response()
            }
        }
    };
    if drain.is_draining() {
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn draining_refuses_new_requests_and_finishes_with_the_last_one() {
        let drain = Arc::new(Drain::default());
        let first = drain.enter().expect("admitted before draining");
        let second = drain.enter().expect("admitted before draining");
        assert_eq!(drain.in_flight(), 2);
        drain.start();
        assert!(drain.enter().is_none(), "refused while draining");
        assert_eq!(drain.in_flight(), 2, "a refused request is not counted");
        let finished = tokio::spawn({
            let drain = drain.clone();
            async move { drain.finished().await }
        });
        drop(first);
        tokio::task::yield_now().await;
        assert!(!finished.is_finished(), "one request is still in flight");
        drop(second);
        tokio::time::timeout(std::time::Duration::from_secs(10), finished)
            .await
            .expect("finished once the last request is answered")
            .unwrap();
    }

    #[tokio::test]
    async fn a_drain_with_nothing_in_flight_is_finished_at_once_and_not_before_it_starts() {
        let drain = Drain::default();
        let early = tokio::time::timeout(std::time::Duration::ZERO, drain.finished()).await;
        assert!(early.is_err(), "not finished before draining starts");
        drain.start();
        drain.finished().await;
    }
}
