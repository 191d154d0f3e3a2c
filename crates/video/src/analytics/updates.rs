//! When consumers hear about a tracked object between its `object.start` and its
//! `object.end`: an `object.update` when something they act on has changed (its label, a
//! clearly better score or a new best snapshot, the zones it is in, loitering, stationary),
//! at most once per object per interval of stream time, with the state told last
//! (`before`) and the state now (`after`), as Frigate's `events` topic does. Score and box
//! move on every frame and are no news by themselves, so a 25 fps stream does not flood
//! MQTT. Plain state: callers pass the stream time, so the tests need no clock.

use std::time::Duration;

use peregrine_types::BBox;

use crate::event::ObjectState;

/// A rise of an object's best score by less than this is no news (the best snapshot is
/// replaced on the same step).
pub(crate) const TOP_SCORE_STEP: f32 = 0.05;

/// A box overlapping the box where the object stopped by at least this IoU has not moved:
/// detection jitter stays well above it, a walking person leaves it within a step or two.
const STILL_IOU: f32 = 0.6;

/// How often, and after how long still, `object.update`s go out.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct UpdatePolicy {
    /// `None`: no updates.
    pub interval: Option<Duration>,
    /// An object still for this long is stationary.
    pub stationary_after: Duration,
}

/// Whether `now` differs from `told` in a way a consumer acts on.
pub(crate) fn is_news(told: &ObjectState, now: &ObjectState) -> bool {
    told.class_id != now.class_id
        || told.current_zones != now.current_zones
        || told.loitering_zones != now.loitering_zones
        || told.stationary != now.stationary
        || told.snapshot_score != now.snapshot_score
        || now.top_score >= told.top_score + TOP_SCORE_STEP
}

/// What consumers were last told about one object, and when (stream time).
#[derive(Debug, Clone)]
pub(crate) struct Told {
    state: ObjectState,
    at: Duration,
}

impl Told {
    /// The object as its `object.start` told it.
    pub fn new(state: ObjectState, at: Duration) -> Self {
        Self { state, at }
    }

    pub fn state(&self) -> &ObjectState {
        &self.state
    }

    /// `Some(before)` when `now` is worth an update at `at`: it is news, and `interval` has
    /// passed since the last event about the object. `now` is then what was told. News that
    /// comes too early waits: it goes out with the first update allowed, unless it has
    /// been undone by then (or the object's end tells it).
    pub fn observe(&mut self, now: &ObjectState, at: Duration, interval: Duration) -> Option<ObjectState> {
        if at < self.at + interval || !is_news(&self.state, now) {
            return None;
        }
        self.at = at;
        Some(std::mem::replace(&mut self.state, now.clone()))
    }
}

/// Whether an object has stopped: its box has stayed on the box where it stopped (IoU at
/// least `STILL_IOU`) for a while.
#[derive(Debug, Clone)]
pub(crate) struct Stillness {
    rest: BBox,
    since: Duration,
}

impl Stillness {
    pub fn new(bbox: BBox, at: Duration) -> Self {
        Self {
            rest: bbox,
            since: at,
        }
    }

    /// The object's box at `at`; whether it has been still for `after`. A box that left the
    /// resting place becomes the new one.
    pub fn observe(&mut self, bbox: BBox, at: Duration, after: Duration) -> bool {
        if self.rest.iou(&bbox) < STILL_IOU {
            self.rest = bbox;
            self.since = at;
        }
        at.saturating_sub(self.since) >= after
    }
}

#[cfg(test)]
mod tests {
    use std::time::UNIX_EPOCH;

    use super::*;

    fn state() -> ObjectState {
        ObjectState {
            class_id: 0,
            label: "person".into(),
            score: 0.8,
            bbox: BBox::new(0.0, 0.0, 40.0, 100.0),
            top_score: 0.8,
            current_zones: Vec::new(),
            entered_zones: Vec::new(),
            loitering_zones: Vec::new(),
            stationary: false,
            snapshot_score: Some(0.8),
            first_seen: UNIX_EPOCH,
            last_seen: UNIX_EPOCH,
        }
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn news_is_what_a_consumer_acts_on_not_every_frame_s_score_and_box() {
        type Change = fn(&mut ObjectState);
        let table: [(&str, Change, bool); 10] = [
            ("nothing", |_| {}, false),
            (
                "score and box move",
                |s| {
                    s.score = 0.6;
                    s.bbox = BBox::new(5.0, 5.0, 45.0, 105.0);
                    s.last_seen += Duration::from_secs(1);
                },
                false,
            ),
            ("top score up a little", |s| s.top_score = 0.84, false),
            ("top score up a step", |s| s.top_score = 0.85, true),
            ("a better snapshot", |s| s.snapshot_score = Some(0.82), true),
            ("entered a zone", |s| s.current_zones = vec!["dock".into()], true),
            ("loitering", |s| s.loitering_zones = vec!["dock".into()], true),
            ("stationary", |s| s.stationary = true, true),
            ("relabelled", |s| s.class_id = 2, true),
            (
                "entered_zones alone (no current change)",
                |s| s.entered_zones = vec!["dock".into()],
                false,
            ),
        ];
        for (what, change, news) in table {
            let mut now = state();
            change(&mut now);
            assert_eq!(is_news(&state(), &now), news, "{what}");
        }
    }

    #[test]
    fn an_update_waits_for_the_interval_and_then_carries_what_was_told_before() {
        let interval = ms(5000);
        let mut told = Told::new(state(), ms(1000));
        let mut inside = state();
        inside.current_zones = vec!["dock".into()];
        inside.entered_zones = vec!["dock".into()];
        // News 1 s after the start: held back until 5 s have passed since it.
        assert_eq!(told.observe(&inside, ms(2000), interval), None);
        assert_eq!(told.observe(&inside, ms(5999), interval), None);
        let before = told.observe(&inside, ms(6000), interval).expect("due");
        assert_eq!(before, state());
        assert_eq!(told.state(), &inside);
        // Told: no news, no update, however long.
        assert_eq!(told.observe(&inside, ms(60_000), interval), None);
        // Left and stopped: news again, from the last update's time.
        let mut left = inside.clone();
        left.current_zones.clear();
        left.stationary = true;
        assert_eq!(told.observe(&left, ms(10_999), interval), None);
        assert_eq!(told.observe(&left, ms(11_000), interval), Some(inside));
    }

    #[test]
    fn news_undone_before_the_interval_is_never_told() {
        let interval = ms(5000);
        let mut told = Told::new(state(), ms(0));
        let mut inside = state();
        inside.current_zones = vec!["dock".into()];
        assert_eq!(told.observe(&inside, ms(1000), interval), None);
        // Out again by the time an update is allowed: the same zones as told.
        let mut out = state();
        out.entered_zones = vec!["dock".into()];
        assert_eq!(told.observe(&out, ms(6000), interval), None);
    }

    #[test]
    fn a_25_fps_object_that_keeps_changing_gets_one_update_per_interval() {
        let interval = ms(2000);
        let mut told = Told::new(state(), ms(0));
        let mut updates = 0;
        for frame in 1..=250u64 {
            // Every frame is news: the best score climbs a step each time.
            let mut now = state();
            now.top_score += frame as f32 * TOP_SCORE_STEP * 2.0;
            updates += usize::from(told.observe(&now, ms(frame * 40), interval).is_some());
        }
        assert_eq!(updates, 5, "10 s at 25 fps with updates every 2 s");
    }

    #[test]
    fn stationary_after_staying_put_and_moving_again_resets() {
        let after = ms(3000);
        let at = |x: f32| BBox::new(x, 0.0, x + 40.0, 100.0);
        let mut still = Stillness::new(at(0.0), ms(0));
        // Jitter of a few pixels keeps the resting place.
        let mut states = Vec::new();
        for (t, x) in [(1000, 2.0), (2000, -3.0), (2999, 1.0), (3000, 4.0)] {
            states.push(still.observe(at(x), ms(t), after));
        }
        assert_eq!(states, [false, false, false, true]);
        // A step of half its width: moving again; still from there 3 s later.
        assert!(!still.observe(at(20.0), ms(4000), after));
        assert!(!still.observe(at(21.0), ms(6999), after));
        assert!(still.observe(at(22.0), ms(7000), after));
    }

    #[test]
    fn a_slow_drift_is_not_stationary() {
        let after = ms(3000);
        let mut still = Stillness::new(BBox::new(0.0, 0.0, 40.0, 100.0), ms(0));
        // 2 px per 100 ms: it leaves the resting place (IoU under 0.6) every 0.6 s.
        let stopped = (1..=100u64).any(|n| {
            let x = n as f32 * 2.0;
            still.observe(BBox::new(x, 0.0, x + 40.0, 100.0), ms(n * 100), after)
        });
        assert!(!stopped);
    }
}
