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
    #[error("a batch of {got} images does not fit this instance (1 to {max})")]
    BatchSize { got: usize, max: usize },
    #[error("a prepared image has {got} bytes; the model input needs {want}")]
    CanvasSize { got: usize, want: usize },
    #[error("an input tensor has {got} bytes; one image of the model input needs {want}")]
    TensorSize { got: usize, want: usize },
    #[error("the model did not warm up: {0}")]
    WarmUp(String),
    #[error("could not start a model thread: {0}")]
    Thread(String),
    #[error("slot {slot} of a detection batch is not an image (a tensor, or a JPEG that did not decode)")]
    NotDetections { slot: usize },
    #[error("the model returned {got} images' worth of output for a batch of {want}")]
    BatchMismatch { got: usize, want: usize },
}
