//! What a stream makes of its detections over time: objects tracked from frame to frame
//! (`peregrine-track`), zones and lines they enter, leave and cross (`peregrine-zones`),
//! the events that follow (`object.start`, `zone.enter`, `line.cross`, ...) with
//! snapshots, and the latest frame for live views.
//!
//! Each stream has one analytics thread ([`worker`]) that owns all of it: the detection
//! task hands it each frame with its detections, API handlers send it commands with reply
//! channels, and it publishes the detection event (now with track ids) and any object
//! events. [`stream::StreamAnalytics`] is the per-frame logic as plain state, with
//! [`objects`] (what it knows of each live object) and [`updates`] (when an
//! `object.update` is due, and when an object is stationary); [`config`] is its settings'
//! shape; [`snapshot`] draws and encodes pictures; [`report`] is what the API and
//! Prometheus read; [`frame_analytics`] opens the per-frame logic to benches.

pub(crate) mod config;
pub(crate) mod frame_analytics;
pub(crate) mod objects;
pub(crate) mod report;
pub(crate) mod snapshot;
pub(crate) mod stream;
pub(crate) mod updates;
pub(crate) mod worker;

#[cfg(test)]
mod stream_tests;
