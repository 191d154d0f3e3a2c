//! The QDQ quantizer on the shared models: calibrate on two images, quantize, check the
//! graph's structure and metadata, and that ONNX Runtime runs it and still finds the
//! float model's objects. Refusals (float16 inside) are checked too.

mod common;

use std::collections::HashMap;

use ort::session::builder::GraphOptimizationLevel;
use ort::value::TensorRef;
use peregrine_onnx::proto::ModelProto;
use peregrine_onnx::quantize::{
    calibration_graph, quantize_qdq, ActivationType, CalibrationMethod, QdqOptions, QuantizeError, Selection,
    TensorHistogram, METADATA_PREFIX,
};
use peregrine_types::DetectParams;
use prost::Message;

/// Ranges of every planned tensor over `images` (min-max), by the calibration graph.
fn calibrate(
    model: &[u8],
    selection: &Selection,
    images: &[&common::Prepared],
) -> HashMap<String, (f32, f32)> {
    let (plan, graph) = calibration_graph(model, selection).expect("a calibration graph");
    let mut session = common::session_at(&graph, GraphOptimizationLevel::Level1);
    let mut histograms: HashMap<String, TensorHistogram> = plan
        .tensors
        .iter()
        .map(|t| (t.clone(), TensorHistogram::new()))
        .collect();
    let mut buf = Vec::new();
    for img in images {
        let shape = common::planar_batch(&[img], &mut buf);
        let input = TensorRef::from_array_view((shape, &buf[..])).expect("input");
        let outputs = session.run(ort::inputs![input]).expect("calibration run");
        for (name, value) in outputs.iter() {
            if let (Some(h), Ok((_, data))) = (histograms.get_mut(name), value.try_extract_tensor::<f32>()) {
                h.add(data);
            }
        }
    }
    assert!(
        histograms.values().all(|h| !h.is_empty()),
        "every planned tensor came back"
    );
    histograms
        .into_iter()
        .map(|(k, h)| (k, h.range(CalibrationMethod::MinMax)))
        .collect()
}

fn options() -> QdqOptions {
    QdqOptions {
        selection: Selection::default(),
        activations: ActivationType::Uint8,
        metadata: vec![
            ("method".into(), "min-max".into()),
            ("samples".into(), "2".into()),
        ],
    }
}

fn count(model: &ModelProto, op: &str) -> usize {
    let graph = model.graph.as_ref().expect("graph");
    graph
        .node
        .iter()
        .filter(|n| n.op_type.as_deref() == Some(op))
        .count()
}

#[test]
fn yolo11n_quantizes_into_a_qdq_model_that_finds_the_same_objects() {
    let bytes = common::model_bytes("yolo11n");
    let images = common::prepare_images(640, 640);
    let by_name = |n: &str| images.iter().find(|p| p.name == n).expect("shared image");
    let (bus, zidane) = (by_name("bus.jpg"), by_name("zidane.jpg"));
    let ranges = calibrate(&bytes, &Selection::default(), &[bus, zidane]);
    let q = quantize_qdq(&bytes, &ranges, &options()).expect("quantized");
    let model = ModelProto::decode(q.model.as_slice()).expect("valid model");

    let convs = count(&model, "Conv");
    let quantized_convs = q.nodes.iter().filter(|n| n.ends_with("Conv")).count();
    // Every conv but the seven output convs (3 box, 3 class, DFL) and attention's qkv
    // projection (which feeds a Reshape, not a conv) is quantized.
    assert_eq!(convs, 88);
    assert_eq!(quantized_convs, 88 - 8, "{:?}", q.nodes);
    assert_eq!(count(&model, "QuantizeLinear"), q.activations.len());
    let graph = model.graph.as_ref().expect("graph");
    let int8_weights = graph
        .initializer
        .iter()
        .filter(|t| t.data_type == Some(3) && t.dims.len() == 4)
        .count();
    assert_eq!(int8_weights, quantized_convs);
    let meta: HashMap<&str, &str> = model
        .metadata_props
        .iter()
        .filter_map(|p| Some((p.key.as_deref()?, p.value.as_deref()?)))
        .collect();
    assert_eq!(meta[format!("{METADATA_PREFIX}method").as_str()], "min-max");
    assert_eq!(meta[format!("{METADATA_PREFIX}activations").as_str()], "uint8");
    assert_eq!(
        meta[format!("{METADATA_PREFIX}nodes").as_str()],
        q.nodes.len().to_string()
    );
    assert!(meta.contains_key("names"), "Ultralytics' metadata is kept");

    // ONNX Runtime runs it, and the float model's confident objects are still found.
    let mut float = common::session(&bytes);
    let mut int8 = common::session(&q.model);
    let (_, layout) = common::layout_of(&float);
    let params = DetectParams::default();
    let mut buf = Vec::new();
    for img in [bus, zidane] {
        let shape = common::planar_batch(&[img], &mut buf);
        let f = common::plain_detections(layout, &common::run_f32(&mut float, shape, &buf), &[img], &params);
        let i = common::plain_detections(layout, &common::run_f32(&mut int8, shape, &buf), &[img], &params);
        let confident: Vec<_> = f[0].iter().filter(|d| d.score > 0.5).collect();
        assert!(!confident.is_empty());
        for d in confident {
            assert!(
                i[0].iter()
                    .any(|e| e.class_id == d.class_id && e.bbox.iou(&d.bbox) > 0.7),
                "{}: float {d:?} not found in {:?}",
                img.name,
                i[0]
            );
        }
    }
}

#[test]
fn end_to_end_model_quantizes_and_float16_is_refused() {
    let bytes = common::model_bytes("yolo26n-e2e");
    let images = common::prepare_images(640, 640);
    let bus = images.iter().find(|p| p.name == "bus.jpg").expect("bus");
    let ranges = calibrate(&bytes, &Selection::default(), &[bus]);
    let q = quantize_qdq(&bytes, &ranges, &options()).expect("quantized");
    let mut session = common::session(&q.model);
    let mut buf = Vec::new();
    let shape = common::planar_batch(&[bus], &mut buf);
    let out = common::run_f32(&mut session, shape, &buf);
    assert_eq!(out.shape, [1, 300, 6]);
    assert!(out.data.iter().all(|v| v.is_finite()));

    let err = calibration_graph(&common::model_bytes("yolo11n-fp16"), &Selection::default())
        .expect_err("float16 refused");
    assert_eq!(err, QuantizeError::Float16);
    assert!(err.to_string().contains("float32 export"), "{err}");
}
