use super::*;

/// 25 fps: frame `i` is at `40 i` ms.
fn frame(i: u64) -> Duration {
    Duration::from_millis(40 * i)
}

fn det(class_id: u32, score: f32, x: f32, y: f32) -> Detection {
    Detection {
        class_id,
        score,
        bbox: BBox::new(x, y, x + 40.0, y + 80.0),
    }
}

fn tracker() -> Tracker {
    Tracker::new(TrackerConfig::default())
}

/// Feeds `frames` from frame index `first` on and returns each frame's update.
fn run(t: &mut Tracker, first: u64, frames: &[Vec<Detection>]) -> Vec<TrackUpdate> {
    frames
        .iter()
        .enumerate()
        .map(|(i, dets)| t.observe(dets, frame(first + i as u64)))
        .collect()
}

fn still(n: usize, d: Detection) -> Vec<Vec<Detection>> {
    vec![vec![d]; n]
}

#[test]
fn birth_only_after_min_hits() {
    for (min_hits, born_at) in [(1, 1), (2, 1), (3, 2), (5, 4)] {
        let mut t = Tracker::new(TrackerConfig {
            min_hits,
            ..Default::default()
        });
        let updates = run(&mut t, 0, &still(6, det(0, 0.9, 100.0, 100.0)));
        for (i, u) in updates.iter().enumerate() {
            let expected = (i >= born_at).then_some(TrackId(1));
            assert_eq!(u.assignments, vec![expected], "min_hits {min_hits}, frame {i}");
            let started = if i == born_at {
                vec![(TrackId(1), 0)]
            } else {
                vec![]
            };
            assert_eq!(u.started, started, "min_hits {min_hits}, frame {i}");
        }
    }
}

#[test]
fn a_tentative_track_missing_a_frame_is_dropped() {
    let mut t = Tracker::new(TrackerConfig {
        min_hits: 3,
        ..Default::default()
    });
    let d = det(0, 0.9, 100.0, 100.0);
    let frames = vec![vec![d], vec![d], vec![], vec![d], vec![d], vec![d]];
    let updates = run(&mut t, 0, &frames);
    // Frames 0-1 are one tentative track, dropped at the gap; 3-5 a new one, confirmed at 5.
    let ids: Vec<Option<TrackId>> = updates.iter().flat_map(|u| u.assignments.clone()).collect();
    assert_eq!(ids, vec![None, None, None, None, Some(TrackId(1))]);
    assert!(
        updates.iter().all(|u| u.ended.is_empty()),
        "tentative tracks end silently"
    );
}

#[test]
fn starting_needs_new_track_score() {
    let mut t = tracker();
    // 0.65 is first-stage (>= 0.6) but under the 0.7 needed to start a track.
    let updates = run(&mut t, 0, &still(5, det(0, 0.65, 100.0, 100.0)));
    assert!(updates.iter().all(|u| u.assignments == vec![None]));
    assert_eq!(t.live_tracks(), 0);
}

#[test]
fn crossing_objects_keep_their_ids() {
    let mut t = tracker();
    // A walks right, B walks left, 6 px per frame; they overlap for ~14 frames mid-way.
    let frames: Vec<Vec<Detection>> = (0..60)
        .map(|i| {
            let step = 6.0 * i as f32;
            vec![det(0, 0.9, 20.0 + step, 100.0), det(0, 0.85, 380.0 - step, 104.0)]
        })
        .collect();
    let updates = run(&mut t, 0, &frames);
    for u in &updates[1..] {
        assert_eq!(u.assignments, vec![Some(TrackId(1)), Some(TrackId(2))]);
    }
}

#[test]
fn an_occlusion_shorter_than_lost_after_keeps_the_id() {
    let mut t = tracker();
    let d = det(0, 0.9, 100.0, 100.0);
    run(&mut t, 0, &still(10, d));
    // Frames 10..=33 empty: at frame 34 the gap is 25 frames = 1.0 s, within lost_after.
    for u in run(&mut t, 10, &vec![vec![]; 24]) {
        assert!(u.ended.is_empty());
    }
    assert_eq!(t.live_tracks(), 1);
    assert_eq!(t.observe(&[d], frame(34)).assignments, vec![Some(TrackId(1))]);
}

#[test]
fn an_occlusion_longer_than_lost_after_ends_the_track() {
    let mut t = tracker();
    let d = det(0, 0.9, 100.0, 100.0);
    run(&mut t, 0, &still(10, d));
    // Last seen at frame 9 (360 ms). At frame 35 (1400 ms) the gap is 1.04 s: it ends there.
    let updates = run(&mut t, 10, &vec![vec![]; 26]);
    let ended_at: Vec<usize> = updates
        .iter()
        .enumerate()
        .filter(|(_, u)| !u.ended.is_empty())
        .map(|(i, _)| i + 10)
        .collect();
    assert_eq!(ended_at, vec![35]);
    let ended = &updates[25].ended[0];
    assert_eq!(
        (ended.id, ended.first_seen, ended.last_seen, ended.hits),
        (TrackId(1), frame(0), frame(9), 10)
    );
    // The object comes back: a new track, a new id.
    let back = run(&mut t, 36, &still(2, d));
    assert_eq!(back[1].assignments, vec![Some(TrackId(2))]);
}

#[test]
fn the_lost_budget_is_media_time_not_frames() {
    // A stream sampled at 5 fps: 200 ms between frames. Four missing frames are 1 s.
    let mut t = tracker();
    let d = det(0, 0.9, 100.0, 100.0);
    let at = |i: u64| Duration::from_millis(200 * i);
    for i in 0..3 {
        t.observe(&[d], at(i));
    }
    for i in 3..=6 {
        assert!(t.observe(&[], at(i)).ended.is_empty(), "frame {i}");
    }
    // Frame 7 is 1.2 s after the last detection: still one last chance to match, as trackers
    // allows; had nothing matched, it would end here.
    assert_eq!(t.observe(&[d], at(7)).assignments, vec![Some(TrackId(1))]);
    for i in 8..=12 {
        assert!(t.observe(&[], at(i)).ended.is_empty(), "frame {i}");
    }
    assert_eq!(t.observe(&[], at(13)).ended.len(), 1);
}

#[test]
fn a_detection_flickering_below_high_score_is_kept_by_the_low_stage() {
    let mut t = tracker();
    let frames: Vec<Vec<Detection>> = (0..20)
        .map(|i| {
            let score = if i < 4 || i % 2 == 0 { 0.9 } else { 0.3 };
            vec![det(0, score, 100.0 + 3.0 * i as f32, 100.0)]
        })
        .collect();
    let updates = run(&mut t, 0, &frames);
    for u in &updates[1..] {
        assert_eq!(u.assignments, vec![Some(TrackId(1))]);
    }
    // With the low stage floored above the flicker, those frames go untracked, but the track
    // survives them and keeps its id.
    let mut t = Tracker::new(TrackerConfig {
        low_score: 0.5,
        ..Default::default()
    });
    let updates = run(&mut t, 0, &frames);
    for (i, u) in updates.iter().enumerate().skip(1) {
        let expected = (i < 4 || i % 2 == 0).then_some(TrackId(1));
        assert_eq!(u.assignments, vec![expected], "frame {i}");
    }
}

#[test]
fn class_aware_tracks_only_match_their_class() {
    let frames = [
        vec![det(0, 0.9, 100.0, 100.0)],
        vec![det(0, 0.9, 100.0, 100.0)],
        vec![det(1, 0.9, 100.0, 100.0)],
        vec![det(1, 0.9, 100.0, 100.0)],
    ];
    let mut aware = tracker();
    let ids: Vec<Option<TrackId>> = run(&mut aware, 0, &frames)
        .iter()
        .map(|u| u.assignments[0])
        .collect();
    assert_eq!(ids, vec![None, Some(TrackId(1)), None, Some(TrackId(2))]);
    assert_eq!(aware.live_tracks(), 2, "track 1 is lost, not ended");

    let mut agnostic = Tracker::new(TrackerConfig {
        class_aware: false,
        ..Default::default()
    });
    let ids: Vec<Option<TrackId>> = run(&mut agnostic, 0, &frames)
        .iter()
        .map(|u| u.assignments[0])
        .collect();
    assert_eq!(
        ids,
        vec![None, Some(TrackId(1)), Some(TrackId(1)), Some(TrackId(1))]
    );
}

#[test]
fn ids_are_never_reused_even_after_finish() {
    let mut t = tracker();
    let a = det(0, 0.9, 100.0, 100.0);
    let b = det(0, 0.9, 400.0, 100.0);
    run(&mut t, 0, &still(3, a));
    run(&mut t, 3, &vec![vec![]; 30]);
    assert_eq!(t.live_tracks(), 0);
    let updates = run(&mut t, 33, &still(3, b));
    assert_eq!(updates[2].assignments, vec![Some(TrackId(2))]);
    let ended = t.finish();
    assert_eq!(ended.iter().map(|e| e.id).collect::<Vec<_>>(), vec![TrackId(2)]);
    assert_eq!(t.live_tracks(), 0);
    let updates = run(&mut t, 36, &still(2, a));
    assert_eq!(updates[1].started, vec![(TrackId(3), 0)]);
}

#[test]
fn summaries_keep_the_best_detection() {
    let mut t = tracker();
    let scores = [0.75, 0.95, 0.8, 0.4];
    for (i, &score) in scores.iter().enumerate() {
        t.observe(&[det(2, score, 100.0 + i as f32, 100.0)], frame(i as u64));
    }
    let live = t.track(TrackId(1)).expect("confirmed at frame 1");
    assert_eq!(
        (live.best_score, live.best_box),
        (0.95, det(2, 0.95, 101.0, 100.0).bbox)
    );
    assert_eq!(
        (live.class_id, live.hits, live.first_seen, live.last_seen),
        (2, 4, frame(0), frame(3))
    );
    assert_eq!(live.last_box, det(2, 0.4, 103.0, 100.0).bbox);
    assert_eq!(t.finish(), vec![live]);
    assert_eq!(t.track(TrackId(1)), None);
}

#[test]
fn non_finite_detections_are_ignored() {
    let mut t = tracker();
    let mut bad = det(0, 0.9, 100.0, 100.0);
    bad.bbox.x2 = f32::NAN;
    let nan_score = Detection {
        score: f32::NAN,
        ..det(0, 0.9, 300.0, 100.0)
    };
    let updates = run(
        &mut t,
        0,
        &still(3, bad)
            .into_iter()
            .map(|mut f| {
                f.push(nan_score);
                f.push(det(0, 0.9, 500.0, 100.0));
                f
            })
            .collect::<Vec<_>>(),
    );
    assert_eq!(updates[2].assignments, vec![None, None, Some(TrackId(1))]);
    assert_eq!(t.live_tracks(), 1);
}
