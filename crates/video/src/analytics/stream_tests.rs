//! `StreamAnalytics` frame by frame: synthetic detections in, track ids and object events
//! out; no threads, clocks or channels.

use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use peregrine_types::{BBox, ClassNames, Detection};

use super::config::{AnalyticsConfig, ClassSelector, LineConfig, UnitsConfig, ZoneConfig};
use super::snapshot::Overlay;
use super::stream::{SnapshotSource, StreamAnalytics};
use crate::event::{CrossDirection, DetectionEvent, ObjectEvent, ObjectEventKind};
use crate::frame::{CaptureTime, ClockSource, Pts};

/// Counts snapshots instead of encoding them; each is its call number as bytes.
#[derive(Default)]
struct CountingSnapshots {
    taken: usize,
}

impl SnapshotSource for CountingSnapshots {
    fn snapshot(&mut self, overlay: &Overlay<'_>, _focus: Option<BBox>) -> Option<Arc<Vec<u8>>> {
        assert_eq!(
            overlay.detections.len(),
            overlay.track_ids.len(),
            "every box has its id slot"
        );
        self.taken += 1;
        Some(Arc::new(self.taken.to_le_bytes().to_vec()))
    }
}

fn names() -> ClassNames {
    ClassNames::new(vec!["person".into(), "bicycle".into(), "car".into()])
}

const FPS: u64 = 25;

/// Frame `n` of a 25 fps, 640x480 stream captured from t = 1000 s.
fn frame(n: u64, detections: Vec<Detection>) -> DetectionEvent {
    let pts_ms = n * 1000 / FPS;
    DetectionEvent {
        stream: "cam".into(),
        seq: n,
        pts: Pts::from_90k((pts_ms * 90) as i64),
        capture: CaptureTime {
            wall: UNIX_EPOCH + Duration::from_secs(1000) + Duration::from_millis(pts_ms),
            source: ClockSource::LocalReceive,
            received: tokio::time::Instant::now(),
        },
        width: 640,
        height: 480,
        track_ids: Vec::new(),
        detections,
        class_names: names(),
        published: UNIX_EPOCH,
        latency: Duration::ZERO,
    }
}

fn person_at(x: f32, y: f32, score: f32) -> Detection {
    Detection {
        class_id: 0,
        score,
        bbox: BBox::new(x, y, x + 40.0, y + 100.0),
    }
}

/// Runs `frames` through `a`, returning each frame's track ids and every event.
fn run(
    a: &mut StreamAnalytics,
    frames: impl IntoIterator<Item = DetectionEvent>,
) -> (Vec<Vec<Option<u64>>>, Vec<ObjectEvent>) {
    let mut snaps = CountingSnapshots::default();
    let (mut ids, mut events) = (Vec::new(), Vec::new());
    for mut f in frames {
        events.extend(a.observe(&mut f, &mut snaps));
        ids.push(f.track_ids);
    }
    (ids, events)
}

fn kinds(events: &[ObjectEvent]) -> Vec<&'static str> {
    events.iter().map(|e| e.kind.name()).collect()
}

#[test]
fn two_walkers_keep_their_ids_and_start_once_each() {
    let mut a = StreamAnalytics::new(AnalyticsConfig::default(), names());
    let frames = (0..20).map(|n| {
        let x = n as f32 * 5.0;
        frame(
            n,
            vec![
                person_at(100.0 + x, 100.0, 0.9),
                person_at(400.0 - x, 300.0, 0.85),
            ],
        )
    });
    let (ids, events) = run(&mut a, frames);
    assert_eq!(kinds(&events), ["object.start", "object.start"]);
    let (first, second) = (ids[5][0].unwrap(), ids[5][1].unwrap());
    assert_ne!(first, second);
    for (n, frame_ids) in ids.iter().enumerate().skip(2) {
        assert_eq!(frame_ids, &vec![Some(first), Some(second)], "frame {n}");
    }
    assert!(events.iter().all(|e| e.snapshot.is_some() && e.label == "person"));
    assert_eq!(events[0].width, 640);
}

#[test]
fn a_lost_track_ends_with_its_times_best_score_and_best_snapshot() {
    let mut a = StreamAnalytics::new(AnalyticsConfig::default(), names());
    // Seen for frames 0..10 (score rising to 0.95 at frame 5), then gone for 2 s.
    let seen = (0..10).map(|n| {
        let score = if n == 5 { 0.95 } else { 0.8 };
        frame(n, vec![person_at(100.0 + n as f32, 100.0, score)])
    });
    let empty = (10..60).map(|n| frame(n, vec![]));
    let (_, events) = run(&mut a, seen.chain(empty));
    assert_eq!(kinds(&events), ["object.start", "object.end"]);
    let end = &events[1];
    let ObjectEventKind::End {
        first_seen,
        last_seen,
        best_score,
    } = end.kind
    else {
        panic!("{:?}", end.kind)
    };
    assert_eq!(best_score, 0.95);
    assert_eq!(end.score, 0.95);
    // Confirmed at its second frame (min_hits 2) but first seen at frame 0.
    let at = |n: u64| UNIX_EPOCH + Duration::from_secs(1000) + Duration::from_millis(n * 1000 / FPS);
    assert!(first_seen <= at(1), "{first_seen:?}");
    assert_eq!(last_seen, at(9));
    assert_eq!(end.track_id, events[0].track_id);
    assert!(end.snapshot.is_some(), "the end carries the best snapshot taken");
}

fn gate_and_yard() -> AnalyticsConfig {
    AnalyticsConfig {
        hysteresis_frames: 1,
        hysteresis_px: 0.0,
        zones: vec![ZoneConfig {
            name: "yard".into(),
            points: vec![[0.0, 0.0], [0.5, 0.0], [0.5, 1.0], [0.0, 1.0]],
            units: UnitsConfig::Normalized,
            classes: vec![ClassSelector::Name("person".into())],
            loiter_s: None,
        }],
        lines: vec![LineConfig {
            name: "gate".into(),
            start: [400.0, 0.0],
            end: [400.0, 480.0],
            units: UnitsConfig::Pixels,
            classes: vec![],
        }],
        ..AnalyticsConfig::default()
    }
}

#[test]
fn a_walker_leaves_the_yard_and_crosses_the_gate() {
    let mut a = StreamAnalytics::new(gate_and_yard(), names());
    // From x = 200 to x = 580 (its bottom centre at x + 20), 10 px a frame.
    let frames = (0..40).map(|n| frame(n, vec![person_at(200.0 + 10.0 * n as f32, 200.0, 0.9)]));
    let (_, events) = run(&mut a, frames);
    assert_eq!(
        kinds(&events),
        ["object.start", "zone.enter", "zone.exit", "line.cross"]
    );
    assert_eq!(events[2].kind, ObjectEventKind::ZoneExit { zone: "yard".into() });
    let ObjectEventKind::LineCross { line, direction } = &events[3].kind else {
        panic!()
    };
    assert_eq!(line, "gate");
    // Start -> end points down the screen, so its right is the screen's left: moving
    // right crosses from its right to its left, which is `in`.
    assert_eq!(*direction, CrossDirection::In);
    assert!(events.iter().all(|e| e.track_id == events[0].track_id));
    let report = super::report::report(&a);
    assert_eq!((report.lines[0].total_in, report.lines[0].total_out), (1, 0));
    assert_eq!(report.zones[0].objects, 0);
}

#[test]
fn untracked_classes_get_no_ids_and_reach_no_zone() {
    let config = AnalyticsConfig {
        classes: vec![ClassSelector::Name("car".into())],
        ..AnalyticsConfig::default()
    };
    let mut a = StreamAnalytics::new(config, names());
    let car = Detection {
        class_id: 2,
        score: 0.9,
        bbox: BBox::new(10.0, 10.0, 110.0, 60.0),
    };
    let (ids, events) = run(
        &mut a,
        (0..5).map(|n| frame(n, vec![person_at(300.0, 100.0, 0.9), car])),
    );
    assert_eq!(kinds(&events), ["object.start"]);
    assert_eq!(events[0].label, "car");
    assert!(ids[4][0].is_none() && ids[4][1].is_some());
}

#[test]
fn class_names_are_resolved_at_the_first_frame_when_no_model_named_them_yet() {
    let mut a = StreamAnalytics::new(gate_and_yard(), ClassNames::default());
    let (ids, _) = run(
        &mut a,
        (0..3).map(|n| frame(n, vec![person_at(100.0, 100.0, 0.9)])),
    );
    assert!(ids[2][0].is_some());
    assert!(a.error().is_none());

    let config = AnalyticsConfig {
        classes: vec![ClassSelector::Name("unicorn".into())],
        ..AnalyticsConfig::default()
    };
    let mut a = StreamAnalytics::new(config, ClassNames::default());
    let (ids, events) = run(
        &mut a,
        (0..3).map(|n| frame(n, vec![person_at(100.0, 100.0, 0.9)])),
    );
    assert!(
        ids.iter().flatten().all(Option::is_none),
        "a config the model does not fit tracks nothing"
    );
    assert!(events.is_empty());
    assert!(a.error().unwrap().contains("unicorn"), "{:?}", a.error());
}

#[test]
fn a_clock_that_goes_back_ends_every_track() {
    let mut a = StreamAnalytics::new(AnalyticsConfig::default(), names());
    let before = (100..105).map(|n| frame(n, vec![person_at(100.0, 100.0, 0.9)]));
    // A reconnect: the stream's clock starts again from 0.
    let after = (0..3).map(|n| frame(n, vec![person_at(100.0, 100.0, 0.9)]));
    let (ids, events) = run(&mut a, before.chain(after));
    assert_eq!(kinds(&events), ["object.start", "object.end", "object.start"]);
    assert_ne!(ids[4][0], ids[7][0], "a new id after the jump");
}

#[test]
fn places_are_checked_against_the_frame_and_the_model() {
    let mut a = StreamAnalytics::new(AnalyticsConfig::default(), names());
    run(&mut a, [frame(0, vec![])]);
    let outside = vec![ZoneConfig {
        name: "far".into(),
        points: vec![[0.0, 0.0], [900.0, 0.0], [900.0, 100.0]],
        units: UnitsConfig::Pixels,
        classes: vec![],
        loiter_s: None,
    }];
    let err = a.set_places(Some(outside), None).unwrap_err();
    assert!(err.contains("far"), "{err}");
    let unknown = vec![LineConfig {
        name: "l".into(),
        start: [0.0, 0.0],
        end: [10.0, 10.0],
        units: UnitsConfig::Pixels,
        classes: vec![ClassSelector::Name("dragon".into())],
    }];
    let err = a.set_places(None, Some(unknown)).unwrap_err();
    assert!(err.contains("dragon") && err.contains("person"), "{err}");
    a.set_places(Some(gate_and_yard().zones), None).unwrap();
    assert_eq!(super::report::report(&a).zones.len(), 1);
}

/// The left half of the frame as a zone, every frame deciding (no hysteresis).
fn left_half(updates: bool, stationary_s: f64) -> AnalyticsConfig {
    AnalyticsConfig {
        hysteresis_frames: 1,
        hysteresis_px: 0.0,
        zones: vec![ZoneConfig {
            name: "yard".into(),
            points: vec![[0.0, 0.0], [0.5, 0.0], [0.5, 1.0], [0.0, 1.0]],
            units: UnitsConfig::Normalized,
            classes: vec![],
            loiter_s: None,
        }],
        updates,
        update_interval_s: 1.0,
        stationary_s,
        ..AnalyticsConfig::default()
    }
}

/// Walks left into the yard (frames 0..20), stands there until frame 100, then is gone.
fn walk_in_and_stop() -> impl Iterator<Item = DetectionEvent> {
    let seen = (0..100).map(|n| {
        let x = 400.0 - 10.0 * n.min(20) as f32;
        frame(n, vec![person_at(x, 200.0, 0.9)])
    });
    seen.chain((100..140).map(|n| frame(n, vec![])))
}

fn changes(events: &[ObjectEvent]) -> Vec<&crate::event::ObjectChange> {
    events.iter().filter_map(|e| e.change.as_deref()).collect()
}

#[test]
fn updates_tell_zones_and_stopping_each_before_the_last_after() {
    let mut a = StreamAnalytics::new(left_half(true, 2.0), names());
    let (_, events) = run(&mut a, walk_in_and_stop());
    assert_eq!(
        kinds(&events),
        [
            "object.start",
            "zone.enter",
            "object.update",
            "object.update",
            "zone.exit",
            "object.end"
        ]
    );
    let told = changes(&events);
    assert_eq!(told.len(), 4, "start, two updates, end carry a change");
    assert_eq!(told[0].before, told[0].after, "a start's before is its after");
    for pair in told.windows(2) {
        assert_eq!(pair[1].before, pair[0].after, "each before is the last after");
    }
    // Entered at frame 11 but the start (frame 1) was told less than 1 s before: the
    // update waits until frame 26.
    let (start, first, second) = (&events[0], &events[2], &events[3]);
    assert!((first.pts.seconds - start.pts.seconds - 1.0).abs() < 1e-9);
    assert_eq!(told[1].after.current_zones, ["yard"]);
    assert_eq!(told[1].after.entered_zones, ["yard"]);
    assert!(!told[1].after.stationary);
    // Still since frame 19 (0.76 s; its box there overlaps where it stops by IoU 0.6):
    // stationary 2 s later, and nothing else changed.
    assert!(told[2].after.stationary);
    assert!((second.pts.seconds - 2.76).abs() < 1e-9, "{}", second.pts.seconds);
    assert_eq!(told[2].after.current_zones, ["yard"]);
    // The end: out of the zone with the track, the zones it entered kept.
    assert!(told[3].after.current_zones.is_empty());
    assert_eq!(told[3].after.entered_zones, ["yard"]);
    assert_eq!(first.bbox, told[1].after.bbox, "an update's box is its after's");
    assert!(
        first.snapshot.is_none() && second.snapshot.is_none(),
        "no better snapshot"
    );
    assert!(events.iter().all(|e| e.track_id == start.track_id));
}

#[test]
fn an_update_brings_a_better_snapshot_once() {
    // Stands still (stationary never counts: an hour), scoring 0.8, then 0.95 at frame 60.
    let mut a = StreamAnalytics::new(left_half(true, 3600.0), names());
    let frames = (0..100).map(|n| {
        let score = if n == 60 { 0.95 } else { 0.8 };
        frame(n, vec![person_at(100.0, 200.0, score)])
    });
    let (_, events) = run(&mut a, frames.chain((100..140).map(|n| frame(n, vec![]))));
    assert_eq!(
        kinds(&events),
        [
            "object.start",
            "zone.enter",
            "object.update",
            "object.update",
            "zone.exit",
            "object.end"
        ]
    );
    let told = changes(&events);
    // First the zone (1 s after the start), then the better score and its snapshot.
    assert_eq!(told[1].after.current_zones, ["yard"]);
    assert_eq!(events[3].pts.seconds, 2.4);
    assert_eq!(
        (told[2].after.top_score, told[2].after.snapshot_score),
        (0.95, Some(0.95))
    );
    assert_eq!(told[2].before.snapshot_score, Some(0.8));
    let better = events[3].snapshot.as_ref().expect("the new best snapshot");
    assert_eq!(
        events[5].snapshot.as_ref(),
        Some(better),
        "the end keeps the best"
    );
    assert!(events[2].snapshot.is_none());
}

#[test]
fn without_updates_the_end_tells_everything_since_the_start() {
    let mut a = StreamAnalytics::new(left_half(false, 2.0), names());
    let (_, events) = run(&mut a, walk_in_and_stop());
    assert_eq!(
        kinds(&events),
        ["object.start", "zone.enter", "zone.exit", "object.end"]
    );
    let told = changes(&events);
    assert_eq!(told[1].before, told[0].after);
    assert!(told[1].after.stationary && told[1].after.entered_zones == ["yard"]);
}
