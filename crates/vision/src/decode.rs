//! Encoded image bytes to 8-bit RGB.
//!
//! The pixel limit is checked against the dimensions in the header, so a 100-byte file that
//! claims to be 100000x100000 is refused before a single buffer is allocated.

use std::io::Cursor;

use image::{DynamicImage, ImageDecoder, ImageFormat, ImageReader, RgbImage};

use crate::jpeg_header::FrameHeader;

/// Bounds applied while decoding untrusted input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeLimits {
    /// Largest accepted `width * height`.
    pub max_pixels: u64,
}

impl DecodeLimits {
    pub const DEFAULT_MAX_PIXELS: u64 = 50_000_000;
}

impl Default for DecodeLimits {
    fn default() -> Self {
        Self {
            max_pixels: Self::DEFAULT_MAX_PIXELS,
        }
    }
}

/// A decoded, upright image.
#[derive(Debug, Clone)]
pub struct DecodedImage {
    pub format: ImageFormat,
    /// The pixels: the whole picture, at its full size unless [`DecodeOptions::fit_within`]
    /// let a JPEG be decoded at a fraction of it.
    pub rgb: RgbImage,
    /// The picture's upright size as encoded, which boxes are reported in.
    pub size: (u32, u32),
}

impl DecodedImage {
    /// Width of the picture as encoded (upright), whatever scale `rgb` holds it at.
    pub fn width(&self) -> u32 {
        self.size.0
    }

    /// Height of the picture as encoded (upright).
    pub fn height(&self) -> u32 {
        self.size.1
    }

    /// Whether `rgb` holds the picture at less than its full size.
    pub fn is_reduced(&self) -> bool {
        self.size != self.rgb.dimensions()
    }
}

/// How to decode, beyond the limits.
#[derive(Debug, Default)]
pub struct DecodeOptions {
    /// Memory for the pixels, reused when large enough (a decoder thread keeps one buffer
    /// instead of allocating, and faulting in, megabytes per image).
    pub buffer: Vec<u8>,
    /// The size the image will be letterboxed into. A JPEG larger than twice that is then
    /// decoded at 1/2, 1/4 or 1/8 of its size by libjpeg-turbo's scaled IDCT (the smallest
    /// that still has at least as many pixels as the letterbox keeps), which skips most of
    /// the decoding work; the letterbox then resamples from that. The pixels differ a little
    /// from a full decode followed by the same resize, so this is a choice, off by default.
    pub fit_within: Option<(usize, usize)>,
}

/// The smallest power-of-two reduction (1/2, 1/4, 1/8) of a `width` x `height` picture that
/// is still no smaller than fitting it into `fit` scales it to; 1 when there is none.
fn jpeg_reduction(width: usize, height: usize, fit: Option<(usize, usize)>) -> usize {
    let Some((fw, fh)) = fit else { return 1 };
    let gain = (fw as f64 / width as f64).min(fh as f64 / height as f64);
    let mut denom = 1;
    while denom < 8 && 1.0 / (2 * denom) as f64 >= gain {
        denom *= 2;
    }
    denom
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("the image is empty (0 bytes)")]
    Empty,
    #[error("the data is not an image in a supported format (JPEG, PNG, WebP, BMP)")]
    UnknownFormat,
    #[error("{0} images are not supported; send JPEG, PNG, WebP or BMP")]
    UnsupportedFormat(String),
    #[error("the image has zero width or height")]
    ZeroSize,
    #[error(
        "the image is {width}x{height} pixels, over the limit of {max_pixels} pixels \
         (raise max-pixels to accept it)"
    )]
    TooLarge {
        width: u32,
        height: u32,
        max_pixels: u64,
    },
    #[error("the {format} data is corrupt or truncated: {reason}")]
    Malformed { format: String, reason: String },
}

fn format_name(format: ImageFormat) -> String {
    match format {
        ImageFormat::Jpeg => "JPEG".into(),
        ImageFormat::Png => "PNG".into(),
        ImageFormat::WebP => "WebP".into(),
        ImageFormat::Bmp => "BMP".into(),
        other => format!("{other:?}").to_uppercase(),
    }
}

fn is_supported(format: ImageFormat) -> bool {
    matches!(
        format,
        ImageFormat::Jpeg | ImageFormat::Png | ImageFormat::WebP | ImageFormat::Bmp
    )
}

/// Decodes a JPEG with libjpeg-turbo (the decoder OpenCV uses, so pixels match the
/// reference pipeline bit for bit). Returns `None` for the colour spaces libjpeg-turbo cannot
/// convert to RGB (CMYK, YCCK), which the generic decoder then handles.
fn decode_jpeg_turbo(bytes: &[u8], options: &mut DecodeOptions) -> Result<Option<DecodedImage>, DecodeError> {
    let orientation = jpeg_orientation(bytes)?;
    let mut decompressor = turbojpeg::Decompressor::new().map_err(|e| jpeg_malformed(e.to_string()))?;
    let header = decompressor
        .read_header(bytes)
        .map_err(|e| jpeg_malformed(e.to_string()))?;
    if matches!(
        header.colorspace,
        turbojpeg::Colorspace::CMYK | turbojpeg::Colorspace::YCCK
    ) {
        return Ok(None);
    }
    // A quarter turn swaps the axes the letterbox fits.
    let fit = options.fit_within.map(|(w, h)| {
        if orientation_swaps_axes(orientation) {
            (h, w)
        } else {
            (w, h)
        }
    });
    let denom = jpeg_reduction(header.width, header.height, fit);
    let full = (header.width as u32, header.height as u32);
    let (width, height) = if denom > 1 {
        let factor = turbojpeg::ScalingFactor::new(1, denom);
        decompressor
            .set_scaling_factor(factor)
            .map_err(|e| jpeg_malformed(e.to_string()))?;
        (factor.scale(header.width), factor.scale(header.height))
    } else {
        (header.width, header.height)
    };
    let mut pixels = std::mem::take(&mut options.buffer);
    pixels.clear();
    // Every byte is written by the decoder; the zeroing is for safety only and touches
    // memory the decoder would fault in anyway.
    pixels.resize(width * height * 3, 0);
    let target = turbojpeg::Image {
        pixels: pixels.as_mut_slice(),
        width,
        pitch: width * 3,
        height,
        format: turbojpeg::PixelFormat::RGB,
    };
    decompressor
        .decompress(bytes, target)
        .map_err(|e| jpeg_malformed(e.to_string()))?;
    let rgb = RgbImage::from_raw(width as u32, height as u32, pixels)
        .ok_or_else(|| jpeg_malformed("decoded size does not match the header".into()))?;
    let size = if orientation_swaps_axes(orientation) {
        (full.1, full.0)
    } else {
        full
    };
    let rgb = if orientation == image::metadata::Orientation::NoTransforms {
        rgb
    } else {
        let mut image = DynamicImage::ImageRgb8(rgb);
        image.apply_orientation(orientation);
        image.into_rgb8()
    };
    Ok(Some(DecodedImage {
        format: ImageFormat::Jpeg,
        rgb,
        size,
    }))
}

fn orientation_swaps_axes(o: image::metadata::Orientation) -> bool {
    use image::metadata::Orientation::*;
    matches!(o, Rotate90 | Rotate270 | Rotate90FlipH | Rotate270FlipH)
}

fn check_pixels(width: u64, height: u64, limits: DecodeLimits) -> Result<(), DecodeError> {
    if width == 0 || height == 0 {
        return Err(DecodeError::ZeroSize);
    }
    if width.saturating_mul(height) > limits.max_pixels {
        return Err(DecodeError::TooLarge {
            width: u32::try_from(width).unwrap_or(u32::MAX),
            height: u32::try_from(height).unwrap_or(u32::MAX),
            max_pixels: limits.max_pixels,
        });
    }
    Ok(())
}

fn jpeg_malformed(reason: String) -> DecodeError {
    DecodeError::Malformed {
        format: "JPEG".into(),
        reason,
    }
}

/// EXIF orientation, from the image crate's header parser, which reads no pixels.
fn jpeg_orientation(bytes: &[u8]) -> Result<image::metadata::Orientation, DecodeError> {
    image::codecs::jpeg::JpegDecoder::new(Cursor::new(bytes))
        .and_then(|mut d| d.orientation())
        .map_err(|e| jpeg_malformed(e.to_string()))
}

/// The JPEG decoder fills a cut-off scan with gray and reports success; a request must not
/// get detections on half a picture without knowing.
fn check_jpeg_complete(bytes: &[u8]) -> Result<(), DecodeError> {
    if jpeg_has_end_marker(bytes) {
        Ok(())
    } else {
        Err(jpeg_malformed(
            "the file ends before the end-of-image marker (truncated upload?)".into(),
        ))
    }
}

/// Whether an end-of-image marker (FF D9) follows the last start-of-scan (FF DA). Scan data
/// stuffs every FF with 00, so a real EOI cannot hide inside it, and an EXIF thumbnail's
/// EOI sits before the main scan.
fn jpeg_has_end_marker(bytes: &[u8]) -> bool {
    let is_sos = |w: &[u8]| w == [0xFF, 0xDA];
    // Searching back from the end finds the EOI of a whole file in a few bytes.
    match bytes.windows(2).rposition(|w| w == [0xFF, 0xD9]) {
        Some(eoi) => !bytes[eoi..].windows(2).any(is_sos),
        // No EOI and no scan at all: let the decoder say what is wrong.
        None => !bytes.windows(2).any(is_sos),
    }
}

/// A JPEG a GPU decoder can take as it is, by its header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BaselineJpeg {
    pub width: u32,
    pub height: u32,
}

/// Reads `bytes`' header and says whether it is a plain baseline JPEG whose pixels a GPU
/// decoder (nvJPEG's planes, then libjpeg-turbo's upsampling and colour arithmetic in the
/// letterbox kernel) reproduces: 8-bit baseline Huffman (SOF0), gray or YCbCr with 4:4:4,
/// 4:2:2, 4:2:0 or 4:4:0 chroma (see [`crate::jpeg_planes::ChromaSubsampling`]), no EXIF
/// rotation, ending in an end-of-image marker. `Ok(None)` means decode it on the CPU instead
/// (progressive, arithmetic-coded, lossless, 12-bit, CMYK, RGB-coded, 4:1:1 and other
/// layouts, rotated, not a JPEG).
/// Errors are the ones [`decode_image`] would give for the same bytes: size over the limits,
/// truncation, an unparseable header.
pub fn baseline_jpeg(bytes: &[u8], limits: DecodeLimits) -> Result<Option<BaselineJpeg>, DecodeError> {
    if !bytes.starts_with(&[0xFF, 0xD8, 0xFF]) {
        return Ok(None);
    }
    let Some(frame) = FrameHeader::parse(bytes) else {
        return Ok(None);
    };
    check_pixels(u64::from(frame.width), u64::from(frame.height), limits)?;
    check_jpeg_complete(bytes)?;
    if frame.marker != 0xC0 || frame.precision != 8 || frame.subsampling().is_none() {
        return Ok(None);
    }
    if jpeg_orientation(bytes)? != image::metadata::Orientation::NoTransforms {
        return Ok(None);
    }
    Ok(Some(BaselineJpeg {
        width: u32::from(frame.width),
        height: u32::from(frame.height),
    }))
}

/// A baseline JPEG of a uniform gray `width` x `height` image: a known-good file for
/// warming up a JPEG decoder.
pub fn gray_jpeg(width: u32, height: u32) -> Vec<u8> {
    let img = RgbImage::from_pixel(width.max(1), height.max(1), image::Rgb([114, 114, 114]));
    let mut out = Cursor::new(Vec::new());
    DynamicImage::ImageRgb8(img)
        .write_to(&mut out, ImageFormat::Jpeg)
        .expect("encoding an in-memory JPEG cannot fail");
    out.into_inner()
}

/// Decodes `bytes` into upright RGB8: EXIF orientation applied, alpha dropped, gray
/// expanded, 16-bit reduced to 8-bit.
pub fn decode_image(bytes: &[u8], limits: DecodeLimits) -> Result<DecodedImage, DecodeError> {
    decode_image_with(bytes, limits, &mut DecodeOptions::default())
}

/// [`decode_image`] with [`DecodeOptions`]: a buffer to decode into (taken from `options`;
/// give it back through `DecodedImage::rgb.into_raw()` for the next call) and an optional
/// letterbox size that lets large JPEGs decode at reduced scale.
pub fn decode_image_with(
    bytes: &[u8],
    limits: DecodeLimits,
    options: &mut DecodeOptions,
) -> Result<DecodedImage, DecodeError> {
    if bytes.is_empty() {
        return Err(DecodeError::Empty);
    }
    let format = image::guess_format(bytes).map_err(|_| DecodeError::UnknownFormat)?;
    if !is_supported(format) {
        return Err(DecodeError::UnsupportedFormat(format_name(format)));
    }
    let malformed = |e: image::ImageError| DecodeError::Malformed {
        format: format_name(format),
        reason: e.to_string(),
    };
    // Read the size from the header alone, before the decoder allocates anything.
    if let Ok(size) = imagesize::blob_size(bytes) {
        check_pixels(size.width as u64, size.height as u64, limits)?;
    }
    if format == ImageFormat::Jpeg {
        check_jpeg_complete(bytes)?;
        if let Some(decoded) = decode_jpeg_turbo(bytes, options)? {
            return Ok(decoded);
        }
    }
    let mut reader = ImageReader::with_format(Cursor::new(bytes), format);
    // The image crate's own allocation cap backs up the pixel check below; 16-bit RGBA is
    // the widest layout we accept (8 bytes a pixel), plus room for the RGB8 copy.
    let mut image_limits = image::Limits::default();
    image_limits.max_alloc = Some(limits.max_pixels.saturating_mul(12).max(1 << 20));
    reader.limits(image_limits);
    let mut decoder = reader.into_decoder().map_err(malformed)?;
    let (width, height) = decoder.dimensions();
    check_pixels(u64::from(width), u64::from(height), limits)?;
    let orientation = decoder.orientation().map_err(malformed)?;
    let mut image = DynamicImage::from_decoder(decoder).map_err(malformed)?;
    image.apply_orientation(orientation);
    let rgb = match image {
        DynamicImage::ImageRgb8(rgb) => rgb,
        other => other.into_rgb8(),
    };
    let size = rgb.dimensions();
    Ok(DecodedImage { format, rgb, size })
}

#[cfg(test)]
#[path = "decode_tests.rs"]
mod tests;
