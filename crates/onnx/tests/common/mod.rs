//! Shared by the parity test and the timing example: ONNX Runtime on the CPU, the shared test
//! images, the plain pipeline (peregrine_vision's letterbox, normaliser, postprocessor and
//! NMS, as the engine runs them) and the path the rewritten graph takes.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::OnceLock;

use ort::environment::Environment;
use ort::session::builder::GraphOptimizationLevel;
use ort::session::Session;
use ort::value::TensorRef;
use peregrine_types::{BBox, DetectParams, Detection, ModelDescription};
use peregrine_vision::nms::Nms;
use peregrine_vision::normalize::rgb8_to_planar_f32;
use peregrine_vision::{decode_image, Candidate, DetectorSpec, ImageView, Letterbox, LetterboxCanvas};
use peregrine_vision::{OutputLayout, Postprocessor};

pub fn shared_dir() -> PathBuf {
    std::env::var_os("PEREGRINE_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared"))
}

pub fn model_bytes(name: &str) -> Vec<u8> {
    let path = shared_dir().join("models").join(format!("{name}.onnx"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// `name`'s model with its output's anchor dimension declared fixed, as a static-shape
/// export would have it.
pub fn with_fixed_anchors(name: &str, anchors: i64) -> Vec<u8> {
    use peregrine_onnx::proto::tensor_shape_proto::dimension::Value;
    use peregrine_onnx::proto::type_proto;
    use prost::Message;
    let mut model = peregrine_onnx::proto::ModelProto::decode(model_bytes(name).as_slice()).expect("model");
    let output = &mut model.graph.as_mut().expect("graph").output[0];
    let Some(type_proto::Value::TensorType(t)) = output.r#type.as_mut().and_then(|t| t.value.as_mut()) else {
        panic!("output is not a tensor");
    };
    t.shape.as_mut().expect("output shape").dim[2].value = Some(Value::DimValue(anchors));
    model.encode_to_vec()
}

/// `name`'s model with its float32 input declared float16. The fp16 export's first node
/// casts the input to float16, which is then a no-op cast: a model with a float16 input.
pub fn with_f16_input(name: &str) -> Vec<u8> {
    use peregrine_onnx::proto::type_proto;
    use prost::Message;
    let mut model = peregrine_onnx::proto::ModelProto::decode(model_bytes(name).as_slice()).expect("model");
    let input = &mut model.graph.as_mut().expect("graph").input[0];
    let Some(type_proto::Value::TensorType(t)) = input.r#type.as_mut().and_then(|t| t.value.as_mut()) else {
        panic!("input is not a tensor");
    };
    t.elem_type = Some(10);
    model.encode_to_vec()
}

/// A float32 graph edge; `dims` entries that parse as numbers are fixed, others named.
pub fn value_info(name: &str, dims: &[&str]) -> peregrine_onnx::proto::ValueInfoProto {
    use peregrine_onnx::proto::tensor_proto::DataType;
    use peregrine_onnx::proto::tensor_shape_proto::{dimension, Dimension};
    use peregrine_onnx::proto::type_proto::{Tensor, Value};
    use peregrine_onnx::proto::{TensorShapeProto, TypeProto, ValueInfoProto};
    let dim = dims
        .iter()
        .map(|d| Dimension {
            value: Some(match d.parse::<i64>() {
                Ok(n) => dimension::Value::DimValue(n),
                Err(_) => dimension::Value::DimParam(d.to_string()),
            }),
            denotation: None,
        })
        .collect();
    ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(TypeProto {
            value: Some(Value::TensorType(Tensor {
                elem_type: Some(DataType::Float as i32),
                shape: Some(TensorShapeProto { dim }),
            })),
            denotation: None,
        }),
        ..Default::default()
    }
}

/// `x` -> Identity -> `output0`, both declared `dims`, opset 17, with `names` class names:
/// run through the rewrite, it times the added nodes alone.
pub fn identity_model(dims: &[&str], names: usize) -> Vec<u8> {
    use peregrine_onnx::proto::*;
    use prost::Message;
    let names: Vec<String> = (0..names).map(|i| format!("{i}: 'c{i}'")).collect();
    let graph = GraphProto {
        node: vec![NodeProto {
            input: vec!["x".into()],
            output: vec!["output0".into()],
            op_type: Some("Identity".into()),
            ..Default::default()
        }],
        input: vec![value_info("x", dims)],
        output: vec![value_info("output0", dims)],
        ..Default::default()
    };
    ModelProto {
        ir_version: Some(8),
        opset_import: vec![OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(17),
        }],
        graph: Some(graph),
        metadata_props: vec![StringStringEntryProto {
            key: Some("names".into()),
            value: Some(format!("{{{}}}", names.join(", "))),
        }],
        ..Default::default()
    }
    .encode_to_vec()
}

/// ONNX Runtime, loaded once: `ORT_DYLIB_PATH`, else this checkout's `make setup` cache.
pub fn environment() -> Environment {
    static ENV: OnceLock<Environment> = OnceLock::new();
    ENV.get_or_init(|| {
        let path = std::env::var_os("ORT_DYLIB_PATH")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                    .join("../../.cache/onnxruntime/1.31.1/libonnxruntime.so.1.31.1")
            });
        ort::init_from(&path)
            .unwrap_or_else(|e| panic!("cannot load ONNX Runtime from {}: {e}", path.display()))
            .with_name("peregrine-onnx-tests")
            .build()
            .expect("ONNX Runtime environment")
    })
    .clone()
}

/// A CPU session with the engine's settings (all graph optimisations).
pub fn session(model: &[u8]) -> Session {
    session_at(model, GraphOptimizationLevel::All)
}

pub fn session_at(model: &[u8], level: GraphOptimizationLevel) -> Session {
    Session::builder(&environment())
        .expect("session builder")
        .with_optimization_level(level)
        .expect("optimisation level")
        .commit_from_memory(model)
        .expect("ONNX Runtime accepts the model")
}

/// What `peregrine_backend::OrtBackend` reports for a session.
pub fn describe(session: &Session) -> ModelDescription {
    peregrine_backend::describe(session).expect("the session describes itself")
}

/// One shared image, letterboxed as the engine does it.
pub struct Prepared {
    pub name: String,
    /// Interleaved RGB8, `width * height * 3`: exactly what `LetterboxCanvas` produces.
    pub canvas: Vec<u8>,
    pub letterbox: Letterbox,
}

pub fn prepare_images(width: usize, height: usize) -> Vec<Prepared> {
    let dir = shared_dir().join("images");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    names.sort();
    let mut canvas = LetterboxCanvas::new();
    names
        .into_iter()
        .map(|name| {
            let bytes = std::fs::read(dir.join(&name)).expect("image bytes");
            let img = decode_image(&bytes, Default::default()).expect("decodable image");
            let letterbox = canvas.fill(ImageView::from(&img.rgb), width, height);
            Prepared {
                name,
                canvas: canvas.pixels().to_vec(),
                letterbox,
            }
        })
        .collect()
}

/// The model output as float32 (float16 widened, as the backend does) and its shape.
pub struct Output {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

fn extract(value: &ort::value::DynValue) -> Output {
    if let Ok((shape, data)) = value.try_extract_tensor::<f32>() {
        return Output {
            shape: shape.iter().map(|&d| d as usize).collect(),
            data: data.to_vec(),
        };
    }
    let (shape, data) = value.try_extract_tensor::<half::f16>().expect("float output");
    Output {
        shape: shape.iter().map(|&d| d as usize).collect(),
        data: data.iter().map(|v| v.to_f32()).collect(),
    }
}

/// The plain path's input: planar float32 from `rgb8_to_planar_f32`, images back to back.
pub fn planar_batch(images: &[&Prepared], buf: &mut Vec<f32>) -> [usize; 4] {
    let (w, h) = (images[0].letterbox.dst_width, images[0].letterbox.dst_height);
    let slot = 3 * w * h;
    buf.resize(slot * images.len(), 0.0);
    for (img, out) in images.iter().zip(buf.chunks_exact_mut(slot)) {
        rgb8_to_planar_f32(&img.canvas, out);
    }
    [images.len(), 3, h, w]
}

/// The rewritten path's input: the canvases themselves, back to back.
pub fn u8_batch(images: &[&Prepared], buf: &mut Vec<u8>) -> [usize; 4] {
    let (w, h) = (images[0].letterbox.dst_width, images[0].letterbox.dst_height);
    buf.clear();
    for img in images {
        buf.extend_from_slice(&img.canvas);
    }
    [images.len(), h, w, 3]
}

pub fn run_f32(session: &mut Session, shape: [usize; 4], data: &[f32]) -> Output {
    let t = TensorRef::from_array_view((shape, data)).expect("input tensor");
    let out = session.run(ort::inputs![t]).expect("run");
    extract(&out[0])
}

pub fn run_f16(session: &mut Session, shape: [usize; 4], data: &[half::f16]) -> Output {
    let t = TensorRef::from_array_view((shape, data)).expect("input tensor");
    let out = session.run(ort::inputs![t]).expect("run");
    extract(&out[0])
}

pub fn run_u8(session: &mut Session, shape: [usize; 4], data: &[u8]) -> Output {
    let t = TensorRef::from_array_view((shape, data)).expect("input tensor");
    let out = session.run(ort::inputs![t]).expect("run");
    extract(&out[0])
}

/// The plain path's detections per image: the engine's `Postprocessor` over the raw output.
pub fn plain_detections(
    layout: OutputLayout,
    out: &Output,
    images: &[&Prepared],
    params: &DetectParams,
) -> Vec<Vec<Detection>> {
    let rows = layout
        .candidates_per_image(&out.shape)
        .expect("output shape fits the layout");
    let per_image = out.data.len() / images.len();
    let mut post = Postprocessor::new();
    images
        .iter()
        .zip(out.data.chunks_exact(per_image))
        .map(|(img, slice)| {
            let mut dets = Vec::new();
            post.process(layout, slice, rows, params, &img.letterbox, &mut dets);
            dets
        })
        .collect()
}

/// The rewritten path's detections per image from `candidates` rows: threshold, class
/// filter, finite boxes, then the same NMS and mapping back that the `Postprocessor` applies
/// (`Postprocessor`'s row decoding is private, so these few lines mirror its
/// `channels_first` + `push_finite` + `finish`).
pub fn candidate_detections(
    out: &Output,
    images: &[&Prepared],
    params: &DetectParams,
) -> Vec<Vec<Detection>> {
    let per_image = out.data.len() / images.len();
    let mut nms = Nms::new();
    let (mut candidates, mut keep) = (Vec::new(), Vec::new());
    images
        .iter()
        .zip(out.data.chunks_exact(per_image))
        .map(|(img, rows)| {
            candidates.clear();
            for r in rows.chunks_exact(6) {
                // Rows arrive best first: the first one not over the threshold ends the list
                // (written so that a NaN score ends it too).
                let over = r[4] > params.conf;
                if !over {
                    break;
                }
                let class_id = r[5] as u32;
                let bbox = BBox::new(r[0], r[1], r[2], r[3]);
                let finite = [bbox.x1, bbox.y1, bbox.x2, bbox.y2].iter().all(|v| v.is_finite());
                if finite && params.wants_class(class_id) {
                    candidates.push(Candidate {
                        class_id,
                        score: r[4],
                        bbox,
                    });
                }
            }
            nms.run(&candidates, params.iou, params.max_det, &mut keep);
            keep.iter()
                .map(|&i| {
                    let c = candidates[i];
                    Detection {
                        class_id: c.class_id,
                        score: c.score,
                        bbox: img.letterbox.to_original(&c.bbox),
                    }
                })
                .collect()
        })
        .collect()
}

/// What the `candidates` rows should be, computed on the host from one image's raw head
/// (`[4 + C, A]`) with the CPU postprocessor's arithmetic: best class by strict `>` from class
/// 0, `BBox::from_cxcywh`, then the `k` best by score, equal scores in anchor order.
pub fn expected_rows(head: &[f32], num_classes: usize, k: usize) -> Vec<[f32; 6]> {
    let anchors = head.len() / (4 + num_classes);
    let row = |r: usize| &head[r * anchors..(r + 1) * anchors];
    let mut rows: Vec<(usize, [f32; 6])> = (0..anchors)
        .map(|a| {
            let (mut best, mut class) = (row(4)[a], 0usize);
            for c in 1..num_classes {
                if row(4 + c)[a] > best {
                    best = row(4 + c)[a];
                    class = c;
                }
            }
            let b = BBox::from_cxcywh(row(0)[a], row(1)[a], row(2)[a], row(3)[a]);
            (a, [b.x1, b.y1, b.x2, b.y2, best, class as f32])
        })
        .collect();
    rows.sort_by(|x, y| y.1[4].total_cmp(&x.1[4]).then(x.0.cmp(&y.0)));
    rows.into_iter().take(k).map(|(_, r)| r).collect()
}

/// The layout the engine would pick for this session's model.
pub fn layout_of(session: &Session) -> (DetectorSpec, OutputLayout) {
    let spec = DetectorSpec::from_model(&describe(session), None).expect("detector spec");
    let layout = spec.layout;
    (spec, layout)
}
