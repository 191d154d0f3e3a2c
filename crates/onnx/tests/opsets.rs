//! Every operator form the rewrite writes (Unsqueeze's axes as attribute before opset 13,
//! ReduceMax's axes as input from 18) runs in ONNX Runtime and gives the host arithmetic's
//! rows, on a synthetic "detector" whose head is its normalised input reshaped to
//! `[N, 4 + 2, A]`. Its values come from 256 byte levels, so equal scores are everywhere:
//! the test pins down the tie order (first class of equal scores, lower anchor first).

mod common;

use common::value_info as value;
use peregrine_onnx::proto::tensor_proto::DataType;
use peregrine_onnx::proto::*;
use peregrine_onnx::{rewrite, OutputForm, RewriteOptions};
use prost::Message;

/// `images [N, 3, H, W]` -> `Reshape [0, 6, -1]` -> `output0 [N, 6, anchors]`, two classes.
fn synthetic_detector(opset: i64) -> Vec<u8> {
    let shape: Vec<u8> = [0i64, 6, -1].iter().flat_map(|v| v.to_le_bytes()).collect();
    let graph = GraphProto {
        node: vec![NodeProto {
            input: vec!["images".into(), "shape".into()],
            output: vec!["output0".into()],
            name: Some("reshape".into()),
            op_type: Some("Reshape".into()),
            ..Default::default()
        }],
        name: Some("synthetic".into()),
        initializer: vec![TensorProto {
            dims: vec![3],
            data_type: Some(DataType::Int64 as i32),
            name: Some("shape".into()),
            raw_data: Some(shape),
            ..Default::default()
        }],
        input: vec![value("images", &["batch", "3", "height", "width"])],
        output: vec![value("output0", &["batch", "6", "anchors"])],
        ..Default::default()
    };
    let meta = |k: &str, v: &str| StringStringEntryProto {
        key: Some(k.into()),
        value: Some(v.into()),
    };
    ModelProto {
        ir_version: Some(10),
        opset_import: vec![OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(opset),
        }],
        producer_name: Some("peregrine-onnx tests".into()),
        graph: Some(graph),
        metadata_props: vec![meta("names", "{0: 'a', 1: 'b'}"), meta("task", "detect")],
        ..Default::default()
    }
    .encode_to_vec()
}

/// Deterministic bytes with few distinct values, so scores tie often.
fn pixels(n: usize, seed: u32) -> Vec<u8> {
    let mut x = seed;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            ((x >> 8) % 16 * 16) as u8
        })
        .collect()
}

#[test]
fn every_opset_form_gives_the_host_rows_ties_included() {
    for opset in [12, 13, 17, 18, 21] {
        let original = synthetic_detector(opset);
        let options = RewriteOptions {
            uint8_nhwc_input: true,
            top_k: Some(20),
            fold_dfl_softmax: false,
        };
        let rewritten = rewrite(&original, &options).unwrap_or_else(|e| panic!("opset {opset}: {e}"));
        assert_eq!(
            rewritten.output_form,
            OutputForm::Candidates {
                max_rows: 20,
                num_classes: 2
            }
        );
        let mut plain = common::session(&original);
        let mut ours = common::session(&rewritten.model);
        // 8x8: 32 anchors (k = 20); 2x4: 4 anchors (k = 4, fewer than asked for).
        for (h, w, k) in [(8, 8, 20), (2, 4, 4)] {
            let (n, hw) = (3, h * w);
            let bytes = pixels(n * hw * 3, 7 + opset as u32);
            let mut planar = vec![0f32; n * 3 * hw];
            for (img, out) in bytes.chunks_exact(hw * 3).zip(planar.chunks_exact_mut(3 * hw)) {
                peregrine_vision::normalize::rgb8_to_planar_f32(img, out);
            }
            let p = common::run_f32(&mut plain, [n, 3, h, w], &planar);
            let o = common::run_u8(&mut ours, [n, h, w, 3], &bytes);
            assert_eq!(o.shape, [n, k, 6], "opset {opset} {h}x{w}");
            let per_image = p.data.len() / n;
            for (i, head) in p.data.chunks_exact(per_image).enumerate() {
                let expected: Vec<f32> = common::expected_rows(head, 2, k).concat();
                let got = &o.data[i * k * 6..(i + 1) * k * 6];
                assert_eq!(got, &expected[..], "opset {opset} {h}x{w} image {i}");
            }
        }
    }
}

/// `images [N, 3, 16, 16]` -> `Reshape [0, 16, 4, -1]` -> `Softmax(axis=1)` -> a 1x1 `Conv`
/// with weights 0..15 -> `Reshape [0, 4, -1]` -> `output0`: the DFL of a YOLOv8/11 head.
fn synthetic_dfl(opset: i64) -> Vec<u8> {
    let ints = |v: &[i64]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let weights: Vec<u8> = (0..16).flat_map(|i| (i as f32).to_le_bytes()).collect();
    let tensor = |name: &str, ty: DataType, dims: Vec<i64>, raw: Vec<u8>| TensorProto {
        dims,
        data_type: Some(ty as i32),
        name: Some(name.into()),
        raw_data: Some(raw),
        ..Default::default()
    };
    let node = |op: &str, inputs: &[&str], output: &str, attribute: Vec<AttributeProto>| NodeProto {
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: vec![output.into()],
        name: Some(output.into()),
        op_type: Some(op.into()),
        attribute,
        ..Default::default()
    };
    let axis = AttributeProto {
        name: Some("axis".into()),
        r#type: Some(attribute_proto::AttributeType::Int as i32),
        i: Some(1),
        ..Default::default()
    };
    let graph = GraphProto {
        node: vec![
            node("Reshape", &["images", "bins"], "logits", vec![]),
            node("Softmax", &["logits"], "probs", vec![axis]),
            node("Conv", &["probs", "w"], "dist", vec![]),
            node("Reshape", &["dist", "sides"], "output0", vec![]),
        ],
        name: Some("synthetic dfl".into()),
        initializer: vec![
            tensor("bins", DataType::Int64, vec![4], ints(&[0, 16, 4, -1])),
            tensor("sides", DataType::Int64, vec![3], ints(&[0, 4, -1])),
            tensor("w", DataType::Float, vec![1, 16, 1, 1], weights),
        ],
        input: vec![value("images", &["batch", "3", "16", "16"])],
        output: vec![value("output0", &["batch", "4", "anchors"])],
        ..Default::default()
    };
    ModelProto {
        ir_version: Some(10),
        opset_import: vec![OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(opset),
        }],
        graph: Some(graph),
        ..Default::default()
    }
    .encode_to_vec()
}

#[test]
fn the_dfl_fold_runs_and_matches_at_every_opset_it_applies_to() {
    let options = RewriteOptions {
        uint8_nhwc_input: false,
        top_k: None,
        fold_dfl_softmax: true,
    };
    // Logits spread over [-24, 24]: exp without the max subtracted would lose the small ones.
    let input: Vec<f32> = pixels(2 * 768, 3)
        .iter()
        .map(|&b| b as f32 / 5.3 - 24.0)
        .collect();
    for opset in [12, 13, 17, 18, 21] {
        let original = synthetic_dfl(opset);
        let folded = rewrite(&original, &options).unwrap_or_else(|e| panic!("opset {opset}: {e}"));
        // Softmax's axis meant something else before 13: left alone there.
        assert_eq!(folded.dfl_folds, usize::from(opset >= 13), "opset {opset}");
        let p = common::run_f32(&mut common::session(&original), [2, 3, 16, 16], &input);
        let o = common::run_f32(&mut common::session(&folded.model), [2, 3, 16, 16], &input);
        assert_eq!(p.shape, [2, 4, 12]);
        assert_eq!(p.shape, o.shape);
        let worst = p
            .data
            .iter()
            .zip(&o.data)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(
            worst < 1e-5,
            "opset {opset}: the fold moved a distance by {worst}"
        );
    }
}
