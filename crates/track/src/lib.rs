//! Multi-object tracking as plain state: one [`Tracker`] per stream turns each frame's
//! detections into tracks with stable ids.
//!
//! The algorithm is ByteTrack as Roboflow's `trackers` package (2.6.1) implements it, step for
//! step, so the two agree when fed the same detections: Kalman-filtered corner boxes
//! ([`kalman`]), a first association of high-score detections and a second of low-score ones
//! to the tracks left over, each an optimal IoU assignment ([`assignment`], SciPy's algorithm),
//! birth after `min_hits` consecutive frames and death after `lost_after`. Two differences, both
//! settings in [`TrackerConfig`]: tracks are class-aware by default, and the lost budget is
//! media time (PTS), since sampled streams have gaps. Nothing here does I/O or reads a clock.

pub mod assignment;
mod config;
pub mod kalman;
mod tracker;

pub use config::{TrackConfigError, TrackerConfig};
pub use tracker::{EndedTrack, TrackId, TrackSummary, TrackUpdate, Tracker};
