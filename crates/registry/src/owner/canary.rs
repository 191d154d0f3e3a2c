//! The owner's side of rollouts: starting one when a new version loads beside a serving
//! one (or on request), judging the canary on every tick with [`Rollout::observe`], and
//! carrying out the verdict. Rolling back takes the canary out of service the way a
//! retirement does: requests already on it finish there, new ones go to the stable
//! version, so no request fails because of a rollback.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Instant;

use super::{ModelState, Owner, Trigger};
use crate::plan::SyncPlan;
use crate::rollout::{Rollout, RolloutPolicy, Verdict};
use crate::settings::ModelSettings;
use crate::store::Fingerprint;
use crate::{RegistryError, RolloutAction, RolloutStatus, RolloutView};

/// How often rollouts in progress are judged. A breach is acted on within this of the
/// canary's window showing it.
pub(super) const JUDGE_EVERY: std::time::Duration = std::time::Duration::from_millis(250);

pub(super) struct ActiveRollout {
    pub plan: Rollout,
    routed: Arc<AtomicU64>,
}

impl ActiveRollout {
    fn new(plan: Rollout) -> Self {
        Self {
            plan,
            routed: Arc::new(AtomicU64::new(0)),
        }
    }

    pub fn view(&self) -> RolloutView {
        RolloutView::new(self.plan.clone(), self.routed.clone())
    }
}

/// A canary that was rolled back: it stays out of service until its files change or a
/// load request asks for it again.
pub(super) struct RolledBack {
    pub fingerprint: Fingerprint,
    pub reason: String,
}

/// The versions a sync may serve: those listed, less rolled-back ones whose files are
/// unchanged (unless a load request asked).
pub(super) fn servable(
    listed: Vec<(u64, Fingerprint)>,
    state: &ModelState,
    trigger: Trigger,
) -> Vec<(u64, Fingerprint)> {
    listed
        .into_iter()
        .filter(|(v, fp)| {
            trigger == Trigger::Request || state.rolled_back.get(v).is_none_or(|r| r.fingerprint != *fp)
        })
        .collect()
}

/// The version serving now that a rollout would keep: the stable of the one in progress,
/// else the highest loaded.
pub(super) fn serving_before(state: &ModelState) -> Option<u64> {
    state
        .rollout
        .as_ref()
        .map(|r| r.plan.stable)
        .or_else(|| state.loaded.keys().max().copied())
}

/// Keeps the serving version out of the plan's retirements while a rollout needs it: one
/// is in progress, or the model rolls new versions out and the plan loads a newer one.
pub(super) fn keep_serving(
    plan: &mut SyncPlan,
    state: &ModelState,
    settings: &ModelSettings,
    serving: Option<u64>,
) {
    let Some(serving) = serving else { return };
    let newer = plan.load.iter().any(|&v| v > serving);
    if state.rollout.is_some() || (settings.rollout.is_some() && newer) {
        plan.retire.retain(|&v| v != serving);
    }
}

/// After a sync's loads: a newer version that loaded beside the serving one becomes its
/// canary when the model rolls versions out; a rollout whose versions are gone ends.
pub(super) fn after_loads(
    name: &str,
    state: &mut ModelState,
    settings: &ModelSettings,
    serving: Option<u64>,
    loaded: &[u64],
) {
    for v in loaded {
        state.rolled_back.remove(v);
    }
    let newest = loaded.iter().copied().max();
    if let (Some(policy), Some(stable), Some(canary)) = (&settings.rollout, serving, newest) {
        if canary > stable && state.loaded.contains_key(&stable) {
            let plan = begin(stable, canary, policy.clone(), settings);
            tracing::info!(model = %name, stable, canary, percent = policy.canary_percent, "rolling a new version out as a canary");
            state.rollout = Some(ActiveRollout::new(plan));
            return;
        }
    }
    if let Some(r) = &state.rollout {
        if !(state.loaded.contains_key(&r.plan.stable) && state.loaded.contains_key(&r.plan.canary)) {
            tracing::info!(model = %name, stable = r.plan.stable, canary = r.plan.canary, "rollout ended: one of its versions is no longer loaded");
            state.rollout = None;
        }
    }
}

/// A rollout of `canary` beside `stable` starting now, its P99 limit defaulting to the
/// model's objective.
fn begin(stable: u64, canary: u64, policy: RolloutPolicy, settings: &ModelSettings) -> Rollout {
    let objective = settings.engine.objective.as_ref().map(|o| o.p99);
    Rollout::new(stable, canary, policy, objective, Instant::now())
}

fn status(plan: &Rollout, outcome: &'static str) -> RolloutStatus {
    RolloutStatus {
        stable: plan.stable,
        canary: plan.canary,
        canary_percent: plan.policy.canary_percent,
        outcome,
    }
}

impl Owner {
    /// Judges every canary on its window and carries out the verdicts.
    pub(super) async fn judge_rollouts(&mut self) {
        let now = Instant::now();
        let verdicts: Vec<(String, Verdict)> = self
            .models
            .iter()
            .filter_map(|(name, m)| {
                let r = m.rollout.as_ref()?;
                let canary = m.loaded.get(&r.plan.canary)?;
                r.plan
                    .observe(&canary.engine.latency(), now)
                    .map(|v| (name.clone(), v))
            })
            .collect();
        for (name, verdict) in verdicts {
            self.conclude(&name, verdict).await;
        }
    }

    /// Ends `name`'s rollout with `verdict`: a rolled-back canary leaves service at once; a
    /// promoted one serves alone once the version policy has retired the stable version.
    async fn conclude(&mut self, name: &str, verdict: Verdict) {
        let Some(state) = self.models.get_mut(name) else {
            return;
        };
        let Some(active) = state.rollout.take() else {
            return;
        };
        let (stable, canary) = (active.plan.stable, active.plan.canary);
        metrics::counter!("peregrine_rollouts_total", "model" => name.to_string(), "outcome" => verdict.outcome())
            .increment(1);
        match verdict {
            Verdict::RollBack(reason) => {
                tracing::warn!(model = %name, canary, stable, %reason, "canary rolled back; the stable version serves alone");
                if let Some(old) = state.loaded.remove(&canary) {
                    let fingerprint = old.origin.fingerprint;
                    let reason = format!("rolled back: {reason}");
                    state
                        .rolled_back
                        .insert(canary, RolledBack { fingerprint, reason });
                    self.retiring
                        .push((name.to_string(), canary, old.engine.downgrade()));
                }
                self.publish();
            }
            Verdict::Promote => {
                tracing::info!(model = %name, canary, stable, "canary promoted; it serves every request that names no version");
                self.publish();
                if let Err(e) = self.sync(name, Trigger::Poll).await {
                    tracing::warn!(model = %name, error = %e, "after the promotion the repository could not be read; the stable version stays loaded");
                }
            }
        }
    }

    /// A rollout request: start one, or end the one in progress.
    pub(super) async fn rollout(
        &mut self,
        name: &str,
        action: RolloutAction,
    ) -> Result<RolloutStatus, RegistryError> {
        let refused = |reason: String| RegistryError::RolloutRefused {
            name: name.to_string(),
            reason,
        };
        let state =
            self.models
                .get_mut(name)
                .filter(|m| m.wanted)
                .ok_or_else(|| RegistryError::NotLoaded {
                    name: name.to_string(),
                })?;
        match action {
            RolloutAction::Start { version, policy } => {
                if let Some(r) = &state.rollout {
                    return Err(refused(format!(
                        "version {} is already rolling out beside version {}; promote or abort that rollout first",
                        r.plan.canary, r.plan.stable
                    )));
                }
                let ready: Vec<u64> = state.loaded.keys().copied().collect();
                let canary = match version {
                    Some(v) if ready.contains(&v) => v,
                    Some(v) => {
                        return Err(refused(format!(
                            "version {v} is not ready; ready: {}",
                            crate::list(&ready)
                        )))
                    }
                    None => *ready
                        .last()
                        .ok_or_else(|| refused("no version is ready".into()))?,
                };
                let stable = ready.iter().rev().copied().find(|&v| v != canary).ok_or_else(|| {
                    refused(format!(
                        "a rollout keeps another version serving beside the canary, and only version {canary} is loaded \
                         (a [rollout] in the model's config.toml keeps the serving version when a new one arrives; \
                         or set a version_policy that keeps two)"
                    ))
                })?;
                let settings = state.settings.clone().unwrap_or_default();
                let base = settings.rollout.clone().unwrap_or_default();
                let policy = policy.apply(&base).map_err(|e| refused(e.0))?;
                let plan = begin(stable, canary, policy, &settings);
                tracing::info!(model = %name, stable, canary, percent = plan.policy.canary_percent, "rollout started on request");
                let answer = status(&plan, "running");
                state.rollout = Some(ActiveRollout::new(plan));
                self.publish();
                Ok(answer)
            }
            RolloutAction::Promote | RolloutAction::Abort => {
                let r = state
                    .rollout
                    .as_ref()
                    .ok_or_else(|| refused("no rollout is in progress".into()))?;
                let verdict = match action {
                    RolloutAction::Promote => Verdict::Promote,
                    _ => Verdict::RollBack("aborted on request".into()),
                };
                let answer = status(&r.plan, verdict.outcome());
                self.conclude(name, verdict).await;
                Ok(answer)
            }
        }
    }
}
