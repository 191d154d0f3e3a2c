//! An uploaded image (JPEG, PNG, WebP, BMP, with EXIF orientation). The pixel limit is
//! small so that a header claiming a huge image is refused before any allocation, as the
//! server's limit does at full size.
#![no_main]

use libfuzzer_sys::fuzz_target;
use peregrine_vision::decode::{decode_image, DecodeLimits};

fuzz_target!(|data: &[u8]| {
    if let Ok(image) = decode_image(data, DecodeLimits { max_pixels: 1 << 20 }) {
        assert!(u64::from(image.width()) * u64::from(image.height()) <= 1 << 20);
    }
});
