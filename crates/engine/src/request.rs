//! What a caller gets back from the engine, and every way a request can fail.

use std::time::Duration;

use peregrine_types::Detection;
use peregrine_vision::DecodeError;

/// Where one image's time went.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RequestTimings {
    /// Decoding and letterboxing, on the preprocessing pool.
    pub decode: Duration,
    /// Waiting in the batch queue.
    pub queue: Duration,
    /// The whole batch's normalisation, model run and postprocessing, shared by its images.
    pub inference: Duration,
    /// Images in the batch this one ran in.
    pub batch_size: usize,
}

/// Detections for one image.
#[derive(Debug, Clone, PartialEq)]
pub struct ImageResult {
    pub width: u32,
    pub height: u32,
    pub detections: Vec<Detection>,
    pub timings: RequestTimings,
}

/// The model's raw output for one image of a caller's input tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorResult {
    /// Row-major float32, the model's first output without its batch dimension.
    pub data: Vec<f32>,
    pub timings: RequestTimings,
}

/// Why a request got no detections. The API maps each kind to a status code in one place.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RequestError {
    #[error("the server is at capacity ({limit} requests in flight); retry shortly")]
    Overloaded { limit: usize },
    #[error("the {model} queue is full ({capacity} images waiting); retry shortly")]
    QueueFull { model: String, capacity: usize },
    #[error(
        "the queue holds about {expected_ms} ms of work, more than this request's remaining \
         deadline of {budget_ms} ms; retry shortly or allow a longer deadline"
    )]
    Backlogged { expected_ms: u64, budget_ms: u64 },
    #[error("the request's deadline passed while {stage}; nothing was computed for it")]
    DeadlineExceeded { stage: &'static str },
    #[error("{0}")]
    BadImage(#[from] DecodeError),
    #[error("bad input tensor: {0}")]
    BadTensor(String),
    #[error("model {model} is still loading or warming up")]
    NotReady { model: String },
    #[error("the server is shutting down")]
    ShuttingDown,
    #[error("inference failed: {0}")]
    Inference(String),
}

impl RequestError {
    /// The outcome label for metrics.
    pub fn outcome(&self) -> &'static str {
        match self {
            Self::Overloaded { .. } | Self::QueueFull { .. } | Self::Backlogged { .. } => "rejected",
            Self::DeadlineExceeded { .. } => "deadline",
            Self::BadImage(_) | Self::BadTensor(_) => "bad_input",
            Self::NotReady { .. } | Self::ShuttingDown | Self::Inference(_) => "error",
        }
    }
}
