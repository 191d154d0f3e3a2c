//! The wait estimator on recorded sequences, with explicit instants.

use super::*;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// `n` images in the batch queue, none decoding.
fn queued(n: usize) -> Ahead {
    Ahead {
        decoding: 0,
        queued: n,
    }
}

fn close(got: Duration, want: Duration) -> bool {
    got.abs_diff(want) <= Duration::from_micros(50)
}

/// Batch cycles of one instance (size, milliseconds) as the CPU server ran them under
/// overload: mostly full batches with the odd straggler.
const RECORDED: [(usize, u64); 12] = [
    (4, 212),
    (4, 198),
    (4, 205),
    (1, 61),
    (4, 231),
    (4, 190),
    (2, 118),
    (4, 201),
    (4, 209),
    (4, 196),
    (4, 214),
    (4, 203),
];

/// Plays `RECORDED` through the estimator as the queue task would: hand-over, then the
/// instance asking for work again when the batch is done.
fn replayed(t0: Instant) -> (WaitEstimator, Instant) {
    let mut w = WaitEstimator::new(4, 1, 2, ms(2));
    let mut now = t0;
    for (size, took) in RECORDED {
        w.batch_started(0, size, now);
        now += ms(took);
        w.instance_idle(0, now);
    }
    (w, now)
}

#[test]
fn nothing_learned_estimates_no_wait() {
    let w = WaitEstimator::new(4, 1, 2, ms(2));
    let now = Instant::now();
    let busy = Ahead {
        decoding: 3,
        queued: 40,
    };
    assert_eq!(w.estimate(busy, true, now), Duration::ZERO);
    assert!(w.is_idle(Ahead::default()));
    assert!(!w.is_idle(busy));
}

#[test]
fn costs_follow_the_recorded_batches_per_size() {
    let (w, _) = replayed(Instant::now());
    let full = w.batch_cost(4).unwrap().as_secs_f64() * 1e3;
    assert!((195.0..215.0).contains(&full), "full batch {full:.1} ms");
    // Size 1 ran once (61 ms), size 2 once (118 ms): each keeps its own figure.
    assert_eq!(w.batch_cost(1), Some(ms(61)));
    assert_eq!(w.batch_cost(2), Some(ms(118)));
    // Size 3 never ran: the nearest measured size (2 or 4, whichever is found first at
    // distance 1) scaled to 3 images.
    let three = w.batch_cost(3).unwrap();
    assert!(
        close(three, ms(177)) || close(three, w.batch_cost(4).unwrap() * 3 / 4),
        "{three:?}"
    );
}

#[test]
fn a_queue_position_waits_for_the_running_batch_and_the_full_batches_ahead() {
    let t0 = Instant::now();
    let mut w = WaitEstimator::new(4, 1, 2, ms(2));
    w.observe_batch(4, ms(200));
    w.observe_batch(1, ms(60));
    // A full batch taken 50 ms ago: 150 ms left.
    w.batch_started(0, 4, t0);
    let now = t0 + ms(50);
    let ahead = queued(9);
    // 150 ms running + 2 full batches ahead + its own batch, which fills up behind it
    // while it waits.
    let want = ms(150) + ms(400) + ms(200);
    assert!(
        close(w.estimate(ahead, false, now), want),
        "{:?}",
        w.estimate(ahead, false, now)
    );
    // With the instance free, it runs at once with the one queued: a batch of 2 (the
    // nearest measured size, 1, scaled: 120 ms), after the wait for company.
    w.instance_idle(0, now);
    let one_queued = queued(1);
    assert!(close(w.estimate(one_queued, false, now), ms(120) + ms(2)));
}

#[test]
fn instances_share_the_batches_ahead() {
    let t0 = Instant::now();
    let mut one = WaitEstimator::new(4, 1, 2, Duration::ZERO);
    let mut two = WaitEstimator::new(4, 2, 2, Duration::ZERO);
    for w in [&mut one, &mut two] {
        w.observe_batch(4, ms(200));
        w.observe_batch(1, ms(60));
    }
    let ahead = queued(15);
    // 3 full batches ahead then its own full batch: on one instance 4 x 200 ms; on two,
    // the first takes batches 1 and 3 (done at 200 and 400), the second batch 2 (done at
    // 200), then its own: answered at 400.
    assert!(close(one.estimate(ahead, false, t0), ms(800)));
    assert!(close(two.estimate(ahead, false, t0), ms(400)));
}

#[test]
fn a_long_decoder_queue_is_the_wait_when_it_is_the_bottleneck() {
    let t0 = Instant::now();
    let mut w = WaitEstimator::new(4, 1, 2, Duration::ZERO);
    w.observe_batch(4, ms(40));
    w.observe_batch(1, ms(10));
    w.observe_decode(ms(30));
    // Ten images ahead at the decoders, two decoders: its own decode is the sixth turn
    // (180 ms), later than the model frees up for it (2 full batches, 80 ms).
    let ahead = Ahead {
        decoding: 10,
        queued: 0,
    };
    let decoding_first = w.estimate(ahead, true, t0);
    assert!(close(decoding_first, ms(180) + ms(40)), "{decoding_first:?}");
    // Already decoded (the re-check before queueing), only the model is left.
    assert!(close(w.estimate(ahead, false, t0), ms(80) + ms(40)));
}

#[test]
fn a_batch_running_past_its_cost_counts_as_ending_now() {
    let t0 = Instant::now();
    let mut w = WaitEstimator::new(4, 1, 1, Duration::ZERO);
    w.observe_batch(4, ms(200));
    w.batch_started(0, 4, t0);
    let late = t0 + ms(500);
    let ahead = queued(3);
    assert!(close(w.estimate(ahead, false, late), ms(200)));
    assert!(!w.is_idle(Ahead::default()), "an instance is busy");
    w.instance_idle(0, late);
    assert!(w.is_idle(Ahead::default()));
    // The long batch is learned, a quarter of the way.
    assert!(close(w.batch_cost(4).unwrap(), ms(275)));
}

/// Replays an overloaded FIFO server (one instance, full batches of the recorded costs)
/// and checks each admitted request's estimate against when it was really answered: the
/// estimator must not promise what the server then breaks by more than the recorded
/// spread of batch times.
#[test]
fn estimates_made_at_admission_hold_on_the_recorded_run() {
    let t0 = Instant::now();
    let (mut w, arrived) = replayed(t0);
    let costs: Vec<u64> = RECORDED
        .iter()
        .filter(|(s, _)| *s == 4)
        .map(|&(_, c)| c)
        .collect();
    // 24 requests arrive at once while a batch has just started; they run in full batches
    // after it.
    w.batch_started(0, 4, arrived);
    let estimates: Vec<Duration> = (0..24).map(|n| w.estimate(queued(n), false, arrived)).collect();
    let mut now = arrived + ms(costs[0]);
    w.instance_idle(0, now);
    let mut waited = Vec::new();
    for cost in costs.iter().cycle().skip(1).take(6) {
        w.batch_started(0, 4, now);
        now += ms(*cost);
        w.instance_idle(0, now);
        waited.extend([now - arrived; 4]);
    }
    assert_eq!(waited.len(), estimates.len());
    for (i, (estimate, waited)) in estimates.iter().zip(&waited).enumerate() {
        let error = (waited.as_secs_f64() - estimate.as_secs_f64()).abs();
        assert!(
            error < 0.06 * waited.as_secs_f64(),
            "request {i}: estimated {estimate:?}, waited {waited:?}"
        );
    }
}

#[test]
fn a_lowered_limit_queues_in_smaller_batches_and_keeps_what_was_learned() {
    let t0 = Instant::now();
    let mut w = WaitEstimator::new(4, 1, 2, ms(0));
    for (size, took) in [(4, 200), (1, 60)] {
        w.batch_started(0, size, t0);
        w.instance_idle(0, t0 + ms(took));
    }
    let now = t0 + ms(1000);
    // Eight queued ahead in batches of 4: two full batches (400 ms), then its own, full by then.
    assert!(close(w.estimate(queued(8), false, now), ms(600)));
    w.set_limits(1, ms(0));
    // In batches of one: eight of 60 ms, then its own. The learned costs stayed.
    assert!(close(w.estimate(queued(8), false, now), ms(540)));
    assert_eq!(w.batch_cost(4), Some(ms(200)));
    w.set_limits(99, ms(0));
    assert!(
        close(w.estimate(queued(8), false, now), ms(600)),
        "clamped to the ceiling"
    );
}

#[test]
fn a_retired_instance_takes_no_more_batches() {
    let now = Instant::now();
    let mut w = WaitEstimator::new(1, 2, 1, Duration::ZERO);
    w.observe_batch(1, Duration::from_millis(100));
    let ahead = Ahead {
        decoding: 0,
        queued: 4,
    };
    let both = w.estimate(ahead, false, now);
    w.batch_started(1, 1, now);
    w.retire(1);
    let one = w.estimate(ahead, false, now);
    // Four queued ahead plus its own: three rounds on two instances, five on one.
    assert_eq!(both, Duration::from_millis(300));
    assert_eq!(one, Duration::from_millis(500));
    w.retire(0);
    assert!(
        w.estimate(ahead, false, now) > Duration::from_secs(3600),
        "none left to run it"
    );
}
