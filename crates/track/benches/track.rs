//! The tracker's cost per frame with 50 objects moving: one iteration tracks a 100-frame
//! sequence from a fresh tracker, so time per iteration / 100 is the cost of one frame.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use peregrine_track::{Tracker, TrackerConfig};
use peregrine_types::{BBox, Detection};

const OBJECTS: usize = 50;
const FRAMES: usize = 100;

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

/// 50 objects of `classes` classes on a 1920x1080 frame, each moving at its own speed with a
/// pixel of jitter; a fifth of the detections score under the high threshold.
fn sequence(classes: u32) -> Vec<Vec<Detection>> {
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let objects: Vec<(f32, f32, f32, f32, u32)> = (0..OBJECTS)
        .map(|i| {
            let (col, row) = ((i % 10) as f32, (i / 10) as f32);
            let velocity = (rng.next() * 8.0 - 4.0, rng.next() * 4.0 - 2.0);
            (
                40.0 + col * 180.0,
                60.0 + row * 200.0,
                velocity.0,
                velocity.1,
                i as u32 % classes,
            )
        })
        .collect();
    (0..FRAMES)
        .map(|f| {
            objects
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
                .collect()
        })
        .collect()
}

fn bench_track(c: &mut Criterion) {
    let mut g = c.benchmark_group("track_50_objects");
    g.throughput(Throughput::Elements(FRAMES as u64));
    for (name, classes, class_aware) in [
        ("one_class", 1, true),
        ("five_classes", 5, true),
        ("class_agnostic", 5, false),
    ] {
        let frames = sequence(classes);
        let config = TrackerConfig {
            class_aware,
            ..Default::default()
        };
        g.bench_function(name, |b| {
            b.iter(|| {
                let mut tracker = Tracker::new(config.clone());
                for (i, detections) in frames.iter().enumerate() {
                    black_box(tracker.observe(detections, Duration::from_millis(40 * i as u64)));
                }
                tracker.live_tracks()
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench_track);
criterion_main!(benches);
