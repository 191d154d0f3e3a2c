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
mod tests {
    use super::*;
    use image::{ImageBuffer, Luma, LumaA, Rgba};

    fn encode(img: DynamicImage, format: ImageFormat) -> Vec<u8> {
        let mut out = Cursor::new(Vec::new());
        img.write_to(&mut out, format).unwrap();
        out.into_inner()
    }

    fn sample_rgb(w: u32, h: u32) -> DynamicImage {
        DynamicImage::ImageRgb8(RgbImage::from_fn(w, h, |x, y| {
            image::Rgb([(x * 7) as u8, (y * 5) as u8, 128])
        }))
    }

    #[test]
    fn decodes_each_supported_format() {
        for format in [
            ImageFormat::Png,
            ImageFormat::Jpeg,
            ImageFormat::Bmp,
            ImageFormat::WebP,
        ] {
            let bytes = encode(sample_rgb(33, 17), format);
            let img =
                decode_image(&bytes, DecodeLimits::default()).unwrap_or_else(|e| panic!("{format:?}: {e}"));
            assert_eq!((img.width(), img.height()), (33, 17), "{format:?}");
            assert_eq!(img.format, format);
        }
    }

    #[test]
    fn png_gray_alpha_and_16_bit_become_rgb8() {
        let gray = DynamicImage::ImageLuma8(ImageBuffer::from_pixel(4, 3, Luma([200u8])));
        let img = decode_image(&encode(gray, ImageFormat::Png), DecodeLimits::default()).unwrap();
        assert_eq!(img.rgb.get_pixel(1, 1).0, [200, 200, 200]);

        let rgba = DynamicImage::ImageRgba8(ImageBuffer::from_pixel(4, 3, Rgba([10u8, 20, 30, 0])));
        let img = decode_image(&encode(rgba, ImageFormat::Png), DecodeLimits::default()).unwrap();
        assert_eq!(img.rgb.get_pixel(0, 0).0, [10, 20, 30]);

        let gray16 = DynamicImage::ImageLuma16(ImageBuffer::from_pixel(2, 2, Luma([65535u16])));
        let img = decode_image(&encode(gray16, ImageFormat::Png), DecodeLimits::default()).unwrap();
        assert_eq!(img.rgb.get_pixel(0, 0).0, [255, 255, 255]);

        let la = DynamicImage::ImageLumaA8(ImageBuffer::from_pixel(2, 2, LumaA([77u8, 9])));
        let img = decode_image(&encode(la, ImageFormat::Png), DecodeLimits::default()).unwrap();
        assert_eq!(img.rgb.get_pixel(1, 0).0, [77, 77, 77]);
    }

    #[test]
    fn empty_and_garbage_are_named() {
        assert_eq!(
            decode_image(&[], DecodeLimits::default()).unwrap_err(),
            DecodeError::Empty
        );
        assert_eq!(
            decode_image(b"hello, this is not an image", DecodeLimits::default()).unwrap_err(),
            DecodeError::UnknownFormat
        );
    }

    #[test]
    fn unsupported_format_is_named() {
        let gif = b"GIF89a\x01\x00\x01\x00\x00\x00\x00;";
        let err = decode_image(gif, DecodeLimits::default()).unwrap_err();
        assert!(
            err.to_string().starts_with("GIF images are not supported"),
            "{err}"
        );
    }

    #[test]
    fn truncated_files_are_malformed_not_panics() {
        for format in [
            ImageFormat::Png,
            ImageFormat::Jpeg,
            ImageFormat::WebP,
            ImageFormat::Bmp,
        ] {
            let bytes = encode(sample_rgb(64, 64), format);
            for cut in [bytes.len() / 2, 40, 12] {
                let err = decode_image(&bytes[..cut], DecodeLimits::default());
                assert!(
                    matches!(
                        err,
                        Err(DecodeError::Malformed { .. }) | Err(DecodeError::UnknownFormat)
                    ),
                    "{format:?} cut at {cut}: {err:?}"
                );
            }
        }
    }

    #[test]
    fn oversized_header_is_refused_before_decoding() {
        // A PNG header claiming 100000 x 100000 pixels, with no pixel data at all.
        let mut png = Vec::new();
        png.extend_from_slice(b"\x89PNG\r\n\x1a\n");
        // Only the header chunk follows: the refusal must come before any pixel data is read.
        let mut ihdr = Vec::new();
        ihdr.extend_from_slice(b"IHDR");
        ihdr.extend_from_slice(&100_000u32.to_be_bytes());
        ihdr.extend_from_slice(&100_000u32.to_be_bytes());
        ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);
        png.extend_from_slice(&13u32.to_be_bytes());
        png.extend_from_slice(&ihdr);
        png.extend_from_slice(&crc32(&ihdr).to_be_bytes());
        let err = decode_image(&png, DecodeLimits::default()).unwrap_err();
        assert_eq!(
            err,
            DecodeError::TooLarge {
                width: 100_000,
                height: 100_000,
                max_pixels: 50_000_000
            }
        );
        assert!(err.to_string().contains("100000x100000"));
    }

    #[test]
    fn limit_is_configurable() {
        let bytes = encode(sample_rgb(100, 100), ImageFormat::Png);
        let err = decode_image(&bytes, DecodeLimits { max_pixels: 9_999 }).unwrap_err();
        assert!(matches!(err, DecodeError::TooLarge { .. }));
        decode_image(&bytes, DecodeLimits { max_pixels: 10_000 }).unwrap();
    }

    #[test]
    fn exif_orientation_is_applied() {
        // A 4x2 JPEG tagged "rotate 90 CW" (orientation 6) must come out 2x4.
        let jpeg = encode(sample_rgb(4, 2), ImageFormat::Jpeg);
        let tagged = insert_exif_orientation(&jpeg, 6);
        let img = decode_image(&tagged, DecodeLimits::default()).unwrap();
        assert_eq!((img.width(), img.height()), (2, 4));
    }

    #[test]
    fn jpeg_reduction_keeps_at_least_the_letterboxed_size() {
        let fit = Some((640, 640));
        assert_eq!(jpeg_reduction(1280, 720, fit), 2, "exactly twice the size");
        assert_eq!(jpeg_reduction(1279, 720, fit), 1, "just under twice");
        assert_eq!(jpeg_reduction(810, 1080, fit), 1);
        assert_eq!(jpeg_reduction(1920, 1080, fit), 2);
        assert_eq!(jpeg_reduction(3840, 2160, fit), 4);
        assert_eq!(
            jpeg_reduction(20_000, 20_000, fit),
            8,
            "1/8 is the most libjpeg does"
        );
        assert_eq!(jpeg_reduction(1920, 1080, None), 1);
        assert_eq!(jpeg_reduction(320, 200, fit), 1, "never for upscaling");
    }

    fn smooth_jpeg(w: u32, h: u32) -> Vec<u8> {
        let img = DynamicImage::ImageRgb8(RgbImage::from_fn(w, h, |x, y| {
            image::Rgb([
                (x * 255 / w) as u8,
                (y * 255 / h) as u8,
                ((x + y) % 256) as u8 / 2,
            ])
        }));
        encode(img, ImageFormat::Jpeg)
    }

    #[test]
    fn large_jpegs_decode_at_reduced_scale_when_allowed() {
        let bytes = smooth_jpeg(1280, 720);
        let full = decode_image(&bytes, DecodeLimits::default()).unwrap();
        assert!(!full.is_reduced());
        let mut options = DecodeOptions {
            fit_within: Some((640, 640)),
            ..Default::default()
        };
        let half = decode_image_with(&bytes, DecodeLimits::default(), &mut options).unwrap();
        assert_eq!(half.size, (1280, 720), "boxes are reported in the full size");
        assert_eq!(half.rgb.dimensions(), (640, 360));
        assert!(half.is_reduced());
        // The letterbox from the half-size decode matches the one from the full decode
        // closely: the same geometry, pixels within a few levels on this smooth image.
        let mut canvas = crate::LetterboxCanvas::new();
        let (mut a, mut b) = (Vec::new(), Vec::new());
        let la = canvas.fill_into(crate::ImageView::from(&full.rgb), 640, 640, &mut a);
        let lb = canvas.fill_into_from(crate::ImageView::from(&half.rgb), (1280, 720), 640, 640, &mut b);
        assert_eq!(la, lb);
        let mean_diff: f64 = a
            .iter()
            .zip(&b)
            .map(|(&x, &y)| f64::from(x.abs_diff(y)))
            .sum::<f64>()
            / a.len() as f64;
        assert!(mean_diff < 1.5, "mean difference {mean_diff}");
    }

    #[test]
    fn reduced_scale_follows_the_exif_rotation() {
        let bytes = insert_exif_orientation(&smooth_jpeg(1280, 720), 6);
        let mut options = DecodeOptions {
            fit_within: Some((640, 640)),
            ..Default::default()
        };
        let img = decode_image_with(&bytes, DecodeLimits::default(), &mut options).unwrap();
        assert_eq!(img.size, (720, 1280));
        assert_eq!(img.rgb.dimensions(), (360, 640));
    }

    #[test]
    fn the_given_buffer_is_decoded_into() {
        let bytes = smooth_jpeg(64, 48);
        let buffer = Vec::with_capacity(64 * 48 * 3);
        let ptr = buffer.as_ptr();
        let mut options = DecodeOptions {
            buffer,
            ..Default::default()
        };
        let img = decode_image_with(&bytes, DecodeLimits::default(), &mut options).unwrap();
        assert_eq!(img.rgb.as_raw().as_ptr(), ptr);
        assert_eq!(img.rgb.dimensions(), (64, 48));
    }

    #[test]
    fn baseline_jpegs_are_recognised_and_others_are_not() {
        let limits = DecodeLimits::default();
        let jpeg = smooth_jpeg(64, 48);
        assert_eq!(
            baseline_jpeg(&jpeg, limits).unwrap(),
            Some(BaselineJpeg {
                width: 64,
                height: 48
            })
        );
        let png = encode(sample_rgb(8, 8), ImageFormat::Png);
        assert_eq!(baseline_jpeg(&png, limits).unwrap(), None, "not a JPEG");
        let rotated = insert_exif_orientation(&jpeg, 6);
        assert_eq!(baseline_jpeg(&rotated, limits).unwrap(), None, "rotated: CPU");
        // The same header bytes with the frame marked progressive (SOF2).
        let mut progressive = jpeg.clone();
        let at = progressive.windows(2).position(|w| w == [0xFF, 0xC0]).unwrap();
        progressive[at + 1] = 0xC2;
        assert_eq!(
            baseline_jpeg(&progressive, limits).unwrap(),
            None,
            "progressive: CPU"
        );
        assert!(matches!(
            baseline_jpeg(&jpeg[..jpeg.len() / 2], limits),
            Err(DecodeError::Malformed { .. })
        ));
        assert!(matches!(
            baseline_jpeg(&jpeg, DecodeLimits { max_pixels: 100 }),
            Err(DecodeError::TooLarge { .. })
        ));
        assert_eq!(
            baseline_jpeg(&[0xFF, 0xD8, 0xFF, 0xE0, 0x00], limits).unwrap(),
            None
        );
    }

    /// Inserts an APP1 EXIF segment holding only an orientation tag right after SOI.
    fn insert_exif_orientation(jpeg: &[u8], orientation: u16) -> Vec<u8> {
        let mut tiff = Vec::new();
        tiff.extend_from_slice(b"MM\x00\x2a\x00\x00\x00\x08"); // big-endian, IFD at 8
        tiff.extend_from_slice(&1u16.to_be_bytes()); // one entry
        tiff.extend_from_slice(&0x0112u16.to_be_bytes()); // Orientation
        tiff.extend_from_slice(&3u16.to_be_bytes()); // SHORT
        tiff.extend_from_slice(&1u32.to_be_bytes()); // count
        tiff.extend_from_slice(&orientation.to_be_bytes());
        tiff.extend_from_slice(&[0, 0]);
        tiff.extend_from_slice(&0u32.to_be_bytes()); // no next IFD
        let mut app1 = b"Exif\x00\x00".to_vec();
        app1.extend_from_slice(&tiff);
        let mut out = jpeg[..2].to_vec();
        out.extend_from_slice(&[0xFF, 0xE1]);
        out.extend_from_slice(&((app1.len() + 2) as u16).to_be_bytes());
        out.extend_from_slice(&app1);
        out.extend_from_slice(&jpeg[2..]);
        out
    }

    fn crc32(data: &[u8]) -> u32 {
        let mut crc = 0xFFFF_FFFFu32;
        for &b in data {
            crc ^= u32::from(b);
            for _ in 0..8 {
                crc = if crc & 1 != 0 {
                    (crc >> 1) ^ 0xEDB8_8320
                } else {
                    crc >> 1
                };
            }
        }
        !crc
    }
}
