//! What the rewrite leaves alone, what it adds, and what it refuses, checked on the decoded
//! protobuf (no ONNX Runtime needed).

mod common;

use peregrine_onnx::proto::ModelProto;
use peregrine_onnx::{rewrite, Dim, ElementType, RewriteError, RewriteOptions, TensorSpec};
use prost::Message;

fn decode(bytes: &[u8]) -> ModelProto {
    ModelProto::decode(bytes).expect("valid model")
}

fn ops(nodes: &[peregrine_onnx::proto::NodeProto]) -> Vec<&str> {
    nodes.iter().map(|n| n.op_type.as_deref().unwrap_or("")).collect()
}

#[test]
fn untouched_models_reencode_to_the_same_bytes() {
    // Nothing is lost in the schema: every field of the exports is known to the generated
    // types, and prost writes fields in the order the exporter did.
    for name in ["yolo11n", "yolo11n-fp16", "yolo26n-e2e"] {
        let bytes = common::model_bytes(name);
        assert!(
            decode(&bytes).encode_to_vec() == bytes,
            "{name} re-encodes differently"
        );
    }
}

#[test]
fn rewrite_adds_nodes_around_the_original_ones_and_keeps_everything_else() {
    let bytes = common::model_bytes("yolo11n");
    let before = decode(&bytes);
    let rewritten = rewrite(&bytes, &RewriteOptions::default()).expect("rewrite fits");
    let after = decode(&rewritten.model);

    assert_eq!(after.ir_version, before.ir_version);
    assert_eq!(after.opset_import, before.opset_import);
    // The original metadata, then the marker that the output holds candidate rows.
    let (kept, added) = after.metadata_props.split_at(before.metadata_props.len());
    assert_eq!(kept, before.metadata_props.as_slice());
    assert_eq!(added.len(), 1);
    assert_eq!(
        added[0].key.as_deref(),
        Some(peregrine_types::model::OUTPUT_FORM_KEY)
    );
    assert_eq!(
        added[0].value.as_deref(),
        Some(peregrine_types::model::CANDIDATES_FORM)
    );
    assert_eq!(after.producer_name, before.producer_name);
    let (g0, g1) = (before.graph.as_ref().unwrap(), after.graph.as_ref().unwrap());
    // Original initializers first, byte for byte; the new ones are small constants.
    assert_eq!(g1.initializer[..g0.initializer.len()], g0.initializer[..]);
    let added: usize = g1.initializer[g0.initializer.len()..]
        .iter()
        .map(|t| t.encoded_len())
        .sum();
    assert!(added < 1024, "added constants take {added} bytes");

    let front = ["Transpose", "Cast", "Mul"];
    let back = [
        "Slice",
        "Slice",
        "ReduceMax",
        "ArgMax",
        "Shape",
        "Gather",
        "Min",
        "TopK",
        "Unsqueeze",
        "Expand",
        "GatherElements",
        "GatherElements",
        "Slice",
        "Slice",
        "Div",
        "Sub",
        "Add",
        "Unsqueeze",
        "Cast",
        "Unsqueeze",
        "Concat",
        "Transpose",
    ];
    let n0 = g0.node.len();
    assert_eq!(g1.node.len(), n0 + front.len() + back.len());
    assert_eq!(ops(&g1.node[..3]), front);
    assert_eq!(
        g1.node[3..3 + n0],
        g0.node[..],
        "original nodes unchanged and in order"
    );
    assert_eq!(ops(&g1.node[3 + n0..]), back);

    // The new edges, and the old ones kept as internal values.
    assert_eq!(g1.input.len(), 1);
    assert_eq!(g1.input[0].name.as_deref(), Some("images_u8"));
    assert_eq!(g1.output[0].name.as_deref(), Some("candidates"));
    for old in ["images", "output0"] {
        assert!(
            g1.value_info.iter().any(|v| v.name.as_deref() == Some(old)),
            "{old} kept"
        );
    }
    assert_eq!(
        rewritten.input,
        TensorSpec {
            name: "images_u8".into(),
            element: ElementType::U8,
            dims: Some(vec![
                Dim::Named("batch".into()),
                Dim::Named("height".into()),
                Dim::Named("width".into()),
                Dim::Fixed(3)
            ]),
        }
    );
}

#[test]
fn fixed_anchor_counts_give_a_fixed_candidate_count() {
    let options = RewriteOptions {
        uint8_nhwc_input: false,
        top_k: Some(100),
        fold_dfl_softmax: false,
    };
    let rewritten = rewrite(&common::with_fixed_anchors("yolo11n", 8400), &options).expect("rewrite fits");
    let dims = rewritten.output.dims.clone().unwrap();
    assert_eq!(dims[1..], [Dim::Fixed(100), Dim::Fixed(6)]);
    let all = RewriteOptions {
        uint8_nhwc_input: false,
        top_k: Some(usize::MAX),
        fold_dfl_softmax: false,
    };
    let every = rewrite(&common::with_fixed_anchors("yolo11n", 8400), &all).expect("rewrite fits");
    assert_eq!(
        every.output.dims.unwrap()[1],
        Dim::Fixed(8400),
        "k is capped at the anchors"
    );
    let g = decode(&rewritten.model).graph.unwrap();
    assert!(
        !ops(&g.node).contains(&"Min"),
        "k is a constant when the anchors are fixed"
    );
    assert_eq!(g.input[0].name.as_deref(), Some("images"), "input left as it was");
}

fn with_names(count: usize) -> Vec<u8> {
    let mut model = decode(&common::model_bytes("yolo11n"));
    let names: Vec<String> = (0..count).map(|i| format!("{i}: 'c{i}'")).collect();
    for p in &mut model.metadata_props {
        if p.key.as_deref() == Some("names") {
            p.value = Some(format!("{{{}}}", names.join(", ")));
        }
    }
    model.encode_to_vec()
}

#[test]
fn refusals_say_what_did_not_fit() {
    let err = rewrite(b"not a model at all", &RewriteOptions::default()).unwrap_err();
    assert!(matches!(err, RewriteError::Decode(_)), "{err}");
    // Truncated and corrupted models are errors, never panics.
    let bytes = common::model_bytes("yolo11n");
    for cut in [1, 100, 10_000, bytes.len() - 1] {
        assert!(
            rewrite(&bytes[..cut], &RewriteOptions::default()).is_err(),
            "cut at {cut}"
        );
    }
    let mut flipped = bytes.clone();
    for i in (0..flipped.len()).step_by(997) {
        flipped[i] ^= 0x5A;
    }
    let _ = rewrite(&flipped, &RewriteOptions::default());

    let err = rewrite(&with_names(81), &RewriteOptions::default()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "output0 has shape [batch, 84, anchors] but metadata lists 81 names"
    );
    // The input rewrite alone does not care about the head.
    let input_only = RewriteOptions {
        uint8_nhwc_input: true,
        top_k: None,
        fold_dfl_softmax: false,
    };
    assert!(rewrite(&with_names(81), &input_only).is_ok());

    let zero = RewriteOptions {
        top_k: Some(0),
        ..Default::default()
    };
    assert_eq!(
        rewrite(&common::model_bytes("yolo11n"), &zero).unwrap_err(),
        RewriteError::ZeroTopK
    );

    let mut model = decode(&common::model_bytes("yolo11n"));
    model.opset_import[0].version = Some(11);
    let err = rewrite(&model.encode_to_vec(), &RewriteOptions::default()).unwrap_err();
    assert_eq!(err, RewriteError::Opset(11));

    let mut model = decode(&common::model_bytes("yolo11n"));
    if let Some(peregrine_onnx::proto::type_proto::Value::TensorType(t)) = model.graph.as_mut().unwrap().input
        [0]
    .r#type
    .as_mut()
    .and_then(|t| t.value.as_mut())
    {
        t.elem_type = Some(7);
    }
    let err = rewrite(&model.encode_to_vec(), &RewriteOptions::default()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "input \"images\" is int64, not a float image tensor"
    );

    let mut model = decode(&common::model_bytes("yolo11n"));
    for p in &mut model.metadata_props {
        if p.key.as_deref() == Some("task") {
            p.value = Some("pose".into());
        }
    }
    let err = rewrite(&model.encode_to_vec(), &RewriteOptions::default()).unwrap_err();
    assert_eq!(err, RewriteError::Task("pose".into()));
}

#[test]
fn summary_names_both_edges() {
    let r = rewrite(&common::model_bytes("yolo11n"), &RewriteOptions::default()).unwrap();
    assert_eq!(
        r.summary(),
        "input images float32 [batch, 3, height, width] -> images_u8 uint8 [batch, height, width, 3]; \
         output output0 float32 [batch, 84, anchors] -> candidates float32 [batch, candidates, 6]"
    );
    let dbg = format!("{r:?}");
    assert!(dbg.contains("model_bytes") && dbg.len() < 2000, "{dbg}");
    let fold_only = RewriteOptions {
        uint8_nhwc_input: false,
        top_k: None,
        fold_dfl_softmax: true,
    };
    let r = rewrite(&common::model_bytes("yolo11n"), &fold_only).unwrap();
    assert_eq!(
        r.summary(),
        "input images float32 [batch, 3, height, width] (unchanged); \
         output output0 float32 [batch, 84, anchors] (unchanged); DFL softmax folded at 1 site(s)"
    );
}
