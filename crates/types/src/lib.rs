//! Plain data shared by every Peregrine crate.
//!
//! Nothing here does I/O, spawns threads or knows a wire format: these are the nouns the
//! rest of the system talks in. [`geometry`] holds boxes and detections, [`model`] the facts
//! a loaded model exposes (tensor shapes, metadata, class names) and which model a request
//! means, [`params`] the knobs a caller turns per request (thresholds, class filter) and how
//! they resolve over a model's defaults, and [`clock`] the wall clock as an injectable value
//! (a trait, the system's clock and a manual one for tests).

pub mod clock;
pub mod geometry;
pub mod model;
pub mod params;
pub mod parity;

pub use clock::{ManualWallClock, SystemWallClock, WallClock};
pub use geometry::{BBox, Detection};
pub use model::{named_or_only, ClassNames, Dim, ModelDescription, NoModelNamed, TensorDescription};
pub use params::{ClassRef, DetectParams, ParamsError, ParamsRequest};
