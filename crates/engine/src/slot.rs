//! One batch slot, from the request that fills it to the instance thread that runs it, and
//! what it produced. The request builds a [`Slot`], the queue task holds it, the instance
//! hands it to [`crate::Detector::run_batch`], and the answer comes back as a
//! [`SlotOutput`]: one type each way, owned, so nothing is converted on the way.

use std::any::Any;
use std::sync::Arc;

use bytes::Bytes;
use peregrine_types::{DetectParams, Detection};
use peregrine_vision::yuv::Nv12Image;
use peregrine_vision::{DecodeError, Letterbox};

/// Whatever keeps a frame's GPU memory alive and unchanged (the decoder's surface); the
/// slot holds it until the batch is answered, then lets go.
#[derive(Clone)]
pub struct FrameOwner(pub Arc<dyn Any + Send + Sync>);

impl std::fmt::Debug for FrameOwner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FrameOwner")
    }
}

/// What one slot of a batch asks of the model.
#[derive(Debug, Clone)]
pub enum Slot {
    /// An image already letterboxed to the model's input size: interleaved RGB8,
    /// `input_height * input_width * 3` bytes (a pooled buffer in the server).
    Canvas {
        canvas: Vec<u8>,
        letterbox: Letterbox,
        params: DetectParams,
    },
    /// One image's worth of model input as the model takes it, in little-endian bytes:
    /// `[3, height, width]` float32 already normalised by the caller, or `[height, width,
    /// 3]` uint8 for a rewritten graph. Its raw output is wanted, not detections.
    Tensor(Bytes),
    /// A baseline JPEG (see `peregrine_vision::baseline_jpeg`) for a backend that decodes
    /// and letterboxes on the device ([`crate::Detector::decodes_jpeg`]), with the
    /// geometry its header gave.
    Jpeg {
        data: Bytes,
        width: usize,
        height: usize,
        /// `Letterbox::new(width, height, ...)` for the model's input size.
        letterbox: Letterbox,
        params: DetectParams,
    },
    /// A video frame in GPU memory, for a backend that converts and letterboxes it there
    /// ([`crate::Detector::frames_device`]).
    Frame {
        image: Nv12Image,
        owner: FrameOwner,
        /// `Letterbox::new(width, height, ...)` for the model's input size.
        letterbox: Letterbox,
        params: DetectParams,
    },
}

impl Slot {
    /// The letterbox and thresholds of a slot that wants detections.
    pub(crate) fn detection_request(&self) -> Option<(&Letterbox, &DetectParams)> {
        match self {
            Self::Canvas {
                letterbox, params, ..
            }
            | Self::Jpeg {
                letterbox, params, ..
            }
            | Self::Frame {
                letterbox, params, ..
            } => Some((letterbox, params)),
            Self::Tensor(_) => None,
        }
    }

    /// The canvas buffer of an image slot, for its pool once the slot is done.
    pub(crate) fn into_canvas(self) -> Option<Vec<u8>> {
        match self {
            Self::Canvas { canvas, .. } => Some(canvas),
            Self::Tensor(_) | Self::Jpeg { .. } | Self::Frame { .. } => None,
        }
    }
}

/// What one slot of a batch produced.
#[derive(Debug, Clone, PartialEq)]
pub enum SlotOutput {
    /// Detections in original-image pixels, best first.
    Detections(Vec<Detection>),
    /// The model's first output for this slot, as it came out (float32, row-major).
    Tensor(Vec<f32>),
    /// A JPEG slot that turned out undecodable (found when the device could not decode the
    /// batch and its JPEGs were decoded on the host).
    Rejected(DecodeError),
}
