//! One stream's zones and lines per frame: 50 tracked objects, 4 zones, 4 lines.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use peregrine_types::BBox;
use peregrine_zones::{Analytics, AnalyticsConfig, Hysteresis, LineSpec, Point, TrackedBox, Units, ZoneSpec};

/// A deterministic xorshift generator, so every run benches the same data.
struct Rng(u64);
impl Rng {
    fn unit(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 40) as f32 / (1u64 << 24) as f32
    }
}

fn points(list: &[(f32, f32)]) -> Vec<Point> {
    list.iter().map(|(x, y)| Point::new(*x, *y)).collect()
}

fn zone(name: &str, list: &[(f32, f32)]) -> ZoneSpec {
    ZoneSpec {
        name: name.to_owned(),
        points: points(list),
        units: Units::Pixels,
        classes: None,
        loiter: Some(Duration::from_secs(10)),
    }
}

fn line(name: &str, start: (f32, f32), end: (f32, f32)) -> LineSpec {
    LineSpec {
        name: name.to_owned(),
        start: Point::new(start.0, start.1),
        end: Point::new(end.0, end.1),
        units: Units::Pixels,
        classes: None,
    }
}

fn stream(hysteresis: Hysteresis) -> Analytics {
    let zones = vec![
        zone(
            "dock",
            &[(100.0, 100.0), (800.0, 100.0), (800.0, 600.0), (100.0, 600.0)],
        ),
        zone(
            "ramp",
            &[(900.0, 200.0), (1700.0, 300.0), (1600.0, 900.0), (1000.0, 800.0)],
        ),
        zone(
            "yard",
            &[
                (50.0, 650.0),
                (900.0, 650.0),
                (900.0, 1050.0),
                (500.0, 1050.0),
                (500.0, 850.0),
                (50.0, 850.0),
            ],
        ),
        zone("door", &[(1200.0, 50.0), (1850.0, 120.0), (1500.0, 500.0)]),
    ];
    let lines = vec![
        line("gate", (100.0, 540.0), (1800.0, 540.0)),
        line("aisle", (960.0, 40.0), (960.0, 1040.0)),
        line("diagonal", (200.0, 1000.0), (1700.0, 100.0)),
        line("exit", (1300.0, 900.0), (1900.0, 700.0)),
    ];
    let config = AnalyticsConfig {
        zone_hysteresis: hysteresis,
        line_hysteresis: hysteresis,
        ..AnalyticsConfig::default()
    };
    Analytics::new(zones, lines, config, (1920, 1080)).expect("valid zones")
}

/// 200 frames of 50 objects wandering over a 1080p frame.
fn frames() -> Vec<Vec<TrackedBox>> {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut objects: Vec<(f32, f32, f32, f32)> = (0..50)
        .map(|_| {
            (
                rng.unit() * 1920.0,
                rng.unit() * 1080.0,
                rng.unit() * 8.0 - 4.0,
                rng.unit() * 8.0 - 4.0,
            )
        })
        .collect();
    (0..200)
        .map(|_| {
            objects
                .iter_mut()
                .enumerate()
                .map(|(i, (x, y, vx, vy))| {
                    *x = (*x + *vx).rem_euclid(1920.0);
                    *y = (*y + *vy).rem_euclid(1080.0);
                    TrackedBox {
                        track: i as u64,
                        class_id: (i % 4) as u32,
                        bbox: BBox::new(*x - 30.0, *y - 120.0, *x + 30.0, *y),
                    }
                })
                .collect()
        })
        .collect()
}

fn observe(c: &mut Criterion) {
    let frames = frames();
    for (name, hysteresis) in [("default", Hysteresis::default()), ("off", Hysteresis::OFF)] {
        let mut analytics = stream(hysteresis);
        let mut n = 0usize;
        c.bench_function(
            &format!("zones/observe 50 objects 4 zones 4 lines ({name} hysteresis)"),
            |b| {
                b.iter(|| {
                    let frame = &frames[n % frames.len()];
                    n += 1;
                    black_box(analytics.observe(black_box(frame), Duration::from_millis(40 * n as u64)))
                })
            },
        );
    }
}

criterion_group!(benches, observe);
criterion_main!(benches);
