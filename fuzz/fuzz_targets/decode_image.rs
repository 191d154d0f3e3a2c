//! An uploaded image (JPEG, PNG, WebP, BMP, with EXIF orientation). The pixel limit is
//! small so that a header claiming a huge image is refused before any allocation, as the
//! server's limit does at full size.
#![no_main]

use libfuzzer_sys::fuzz_target;
use peregrine_vision::decode::{baseline_jpeg, decode_image, DecodeLimits};

fuzz_target!(|data: &[u8]| {
    let limits = DecodeLimits { max_pixels: 1 << 20 };
    if let Ok(image) = decode_image(data, limits) {
        assert!(u64::from(image.width()) * u64::from(image.height()) <= 1 << 20);
    }
    // The header check that sends JPEGs to the GPU decoder walks the marker segments itself.
    if let Ok(Some(jpeg)) = baseline_jpeg(data, limits) {
        assert!(u64::from(jpeg.width) * u64::from(jpeg.height) <= 1 << 20);
    }
});
