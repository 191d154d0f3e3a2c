//! Serving a request with the model's fallback (`fallback` in its `config.toml`) when the
//! model itself cannot answer in time: at admission, when its engine is diverting (the
//! expected wait passed the objective; `peregrine_engine::divert` keeps it from flapping)
//! or has no room; and after the request is read, when the engine refuses a single image
//! or tensor for its backlog or a full queue (before any work is spent on it). The answer
//! names the model and version that served it. When the fallback cannot take the request
//! (no room, or not its inputs), the model's own answer stands (a 429 as without a
//! fallback). Requests that name a version, or say `fallback=false`, are never moved.
//!
//! One decision for `/v1/detect`, KServe REST and gRPC: [`AppState::admission`] before the
//! request's content is read, [`Admission::settle`] once it is known whether the request
//! refuses the fallback and whether the fallback can take its inputs, and
//! [`AppState::after_refusal`] when the model refused it after all.

use peregrine_engine::{AdmissionPermit, Engine, RequestError};

use crate::{ApiError, AppState};

/// Why a request went to the fallback, as `peregrine_fallbacks_total` labels it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reason {
    /// The model's expected wait is past its objective.
    Objective,
    /// The model has no room for another request in flight.
    Overloaded,
    /// The model refused the request for its backlog or a full queue.
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

/// Whether a request may go to its model's fallback: it names no version and does not
/// say `fallback=false`.
pub(crate) fn allowed(version: Option<u64>, fallback: Option<bool>) -> bool {
    version.is_none() && fallback != Some(false)
}

/// A request admitted, or held for its model's fallback until what only its content says
/// is known. Drop it to give the places it holds back.
#[derive(Debug)]
pub(crate) struct Admission {
    engine: Engine,
    /// The model's own permit, when it admitted the request at once.
    own: Option<AdmissionPermit>,
    /// The fallback's place, when the model is diverting or full.
    fallback: Option<(Engine, AdmissionPermit, Reason)>,
}

impl Admission {
    /// Where the request runs: on the fallback when it holds a place for it, the request
    /// allows it and `fits` says the fallback can take it (counted); otherwise on the
    /// model itself, whose refusal (429) stands when it has no room.
    pub(crate) fn settle(
        self,
        allowed: bool,
        fits: impl Fn(&Engine) -> bool,
    ) -> Result<(Engine, AdmissionPermit), ApiError> {
        if let Some((fallback, permit, reason)) = self.fallback {
            if allowed && fits(&fallback) {
                count(&self.engine, &fallback, reason);
                return Ok((fallback, permit));
            }
        }
        let permit = match self.own {
            Some(permit) => permit,
            None => self.engine.try_admit()?,
        };
        Ok((self.engine, permit))
    }
}

/// Whether a refusal is one the fallback may answer instead: the request was turned away
/// before any work was spent on it, for lack of time or room.
fn is_refusal(e: &ApiError) -> bool {
    matches!(
        e,
        ApiError::Request(RequestError::Backlogged { .. } | RequestError::QueueFull { .. })
    )
}

fn count(engine: &Engine, fallback: &Engine, reason: Reason) {
    metrics::counter!(
        "peregrine_fallbacks_total",
        "model" => engine.name().to_string(),
        "fallback" => fallback.name().to_string(),
        "reason" => reason.as_str(),
    )
    .increment(1);
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

    /// Admits a request on `engine`, or holds a place on its fallback when `may_move` (what
    /// is known of the request so far allows it) and the engine is diverting or full. A
    /// refusal comes at once: the model has no room and its fallback none either (or it
    /// has none), so nothing more is read or converted for the request.
    pub(crate) fn admission(&self, engine: Engine, may_move: bool) -> Result<Admission, ApiError> {
        let diverting = may_move && engine.diverting();
        let own = if diverting { None } else { Some(engine.try_admit()) };
        let full = match own {
            Some(Ok(permit)) => {
                return Ok(Admission {
                    engine,
                    own: Some(permit),
                    fallback: None,
                })
            }
            Some(Err(e)) => Some(e),
            None => None,
        };
        let reason = if diverting {
            Reason::Objective
        } else {
            Reason::Overloaded
        };
        let held = may_move
            .then(|| self.fallback_of(&engine))
            .flatten()
            .and_then(|f| Some((f.clone(), f.try_admit().ok()?, reason)));
        match (held, full) {
            (Some(fallback), _) => Ok(Admission {
                engine,
                own: None,
                fallback: Some(fallback),
            }),
            (None, Some(refused)) => Err(refused.into()),
            // Diverting, but the fallback cannot take it: the model serves it if it can.
            (None, None) => {
                let permit = engine.try_admit()?;
                Ok(Admission {
                    engine,
                    own: Some(permit),
                    fallback: None,
                })
            }
        }
    }

    /// Admits a request whose content is known already: [`AppState::admission`] settled
    /// at once (any request the fallback can take).
    pub(crate) fn admit(
        &self,
        engine: Engine,
        may_move: bool,
    ) -> Result<(Engine, AdmissionPermit), ApiError> {
        self.admission(engine, may_move)?.settle(may_move, |_| true)
    }

    /// After `engine` refused a request with `error`: the fallback's engine and a place on
    /// it (counted) when the refusal came before any work was spent, the request `may_move`
    /// (and is a single image or tensor, so nothing of it ran) and `fits` the fallback.
    pub(crate) fn after_refusal(
        &self,
        engine: &Engine,
        error: &ApiError,
        may_move: bool,
        fits: impl Fn(&Engine) -> bool,
    ) -> Option<(Engine, AdmissionPermit)> {
        if !may_move || !is_refusal(error) {
            return None;
        }
        let fallback = self.fallback_of(engine).filter(|f| fits(f))?;
        let permit = fallback.try_admit().ok()?;
        count(engine, &fallback, Reason::Backlogged);
        Some((fallback, permit))
    }
}
