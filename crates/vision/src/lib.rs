//! Pure image code for detection: everything between encoded bytes and a list of boxes,
//! except running the model.
//!
//! - [`decode`]: encoded JPEG/PNG/WebP/BMP bytes to RGB pixels, with a pixel limit checked
//!   from the header before any pixel is decoded, and EXIF orientation applied.
//! - [`jpeg_planes`]: a JPEG's decoded Y/Cb/Cr planes to RGB with libjpeg-turbo's own
//!   upsampling and colour arithmetic: the reference for GPU decoding.
//! - [`letterbox`]: Ultralytics-compatible letterbox (centred, pad 114, bilinear) into a
//!   reusable canvas, and the geometry that maps boxes back to the original image.
//! - [`normalize`]: canvas bytes to the model's NCHW float input, written in place into a
//!   batch buffer.
//! - [`layout`] and [`postprocess`]: recognise the model's output layout and turn raw output
//!   rows into candidate boxes; [`nms`] keeps the best non-overlapping ones.
//! - [`spec`]: reads what the pipeline needs (input size, class names, layout) off a
//!   [`peregrine_types::ModelDescription`].
//! - [`annotate`]: draws boxes and labels for people to look at.
//!
//! No I/O and no threads: every function here is deterministic and benchable on its own.

pub mod annotate;
pub mod decode;
pub mod encode;
mod jpeg_header;
pub mod jpeg_planes;
pub mod layout;
pub mod letterbox;
pub mod nms;
pub mod normalize;
pub mod postprocess;
pub mod spec;
pub mod yuv;

pub use decode::{
    baseline_jpeg, decode_image, decode_image_with, gray_jpeg, BaselineJpeg, DecodeError, DecodeLimits,
    DecodeOptions, DecodedImage,
};
pub use layout::{LayoutError, OutputLayout};
pub use letterbox::{resample_tables, ImageView, Letterbox, LetterboxCanvas};
pub use postprocess::{Candidate, Postprocessor};
pub use spec::{DetectorSpec, InputForm, SpecError};
