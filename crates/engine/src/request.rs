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
    /// Every instance of the model is out of rotation: the GPUs it ran on failed.
    #[error("model {model} has no instance left to run it: {reason}")]
    NoInstances { model: String, reason: String },
    #[error("inference failed: {0}")]
    Inference(String),
    /// A video frame in GPU memory that this engine cannot take (another GPU, no GPU, or
    /// not an NV12 picture it can read); the caller converts it on the host instead.
    #[error("the frame in GPU memory was not taken: {0}")]
    FrameNotTaken(String),
}

impl RequestError {
    /// When a refused request is worth retrying: for a backlog, once the work ahead has
    /// shrunk by the excess of its estimate over the deadline (at least a second); for a
    /// full queue or admission limit, a second. `None` for errors a retry does not cure.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Backlogged {
                expected_ms,
                budget_ms,
            } => Some(Duration::from_secs(
                expected_ms.saturating_sub(*budget_ms).div_ceil(1000).max(1),
            )),
            Self::Overloaded { .. } | Self::QueueFull { .. } | Self::NotReady { .. } | Self::ShuttingDown => {
                Some(Duration::from_secs(1))
            }
            Self::DeadlineExceeded { .. }
            | Self::BadImage(_)
            | Self::BadTensor(_)
            | Self::Inference(_)
            | Self::FrameNotTaken(_)
            | Self::NoInstances { .. } => None,
        }
    }

    /// The outcome label for metrics.
    pub fn outcome(&self) -> &'static str {
        match self {
            Self::Overloaded { .. } | Self::QueueFull { .. } | Self::Backlogged { .. } => "rejected",
            Self::DeadlineExceeded { .. } => "deadline",
            Self::BadImage(_) | Self::BadTensor(_) | Self::FrameNotTaken(_) => "bad_input",
            Self::NotReady { .. } | Self::ShuttingDown | Self::Inference(_) | Self::NoInstances { .. } => {
                "error"
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backlog_says_how_long_until_it_has_drained_enough() {
        let backlog = |expected_ms, budget_ms| RequestError::Backlogged {
            expected_ms,
            budget_ms,
        };
        let secs = |e: RequestError| e.retry_after().map(|d| d.as_secs());
        assert_eq!(secs(backlog(2300, 2000)), Some(1), "at least a second");
        assert_eq!(secs(backlog(5200, 2000)), Some(4), "3.2 s over, rounded up");
        assert_eq!(
            secs(RequestError::QueueFull {
                model: "m".into(),
                capacity: 4
            }),
            Some(1)
        );
        assert_eq!(secs(RequestError::DeadlineExceeded { stage: "queued" }), None);
    }
}
