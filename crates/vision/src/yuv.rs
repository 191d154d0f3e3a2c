//! YUV 4:2:0 to packed RGB8 exactly as the video pipeline's CPU path computes it: the
//! arithmetic of FFmpeg's x86 SIMD converter (`libswscale/x86/yuv_2_rgb.asm`), which
//! `sws_scale` runs for a same-size `yuv420p` -> `rgb24` conversion with the flags the
//! decoder uses on any x86-64 core with SSSE3 (MMXEXT before it: the same arithmetic).
//!
//! Why it exists: a GPU kernel converting NVDEC's NV12 surfaces must produce the bytes
//! the CPU path produces from the same decoded pixels, and this is that kernel's
//! reference (as [`crate::jpeg_planes`] is for JPEG), tested against `sws_scale` itself
//! in the video crate. The arithmetic, per pixel (16-bit lanes; `mulhi(a, b)` is
//! `(a * b) >> 16`; `+` saturates to 16 bits, the last step to 0..=255):
//!
//! ```text
//! y' = (Y << 3) - y_offset        u' = (U << 3) - 1024        v' = (V << 3) - 1024
//! R = mulhi(y', cy) + mulhi(v', crv)
//! G = mulhi(y', cy) + (mulhi(u', cgu) + mulhi(v', cgv))
//! B = mulhi(y', cy) + mulhi(u', cbu)
//! ```
//!
//! with swscale's coefficients (`ff_yuv2rgb_c_init_tables` at neutral brightness,
//! contrast and saturation) rounded to 16 bits at a scale of 2^13. Chroma is not
//! interpolated: pixel (x, y) takes the chroma sample (x / 2, y / 2).
//! What it does not cover: odd heights (swscale then takes its generic scaler), other
//! architectures' converters (NEON and the C tables round differently), 4:2:2 and 4:4:4.

/// FFmpeg's `ff_yuv2rgb_coeffs`: per colour matrix (`SWS_CS_*`, the same numbers as
/// `AVColorSpace`), the inverse matrix's `crv, cbu, -cgu, -cgv` at a scale of 2^16.
const SWS_COEFFICIENTS: [[i64; 4]; 11] = [
    [117489, 138438, 13975, 34925], // no sequence_display_extension
    [117489, 138438, 13975, 34925], // ITU-R Rec. 709 (1990)
    [104597, 132201, 25675, 53279], // unspecified
    [104597, 132201, 25675, 53279], // reserved
    [104448, 132798, 24759, 53109], // FCC
    [104597, 132201, 25675, 53279], // ITU-R Rec. 624-4 System B, G
    [104597, 132201, 25675, 53279], // SMPTE 170M
    [117579, 136230, 16907, 35559], // SMPTE 240M (1987)
    [0, 0, 0, 0],                   // YCgCo: not a matrix this converter applies
    [110013, 140363, 12277, 42626], // BT.2020 NCL
    [110013, 140363, 12277, 42626], // BT.2020 CL
];

/// `SWS_CS_DEFAULT` (BT.601), what `sws_getCoefficients` gives for an unknown number.
const SWS_CS_DEFAULT: usize = 5;
const SWS_CS_YCGCO: usize = 8;

/// swscale's `roundToInt16`: a 16.16 value rounded to a 16-bit integer, saturated.
fn round_to_i16(f: i64) -> i16 {
    let r = (f + (1 << 15)) >> 16;
    r.clamp(-0x8000, 0x7FFF) as i16
}

/// One conversion's coefficients, as the SIMD converter holds them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct YuvToRgb {
    pub y_offset: i16,
    pub y_coeff: i16,
    pub vr_coeff: i16,
    pub ub_coeff: i16,
    pub ug_coeff: i16,
    pub vg_coeff: i16,
}

/// The chroma offset of 128, at the converter's scale of 8.
const UV_OFFSET: i16 = 128 << 3;

fn mulhi(a: i16, b: i16) -> i16 {
    ((i32::from(a) * i32::from(b)) >> 16) as i16
}

impl YuvToRgb {
    /// The conversion `sws_setColorspaceDetails` sets up for colour matrix
    /// `sws_colorspace` (an `SWS_CS_*` / `AVColorSpace` number; unknown numbers get BT.601,
    /// as `sws_getCoefficients` gives them) and limited (`false`) or full (`true`) range
    /// input, to full-range RGB. `None` for YCgCo, which is no matrix of this kind.
    pub fn new(sws_colorspace: i32, full_range: bool) -> Option<Self> {
        let index = usize::try_from(sws_colorspace)
            .ok()
            .filter(|&i| i > 0 && i < SWS_COEFFICIENTS.len())
            .unwrap_or(SWS_CS_DEFAULT);
        if index == SWS_CS_YCGCO {
            return None;
        }
        let [crv, cbu, cgu, cgv] = SWS_COEFFICIENTS[index];
        let (mut crv, mut cbu, mut cgu, mut cgv) = (crv, cbu, -cgu, -cgv);
        let mut cy: i64 = 1 << 16;
        let mut oy: i64 = 0;
        if full_range {
            // C's division truncates towards zero, as Rust's does.
            crv = crv * 224 / 255;
            cbu = cbu * 224 / 255;
            cgu = cgu * 224 / 255;
            cgv = cgv * 224 / 255;
        } else {
            cy = cy * 255 / 219;
            oy = 16 << 16;
        }
        // Neutral contrast and saturation (1 << 16 each) leave the coefficients as they are.
        Some(Self {
            y_offset: round_to_i16(oy * (1 << 3)),
            y_coeff: round_to_i16(cy * (1 << 13)),
            vr_coeff: round_to_i16(crv * (1 << 13)),
            ub_coeff: round_to_i16(cbu * (1 << 13)),
            ug_coeff: round_to_i16(cgu * (1 << 13)),
            vg_coeff: round_to_i16(cgv * (1 << 13)),
        })
    }

    /// One pixel's RGB from its luma and its block's chroma.
    #[inline]
    pub fn rgb(&self, y: u8, u: u8, v: u8) -> [u8; 3] {
        let y = (i16::from(y) << 3).wrapping_sub(self.y_offset);
        let u = (i16::from(u) << 3).saturating_sub(UV_OFFSET);
        let v = (i16::from(v) << 3).saturating_sub(UV_OFFSET);
        let luma = mulhi(y, self.y_coeff);
        let green = mulhi(u, self.ug_coeff).saturating_add(mulhi(v, self.vg_coeff));
        let pack = |x: i16| x.clamp(0, 255) as u8;
        [
            pack(luma.saturating_add(mulhi(v, self.vr_coeff))),
            pack(luma.saturating_add(green)),
            pack(luma.saturating_add(mulhi(u, self.ub_coeff))),
        ]
    }

    /// Converts a 4:2:0 picture (planes with their strides; chroma planes of
    /// `width.div_ceil(2)` x `height.div_ceil(2)` samples) into packed RGB8 rows of
    /// `out_stride` bytes.
    ///
    /// # Panics
    /// If a plane or `out` is too small for the size given.
    pub fn convert_420(
        &self,
        planes: Planes420<'_>,
        width: usize,
        height: usize,
        out: &mut [u8],
        out_stride: usize,
    ) {
        let chroma_w = width.div_ceil(2);
        assert!(out_stride >= width * 3, "an RGB row needs {} bytes", width * 3);
        for row in 0..height {
            let luma = &planes.y[row * planes.y_stride..][..width];
            let crow = row / 2;
            let u = &planes.u[crow * planes.u_stride..][..chroma_w];
            let v = &planes.v[crow * planes.v_stride..][..chroma_w];
            let rgb = &mut out[row * out_stride..][..width * 3];
            for (x, (px, &y)) in rgb.chunks_exact_mut(3).zip(luma).enumerate() {
                px.copy_from_slice(&self.rgb(y, u[x / 2], v[x / 2]));
            }
        }
    }
}

impl YuvToRgb {
    /// [`YuvToRgb::convert_420`] for NV12, whose chroma is one plane of interleaved U,V
    /// pairs (`width.div_ceil(2)` pairs a row): the same bytes as splitting the chroma into
    /// planes first, which is what the CPU path does with an NVDEC surface before swscale.
    /// This is the GPU kernel `nv12_to_rgb`'s reference, line for line.
    ///
    /// # Panics
    /// If a plane or `out` is too small for the size given.
    pub fn convert_nv12(
        &self,
        planes: Nv12Planes<'_>,
        width: usize,
        height: usize,
        out: &mut [u8],
        out_stride: usize,
    ) {
        let chroma_w = width.div_ceil(2);
        assert!(out_stride >= width * 3, "an RGB row needs {} bytes", width * 3);
        for row in 0..height {
            let luma = &planes.y[row * planes.y_stride..][..width];
            let uv = &planes.uv[(row / 2) * planes.uv_stride..][..chroma_w * 2];
            let rgb = &mut out[row * out_stride..][..width * 3];
            for (x, (px, &y)) in rgb.chunks_exact_mut(3).zip(luma).enumerate() {
                let pair = &uv[(x / 2) * 2..][..2];
                px.copy_from_slice(&self.rgb(y, pair[0], pair[1]));
            }
        }
    }

    /// The six coefficients in the order the GPU kernel takes them: `y_offset, y_coeff,
    /// vr_coeff, ub_coeff, ug_coeff, vg_coeff`.
    pub fn kernel_coefficients(&self) -> [i32; 6] {
        [
            self.y_offset,
            self.y_coeff,
            self.vr_coeff,
            self.ub_coeff,
            self.ug_coeff,
            self.vg_coeff,
        ]
        .map(i32::from)
    }
}

/// An NV12 picture: a luma plane and a plane of interleaved U,V pairs, with their strides
/// in bytes.
#[derive(Debug, Clone, Copy)]
pub struct Nv12Planes<'a> {
    pub y: &'a [u8],
    pub y_stride: usize,
    pub uv: &'a [u8],
    pub uv_stride: usize,
}

/// An 8-bit NV12 picture in a GPU's memory (an NVDEC surface), described for a kernel that
/// converts and letterboxes it there: device addresses, strides in bytes, and the colour
/// conversion the CPU path would apply to the same picture. Plain data: whoever hands one
/// out keeps the memory alive and unchanged until the consumer is done with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Nv12Image {
    /// CUDA's device number.
    pub device: i32,
    pub width: usize,
    pub height: usize,
    pub luma: u64,
    pub luma_pitch: usize,
    pub chroma: u64,
    pub chroma_pitch: usize,
    pub conversion: YuvToRgb,
}

impl Nv12Image {
    /// Why the planes as described cannot be an NV12 picture of this size: zero size,
    /// null addresses, or rows shorter than the picture's.
    pub fn check(&self) -> Result<(), String> {
        let (w, h) = (self.width, self.height);
        if w == 0 || h == 0 {
            return Err(format!("an NV12 picture of {w}x{h} has no pixels"));
        }
        if self.luma == 0 || self.chroma == 0 {
            return Err("an NV12 picture's planes have no address".into());
        }
        if self.luma_pitch < w || self.chroma_pitch < w.div_ceil(2) * 2 {
            return Err(format!(
                "NV12 rows of {} (luma) and {} (chroma) bytes are too short for a width of {w}",
                self.luma_pitch, self.chroma_pitch
            ));
        }
        Ok(())
    }
}

/// The three planes of a 4:2:0 picture and their strides in bytes.
#[derive(Debug, Clone, Copy)]
pub struct Planes420<'a> {
    pub y: &'a [u8],
    pub y_stride: usize,
    pub u: &'a [u8],
    pub u_stride: usize,
    pub v: &'a [u8],
    pub v_stride: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coefficients_are_swscales_for_bt601_limited_range() {
        // cy = 65536 * 255 / 219 = 76309; * 2^13 rounded to 16 bits: 9539.
        let c = YuvToRgb::new(5, false).unwrap();
        assert_eq!(c.y_offset, 128);
        assert_eq!(c.y_coeff, 9539);
        assert_eq!(c.vr_coeff, 13075); // 104597 / 8, rounded
        assert_eq!(c.ub_coeff, 16525); // 132201 / 8
        assert_eq!(c.ug_coeff, -3209); // -25675 / 8
        assert_eq!(c.vg_coeff, -6660); // -53279 / 8
    }

    #[test]
    fn unknown_matrices_are_bt601_and_ycgco_is_refused() {
        assert_eq!(YuvToRgb::new(2, false), YuvToRgb::new(5, false));
        assert_eq!(YuvToRgb::new(0, true), YuvToRgb::new(5, true));
        assert_eq!(YuvToRgb::new(99, false), YuvToRgb::new(5, false));
        assert_eq!(YuvToRgb::new(8, false), None);
        assert_ne!(YuvToRgb::new(1, false), YuvToRgb::new(5, false));
    }

    #[test]
    fn limited_range_black_white_and_grey() {
        let c = YuvToRgb::new(1, false).unwrap();
        assert_eq!(c.rgb(16, 128, 128), [0, 0, 0]);
        assert_eq!(c.rgb(235, 128, 128), [255, 255, 255]);
        let [r, g, b] = c.rgb(126, 128, 128);
        assert!(r == g && g == b && (127..=128).contains(&r));
        // Saturated chroma clips rather than wrapping.
        assert_eq!(c.rgb(235, 255, 255)[0], 255);
        assert_eq!(c.rgb(16, 0, 0)[0], 0);
    }

    /// Deterministic noise, so every chroma pair and luma value is exercised.
    fn noise(len: usize, seed: u32) -> Vec<u8> {
        let mut state = seed.wrapping_mul(2_654_435_761).max(1);
        (0..len)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 17;
                state ^= state << 5;
                (state >> 24) as u8
            })
            .collect()
    }

    #[test]
    fn nv12_converts_as_the_same_chroma_split_into_planes() {
        for (w, h, matrix, full) in [
            (6usize, 4usize, 1, false),
            (7, 6, 5, true),
            (33, 10, 9, false),
            (2, 2, 5, false),
        ] {
            let c = YuvToRgb::new(matrix, full).unwrap();
            let (cw, ch) = (w.div_ceil(2), h.div_ceil(2));
            let (y_stride, uv_stride) = (w + 5, cw * 2 + 3);
            let y = noise(y_stride * h, w as u32);
            let uv = noise(uv_stride * ch, h as u32 + 7);
            let mut u = vec![0u8; cw * ch];
            let mut v = vec![0u8; cw * ch];
            for row in 0..ch {
                for col in 0..cw {
                    u[row * cw + col] = uv[row * uv_stride + 2 * col];
                    v[row * cw + col] = uv[row * uv_stride + 2 * col + 1];
                }
            }
            let stride = w * 3 + 1;
            let (mut planar, mut interleaved) = (vec![0u8; stride * h], vec![0u8; stride * h]);
            let planes = Planes420 {
                y: &y,
                y_stride,
                u: &u,
                u_stride: cw,
                v: &v,
                v_stride: cw,
            };
            c.convert_420(planes, w, h, &mut planar, stride);
            let nv12 = Nv12Planes {
                y: &y,
                y_stride,
                uv: &uv,
                uv_stride,
            };
            c.convert_nv12(nv12, w, h, &mut interleaved, stride);
            assert_eq!(planar, interleaved, "{w}x{h}, matrix {matrix}, full range {full}");
            assert!(planar.iter().any(|&b| b != 0), "something was written");
        }
    }

    #[test]
    fn kernel_coefficients_keep_their_order() {
        let c = YuvToRgb::new(5, false).unwrap();
        assert_eq!(c.kernel_coefficients(), [128, 9539, 13075, 16525, -3209, -6660]);
    }

    #[test]
    fn nv12_images_are_checked() {
        let image = Nv12Image {
            device: 0,
            width: 1919,
            height: 1080,
            luma: 0x1000,
            luma_pitch: 2048,
            chroma: 0x2000,
            chroma_pitch: 1920,
            conversion: YuvToRgb::new(1, false).unwrap(),
        };
        assert_eq!(image.check(), Ok(()));
        let short = Nv12Image {
            chroma_pitch: 1918,
            ..image
        };
        assert!(short.check().unwrap_err().contains("too short"));
        assert!(Nv12Image { luma: 0, ..image }.check().is_err());
        assert!(Nv12Image { height: 0, ..image }.check().is_err());
    }

    #[test]
    fn each_pixel_takes_its_blocks_chroma() {
        let c = YuvToRgb::new(5, true).unwrap();
        let (w, h) = (3, 3);
        let y = [100u8; 9];
        let u = [60u8, 200, 90, 30];
        let v = [128u8, 128, 250, 10];
        let mut out = vec![0u8; 12 * h];
        let planes = Planes420 {
            y: &y,
            y_stride: 3,
            u: &u,
            u_stride: 2,
            v: &v,
            v_stride: 2,
        };
        c.convert_420(planes, w, h, &mut out, 12);
        for (row, col) in [(0, 0), (1, 1), (0, 2), (2, 0), (2, 2)] {
            let k = (row / 2) * 2 + col / 2;
            assert_eq!(
                out[row * 12 + col * 3..][..3],
                c.rgb(100, u[k], v[k]),
                "pixel {row},{col}"
            );
        }
        assert_eq!(out[9..12], [0, 0, 0], "the row's padding is not written");
    }
}
