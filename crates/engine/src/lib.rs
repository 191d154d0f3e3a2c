//! Running detection models.
//!
//! [`Detector`] is the synchronous pipeline for one model instance: letterbox a batch of
//! images into a reused input buffer, run the [`peregrine_backend::Backend`], decode and
//! suppress the output, map boxes back to each image. It owns every buffer it needs, so
//! steady-state detection allocates only the result vectors. The CLI drives it directly.
//!
//! [`Engine`] serves one model to many concurrent callers: admission (a bounded number of
//! requests in flight), decoding on a bounded blocking pool, a batch queue owned by one
//! task whose decisions live in the pure [`queue::BatchQueue`], and model instances on
//! dedicated OS threads (never on a tokio worker). [`telemetry`] names every metric.

mod detector;
mod error;
pub mod queue;
mod request;
mod service;
pub mod telemetry;

pub use detector::{Detector, DetectorConfig, PreparedInput, StageTimings};
pub use error::EngineError;
pub use queue::BatchPolicy;
pub use request::{ImageResult, RequestError, RequestTimings};
pub use service::{AdmissionPermit, DetectorFactory, Engine, EngineConfig};
