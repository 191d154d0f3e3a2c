//! The registry's lifecycle over a real repository directory and fake engines: start-up,
//! hot swaps under load, broken versions, unloading, polling.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use peregrine_backend::BackendError;
use peregrine_engine::fake::{png, SlowBackend};
use peregrine_engine::{Detector, DetectorConfig, EngineError};
use peregrine_types::DetectParams;

use super::*;

mod rollout;

/// Weights are text: `ok` (a working model), `slow` (a working model that takes 40 ms a
/// run instead of 2), `corrupt` (fails to load), `cold` (loads but fails its warm-up).
struct FakeLoader {
    loads: AtomicUsize,
}

impl EngineLoader for FakeLoader {
    fn load(
        &self,
        name: &str,
        version: u64,
        weights: &[u8],
        settings: &ModelSettings,
    ) -> Result<Engine, LoadError> {
        self.loads.fetch_add(1, Ordering::Relaxed);
        let text = std::str::from_utf8(weights).unwrap_or("").trim().to_string();
        if text == "corrupt" {
            return Err(
                EngineError::Backend(BackendError::ModelLoad("Protobuf parsing failed".into())).into(),
            );
        }
        let max_batch = settings.engine.policy.max_batch;
        let factory = move |_instance: usize| -> Result<Detector, EngineError> {
            let delay = Duration::from_millis(if text == "slow" { 40 } else { 2 });
            let mut backend = SlowBackend::new(delay, Arc::new(Mutex::new(Vec::new())));
            if text == "cold" {
                backend.fail = Some("CUDA out of memory".into());
            }
            Detector::new(
                Box::new(backend),
                &DetectorConfig {
                    imgsz: None,
                    max_batch,
                    run_sizes: vec![],
                },
            )
        };
        Ok(Engine::start(engine_config(name, version, settings), factory)?)
    }
}

struct Repo(PathBuf);

impl Repo {
    fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("peregrine-registry-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    fn put(&self, model: &str, version: u64, weights: &str) {
        let dir = self.0.join(model).join(version.to_string());
        std::fs::create_dir_all(&dir).unwrap();
        // Written beside and renamed, as a careful deployment does, so a poll never sees
        // half a file.
        let tmp = dir.join(".model.onnx.tmp");
        std::fs::write(&tmp, weights).unwrap();
        std::fs::rename(&tmp, dir.join("model.onnx")).unwrap();
    }

    fn config(&self, model: &str, text: &str) {
        std::fs::write(self.0.join(model).join("config.toml"), text).unwrap();
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Repo {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn start(repo: &Repo, poll: Option<Duration>, startup: Startup) -> ModelRegistry {
    let config = RegistryConfig {
        source: ModelSource::Directory(repo.path().to_path_buf()),
        defaults: ModelSettings {
            load_timeout: Duration::from_secs(20),
            ..Default::default()
        },
        poll_interval: poll,
        startup,
        unload_wait: Duration::from_secs(5),
    };
    ModelRegistry::start(
        config,
        Arc::new(FakeLoader {
            loads: AtomicUsize::new(0),
        }),
    )
}

async fn detect(registry: &ModelRegistry, name: &str, version: Option<u64>) -> Result<String, String> {
    let engine = registry.route(name, version).map_err(|e| e.to_string())?;
    let permit = engine.try_admit().map_err(|e| e.to_string())?;
    let deadline = Instant::now() + Duration::from_secs(10);
    engine
        .detect(&permit, png(9), DetectParams::default(), deadline)
        .await
        .map_err(|e| e.to_string())?;
    Ok(engine.version().to_string())
}

async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let start = Instant::now();
    while !check() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "timed out waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_up_serves_the_latest_version_and_a_load_swaps_in_a_new_one() {
    let repo = Repo::new("swap");
    repo.put("det", 1, "ok");
    repo.put("det", 2, "ok");
    let registry = start(&repo, None, Startup::All);
    assert!(registry.wait_started().await.is_empty());
    assert!(registry.snapshot().is_ready());
    assert_eq!(detect(&registry, "det", None).await.unwrap(), "2");
    let old = registry.engine("det", None).unwrap().downgrade();
    repo.put("det", 3, "ok");
    let report = registry.load("det").await.unwrap();
    assert_eq!((report.loaded, report.retired), (vec![3], vec![2]));
    assert_eq!(detect(&registry, "det", None).await.unwrap(), "3");
    eventually("the retired engine stops", || old.is_stopped()).await;
    // Loading again with nothing changed loads nothing.
    let report = registry.load("det").await.unwrap();
    assert_eq!((report.loaded, report.unchanged), (vec![], vec![3]));
}

fn set_modified(path: &Path, at: std::time::SystemTime) {
    let file = std::fs::File::options().write(true).open(path).unwrap();
    file.set_modified(at).unwrap();
}

/// The index's fingerprint of `name` version `version`.
async fn indexed_sha256(registry: &ModelRegistry, name: &str, version: u64) -> Option<Fingerprint> {
    let index = registry.index(false).await.unwrap();
    let entry = index
        .iter()
        .find(|e| e.name == name && e.version == Some(version));
    entry.and_then(|e| e.sha256)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_are_detected_by_content_not_by_size_and_time() {
    let repo = Repo::new("content");
    repo.put("det", 1, "ok");
    let registry = start(&repo, None, Startup::All);
    assert!(registry.wait_started().await.is_empty());
    let file = repo.path().join("det/1/model.onnx");
    assert_eq!(
        indexed_sha256(&registry, "det", 1).await,
        Some(Fingerprint::of(b"ok"))
    );
    assert_eq!(
        registry.snapshot().fingerprint("det", "1"),
        Some(Fingerprint::of(b"ok"))
    );

    // Touched: a new modification time, the same bytes.
    let later = std::fs::metadata(&file).unwrap().modified().unwrap() + Duration::from_secs(60);
    set_modified(&file, later);
    let report = registry.load("det").await.unwrap();
    assert_eq!(
        (report.loaded, report.unchanged),
        (vec![], vec![1]),
        "a touch reloads nothing"
    );

    // Replaced by other bytes of the same size, given the old modification time.
    repo.put("det", 1, "OK");
    set_modified(&file, later);
    let report = registry.load("det").await.unwrap();
    assert_eq!(
        (report.loaded, report.unchanged),
        (vec![1], vec![]),
        "new content reloads"
    );
    assert_eq!(
        indexed_sha256(&registry, "det", 1).await,
        Some(Fingerprint::of(b"OK"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_fallback_reloads_the_versions_with_it() {
    let repo = Repo::new("fallback");
    repo.put("det", 1, "ok");
    repo.config("det", "fallback = \"small\"\n");
    let registry = start(&repo, None, Startup::All);
    assert!(registry.wait_started().await.is_empty());
    let has_fallback = || registry.engine("det", None).unwrap().config().has_fallback;
    assert!(has_fallback());
    for (config, expected) in [
        ("", false),
        ("fallback = \"det\"\n", false),
        ("fallback = \"s\"\n", true),
    ] {
        repo.config("det", config);
        let report = registry.load("det").await.unwrap();
        assert_eq!(report.loaded, [1], "{config:?} reloads the version");
        assert_eq!(has_fallback(), expected, "{config:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_index_says_when_one_run_is_past_the_objective() {
    let repo = Repo::new("past-objective");
    repo.put("det", 1, "slow");
    repo.put("quick", 1, "ok");
    repo.config("det", "[slo]\np99_ms = 20\n");
    repo.config("quick", "[slo]\np99_ms = 1000\n");
    let registry = start(&repo, None, Startup::All);
    assert!(registry.wait_started().await.is_empty());
    let index = registry.index(false).await.unwrap();
    let reason = |name: &str| index.iter().find(|e| e.name == name).unwrap().reason.clone();
    let slow = reason("det").expect("a 40 ms run is past a 20 ms objective");
    assert!(
        slow.starts_with("one run takes ")
            && slow.ends_with("over the objective's P99 of 20.0 ms: it misses its objective"),
        "{slow}"
    );
    assert_eq!(reason("quick"), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn swaps_under_continuous_load_fail_no_request() {
    let repo = Repo::new("load");
    repo.put("det", 1, "ok");
    let registry = start(&repo, None, Startup::All);
    assert!(registry.wait_started().await.is_empty());
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..3)
        .map(|_| {
            let (registry, stop) = (registry.clone(), stop.clone());
            tokio::spawn(async move {
                let mut versions = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    versions.push(detect(&registry, "det", None).await);
                }
                versions
            })
        })
        .collect();
    for v in 2..=11 {
        repo.put("det", v, "ok");
        registry.load("det").await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        let answers = client.await.unwrap();
        assert!(answers.len() > 10, "the client kept sending: {}", answers.len());
        let versions: Vec<u64> = answers
            .into_iter()
            .map(|a| a.expect("no request fails during a swap").parse().unwrap())
            .collect();
        assert!(
            versions.windows(2).all(|w| w[0] <= w[1]),
            "versions only move forward: {versions:?}"
        );
        assert_eq!(*versions.last().unwrap(), 11);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_version_leaves_the_serving_one_untouched_and_says_why() {
    let repo = Repo::new("broken");
    repo.put("det", 1, "ok");
    let registry = start(&repo, None, Startup::All);
    assert!(registry.wait_started().await.is_empty());
    repo.put("det", 2, "corrupt");
    let err = registry.load("det").await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "model \"det\": version 2 failed to load: could not load the model: Protobuf parsing failed \
         (version 1 still serving)"
    );
    assert_eq!(detect(&registry, "det", None).await.unwrap(), "1");
    let snap = registry.snapshot();
    let versions = &snap.models["det"].versions;
    assert_eq!(versions[0].state, VersionState::Ready);
    assert_eq!(versions[1].state, VersionState::Unavailable);
    assert!(versions[1]
        .reason
        .as_deref()
        .unwrap()
        .contains("Protobuf parsing failed"));
    // One that loads but cannot warm up is refused the same way.
    repo.put("det", 3, "cold");
    let err = registry.load("det").await.unwrap_err().to_string();
    assert!(
        err.contains("version 3 failed to load") && err.contains("CUDA out of memory"),
        "{err}"
    );
    assert_eq!(detect(&registry, "det", None).await.unwrap(), "1");
    // Fixing the file and asking again swaps it in.
    repo.put("det", 3, "ok");
    assert_eq!(registry.load("det").await.unwrap().loaded, [3]);
    assert_eq!(detect(&registry, "det", None).await.unwrap(), "3");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unload_stops_the_engines_and_a_load_brings_the_model_back() {
    let repo = Repo::new("unload");
    repo.put("det", 1, "ok");
    let registry = start(&repo, None, Startup::All);
    assert!(registry.wait_started().await.is_empty());
    let engine = registry.engine("det", None).unwrap().downgrade();
    registry.unload("det").await.unwrap();
    assert!(engine.is_stopped(), "unload answers once the engine has stopped");
    let err = detect(&registry, "det", None).await.unwrap_err();
    assert_eq!(err, "model \"det\" is not ready: unloaded");
    assert!(
        registry.snapshot().is_ready(),
        "an unloaded model does not make the server unready"
    );
    let index = registry.index(false).await.unwrap();
    assert_eq!(index.len(), 1);
    assert_eq!(index[0].state, Some(VersionState::Unavailable));
    assert_eq!(index[0].reason.as_deref(), Some("unloaded"));
    registry.load("det").await.unwrap();
    assert_eq!(detect(&registry, "det", None).await.unwrap(), "1");
    assert!(matches!(
        registry.unload("nope").await,
        Err(RegistryError::NotLoaded { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_picks_up_new_versions_new_models_and_removals() {
    let repo = Repo::new("poll");
    repo.put("det", 1, "ok");
    let registry = start(&repo, Some(Duration::from_millis(30)), Startup::All);
    assert!(registry.wait_started().await.is_empty());
    repo.put("det", 2, "ok");
    eventually("version 2 serves", || {
        registry.engine("det", None).is_ok_and(|e| e.version() == "2")
    })
    .await;
    repo.put("det", 3, "corrupt");
    eventually("version 3 is listed as failed", || {
        registry.snapshot().models["det"]
            .versions
            .iter()
            .any(|v| v.version == 3 && v.state == VersionState::Unavailable)
    })
    .await;
    assert_eq!(
        detect(&registry, "det", None).await.unwrap(),
        "2",
        "the corrupt file changes nothing"
    );
    repo.put("other", 1, "ok");
    eventually("a new model serves", || registry.engine("other", None).is_ok()).await;
    std::fs::remove_dir_all(repo.path().join("other")).unwrap();
    eventually("a removed model is unloaded", || {
        registry.engine("other", None).is_err()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn version_policies_and_explicit_versions() {
    let repo = Repo::new("policy");
    for v in 1..=3 {
        repo.put("det", v, "ok");
    }
    repo.config("det", "version_policy = { latest = 2 }\n");
    repo.put("idle", 1, "ok");
    let registry = start(&repo, None, Startup::Only(vec!["det".into()]));
    assert!(registry.wait_started().await.is_empty());
    assert_eq!(detect(&registry, "det", Some(2)).await.unwrap(), "2");
    assert_eq!(detect(&registry, "det", None).await.unwrap(), "3");
    let err = detect(&registry, "det", Some(1)).await.unwrap_err();
    assert_eq!(err, "model \"det\" has no version 1; it has: 2, 3");
    let err = detect(&registry, "nope", None).await.unwrap_err();
    assert_eq!(err, "unknown model \"nope\"; this server has: det");
    let index = registry.index(false).await.unwrap();
    let lines: Vec<(String, Option<u64>)> = index.into_iter().map(|e| (e.name, e.version)).collect();
    assert_eq!(
        lines,
        [
            ("det".to_string(), Some(2)),
            ("det".to_string(), Some(3)),
            ("idle".to_string(), None)
        ]
    );
    let err = registry.load("../etc").await.unwrap_err();
    assert!(
        matches!(err, RegistryError::Store(StoreError::InvalidName(_))),
        "{err}"
    );
    repo.config("det", "max_batch = 0\n");
    let err = registry.load("det").await.unwrap_err();
    assert_eq!(err.to_string(), "model \"det\": max_batch must be at least 1");
    assert_eq!(
        detect(&registry, "det", None).await.unwrap(),
        "3",
        "a bad config changes nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_that_fails_at_start_up_is_reported() {
    let repo = Repo::new("startfail");
    repo.put("det", 1, "corrupt");
    std::fs::create_dir_all(repo.path().join("empty")).unwrap();
    let registry = start(&repo, None, Startup::All);
    let errors: Vec<String> = registry
        .wait_started()
        .await
        .iter()
        .map(|e| e.to_string())
        .collect();
    assert_eq!(errors.len(), 2, "{errors:?}");
    assert!(errors[0].contains("version 1 failed to load"), "{errors:?}");
    assert_eq!(
        errors[1],
        "model \"empty\" has no version directory holding model.onnx"
    );
}
