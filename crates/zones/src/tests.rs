//! Behaviour of [`Analytics`] on hand-made sequences; no clock: `at` is made up per frame.

use super::*;

const FRAME: (u32, u32) = (1000, 1000);

/// A 20x40 box whose bottom centre (the default anchor) is at `(x, y)`.
fn at_feet(track: u64, class_id: u32, x: f32, y: f32) -> TrackedBox {
    TrackedBox {
        track,
        class_id,
        bbox: BBox::new(x - 10.0, y - 40.0, x + 10.0, y),
    }
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn square(name: &str) -> ZoneSpec {
    ZoneSpec {
        name: name.to_owned(),
        points: [(100.0, 100.0), (300.0, 100.0), (300.0, 300.0), (100.0, 300.0)]
            .map(|(x, y)| Point::new(x, y))
            .to_vec(),
        units: Units::Pixels,
        classes: None,
        loiter: None,
    }
}

/// A horizontal line drawn left to right at `y = 500`, from `x = 200` to `x = 800`.
fn gate() -> LineSpec {
    LineSpec {
        name: "gate".to_owned(),
        start: Point::new(200.0, 500.0),
        end: Point::new(800.0, 500.0),
        units: Units::Pixels,
        classes: None,
    }
}

fn config(hysteresis: Hysteresis) -> AnalyticsConfig {
    AnalyticsConfig {
        anchor: Anchor::BottomCenter,
        zone_hysteresis: hysteresis,
        line_hysteresis: hysteresis,
    }
}

fn analytics(zones: Vec<ZoneSpec>, lines: Vec<LineSpec>, hysteresis: Hysteresis) -> Analytics {
    Analytics::new(zones, lines, config(hysteresis), FRAME).expect("valid specs")
}

/// Feeds one object per frame (40 ms apart) and returns `(frame index, kind)` of its events.
fn run(analytics: &mut Analytics, path: &[(f32, f32)]) -> Vec<(usize, ZoneEventKind)> {
    let mut seen = Vec::new();
    for (i, (x, y)) in path.iter().enumerate() {
        for event in analytics.observe(&[at_feet(7, 0, *x, *y)], ms(40 * i as u64)) {
            seen.push((i, event.kind));
        }
    }
    seen
}

#[test]
fn enters_and_exits_a_zone() {
    let mut zones = analytics(vec![square("dock")], vec![], Hysteresis::OFF);
    let path = [
        (50.0, 200.0),
        (99.0, 200.0),
        (100.0, 200.0),
        (200.0, 200.0),
        (301.0, 200.0),
    ];
    let events = run(&mut zones, &path);
    assert_eq!(events, vec![(2, ZoneEventKind::Enter), (4, ZoneEventKind::Exit)]);
}

#[test]
fn enter_waits_for_consecutive_frames() {
    let hysteresis = Hysteresis {
        frames: 3,
        margin_px: 0.0,
    };
    let mut zones = analytics(vec![square("dock")], vec![], hysteresis);
    let path = [
        (50.0, 200.0),
        (200.0, 200.0),
        (50.0, 200.0),
        (200.0, 200.0),
        (200.0, 200.0),
    ];
    assert!(
        run(&mut zones, &path).is_empty(),
        "two frames inside are not enough"
    );
    let events = run(&mut zones, &[(200.0, 200.0), (50.0, 200.0)]);
    assert_eq!(events, vec![(0, ZoneEventKind::Enter)]);
}

#[test]
fn loiter_fires_once_per_stay() {
    let mut spec = square("dock");
    spec.loiter = Some(ms(100));
    let mut zones = analytics(vec![spec], vec![], Hysteresis::OFF);
    // Inside from frame 1 (40 ms) to frame 6, outside at 7, back inside from 8.
    let mut path = vec![(50.0, 200.0)];
    path.extend([(200.0, 200.0); 6]);
    path.push((50.0, 200.0));
    path.extend([(200.0, 200.0); 4]);
    let loiters: Vec<_> = run(&mut zones, &path)
        .into_iter()
        .filter(|(_, kind)| matches!(kind, ZoneEventKind::Loiter { .. }))
        .collect();
    // 40 ms -> 160 ms is the first frame at >= 100 ms inside; 320 ms -> 440 ms the second.
    assert_eq!(
        loiters,
        vec![
            (4, ZoneEventKind::Loiter { inside_for: ms(120) }),
            (11, ZoneEventKind::Loiter { inside_for: ms(120) }),
        ]
    );
}

/// The anchor alternates between 1 px inside and 1 px outside the zone's left edge, with
/// an occasional second or third frame on one side.
fn jitter_path() -> Vec<(f32, f32)> {
    [0, 1, 0, 1, 1, 0, 1, 0, 0, 1, 0, 1, 1, 1, 0, 1, 0, 0, 0, 1]
        .iter()
        .map(|inside| (if *inside == 1 { 101.0 } else { 99.0 }, 200.0))
        .collect()
}

#[test]
fn a_box_jittering_on_a_zone_border_flaps_without_hysteresis() {
    let mut zones = analytics(vec![square("dock")], vec![], Hysteresis::OFF);
    let events = run(&mut zones, &jitter_path());
    assert_eq!(events.len(), 13, "{events:?}");
}

#[test]
fn a_box_jittering_on_a_zone_border_does_not_flap_with_the_default_hysteresis() {
    let mut zones = analytics(vec![square("dock")], vec![], Hysteresis::default());
    assert!(run(&mut zones, &jitter_path()).is_empty());
    // Frames alone (no margin) also hold it: never three in a row on the new side but once.
    let frames_only = Hysteresis {
        frames: 3,
        margin_px: 0.0,
    };
    let mut zones = analytics(vec![square("dock")], vec![], frames_only);
    assert_eq!(
        run(&mut zones, &jitter_path()),
        vec![(13, ZoneEventKind::Enter), (18, ZoneEventKind::Exit)]
    );
}

#[test]
fn crossing_a_line_both_ways() {
    let mut lines = analytics(vec![], vec![gate()], Hysteresis::OFF);
    // Upwards across a left-to-right line: from its right (below) to its left (above): in.
    let events = run(&mut lines, &[(500.0, 520.0), (500.0, 490.0), (500.0, 530.0)]);
    assert_eq!(
        events,
        vec![
            (1, ZoneEventKind::Cross(Direction::In)),
            (2, ZoneEventKind::Cross(Direction::Out)),
        ]
    );
    let counts = &lines.line_counts()[0];
    assert_eq!(counts.in_by_class, BTreeMap::from([(0, 1)]));
    assert_eq!(counts.out_by_class, BTreeMap::from([(0, 1)]));
}

#[test]
fn crossings_beyond_the_segment_ends_do_not_count() {
    let mut lines = analytics(vec![], vec![gate()], Hysteresis::OFF);
    let events = run(
        &mut lines,
        &[(150.0, 520.0), (150.0, 480.0), (850.0, 480.0), (850.0, 520.0)],
    );
    assert!(events.is_empty(), "{events:?}");
    assert_eq!(lines.line_counts()[0].in_by_class, BTreeMap::new());
}

#[test]
fn a_line_crossing_needs_the_configured_frames_on_the_new_side() {
    let hysteresis = Hysteresis {
        frames: 3,
        margin_px: 0.0,
    };
    let mut lines = analytics(vec![], vec![gate()], hysteresis);
    let path = [
        (500.0, 520.0),
        (500.0, 490.0),
        (500.0, 490.0),
        (500.0, 490.0),
        (500.0, 480.0),
    ];
    assert_eq!(
        run(&mut lines, &path),
        vec![(3, ZoneEventKind::Cross(Direction::In))]
    );
}

#[test]
fn a_box_jittering_on_a_line_flaps_only_without_hysteresis() {
    let path: Vec<_> = (0..20)
        .map(|i| (500.0, if i % 2 == 0 { 501.5 } else { 498.5 }))
        .collect();
    let mut off = analytics(vec![], vec![gate()], Hysteresis::OFF);
    assert_eq!(run(&mut off, &path).len(), 19);
    let mut on = analytics(vec![], vec![gate()], Hysteresis::default());
    assert!(run(&mut on, &path).is_empty());
    assert_eq!(on.line_counts()[0].in_by_class, BTreeMap::new());
}

#[test]
fn a_track_absent_for_two_frames_starts_afresh_on_a_line() {
    // supervision's LineZone drops a track's history once it has been absent for
    // `minimum_crossing_threshold + 1` frames (2 here); a track coming back on the other
    // side is not counted.
    let mut lines = analytics(vec![], vec![gate()], Hysteresis::OFF);
    lines.observe(&[at_feet(1, 0, 500.0, 520.0), at_feet(2, 0, 600.0, 520.0)], ms(0));
    lines.observe(&[at_feet(2, 0, 600.0, 520.0)], ms(40));
    lines.observe(&[], ms(80));
    let events = lines.observe(
        &[at_feet(1, 0, 500.0, 480.0), at_feet(2, 0, 600.0, 480.0)],
        ms(120),
    );
    let crossed: Vec<_> = events.iter().map(|e| e.track).collect();
    assert_eq!(crossed, vec![2], "track 1 was absent two frames, track 2 one");
}

#[test]
fn class_filters_ignore_other_classes() {
    let mut cars = square("cars");
    cars.classes = Some(vec![2]);
    let mut line = gate();
    line.classes = Some(vec![2]);
    let mut analytics = analytics(vec![cars], vec![line], Hysteresis::OFF);
    let person = |y| at_feet(1, 0, 200.0, y);
    let car = |y| at_feet(2, 2, 250.0, y);
    analytics.observe(&[person(200.0), car(200.0)], ms(0));
    assert_eq!(analytics.occupancy()[0].tracks, vec![2]);
    analytics.observe(&[person(520.0), car(520.0)], ms(40));
    let events = analytics.observe(&[person(480.0), car(480.0)], ms(80));
    assert_eq!(events.len(), 1);
    assert_eq!((events[0].track, events[0].name.as_str()), (2, "gate"));
    assert_eq!(analytics.line_counts()[0].in_by_class, BTreeMap::from([(2, 1)]));
}

#[test]
fn normalized_units_scale_with_the_frame() {
    let mut zone = square("dock");
    zone.points = [(0.1, 0.1), (0.3, 0.1), (0.3, 0.3), (0.1, 0.3)]
        .map(|(x, y)| Point::new(x, y))
        .to_vec();
    zone.units = Units::Normalized;
    let mut line = gate();
    (line.start, line.end, line.units) = (Point::new(0.2, 0.5), Point::new(0.8, 0.5), Units::Normalized);
    let mut normalized = analytics(vec![zone], vec![line], Hysteresis::OFF);
    let mut pixels = analytics(vec![square("dock")], vec![gate()], Hysteresis::OFF);
    let path = [
        (50.0, 200.0),
        (150.0, 200.0),
        (150.0, 520.0),
        (150.0, 480.0),
        (500.0, 520.0),
        (500.0, 480.0),
    ];
    let events = run(&mut normalized, &path);
    assert_eq!(events, run(&mut pixels, &path));
    assert_eq!(events.len(), 3, "{events:?}");
}

#[test]
fn the_anchor_decides_where_an_object_is() {
    let mut centre = config(Hysteresis::OFF);
    centre.anchor = Anchor::Center;
    let mut by_centre = Analytics::new(vec![square("dock")], vec![], centre, FRAME).unwrap();
    let mut by_feet = analytics(vec![square("dock")], vec![], Hysteresis::OFF);
    // Feet at y = 320 (outside), centre at y = 300 (on the edge, inside).
    let object = [at_feet(1, 0, 200.0, 320.0)];
    assert!(by_feet.observe(&object, ms(0)).is_empty());
    assert_eq!(by_centre.observe(&object, ms(0))[0].kind, ZoneEventKind::Enter);
}

#[test]
fn forget_exits_every_zone_the_track_was_in() {
    let mut big = square("big");
    big.points = [(0.0, 0.0), (1000.0, 0.0), (1000.0, 1000.0), (0.0, 1000.0)]
        .map(|(x, y)| Point::new(x, y))
        .to_vec();
    let mut analytics = analytics(vec![square("dock"), big], vec![gate()], Hysteresis::OFF);
    analytics.observe(&[at_feet(5, 3, 200.0, 200.0), at_feet(6, 3, 900.0, 900.0)], ms(0));
    let exits = analytics.forget(5, ms(500));
    let named: Vec<_> = exits
        .iter()
        .map(|e| (e.kind, e.name.as_str(), e.track, e.class_id, e.at))
        .collect();
    assert_eq!(
        named,
        vec![
            (ZoneEventKind::Exit, "dock", 5, 3, ms(500)),
            (ZoneEventKind::Exit, "big", 5, 3, ms(500)),
        ]
    );
    assert!(analytics.forget(5, ms(600)).is_empty());
    assert_eq!(analytics.occupancy()[1].tracks, vec![6]);
}

#[test]
fn occupancy_and_counts_by_class() {
    let mut analytics = analytics(vec![square("dock")], vec![gate()], Hysteresis::OFF);
    let inside = [
        at_feet(3, 0, 150.0, 150.0),
        at_feet(1, 0, 200.0, 200.0),
        at_feet(2, 2, 250.0, 250.0),
        at_feet(4, 2, 600.0, 520.0),
    ];
    let events = analytics.observe(&inside, ms(0));
    let tracks: Vec<_> = events.iter().map(|e| e.track).collect();
    assert_eq!(
        tracks,
        vec![1, 2, 3],
        "events by track id, whatever the input order"
    );
    assert_eq!(
        analytics.occupancy(),
        vec![ZoneOccupancy {
            name: "dock".to_owned(),
            by_class: BTreeMap::from([(0, 2), (2, 1)]),
            tracks: vec![1, 2, 3],
        }]
    );
    analytics.observe(&[at_feet(4, 2, 600.0, 480.0)], ms(40));
    assert_eq!(
        analytics.line_counts(),
        vec![LineCounts {
            name: "gate".to_owned(),
            in_by_class: BTreeMap::from([(2, 1)]),
            out_by_class: BTreeMap::new(),
        }]
    );
    assert_eq!(analytics.zone_names(), vec!["dock"]);
    assert_eq!(analytics.line_names(), vec!["gate"]);
}

fn refusal(zones: Vec<ZoneSpec>, lines: Vec<LineSpec>) -> String {
    let err = Analytics::new(zones, lines, AnalyticsConfig::default(), FRAME).unwrap_err();
    err.to_string()
}

fn zone_with(points: &[(f32, f32)], units: Units) -> Vec<ZoneSpec> {
    vec![ZoneSpec {
        points: points.iter().map(|(x, y)| Point::new(*x, *y)).collect(),
        units,
        ..square("dock")
    }]
}

#[test]
fn every_bad_zone_is_refused_with_a_message_naming_it() {
    let px = Units::Pixels;
    let cases = [
        (
            zone_with(&[(0.0, 0.0), (10.0, 0.0)], px),
            "zone `dock` has 2 points",
        ),
        (
            zone_with(&[(0.0, 0.0), (10.0, 10.0), (10.0, 0.0), (0.0, 10.0)], px),
            "zone `dock` intersects itself: edge 0",
        ),
        (
            zone_with(&[(0.0, 0.0), (5.0, 5.0), (10.0, 10.0)], px),
            "zero area",
        ),
        (
            zone_with(&[(0.0, 0.0), (0.0, 0.0), (10.0, 10.0), (0.0, 10.0)], px),
            "repeats point 0",
        ),
        (
            zone_with(&[(0.0, 0.0), (1001.0, 0.0), (0.0, 10.0)], px),
            "point 1 is (1001, 0), outside the 1000x1000 frame",
        ),
        (
            zone_with(&[(0.0, 0.0), (0.5, 0.0), (0.5, 1.5)], Units::Normalized),
            "must lie in [0, 1] x [0, 1]",
        ),
        (
            zone_with(&[(0.0, -1.0), (5.0, 0.0), (5.0, 5.0)], px),
            "point 0 is (0, -1)",
        ),
        (
            zone_with(&[(0.0, f32::NAN), (5.0, 0.0), (5.0, 5.0)], px),
            "(0, NaN)",
        ),
        (
            vec![ZoneSpec {
                classes: Some(vec![]),
                ..square("dock")
            }],
            "zone `dock` has an empty class list",
        ),
    ];
    for (zones, expected) in cases {
        let message = refusal(zones, vec![]);
        assert!(message.contains(expected), "`{message}` should say `{expected}`");
    }
}

#[test]
fn bad_lines_and_names_are_refused_with_a_message_naming_them() {
    let cases = [
        (
            vec![],
            vec![LineSpec {
                end: Point::new(200.0, 500.0),
                ..gate()
            }],
            "line `gate` starts and ends at the same point",
        ),
        (
            vec![],
            vec![LineSpec {
                start: Point::new(-1.0, 0.0),
                ..gate()
            }],
            "line `gate` point 0 is (-1, 0)",
        ),
        (
            vec![],
            vec![LineSpec {
                classes: Some(vec![]),
                ..gate()
            }],
            "line `gate` has an empty class list",
        ),
        (vec![square("gate")], vec![gate()], "name `gate` is used twice"),
        (
            vec![square("dock"), square("dock")],
            vec![],
            "name `dock` is used twice",
        ),
        (vec![square(" ")], vec![], "empty name"),
    ];
    for (zones, lines, expected) in cases {
        let message = refusal(zones, lines);
        assert!(message.contains(expected), "`{message}` should say `{expected}`");
    }
}

#[test]
fn a_bad_frame_or_margin_is_refused() {
    let empty = Analytics::new(vec![], vec![], AnalyticsConfig::default(), (0, 720)).unwrap_err();
    assert_eq!(
        empty,
        ZoneError::FrameSize {
            width: 0,
            height: 720
        }
    );
    let huge = Analytics::new(vec![], vec![], AnalyticsConfig::default(), (100_000, 720));
    let message = huge.unwrap_err().to_string();
    assert!(message.contains("100000x720 is not usable"), "{message}");
    let mut negative = AnalyticsConfig::default();
    negative.line_hysteresis.margin_px = -1.0;
    let err = Analytics::new(vec![], vec![], negative, FRAME).unwrap_err();
    assert!(err.to_string().contains("line hysteresis margin -1 px"), "{err}");
}

#[test]
fn normalized_points_land_on_whole_pixels() {
    // f32 holds 0.55 as 0.550000012: unsnapped, 0.55 of 1280 would be 704.000015 and an
    // anchor on pixel 704 would be outside.
    let zone = ZoneSpec {
        points: [(0.55, 0.6), (0.95, 0.6), (0.95, 0.9)]
            .map(|(x, y)| Point::new(x, y))
            .to_vec(),
        units: Units::Normalized,
        ..square("corner")
    };
    let mut analytics = Analytics::new(vec![zone], vec![], config(Hysteresis::OFF), (1280, 720)).unwrap();
    let events = analytics.observe(&[at_feet(1, 0, 1216.0, 432.0)], ms(0));
    assert_eq!(
        events.len(),
        1,
        "the corner (1216, 432) is on the boundary, so inside"
    );
}
