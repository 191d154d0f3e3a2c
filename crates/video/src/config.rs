//! Stream definitions as the configuration file (TOML, `[[streams]]`) or a runtime request
//! gives them. Every default lives here, on the field it belongs to.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use peregrine_types::WallClock;
use serde::Deserialize;

pub use crate::analytics::config::AnalyticsConfig;
use crate::backoff::BackoffPolicy;
use crate::decode::DecoderKind;
use crate::policy::{UrlPolicy, UrlRefusal};
use crate::sinks::mqtt::MqttConfig;
use crate::sinks::webhook::WebhookConfig;
use crate::source::file::{FileOpener, Pacing};
use crate::source::gb28181::{Gb28181Channel, Gb28181Opener, LivePlay};
use crate::source::rtp::endpoint::RtpEndpoint;
use crate::source::rtp::RtpOpener;
use crate::source::rtsp::{RtspOpener, RtspTransport};
use crate::source::Opener;

/// The video section of the server's configuration.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct VideoConfig {
    #[serde(default)]
    pub streams: Vec<StreamConfig>,
    pub mqtt: Option<MqttConfig>,
    #[serde(default)]
    pub webhooks: Vec<WebhookConfig>,
}

/// One camera or file.
///
/// ```toml
/// [[streams]]
/// name = "cam1"
/// url = "rtsp://user:pass@10.0.0.5/stream1"
/// transport = "tcp"
/// fps = 5
/// ```
#[derive(Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct StreamConfig {
    /// Identifies the stream in the API, metrics and MQTT topics: letters, digits, `-`, `_`.
    pub name: String,
    /// `rtsp://[user:pass@]host[:port]/path`; a pushed RTP stream (GB28181) as
    /// `rtp://0.0.0.0:PORT?format=ps` (UDP) or `rtp+tcp://0.0.0.0:PORT?format=ps`
    /// (TCP, the camera connects; `&mode=active`: we connect to the URL's host), `format`
    /// one of `ps`, `h264`, `h265`; a GB28181 device's channel as
    /// `gb28181://DEVICE_ID/CHANNEL_ID[?transport=udp|tcp|tcp-active]` (the server INVITEs
    /// it); or an mp4
    /// file as `file:///path` or a path.
    pub url: String,
    /// RTP transport for RTSP streams.
    #[serde(default)]
    pub transport: RtspTransport,
    /// Frames per second handed to detection; absent or 0 for every frame.
    #[serde(default)]
    pub fps: Option<f64>,
    /// A frame not yet given to the detector this long after it arrived is dropped unrun.
    #[serde(default = "defaults::staleness_ms")]
    pub staleness_ms: u64,
    /// Limit on DESCRIBE + SETUP + PLAY (or opening a file).
    #[serde(default = "defaults::connect_timeout_ms")]
    pub connect_timeout_ms: u64,
    /// A connection that yields no frame for this long is dropped and reopened.
    #[serde(default = "defaults::frame_timeout_ms")]
    pub frame_timeout_ms: u64,
    /// FFmpeg frame threads for this stream's decoder (each adds a frame of latency).
    #[serde(default = "defaults::decode_threads")]
    pub decode_threads: usize,
    /// `auto`, `cpu` or `nvdec` (absent: the server's `--video-decoder`). `auto` decodes on
    /// the models' GPU with NVDEC where it takes the stream, else on the CPU.
    #[serde(default)]
    pub decoder: Option<DecoderKind>,
    /// The GPU whose NVDEC decodes this stream (absent: of the models' GPUs, the one
    /// decoding the fewest streams).
    #[serde(default)]
    pub gpu: Option<i32>,
    /// Access units queued for the decode thread before the source skips to a key frame.
    #[serde(default = "defaults::decode_queue")]
    pub decode_queue: usize,
    /// Decoded frames alive at once (slot, detection, conversion, detector's batch, and the
    /// latest one the analytics keep for snapshots and live views).
    #[serde(default = "defaults::frame_pool")]
    pub frame_pool: usize,
    /// Frames in detection at once, answered in order: more than 1 lets a camera whose
    /// frames come faster than one detection's round trip use several model instances.
    #[serde(default = "defaults::detect_in_flight")]
    pub detect_in_flight: usize,
    #[serde(default)]
    pub backoff: BackoffConfig,
    /// Files only: start again at the end.
    #[serde(default, rename = "loop")]
    pub looped: bool,
    /// Files only: release frames at the clip's rate (`true`, like a camera) or as fast as
    /// they are consumed (`false`).
    #[serde(default = "defaults::yes")]
    pub realtime: bool,
    /// Tracking, zones, lines and snapshots.
    #[serde(default)]
    pub analytics: AnalyticsConfig,
}

impl std::fmt::Debug for StreamConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // By hand, so a password in the URL never reaches a log line.
        f.debug_struct("StreamConfig")
            .field("name", &self.name)
            .field("url", &redact_url(&self.url))
            .field("transport", &self.transport)
            .field("fps", &self.fps)
            .field("staleness_ms", &self.staleness_ms)
            .field("connect_timeout_ms", &self.connect_timeout_ms)
            .field("frame_timeout_ms", &self.frame_timeout_ms)
            .field("decode_threads", &self.decode_threads)
            .field("decoder", &self.decoder)
            .field("gpu", &self.gpu)
            .field("decode_queue", &self.decode_queue)
            .field("frame_pool", &self.frame_pool)
            .field("detect_in_flight", &self.detect_in_flight)
            .field("backoff", &self.backoff)
            .field("looped", &self.looped)
            .field("realtime", &self.realtime)
            .field("analytics", &self.analytics)
            .finish()
    }
}

/// `url` with any password replaced by `REDACTED`.
pub fn redact_url(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) if u.password().is_some() => {
            let _ = u.set_password(Some("REDACTED"));
            u.to_string()
        }
        _ => url.to_string(),
    }
}

/// A stream URL, parsed: what the policy judges and the opener opens.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum SourceUrl {
    Rtsp(url::Url),
    Rtp(RtpEndpoint),
    Gb28181(Gb28181Channel),
    File(PathBuf),
}

/// Reconnect schedule (see [`BackoffPolicy`]).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct BackoffConfig {
    pub first_retry_ms: u64,
    pub initial_ms: u64,
    pub max_ms: u64,
    pub multiplier: f64,
    pub jitter: f64,
    pub min_connection_interval_ms: u64,
    pub first_connect_timeout_ms: u64,
    pub first_frame_timeout_ms: u64,
}

impl Default for BackoffConfig {
    fn default() -> Self {
        let p = BackoffPolicy::default();
        Self {
            first_retry_ms: p.first_retry.as_millis() as u64,
            initial_ms: p.initial.as_millis() as u64,
            max_ms: p.max.as_millis() as u64,
            multiplier: p.multiplier,
            jitter: p.jitter,
            min_connection_interval_ms: p.min_connection_interval.as_millis() as u64,
            first_connect_timeout_ms: p.first_connect_timeout.as_millis() as u64,
            first_frame_timeout_ms: p.first_frame_timeout.as_millis() as u64,
        }
    }
}

impl From<&BackoffConfig> for BackoffPolicy {
    fn from(c: &BackoffConfig) -> Self {
        Self {
            first_retry: Duration::from_millis(c.first_retry_ms),
            initial: Duration::from_millis(c.initial_ms),
            max: Duration::from_millis(c.max_ms.max(c.initial_ms)),
            multiplier: c.multiplier,
            jitter: c.jitter,
            min_connection_interval: Duration::from_millis(c.min_connection_interval_ms),
            first_connect_timeout: Duration::from_millis(c.first_connect_timeout_ms),
            first_frame_timeout: Duration::from_millis(c.first_frame_timeout_ms),
        }
    }
}

mod defaults {
    pub fn staleness_ms() -> u64 {
        1000
    }
    pub fn connect_timeout_ms() -> u64 {
        10_000
    }
    pub fn frame_timeout_ms() -> u64 {
        5_000
    }
    pub fn decode_threads() -> usize {
        2
    }
    pub fn decode_queue() -> usize {
        32
    }
    pub fn frame_pool() -> usize {
        5
    }
    pub fn detect_in_flight() -> usize {
        1
    }
    pub fn yes() -> bool {
        true
    }
}

/// A stream definition that cannot work, with what to change.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[error("stream {name:?}: {problem}")]
pub struct ConfigError {
    pub name: String,
    pub problem: String,
}

impl StreamConfig {
    /// A stream with every default, for code that builds configurations itself.
    pub fn new(name: impl Into<String>, url: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            url: url.into(),
            transport: RtspTransport::default(),
            fps: None,
            staleness_ms: defaults::staleness_ms(),
            connect_timeout_ms: defaults::connect_timeout_ms(),
            frame_timeout_ms: defaults::frame_timeout_ms(),
            decode_threads: defaults::decode_threads(),
            decoder: None,
            gpu: None,
            decode_queue: defaults::decode_queue(),
            frame_pool: defaults::frame_pool(),
            detect_in_flight: defaults::detect_in_flight(),
            backoff: BackoffConfig::default(),
            looped: false,
            realtime: true,
            analytics: AnalyticsConfig::default(),
        }
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let fail = |problem: String| {
            Err(ConfigError {
                name: self.name.clone(),
                problem,
            })
        };
        let name_ok = !self.name.is_empty()
            && self.name.len() <= 64
            && self
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if !name_ok {
            return fail("name must be 1-64 letters, digits, '-' or '_' (it is used in MQTT topics)".into());
        }
        if let Some(fps) = self.fps {
            if !fps.is_finite() || fps < 0.0 {
                return fail(format!(
                    "fps must be a positive number or 0 for every frame, not {fps}"
                ));
            }
        }
        if self.staleness_ms == 0 || self.connect_timeout_ms == 0 || self.frame_timeout_ms == 0 {
            return fail("staleness_ms, connect_timeout_ms and frame_timeout_ms must be over 0".into());
        }
        if self.gpu.is_some_and(|g| g < 0) {
            return fail("gpu must be a GPU number, 0 or more".into());
        }
        if self.frame_pool < 2 {
            return fail("frame_pool must be at least 2 (one frame in detection, one arriving)".into());
        }
        match self.detect_in_flight {
            0 => return fail("detect_in_flight must be at least 1".into()),
            n if n >= self.frame_pool => {
                return fail(format!(
                    "detect_in_flight {n} needs a frame_pool of at least {} (the frames in detection and one arriving), not {}",
                    n + 1,
                    self.frame_pool
                ))
            }
            _ => {}
        }
        if let Err(problem) = self.analytics.validate() {
            return fail(problem);
        }
        let b = &self.backoff;
        let multiplier_ok = b.multiplier.is_finite() && b.multiplier >= 1.0;
        if b.initial_ms == 0 || !multiplier_ok || !(0.0..=1.0).contains(&b.jitter) {
            return fail("backoff needs initial_ms > 0, multiplier >= 1 and jitter in 0..=1".into());
        }
        self.source_url().map(|_| ())
    }

    /// What the URL names: an RTSP camera or an mp4 file.
    pub(crate) fn source_url(&self) -> Result<SourceUrl, ConfigError> {
        let fail = |problem: String| ConfigError {
            name: self.name.clone(),
            problem,
        };
        if self.url.starts_with("rtsp://") {
            let url = url::Url::parse(&self.url).map_err(|e| fail(format!("bad RTSP URL: {e}")))?;
            return Ok(SourceUrl::Rtsp(url));
        }
        if self.url.starts_with("rtp://") || self.url.starts_with("rtp+tcp://") {
            let url = url::Url::parse(&self.url).map_err(|e| fail(format!("bad RTP URL: {e}")))?;
            return RtpEndpoint::parse(&url).map(SourceUrl::Rtp).map_err(fail);
        }
        if self.url.starts_with("gb28181://") {
            let url = url::Url::parse(&self.url).map_err(|e| fail(format!("bad GB28181 URL: {e}")))?;
            return Gb28181Channel::parse(&url).map(SourceUrl::Gb28181).map_err(fail);
        }
        if self.url.contains("://") && !self.url.starts_with("file://") {
            return Err(fail(
                "url must start with rtsp://, rtp://, rtp+tcp:// or gb28181://, or be an mp4 file (file:///path or a path); rtsps is not supported"
                    .into(),
            ));
        }
        Ok(SourceUrl::File(match self.url.strip_prefix("file://") {
            Some(p) => PathBuf::from(p),
            None => PathBuf::from(&self.url),
        }))
    }

    /// The source this definition names, as `policy` allows it: an RTSP camera checked
    /// again before every connection, a file opened by its canonical path, a GB28181
    /// channel through `live` (refused when the server has none). `clock` stamps what it reads where the source has no clock of its own (files, RTP).
    pub(crate) fn opener(
        &self,
        source: SourceUrl,
        clock: &Arc<dyn WallClock>,
        policy: &Arc<UrlPolicy>,
        live: Option<&Arc<dyn LivePlay>>,
    ) -> Result<Arc<dyn Opener>, UrlRefusal> {
        let path = match source {
            SourceUrl::Rtsp(url) => {
                let opener =
                    RtspOpener::new(url, self.transport, self.decode_threads).guarded_by(policy.clone());
                return Ok(Arc::new(opener));
            }
            SourceUrl::Rtp(endpoint) => {
                let opener =
                    RtpOpener::new(endpoint, self.decode_threads, clock.clone()).guarded_by(policy.clone());
                return Ok(Arc::new(opener));
            }
            SourceUrl::Gb28181(channel) => {
                let live = live.ok_or(UrlRefusal::Gb28181Off)?;
                let opener = Gb28181Opener::new(channel, live.clone(), self.decode_threads, clock.clone())
                    .guarded_by(policy.clone());
                return Ok(Arc::new(opener));
            }
            SourceUrl::File(path) => policy.file_path(&path)?,
        };
        Ok(Arc::new(FileOpener {
            path,
            looped: self.looped,
            pacing: if self.realtime {
                Pacing::Realtime
            } else {
                Pacing::AsFastAsPossible
            },
            decode_threads: self.decode_threads,
            clock: clock.clone(),
        }))
    }

    /// The same definition with any password in the URL replaced, safe to show.
    pub fn redacted(&self) -> Self {
        Self {
            url: redact_url(&self.url),
            ..self.clone()
        }
    }

    pub fn staleness(&self) -> Duration {
        Duration::from_millis(self.staleness_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_documented_toml_with_defaults() {
        let text = r#"
            [[streams]]
            name = "cam1"
            url = "rtsp://user:pass@127.0.0.1:8554/cam"
            transport = "udp"
            fps = 5

            [[streams]]
            name = "demo"
            url = "/work/shared/videos/bikes.mp4"
            loop = true
            realtime = false
            backoff = { initial_ms = 100, max_ms = 2000 }

            [[streams]]
            name = "gate"
            url = "rtp://0.0.0.0:15060?format=ps"
            fps = 5

            [mqtt]
            host = "127.0.0.1"
            port = 1883

            [[webhooks]]
            url = "http://127.0.0.1:9000/hook"
        "#;
        let cfg: VideoConfig = toml::from_str(text).unwrap();
        assert_eq!(cfg.streams.len(), 3);
        let cam = &cfg.streams[0];
        assert_eq!(cam.transport, RtspTransport::Udp);
        assert_eq!(cam.fps, Some(5.0));
        assert_eq!(cam.staleness_ms, 1000);
        cam.validate().unwrap();
        let clock: Arc<dyn WallClock> = Arc::new(peregrine_types::SystemWallClock);
        let policy = crate::policy::StreamPolicy::default();
        let policy = Arc::new(UrlPolicy::new(&policy, Arc::new(crate::policy::SystemResolver)).unwrap());
        let gate = &cfg.streams[2];
        gate.validate().unwrap();
        let opener = gate
            .opener(gate.source_url().unwrap(), &clock, &policy, None)
            .unwrap();
        assert_eq!(
            opener.describe(),
            "rtp://0.0.0.0:15060?format=ps (rtp over udp, listening, mpeg-ps)"
        );
        assert!(!cam
            .opener(cam.source_url().unwrap(), &clock, &policy, None)
            .unwrap()
            .describe()
            .contains("pass"));
        assert!(!format!("{cam:?}").contains("pass") && !cam.redacted().url.contains("pass"));
        assert!(cam.redacted().url.contains("user:REDACTED@"));
        let channel = StreamConfig::new("gb", "gb28181://34020000001320000001/34020000001310000001");
        let refusal = channel
            .opener(channel.source_url().unwrap(), &clock, &policy, None)
            .err();
        assert_eq!(
            refusal,
            Some(UrlRefusal::Gb28181Off),
            "no GB28181 server, no such streams"
        );
        let demo = &cfg.streams[1];
        assert!(demo.looped && !demo.realtime);
        assert_eq!(demo.backoff.max_ms, 2000);
        assert_eq!(
            demo.backoff.multiplier, 2.0,
            "unspecified backoff fields keep defaults"
        );
        assert_eq!(cfg.mqtt.unwrap().effective_port(), 1883);
        assert_eq!(cfg.webhooks.len(), 1);
    }

    #[test]
    fn rejects_bad_definitions_with_a_reason() {
        let mut c = StreamConfig::new("cam 1", "rtsp://h/x");
        assert!(c.validate().unwrap_err().problem.contains("letters"));
        c.name = "cam1".into();
        c.url = "http://h/x".into();
        assert!(c.validate().unwrap_err().problem.contains("rtsp://"));
        c.url = "rtsp://h/x".into();
        c.fps = Some(-1.0);
        assert!(c.validate().is_err());
        c.fps = Some(0.0);
        c.validate().unwrap();
        c.url = "rtp://0.0.0.0?format=ps".into();
        assert!(c.validate().unwrap_err().problem.contains("needs a port"));
        c.url = "rtp://0.0.0.0:5004?format=vp8".into();
        assert!(c
            .validate()
            .unwrap_err()
            .problem
            .contains("format=vp8 is not ps, h264 or h265"));
        c.url = "rtp+tcp://0.0.0.0:5004?format=ps".into();
        c.validate().unwrap();
        let unknown: Result<VideoConfig, _> = toml::from_str("[[streams]]\nname='a'\nurl='x'\nfsp=5\n");
        assert!(unknown.is_err(), "typos are errors, not silently ignored");
    }

    #[test]
    fn frames_in_detection_must_fit_the_pool() {
        let mut c = StreamConfig::new("cam1", "rtsp://h/x");
        assert_eq!(c.detect_in_flight, 1);
        c.frame_pool = 8;
        c.detect_in_flight = 4;
        c.validate().unwrap();
        c.detect_in_flight = 0;
        assert!(c.validate().unwrap_err().problem.contains("at least 1"));
        c.detect_in_flight = 8;
        let problem = c.validate().unwrap_err().problem;
        assert!(problem.contains("frame_pool of at least 9"), "{problem}");
    }
}
