//! Metric names and the events the engine emits. One place, so the names stay consistent
//! and low in cardinality (labels: model, and a few fixed words).

use std::time::Duration;

pub const QUEUE_SECONDS: &str = "peregrine_queue_seconds";
pub const PREPROCESS_SECONDS: &str = "peregrine_preprocess_seconds";
pub const INFERENCE_SECONDS: &str = "peregrine_inference_seconds";
pub const POSTPROCESS_SECONDS: &str = "peregrine_postprocess_seconds";
pub const BATCH_SIZE: &str = "peregrine_batch_size";
pub const QUEUE_DEPTH: &str = "peregrine_queue_depth";
pub const IN_FLIGHT: &str = "peregrine_in_flight_requests";
pub const INFERRED_IMAGES: &str = "peregrine_inferred_images_total";
pub const QUEUE_DROPPED: &str = "peregrine_queue_dropped_total";
pub const DEADLINE_EXCEEDED: &str = "peregrine_deadline_exceeded_total";
pub const REQUESTS: &str = "peregrine_requests_total";
pub const REQUEST_SECONDS: &str = "peregrine_request_seconds";
pub const LATENCY_P99: &str = "peregrine_latency_p99_seconds";
pub const LATENCY_OBJECTIVE: &str = "peregrine_latency_objective_seconds";
pub const BATCH_LIMIT: &str = "peregrine_batch_limit";
pub const BATCH_DELAY: &str = "peregrine_batch_delay_seconds";
pub const BATCH_ADJUSTMENTS: &str = "peregrine_batch_adjustments_total";
pub const DEVICE_BATCHES: &str = "peregrine_device_batches_total";
pub const DEVICE_FAILURES: &str = "peregrine_device_failures_total";
pub const REQUEUED: &str = "peregrine_requeued_images_total";
pub const INSTANCES: &str = "peregrine_instances";
pub const REFUSALS: &str = "peregrine_refusals_total";

/// Histogram buckets for stage and request durations, in seconds (1 ms to 60 s).
pub const DURATION_BUCKETS: &[f64] = &[
    0.001, 0.002, 0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0,
];
/// Histogram buckets for batch sizes.
pub const BATCH_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0];

/// One batch ran on `device` (`cpu`, `gpu0`, ...).
pub(crate) fn batch_ran(
    model: &str,
    device: &str,
    size: usize,
    preprocess: Duration,
    inference: Duration,
    post: Duration,
) {
    let m = model.to_string();
    metrics::counter!(DEVICE_BATCHES, "model" => m.clone(), "device" => device.to_string()).increment(1);
    metrics::histogram!(BATCH_SIZE, "model" => m.clone()).record(size as f64);
    metrics::histogram!(PREPROCESS_SECONDS, "model" => m.clone()).record(preprocess.as_secs_f64());
    metrics::histogram!(INFERENCE_SECONDS, "model" => m.clone()).record(inference.as_secs_f64());
    metrics::histogram!(POSTPROCESS_SECONDS, "model" => m.clone()).record(post.as_secs_f64());
    metrics::counter!(INFERRED_IMAGES, "model" => m, "device" => device.to_string()).increment(size as u64);
}

/// A request refused at once (429) at `stage`: `in_flight` (no admission permit left),
/// `admission` (before its body was read), `before_decode`, `after_decode`, `queue_full`.
pub(crate) fn refused(model: &str, stage: &'static str) {
    metrics::counter!(REFUSALS, "model" => model.to_string(), "stage" => stage).increment(1);
}

/// A device failed and its instances left the rotation.
pub(crate) fn device_lost(model: &str, device: &str) {
    metrics::counter!(DEVICE_FAILURES, "model" => model.to_string(), "device" => device.to_string())
        .increment(1);
}

/// Images of a failed device's batch queued again for the other devices.
pub(crate) fn requeued(model: &str, n: usize) {
    metrics::counter!(REQUEUED, "model" => model.to_string()).increment(n as u64);
}

pub(crate) fn queued(model: &str, waited: Duration) {
    metrics::histogram!(QUEUE_SECONDS, "model" => model.to_string()).record(waited.as_secs_f64());
}

pub(crate) fn queue_depth(model: &str, depth: usize) {
    metrics::gauge!(QUEUE_DEPTH, "model" => model.to_string()).set(depth as f64);
}

pub(crate) fn in_flight(model: &str, n: usize) {
    metrics::gauge!(IN_FLIGHT, "model" => model.to_string()).set(n as f64);
}

/// A request left the queue without being computed: `reason` is `expired` or `abandoned`.
pub(crate) fn dropped(model: &str, reason: &'static str, n: usize) {
    if n > 0 {
        metrics::counter!(QUEUE_DROPPED, "model" => model.to_string(), "reason" => reason)
            .increment(n as u64);
    }
}

/// A request's deadline passed at `stage`; no compute was spent on it after that point.
pub(crate) fn deadline_exceeded(model: &str, stage: &'static str) {
    metrics::counter!(DEADLINE_EXCEEDED, "model" => model.to_string(), "stage" => stage).increment(1);
}

/// One finished API request; `outcome` is success, rejected, deadline, bad_input or error.
pub fn request_finished(model: &str, outcome: &'static str, total: Duration) {
    metrics::counter!(REQUESTS, "model" => model.to_string(), "outcome" => outcome).increment(1);
    metrics::histogram!(REQUEST_SECONDS, "model" => model.to_string(), "outcome" => outcome)
        .record(total.as_secs_f64());
}

/// The per-version gauges ([`LATENCY_P99`], [`LATENCY_OBJECTIVE`], [`BATCH_LIMIT`],
/// [`BATCH_DELAY`]) of one engine, read when `/metrics` is scraped rather than pushed into
/// the recorder: the Prometheus exporter cannot remove a series, so pushed ones would
/// stay after their version retired. Only engines still served are read.
#[derive(Debug, Clone, PartialEq)]
pub struct VersionGauges {
    /// P99 over the latency window ending now.
    pub p99: Duration,
    pub objective: Option<Duration>,
    /// The batch limit and delay in force (adaptive batching may hold them lower).
    pub batch_limit: usize,
    pub batch_delay: Duration,
}

/// Adaptive batching changed one model version's limits, for `reason` (`breach`,
/// `backlog` or `headroom`).
pub(crate) fn batch_limits_changed(model: &str, version: &str, reason: &'static str) {
    metrics::counter!(BATCH_ADJUSTMENTS, "model" => model.to_string(), "version" => version.to_string(), "reason" => reason)
        .increment(1);
}
