//! Running one detection model version.
//!
//! [`Detector`] is the synchronous pipeline for one model instance: letterbox a batch of
//! images into a reused input buffer, run the [`peregrine_backend::Backend`], decode and
//! suppress the output, map boxes back to each image. It owns every buffer it needs, so
//! steady-state detection allocates only the result vectors. The CLI drives it directly.
//!
//! [`Engine`] serves one model to many concurrent callers: admission (a bounded number of
//! requests in flight), decoding on a bounded blocking pool, a batch queue owned by one
//! task whose decisions live in the pure [`queue::BatchQueue`], and model instances on
//! dedicated OS threads (never on a tokio worker). One batch slot is a [`Slot`] from the
//! request to the instance and a [`SlotOutput`] on the way back. The pure
//! [`wait::WaitEstimator`], owned by the queue task, estimates each request's wait so that
//! one that cannot meet its deadline is refused at once. The pure [`rotation::Rotation`],
//! also the queue task's, takes a failed GPU's instances out of rotation while the others
//! serve. [`telemetry`] names every metric
//! and [`stats`] keeps Triton-style counters per engine.
//!
//! The engine knows one model version and the [`peregrine_backend::Backend`] trait only:
//! which models are served, where their weights come from and how a graph is prepared for
//! a session is the `peregrine-registry` crate's business.

pub mod adaptive;
mod admission;
mod detector;
pub mod divert;
mod error;
#[cfg(any(test, feature = "test-support"))]
pub mod fake;
mod instance;
mod preprocess;
pub mod queue;
mod queue_task;
mod request;
pub mod rotation;
pub mod sample;
mod service;
mod shared;
mod slot;
pub mod spans;
pub mod stats;
pub mod telemetry;
pub mod wait;
pub mod window;

pub use adaptive::Objective;
pub use detector::{run_sizes, Detector, DetectorConfig, StageTimings};
pub use error::EngineError;
pub use instance::live_instances;
pub use queue::BatchPolicy;
pub use request::{ImageResult, RequestError, RequestTimings, TensorResult};
pub use rotation::{by_device, device_label, InstancePlacement};
pub use service::{AdmissionPermit, Engine, EngineConfig, WeakEngine};
pub use slot::{FrameOwner, Slot, SlotOutput};
pub use stats::StatsSnapshot;
pub use window::WindowStats;
