//! Times the plain and rewritten graphs on ONNX Runtime's CPU provider, per image, at batch 1
//! and 4, over the shared test images; and the rewrite itself.
//!
//! `cargo run --release -p peregrine-onnx --example timing [iterations] [model...]`
//!
//! "run" is `Session::run` alone (input copy in, output copy out); "host" adds what the host
//! does around it on each path: normalisation and the full postprocess (best class scan,
//! threshold, NMS) for the plain graph, thresholding the rows and NMS for the rewritten one.

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::Prepared;
use peregrine_onnx::{rewrite, RewriteOptions};
use peregrine_types::DetectParams;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration, per: usize) -> String {
    format!("{:7.2}", d.as_secs_f64() * 1e3 / per as f64)
}

/// `median / min` per image: the machine is shared, and the minimum is the figure least
/// disturbed by other work; both paths are timed alternately so noise hits them alike.
fn both(v: Vec<Duration>, per: usize) -> String {
    let min = v.iter().min().copied().unwrap_or_default();
    format!("{} /{}", ms(median(v), per), ms(min, per))
}

fn main() {
    let iterations: usize = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(10);
    let images = common::prepare_images(640, 640);
    let params = DetectParams::default();

    let bytes = common::model_bytes("yolo11n");
    let times: Vec<Duration> = (0..20)
        .map(|_| {
            let t = Instant::now();
            let r = rewrite(&bytes, &RewriteOptions::default()).expect("rewrite");
            std::hint::black_box(r.model.len());
            t.elapsed()
        })
        .collect();
    println!(
        "rewrite yolo11n (decode + edit + encode): median {} ms",
        ms(median(times), 1)
    );
    let rewritten = rewrite(&bytes, &RewriteOptions::default()).expect("rewrite");
    for (label, model) in [("original", &bytes), ("rewritten", &rewritten.model)] {
        let times: Vec<Duration> = (0..5)
            .map(|_| {
                let t = Instant::now();
                drop(common::session(model));
                t.elapsed()
            })
            .collect();
        println!(
            "ONNX Runtime session from {label} yolo11n: median {} ms",
            ms(median(times), 1)
        );
    }

    added_work_alone(&images);

    println!("ms per image, median / min of {iterations} runs");
    println!("model         batch       plain run     rewritten run   plain host+run  rewritten host+run");
    // Model names after the iteration count pick the models (and their order).
    let mut models: Vec<String> = std::env::args().skip(2).collect();
    if models.is_empty() {
        models = ["yolo11n", "yolo11n-fp16", "yolo26n-e2e"]
            .map(String::from)
            .to_vec();
    }
    for name in &models {
        let name = name.as_str();
        let original = common::model_bytes(name);
        let rewritten = rewrite(&original, &RewriteOptions::default()).expect("rewrite");
        let mut plain = common::session(&original);
        let mut ours = common::session(&rewritten.model);
        let (_, layout) = common::layout_of(&plain);
        let batches: &[usize] = if name == "yolo26n-e2e" { &[1] } else { &[1, 4] };
        for &n in batches {
            let groups: Vec<Vec<&Prepared>> = images
                .chunks(n)
                .filter(|c| c.len() == n)
                .map(|c| c.iter().collect())
                .collect();
            let (mut fbuf, mut ubuf) = (Vec::new(), Vec::new());
            let (mut p_run, mut o_run, mut p_all, mut o_all) = (vec![], vec![], vec![], vec![]);
            for it in 0..iterations + 2 {
                let batch = &groups[it % groups.len()];
                let t0 = Instant::now();
                let shape = common::planar_batch(batch, &mut fbuf);
                let t1 = Instant::now();
                let out = common::run_f32(&mut plain, shape, &fbuf);
                let t2 = Instant::now();
                std::hint::black_box(common::plain_detections(layout, &out, batch, &params));
                let t3 = Instant::now();

                let shape = common::u8_batch(batch, &mut ubuf);
                let t4 = Instant::now();
                let out = common::run_u8(&mut ours, shape, &ubuf);
                let t5 = Instant::now();
                if name == "yolo26n-e2e" {
                    std::hint::black_box(common::plain_detections(layout, &out, batch, &params));
                } else {
                    std::hint::black_box(common::candidate_detections(&out, batch, &params));
                }
                let t6 = Instant::now();
                if it >= 2 {
                    p_run.push(t2 - t1);
                    p_all.push(t3 - t0);
                    o_run.push(t5 - t4);
                    o_all.push(t6 - t4);
                }
            }
            println!(
                "{name:13} {n:5}  {}  {}  {}  {}",
                both(p_run, n),
                both(o_run, n),
                both(p_all, n),
                both(o_all, n)
            );
        }
    }
}

/// The added nodes on their own, on graphs that are nothing but them (an Identity in the
/// middle): what the rewrite adds to a CPU run, free of the model's 100 ms of noise.
fn added_work_alone(images: &[Prepared]) {
    let time = |f: &mut dyn FnMut()| {
        let v: Vec<Duration> = (0..30)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed()
            })
            .collect();
        both(v, 1)
    };
    let batch = vec![&images[0]];
    let (mut fbuf, mut ubuf) = (Vec::new(), Vec::new());
    let u8_shape = common::u8_batch(&batch, &mut ubuf);

    let input_only = RewriteOptions {
        uint8_nhwc_input: true,
        top_k: None,
        fold_dfl_softmax: false,
    };
    let model = common::identity_model(&["batch", "3", "height", "width"], 80);
    let r = rewrite(&model, &input_only).expect("rewrite");
    let mut s = common::session(&r.model);
    let in_graph = time(&mut || drop(common::run_u8(&mut s, u8_shape, &ubuf)));
    let on_host = time(&mut || {
        common::planar_batch(&batch, &mut fbuf);
    });
    println!("normalise 640x640 (ms, median / min): in graph (Transpose, Cast, Mul) {in_graph}; on host (rgb8_to_planar_f32) {on_host}");

    // A real head: yolo11n's output for the first image.
    let mut plain = common::session(&common::model_bytes("yolo11n"));
    let shape = common::planar_batch(&batch, &mut fbuf);
    let head = common::run_f32(&mut plain, shape, &fbuf);
    let output_only = RewriteOptions {
        uint8_nhwc_input: false,
        top_k: Some(peregrine_onnx::DEFAULT_TOP_K),
        fold_dfl_softmax: false,
    };
    let model = common::identity_model(&["batch", "84", "anchors"], 80);
    let r = rewrite(&model, &output_only).expect("rewrite");
    let mut s = common::session(&r.model);
    let head_shape = [1, 84, head.shape[2]];
    let in_graph = time(&mut || {
        let t = ort::value::TensorRef::from_array_view((head_shape, head.data.as_slice())).expect("tensor");
        drop(s.run(ort::inputs![t]).expect("run"));
    });
    let (_, layout) = common::layout_of(&plain);
    let params = DetectParams::default();
    let on_host = time(&mut || {
        std::hint::black_box(common::plain_detections(layout, &head, &batch, &params));
    });
    println!("head [1, 84, 8400] to candidates (ms, median / min): in graph (ReduceMax ... Transpose) {in_graph}; whole host postprocess incl. NMS {on_host}");
}
