//! Gradual rollout of a new version (a canary) beside the one serving (the stable), as
//! plain state: the policy, the split of requests that name no version, and the verdict
//! on the canary's latency window. No clock, no engines: the owner task feeds it the
//! canary's [`WindowStats`] and carries out what it decides.
//!
//! The canary is judged on its own window: at once when its P99 or error rate breaks the
//! policy (rolled back), and promoted once it has served `promote_after` within both.
//! A window with fewer than [`MIN_REQUESTS`] requests is not judged either way: a P99 of
//! three requests says nothing, and a canary nobody sends traffic to is not promoted.

use std::time::{Duration, Instant};

use peregrine_engine::WindowStats;
use serde::Deserialize;

use crate::settings::SettingsError;

/// Requests a canary's window must hold before it is judged.
pub const MIN_REQUESTS: u64 = 20;

/// How a new version is rolled out.
#[derive(Debug, Clone, PartialEq)]
pub struct RolloutPolicy {
    /// Share of the requests that name no version sent to the canary, 1 to 99.
    pub canary_percent: u8,
    /// How long the canary must hold its limits before it is promoted.
    pub promote_after: Duration,
    /// The canary's windowed P99 above which it is rolled back; `None` takes the model's
    /// objective (`[slo] p99_ms`), and without one only errors are judged.
    pub max_p99: Option<Duration>,
    /// Failed requests (inference errors, deadlines passed) as a share of the canary's,
    /// above which it is rolled back.
    pub max_error_rate: f64,
}

impl Default for RolloutPolicy {
    fn default() -> Self {
        Self {
            canary_percent: 10,
            promote_after: Duration::from_secs(60),
            max_p99: None,
            max_error_rate: 0.01,
        }
    }
}

/// `[rollout]` in a model's `config.toml`, and the body of a rollout request: every key
/// optional, each over the defaults (or the model's own `[rollout]`, for a request).
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct RolloutFile {
    pub canary_percent: Option<u8>,
    pub promote_after_s: Option<u64>,
    pub max_p99_ms: Option<u64>,
    pub max_error_rate: Option<f64>,
}

impl RolloutFile {
    /// These keys laid over `base`, checked; errors name the key.
    pub fn apply(&self, base: &RolloutPolicy) -> Result<RolloutPolicy, SettingsError> {
        let mut p = base.clone();
        if let Some(v) = self.canary_percent {
            p.canary_percent = v;
        }
        if let Some(v) = self.promote_after_s {
            p.promote_after = Duration::from_secs(v);
        }
        if let Some(v) = self.max_p99_ms {
            p.max_p99 = Some(Duration::from_millis(v));
        }
        if let Some(v) = self.max_error_rate {
            p.max_error_rate = v;
        }
        p.validate()?;
        Ok(p)
    }
}

impl RolloutPolicy {
    pub fn validate(&self) -> Result<(), SettingsError> {
        let bad = |m: String| Err(SettingsError(m));
        if !(1..=99).contains(&self.canary_percent) {
            return bad(format!(
                "rollout.canary_percent must be 1 to 99, not {}",
                self.canary_percent
            ));
        }
        if self.max_p99 == Some(Duration::ZERO) {
            return bad("rollout.max_p99_ms must be at least 1".into());
        }
        if !(0.0..=1.0).contains(&self.max_error_rate) {
            return bad(format!(
                "rollout.max_error_rate is a share of requests, 0 to 1, not {}",
                self.max_error_rate
            ));
        }
        Ok(())
    }
}

/// What the canary's window decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Held its limits for `promote_after`: it serves alone from now on.
    Promote,
    /// Broke a limit: out of service at once; says which and by how much.
    RollBack(String),
}

impl Verdict {
    /// The outcome as `peregrine_rollouts_total` labels it.
    pub fn outcome(&self) -> &'static str {
        match self {
            Self::Promote => "promoted",
            Self::RollBack(_) => "rolled_back",
        }
    }
}

/// One rollout in progress.
#[derive(Debug, Clone, PartialEq)]
pub struct Rollout {
    pub stable: u64,
    pub canary: u64,
    /// With `max_p99` resolved against the model's objective.
    pub policy: RolloutPolicy,
    pub started: Instant,
}

impl Rollout {
    pub fn new(
        stable: u64,
        canary: u64,
        policy: RolloutPolicy,
        objective_p99: Option<Duration>,
        now: Instant,
    ) -> Self {
        let policy = RolloutPolicy {
            max_p99: policy.max_p99.or(objective_p99),
            ..policy
        };
        Self {
            stable,
            canary,
            policy,
            started: now,
        }
    }

    /// Judges the canary's window as of `now`.
    pub fn observe(&self, canary: &WindowStats, now: Instant) -> Option<Verdict> {
        let requests = canary.answered + canary.failed;
        if requests < MIN_REQUESTS {
            return None;
        }
        let rate = canary.error_rate();
        if rate > self.policy.max_error_rate {
            return Some(Verdict::RollBack(format!(
                "{:.1}% of its last {requests} requests failed, above max_error_rate {:.1}%",
                rate * 100.0,
                self.policy.max_error_rate * 100.0
            )));
        }
        if let Some(max) = self.policy.max_p99.filter(|max| canary.p99 > *max) {
            return Some(Verdict::RollBack(format!(
                "P99 {} ms over its last {requests} requests, above max_p99_ms {}",
                canary.p99.as_millis(),
                max.as_millis()
            )));
        }
        (now.saturating_duration_since(self.started) >= self.policy.promote_after).then_some(Verdict::Promote)
    }

    /// Whether the `n`-th request that names no version (counted from 0) goes to the
    /// canary: spread evenly, so that any run of requests splits by the percentage.
    pub fn takes_canary(n: u64, percent: u8) -> bool {
        let p = u64::from(percent);
        (n + 1) * p / 100 > n * p / 100
    }

    /// What the repository index says about the canary, as of `now`.
    pub fn describe_canary(&self, now: Instant) -> String {
        let limits = match self.policy.max_p99 {
            Some(p99) => format!("P99 within {} ms", p99.as_millis()),
            None => "no P99 limit".into(),
        };
        format!(
            "canary for {}% of requests that name no version, for {} s of the {} s before promotion ({limits}, errors within {:.1}%)",
            self.policy.canary_percent,
            now.saturating_duration_since(self.started).as_secs(),
            self.policy.promote_after.as_secs(),
            self.policy.max_error_rate * 100.0,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(answered: u64, failed: u64, p99_ms: u64) -> WindowStats {
        WindowStats {
            answered,
            failed,
            p99: Duration::from_millis(p99_ms),
            ..Default::default()
        }
    }

    fn rollout(max_p99_ms: Option<u64>, objective_ms: Option<u64>, t0: Instant) -> Rollout {
        let policy = RolloutPolicy {
            max_p99: max_p99_ms.map(Duration::from_millis),
            ..Default::default()
        };
        Rollout::new(1, 2, policy, objective_ms.map(Duration::from_millis), t0)
    }

    #[test]
    fn a_breach_rolls_back_at_once_and_says_what_broke() {
        let t0 = Instant::now();
        let r = rollout(Some(300), None, t0);
        let one_second = t0 + Duration::from_secs(1);
        assert_eq!(r.observe(&window(40, 0, 120), one_second), None);
        match r.observe(&window(40, 0, 812), one_second) {
            Some(Verdict::RollBack(why)) => {
                assert!(
                    why.contains("P99 812 ms") && why.contains("max_p99_ms 300"),
                    "{why}"
                )
            }
            other => panic!("{other:?}"),
        }
        match r.observe(&window(30, 2, 10), one_second) {
            Some(Verdict::RollBack(why)) => assert!(why.contains("6.2% of its last 32"), "{why}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn promotion_needs_the_whole_period_within_limits_and_enough_requests() {
        let t0 = Instant::now();
        let r = rollout(Some(300), None, t0);
        let later = t0 + Duration::from_secs(59);
        assert_eq!(r.observe(&window(500, 0, 100), later), None, "not yet 60 s");
        let due = t0 + Duration::from_secs(60);
        assert_eq!(r.observe(&window(500, 0, 100), due), Some(Verdict::Promote));
        assert_eq!(r.observe(&window(19, 0, 100), due), None, "too few to judge");
        assert_eq!(r.observe(&window(19, 0, 5000), due), None, "nor to roll back on");
    }

    #[test]
    fn without_its_own_limit_the_objective_is_the_limit_and_without_either_only_errors_count() {
        let t0 = Instant::now();
        let slow = window(100, 0, 900);
        assert!(matches!(
            rollout(None, Some(500), t0).observe(&slow, t0),
            Some(Verdict::RollBack(_))
        ));
        assert_eq!(rollout(Some(1000), Some(500), t0).observe(&slow, t0), None);
        assert_eq!(rollout(None, None, t0).observe(&slow, t0), None);
        assert!(matches!(
            rollout(None, None, t0).observe(&window(90, 10, 1), t0),
            Some(Verdict::RollBack(_))
        ));
    }

    #[test]
    fn the_split_is_even_and_exact_over_every_hundred_requests() {
        for percent in [1u8, 10, 33, 50, 99] {
            let canary: Vec<u64> = (0..1000).filter(|&n| Rollout::takes_canary(n, percent)).collect();
            assert_eq!(canary.len() as u64, 10 * u64::from(percent), "{percent}%");
            // No long runs: consecutive canary requests are never closer than 100/p - 1.
            let gaps = canary.windows(2).map(|w| w[1] - w[0]);
            assert!(gaps.clone().all(|g| g >= 100 / u64::from(percent)), "{percent}%");
        }
    }

    #[test]
    fn bad_settings_are_refused_naming_the_key() {
        let base = RolloutPolicy::default();
        let err = |f: RolloutFile| f.apply(&base).unwrap_err().0;
        assert!(err(RolloutFile {
            canary_percent: Some(0),
            ..Default::default()
        })
        .contains("rollout.canary_percent"));
        assert!(err(RolloutFile {
            canary_percent: Some(100),
            ..Default::default()
        })
        .contains("1 to 99"));
        assert!(err(RolloutFile {
            max_p99_ms: Some(0),
            ..Default::default()
        })
        .contains("rollout.max_p99_ms"));
        assert!(err(RolloutFile {
            max_error_rate: Some(1.5),
            ..Default::default()
        })
        .contains("rollout.max_error_rate"));
        let p = RolloutFile {
            canary_percent: Some(25),
            promote_after_s: Some(5),
            ..Default::default()
        }
        .apply(&base)
        .unwrap();
        assert_eq!((p.canary_percent, p.promote_after), (25, Duration::from_secs(5)));
    }
}
