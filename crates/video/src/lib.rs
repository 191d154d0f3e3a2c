//! Video analytics for Peregrine: cameras and files in, detections out, live.
//!
//! A stream is a camera (RTSP over TCP or UDP, H.264 or H.265), a camera that pushes RTP
//! to us (GB28181: MPEG-PS or plain H.264/H.265 over UDP or TCP) or an mp4 file. The
//! [`manager`] owns the set of streams and is reached through a cloneable
//! [`StreamManagerHandle`] (add, remove, list, status, subscribe). Each stream runs as
//! four pieces: a [`supervisor`] task that opens its [`source`] (behind the `Opener` /
//! `Source` traits), reads access units and reconnects with [`backoff`] on failure; a
//! [`decode`] thread (FFmpeg, linked statically) that decodes every access unit, lets
//! [`sampling`] pick the frames to keep and converts those into pooled RGB [`frame`]s;
//! a [`detect`] task that takes the newest frame from the [`latest`] slot, drops it if
//! its staleness budget is spent, and calls the server's [`FrameDetector`]; and an
//! [`analytics`] thread that tracks objects, follows them through zones and across lines,
//! turns that into object events with snapshots, and keeps the latest frame. Results are
//! plain [`event`]s stamped with the stream's presentation time and a wall-clock capture
//! time ([`clock`]: RTCP sender reports, else local receive time); [`fanout`] carries them
//! through bounded broadcasts and to the [`sinks`] (MQTT, webhooks), each with its own
//! bounded drop-oldest queue, so nothing downstream can stall detection. [`config`] is the
//! TOML shape of it all and [`telemetry`] names every metric. When servers share one
//! stream list, [`shard`] says which of them runs each stream. The [`policy`] says which
//! URLs a stream may have (schemes, file roots, hosts judged after DNS resolution); the
//! manager applies it when a stream is added and the RTSP source before every connection. Wall-clock readings come
//! from the [`WallClock`] in [`ManagerOptions`], so tests can set the time of day.
//!
//! The modules are private: what other crates use is re-exported below, and nothing else
//! is a promise.
//!
//! No HTTP routes and no binary configuration parsing live here: the API crate subscribes
//! to events and calls the handle; the binary builds a [`VideoConfig`] and the sinks.

mod analytics;
mod backoff;
mod clock;
mod config;
mod decode;
mod detect;
mod event;
mod fanout;
mod frame;
mod latest;
mod manager;
mod policy;
mod sampling;
mod shard;
mod sinks;
mod source;
mod supervisor;
mod telemetry;

pub use analytics::config::{
    AnalyticsConfig, ClassSelector, LineConfig, TrackerSettings, UnitsConfig, ZoneConfig,
};
pub use analytics::frame_analytics::FrameAnalytics;
pub use analytics::report::{AnalyticsReport, LineReport, ZoneReport};
pub use analytics::worker::LatestPicture;
pub use config::{BackoffConfig, ConfigError, StreamConfig, VideoConfig};
pub use decode::worker::live_decode_threads;
pub use decode::{
    ActiveDecoder, Codec, DecodeError, DecodePlan, DecodedPicture, DecoderConfig, DecoderDefaults,
    DecoderKind, DecoderStatus, Hardware, VideoDecoder,
};
pub use detect::{DetectError, FrameDetector};
pub use event::{
    CrossDirection, DetectionEvent, ObjectChange, ObjectEvent, ObjectEventKind, ObjectState, SinkMessage,
    StatusChange, StreamStatus,
};
pub use fanout::{EventSubscription, ObjectSubscription, SinkQueue, Subscription};
pub use frame::{CaptureTime, ClockSource, DeviceSurface, Frame, FrameMeta, FramePool, Pts};
pub use manager::{
    ManagerError, ManagerOptions, StreamManager, StreamManagerHandle, StreamReport, StreamSummary,
};
pub use peregrine_types::{ManualWallClock, SystemWallClock, WallClock};
pub use policy::address::RefusedRange;
pub use policy::{HostResolver, StreamPolicy, SystemResolver, UrlPolicy, UrlRefusal};
pub use shard::{rendezvous_owner, shard_weight, ShardAssignment, ShardError, ShardPlacement, SkippedStream};
pub use sinks::mqtt::{MqttConfig, MqttSink, MqttStats};
pub use sinks::store::StoreSink;
pub use sinks::webhook::{WebhookConfig, WebhookSink, WebhookStats};
pub use sinks::wire::{event_json, object_json, snapshot_url};
pub use sinks::{ConfiguredSinks, SinkError};
pub use source::file::{FileOpener, Pacing};
/// Pushed RTP: the source and its parsers (RTP headers, the jitter buffer, the MPEG-PS
/// demuxer, H.264/H.265 depacketization), public for the fuzz targets in fuzz/.
pub use source::gb28181::{Gb28181Channel, LivePlay, LivePlayGrant, LivePlayRequest, LiveTransport};
pub use source::rtp;
pub use source::rtp::RtpOpener;
pub use source::rtsp::{RtspOpener, RtspTransport};
pub use source::{EncodedFrame, Opener, Source, SourceError, StreamParameters};
pub use telemetry::{CounterSnapshot, DropReason, GLASS_TO_RESULT, GLASS_TO_RESULT_BUCKETS};

#[cfg(test)]
pub(crate) mod test_clips {
    use std::path::PathBuf;

    /// A clip from the shared test videos.
    pub fn clip(name: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../../shared/videos")
            .join(name)
    }

    /// The H.265 clip scripts/setup-video-peers.sh transcodes (setup-test.sh runs it).
    pub fn h265_clip() -> PathBuf {
        let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.cache/videos/bikes-h265.mp4");
        assert!(p.exists(), "{} missing: run scripts/setup-test.sh", p.display());
        p
    }
}
