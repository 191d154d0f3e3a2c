//! The whole detection pipeline on the real model, stage by stage, at batch 1.
//!
//! Compares the model's own time with everything around it (decode, letterbox, normalize,
//! output decoding, NMS) in one run, so the ratio holds whatever the machine's load.

use std::path::PathBuf;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use peregrine_backend::{OrtBackend, SessionConfig};
use peregrine_engine::{Detector, DetectorConfig, StageTimings};
use peregrine_types::DetectParams;
use peregrine_vision::{decode_image, ImageView};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn bench_pipeline(c: &mut Criterion) {
    let model = repo().join("models/yolo11n.onnx");
    let image_path = std::env::var_os("PEREGRINE_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("../shared"))
        .join("images/bus.jpg");
    let Ok(bytes) = std::fs::read(&image_path) else {
        eprintln!("skipping pipeline bench: {} not found", image_path.display());
        return;
    };
    let backend = OrtBackend::from_file(&model, &SessionConfig::default()).expect("run `make setup` first");
    let mut detector = Detector::new(Box::new(backend), &DetectorConfig::default()).unwrap();
    let params = DetectParams::default();
    let image = decode_image(&bytes, Default::default()).unwrap();

    let mut g = c.benchmark_group("pipeline_batch1");
    g.sample_size(20).measurement_time(Duration::from_secs(15));
    g.bench_function("decode_bus_jpg", |b| {
        b.iter(|| decode_image(&bytes, Default::default()).unwrap())
    });
    let mut stages = StageTimings::default();
    let mut runs = 0u32;
    g.bench_function("detect_bus_jpg", |b| {
        b.iter(|| {
            let (_, t) = detector.detect(&[ImageView::from(&image.rgb)], &params).unwrap();
            stages += t;
            runs += 1;
        })
    });
    g.finish();
    let per = |d: Duration| d.as_secs_f64() * 1e3 / f64::from(runs.max(1));
    eprintln!(
        "stage means over {runs} runs: preprocess {:.3} ms, inference {:.3} ms, postprocess {:.3} ms",
        per(stages.preprocess),
        per(stages.inference),
        per(stages.postprocess)
    );
}

criterion_group!(benches, bench_pipeline);
criterion_main!(benches);
