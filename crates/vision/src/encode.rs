//! RGB pixels to JPEG bytes, with libjpeg-turbo (the same library that decodes), for
//! snapshots and live views.

/// Why pixels could not be encoded.
#[derive(Debug, thiserror::Error)]
pub enum EncodeError {
    #[error("{width}x{height} pixels with {stride} bytes per row do not fit in {len} bytes")]
    Geometry {
        width: u32,
        height: u32,
        stride: usize,
        len: usize,
    },
    #[error("JPEG encoding failed: {0}")]
    Jpeg(#[from] turbojpeg::Error),
}

/// Encodes `height` rows of `stride` bytes, each starting with `width` packed RGB8 pixels,
/// as a baseline 4:2:0 JPEG of `quality` (1–100).
pub fn jpeg(
    pixels: &[u8],
    width: u32,
    height: u32,
    stride: usize,
    quality: u8,
) -> Result<Vec<u8>, EncodeError> {
    let geometry = EncodeError::Geometry {
        width,
        height,
        stride,
        len: pixels.len(),
    };
    let row = width as usize * 3;
    let needed = match height as usize {
        0 => 0,
        h => (h - 1) * stride + row,
    };
    if width == 0 || height == 0 || stride < row || pixels.len() < needed {
        return Err(geometry);
    }
    let image = turbojpeg::Image {
        pixels: &pixels[..needed],
        width: width as usize,
        pitch: stride,
        height: height as usize,
        format: turbojpeg::PixelFormat::RGB,
    };
    let out = turbojpeg::compress(
        image,
        i32::from(quality.clamp(1, 100)),
        turbojpeg::Subsamp::Sub2x2,
    )?;
    Ok(out.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_padded_rows_and_decodes_back_to_the_same_picture() {
        let (w, h, stride) = (32u32, 16u32, 128usize);
        let mut pixels = vec![0u8; stride * h as usize];
        for y in 0..h as usize {
            for x in 0..w as usize {
                // Left half red, right half blue; the row padding is noise.
                let px = if x < 16 { [200, 20, 20] } else { [20, 20, 200] };
                pixels[y * stride + x * 3..][..3].copy_from_slice(&px);
            }
            pixels[y * stride + 96..(y + 1) * stride].fill(77);
        }
        let bytes = jpeg(&pixels, w, h, stride, 90).unwrap();
        let back = crate::decode::decode_image(&bytes, Default::default()).unwrap();
        assert_eq!((back.width(), back.height()), (w, h));
        let at = |x: u32, y: u32| back.rgb.get_pixel(x, y).0;
        assert!(
            at(4, 8)[0] > 150 && at(4, 8)[2] < 70,
            "left stays red: {:?}",
            at(4, 8)
        );
        assert!(
            at(28, 8)[2] > 150 && at(28, 8)[0] < 70,
            "right stays blue: {:?}",
            at(28, 8)
        );
    }

    #[test]
    fn refuses_a_buffer_too_small_for_its_geometry() {
        let err = jpeg(&[0; 100], 10, 10, 30, 80).unwrap_err();
        assert!(err.to_string().contains("10x10 pixels"), "{err}");
        assert!(
            jpeg(&[0; 300], 10, 10, 20, 80).is_err(),
            "stride shorter than a row"
        );
    }
}
