//! The rewritten graphs give the plain CPU pipeline's detections, run by ONNX Runtime on the
//! CPU over the shared test images.
//!
//! Plain path: `LetterboxCanvas` -> `rgb8_to_planar_f32` -> original model -> `Postprocessor`
//! (conf 0.25, class-aware NMS at IoU 0.7, max 300). Rewritten path: the same canvas bytes
//! fed as uint8 -> rewritten model -> `candidates` rows above conf -> the same `Nms` -> the
//! same `Letterbox::to_original`. Detections must agree in count and class, boxes within
//! 1e-3 px and scores within 1e-5; the candidate rows themselves are also checked against
//! the rows the CPU arithmetic gives for the original head.

mod common;

use common::{candidate_detections, expected_rows, plain_detections, Output, Prepared};
use peregrine_onnx::{rewrite, InputForm, OutputForm, RewriteOptions, DEFAULT_TOP_K};
use peregrine_types::{DetectParams, Detection};

#[derive(Debug, Default)]
struct Worst {
    detections: usize,
    box_px: f32,
    score: f32,
}

/// Asserts the two detection lists agree and returns the largest differences seen.
fn compare(label: &str, plain: &[Vec<Detection>], ours: &[Vec<Detection>], worst: &mut Worst) {
    assert_eq!(plain.len(), ours.len());
    for (i, (p, o)) in plain.iter().zip(ours).enumerate() {
        assert_eq!(p.len(), o.len(), "{label} image {i}: detection count");
        for (a, b) in p.iter().zip(o) {
            assert_eq!(a.class_id, b.class_id, "{label} image {i}: class");
            let d = [
                (a.bbox.x1 - b.bbox.x1).abs(),
                (a.bbox.y1 - b.bbox.y1).abs(),
                (a.bbox.x2 - b.bbox.x2).abs(),
                (a.bbox.y2 - b.bbox.y2).abs(),
            ];
            let box_px = d.into_iter().fold(0.0, f32::max);
            let score = (a.score - b.score).abs();
            assert!(box_px <= 1e-3, "{label} image {i}: box off by {box_px} px");
            assert!(score <= 1e-5, "{label} image {i}: score off by {score}");
            worst.box_px = worst.box_px.max(box_px);
            worst.score = worst.score.max(score);
        }
        worst.detections += p.len();
    }
}

/// Largest per-field difference between the graph's rows and the host-computed ones.
fn row_diff(label: &str, ours: &[f32], expected: &[[f32; 6]]) -> (f32, f32) {
    assert_eq!(ours.len(), expected.len() * 6, "{label}: candidate row count");
    let (mut box_d, mut score_d) = (0f32, 0f32);
    for (i, (r, e)) in ours.chunks_exact(6).zip(expected).enumerate() {
        assert_eq!(r[5], e[5], "{label} row {i}: class");
        for c in 0..4 {
            box_d = box_d.max((r[c] - e[c]).abs());
        }
        score_d = score_d.max((r[4] - e[4]).abs());
    }
    (box_d, score_d)
}

fn one(images: &[Prepared], i: usize) -> Vec<&Prepared> {
    vec![&images[i]]
}

/// Runs the plain and rewritten `model` image by image at batch 1, then as one batch of
/// four, and checks rows and detections.
fn check_raw_head(model: &str, head_bytes_per_value: usize) {
    let original = common::model_bytes(model);
    let rewritten = rewrite(&original, &RewriteOptions::default()).expect("rewrite fits");
    eprintln!("{model}: {}", rewritten.summary());
    assert_eq!(rewritten.input_form, InputForm::InterleavedU8);
    assert_eq!(
        rewritten.output_form,
        OutputForm::Candidates {
            max_rows: DEFAULT_TOP_K,
            num_classes: 80
        }
    );

    let mut plain = common::session(&original);
    let mut ours = common::session(&rewritten.model);
    let (_, layout) = common::layout_of(&plain);
    let images = common::prepare_images(640, 640);
    let params = DetectParams::default();
    let (mut fbuf, mut ubuf) = (Vec::new(), Vec::new());
    let mut worst = Worst::default();
    let (mut row_box, mut row_score) = (0f32, 0f32);
    let (mut plain_bytes, mut our_bytes) = (0, 0);
    // How full the K rows get: the most rows over conf in one image, and the highest score
    // of a last row (a threshold above it means no image lost a candidate to the cut).
    let (mut most_over_conf, mut highest_last_row) = (0, 0f32);

    for i in 0..images.len() {
        let batch = one(&images, i);
        let shape = common::planar_batch(&batch, &mut fbuf);
        let p: Output = common::run_f32(&mut plain, shape, &fbuf);
        let shape = common::u8_batch(&batch, &mut ubuf);
        let o: Output = common::run_u8(&mut ours, shape, &ubuf);
        assert_eq!(o.shape, [1, DEFAULT_TOP_K, 6]);
        plain_bytes = p.data.len() * head_bytes_per_value;
        our_bytes = o.data.len() * 4;
        let scores: Vec<f32> = o.data.chunks_exact(6).map(|r| r[4]).collect();
        most_over_conf = most_over_conf.max(scores.iter().filter(|&&s| s > params.conf).count());
        highest_last_row = highest_last_row.max(scores[scores.len() - 1]);

        let label = format!("{model} {}", images[i].name);
        let (b, s) = row_diff(&label, &o.data, &expected_rows(&p.data, 80, DEFAULT_TOP_K));
        row_box = row_box.max(b);
        row_score = row_score.max(s);
        compare(
            &label,
            &plain_detections(layout, &p, &batch, &params),
            &candidate_detections(&o, &batch, &params),
            &mut worst,
        );
    }

    // One batch of four: the batch dimension stays dynamic through the added nodes.
    let batch: Vec<&Prepared> = images.iter().take(4).collect();
    let shape = common::planar_batch(&batch, &mut fbuf);
    let p = common::run_f32(&mut plain, shape, &fbuf);
    let shape = common::u8_batch(&batch, &mut ubuf);
    let o = common::run_u8(&mut ours, shape, &ubuf);
    assert_eq!(o.shape, [4, DEFAULT_TOP_K, 6]);
    let mut worst4 = Worst::default();
    compare(
        &format!("{model} batch 4"),
        &plain_detections(layout, &p, &batch, &params),
        &candidate_detections(&o, &batch, &params),
        &mut worst4,
    );

    eprintln!(
        "{model}: {} images, {} detections identical in count and class; max |box diff| {} px, \
         max |score diff| {}; candidate rows vs host arithmetic: max |box diff| {}, max |score \
         diff| {}; batch 4: {} detections, max box {} px, max score {}",
        images.len(),
        worst.detections,
        worst.box_px,
        worst.score,
        row_box,
        row_score,
        worst4.detections,
        worst4.box_px,
        worst4.score
    );
    eprintln!("{model}: output per image {plain_bytes} bytes -> {our_bytes} bytes");
    eprintln!(
        "{model}: at most {most_over_conf} of {DEFAULT_TOP_K} rows over conf in one image; \
         highest last-row score {highest_last_row}"
    );
    assert!(
        highest_last_row <= params.conf,
        "K rows cut off candidates over conf"
    );
    assert!(
        worst.detections > 20,
        "the images should give plenty of detections"
    );
}

#[test]
fn yolo11n_candidates_give_the_cpu_pipelines_detections() {
    check_raw_head("yolo11n", 4);
}

#[test]
fn yolo11n_fp16_candidates_give_the_cpu_pipelines_detections() {
    // The fp16 export's head is float16; the backend widens it, the rewrite casts it.
    check_raw_head("yolo11n-fp16", 2);
}

#[test]
fn input_rewrite_alone_reproduces_the_raw_head_bit_for_bit() {
    let original = common::model_bytes("yolo11n");
    let options = RewriteOptions {
        uint8_nhwc_input: true,
        top_k: None,
        fold_dfl_softmax: false,
    };
    let rewritten = rewrite(&original, &options).expect("rewrite fits");
    assert_eq!(rewritten.output_form, OutputForm::Unchanged);
    let mut plain = common::session(&original);
    let mut ours = common::session(&rewritten.model);
    let images = common::prepare_images(640, 640);
    let (mut fbuf, mut ubuf) = (Vec::new(), Vec::new());
    for i in [0, 5] {
        let batch = one(&images, i);
        let shape = common::planar_batch(&batch, &mut fbuf);
        let p = common::run_f32(&mut plain, shape, &fbuf);
        let shape = common::u8_batch(&batch, &mut ubuf);
        let o = common::run_u8(&mut ours, shape, &ubuf);
        assert_eq!(p.shape, o.shape);
        let differing = p
            .data
            .iter()
            .zip(&o.data)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        assert_eq!(
            differing, 0,
            "{}: raw head differs in {differing} values",
            images[i].name
        );
    }
}

#[test]
fn dfl_fold_moves_boxes_by_under_a_thousandth_of_a_pixel_and_keeps_scores() {
    let fold_only = RewriteOptions {
        uint8_nhwc_input: false,
        top_k: None,
        fold_dfl_softmax: true,
    };
    let images = common::prepare_images(640, 640);
    let mut buf = Vec::new();
    // The fp16 export keeps its DFL in float32 (casts around it), so it is folded too.
    for model in ["yolo11n", "yolo11n-fp16"] {
        let original = common::model_bytes(model);
        let folded = rewrite(&original, &fold_only).expect("rewrite fits");
        assert_eq!(folded.dfl_folds, 1, "{model}: {}", folded.summary());
        let mut plain = common::session(&original);
        let mut ours = common::session(&folded.model);
        let batches = [one(&images, 0), one(&images, 7), images.iter().take(4).collect()];
        let (mut box_px, mut score) = (0f32, 0f32);
        for batch in batches {
            let shape = common::planar_batch(&batch, &mut buf);
            let p = common::run_f32(&mut plain, shape, &buf);
            let o = common::run_f32(&mut ours, shape, &buf);
            assert_eq!(p.shape, o.shape);
            let anchors = p.shape[2];
            for (i, (a, b)) in p.data.iter().zip(&o.data).enumerate() {
                let d = (a - b).abs();
                if (i / anchors) % p.shape[1] < 4 {
                    box_px = box_px.max(d);
                } else {
                    score = score.max(d);
                }
            }
        }
        eprintln!("{model} DFL fold: boxes within {box_px} px, class scores within {score}");
        // The fp16 head rounds to float16, whose steps are 0.25-0.5 px between 256 and 640:
        // a flip of its last bit is all the fold may cause there.
        let limit = if model == "yolo11n" { 1e-3 } else { 0.5 };
        assert!(box_px < limit, "{model}: boxes moved by {box_px} px");
        assert_eq!(score, 0.0, "{model}: class scores do not go through the DFL");
    }
    // An end-to-end head has no DFL site: left as it is.
    let e2e = rewrite(&common::model_bytes("yolo26n-e2e"), &fold_only).expect("rewrite fits");
    assert_eq!(e2e.dfl_folds, 0);
}

#[test]
fn yolo26n_end_to_end_takes_uint8_and_keeps_its_output() {
    let original = common::model_bytes("yolo26n-e2e");
    let rewritten = rewrite(&original, &RewriteOptions::default()).expect("rewrite fits");
    eprintln!("yolo26n-e2e: {}", rewritten.summary());
    assert_eq!(rewritten.output_form, OutputForm::EndToEnd);
    assert_eq!(rewritten.output, rewritten.original_output);
    let mut plain = common::session(&original);
    let mut ours = common::session(&rewritten.model);
    let (_, layout) = common::layout_of(&plain);
    let images = common::prepare_images(640, 640);
    let params = DetectParams::default();
    let (mut fbuf, mut ubuf) = (Vec::new(), Vec::new());
    let (mut worst, mut raw_diff) = (Worst::default(), 0f32);
    for i in 0..images.len() {
        let batch = one(&images, i);
        let shape = common::planar_batch(&batch, &mut fbuf);
        let p = common::run_f32(&mut plain, shape, &fbuf);
        let shape = common::u8_batch(&batch, &mut ubuf);
        let o = common::run_u8(&mut ours, shape, &ubuf);
        raw_diff = p
            .data
            .iter()
            .zip(&o.data)
            .map(|(a, b)| (a - b).abs())
            .fold(raw_diff, f32::max);
        compare(
            &format!("yolo26n-e2e {}", images[i].name),
            &plain_detections(layout, &p, &batch, &params),
            &plain_detections(layout, &o, &batch, &params),
            &mut worst,
        );
    }
    eprintln!(
        "yolo26n-e2e: {} detections identical in count and class; max |box diff| {} px, max \
         |score diff| {}; max |raw output diff| {raw_diff}",
        worst.detections, worst.box_px, worst.score
    );
    assert!(
        worst.detections > 20,
        "the images should give plenty of detections"
    );
}

#[test]
fn dynamic_sizes_take_k_or_every_anchor_when_fewer() {
    let original = common::model_bytes("yolo11n");
    let rewritten = rewrite(&original, &RewriteOptions::default()).expect("rewrite fits");
    let mut plain = common::session(&original);
    let mut ours = common::session(&rewritten.model);
    // 320x320 has 2100 anchors (more than K); 96x64 has 126 (fewer).
    for (w, h, rows) in [(320, 320, DEFAULT_TOP_K), (96, 64, 126)] {
        let images = common::prepare_images(w, h);
        let batch: Vec<&Prepared> = images.iter().skip(1).take(2).collect();
        let (mut fbuf, mut ubuf) = (Vec::new(), Vec::new());
        let shape = common::planar_batch(&batch, &mut fbuf);
        let p = common::run_f32(&mut plain, shape, &fbuf);
        let shape = common::u8_batch(&batch, &mut ubuf);
        let o = common::run_u8(&mut ours, shape, &ubuf);
        assert_eq!(o.shape, [2, rows, 6], "{w}x{h}");
        let per_image = p.data.len() / 2;
        for (n, head) in p.data.chunks_exact(per_image).enumerate() {
            let ours = &o.data[n * rows * 6..(n + 1) * rows * 6];
            let (b, s) = row_diff(
                &format!("{w}x{h} image {n}"),
                ours,
                &expected_rows(head, 80, rows),
            );
            assert!(b <= 1e-3 && s <= 1e-5, "{w}x{h}: rows off by {b} px / {s}");
        }
    }
}

#[test]
fn fixed_anchors_use_a_constant_k() {
    let original = common::with_fixed_anchors("yolo11n", 8400);
    let options = RewriteOptions {
        uint8_nhwc_input: true,
        top_k: Some(100),
        fold_dfl_softmax: false,
    };
    let rewritten = rewrite(&original, &options).expect("rewrite fits");
    let mut plain = common::session(&original);
    let mut ours = common::session(&rewritten.model);
    let images = common::prepare_images(640, 640);
    let batch: Vec<&Prepared> = images.iter().take(2).collect();
    let (mut fbuf, mut ubuf) = (Vec::new(), Vec::new());
    let shape = common::planar_batch(&batch, &mut fbuf);
    let p = common::run_f32(&mut plain, shape, &fbuf);
    let shape = common::u8_batch(&batch, &mut ubuf);
    let o = common::run_u8(&mut ours, shape, &ubuf);
    assert_eq!(o.shape, [2, 100, 6]);
    let per_image = p.data.len() / 2;
    for (n, head) in p.data.chunks_exact(per_image).enumerate() {
        let (b, s) = row_diff(
            &format!("image {n}"),
            &o.data[n * 600..(n + 1) * 600],
            &expected_rows(head, 80, 100),
        );
        assert!(b == 0.0 && s == 0.0, "rows off by {b} px / {s}");
    }
}

/// The rewritten model with its internal normalised input (the original input's name) also
/// exposed as an output, so the values themselves can be compared, not only their effect.
fn exposing_normalised_input(rewritten: &[u8], name: &str) -> Vec<u8> {
    use peregrine_onnx::proto::ModelProto;
    use prost::Message;
    let mut model = ModelProto::decode(rewritten).expect("model");
    let graph = model.graph.as_mut().expect("graph");
    let declared = graph
        .value_info
        .iter()
        .find(|v| v.name.as_deref() == Some(name))
        .cloned();
    graph
        .output
        .push(declared.expect("original input kept in value_info"));
    model.encode_to_vec()
}

#[test]
fn normalised_input_is_the_cpu_normalisers_bit_for_bit() {
    let images = common::prepare_images(640, 640);
    let batch: Vec<&Prepared> = images.iter().take(2).collect();
    let (mut fbuf, mut ubuf) = (Vec::new(), Vec::new());
    let shape = common::planar_batch(&batch, &mut fbuf);
    let u8_shape = common::u8_batch(&batch, &mut ubuf);
    let input_only = RewriteOptions {
        uint8_nhwc_input: true,
        top_k: None,
        fold_dfl_softmax: false,
    };

    // float32 input: exactly rgb8_to_planar_f32's values.
    let r = rewrite(&common::model_bytes("yolo11n"), &input_only).expect("rewrite fits");
    let mut s = common::session(&exposing_normalised_input(&r.model, "images"));
    let t = ort::value::TensorRef::from_array_view((u8_shape, ubuf.as_slice())).expect("tensor");
    let out = s.run(ort::inputs![t]).expect("run");
    let (dims, values) = out["images"].try_extract_tensor::<f32>().expect("float32 images");
    assert_eq!(dims.iter().map(|&d| d as usize).collect::<Vec<_>>(), shape);
    let differing = values
        .iter()
        .zip(&fbuf)
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count();
    assert_eq!(differing, 0, "float32 input differs in {differing} values");
    drop(out);

    // float16 input: those values rounded once to float16. (Comparing heads would not show
    // this on the CPU: ONNX Runtime's CPU provider runs float16 convolutions in float32 and
    // drops the float32 -> float16 -> float32 round trip in front of them.)
    let r = rewrite(&common::with_f16_input("yolo11n-fp16"), &input_only).expect("rewrite fits");
    assert_eq!(r.original_input.element, peregrine_onnx::ElementType::F16);
    let mut s = common::session(&exposing_normalised_input(&r.model, "images"));
    let t = ort::value::TensorRef::from_array_view((u8_shape, ubuf.as_slice())).expect("tensor");
    let out = s.run(ort::inputs![t]).expect("run");
    let (_, values) = out["images"]
        .try_extract_tensor::<half::f16>()
        .expect("float16 images");
    let differing = values
        .iter()
        .zip(&fbuf)
        .filter(|(a, b)| a.to_bits() != half::f16::from_f32(**b).to_bits())
        .count();
    assert_eq!(differing, 0, "float16 input differs in {differing} values");
}

/// A graph with its input shape fixed (one session per batch size) computes exactly what
/// the dynamic graph does, for the plain and the fully rewritten model; its declared shape
/// is the fixed one, and `describe` reads the file as ONNX Runtime does.
#[test]
fn fixed_input_shapes_give_the_dynamic_graphs_output_bit_for_bit() {
    let original = common::model_bytes("yolo11n");
    let rewritten = rewrite(&original, &RewriteOptions::default()).expect("rewrite fits");
    let images = common::prepare_images(640, 640);
    let batch: Vec<&Prepared> = [0, 5, 9].iter().map(|&i| &images[i]).collect();
    let (mut fbuf, mut ubuf) = (Vec::new(), Vec::new());
    for (model, u8_input) in [(&original, false), (&rewritten.model, true)] {
        let fixed = peregrine_onnx::fix_input_shape(model, batch.len(), 640, 640).expect("fixes");
        let mut dynamic = common::session(model);
        let mut fixed_session = common::session(&fixed);
        assert_eq!(
            common::describe(&fixed_session).inputs,
            peregrine_onnx::describe(&fixed).unwrap().inputs,
            "describe reads what ONNX Runtime reads"
        );
        let fixed_dims = &common::describe(&fixed_session).inputs[0].dims;
        assert!(fixed_dims.iter().all(|d| d.fixed().is_some()), "{fixed_dims:?}");
        let (a, b) = if u8_input {
            let shape = common::u8_batch(&batch, &mut ubuf);
            (
                common::run_u8(&mut dynamic, shape, &ubuf),
                common::run_u8(&mut fixed_session, shape, &ubuf),
            )
        } else {
            let shape = common::planar_batch(&batch, &mut fbuf);
            (
                common::run_f32(&mut dynamic, shape, &fbuf),
                common::run_f32(&mut fixed_session, shape, &fbuf),
            )
        };
        assert_eq!(a.shape, b.shape);
        let differing = a
            .data
            .iter()
            .zip(&b.data)
            .filter(|(x, y)| x.to_bits() != y.to_bits())
            .count();
        assert_eq!(differing, 0, "u8 input {u8_input}: {differing} values differ");
    }
}
