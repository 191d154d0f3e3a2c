use peregrine_backend::BackendError;
use peregrine_vision::{LayoutError, SpecError};

/// Failures of the detection pipeline around a loaded model.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("the model is not a detector Peregrine understands: {0}")]
    Spec(#[from] SpecError),
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error("the model's output is not in the layout it declared: {0}")]
    Layout(#[from] LayoutError),
    #[error("the model returned {got} images' worth of output for a batch of {want}")]
    BatchMismatch { got: usize, want: usize },
}
