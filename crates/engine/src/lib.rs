//! Running detection models.
//!
//! [`Detector`] is the synchronous pipeline for one model instance: letterbox a batch of
//! images into a reused input buffer, run the [`peregrine_backend::Backend`], decode and
//! suppress the output, map boxes back to each image. It owns every buffer it needs, so
//! steady-state detection allocates only the result vectors. The CLI drives it directly;
//! the server will drive one per model thread.

mod detector;
mod error;

pub use detector::{Detector, DetectorConfig, StageTimings};
pub use error::EngineError;
