//! Admission: a request's claim on capacity ([`AdmissionPermit`]) and the checks that
//! refuse at once what the engine cannot answer within its deadline, each refusal counted
//! by the stage it came at (`peregrine_refusals_total{stage}`).
//!
//! A request that passes the check before its body is read counts as ahead of later ones
//! from that moment (`Shared::admitted`) until it reaches a decoder: otherwise a burst of
//! requests arriving together would all see the same short queue, all be admitted, and
//! most be refused after reading and decoding their images, late and at a cost.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::OwnedSemaphorePermit;

use crate::request::RequestError;
use crate::service::Engine;
use crate::shared::Shared;
use crate::wait::Ahead;
use crate::{spans, telemetry};

/// Estimates are stretched by this much before they are held against a deadline, after
/// decoding: under overload the queue settles where estimates meet deadlines, so without
/// headroom the ordinary spread of batch times would carry a share of admitted requests
/// past theirs.
pub(crate) const QUEUEING_HEADROOM: f64 = 1.15;

/// The same, for the checks made before decoding. A promise made then has the decode's
/// spread ahead of it too (decoders share the cores with the model, most of all in a
/// burst), so it keeps a wider margin than the last check: otherwise a request admitted
/// at the margin is refused after decoding, late and after costing its upload and decode.
/// Measured against 1.15 and 1.5 (docs/benchmarks.md, "One margin before decoding,
/// another after"): 1.3 left no refusal after decoding at the same throughput.
pub(crate) const EARLY_HEADROOM: f64 = 1.3;

/// Where a refusal came: which work the request had cost by then.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stage {
    /// Before its body was read ([`Engine::check_admission`]).
    Admission,
    /// With its input in hand, before decoding or queueing it.
    BeforeDecode,
    /// After decoding, before taking a place in the queue.
    AfterDecode,
}

impl Stage {
    /// How much an estimate is stretched at this stage before it meets the deadline.
    fn headroom(self) -> f64 {
        match self {
            Self::Admission | Self::BeforeDecode => EARLY_HEADROOM,
            Self::AfterDecode => QUEUEING_HEADROOM,
        }
    }

    fn label(self) -> &'static str {
        match self {
            Self::Admission => "admission",
            Self::BeforeDecode => "before_decode",
            Self::AfterDecode => "after_decode",
        }
    }
}

/// A request's claim on capacity. Keep it until the response is sent.
#[derive(Debug)]
pub struct AdmissionPermit {
    _permit: OwnedSemaphorePermit,
    engine: Arc<Shared>,
    /// Counted in `Shared::admitted`: passed the early check, not yet at a decoder.
    pending: AtomicBool,
}

impl AdmissionPermit {
    /// The request reached its decoder (or the queue): it no longer counts as admitted
    /// and waiting, since the decoding count or the queue now holds it.
    pub(crate) fn settle(&self) {
        if self.pending.swap(false, Ordering::Relaxed) {
            self.engine.admitted.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl Drop for AdmissionPermit {
    fn drop(&mut self) {
        self.settle();
        let n = self.engine.in_flight.fetch_sub(1, Ordering::Relaxed) - 1;
        telemetry::in_flight(&self.engine.config.name, n);
    }
}

impl Engine {
    /// Takes a slot for one request, or says at once that there is none.
    pub fn try_admit(&self) -> Result<AdmissionPermit, RequestError> {
        let _span = spans::admission().entered();
        let shared = self.shared();
        let Ok(permit) = shared.admission.clone().try_acquire_owned() else {
            telemetry::refused(&shared.config.name, "in_flight");
            return Err(RequestError::Overloaded {
                limit: shared.config.max_in_flight,
            });
        };
        let n = shared.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        telemetry::in_flight(&shared.config.name, n);
        Ok(AdmissionPermit {
            _permit: permit,
            engine: shared.clone(),
            pending: AtomicBool::new(false),
        })
    }

    /// Whether one image with this deadline could be answered in time, judged before its
    /// body is read: a request refused here costs its client no upload and the server no
    /// memory. Optimistic where the image is unknown (a device decoder may take it without a
    /// host decode), so whatever passes here is judged again, exactly, once it is read, and
    /// counts as ahead of later requests from now on. A refusal counts as a failed request
    /// in the engine's statistics, as it would later.
    pub fn check_admission(&self, permit: &AdmissionPermit, deadline: Instant) -> Result<(), RequestError> {
        let shared = self.shared();
        let checked = self.check_admissible(deadline, !shared.device_jpeg, Stage::Admission);
        match checked {
            Ok(()) => {
                if !permit.pending.swap(true, Ordering::Relaxed) {
                    shared.admitted.fetch_add(1, Ordering::Relaxed);
                }
            }
            Err(_) => shared.stats.finished(false, Duration::ZERO),
        }
        checked
    }

    /// Refuses a request the engine cannot serve in time, before any work is spent on it.
    pub(crate) fn check_admissible(
        &self,
        deadline: Instant,
        decodes: bool,
        stage: Stage,
    ) -> Result<(), RequestError> {
        let shared = self.shared();
        if let Some(reason) = shared.no_instances.get() {
            return Err(RequestError::NoInstances {
                model: shared.config.name.clone(),
                reason: reason.clone(),
            });
        }
        if !self.is_ready() {
            return Err(RequestError::NotReady {
                model: shared.config.name.clone(),
            });
        }
        // Refuse now, with a 429 the client can act on, rather than decode and queue a
        // request that will certainly miss its deadline and end as a 504.
        self.check_backlog(deadline, shared.ahead(), decodes, stage)
    }

    /// Refuses a request whose estimated answer (see [`crate::wait`]), with headroom for
    /// the spread of batch times, comes after its deadline. An engine with nothing ahead
    /// of the request admits it whatever past batches cost, so that it keeps learning.
    pub(crate) fn check_backlog(
        &self,
        deadline: Instant,
        ahead: Ahead,
        decodes: bool,
        stage: Stage,
    ) -> Result<(), RequestError> {
        let shared = self.shared();
        if !shared.config.shed_on_backlog {
            return Ok(());
        }
        let now = Instant::now();
        let wait = shared.wait.load();
        if wait.is_idle(ahead) {
            return Ok(());
        }
        let expected = wait.estimate(ahead, decodes, now).mul_f64(stage.headroom());
        let budget = deadline.saturating_duration_since(now);
        if expected > budget {
            telemetry::refused(&shared.config.name, stage.label());
            return Err(RequestError::Backlogged {
                expected_ms: expected.as_millis() as u64,
                budget_ms: budget.as_millis() as u64,
            });
        }
        Ok(())
    }
}
