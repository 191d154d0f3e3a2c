//! Post-training INT8 quantization into a QDQ model.
//!
//! The caller runs the calibration graph ([`with_extra_outputs`] on [`plan`]'s tensors)
//! over letterboxed images, feeds every returned activation into a
//! [`TensorHistogram`] per tensor, turns each into a range by a [`CalibrationMethod`],
//! and [`quantize_qdq`] writes the model with `QuantizeLinear`/`DequantizeLinear` pairs,
//! per-channel int8 weights and metadata under [`METADATA_PREFIX`]. [`calibration_table`]
//! writes the same ranges as TensorRT's calibration cache.
//!
//! Modules: `histogram` (statistics and the three range methods), `select` (which nodes
//! and tensors), `qdq` (the graph edit), `trt` (the cache writer).

mod histogram;
mod qdq;
mod select;
mod trt;

pub use histogram::{CalibrationMethod, TensorHistogram, BINS};
pub use qdq::{quantize_qdq, ActivationType, QdqOptions, QuantParams, Quantized, METADATA_PREFIX};
pub use select::{check_model, plan, with_extra_outputs, NodeRole, Plan, Selection};
pub use trt::calibration_table;

use prost::Message;

/// The nodes kept float unless the caller says otherwise: the attention block of
/// Ultralytics' C2PSA (YOLO11's layer 10). Measured, keeping it float costs no speed and
/// gains parity (docs/benchmarks.md).
pub const DEFAULT_EXCLUDE: &str = "/model.10/m/";

/// Why a model could not be quantized.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantizeError {
    #[error("the bytes are not an ONNX model: {0}")]
    Decode(String),
    #[error("the model has no graph")]
    NoGraph,
    #[error(
        "the model imports ONNX opset {0}; per-channel quantization needs opset 13 or newer \
         (re-export with a newer opset)"
    )]
    Opset(i64),
    #[error(
        "the model computes in float16 (float16 weights or casts to float16 inside); quantize \
         the float32 export of the same weights instead"
    )]
    Float16,
    #[error("initializer {0:?} keeps its data in an external file; save the model as one file")]
    ExternalData(String),
    #[error(
        "no node can be quantized (no Conv with constant float weights outside the excluded \
         nodes); check --exclude"
    )]
    NothingToQuantize,
    #[error("tensor {0:?} has no calibration range (calibration did not return it)")]
    MissingRange(String),
}

/// The calibration plan of a model file: which tensors to measure, plus the calibration
/// graph's bytes (the model returning them as extra outputs).
pub fn calibration_graph(model: &[u8], selection: &Selection) -> Result<(Plan, Vec<u8>), QuantizeError> {
    let proto = crate::proto::ModelProto::decode(model).map_err(|e| QuantizeError::Decode(e.to_string()))?;
    check_model(&proto)?;
    let graph = proto.graph.as_ref().ok_or(QuantizeError::NoGraph)?;
    let plan = plan(graph, selection);
    if plan.nodes.is_empty() {
        return Err(QuantizeError::NothingToQuantize);
    }
    let with = with_extra_outputs(&proto, &plan.tensors);
    Ok((plan, with.encode_to_vec()))
}
