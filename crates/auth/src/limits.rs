//! Per-key limits: a request rate (governor's GCRA) and requests at once (permits).

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use governor::clock::Clock;
use governor::middleware::NoOpMiddleware;
use governor::state::{InMemoryState, NotKeyed};
use governor::{Quota, RateLimiter};

use crate::keys::KeyLimits;

type Rate<C> = RateLimiter<NotKeyed, InMemoryState, C, NoOpMiddleware<<C as Clock>::Instant>>;

/// The limits of one key, with their state.
pub(crate) struct KeyLimiter<C: Clock> {
    rate: Option<Rate<C>>,
    concurrency: Option<Arc<Concurrency>>,
}

/// Why a key's request may not start now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Limited {
    /// Over the request rate: the next request fits after this long.
    Rate(Duration),
    /// This many requests of the key are already being answered.
    Concurrency(u32),
}

impl<C: Clock + Clone> KeyLimiter<C> {
    pub(crate) fn new(limits: &KeyLimits, clock: &C) -> Self {
        let rate = limits.requests_per_s.and_then(NonZeroU32::new).map(|per_s| {
            let clock = C::clone(clock);
            let burst = limits.burst.and_then(NonZeroU32::new).unwrap_or(per_s);
            RateLimiter::direct_with_clock(Quota::per_second(per_s).allow_burst(burst), clock)
        });
        let concurrency = limits.max_concurrent.map(|max| {
            Arc::new(Concurrency {
                max,
                running: AtomicU32::new(0),
            })
        });
        KeyLimiter { rate, concurrency }
    }

    /// Takes a concurrency permit (if the key has a limit), then a unit of rate. A request
    /// refused for its rate gives its permit back at once.
    pub(crate) fn admit(&self, clock: &C) -> Result<Option<Permit>, Limited> {
        let permit = match &self.concurrency {
            Some(c) => Some(Permit::take(c).ok_or(Limited::Concurrency(c.max))?),
            None => None,
        };
        if let Some(rate) = &self.rate {
            rate.check()
                .map_err(|not_until| Limited::Rate(not_until.wait_time_from(clock.now())))?;
        }
        Ok(permit)
    }
}

pub(crate) struct Concurrency {
    max: u32,
    running: AtomicU32,
}

/// One of a key's concurrent requests; dropping it (when the response is sent) frees the
/// place.
#[derive(Debug)]
pub struct Permit {
    of: Arc<Concurrency>,
}

impl std::fmt::Debug for Concurrency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.running.load(Ordering::Relaxed), self.max)
    }
}

impl Permit {
    fn take(of: &Arc<Concurrency>) -> Option<Permit> {
        of.running
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < of.max).then_some(n + 1)
            })
            .ok()
            .map(|_| Permit { of: of.clone() })
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.of.running.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use governor::clock::FakeRelativeClock;

    use super::*;

    #[test]
    fn the_rate_allows_the_burst_then_refills_at_the_sustained_rate() {
        let clock = FakeRelativeClock::default();
        let limits = KeyLimits {
            requests_per_s: Some(2),
            burst: Some(3),
            max_concurrent: None,
        };
        let limiter = KeyLimiter::new(&limits, &clock);
        for _ in 0..3 {
            assert!(limiter.admit(&clock).is_ok());
        }
        assert_eq!(
            limiter.admit(&clock).unwrap_err(),
            Limited::Rate(Duration::from_millis(500))
        );
        clock.advance(Duration::from_millis(499));
        assert!(matches!(limiter.admit(&clock), Err(Limited::Rate(_))));
        clock.advance(Duration::from_millis(1));
        assert!(limiter.admit(&clock).is_ok());
        assert!(
            limiter.admit(&clock).is_err(),
            "one request per 500 ms once the burst is spent"
        );
    }

    #[test]
    fn permits_limit_requests_at_once_and_free_their_place_on_drop() {
        let clock = FakeRelativeClock::default();
        let limits = KeyLimits {
            max_concurrent: Some(2),
            ..KeyLimits::default()
        };
        let limiter = KeyLimiter::new(&limits, &clock);
        let first = limiter.admit(&clock).unwrap();
        let second = limiter.admit(&clock).unwrap();
        assert!(first.is_some() && second.is_some());
        assert_eq!(limiter.admit(&clock).unwrap_err(), Limited::Concurrency(2));
        drop(first);
        let third = limiter.admit(&clock).unwrap();
        assert_eq!(limiter.admit(&clock).unwrap_err(), Limited::Concurrency(2));
        drop((second, third));
        assert!(limiter.admit(&clock).is_ok());
    }

    #[test]
    fn a_request_refused_for_its_rate_does_not_keep_its_permit() {
        let clock = FakeRelativeClock::default();
        let limits = KeyLimits {
            requests_per_s: Some(1),
            burst: None,
            max_concurrent: Some(1),
        };
        let limiter = KeyLimiter::new(&limits, &clock);
        drop(limiter.admit(&clock).unwrap());
        assert!(matches!(limiter.admit(&clock), Err(Limited::Rate(_))));
        clock.advance(Duration::from_secs(1));
        assert!(
            limiter.admit(&clock).unwrap().is_some(),
            "the place was free again"
        );
    }
}
