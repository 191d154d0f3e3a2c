//! Reconnect delays and limits. Attempts that fail back off exponentially, with jitter, up
//! to a cap; a connection that worked (it decoded a picture) wipes that slate, so the next
//! outage starts again with a fast first retry instead of where the last outage left off.
//! An attempt the camera answered (the stream opened) but that failed before a picture
//! shows the camera is back, so it too starts the schedule again. A cap on how often such
//! connections may start keeps a camera that accepts and drops at once from causing a
//! reconnect storm.
//!
//! Each attempt also gets a limit on opening. A camera that is rebooting often does not
//! answer at all (no refusal), so an attempt hangs until its limit: right after an outage
//! begins the limit is short (`first_connect_timeout`), so the camera is found soon after
//! it returns, and each attempt that hangs doubles it up to the stream's connect timeout,
//! so a slow camera far away still gets through. The first frame of a connection has the
//! same kind of limit (`first_frame_timeout`): a camera that opened but sends nothing is
//! tried again soon, and each attempt that stays silent doubles the limit up to the
//! stream's frame timeout, so a camera that starts with a long wait for its key frame
//! still gets through.
//!
//! Pure arithmetic: the time and the randomness are passed in, so the schedule is
//! unit-tested exactly.

use std::time::Duration;

use tokio::time::Instant;

/// How a stream waits between connection attempts.
#[derive(Debug, Clone, PartialEq)]
pub struct BackoffPolicy {
    /// Delay before the first attempt after a working connection ended: most drops are a
    /// blip or a quick reboot, and a camera that is back should be found at once.
    pub first_retry: Duration,
    /// Delay after the first failed attempt.
    pub initial: Duration,
    /// Longest delay, jitter included.
    pub max: Duration,
    /// Growth per consecutive failure.
    pub multiplier: f64,
    /// Each delay is scaled by a random factor in `[1 - jitter, 1 + jitter]`, so cameras
    /// behind one failed switch do not all reconnect in the same instant.
    pub jitter: f64,
    /// Working connections start at most this often: after one ends, the next attempt
    /// waits until this long after it began.
    pub min_connection_interval: Duration,
    /// Limit on opening for the first attempt of an outage; doubled by each attempt that
    /// hangs, up to the stream's connect timeout. Zero: always the connect timeout.
    pub first_connect_timeout: Duration,
    /// Limit on a connection's first frame, after an outage; doubled by each attempt that
    /// opened but stayed silent, up to the stream's frame timeout. Zero: always the frame
    /// timeout.
    pub first_frame_timeout: Duration,
}

impl Default for BackoffPolicy {
    fn default() -> Self {
        Self {
            first_retry: Duration::from_millis(100),
            initial: Duration::from_millis(250),
            max: Duration::from_secs(8),
            multiplier: 2.0,
            jitter: 0.2,
            min_connection_interval: Duration::from_secs(2),
            // A camera on its network answers within milliseconds; RTSP's DESCRIBE, SETUP
            // and PLAY take well under a second even on a busy one.
            first_connect_timeout: Duration::from_secs(2),
            // A camera streams within a frame or two of PLAY; measured on GStreamer's RTSP
            // server, one fresh start in twenty sent nothing on its first connection
            // (docs/benchmarks.md, issue 22).
            first_frame_timeout: Duration::from_secs(2),
        }
    }
}

/// The state of one stream's schedule.
#[derive(Debug, Clone)]
pub struct Backoff {
    policy: BackoffPolicy,
    /// Failed attempts since the last working connection.
    failures: u32,
    /// Attempts in a row that hung until their limit on opening.
    hung: u32,
    /// Attempts the camera answered but that failed before a picture, since the last
    /// working connection.
    answered: u32,
}

impl Backoff {
    pub fn new(policy: BackoffPolicy) -> Self {
        Self {
            policy,
            failures: 0,
            hung: 0,
            answered: 0,
        }
    }

    /// The limit on opening for the next attempt, at most `cap` (the stream's connect
    /// timeout).
    pub fn connect_timeout(&self, cap: Duration) -> Duration {
        doubled(self.policy.first_connect_timeout, self.hung, cap)
    }

    /// The limit on the next connection's first frame, at most `cap` (the stream's frame
    /// timeout).
    pub fn first_frame_timeout(&self, cap: Duration) -> Duration {
        doubled(self.policy.first_frame_timeout, self.answered, cap)
    }

    /// Failed attempts counted since the last working connection.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// The delay before the next attempt, after one that failed without an answer from
    /// the camera (refused, unreachable, or an error before the stream opened).
    /// `unit_random` is uniform in [0, 1).
    pub fn after_failure(&mut self, unit_random: f64) -> Duration {
        self.hung = 0;
        self.grow(unit_random)
    }

    /// The delay before the next attempt, after one that hung until its limit on opening:
    /// the next attempt may wait twice as long for an answer.
    pub fn after_hang(&mut self, unit_random: f64) -> Duration {
        self.hung = self.hung.saturating_add(1);
        self.grow(unit_random)
    }

    /// The delay before the next attempt, after one that began at `started` and that the
    /// camera answered (the stream opened) but that failed at `now` before a picture was
    /// decoded: the camera is back, so the outage's failures are forgiven and the schedule
    /// starts again, as often as working connections may start.
    /// Such attempts in a row grow their own delay from `initial`, so a camera that
    /// answers but never streams ends up tried as rarely as one that is down.
    pub fn after_answered(&mut self, started: Instant, now: Instant, unit_random: f64) -> Duration {
        self.failures = 0;
        self.hung = 0;
        let delay = self.exponential(self.answered, unit_random);
        self.answered = self.answered.saturating_add(1);
        delay.max(self.rate_cap(started, now))
    }

    fn grow(&mut self, unit_random: f64) -> Duration {
        let delay = self.exponential(self.failures, unit_random);
        self.failures = self.failures.saturating_add(1);
        delay
    }

    /// `initial` grown `steps` times, jittered and capped.
    fn exponential(&self, steps: u32, unit_random: f64) -> Duration {
        let p = &self.policy;
        let exponent = i32::try_from(steps).unwrap_or(i32::MAX).min(64);
        let base = p.initial.as_secs_f64() * p.multiplier.max(1.0).powi(exponent);
        self.jittered(base, unit_random)
    }

    /// The delay before the next attempt, after a connection that began at `started` and
    /// worked ended at `now`: the failures before it are forgiven.
    pub fn after_working(&mut self, started: Instant, now: Instant, unit_random: f64) -> Duration {
        self.failures = 0;
        self.hung = 0;
        self.answered = 0;
        let fast = self.jittered(self.policy.first_retry.as_secs_f64(), unit_random);
        fast.max(self.rate_cap(started, now))
    }

    /// How long until a connection may start again after one that began at `started`.
    fn rate_cap(&self, started: Instant, now: Instant) -> Duration {
        (started + self.policy.min_connection_interval).saturating_duration_since(now)
    }

    fn jittered(&self, base_secs: f64, unit_random: f64) -> Duration {
        let p = &self.policy;
        let max = p.max.as_secs_f64();
        let jitter = p.jitter.clamp(0.0, 1.0);
        let factor = 1.0 - jitter + 2.0 * jitter * unit_random.clamp(0.0, 1.0);
        let secs = (base_secs.min(max) * factor).min(max);
        Duration::try_from_secs_f64(secs).unwrap_or(p.max)
    }
}

/// `first` doubled `times` times, at most `cap`; `cap` when `first` is zero.
fn doubled(first: Duration, times: u32, cap: Duration) -> Duration {
    if first.is_zero() {
        return cap;
    }
    let exponent = i32::try_from(times).unwrap_or(i32::MAX).min(32);
    Duration::try_from_secs_f64(first.as_secs_f64() * 2f64.powi(exponent)).map_or(cap, |limit| limit.min(cap))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> BackoffPolicy {
        BackoffPolicy {
            first_retry: Duration::from_millis(20),
            initial: Duration::from_millis(100),
            max: Duration::from_secs(1),
            multiplier: 2.0,
            jitter: 0.5,
            min_connection_interval: Duration::from_secs(3),
            first_connect_timeout: Duration::from_secs(2),
            first_frame_timeout: Duration::from_secs(1),
        }
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn failures_double_up_to_the_cap_without_jitter_at_the_midpoint() {
        let mut b = Backoff::new(policy());
        let delays: Vec<u128> = (0..6).map(|_| b.after_failure(0.5).as_millis()).collect();
        assert_eq!(delays, [100, 200, 400, 800, 1000, 1000]);
        assert_eq!(b.failures(), 6);
    }

    #[test]
    fn jitter_stays_within_its_band_and_under_the_cap() {
        let mut low = Backoff::new(policy());
        let mut high = Backoff::new(policy());
        assert_eq!(low.after_failure(0.0), ms(50));
        assert_eq!(high.after_failure(0.999_999).as_millis(), 149);
        for _ in 0..10 {
            assert!(high.after_failure(0.999) <= Duration::from_secs(1));
        }
    }

    #[test]
    fn a_working_connection_forgives_the_failures_before_it() {
        let t0 = Instant::now();
        let mut b = Backoff::new(policy());
        for _ in 0..5 {
            b.after_failure(0.5);
        }
        assert_eq!(b.failures(), 5);
        // Streamed 10 s: well past the rate cap, so the first retry is the fast one.
        assert_eq!(b.after_working(t0, t0 + Duration::from_secs(10), 0.5), ms(20));
        assert_eq!(b.failures(), 0);
        let next: Vec<Duration> = (0..3).map(|_| b.after_failure(0.5)).collect();
        assert_eq!(
            next,
            [ms(100), ms(200), ms(400)],
            "the outage starts from the start"
        );
    }

    #[test]
    fn a_camera_that_accepts_and_drops_at_once_reconnects_at_most_once_per_interval() {
        let mut b = Backoff::new(policy());
        let mut now = Instant::now();
        let mut starts = Vec::new();
        for _ in 0..5 {
            // Connects, decodes one picture, drops 50 ms later.
            let started = now;
            starts.push(started);
            now += ms(50);
            now += b.after_working(started, now, 0.5);
        }
        let gaps: Vec<Duration> = starts.windows(2).map(|w| w[1] - w[0]).collect();
        assert_eq!(gaps, [Duration::from_secs(3); 4]);
    }

    #[test]
    fn the_rate_cap_only_delays_the_first_retry_as_long_as_needed() {
        let t0 = Instant::now();
        for (worked_for, expected) in [
            (ms(0), ms(3000)),
            (ms(2900), ms(100)),
            (ms(2990), ms(20)),
            (ms(60_000), ms(20)),
        ] {
            let mut b = Backoff::new(policy());
            assert_eq!(
                b.after_working(t0, t0 + worked_for, 0.5),
                expected,
                "{worked_for:?}"
            );
        }
    }

    #[test]
    fn an_answer_that_fails_before_a_picture_starts_the_schedule_again() {
        let t0 = Instant::now();
        let mut b = Backoff::new(policy());
        for _ in 0..5 {
            b.after_failure(0.5);
        }
        // Opened at t0, no picture within 5 s: the camera is back, retry soon.
        let delay = b.after_answered(t0, t0 + Duration::from_secs(5), 0.5);
        assert_eq!(delay, ms(100));
        assert_eq!(b.failures(), 0);
        assert_eq!(
            b.after_failure(0.5),
            ms(100),
            "a refusal after it starts from the start"
        );
    }

    #[test]
    fn answers_that_keep_failing_grow_their_own_delay_until_a_connection_works() {
        let t0 = Instant::now();
        let late = t0 + Duration::from_secs(60);
        let mut b = Backoff::new(policy());
        let delays: Vec<u128> = (0..5)
            .map(|_| b.after_answered(t0, late, 0.5).as_millis())
            .collect();
        assert_eq!(delays, [100, 200, 400, 800, 1000]);
        b.after_working(t0, late, 0.5);
        assert_eq!(b.after_answered(t0, late, 0.5), ms(100));
    }

    #[test]
    fn a_camera_that_answers_and_drops_at_once_is_tried_at_most_once_per_interval() {
        let mut b = Backoff::new(policy());
        let mut now = Instant::now();
        let mut starts = Vec::new();
        for _ in 0..4 {
            let started = now;
            starts.push(started);
            now += ms(30);
            now += b.after_answered(started, now, 0.5);
        }
        let gaps: Vec<Duration> = starts.windows(2).map(|w| w[1] - w[0]).collect();
        assert_eq!(gaps, [Duration::from_secs(3); 3]);
    }

    #[test]
    fn hanging_attempts_double_the_limit_up_to_the_connect_timeout() {
        let cap = Duration::from_secs(10);
        let mut b = Backoff::new(policy());
        let mut limits = vec![b.connect_timeout(cap)];
        for _ in 0..4 {
            b.after_hang(0.5);
            limits.push(b.connect_timeout(cap));
        }
        let secs: Vec<u64> = limits.iter().map(Duration::as_secs).collect();
        assert_eq!(secs, [2, 4, 8, 10, 10]);
        assert_eq!(b.failures(), 4, "a hang is a failure too");
    }

    #[test]
    fn any_answer_brings_the_limit_back_to_the_first() {
        let cap = Duration::from_secs(10);
        let t0 = Instant::now();
        for end in [
            (|b: &mut Backoff, _| {
                b.after_failure(0.5);
            }) as fn(&mut Backoff, Instant),
            |b, t0| {
                b.after_answered(t0, t0, 0.5);
            },
            |b, t0| {
                b.after_working(t0, t0, 0.5);
            },
        ] {
            let mut b = Backoff::new(policy());
            b.after_hang(0.5);
            b.after_hang(0.5);
            assert_eq!(b.connect_timeout(cap), Duration::from_secs(8));
            end(&mut b, t0);
            assert_eq!(b.connect_timeout(cap), Duration::from_secs(2));
        }
    }

    #[test]
    fn a_zero_first_limit_or_a_short_cap_keeps_the_connect_timeout() {
        let off = BackoffPolicy {
            first_connect_timeout: Duration::ZERO,
            ..policy()
        };
        assert_eq!(Backoff::new(off).connect_timeout(ms(7000)), ms(7000));
        assert_eq!(Backoff::new(policy()).connect_timeout(ms(500)), ms(500));
    }

    #[test]
    fn silent_connections_double_the_first_frame_limit_until_one_works() {
        let cap = Duration::from_secs(5);
        let t0 = Instant::now();
        let mut b = Backoff::new(policy());
        let mut limits = vec![b.first_frame_timeout(cap)];
        for _ in 0..3 {
            b.after_answered(t0, t0, 0.5);
            limits.push(b.first_frame_timeout(cap));
        }
        let got: Vec<u128> = limits.iter().map(Duration::as_millis).collect();
        assert_eq!(got, [1000, 2000, 4000, 5000]);
        b.after_working(t0, t0, 0.5);
        assert_eq!(b.first_frame_timeout(cap), ms(1000));
    }
}
