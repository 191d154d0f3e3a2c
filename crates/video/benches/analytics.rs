//! What a stream's analytics cost per frame with 50 objects moving: the tracker, 4 zones
//! and 4 lines, object events and updates together, as the stream's analytics thread runs
//! them (`FrameAnalytics`: no snapshots, whose JPEG encoding is per event, not per frame).
//! One iteration runs frames 1 to 99 of a 100-frame sequence on analytics that have seen
//! frame 0 (made outside the timing, with the zones built for the frame size), so time per
//! iteration / 99 is the cost of one frame. `tracking_only` has no zones or lines;
//! `..._updates_every_frame` allows an `object.update` on every frame (the most updates can
//! cost) where the defaults allow one per object per 5 s.

use std::hint::black_box;
use std::time::{Duration, UNIX_EPOCH};

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use peregrine_types::{BBox, ClassNames, Detection};
use peregrine_video::{
    AnalyticsConfig, CaptureTime, ClockSource, DetectionEvent, FrameAnalytics, LineConfig, Pts, UnitsConfig,
    ZoneConfig,
};

const OBJECTS: usize = 50;
const FRAMES: usize = 100;
const FPS: u64 = 25;

/// SplitMix64 as a uniform `[0, 1)` source: deterministic, so every run benches the same data.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f32 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) >> 40) as f32 / (1u64 << 24) as f32
    }
}

fn names() -> ClassNames {
    ClassNames::new(
        ["person", "bicycle", "car", "truck", "dog"]
            .map(String::from)
            .to_vec(),
    )
}

/// 100 frames of 50 objects of 5 classes on a 1920x1080 frame, each moving at its own speed
/// (up to 3 px a frame across, 2 down or up) with a pixel of jitter; a fifth of the
/// detections score under the tracker's high threshold.
fn frames() -> Vec<DetectionEvent> {
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let objects: Vec<(f32, f32, f32, f32, u32)> = (0..OBJECTS)
        .map(|i| {
            let (col, row) = ((i % 10) as f32, (i / 10) as f32);
            let velocity = (rng.next() * 6.0 - 3.0, rng.next() * 4.0 - 2.0);
            (
                40.0 + col * 180.0,
                60.0 + row * 200.0,
                velocity.0,
                velocity.1,
                i as u32 % 5,
            )
        })
        .collect();
    (0..FRAMES)
        .map(|f| {
            let detections = objects
                .iter()
                .map(|&(x, y, vx, vy, class_id)| {
                    let (x, y) = (x + vx * f as f32 + rng.next(), y + vy * f as f32 + rng.next());
                    let score = if rng.next() < 0.2 {
                        0.3 + rng.next() * 0.2
                    } else {
                        0.7 + rng.next() * 0.3
                    };
                    Detection {
                        class_id,
                        score,
                        bbox: BBox::new(x, y, x + 60.0, y + 140.0),
                    }
                })
                .collect();
            frame(f as u64, detections)
        })
        .collect()
}

fn frame(n: u64, detections: Vec<Detection>) -> DetectionEvent {
    let pts_ms = n * 1000 / FPS;
    DetectionEvent {
        stream: "bench".into(),
        seq: n,
        pts: Pts::from_90k((pts_ms * 90) as i64),
        capture: CaptureTime {
            wall: UNIX_EPOCH + Duration::from_secs(1_800_000_000) + Duration::from_millis(pts_ms),
            source: ClockSource::LocalReceive,
            received: tokio::time::Instant::now(),
        },
        width: 1920,
        height: 1080,
        track_ids: Vec::new(),
        detections,
        class_names: names(),
        published: UNIX_EPOCH,
        latency: Duration::ZERO,
    }
}

fn zone(name: &str, points: &[[f32; 2]]) -> ZoneConfig {
    ZoneConfig {
        name: name.into(),
        points: points.to_vec(),
        units: UnitsConfig::Pixels,
        classes: Vec::new(),
        loiter_s: Some(2.0),
    }
}

fn line(name: &str, start: [f32; 2], end: [f32; 2]) -> LineConfig {
    LineConfig {
        name: name.into(),
        start,
        end,
        units: UnitsConfig::Pixels,
        classes: Vec::new(),
    }
}

/// The zones bench's places: 4 zones (a rectangle, two quadrilaterals, an L) and 4 lines
/// over the whole frame, so objects enter, leave, loiter and cross.
fn places() -> AnalyticsConfig {
    AnalyticsConfig {
        zones: vec![
            zone(
                "dock",
                &[[100.0, 100.0], [800.0, 100.0], [800.0, 600.0], [100.0, 600.0]],
            ),
            zone(
                "ramp",
                &[[900.0, 200.0], [1700.0, 300.0], [1600.0, 900.0], [1000.0, 800.0]],
            ),
            zone(
                "yard",
                &[
                    [50.0, 650.0],
                    [900.0, 650.0],
                    [900.0, 1050.0],
                    [500.0, 1050.0],
                    [500.0, 850.0],
                    [50.0, 850.0],
                ],
            ),
            zone("door", &[[1200.0, 50.0], [1850.0, 120.0], [1500.0, 500.0]]),
        ],
        lines: vec![
            line("gate", [100.0, 540.0], [1800.0, 540.0]),
            line("aisle", [960.0, 40.0], [960.0, 1040.0]),
            line("diagonal", [200.0, 1000.0], [1700.0, 100.0]),
            line("exit", [1300.0, 900.0], [1900.0, 700.0]),
        ],
        ..AnalyticsConfig::default()
    }
}

fn bench_analytics(c: &mut Criterion) {
    let mut g = c.benchmark_group("analytics_50_objects");
    g.throughput(Throughput::Elements(FRAMES as u64 - 1));
    let every_frame = AnalyticsConfig {
        update_interval_s: 0.04,
        stationary_s: 1.0,
        ..places()
    };
    for (name, config) in [
        ("tracking_only", AnalyticsConfig::default()),
        ("tracking_4_zones_4_lines", places()),
        ("tracking_4_zones_4_lines_updates_every_frame", every_frame),
    ] {
        let frames = frames();
        let started = || {
            let mut analytics = FrameAnalytics::new(config.clone(), names()).expect("valid settings");
            let mut rest = frames.clone();
            analytics.observe(&mut rest[0]);
            (analytics, rest)
        };
        g.bench_function(name, |b| {
            b.iter_batched(
                started,
                |(mut analytics, mut rest)| {
                    let mut events = 0;
                    for event in &mut rest[1..] {
                        events += black_box(analytics.observe(event)).len();
                    }
                    // Dropped after the timing.
                    (events, analytics, rest)
                },
                BatchSize::LargeInput,
            )
        });
        // What one sequence produced, so the figures say what the work was.
        let mut analytics = FrameAnalytics::new(config, names()).expect("valid settings");
        let mut kinds = std::collections::BTreeMap::<&str, usize>::new();
        for event in frames.clone().iter_mut() {
            for e in analytics.observe(event) {
                *kinds.entry(e.kind.name()).or_default() += 1;
            }
        }
        eprintln!("{name}: events in {FRAMES} frames: {kinds:?}");
    }
    g.finish();
}

criterion_group!(benches, bench_analytics);
criterion_main!(benches);
