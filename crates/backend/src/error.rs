use std::path::PathBuf;

use crate::runtime::ORT_VERSION;

/// Everything that can go wrong between a model file and its output.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error(
        "ONNX Runtime {ORT_VERSION} was not found (looked in: {}). Run `make setup` in the \
         Peregrine checkout to fetch it, or set ORT_DYLIB_PATH to a libonnxruntime.so of \
         version {ORT_VERSION} or newer",
        .searched.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
    )]
    RuntimeNotFound { searched: Vec<PathBuf> },
    #[error(
        "could not load ONNX Runtime from {path}: {reason}. Peregrine needs ONNX Runtime \
         {ORT_VERSION} or newer: run `make setup`, or point ORT_DYLIB_PATH at a suitable \
         libonnxruntime.so"
    )]
    RuntimeLoad { path: PathBuf, reason: String },
    #[error("could not load the model: {0}")]
    ModelLoad(String),
    #[error("execution provider {provider} is not available: {reason}")]
    ProviderUnavailable { provider: String, reason: String },
    #[error("input batch has shape {shape:?} but {len} values")]
    InputSize { shape: [usize; 4], len: usize },
    #[error("inference failed: {0}")]
    Inference(String),
    /// Decoding JPEGs on the device failed for the batch; its images may be decoded on the
    /// host instead (one bad file fails the whole device call, so which one is unknown).
    #[error("decoding JPEGs on the GPU failed: {0}")]
    DeviceDecode(String),
    #[error("the model's output is unusable: {0}")]
    Output(String),
}
