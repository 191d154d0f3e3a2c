//! One inference request of the Open Inference Protocol, after HTTP or gRPC has been
//! peeled off: inputs as raw bytes in, output tensors out. The detection model decodes
//! each `IMAGE` element and returns padded detection tensors; the tensor model splits
//! its float input per image and returns the raw outputs stacked again.

use std::time::{Duration, Instant};

use bytes::Bytes;
use peregrine_engine::{AdmissionPermit, Engine, ImageResult};
use peregrine_types::{ClassRef, DetectParams, ParamsRequest};
use peregrine_vision::InputForm;

use super::face::{self, Face, Resolved};
use super::tensor::{element_count, split_bytes_elements, DataType, OutputData};
use crate::fallback::{self, Admission};
use crate::{ApiError, AppState};

/// Most images in one detection request.
pub const MAX_IMAGES: usize = 64;

#[derive(Debug, Clone)]
pub struct InferInput {
    pub name: String,
    pub datatype: String,
    pub shape: Vec<i64>,
    /// Little-endian, row-major; BYTES elements length-prefixed.
    pub raw: Bytes,
}

/// Request parameters Peregrine reads; others are ignored, as the protocol allows.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct InferParams {
    pub conf: Option<f32>,
    pub iou: Option<f32>,
    pub max_det: Option<usize>,
    /// Class ids or names, comma separated.
    pub classes: Option<String>,
    /// Triton's `timeout` parameter.
    pub timeout: Option<Duration>,
    /// `false` keeps the request on the model it names, however busy (see
    /// `crate::fallback`).
    pub fallback: Option<bool>,
}

#[derive(Debug, Clone)]
pub struct InferRequest {
    pub id: Option<String>,
    pub inputs: Vec<InferInput>,
    /// Outputs asked for by name, in the order wanted; `None` for all.
    pub outputs: Option<Vec<String>>,
    pub params: InferParams,
}

#[derive(Debug, Clone, PartialEq)]
pub struct InferOutput {
    pub name: String,
    pub shape: Vec<usize>,
    pub data: OutputData,
}

#[derive(Debug, Clone)]
pub struct InferResponse {
    pub model_name: String,
    pub model_version: String,
    pub id: Option<String>,
    pub outputs: Vec<InferOutput>,
}

/// The engine behind `resolved` at `version` (else the one serving), and the request's
/// admission on it or a place on its fallback (`crate::fallback`). Taken before the
/// request's body is read or parsed, so that a full server refuses at once and a refused
/// request costs no reading and no parsing.
pub fn admit(state: &AppState, resolved: &Resolved<'_>, version: Option<u64>) -> Result<Admission, ApiError> {
    let engine = resolved.model.route(version)?.clone();
    state.admission(engine, version.is_none())
}

/// Runs `request` on the face `resolved` names: on the engine that admitted it, or on
/// the model's fallback when the request allows it and the fallback can take its input.
/// The answer names the model (as the same face) and version that served it.
pub async fn infer(
    state: &AppState,
    resolved: &Resolved<'_>,
    version: Option<u64>,
    admission: Admission,
    request: InferRequest,
    deadline: Instant,
) -> Result<InferResponse, ApiError> {
    let [input] = request.inputs.as_slice() else {
        return Err(ApiError::BadRequest(format!(
            "model {:?} takes exactly one input; the request has {}",
            resolved.name,
            request.inputs.len()
        )));
    };
    let allowed = fallback::allowed(version, request.params.fallback);
    let takes = |e: &Engine| fits(resolved.face, e, input, request.outputs.as_deref());
    let (mut engine, permit) = admission.settle(allowed, takes)?;
    let outputs = match run(resolved.face, &engine, &permit, input, &request.params, deadline).await {
        Ok(outputs) => outputs,
        Err(e) => {
            // One image or tensor refused before any work was spent on it may still move.
            let single = input.shape.first() == Some(&1);
            let Some((moved, permit)) = state.after_refusal(&engine, &e, allowed && single, takes) else {
                return Err(e);
            };
            engine = moved;
            run(resolved.face, &engine, &permit, input, &request.params, deadline).await?
        }
    };
    let model_name = face::face_name(resolved.face, engine.name());
    let outputs = select_outputs(&model_name, outputs, request.outputs.as_deref())?;
    Ok(InferResponse {
        model_name,
        model_version: engine.version().to_string(),
        id: request.id,
        outputs,
    })
}

async fn run(
    face: Face,
    engine: &Engine,
    permit: &AdmissionPermit,
    input: &InferInput,
    params: &InferParams,
    deadline: Instant,
) -> Result<Vec<InferOutput>, ApiError> {
    match face {
        Face::Detection => detect(engine, permit, input, params, deadline).await,
        Face::Tensor => raw(engine, permit, input, deadline).await,
    }
}

/// Whether `engine` can take `input` and give the `outputs` asked for, as `face` offers
/// it: the detection face takes encoded images on any detection model; the tensor face
/// only the engine's own input tensor (name, type, size, batch) and output.
fn fits(face: Face, engine: &Engine, input: &InferInput, outputs: Option<&[String]>) -> bool {
    match face {
        Face::Detection => true,
        Face::Tensor => {
            let output = &engine.spec().output_name;
            tensor_batch(engine, input).is_ok() && outputs.is_none_or(|o| o.iter().all(|n| n == output))
        }
    }
}

/// Keeps the outputs asked for, in the order asked.
fn select_outputs(
    model: &str,
    all: Vec<InferOutput>,
    wanted: Option<&[String]>,
) -> Result<Vec<InferOutput>, ApiError> {
    let Some(wanted) = wanted else { return Ok(all) };
    wanted
        .iter()
        .map(|name| {
            all.iter().find(|o| &o.name == name).cloned().ok_or_else(|| {
                ApiError::BadRequest(format!(
                    "unexpected inference output {name:?} for model {model:?}; it has: {}",
                    all.iter().map(|o| o.name.as_str()).collect::<Vec<_>>().join(", ")
                ))
            })
        })
        .collect()
}

fn check_input(input: &InferInput, name: &str, datatype: DataType) -> Result<(), ApiError> {
    if input.name != name {
        return Err(ApiError::BadRequest(format!(
            "unexpected inference input {:?}; the model's input is {name:?}",
            input.name
        )));
    }
    if input.datatype != datatype.protocol_name() {
        return Err(ApiError::BadRequest(format!(
            "input {name:?} must be {}, not {}",
            datatype.protocol_name(),
            input.datatype
        )));
    }
    Ok(())
}

fn params(engine: &Engine, p: &InferParams) -> Result<DetectParams, ApiError> {
    let request = ParamsRequest {
        conf: p.conf,
        iou: p.iou,
        max_det: p.max_det,
        classes: p.classes.as_deref().map(ClassRef::parse_list),
    };
    Ok(request.resolve(&engine.config().defaults, &engine.spec().names)?)
}

async fn detect(
    engine: &Engine,
    permit: &AdmissionPermit,
    input: &InferInput,
    p: &InferParams,
    deadline: Instant,
) -> Result<Vec<InferOutput>, ApiError> {
    check_input(input, face::IMAGE, DataType::Bytes)?;
    let batch = match input.shape.as_slice() {
        [n] | [n, 1] if *n >= 1 => *n as usize,
        other => {
            return Err(ApiError::BadRequest(format!(
                "input IMAGE has shape {other:?}; send [N] or [N, 1] encoded images"
            )))
        }
    };
    let images = split_bytes_elements(face::IMAGE, &input.raw)?;
    if images.len() != batch {
        return Err(ApiError::BadRequest(format!(
            "input IMAGE has shape {:?} but holds {} elements",
            input.shape,
            images.len()
        )));
    }
    if batch > MAX_IMAGES {
        return Err(ApiError::BadRequest(format!(
            "{batch} images in one request; at most {MAX_IMAGES}"
        )));
    }
    let params = params(engine, p)?;
    let runs = images
        .into_iter()
        .map(|image| engine.detect(permit, image, params.clone(), deadline));
    let mut results = Vec::with_capacity(batch);
    for (i, outcome) in futures_util::future::join_all(runs).await.into_iter().enumerate() {
        match outcome {
            Ok(r) => results.push(r),
            Err(e) if batch == 1 => return Err(e.into()),
            Err(e) => {
                return Err(ApiError::Image {
                    context: format!("IMAGE element {i}"),
                    source: e,
                })
            }
        }
    }
    Ok(detection_outputs(engine, &results))
}

/// Detections as padded tensors: `K` is the most detections of any image in the batch;
/// rows past an image's `NUM_DETECTIONS` are zeros (class -1, empty label).
fn detection_outputs(engine: &Engine, results: &[ImageResult]) -> Vec<InferOutput> {
    let n = results.len();
    let k = results.iter().map(|r| r.detections.len()).max().unwrap_or(0);
    let names = &engine.spec().names;
    let mut boxes = vec![0f32; n * k * 4];
    let mut scores = vec![0f32; n * k];
    let mut classes = vec![-1i32; n * k];
    let mut labels = vec![Vec::new(); n * k];
    for (i, r) in results.iter().enumerate() {
        for (j, d) in r.detections.iter().enumerate() {
            let at = i * k + j;
            boxes[at * 4..at * 4 + 4].copy_from_slice(&[d.bbox.x1, d.bbox.y1, d.bbox.x2, d.bbox.y2]);
            scores[at] = d.score;
            classes[at] = d.class_id as i32;
            labels[at] = names.name(d.class_id).as_bytes().to_vec();
        }
    }
    let counts = results.iter().map(|r| r.detections.len() as i32).collect();
    vec![
        InferOutput {
            name: face::NUM_DETECTIONS.into(),
            shape: vec![n, 1],
            data: OutputData::Int32(counts),
        },
        InferOutput {
            name: face::BOXES.into(),
            shape: vec![n, k, 4],
            data: OutputData::Fp32(boxes),
        },
        InferOutput {
            name: face::SCORES.into(),
            shape: vec![n, k],
            data: OutputData::Fp32(scores),
        },
        InferOutput {
            name: face::CLASSES.into(),
            shape: vec![n, k],
            data: OutputData::Int32(classes),
        },
        InferOutput {
            name: face::LABELS.into(),
            shape: vec![n, k],
            data: OutputData::Bytes(labels),
        },
    ]
}

/// How many images `input` holds as `engine`'s own input tensor, or why it is not one.
fn tensor_batch(engine: &Engine, input: &InferInput) -> Result<usize, ApiError> {
    let s = engine.spec();
    let (h, w) = (s.input_height as i64, s.input_width as i64);
    let (datatype, layout) = match s.input_form {
        InputForm::PlanarF32 => (DataType::Fp32, format!("[N, 3, {h}, {w}]")),
        InputForm::InterleavedU8 => (DataType::Uint8, format!("[N, {h}, {w}, 3]")),
    };
    check_input(input, &s.input_name, datatype)?;
    let max = engine.config().policy.max_batch;
    let batch = match (s.input_form, input.shape.as_slice()) {
        (InputForm::PlanarF32, [n, 3, hh, ww]) | (InputForm::InterleavedU8, [n, hh, ww, 3])
            if *hh == h && *ww == w && *n >= 1 =>
        {
            *n as usize
        }
        (_, other) => {
            return Err(ApiError::BadRequest(format!(
                "input {:?} has shape {other:?}; this model takes {layout} with N from 1 to {max}",
                s.input_name
            )))
        }
    };
    if batch > max {
        return Err(ApiError::BadRequest(format!(
            "a batch of {batch} is over this model's max_batch_size of {max}"
        )));
    }
    let expected = element_count(&input.shape)? * s.input_form.element_size();
    if input.raw.len() != expected {
        return Err(ApiError::BadRequest(format!(
            "input {:?} of shape {:?} needs {expected} bytes of {} data; got {}",
            s.input_name,
            input.shape,
            datatype.protocol_name(),
            input.raw.len()
        )));
    }
    Ok(batch)
}

async fn raw(
    engine: &Engine,
    permit: &AdmissionPermit,
    input: &InferInput,
    deadline: Instant,
) -> Result<Vec<InferOutput>, ApiError> {
    let s = engine.spec();
    let batch = tensor_batch(engine, input)?;
    let per_image = input.raw.len() / batch;
    let runs = (0..batch).map(|i| {
        let slice = input.raw.slice(i * per_image..(i + 1) * per_image);
        engine.infer_tensor(permit, slice, deadline)
    });
    let mut data = Vec::new();
    for outcome in futures_util::future::join_all(runs).await {
        data.extend_from_slice(&outcome?.data);
    }
    let mut shape = vec![batch];
    shape.extend(engine.output_shape().unwrap_or(&[]).iter().copied());
    Ok(vec![InferOutput {
        name: s.output_name.clone(),
        shape,
        data: OutputData::Fp32(data),
    }])
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use peregrine_engine::fake::SlowBackend;
    use peregrine_engine::{Detector, DetectorConfig, EngineConfig};

    use super::*;

    /// The fake model: a `[N, 3, 32, 32]` float input named `images`, output `output0`.
    fn fake_engine() -> Engine {
        let factory = |_instance: usize| {
            let backend = SlowBackend::new(Duration::ZERO, Arc::default());
            Detector::new(Box::new(backend), &DetectorConfig::default())
        };
        Engine::start(EngineConfig::default(), factory).unwrap()
    }

    fn tensor(name: &str, shape: &[i64]) -> InferInput {
        InferInput {
            name: name.into(),
            datatype: "FP32".into(),
            shape: shape.to_vec(),
            raw: Bytes::from(vec![0u8; element_count(shape).unwrap() * 4]),
        }
    }

    #[tokio::test]
    async fn a_fallback_takes_images_always_and_a_tensor_only_when_it_is_its_own() {
        let engine = fake_engine();
        let own = tensor("images", &[1, 3, 32, 32]);
        assert!(fits(Face::Tensor, &engine, &own, None));
        assert!(fits(Face::Tensor, &engine, &own, Some(&["output0".into()])));
        assert!(!fits(Face::Tensor, &engine, &own, Some(&["boxes".into()])));
        for other in [
            tensor("images", &[1, 3, 64, 64]),
            tensor("input", &[1, 3, 32, 32]),
        ] {
            assert!(!fits(Face::Tensor, &engine, &other, None), "{other:?}");
        }
        let over_max_batch = tensor("images", &[8, 3, 32, 32]);
        assert!(!fits(Face::Tensor, &engine, &over_max_batch, None));
        let image = InferInput {
            name: face::IMAGE.into(),
            datatype: "BYTES".into(),
            shape: vec![1],
            raw: Bytes::from_static(b"\x03\0\0\0abc"),
        };
        assert!(fits(Face::Detection, &engine, &image, None));
    }

    fn out(name: &str) -> InferOutput {
        InferOutput {
            name: name.into(),
            shape: vec![1],
            data: OutputData::Int32(vec![1]),
        }
    }

    #[test]
    fn outputs_are_selected_in_the_order_asked_and_unknown_ones_refused() {
        let all = vec![out("A"), out("B"), out("C")];
        let picked = select_outputs("m", all.clone(), Some(&["C".into(), "A".into()])).unwrap();
        assert_eq!(
            picked.iter().map(|o| o.name.as_str()).collect::<Vec<_>>(),
            ["C", "A"]
        );
        assert_eq!(select_outputs("m", all.clone(), None).unwrap().len(), 3);
        let err = select_outputs("m", all, Some(&["D".into()]))
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "unexpected inference output \"D\" for model \"m\"; it has: A, B, C"
        );
    }
}
