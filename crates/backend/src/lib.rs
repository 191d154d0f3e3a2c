//! Model execution behind a small synchronous trait.
//!
//! [`Backend`] is what the engine's model threads call: one batch in, one output tensor out,
//! blocking. [`OrtBackend`] implements it with ONNX Runtime through the `ort` crate, loading
//! the runtime library at run time ([`runtime`] finds it and says exactly what to do when it
//! is missing or too old). Nothing here knows about images or boxes.

mod error;
mod ort_backend;
pub mod runtime;

pub use error::BackendError;
pub use ort_backend::{CudaOptions, ExecutionProvider, OrtBackend, SessionConfig, TensorRtOptions};
pub use peregrine_types::ModelDescription;

/// One batch of model input: a dense float32 tensor.
#[derive(Debug, Clone, Copy)]
pub struct InputBatch<'a> {
    pub shape: [usize; 4],
    pub data: &'a [f32],
}

/// The model's detection output, copied into a buffer the caller owns and reuses.
#[derive(Debug, Default, Clone)]
pub struct OutputBuffer {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

/// A loaded model that runs batches, one at a time, on the calling thread.
///
/// Implementations are `Send` so the engine can move them onto a dedicated thread; they
/// need not be `Sync`, as one instance never runs two batches at once.
pub trait Backend: Send {
    /// The model's tensors and metadata.
    fn description(&self) -> &ModelDescription;

    /// Runs `input` and writes the first output into `output`, reusing its allocation.
    fn run(&mut self, input: InputBatch<'_>, output: &mut OutputBuffer) -> Result<(), BackendError>;
}
