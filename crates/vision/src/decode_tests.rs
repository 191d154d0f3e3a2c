//! Tests of `decode`: formats, limits, orientation, truncation, baseline JPEG checks.

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
        let img = decode_image(&bytes, DecodeLimits::default()).unwrap_or_else(|e| panic!("{format:?}: {e}"));
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
