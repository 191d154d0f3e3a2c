//! Serving a request with the model's fallback (`fallback` in its `config.toml`) when the
//! model itself cannot answer in time: at admission, when its engine is diverting (the
//! expected wait passed the objective; `peregrine_engine::divert` keeps it from flapping)
//! or has no room; and after the body is read, when the engine refuses a single image for
//! its backlog or a full queue (before any work is spent on it). The answer names the model
//! and version that served it. When the fallback cannot take the request either, the
//! model's own answer stands (a 429 as without a fallback). Requests that name a version,
//! or say `fallback=false`, are never moved.

use peregrine_engine::{AdmissionPermit, Engine, RequestError};

use crate::{ApiError, AppState};

/// Why a request went to the fallback, as `peregrine_fallbacks_total` labels it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reason {
    /// The model's expected wait is past its objective.
    Objective,
    /// The model has no room for another request in flight.
    Overloaded,
    /// The model refused the image for its backlog or a full queue.
    Backlogged,
}

impl Reason {
    fn as_str(self) -> &'static str {
        match self {
            Self::Objective => "objective",
            Self::Overloaded => "overloaded",
            Self::Backlogged => "backlogged",
        }
    }
}

/// Whether a refusal is one the fallback may answer instead: the request was turned away
/// before any work was spent on it, for lack of time or room.
pub(crate) fn is_refusal(e: &ApiError) -> bool {
    matches!(
        e,
        ApiError::Request(RequestError::Backlogged { .. } | RequestError::QueueFull { .. })
    )
}

impl AppState {
    /// The ready engine of `engine`'s model's fallback, if it names one other than itself.
    pub(crate) fn fallback_of(&self, engine: &Engine) -> Option<Engine> {
        let snapshot = self.registry.snapshot();
        let name = snapshot
            .models
            .get(engine.name())?
            .settings
            .as_ref()?
            .fallback
            .clone()?;
        if name == engine.name() {
            return None;
        }
        snapshot.route(&name, None).ok().filter(Engine::is_ready)
    }

    /// Admits a request on `engine`, or on its fallback when `allowed` and the engine is
    /// diverting or full. Returns the engine that admitted it.
    pub(crate) fn admit(&self, engine: Engine, allowed: bool) -> Result<(Engine, AdmissionPermit), ApiError> {
        if allowed && engine.diverting() {
            if let Some(moved) = self.try_fallback(&engine, Reason::Objective) {
                return Ok(moved);
            }
        }
        match engine.try_admit() {
            Ok(permit) => Ok((engine, permit)),
            Err(e) => match allowed
                .then(|| self.try_fallback(&engine, Reason::Overloaded))
                .flatten()
            {
                Some(moved) => Ok(moved),
                None => Err(e.into()),
            },
        }
    }

    /// The fallback's engine and a permit on it, counted, if it can take the request now.
    pub(crate) fn try_fallback(&self, engine: &Engine, reason: Reason) -> Option<(Engine, AdmissionPermit)> {
        let fallback = self.fallback_of(engine)?;
        let permit = fallback.try_admit().ok()?;
        metrics::counter!(
            "peregrine_fallbacks_total",
            "model" => engine.name().to_string(),
            "fallback" => fallback.name().to_string(),
            "reason" => reason.as_str(),
        )
        .increment(1);
        Some((fallback, permit))
    }
}
