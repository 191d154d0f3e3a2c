//! Canary rollouts over a real repository and fake engines: a slow canary is rolled back, a
//! healthy one promoted, both under continuous load with no failed request, and rollout
//! requests refused with reasons.

use super::*;

/// Clients sending requests that name no version until `stop`; each returns the version
/// that answered every request, or its error.
fn clients(
    registry: &ModelRegistry,
    n: usize,
    stop: &Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<Vec<Result<String, String>>>> {
    (0..n)
        .map(|_| {
            let (registry, stop) = (registry.clone(), stop.clone());
            tokio::spawn(async move {
                let mut answers = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    answers.push(detect(&registry, "det", None).await);
                }
                answers
            })
        })
        .collect()
}

/// Every answer of every client, which must all have succeeded, as version numbers.
async fn versions(clients: Vec<tokio::task::JoinHandle<Vec<Result<String, String>>>>) -> Vec<Vec<u64>> {
    let mut all = Vec::new();
    for client in clients {
        let answers = client.await.unwrap();
        let versions: Vec<u64> = answers
            .into_iter()
            .map(|a| a.expect("no request fails during a rollout").parse().unwrap())
            .collect();
        all.push(versions);
    }
    all
}

fn version_state(registry: &ModelRegistry, version: u64) -> Option<(VersionState, Option<String>)> {
    let snap = registry.snapshot();
    let v = snap
        .models
        .get("det")?
        .versions
        .iter()
        .find(|v| v.version == version)?;
    Some((v.state, v.reason.clone()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_canary_is_rolled_back_while_the_stable_version_serves_and_no_request_fails() {
    let repo = Repo::new("rollback");
    repo.put("det", 1, "ok");
    repo.config(
        "det",
        "[rollout]\ncanary_percent = 50\npromote_after_s = 3600\nmax_p99_ms = 20\n",
    );
    let registry = start(&repo, Some(Duration::from_millis(20)), Startup::All);
    assert!(registry.wait_started().await.is_empty());
    let stop = Arc::new(AtomicBool::new(false));
    let load = clients(&registry, 3, &stop);
    repo.put("det", 2, "slow");
    eventually("version 2 is a canary", || {
        registry.snapshot().models["det"].rollout.is_some()
    })
    .await;
    let index = registry.index(false).await.unwrap();
    assert!(
        index[1].reason.as_deref().unwrap().starts_with("canary for 50%"),
        "{index:?}"
    );
    assert!(
        index[0].reason.as_deref().unwrap().starts_with("stable"),
        "{index:?}"
    );
    eventually("version 2 is rolled back", || {
        version_state(&registry, 2).is_some_and(|(s, _)| s == VersionState::Unavailable)
    })
    .await;
    let (_, reason) = version_state(&registry, 2).unwrap();
    let reason = reason.unwrap();
    assert!(
        reason.starts_with("rolled back: P99 ") && reason.contains("above max_p99_ms 20"),
        "{reason}"
    );
    assert!(registry.snapshot().models["det"].rollout.is_none());
    // Polling (every 20 ms) does not bring the same files back: a hundred requests later
    // only the stable version serves, and the canary is still listed as rolled back.
    for _ in 0..100 {
        assert_eq!(detect(&registry, "det", None).await.unwrap(), "1");
    }
    assert_eq!(version_state(&registry, 2).unwrap().0, VersionState::Unavailable);
    stop.store(true, Ordering::Relaxed);
    let served = versions(load).await;
    assert!(
        served.iter().flatten().any(|&v| v == 2),
        "the canary took traffic"
    );
    for versions in &served {
        assert_eq!(versions.last(), Some(&1));
    }
    assert_eq!(version_state(&registry, 1).unwrap().0, VersionState::Ready);
    // A load request asks for it again: it is a canary once more.
    registry.load("det").await.unwrap();
    let rollout = registry.snapshot().models["det"]
        .rollout
        .clone()
        .expect("a canary again");
    assert_eq!((rollout.plan.stable, rollout.plan.canary), (1, 2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_canary_is_promoted_and_the_old_version_retired_with_no_failed_request() {
    let repo = Repo::new("promote");
    repo.put("det", 1, "ok");
    repo.config(
        "det",
        "[rollout]\ncanary_percent = 20\npromote_after_s = 1\nmax_p99_ms = 2000\n",
    );
    let registry = start(&repo, Some(Duration::from_millis(20)), Startup::All);
    assert!(registry.wait_started().await.is_empty());
    let stop = Arc::new(AtomicBool::new(false));
    let load = clients(&registry, 3, &stop);
    repo.put("det", 2, "ok");
    eventually("version 2 is a canary", || {
        registry.snapshot().models["det"].rollout.is_some()
    })
    .await;
    eventually("version 1 is retired", || version_state(&registry, 1).is_none()).await;
    assert!(registry.snapshot().models["det"].rollout.is_none());
    // Every request routed after the promotion goes to version 2. (A client's request
    // routed just before it may still end on version 1, which finishes what it holds.)
    for _ in 0..20 {
        assert_eq!(detect(&registry, "det", None).await.unwrap(), "2");
    }
    stop.store(true, Ordering::Relaxed);
    let served = versions(load).await;
    let all: Vec<u64> = served.iter().flatten().copied().collect();
    let canary = all.iter().filter(|&&v| v == 2).count();
    assert!(canary > 0 && all.contains(&1), "both served");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollout_requests_split_the_traffic_and_are_refused_with_reasons() {
    let repo = Repo::new("rollout-api");
    repo.put("det", 1, "ok");
    let registry = start(&repo, None, Startup::All);
    assert!(registry.wait_started().await.is_empty());
    let start = |version| RolloutAction::Start {
        version,
        policy: RolloutFile {
            canary_percent: Some(25),
            ..Default::default()
        },
    };
    let refused = |e: RegistryError| match e {
        RegistryError::RolloutRefused { reason, .. } => reason,
        other => panic!("{other:?}"),
    };
    let why = refused(registry.rollout("det", start(None)).await.unwrap_err());
    assert!(why.contains("only version 1 is loaded"), "{why}");
    let why = refused(registry.rollout("det", RolloutAction::Abort).await.unwrap_err());
    assert_eq!(why, "no rollout is in progress");
    assert!(matches!(
        registry.rollout("nope", RolloutAction::Promote).await,
        Err(RegistryError::NotLoaded { .. })
    ));
    repo.config("det", "version_policy = \"all\"\n");
    repo.put("det", 2, "ok");
    registry.load("det").await.unwrap();
    let why = refused(registry.rollout("det", start(Some(7))).await.unwrap_err());
    assert_eq!(why, "version 7 is not ready; ready: 1, 2");
    let status = registry.rollout("det", start(None)).await.unwrap();
    assert_eq!((status.stable, status.canary, status.canary_percent), (1, 2, 25));
    let why = refused(registry.rollout("det", start(None)).await.unwrap_err());
    assert!(
        why.starts_with("version 2 is already rolling out beside version 1"),
        "{why}"
    );
    // Exactly one request in four that names no version goes to the canary; named
    // versions are served as named; the default version is the stable one meanwhile.
    let mut served = Vec::new();
    for _ in 0..40 {
        served.push(detect(&registry, "det", None).await.unwrap());
    }
    assert_eq!(served.iter().filter(|v| *v == "2").count(), 10, "{served:?}");
    assert_eq!(detect(&registry, "det", Some(2)).await.unwrap(), "2");
    assert_eq!(registry.engine("det", None).unwrap().version(), "1");
    let status = registry.rollout("det", RolloutAction::Promote).await.unwrap();
    assert_eq!(status.outcome, "promoted");
    // The version policy keeps both; the promoted one is the default now.
    assert_eq!(detect(&registry, "det", None).await.unwrap(), "2");
    assert_eq!(version_state(&registry, 1).unwrap().0, VersionState::Ready);
}
