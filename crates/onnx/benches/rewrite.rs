//! The cost of rewriting at load time: decode, edit and encode yolo11n (11 MB), against
//! decode and encode alone, which is the floor any protobuf-level edit pays.

use std::hint::black_box;
use std::path::PathBuf;

use criterion::{criterion_group, criterion_main, Criterion};
use peregrine_onnx::proto::ModelProto;
use peregrine_onnx::{rewrite, RewriteOptions};
use prost::Message;

fn model(name: &str) -> Option<Vec<u8>> {
    let dir = std::env::var_os("PEREGRINE_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared"));
    std::fs::read(dir.join("models").join(format!("{name}.onnx"))).ok()
}

fn bench_rewrite(c: &mut Criterion) {
    let mut g = c.benchmark_group("rewrite");
    for name in ["yolo11n", "yolo26n-e2e"] {
        let Some(bytes) = model(name) else {
            eprintln!("skipping {name}: shared models not found");
            continue;
        };
        g.bench_function(format!("{name}/decode_edit_encode"), |b| {
            b.iter(|| rewrite(black_box(&bytes), &RewriteOptions::default()).map(|r| r.model.len()))
        });
        g.bench_function(format!("{name}/decode_encode_only"), |b| {
            b.iter(|| ModelProto::decode(black_box(bytes.as_slice())).map(|m| m.encode_to_vec().len()))
        });
    }
    g.finish();
}

criterion_group!(benches, bench_rewrite);
criterion_main!(benches);
