//! Decoding: FFmpeg behind a safe wrapper ([`ffmpeg`]) and the per-stream decode thread
//! ([`worker`]) that turns access units into sampled, pooled RGB frames.

mod cuda;
mod download;
pub mod ffmpeg;
mod ffmpeg_log;
pub mod hardware;
pub mod nvdec;
pub mod surface;
pub mod worker;

pub use ffmpeg::{Codec, DecodedPicture, DecoderConfig, Hardware, VideoDecoder};
pub use hardware::{
    ActiveDecoder, DecodePlan, DecoderDefaults, DecoderKind, DecoderStatus, DecoderStatusCell,
};
pub use worker::{DecodeWorker, DecodeWorkerConfig};

/// What can go wrong between compressed bytes and an RGB frame.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum DecodeError {
    #[error("this build of FFmpeg has no {0} decoder (rebuild it with scripts/fetch-ffmpeg.sh)")]
    Unsupported(&'static str),
    #[error("FFmpeg could not allocate memory")]
    OutOfMemory,
    #[error("codec configuration record is too large")]
    BadExtradata,
    #[error("FFmpeg refused to open the decoder: {0}")]
    Open(String),
    #[error("access unit is over 2 GiB")]
    PacketTooLarge,
    #[error("damaged access unit: {0}")]
    Corrupt(String),
    #[error("frame buffer is smaller than the picture")]
    OutputTooSmall,
    #[error("colour conversion to RGB failed")]
    Convert,
    #[error("NVDEC is unavailable: {0}")]
    NvdecUnavailable(String),
    #[error("copying a decoded picture from the GPU failed: {0}")]
    Download(String),
}
