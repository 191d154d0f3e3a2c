//! Reconnect delays: exponential with jitter, capped, and forgiven after a healthy spell.
//! Pure arithmetic with the randomness passed in, so the schedule is unit-tested exactly.

use std::time::Duration;

/// How a stream waits between connection attempts.
#[derive(Debug, Clone, PartialEq)]
pub struct BackoffPolicy {
    /// Delay after the first failure.
    pub initial: Duration,
    /// Longest delay, jitter included.
    pub max: Duration,
    /// Growth per consecutive failure.
    pub multiplier: f64,
    /// Each delay is scaled by a random factor in `[1 - jitter, 1 + jitter]`, so cameras
    /// behind one failed switch do not all reconnect in the same instant.
    pub jitter: f64,
    /// A connection that streamed this long counts as healthy: the next failure starts
    /// the schedule over from `initial`.
    pub reset_after: Duration,
}

impl Default for BackoffPolicy {
    fn default() -> Self {
        Self {
            initial: Duration::from_millis(250),
            max: Duration::from_secs(8),
            multiplier: 2.0,
            jitter: 0.2,
            reset_after: Duration::from_secs(30),
        }
    }
}

/// The state of one stream's schedule: how many failures in a row.
#[derive(Debug, Clone)]
pub struct Backoff {
    policy: BackoffPolicy,
    failures: u32,
}

impl Backoff {
    pub fn new(policy: BackoffPolicy) -> Self {
        Self { policy, failures: 0 }
    }

    /// Consecutive failures counted so far.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// The delay before the next attempt, after an attempt that failed having streamed
    /// for `healthy_for` (zero if it never connected). `unit_random` is uniform in [0, 1).
    pub fn next_delay(&mut self, healthy_for: Duration, unit_random: f64) -> Duration {
        if healthy_for >= self.policy.reset_after {
            self.failures = 0;
        }
        let p = &self.policy;
        let exponent = i32::try_from(self.failures).unwrap_or(i32::MAX).min(64);
        let base = p.initial.as_secs_f64() * p.multiplier.max(1.0).powi(exponent);
        let jitter = p.jitter.clamp(0.0, 1.0);
        let factor = 1.0 - jitter + 2.0 * jitter * unit_random.clamp(0.0, 1.0);
        let secs = (base.min(p.max.as_secs_f64()) * factor).min(p.max.as_secs_f64());
        self.failures = self.failures.saturating_add(1);
        Duration::try_from_secs_f64(secs).unwrap_or(p.max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> BackoffPolicy {
        BackoffPolicy {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(1),
            multiplier: 2.0,
            jitter: 0.5,
            reset_after: Duration::from_secs(10),
        }
    }

    #[test]
    fn doubles_up_to_the_cap_without_jitter_at_the_midpoint() {
        let mut b = Backoff::new(policy());
        let delays: Vec<u128> = (0..6)
            .map(|_| b.next_delay(Duration::ZERO, 0.5).as_millis())
            .collect();
        assert_eq!(delays, [100, 200, 400, 800, 1000, 1000]);
        assert_eq!(b.failures(), 6);
    }

    #[test]
    fn jitter_stays_within_its_band_and_under_the_cap() {
        let mut low = Backoff::new(policy());
        let mut high = Backoff::new(policy());
        assert_eq!(low.next_delay(Duration::ZERO, 0.0), Duration::from_millis(50));
        assert_eq!(high.next_delay(Duration::ZERO, 0.999_999).as_millis(), 149);
        for _ in 0..10 {
            assert!(high.next_delay(Duration::ZERO, 0.999) <= Duration::from_secs(1));
        }
    }

    #[test]
    fn a_healthy_connection_resets_the_schedule() {
        let mut b = Backoff::new(policy());
        for _ in 0..5 {
            b.next_delay(Duration::from_secs(1), 0.5);
        }
        assert_eq!(
            b.next_delay(Duration::from_secs(9), 0.5),
            Duration::from_secs(1),
            "not healthy long enough"
        );
        assert_eq!(
            b.next_delay(Duration::from_secs(10), 0.5),
            Duration::from_millis(100)
        );
        assert_eq!(b.next_delay(Duration::ZERO, 0.5), Duration::from_millis(200));
    }
}
