//! Canvas bytes to the model's input: planar (NCHW) float32 in `[0, 1]`.

/// Writes `pixels` (interleaved RGB8, `width * height` pixels) as three planes of
/// `value / 255` into `out`, which must hold exactly `3 * width * height` floats: one
/// image's slot in a batch buffer.
///
/// # Panics
/// If the lengths disagree; callers size the slot from the same canvas.
#[multiversion::multiversion(targets("x86_64+avx2+fma", "x86_64+sse4.1"))]
pub fn rgb8_to_planar_f32(pixels: &[u8], out: &mut [f32]) {
    let n = pixels.len() / 3;
    assert_eq!(pixels.len(), n * 3, "pixel buffer is not whole RGB triples");
    assert_eq!(out.len(), n * 3, "output slot does not match the canvas size");
    let (r, rest) = out.split_at_mut(n);
    let (g, b) = rest.split_at_mut(n);
    let (r, g, b) = (&mut r[..n], &mut g[..n], &mut b[..n]);
    let pixels = &pixels[..n * 3];
    const SCALE: f32 = 1.0 / 255.0;
    // Plain indexing over slices of known length: LLVM turns this into vector code with
    // stride-3 interleaved loads, which the iterator-zip form defeated.
    for i in 0..n {
        r[i] = f32::from(pixels[3 * i]) * SCALE;
        g[i] = f32::from(pixels[3 * i + 1]) * SCALE;
        b[i] = f32::from(pixels[3 * i + 2]) * SCALE;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_channels_into_planes() {
        let pixels = [0, 51, 255, 255, 102, 0];
        let mut out = [9.0f32; 6];
        rgb8_to_planar_f32(&pixels, &mut out);
        let expect = [0.0, 1.0, 0.2, 0.4, 1.0, 0.0];
        for (a, e) in out.iter().zip(expect) {
            assert!((a - e).abs() < 1e-6, "{out:?}");
        }
    }

    #[test]
    #[should_panic(expected = "output slot")]
    fn mismatched_slot_panics() {
        rgb8_to_planar_f32(&[1, 2, 3], &mut [0.0; 4]);
    }
}
