//! The registry's owner task: the only holder of the registry's state. It runs one
//! operation at a time (start-up, a load or unload request, a poll of the source), does the
//! slow parts (reading weights, building sessions, warming up) on the blocking pool and
//! the engines' own threads, and publishes a new snapshot after every change.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use tokio::sync::{mpsc, watch};

use super::plan::{plan_sync, Origin, SyncPlan};
use super::settings::ModelSettings;
use super::store::{DigestCache, ModelListing, StoreError, Weights};
use super::{
    Command, EngineLoader, LoadReport, ModelView, RegistryConfig, RegistryError, RegistrySnapshot, Startup,
    VersionState, VersionView,
};
use peregrine_engine::{Engine, WeakEngine};

mod calibrate;
mod canary;

struct Loaded {
    origin: Origin,
    engine: Engine,
}

struct Failed {
    origin: Origin,
    reason: String,
}

#[derive(Default)]
struct ModelState {
    loaded: BTreeMap<u64, Loaded>,
    failed: BTreeMap<u64, Failed>,
    loading: BTreeSet<u64>,
    settings: Option<Arc<ModelSettings>>,
    error: Option<String>,
    wanted: bool,
    /// Versions listed as unavailable since an unload.
    unloaded: BTreeSet<u64>,
    rollout: Option<canary::ActiveRollout>,
    rolled_back: BTreeMap<u64, canary::RolledBack>,
}

pub(super) struct Owner {
    config: RegistryConfig,
    loader: Arc<dyn EngineLoader>,
    snapshot: Arc<ArcSwap<RegistrySnapshot>>,
    models: BTreeMap<String, ModelState>,
    /// Engines taken out of service, until their last request is answered.
    retiring: Vec<(String, u64, WeakEngine)>,
    started: bool,
    /// Weights' SHA-256 by file, so that a poll reads only files that changed on disk.
    digests: Arc<DigestCache>,
    /// Where online calibrations report how they ended (`calibrate`).
    calibrations: calibrate::Calibrations,
}

/// Why a sync was asked for: it decides whether failed versions are retried and whether
/// the model becomes one that should serve.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Trigger {
    Request,
    Poll,
}

impl Owner {
    pub fn new(
        config: RegistryConfig,
        loader: Arc<dyn EngineLoader>,
        snapshot: Arc<ArcSwap<RegistrySnapshot>>,
    ) -> Self {
        Self {
            config,
            loader,
            snapshot,
            models: BTreeMap::new(),
            retiring: Vec::new(),
            started: false,
            digests: Arc::default(),
            calibrations: calibrate::Calibrations::new(),
        }
    }

    pub async fn run(
        mut self,
        mut commands: mpsc::Receiver<Command>,
        started: watch::Sender<Option<Vec<RegistryError>>>,
    ) {
        let errors = self.start_up().await;
        self.started = true;
        self.publish();
        let _ = started.send(Some(errors));
        let mut poll = self.config.poll_interval.map(|every| {
            let mut t = tokio::time::interval(every);
            t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            t
        });
        let mut calibrated = self.calibrations.take_receiver();
        let mut judge = tokio::time::interval(canary::JUDGE_EVERY);
        judge.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let tick = async {
                match poll.as_mut() {
                    Some(t) => {
                        t.tick().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                command = commands.recv() => match command {
                    None => break,
                    Some(Command::Load { name, reply }) => {
                        let outcome = self.sync(&name, Trigger::Request).await;
                        let _ = reply.send(outcome);
                    }
                    Some(Command::Unload { name, reply }) => {
                        let outcome = self.unload(&name).await;
                        let _ = reply.send(outcome);
                    }
                    Some(Command::Rollout { name, action, reply }) => {
                        let outcome = self.rollout(&name, action).await;
                        let _ = reply.send(outcome);
                    }
                },
                Some(finished) = calibrated.recv() => self.calibration_finished(finished).await,
                () = tick => self.poll().await,
                _ = judge.tick() => self.judge_rollouts().await,
            }
            self.prune_retired();
        }
    }

    async fn start_up(&mut self) -> Vec<RegistryError> {
        let names = match &self.config.startup {
            Startup::Only(names) => names.clone(),
            Startup::All => match self.list().await {
                Ok(names) => names,
                Err(e) => return vec![e.into()],
            },
        };
        let mut errors = Vec::new();
        for name in names {
            if let Err(e) = self.sync(&name, Trigger::Request).await {
                tracing::error!(model = %name, error = %e, "model failed to load at start-up");
                errors.push(e);
            }
        }
        errors
    }

    async fn list(&self) -> Result<Vec<String>, StoreError> {
        let source = self.config.source.clone();
        tokio::task::spawn_blocking(move || source.list())
            .await
            .map_err(|e| StoreError::Io(format!("listing the repository failed: {e}")))?
    }

    /// Rescans the source: new models load, wanted ones pick up new and changed versions,
    /// models whose directory is gone are unloaded. Explicitly unloaded models stay so.
    async fn poll(&mut self) {
        let names = match self.list().await {
            Ok(names) => names,
            Err(e) => {
                tracing::warn!(error = %e, "repository poll failed; serving as before");
                return;
            }
        };
        let gone: Vec<String> = self
            .models
            .iter()
            .filter(|(n, m)| m.wanted && !names.contains(n))
            .map(|(n, _)| n.clone())
            .collect();
        for name in gone {
            tracing::info!(model = %name, "model directory removed; unloading");
            let _ = self.unload(&name).await;
        }
        for name in names {
            let known = self.models.get(&name);
            if known.is_some_and(|m| !m.wanted && !m.unloaded.is_empty()) {
                continue;
            }
            if let Err(e) = self.sync(&name, Trigger::Poll).await {
                tracing::warn!(model = %name, error = %e, "repository poll: model did not load");
            }
        }
    }

    /// Brings one model in line with the source: loads new and changed versions beside the
    /// serving ones, then publishes them and retires what the policy no longer wants, in
    /// one snapshot.
    async fn sync(&mut self, name: &str, trigger: Trigger) -> Result<LoadReport, RegistryError> {
        let listing = self.scan(name).await?;
        let state = self.models.entry(name.to_string()).or_default();
        let loaded_origins = state.loaded.iter().map(|(v, l)| (*v, l.origin.clone())).collect();
        let failed_origins = state.failed.iter().map(|(v, f)| (*v, f.origin.clone())).collect();
        let serving = canary::serving_before(state);
        let mut plan = plan_sync(
            &canary::servable(listing.available(), state, trigger),
            &listing.settings,
            &loaded_origins,
            &failed_origins,
            trigger == Trigger::Request,
        );
        canary::keep_serving(&mut plan, state, &listing.settings, serving);
        if plan.load.is_empty() && plan.retire.is_empty() {
            // Nothing changed. (On request, failed versions are always retried, so this
            // is only reached with versions still failing when polling, which stays quiet
            // until their files change.)
            if trigger == Trigger::Request {
                state.wanted = true;
                state.unloaded.clear();
                state.error = None;
                self.publish();
            }
            return Ok(LoadReport {
                unchanged: plan.keep,
                ..Default::default()
            });
        }
        state.loading.extend(plan.load.iter().copied());
        self.publish();

        let loads = plan.load.iter().map(|&v| {
            let listed = listing
                .versions
                .iter()
                .find(|l| l.version == v)
                .expect("the plan only loads listed versions");
            load_version(
                self.loader.clone(),
                name.to_string(),
                v,
                listed.weights.clone(),
                listing.settings.clone(),
            )
        });
        let outcomes = futures_util::future::join_all(loads).await;
        let (report, failed) = self.apply_loads(name, &listing, &plan, outcomes, trigger);
        let state = self
            .models
            .get_mut(name)
            .expect("the model's state was created by sync");
        canary::after_loads(name, state, &listing.settings, serving, &report.loaded);
        self.start_calibrations(&listing, &report.loaded);
        let serving: Vec<u64> = self.models[name].loaded.keys().copied().collect();
        self.publish();
        if failed.is_empty() {
            Ok(report)
        } else {
            Err(RegistryError::LoadFailed {
                name: name.to_string(),
                failed,
                serving,
            })
        }
    }

    /// The model's listing in the source, on the blocking pool. A model that cannot be
    /// listed (bad settings, no versions) keeps the reason in its state, for the index.
    async fn scan(&mut self, name: &str) -> Result<ModelListing, RegistryError> {
        let (source, defaults, owned, digests) = (
            self.config.source.clone(),
            self.config.defaults.clone(),
            name.to_string(),
            self.digests.clone(),
        );
        let scanned = tokio::task::spawn_blocking(move || source.scan(&owned, &defaults, &digests))
            .await
            .map_err(|e| StoreError::Io(format!("scanning the repository failed: {e}")))?;
        let listing = match scanned {
            Ok(listing) => listing,
            Err(e) => {
                if !matches!(e, StoreError::InvalidName(_) | StoreError::NotFound { .. }) {
                    self.models.entry(name.to_string()).or_default().error = Some(e.to_string());
                    self.publish();
                }
                return Err(e.into());
            }
        };
        if listing.versions.is_empty() {
            let e = RegistryError::NoVersions {
                name: name.to_string(),
                file: listing.settings.model_file.clone(),
            };
            self.models.entry(name.to_string()).or_default().error = Some(e.to_string());
            self.publish();
            return Err(e);
        }
        Ok(listing)
    }

    /// Takes the planned loads' outcomes into the model's state: loaded versions serve
    /// (replacing the ones they reload), failed ones are kept with their reason, and the
    /// policy's retirements happen only where [`SyncPlan::may_retire`] allows. Returns the
    /// report and the failures.
    fn apply_loads(
        &mut self,
        name: &str,
        listing: &ModelListing,
        plan: &SyncPlan,
        outcomes: Vec<Result<Engine, String>>,
        trigger: Trigger,
    ) -> (LoadReport, Vec<(u64, String)>) {
        let state = self
            .models
            .get_mut(name)
            .expect("the model's state was created by sync");
        state.loading.clear();
        let mut report = LoadReport {
            unchanged: plan.keep.clone(),
            ..Default::default()
        };
        let mut failed = Vec::new();
        let available = listing.available();
        for (&v, outcome) in plan.load.iter().zip(outcomes) {
            let fingerprint = available
                .iter()
                .find(|(av, _)| *av == v)
                .map(|(_, fp)| *fp)
                .expect("the plan only loads listed versions");
            let origin = Origin {
                fingerprint,
                settings: listing.settings.clone(),
            };
            match outcome {
                Ok(engine) => {
                    state.failed.remove(&v);
                    let previous = state.loaded.insert(v, Loaded { origin, engine });
                    let replaced = previous.as_ref().map(|old| old.origin.fingerprint);
                    match replaced.filter(|old| *old != fingerprint) {
                        Some(old) => {
                            tracing::info!(model = %name, version = v, sha256 = %fingerprint, previous_sha256 = %old, "version reloaded with new weights and warmed up; now serving")
                        }
                        None => {
                            tracing::info!(model = %name, version = v, sha256 = %fingerprint, "version loaded and warmed up; now serving")
                        }
                    }
                    if let Some(old) = previous {
                        self.retiring.push((name.to_string(), v, old.engine.downgrade()));
                    }
                    report.loaded.push(v);
                }
                Err(reason) => {
                    tracing::error!(model = %name, version = v, sha256 = %fingerprint, error = %reason, "version failed to load; serving versions are untouched");
                    failed.push((v, reason.clone()));
                    state.failed.insert(v, Failed { origin, reason });
                }
            }
        }
        if plan.may_retire(&report.loaded) {
            for v in &plan.retire {
                if let Some(old) = state.loaded.remove(v) {
                    tracing::info!(model = %name, version = v, "version retired; it finishes its requests in flight");
                    self.retiring.push((name.to_string(), *v, old.engine.downgrade()));
                    report.retired.push(*v);
                }
            }
        }
        if !state.loaded.is_empty() {
            state.settings = Some(listing.settings.clone());
            state.error = None;
            if trigger == Trigger::Request || !state.wanted {
                // A model found by polling serves from now on, like one loaded on request.
                state.wanted = true;
            }
            state.unloaded.clear();
        }
        (report, failed)
    }

    async fn unload(&mut self, name: &str) -> Result<(), RegistryError> {
        let state = self
            .models
            .get_mut(name)
            .ok_or_else(|| RegistryError::NotLoaded {
                name: name.to_string(),
            })?;
        let versions: Vec<u64> = state.loaded.keys().copied().collect();
        let stopping: Vec<WeakEngine> = std::mem::take(&mut state.loaded)
            .into_values()
            .map(|l| l.engine.downgrade())
            .collect();
        state.unloaded.extend(versions.iter().copied());
        state.failed.clear();
        state.rollout = None;
        state.rolled_back.clear();
        state.wanted = false;
        state.error = Some("unloaded".into());
        if state.unloaded.is_empty() {
            // Never loaded: forget it, so the index does not list it as unloaded.
            self.models.remove(name);
        }
        self.publish();
        tracing::info!(model = %name, versions = ?versions, "model unloaded; its engines finish their requests in flight");
        let deadline = Instant::now() + self.config.unload_wait;
        while stopping.iter().any(|w| !w.is_stopped()) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        for w in stopping {
            if !w.is_stopped() {
                self.retiring.push((name.to_string(), 0, w));
            }
        }
        release_freed_memory();
        Ok(())
    }

    fn prune_retired(&mut self) {
        let before = self.retiring.len();
        self.retiring.retain(|(name, version, engine)| {
            let stopped = engine.is_stopped();
            if stopped {
                tracing::debug!(model = %name, version, "retired engine stopped");
            }
            !stopped
        });
        if self.retiring.len() < before {
            release_freed_memory();
        }
    }

    fn publish(&self) {
        let models = self
            .models
            .iter()
            .map(|(name, m)| (name.clone(), view(name, m)))
            .collect();
        self.snapshot.store(Arc::new(RegistrySnapshot {
            models,
            started: self.started,
        }));
    }
}

fn view(name: &str, m: &ModelState) -> ModelView {
    let mut numbers: BTreeSet<u64> = m.loaded.keys().copied().collect();
    numbers.extend(m.failed.keys());
    numbers.extend(&m.loading);
    numbers.extend(&m.unloaded);
    numbers.extend(m.rolled_back.keys());
    let versions = numbers
        .into_iter()
        .map(|v| {
            let failure = m
                .failed
                .get(&v)
                .map(|f| f.reason.clone())
                .or_else(|| m.rolled_back.get(&v).map(|r| r.reason.clone()));
            let sha256 = m
                .loaded
                .get(&v)
                .map(|l| l.origin.fingerprint)
                .or_else(|| m.failed.get(&v).map(|f| f.origin.fingerprint))
                .or_else(|| m.rolled_back.get(&v).map(|r| r.fingerprint));
            match (m.loaded.get(&v), m.loading.contains(&v)) {
                (Some(l), _) => VersionView {
                    version: v,
                    state: VersionState::Ready,
                    reason: failure
                        .map(|r| format!("serving the previous load; reloading failed: {r}"))
                        .or_else(|| past_objective(&l.engine)),
                    engine: Some(l.engine.clone()),
                    sha256,
                },
                (None, true) => VersionView {
                    version: v,
                    state: VersionState::Loading,
                    reason: None,
                    engine: None,
                    sha256,
                },
                (None, false) => VersionView {
                    version: v,
                    state: VersionState::Unavailable,
                    reason: failure.or_else(|| Some("unloaded".into())),
                    engine: None,
                    sha256,
                },
            }
        })
        .collect();
    ModelView {
        name: name.to_string(),
        versions,
        settings: m.settings.clone(),
        error: m.error.clone(),
        wanted: m.wanted,
        rollout: m.rollout.as_ref().map(canary::ActiveRollout::view),
    }
}

/// What the index says of a ready version whose single run (at warm-up) is longer than
/// its objective's P99.
fn past_objective(engine: &Engine) -> Option<String> {
    let (run, p99) = engine.run_past_objective()?;
    let what = if engine.config().has_fallback {
        "every request that allows it goes to the fallback"
    } else {
        "it misses its objective"
    };
    Some(format!(
        "one run takes {:.1} ms (warm-up, smallest batch), over the objective's P99 of {:.1} ms: {what}",
        run.as_secs_f64() * 1e3,
        p99.as_secs_f64() * 1e3
    ))
}

/// Gives the memory of stopped sessions back to the system. A session frees hundreds of
/// megabytes across the allocator's per-thread arenas, which glibc keeps; without this,
/// every load and unload cycle left resident memory a little higher.
fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks the allocator's own free lists; it has no
    // preconditions and is safe to call from any thread at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Reads, builds and warms one version, within the model's load timeout.
async fn load_version(
    loader: Arc<dyn EngineLoader>,
    name: String,
    version: u64,
    weights: Weights,
    settings: Arc<ModelSettings>,
) -> Result<Engine, String> {
    let limit = settings.load_timeout;
    let work = async move {
        let engine = tokio::task::spawn_blocking(move || {
            let bytes = weights.read()?;
            loader
                .load(&name, version, &bytes, &settings)
                .map_err(|e| e.to_string())
        })
        .await
        .map_err(|e| format!("the loading task failed: {e}"))??;
        engine.wait_ready().await.map_err(|e| e.to_string())?;
        Ok(engine)
    };
    tokio::time::timeout(limit, work).await.map_err(|_| {
        format!(
            "it did not load and warm up within {} s (load_timeout_s)",
            limit.as_secs()
        )
    })?
}
