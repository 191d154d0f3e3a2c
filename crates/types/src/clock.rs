//! The wall clock as a value, so code that stamps results with the time of day (capture,
//! publish, "next attempt at") can be tested with a clock the test sets. Monotonic time
//! stays with the runtime (tokio's paused clock covers it); this is only the calendar.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Where wall-clock readings come from.
pub trait WallClock: std::fmt::Debug + Send + Sync + 'static {
    fn now(&self) -> SystemTime;
}

/// The operating system's clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemWallClock;

impl WallClock for SystemWallClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// A clock that moves only when told to (tests). Nanosecond resolution, from 1970 to 2554.
#[derive(Debug)]
pub struct ManualWallClock {
    nanos_since_epoch: AtomicU64,
}

impl ManualWallClock {
    /// A clock showing `start`; times before 1970 read as 1970.
    pub fn new(start: SystemTime) -> Self {
        let clock = Self {
            nanos_since_epoch: AtomicU64::new(0),
        };
        clock.set(start);
        clock
    }

    pub fn set(&self, time: SystemTime) {
        let nanos = time.duration_since(UNIX_EPOCH).unwrap_or_default().as_nanos();
        self.nanos_since_epoch
            .store(u64::try_from(nanos).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    pub fn advance(&self, by: Duration) {
        let by = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        let _ = self
            .nanos_since_epoch
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                Some(n.saturating_add(by))
            });
    }
}

impl WallClock for ManualWallClock {
    fn now(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_nanos(self.nanos_since_epoch.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_shows_what_it_was_set_to_and_advances_on_request() {
        let start = UNIX_EPOCH + Duration::from_secs(1_704_067_200);
        let clock = ManualWallClock::new(start);
        assert_eq!(clock.now(), start);
        assert_eq!(clock.now(), start, "does not move by itself");
        clock.advance(Duration::from_millis(1500));
        assert_eq!(clock.now(), start + Duration::from_millis(1500));
        clock.set(UNIX_EPOCH);
        assert_eq!(clock.now(), UNIX_EPOCH);
    }

    #[test]
    fn the_system_clock_reads_the_time_of_day() {
        let before = SystemTime::now();
        let read = SystemWallClock.now();
        assert!(read >= before && read <= SystemTime::now());
    }
}
