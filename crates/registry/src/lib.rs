//! The model registry: every model the server serves, each with its loaded versions,
//! and the lifecycle around them (load, hot reload, unload, repository polling), plus the
//! recipe that turns a version's weights into a running detector.
//!
//! One owner task (`owner`) holds the registry's state and does all loading; everyone
//! else holds a [`ModelRegistry`] handle. Readers never wait for the owner: each change is
//! published as an immutable [`RegistrySnapshot`] that request handlers read lock-free, so
//! a swap is one pointer store. A new version is loaded and warmed beside the old one and
//! only then published; requests that already hold the old engine finish on it, and the
//! old engine stops by itself once the last of them is answered.
//!
//! - [`settings`]: server defaults overlaid with a model's `config.toml`, version policies;
//!   [`ModelSettings`] nests the engine's, the session's and the detector's configs.
//! - [`store`]: the repository directory (or models given directly) and change detection
//!   by content: `fingerprint` keeps each weights file's SHA-256, hashed again only when
//!   the file's stamp (size, times, inode) moved.
//! - `plan`: the pure decisions of a sync (load, keep, retire), unit-tested.
//! - [`graph`]: the load-time graph rewrite and input-shape fixing (`peregrine-onnx`).
//! - `build`: [`build_detector`], the one recipe from weights to a [`Detector`] (rewrite,
//!   fix shapes, sessions, detector), used by the loader and by the CLI.
//! - `loader`: [`EngineLoader`], how a version's bytes become a running [`Engine`].
//! - [`rollout`]: canary rollouts as plain state: the policy, the split of requests that
//!   name no version, and the verdict on the canary's latency window.
//!
//! [`Detector`]: peregrine_engine::Detector

mod build;
pub mod calibration;
mod fingerprint;
pub mod graph;
mod loader;
mod owner;
mod plan;
pub mod rollout;
pub mod settings;
pub mod slo;
pub mod store;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::sync::{mpsc, oneshot, watch};

pub use build::{build_detector, LoadError, PreparedModel};
pub use graph::GraphRewrite;
pub use loader::{engine_config, EngineLoader, OrtLoader};
pub use rollout::{RolloutFile, RolloutPolicy};
pub use settings::{ModelConfigFile, ModelSettings, ProviderFile, SettingsError, VersionPolicy};
pub use slo::SloFile;
pub use store::{DigestCache, Fingerprint, FixedModel, ModelSource, StoreError, Weights};

use peregrine_engine::Engine;

/// A version's state, in the terms of Triton's repository index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VersionState {
    Loading,
    Ready,
    Unavailable,
}

#[derive(Debug, Clone)]
pub struct VersionView {
    pub version: u64,
    pub state: VersionState,
    /// Why it is unavailable, why a reload of a ready version failed, or that a ready
    /// version's single run is past its objective.
    pub reason: Option<String>,
    /// Present when ready.
    pub engine: Option<Engine>,
    /// The SHA-256 of the weights the version was loaded (or failed to load) from.
    pub sha256: Option<Fingerprint>,
}

#[derive(Debug, Clone)]
pub struct ModelView {
    pub name: String,
    /// Ascending by version.
    pub versions: Vec<VersionView>,
    /// The settings the ready versions were loaded with, once any loaded.
    pub settings: Option<Arc<ModelSettings>>,
    /// The last sync's model-level failure (unreadable config, no versions, unloaded).
    pub error: Option<String>,
    /// Should be serving: loaded at start or by request, and not unloaded since.
    pub wanted: bool,
    /// The rollout in progress, if any.
    pub rollout: Option<RolloutView>,
}

/// A rollout in progress, as request routing and the index see it.
#[derive(Debug, Clone)]
pub struct RolloutView {
    pub plan: rollout::Rollout,
    /// Requests that named no version routed so far; one counter for every snapshot of
    /// this rollout, so that the split holds across swaps.
    routed: Arc<AtomicU64>,
}

impl RolloutView {
    fn new(plan: rollout::Rollout, routed: Arc<AtomicU64>) -> Self {
        Self { plan, routed }
    }

    /// What the index says about `version` while this rollout runs, if it is one of its.
    fn describe(&self, version: u64) -> Option<String> {
        if version == self.plan.canary {
            Some(self.plan.describe_canary(std::time::Instant::now()))
        } else if version == self.plan.stable {
            Some(format!(
                "stable: serves the requests that name no version and do not go to the canary (version {})",
                self.plan.canary
            ))
        } else {
            None
        }
    }
}

impl ModelView {
    /// The engine a request for `version` gets: that version's, or when `None` the
    /// canary's for the rollout's share of such requests and otherwise the default one
    /// (see [`ModelView::engine`]). Only request routing calls this: it counts.
    pub fn route(&self, version: Option<u64>) -> Result<&Engine, LookupError> {
        if let (None, Some(r)) = (version, &self.rollout) {
            let n = r.routed.fetch_add(1, Ordering::Relaxed);
            if rollout::Rollout::takes_canary(n, r.plan.policy.canary_percent) {
                if let Ok(canary) = self.engine(Some(r.plan.canary)) {
                    return Ok(canary);
                }
            }
        }
        self.engine(version)
    }

    /// The engine of `version`, or of the default version when `None`: the stable one
    /// while a rollout is in progress, else the highest ready one.
    pub fn engine(&self, version: Option<u64>) -> Result<&Engine, LookupError> {
        let ready = |v: &&VersionView| v.state == VersionState::Ready && v.engine.is_some();
        let stable = self
            .rollout
            .as_ref()
            .and_then(|r| self.versions.iter().find(|v| v.version == r.plan.stable))
            .filter(ready);
        let found = match version {
            Some(want) => {
                let v = self.versions.iter().find(|v| v.version == want).ok_or_else(|| {
                    LookupError::UnknownVersion {
                        name: self.name.clone(),
                        version: want,
                        available: self.versions.iter().map(|v| v.version).collect(),
                    }
                })?;
                Some(v).filter(ready)
            }
            None => stable.or_else(|| self.versions.iter().rev().find(ready)),
        };
        found
            .and_then(|v| v.engine.as_ref())
            .ok_or_else(|| LookupError::NotReady {
                name: self.name.clone(),
                version,
                reason: self.not_ready_reason(version),
            })
    }

    fn not_ready_reason(&self, version: Option<u64>) -> String {
        let v = version.and_then(|want| self.versions.iter().find(|v| v.version == want));
        match v {
            Some(v) if v.state == VersionState::Loading => "it is loading".into(),
            Some(v) => v.reason.clone().unwrap_or_else(|| "it is unavailable".into()),
            None => self
                .error
                .clone()
                .or_else(|| {
                    self.versions
                        .iter()
                        .any(|v| v.state == VersionState::Loading)
                        .then(|| "it is loading".to_string())
                })
                .unwrap_or_else(|| "no version is ready".into()),
        }
    }

    /// The highest ready version's engine, if any.
    pub fn serving(&self) -> Option<&Engine> {
        self.engine(None).ok()
    }
}

/// Everything the registry serves, as of one moment. Cheap to hold; never changes.
#[derive(Debug, Clone, Default)]
pub struct RegistrySnapshot {
    pub models: BTreeMap<String, ModelView>,
    /// The start-up loads have finished (successfully or not).
    pub started: bool,
}

impl RegistrySnapshot {
    pub fn model(&self, name: &str) -> Result<&ModelView, LookupError> {
        self.models.get(name).ok_or_else(|| LookupError::UnknownModel {
            name: name.to_string(),
            known: self.models.keys().cloned().collect(),
        })
    }

    pub fn engine(&self, name: &str, version: Option<u64>) -> Result<Engine, LookupError> {
        self.model(name)?.engine(version).cloned()
    }

    /// The engine a request for `name` at `version` is served by ([`ModelView::route`]).
    pub fn route(&self, name: &str, version: Option<u64>) -> Result<Engine, LookupError> {
        self.model(name)?.route(version).cloned()
    }

    /// Start-up is over and every model that should serve has a ready version.
    pub fn is_ready(&self) -> bool {
        self.started
            && self
                .models
                .values()
                .filter(|m| m.wanted)
                .all(|m| m.serving().is_some())
    }

    /// The SHA-256 of the weights `name` version `version` was loaded from.
    pub fn fingerprint(&self, name: &str, version: &str) -> Option<Fingerprint> {
        let version: u64 = version.parse().ok()?;
        let m = self.models.get(name)?;
        m.versions.iter().find(|v| v.version == version)?.sha256
    }

    /// Every ready engine, of every model and version.
    pub fn ready_engines(&self) -> impl Iterator<Item = &Engine> {
        self.models
            .values()
            .flat_map(|m| m.versions.iter())
            .filter_map(|v| v.engine.as_ref())
    }
}

/// A request for a model or version the registry cannot serve.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LookupError {
    #[error("unknown model {name:?}; this server has: {}", .known.join(", "))]
    UnknownModel { name: String, known: Vec<String> },
    #[error("model {name:?} has no version {version}; it has: {}", list(.available))]
    UnknownVersion {
        name: String,
        version: u64,
        available: Vec<u64>,
    },
    #[error("model {name:?}{} is not ready: {reason}", .version.map(|v| format!(" version {v}")).unwrap_or_default())]
    NotReady {
        name: String,
        version: Option<u64>,
        reason: String,
    },
}

fn list(versions: &[u64]) -> String {
    if versions.is_empty() {
        return "none".into();
    }
    versions.iter().map(u64::to_string).collect::<Vec<_>>().join(", ")
}

/// A load or unload that did not do what was asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("model {name:?} has no version directory holding {file}")]
    NoVersions { name: String, file: String },
    #[error("model {name:?}: {}{}", describe_failures(.failed), serving_note(.serving))]
    LoadFailed {
        name: String,
        /// Each failed version with the reason.
        failed: Vec<(u64, String)>,
        /// Versions still serving after the failure.
        serving: Vec<u64>,
    },
    #[error("model {name:?} is not loaded")]
    NotLoaded { name: String },
    #[error("model {name:?}: {reason}")]
    RolloutRefused { name: String, reason: String },
    #[error("the model registry has stopped")]
    Stopped,
}

fn describe_failures(failed: &[(u64, String)]) -> String {
    failed
        .iter()
        .map(|(v, why)| format!("version {v} failed to load: {why}"))
        .collect::<Vec<_>>()
        .join("; ")
}

fn serving_note(serving: &[u64]) -> String {
    if serving.is_empty() {
        String::new()
    } else {
        format!(" (version {} still serving)", list(serving))
    }
}

/// What a successful load did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoadReport {
    /// Versions loaded (new, or reloaded because their files or settings changed).
    pub loaded: Vec<u64>,
    /// Versions already loaded and unchanged.
    pub unchanged: Vec<u64>,
    /// Versions taken out of service because the version policy no longer wants them.
    pub retired: Vec<u64>,
}

/// One line of the repository index: a model version, or a model of the source that is
/// not loaded (no version, no state).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexEntry {
    pub name: String,
    pub version: Option<u64>,
    pub state: Option<VersionState>,
    pub reason: Option<String>,
    /// The SHA-256 of the version's weights, once the registry has read them.
    pub sha256: Option<Fingerprint>,
}

/// Which models to load when the registry starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Startup {
    /// Every model in the source.
    All,
    /// Only these (Triton's `--load-model`); others wait for a load request.
    Only(Vec<String>),
}

#[derive(Debug, Clone)]
pub struct RegistryConfig {
    pub source: ModelSource,
    /// What a model without its own setting gets.
    pub defaults: ModelSettings,
    /// Rescan the source this often, loading new and changed versions and models; `None`
    /// loads only at start and on request.
    pub poll_interval: Option<Duration>,
    pub startup: Startup,
    /// Longest an unload waits for in-flight requests before it answers.
    pub unload_wait: Duration,
}

/// What a rollout request asks.
#[derive(Debug, Clone, PartialEq)]
pub enum RolloutAction {
    /// Roll `version` (else the highest ready one) out as a canary beside the highest
    /// other ready version, with these keys over the model's `[rollout]`.
    Start {
        version: Option<u64>,
        policy: RolloutFile,
    },
    /// Promote the canary now.
    Promote,
    /// Roll the canary back now.
    Abort,
}

/// A rollout, as a rollout request's answer describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RolloutStatus {
    pub stable: u64,
    pub canary: u64,
    pub canary_percent: u8,
    /// `running`, `promoted` or `rolled_back`.
    pub outcome: &'static str,
}

enum Command {
    Load {
        name: String,
        reply: oneshot::Sender<Result<LoadReport, RegistryError>>,
    },
    Unload {
        name: String,
        reply: oneshot::Sender<Result<(), RegistryError>>,
    },
    Rollout {
        name: String,
        action: RolloutAction,
        reply: oneshot::Sender<Result<RolloutStatus, RegistryError>>,
    },
}

/// A cloneable handle to the registry. The owner task stops when every handle is gone.
#[derive(Clone)]
pub struct ModelRegistry {
    source: ModelSource,
    snapshot: Arc<ArcSwap<RegistrySnapshot>>,
    commands: mpsc::Sender<Command>,
    /// Start-up failures, once start-up is over.
    started: watch::Receiver<Option<Vec<RegistryError>>>,
}

impl std::fmt::Debug for ModelRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelRegistry").finish_non_exhaustive()
    }
}

impl ModelRegistry {
    /// Starts the owner task, which loads the start-up models in the background. Must be
    /// called inside a tokio runtime.
    pub fn start(config: RegistryConfig, loader: Arc<dyn EngineLoader>) -> Self {
        let snapshot = Arc::new(ArcSwap::from_pointee(RegistrySnapshot::default()));
        // Requests to load or unload wait here while the owner works on earlier ones.
        let (tx, rx) = mpsc::channel(64);
        let (started_tx, started) = watch::channel(None);
        let source = config.source.clone();
        let owner = owner::Owner::new(config, loader, snapshot.clone());
        tokio::spawn(owner.run(rx, started_tx));
        Self {
            source,
            snapshot,
            commands: tx,
            started,
        }
    }

    /// The registry as of now.
    pub fn snapshot(&self) -> Arc<RegistrySnapshot> {
        self.snapshot.load_full()
    }

    /// The engine of `name` at `version`, or its default one ([`ModelView::engine`]).
    pub fn engine(&self, name: &str, version: Option<u64>) -> Result<Engine, LookupError> {
        self.snapshot.load().engine(name, version)
    }

    /// The engine a request for `name` at `version` is served by ([`ModelView::route`]).
    pub fn route(&self, name: &str, version: Option<u64>) -> Result<Engine, LookupError> {
        self.snapshot.load().route(name, version)
    }

    /// Every version the registry knows, then every model of the source it has not
    /// loaded, by name. With `ready_only`, only ready versions.
    pub async fn index(&self, ready_only: bool) -> Result<Vec<IndexEntry>, RegistryError> {
        let source = self.source.clone();
        let names = tokio::task::spawn_blocking(move || source.list())
            .await
            .map_err(|e| StoreError::Io(format!("listing the repository failed: {e}")))??;
        let snapshot = self.snapshot();
        let mut entries: Vec<IndexEntry> = snapshot
            .models
            .values()
            .flat_map(|m| {
                m.versions.iter().map(|v| IndexEntry {
                    name: m.name.clone(),
                    version: Some(v.version),
                    state: Some(v.state),
                    reason: m
                        .rollout
                        .as_ref()
                        .and_then(|r| r.describe(v.version))
                        .or_else(|| v.reason.clone()),
                    sha256: v.sha256,
                })
            })
            .filter(|e| !ready_only || e.state == Some(VersionState::Ready))
            .collect();
        if !ready_only {
            entries.extend(
                names
                    .into_iter()
                    .filter(|n| snapshot.models.get(n).is_none_or(|m| m.versions.is_empty()))
                    .map(|name| {
                        let reason = snapshot.models.get(&name).and_then(|m| m.error.clone());
                        IndexEntry {
                            state: reason.as_ref().map(|_| VersionState::Unavailable),
                            name,
                            version: None,
                            reason,
                            sha256: None,
                        }
                    }),
            );
        }
        entries.sort_by(|a, b| (&a.name, a.version).cmp(&(&b.name, b.version)));
        Ok(entries)
    }

    /// Waits for the start-up loads and returns what failed among them.
    pub async fn wait_started(&self) -> Vec<RegistryError> {
        let mut rx = self.started.clone();
        let outcome = match rx.wait_for(Option::is_some).await {
            Ok(v) => v.clone().unwrap_or_default(),
            Err(_) => vec![RegistryError::Stopped],
        };
        outcome
    }

    /// Loads `name` from the source, or reloads it: new and changed versions are loaded
    /// and warmed beside the serving ones, then swapped in at once. Answers when done.
    pub async fn load(&self, name: &str) -> Result<LoadReport, RegistryError> {
        let (reply, answer) = oneshot::channel();
        self.commands
            .send(Command::Load {
                name: name.to_string(),
                reply,
            })
            .await
            .map_err(|_| RegistryError::Stopped)?;
        answer.await.map_err(|_| RegistryError::Stopped)?
    }

    /// Starts, promotes or aborts a rollout of `name`; answers once it is done.
    pub async fn rollout(&self, name: &str, action: RolloutAction) -> Result<RolloutStatus, RegistryError> {
        let (reply, answer) = oneshot::channel();
        self.commands
            .send(Command::Rollout {
                name: name.to_string(),
                action,
                reply,
            })
            .await
            .map_err(|_| RegistryError::Stopped)?;
        answer.await.map_err(|_| RegistryError::Stopped)?
    }

    /// Takes every version of `name` out of service. Requests in flight finish first;
    /// answers once the engines have stopped (or the unload wait ran out).
    pub async fn unload(&self, name: &str) -> Result<(), RegistryError> {
        let (reply, answer) = oneshot::channel();
        self.commands
            .send(Command::Unload {
                name: name.to_string(),
                reply,
            })
            .await
            .map_err(|_| RegistryError::Stopped)?;
        answer.await.map_err(|_| RegistryError::Stopped)?
    }
}

#[cfg(test)]
mod tests;
