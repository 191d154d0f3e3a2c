//! Hot paths of the pure vision code: decode, letterbox + normalize, output decoding, NMS.

use std::hint::black_box;
use std::path::PathBuf;

use criterion::{criterion_group, criterion_main, Criterion};
use peregrine_types::{BBox, DetectParams};
use peregrine_vision::nms::Nms;
use peregrine_vision::normalize::rgb8_to_planar_f32;
use peregrine_vision::{
    decode_image, Candidate, ImageView, Letterbox, LetterboxCanvas, OutputLayout, Postprocessor,
};

/// A deterministic xorshift generator, so every run benches the same data.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 40) as f32 / (1u64 << 24) as f32
    }
}

fn shared_images() -> PathBuf {
    std::env::var_os("PEREGRINE_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared"))
        .join("images")
}

fn textured(w: usize, h: usize) -> Vec<u8> {
    (0..w * h * 3).map(|i| ((i * 7919) % 251) as u8).collect()
}

fn bench_decode(c: &mut Criterion) {
    let mut g = c.benchmark_group("decode");
    for name in ["bus.jpg", "zidane.jpg", "astronaut.png"] {
        let Ok(bytes) = std::fs::read(shared_images().join(name)) else {
            eprintln!("skipping decode/{name}: shared images not found");
            continue;
        };
        g.bench_function(name, |b| {
            b.iter(|| decode_image(black_box(&bytes), Default::default()).unwrap())
        });
    }
    g.finish();
}

fn bench_preprocess(c: &mut Criterion) {
    let mut g = c.benchmark_group("letterbox_normalize");
    for (w, h) in [(640, 480), (1280, 720), (1920, 1080)] {
        let pixels = textured(w, h);
        let mut canvas = LetterboxCanvas::new();
        let mut slot = vec![0f32; 3 * 640 * 640];
        g.bench_function(format!("{w}x{h}_to_640"), |b| {
            b.iter(|| {
                let view = ImageView::packed(black_box(&pixels), w, h).unwrap();
                canvas.fill(view, 640, 640);
                rgb8_to_planar_f32(canvas.pixels(), &mut slot);
            })
        });
    }
    g.finish();
}

/// 8400 candidates in 60 clusters of heavily overlapping boxes over 10 classes: the shape
/// of a crowded scene's raw output with every anchor above the threshold.
fn clustered_candidates(n: usize) -> Vec<Candidate> {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let centres: Vec<(f32, f32, f32, u32)> = (0..60)
        .map(|i| {
            (
                rng.next() * 600.0 + 20.0,
                rng.next() * 600.0 + 20.0,
                rng.next() * 80.0 + 20.0,
                i % 10,
            )
        })
        .collect();
    (0..n)
        .map(|i| {
            let (cx, cy, s, class_id) = centres[i % centres.len()];
            let j = |r: &mut Rng| (r.next() - 0.5) * s * 0.2;
            Candidate {
                class_id,
                score: 0.25 + rng.next() * 0.75,
                bbox: BBox::from_cxcywh(
                    cx + j(&mut rng),
                    cy + j(&mut rng),
                    s + j(&mut rng),
                    s + j(&mut rng),
                ),
            }
        })
        .collect()
}

fn bench_nms(c: &mut Criterion) {
    let mut g = c.benchmark_group("nms");
    let candidates = clustered_candidates(8400);
    let mut nms = Nms::new();
    let mut keep = Vec::new();
    g.bench_function("8400_clustered", |b| {
        b.iter(|| nms.run(black_box(&candidates), 0.7, 300, &mut keep))
    });
    // Disjoint boxes: nothing is suppressed, so the loop stops at max_det.
    let grid: Vec<Candidate> = (0..8400)
        .map(|i| Candidate {
            class_id: (i % 80) as u32,
            score: 1.0 - i as f32 / 8400.0,
            bbox: BBox::new(
                (i % 92) as f32 * 7.0,
                (i / 92) as f32 * 7.0,
                (i % 92) as f32 * 7.0 + 6.0,
                (i / 92) as f32 * 7.0 + 6.0,
            ),
        })
        .collect();
    g.bench_function("8400_disjoint", |b| {
        b.iter(|| nms.run(black_box(&grid), 0.7, 300, &mut keep))
    });
    g.finish();
}

/// Raw YOLO11 output `[84, 8400]` with a few confident anchors, decoded and suppressed.
fn bench_postprocess(c: &mut Criterion) {
    let mut rng = Rng(42);
    let anchors = 8400;
    let mut raw = vec![0f32; 84 * anchors];
    for a in 0..anchors {
        raw[a] = rng.next() * 640.0;
        raw[anchors + a] = rng.next() * 640.0;
        raw[2 * anchors + a] = rng.next() * 100.0 + 5.0;
        raw[3 * anchors + a] = rng.next() * 100.0 + 5.0;
        for c in 0..80 {
            // Mostly low scores; about 2% of anchors confident in one class.
            raw[(4 + c) * anchors + a] = rng.next() * 0.05;
        }
        if a % 50 == 0 {
            raw[(4 + a % 80) * anchors + a] = 0.5 + rng.next() * 0.5;
        }
    }
    let mut post = Postprocessor::new();
    let lb = Letterbox::new(1280, 720, 640, 640);
    let params = DetectParams::default();
    let mut out = Vec::new();
    c.bench_function("postprocess/yolo11_8400_anchors", |b| {
        b.iter(|| {
            out.clear();
            post.process(
                OutputLayout::ChannelsFirst { num_classes: 80 },
                black_box(&raw),
                anchors,
                &params,
                &lb,
                &mut out,
            );
        })
    });
}

criterion_group!(
    benches,
    bench_decode,
    bench_preprocess,
    bench_nms,
    bench_postprocess
);
criterion_main!(benches);
