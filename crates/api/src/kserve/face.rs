//! The two ways a detector is offered over the Open Inference Protocol, and what each
//! looks like to a client (its tensors, batching and configuration), independent of HTTP
//! or gRPC.
//!
//! - The detection model, under the model's own name: encoded images in (`IMAGE`, BYTES),
//!   detections out, with decoding, letterboxing and NMS done by the server.
//! - The tensor model, under `<name>_tensor`: the ONNX model's own float input and raw
//!   output, for clients that do their own pre- and postprocessing (and for
//!   perf_analyzer with its random data).
//!
//! Both run on the same engine, so they share its batches.

use std::sync::Arc;

use peregrine_engine::Engine;
use peregrine_registry::{LookupError, ModelSettings, ModelView, RegistrySnapshot, VersionPolicy};
use peregrine_types::Dim;
use peregrine_vision::InputForm;

use super::tensor::DataType;
use crate::ApiError;

pub const TENSOR_SUFFIX: &str = "_tensor";

pub const IMAGE: &str = "IMAGE";
pub const NUM_DETECTIONS: &str = "NUM_DETECTIONS";
pub const BOXES: &str = "BOXES";
pub const SCORES: &str = "SCORES";
pub const CLASSES: &str = "CLASSES";
pub const LABELS: &str = "LABELS";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Face {
    Detection,
    Tensor,
}

/// A protocol model name resolved to a registry model.
#[derive(Debug)]
pub struct Resolved<'a> {
    pub face: Face,
    pub model: &'a ModelView,
    /// The name as the client used it.
    pub name: &'a str,
}

/// Finds the registry model behind a protocol name: the model itself, else `<base>_tensor`.
pub fn resolve<'a>(snapshot: &'a RegistrySnapshot, name: &'a str) -> Result<Resolved<'a>, ApiError> {
    if let Some(model) = snapshot.models.get(name) {
        return Ok(Resolved {
            face: Face::Detection,
            model,
            name,
        });
    }
    if let Some(model) = name
        .strip_suffix(TENSOR_SUFFIX)
        .and_then(|b| snapshot.models.get(b))
    {
        return Ok(Resolved {
            face: Face::Tensor,
            model,
            name,
        });
    }
    if !snapshot.started {
        return Err(crate::starting());
    }
    Err(LookupError::UnknownModel {
        name: name.to_string(),
        known: face_names(snapshot),
    }
    .into())
}

/// The protocol name under which `face` offers the registry model `model`.
pub fn face_name(face: Face, model: &str) -> String {
    match face {
        Face::Detection => model.to_string(),
        Face::Tensor => format!("{model}{TENSOR_SUFFIX}"),
    }
}

/// Every protocol model name the snapshot offers.
pub fn face_names(snapshot: &RegistrySnapshot) -> Vec<String> {
    snapshot
        .models
        .keys()
        .flat_map(|n| [n.clone(), format!("{n}{TENSOR_SUFFIX}")])
        .collect()
}

/// One tensor as metadata and configuration describe it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpec {
    pub name: String,
    pub datatype: DataType,
    /// Without the batch dimension; -1 where it varies.
    pub dims: Vec<i64>,
}

/// Everything metadata, configuration and statistics say about one face of a model.
#[derive(Debug, Clone)]
pub struct FaceInfo {
    pub name: String,
    pub face: Face,
    /// Ready versions, ascending (or only the one asked for).
    pub versions: Vec<u64>,
    /// Each version's weights' SHA-256 (hex), by version: Peregrine's extension of the
    /// metadata.
    pub sha256: Vec<(u64, String)>,
    pub engines: Vec<Engine>,
    pub max_batch_size: usize,
    pub inputs: Vec<TensorSpec>,
    pub outputs: Vec<TensorSpec>,
    pub settings: Arc<ModelSettings>,
}

fn spec(name: &str, datatype: DataType, dims: &[i64]) -> TensorSpec {
    TensorSpec {
        name: name.to_string(),
        datatype,
        dims: dims.to_vec(),
    }
}

/// The detection model's tensors.
pub fn detection_tensors() -> (Vec<TensorSpec>, Vec<TensorSpec>) {
    (
        vec![spec(IMAGE, DataType::Bytes, &[1])],
        vec![
            spec(NUM_DETECTIONS, DataType::Int32, &[1]),
            spec(BOXES, DataType::Fp32, &[-1, 4]),
            spec(SCORES, DataType::Fp32, &[-1]),
            spec(CLASSES, DataType::Int32, &[-1]),
            spec(LABELS, DataType::Bytes, &[-1]),
        ],
    )
}

/// The tensor model's tensors: the graph as it runs (float `[3, H, W]` as exported, or
/// uint8 `[H, W, 3]` when rewritten), at the engine's input size, and the measured output.
pub fn raw_tensors(engine: &Engine) -> (Vec<TensorSpec>, Vec<TensorSpec>) {
    let s = engine.spec();
    let (h, w) = (s.input_height as i64, s.input_width as i64);
    let input = match s.input_form {
        InputForm::PlanarF32 => spec(&s.input_name, DataType::Fp32, &[3, h, w]),
        InputForm::InterleavedU8 => spec(&s.input_name, DataType::Uint8, &[h, w, 3]),
    };
    let out_dims: Vec<i64> = match engine.output_shape() {
        Some(shape) => shape.iter().map(|&d| d as i64).collect(),
        None => engine
            .description()
            .outputs
            .first()
            .map(|o| {
                o.dims
                    .iter()
                    .skip(1)
                    .map(|d| match d {
                        Dim::Fixed(n) => *n as i64,
                        Dim::Dynamic => -1,
                    })
                    .collect()
            })
            .unwrap_or_default(),
    };
    (vec![input], vec![spec(&s.output_name, DataType::Fp32, &out_dims)])
}

impl FaceInfo {
    /// Describes `resolved` at `version`, or at every ready version when `None`. A model
    /// with nothing ready cannot be described (its tensors come from a loaded engine).
    pub fn of(resolved: &Resolved<'_>, version: Option<u64>) -> Result<Self, ApiError> {
        let model = resolved.model;
        let engines: Vec<Engine> = match version {
            Some(_) => vec![model.engine(version)?.clone()],
            None => model.versions.iter().filter_map(|v| v.engine.clone()).collect(),
        };
        let Some(newest) = engines.last() else {
            // Says why (loading, failed, unloaded) through the lookup error.
            return Err(match model.engine(None) {
                Err(e) => e.into(),
                Ok(_) => ApiError::NotReady(format!("model {:?} has no ready version", resolved.name)),
            });
        };
        let (inputs, outputs) = match resolved.face {
            Face::Detection => detection_tensors(),
            Face::Tensor => raw_tensors(newest),
        };
        let settings = model
            .settings
            .clone()
            .unwrap_or_else(|| Arc::new(ModelSettings::default()));
        let versions: Vec<u64> = engines.iter().filter_map(|e| e.version().parse().ok()).collect();
        let sha256 = model
            .versions
            .iter()
            .filter(|v| versions.contains(&v.version))
            .filter_map(|v| Some((v.version, v.sha256?.hex())))
            .collect();
        Ok(Self {
            name: resolved.name.to_string(),
            face: resolved.face,
            versions,
            sha256,
            max_batch_size: newest.config().policy.max_batch,
            inputs,
            outputs,
            engines,
            settings,
        })
    }

    /// `platform` as Triton reports it (the backend for models without a platform).
    pub fn platform(&self) -> &'static str {
        match self.face {
            Face::Detection => "peregrine_detection",
            Face::Tensor => "onnxruntime_onnx",
        }
    }

    pub fn backend(&self) -> &'static str {
        match self.face {
            Face::Detection => "peregrine",
            Face::Tensor => "onnxruntime",
        }
    }

    /// The instance group's kind (`KIND_GPU` on a GPU provider, with the device), and its
    /// `ModelInstanceGroup.Kind` number.
    pub fn instance_kind(&self) -> (&'static str, i32, Vec<i32>) {
        let gpus = self.settings.gpu_devices();
        if gpus.is_empty() {
            ("KIND_CPU", 2, vec![])
        } else {
            ("KIND_GPU", 1, gpus)
        }
    }

    /// The version policy as (`latest` n | `all` | `specific` list).
    pub fn version_policy(&self) -> &VersionPolicy {
        &self.settings.version_policy
    }

    /// The class names of the detection model, for its configuration's parameters.
    pub fn class_names(&self) -> Vec<String> {
        self.engines
            .last()
            .map(|e| e.spec().names.iter().map(str::to_string).collect())
            .unwrap_or_default()
    }
}
