//! Where compressed video comes from, behind two small traits so the supervisor's retry and
//! timeout logic can be tested with fake sources on simulated time.
//!
//! An [`Opener`] knows how to connect to one stream (an RTSP camera, an mp4 file) and is
//! called again after every failure; the [`Source`] it returns yields access units until
//! the stream ends or breaks. [`rtsp`] implements both with retina, [`file`] with re_mp4,
//! [`rtp`] for cameras that push RTP to us (GB28181: MPEG-PS or H.264/H.265, over UDP or
//! TCP), [`gb28181`] for GB28181 channels the server INVITEs to push that RTP.

pub mod file;
pub mod gb28181;
pub mod rtp;
pub mod rtsp;

use bytes::Bytes;
use futures_util::future::BoxFuture;

use crate::decode::DecoderConfig;
use crate::frame::CaptureTime;

/// What the decoder needs to know about a stream, and what is worth reporting about it.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamParameters {
    pub decoder: DecoderConfig,
    /// Picture size as the stream declares it (0 when not known before decoding).
    pub width: u32,
    pub height: u32,
    /// Frames per second as the stream declares it, if it does.
    pub frame_rate: Option<f64>,
}

/// One compressed picture (an access unit) as the source received it.
#[derive(Debug, Clone)]
pub struct EncodedFrame {
    /// In the format `StreamParameters::decoder` says (length-prefixed with an avcC/hvcC
    /// record, or Annex B).
    pub data: Bytes,
    /// Presentation time in 90 kHz ticks from the stream's start.
    pub pts_90k: i64,
    pub capture: CaptureTime,
    /// A random access point: decoding can start here.
    pub is_key: bool,
    /// Set when the stream's parameters changed with this frame; the decoder is reopened.
    pub new_parameters: Option<StreamParameters>,
}

/// Failures of a source; every one of them leads the supervisor to reconnect (after a
/// backoff), except the end of a file that does not loop.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum SourceError {
    #[error("cannot connect to {url}: {reason}")]
    Connect { url: String, reason: String },
    #[error("stream {url} failed: {reason}")]
    Stream { url: String, reason: String },
    #[error("{what} timed out after {after_ms} ms")]
    Timeout { what: &'static str, after_ms: u64 },
    #[error("cannot read {path}: {reason}")]
    Io { path: String, reason: String },
    #[error("{path} is not a usable mp4 file: {reason}")]
    Malformed { path: String, reason: String },
    #[error("{url} has no H.264 or H.265 video track (found: {found})")]
    NoVideo { url: String, found: String },
    #[error("the decoder thread has stopped")]
    DecoderGone,
}

/// An open stream.
pub trait Source: Send {
    /// The stream's parameters, when known before the first frame.
    fn parameters(&self) -> Option<&StreamParameters>;

    /// A live source (a camera, a file paced like one) does not wait for us: when the
    /// decoder falls behind its frames are dropped. A source that is not live (a file read
    /// as fast as possible) is read only as fast as the decoder takes it.
    fn is_live(&self) -> bool {
        true
    }

    /// The next access unit; `Ok(None)` when a finite source (a file that does not loop)
    /// has ended.
    fn next_frame(&mut self) -> BoxFuture<'_, Result<Option<EncodedFrame>, SourceError>>;
}

/// Connects to one stream, as many times as the supervisor asks.
pub trait Opener: Send + Sync + 'static {
    fn open(&self) -> BoxFuture<'static, Result<Box<dyn Source>, SourceError>>;

    /// Where this opener connects, safe for logs (no credentials).
    fn describe(&self) -> String;
}
