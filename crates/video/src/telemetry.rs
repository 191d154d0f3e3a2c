//! Every metric the video pipeline emits, named in one place. Prefix `peregrine_stream_`,
//! units in the names, and one label per stream (its configured name) plus, for drops,
//! the reason from a fixed list: the cardinality is streams x reasons.
//!
//! Each stream's [`StreamCounters`] keeps the same counts as atomics too, so a status
//! request reads them without going through a metrics recorder.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use metrics::{counter, gauge, histogram, Counter, Histogram};

pub const FRAMES_RECEIVED: &str = "peregrine_stream_frames_received_total";
pub const FRAMES_DECODED: &str = "peregrine_stream_frames_decoded_total";
pub const FRAMES_DETECTED: &str = "peregrine_stream_frames_detected_total";
pub const FRAMES_DROPPED: &str = "peregrine_stream_frames_dropped_total";
pub const RECONNECTS: &str = "peregrine_stream_reconnects_total";
pub const GLASS_TO_RESULT: &str = "peregrine_stream_glass_to_result_seconds";
pub const SUBSCRIBER_LAGGED: &str = "peregrine_stream_subscriber_lagged_events_total";
pub const SINK_DROPPED: &str = "peregrine_stream_sink_dropped_events_total";
pub const SINK_DELIVERED: &str = "peregrine_stream_sink_delivered_events_total";
/// Objects inside a zone now, by class (`stream`, `zone`, `class`).
pub const ZONE_OBJECTS: &str = "peregrine_zone_objects";
/// Line crossings (`stream`, `line`, `direction` in/out, `class`).
pub const LINE_CROSSINGS: &str = "peregrine_line_crossings_total";
/// Object events (`stream`, `type`: object.start, zone.enter, ...).
pub const OBJECT_EVENTS: &str = "peregrine_object_events_total";
/// 1 for what decodes a stream now (`stream`, `decoder`: cpu or nvdec), 0 for the other.
pub const STREAM_DECODER: &str = "peregrine_stream_decoder";
/// Object events the event store dropped (its queue was full) or failed to write.
pub const STORE_DROPPED: &str = "peregrine_event_store_dropped_total";

/// Buckets for [`GLASS_TO_RESULT`], for the binary's Prometheus exporter: from one frame
/// interval at 60 fps up to the point where a result is useless for live video.
pub const GLASS_TO_RESULT_BUCKETS: &[f64] = &[
    0.016, 0.033, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0,
];

/// Why a frame did not become a result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DropReason {
    /// The decode thread's input queue was full; access units up to the next key frame
    /// are skipped, as the ones in between cannot be decoded without it.
    DecoderBehind,
    /// The decoder rejected the access unit (damaged or incomplete data).
    DecodeError,
    /// Every frame buffer of the stream was in use.
    PoolExhausted,
    /// A newer frame replaced it before detection took it (latest frame wins).
    Superseded,
    /// Its staleness budget ran out before detection could start (or the detector said
    /// so): it was never computed.
    Stale,
    /// The detector's queue was full (it answered "overloaded" without computing it).
    DetectorBusy,
    /// The detector failed on it.
    DetectError,
}

impl DropReason {
    pub const ALL: [DropReason; 7] = [
        Self::DecoderBehind,
        Self::DecodeError,
        Self::PoolExhausted,
        Self::Superseded,
        Self::Stale,
        Self::DetectorBusy,
        Self::DetectError,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::DecoderBehind => "decoder_behind",
            Self::DecodeError => "decode_error",
            Self::PoolExhausted => "pool_exhausted",
            Self::Superseded => "superseded",
            Self::Stale => "stale",
            Self::DetectorBusy => "detector_busy",
            Self::DetectError => "detect_error",
        }
    }

    fn index(self) -> usize {
        Self::ALL.iter().position(|r| *r == self).unwrap_or(0)
    }
}

/// A point-in-time copy of a stream's counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CounterSnapshot {
    pub frames_received: u64,
    pub frames_decoded: u64,
    pub frames_detected: u64,
    /// By reason, in [`DropReason::ALL`] order.
    pub frames_dropped: Vec<(DropReason, u64)>,
    pub reconnects: u64,
}

impl CounterSnapshot {
    pub fn dropped(&self, reason: DropReason) -> u64 {
        self.frames_dropped
            .iter()
            .find(|(r, _)| *r == reason)
            .map_or(0, |(_, n)| *n)
    }

    pub fn dropped_total(&self) -> u64 {
        self.frames_dropped.iter().map(|(_, n)| n).sum()
    }
}

/// One stream's counts, as atomics and as metric handles registered once.
#[derive(Debug)]
pub struct StreamCounters {
    received: (AtomicU64, Counter),
    decoded: (AtomicU64, Counter),
    detected: (AtomicU64, Counter),
    dropped: Vec<(AtomicU64, Counter)>,
    reconnects: (AtomicU64, Counter),
    glass_to_result: Histogram,
}

impl StreamCounters {
    pub fn new(stream: &str) -> Arc<Self> {
        let label = stream.to_string();
        let pair = |name: &'static str| (AtomicU64::new(0), counter!(name, "stream" => label.clone()));
        Arc::new(Self {
            received: pair(FRAMES_RECEIVED),
            decoded: pair(FRAMES_DECODED),
            detected: pair(FRAMES_DETECTED),
            dropped: DropReason::ALL
                .iter()
                .map(|r| {
                    let c = counter!(FRAMES_DROPPED, "stream" => label.clone(), "reason" => r.as_str());
                    (AtomicU64::new(0), c)
                })
                .collect(),
            reconnects: pair(RECONNECTS),
            glass_to_result: histogram!(GLASS_TO_RESULT, "stream" => label.clone()),
        })
    }

    fn bump(pair: &(AtomicU64, Counter), n: u64) {
        pair.0.fetch_add(n, Ordering::Relaxed);
        pair.1.increment(n);
    }

    pub fn received(&self) {
        Self::bump(&self.received, 1);
    }

    pub fn decoded(&self) {
        Self::bump(&self.decoded, 1);
    }

    pub fn detected(&self, glass_to_result: Duration) {
        Self::bump(&self.detected, 1);
        self.glass_to_result.record(glass_to_result.as_secs_f64());
    }

    pub fn dropped(&self, reason: DropReason) {
        if let Some(pair) = self.dropped.get(reason.index()) {
            Self::bump(pair, 1);
        }
    }

    pub fn reconnected(&self) {
        Self::bump(&self.reconnects, 1);
    }

    pub fn snapshot(&self) -> CounterSnapshot {
        let get = |p: &(AtomicU64, Counter)| p.0.load(Ordering::Relaxed);
        CounterSnapshot {
            frames_received: get(&self.received),
            frames_decoded: get(&self.decoded),
            frames_detected: get(&self.detected),
            frames_dropped: DropReason::ALL
                .iter()
                .zip(&self.dropped)
                .map(|(r, p)| (*r, get(p)))
                .collect(),
            reconnects: get(&self.reconnects),
        }
    }
}

/// Events a subscriber missed because it fell behind (`stream` is the stream's name, or
/// `*` for the all-streams feed).
pub fn subscriber_lagged(stream: &str, missed: u64) {
    counter!(SUBSCRIBER_LAGGED, "stream" => stream.to_string()).increment(missed);
}

/// An event a sink threw away (`reason`: `queue_full` or `gave_up`).
pub fn sink_dropped(sink: &'static str, reason: &'static str) {
    counter!(SINK_DROPPED, "sink" => sink, "reason" => reason).increment(1);
}

pub fn sink_delivered(sink: &'static str) {
    counter!(SINK_DELIVERED, "sink" => sink).increment(1);
}

// The zone and line labels come from the stream's configuration (a few per stream), and
// classes from the model: cardinality is streams x zones x classes seen.
pub fn zone_objects(stream: &str, zone: &str, class: &str, objects: usize) {
    gauge!(ZONE_OBJECTS, "stream" => stream.to_string(), "zone" => zone.to_string(), "class" => class.to_string())
        .set(objects as f64);
}

pub fn line_crossed(stream: &str, line: &str, direction: &'static str, class: &str) {
    counter!(LINE_CROSSINGS, "stream" => stream.to_string(), "line" => line.to_string(),
        "direction" => direction, "class" => class.to_string())
    .increment(1);
}

pub fn object_event(stream: &str, kind: &'static str) {
    counter!(OBJECT_EVENTS, "stream" => stream.to_string(), "type" => kind).increment(1);
}

/// Sets [`STREAM_DECODER`] for `stream` (`None`: neither decodes).
pub fn decoder_active(stream: &str, active: Option<crate::decode::ActiveDecoder>) {
    use crate::decode::ActiveDecoder;
    for kind in [ActiveDecoder::Cpu, ActiveDecoder::Nvdec] {
        gauge!(STREAM_DECODER, "stream" => stream.to_string(), "decoder" => kind.as_str())
            .set(f64::from(u8::from(active == Some(kind))));
    }
}

pub fn store_dropped(reason: &'static str) {
    counter!(STORE_DROPPED, "reason" => reason).increment(1);
}

#[cfg(test)]
mod tests {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    use super::*;

    #[test]
    fn counters_reach_the_recorder_with_stream_and_reason_labels() {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let counters = metrics::with_local_recorder(&recorder, || {
            let c = StreamCounters::new("cam1");
            c.received();
            c.decoded();
            c.detected(Duration::from_millis(40));
            c.dropped(DropReason::Stale);
            c.dropped(DropReason::Stale);
            c.reconnected();
            c
        });
        let s = counters.snapshot();
        assert_eq!((s.frames_received, s.frames_detected, s.reconnects), (1, 1, 1));
        assert_eq!(s.dropped(DropReason::Stale), 2);
        assert_eq!(s.dropped_total(), 2);
        let mut seen = std::collections::BTreeMap::new();
        for (key, _, _, value) in snapshotter.snapshot().into_vec() {
            let key = key.key();
            let labels: Vec<String> = key
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            assert!(key.name().starts_with("peregrine_stream_"), "{}", key.name());
            assert_eq!(labels[0], "stream=cam1");
            let v = match value {
                DebugValue::Counter(n) => n as f64,
                DebugValue::Histogram(h) => h.len() as f64,
                DebugValue::Gauge(g) => g.into_inner(),
            };
            seen.insert(format!("{}{{{}}}", key.name(), labels.join(",")), v);
        }
        assert_eq!(
            seen["peregrine_stream_frames_dropped_total{stream=cam1,reason=stale}"],
            2.0
        );
        assert_eq!(seen["peregrine_stream_glass_to_result_seconds{stream=cam1}"], 1.0);
        assert_eq!(seen["peregrine_stream_reconnects_total{stream=cam1}"], 1.0);
        assert_eq!(
            seen.keys().filter(|k| k.starts_with(FRAMES_DROPPED)).count(),
            DropReason::ALL.len(),
            "one series per reason, registered up front"
        );
    }
}
