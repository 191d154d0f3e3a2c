//! A JPEG's decoded component planes (Y, Cb, Cr at their own resolutions) to RGB, with
//! libjpeg-turbo's exact integer arithmetic: its "fancy" (triangular) chroma upsampling
//! (jdsample.c) and its fixed-point YCbCr->RGB tables (jdcolor.c).
//!
//! This is what turns a GPU decoder's planar output into the pixels the CPU path (and so
//! OpenCV and Ultralytics) would have produced from the same planes: the GPU letterbox kernel
//! does the same arithmetic per pixel, from the tables [`YccToRgb::tables`] gives it, and
//! [`planes_to_rgb`] is its reference, checked here against libjpeg-turbo's own decode.
//! Only the layouts the GPU path takes are covered ([`ChromaSubsampling`]); others (4:1:1,
//! 4:1:0, unusual sampling factors) are decoded on the CPU.

/// How a JPEG's chroma planes are subsampled relative to its luma plane, for the layouts
/// whose upsampling is reproduced here: chroma factors 1x1 and luma factors 1 or 2 each way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChromaSubsampling {
    /// One component: R = G = B = Y.
    Gray,
    /// 4:4:4, chroma at full resolution.
    None,
    /// 4:2:2, half the columns.
    Half,
    /// 4:2:0, half the columns and half the rows.
    Quarter,
    /// 4:4:0, half the rows.
    HalfRows,
}

impl ChromaSubsampling {
    /// The layout of a JPEG whose luma component has sampling factors `luma` (horizontal,
    /// vertical) and whose two chroma components have `chroma` each; `None` for layouts
    /// this module does not reproduce.
    pub fn from_factors(luma: (u8, u8), chroma: [(u8, u8); 2]) -> Option<Self> {
        if chroma != [(1, 1), (1, 1)] {
            return None;
        }
        match luma {
            (1, 1) => Some(Self::None),
            (2, 1) => Some(Self::Half),
            (2, 2) => Some(Self::Quarter),
            (1, 2) => Some(Self::HalfRows),
            _ => None,
        }
    }

    /// How many luma columns and rows share one chroma sample (1 or 2 each).
    pub fn factors(self) -> (usize, usize) {
        match self {
            Self::Gray | Self::None => (1, 1),
            Self::Half => (2, 1),
            Self::Quarter => (2, 2),
            Self::HalfRows => (1, 2),
        }
    }

    /// The size of each chroma plane of a `width` x `height` image (libjpeg's
    /// `downsampled_width` and `downsampled_height`); (0, 0) for gray.
    pub fn chroma_size(self, width: usize, height: usize) -> (usize, usize) {
        if self == Self::Gray {
            return (0, 0);
        }
        let (h, v) = self.factors();
        (width.div_ceil(h), height.div_ceil(v))
    }
}

/// libjpeg-turbo's YCbCr->RGB conversion (jdcolor.c, `build_ycc_rgb_table`): four tables
/// indexed by the chroma sample, in 16-bit fixed point.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct YccToRgb {
    cr_r: [i32; 256],
    cb_b: [i32; 256],
    cr_g: [i32; 256],
    cb_g: [i32; 256],
}

const SCALEBITS: i32 = 16;
const ONE_HALF: i32 = 1 << (SCALEBITS - 1);

/// jdcolor.c's `FIX(x)`: `x` in 16-bit fixed point, rounded.
fn fix(x: f64) -> i32 {
    (x * f64::from(1 << SCALEBITS) + 0.5) as i32
}

impl Default for YccToRgb {
    fn default() -> Self {
        Self::new()
    }
}

impl YccToRgb {
    pub fn new() -> Self {
        let mut t = Self {
            cr_r: [0; 256],
            cb_b: [0; 256],
            cr_g: [0; 256],
            cb_g: [0; 256],
        };
        for i in 0..256 {
            // The chroma value centred on zero; `>>` on i32 is arithmetic, as RIGHT_SHIFT.
            let x = i as i32 - 128;
            t.cr_r[i] = (fix(1.40200) * x + ONE_HALF) >> SCALEBITS;
            t.cb_b[i] = (fix(1.77200) * x + ONE_HALF) >> SCALEBITS;
            t.cr_g[i] = -fix(0.71414) * x;
            // ONE_HALF is folded in here so the per-pixel sum needs no rounding term.
            t.cb_g[i] = -fix(0.34414) * x + ONE_HALF;
        }
        t
    }

    /// The tables one after another (Cr->R, Cb->B, Cr->G, Cb->G), as the GPU kernel reads
    /// them.
    pub fn tables(&self) -> Vec<i32> {
        [self.cr_r, self.cb_b, self.cr_g, self.cb_g].concat()
    }

    /// One pixel, as `ycc_rgb_convert` computes it (range-limited to 0..=255).
    pub fn rgb(&self, y: u8, cb: u8, cr: u8) -> [u8; 3] {
        let (y, cb, cr) = (i32::from(y), usize::from(cb), usize::from(cr));
        let limit = |v: i32| v.clamp(0, 255) as u8;
        [
            limit(y + self.cr_r[cr]),
            limit(y + ((self.cb_g[cb] + self.cr_g[cr]) >> SCALEBITS)),
            limit(y + self.cb_b[cb]),
        ]
    }
}

/// One chroma plane: `width` x `height` samples, rows `pitch` bytes apart.
#[derive(Debug, Clone, Copy)]
pub struct Plane<'a> {
    pub data: &'a [u8],
    pub width: usize,
    pub height: usize,
    pub pitch: usize,
}

impl Plane<'_> {
    fn at(&self, x: usize, y: usize) -> i32 {
        i32::from(self.data[y * self.pitch + x])
    }

    /// The chroma sample libjpeg-turbo's upsampler gives full-resolution pixel (`x`, `y`):
    /// `h2v1_fancy_upsample`, `h1v2_fancy_upsample` and `h2v2_fancy_upsample` (jdsample.c),
    /// whose edge cases all amount to repeating the edge sample; plain replication where
    /// libjpeg-turbo uses it (2:1 horizontally with a plane of at most 2 columns). The GPU
    /// kernel's `upsampled` is this, line for line.
    pub fn upsampled(&self, subsampling: ChromaSubsampling, x: usize, y: usize) -> u8 {
        let (h, v) = subsampling.factors();
        let (cx, cy) = (x / h, y / v);
        let fancy = self.width > 2;
        // The neighbour a half sample away: left or above for even pixels, else right or below.
        let nx = if x % 2 == 1 {
            (cx + 1).min(self.width - 1)
        } else {
            cx.saturating_sub(1)
        };
        let ny = if y % 2 == 1 {
            (cy + 1).min(self.height - 1)
        } else {
            cy.saturating_sub(1)
        };
        let value = match subsampling {
            ChromaSubsampling::Gray | ChromaSubsampling::None => self.at(x, y),
            ChromaSubsampling::Half if !fancy => self.at(cx, cy),
            ChromaSubsampling::Half => {
                let bias = if x % 2 == 1 { 2 } else { 1 };
                (3 * self.at(cx, cy) + self.at(nx, cy) + bias) >> 2
            }
            ChromaSubsampling::HalfRows => {
                let bias = if y % 2 == 1 { 2 } else { 1 };
                (3 * self.at(cx, cy) + self.at(cx, ny) + bias) >> 2
            }
            ChromaSubsampling::Quarter if !fancy => self.at(cx, cy),
            ChromaSubsampling::Quarter => {
                let near = 3 * self.at(cx, cy) + self.at(cx, ny);
                let far = 3 * self.at(nx, cy) + self.at(nx, ny);
                let bias = if x % 2 == 1 { 7 } else { 8 };
                (3 * near + far + bias) >> 4
            }
        };
        value as u8
    }
}

/// A decoded JPEG's planes: luma at the image's size, and two chroma planes (unused for
/// gray).
#[derive(Debug, Clone, Copy)]
pub struct YccPlanes<'a> {
    pub width: usize,
    pub height: usize,
    pub subsampling: ChromaSubsampling,
    pub y: &'a [u8],
    pub y_pitch: usize,
    pub cb: Plane<'a>,
    pub cr: Plane<'a>,
}

/// A decoded JPEG's planes in buffers of their own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodedPlanes {
    pub width: usize,
    pub height: usize,
    pub subsampling: ChromaSubsampling,
    pub y: Vec<u8>,
    pub y_pitch: usize,
    /// Empty for gray.
    pub cb: Vec<u8>,
    pub cr: Vec<u8>,
    pub chroma_pitch: usize,
}

impl DecodedPlanes {
    /// libjpeg-turbo's planes of `jpeg`: its IDCT's output, before upsampling and colour
    /// conversion (`tj3DecompressToYUV8`). `None` for a layout [`ChromaSubsampling`] does not
    /// cover; an error for bytes libjpeg-turbo cannot decode.
    pub fn decode_with_libjpeg_turbo(jpeg: &[u8]) -> Result<Option<Self>, turbojpeg::Error> {
        use turbojpeg::Subsamp;
        let yuv = turbojpeg::decompress_to_yuv(jpeg)?;
        let subsampling = match yuv.subsamp {
            Subsamp::Gray => ChromaSubsampling::Gray,
            Subsamp::None => ChromaSubsampling::None,
            Subsamp::Sub2x1 => ChromaSubsampling::Half,
            Subsamp::Sub2x2 => ChromaSubsampling::Quarter,
            Subsamp::Sub1x2 => ChromaSubsampling::HalfRows,
            _ => return Ok(None),
        };
        let (y_pitch, y_rows) = yuv.y_size();
        let y_bytes = y_pitch * y_rows;
        let (chroma_pitch, chroma_rows) = if subsampling == ChromaSubsampling::Gray {
            (0, 0)
        } else {
            yuv.uv_size()
        };
        let chroma_bytes = chroma_pitch * chroma_rows;
        let pixels = &yuv.pixels;
        Ok(Some(Self {
            width: yuv.width,
            height: yuv.height,
            subsampling,
            y: pixels[..y_bytes].to_vec(),
            y_pitch,
            cb: pixels[y_bytes..y_bytes + chroma_bytes].to_vec(),
            cr: pixels[y_bytes + chroma_bytes..y_bytes + 2 * chroma_bytes].to_vec(),
            chroma_pitch,
        }))
    }

    pub fn view(&self) -> YccPlanes<'_> {
        let (width, height) = self.subsampling.chroma_size(self.width, self.height);
        let plane = |data| Plane {
            data,
            width,
            height,
            pitch: self.chroma_pitch,
        };
        YccPlanes {
            width: self.width,
            height: self.height,
            subsampling: self.subsampling,
            y: &self.y,
            y_pitch: self.y_pitch,
            cb: plane(&self.cb),
            cr: plane(&self.cr),
        }
    }
}

/// Converts `planes` to interleaved RGB (`width * 3` bytes a row) in `out`, as
/// libjpeg-turbo's decoder does after its IDCT.
pub fn planes_to_rgb(planes: &YccPlanes<'_>, colour: &YccToRgb, out: &mut Vec<u8>) {
    out.clear();
    out.reserve(planes.width * planes.height * 3);
    for y in 0..planes.height {
        for x in 0..planes.width {
            let luma = planes.y[y * planes.y_pitch + x];
            if planes.subsampling == ChromaSubsampling::Gray {
                out.extend_from_slice(&[luma; 3]);
                continue;
            }
            let cb = planes.cb.upsampled(planes.subsampling, x, y);
            let cr = planes.cr.upsampled(planes.subsampling, x, y);
            out.extend_from_slice(&colour.rgb(luma, cb, cr));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use turbojpeg::Subsamp;

    /// A busy picture: gradients, a hard edge and pseudo-random noise, so every upsampling
    /// branch and the colour tables' whole range are exercised.
    fn picture(width: usize, height: usize) -> Vec<u8> {
        let mut seed = 0x2545_f491_u32;
        let mut out = Vec::with_capacity(width * height * 3);
        for y in 0..height {
            for x in 0..width {
                seed ^= seed << 13;
                seed ^= seed >> 17;
                seed ^= seed << 5;
                let noise = (seed % 64) as usize;
                let edge = if x * 3 > width { 200 } else { 10 };
                out.push(((x * 255 / width.max(1)) + noise).min(255) as u8);
                out.push(((y * 255 / height.max(1)) ^ edge) as u8);
                out.push((edge + noise) as u8);
            }
        }
        out
    }

    fn encode(width: usize, height: usize, subsamp: Subsamp, quality: i32) -> Vec<u8> {
        let pixels = picture(width, height);
        let image = turbojpeg::Image {
            pixels: pixels.as_slice(),
            width,
            pitch: width * 3,
            height,
            format: turbojpeg::PixelFormat::RGB,
        };
        let mut compressor = turbojpeg::Compressor::new().unwrap();
        compressor.set_quality(quality).unwrap();
        compressor.set_subsamp(subsamp).unwrap();
        compressor.compress_to_vec(image).unwrap()
    }

    fn reference_rgb(jpeg: &[u8]) -> Vec<u8> {
        let planes = DecodedPlanes::decode_with_libjpeg_turbo(jpeg).unwrap().unwrap();
        if planes.subsampling != ChromaSubsampling::Gray {
            let (cw, ch) = planes.subsampling.chroma_size(planes.width, planes.height);
            assert!(cw <= planes.chroma_pitch, "chroma columns");
            assert_eq!(planes.cb.len(), planes.chroma_pitch * ch, "chroma rows");
        }
        let mut out = Vec::new();
        planes_to_rgb(&planes.view(), &YccToRgb::new(), &mut out);
        out
    }

    fn turbo_rgb(jpeg: &[u8]) -> Vec<u8> {
        turbojpeg::decompress(jpeg, turbojpeg::PixelFormat::RGB)
            .unwrap()
            .pixels
    }

    #[test]
    fn planes_convert_to_libjpeg_turbos_own_rgb_bit_for_bit() {
        // Odd sizes, sizes under one MCU, and plane widths at and around the fancy
        // upsampling threshold (more than 2 chroma columns).
        let sizes = [
            (1, 1),
            (2, 3),
            (3, 2),
            (4, 4),
            (5, 7),
            (6, 5),
            (17, 9),
            (33, 31),
            (64, 48),
            (101, 37),
        ];
        let layouts = [
            Subsamp::Gray,
            Subsamp::None,
            Subsamp::Sub2x1,
            Subsamp::Sub2x2,
            Subsamp::Sub1x2,
        ];
        for &(w, h) in &sizes {
            for &subsamp in &layouts {
                for quality in [50, 95] {
                    let jpeg = encode(w, h, subsamp, quality);
                    let expected = turbo_rgb(&jpeg);
                    let got = reference_rgb(&jpeg);
                    assert_eq!(got.len(), expected.len(), "{w}x{h} {subsamp:?} q{quality}");
                    let first = got.iter().zip(&expected).position(|(a, b)| a != b);
                    assert_eq!(
                        first,
                        None,
                        "{w}x{h} {subsamp:?} q{quality}: first differing byte (pixel {:?})",
                        first.map(|i| (i / 3 % w, i / 3 / w))
                    );
                }
            }
        }
    }

    #[test]
    fn colour_tables_are_jdcolors() {
        let t = YccToRgb::new();
        // Neutral chroma leaves luma alone, ONE_HALF folded into Cb->G included.
        assert_eq!(t.rgb(77, 128, 128), [77, 77, 77]);
        // Extremes: FIX(1.402) * 127 rounds to 178, FIX(1.772) * -128 to -227.
        assert_eq!(t.cr_r[255], 178);
        assert_eq!(t.cb_b[0], -227);
        // Green: (-FIX(0.34414) * 127 + ONE_HALF - FIX(0.71414) * 127) >> 16 = -134.
        assert_eq!(t.rgb(255, 255, 255), [255, 121, 255]);
        assert_eq!(t.rgb(0, 0, 0), [0, 135, 0]);
        let tables = t.tables();
        assert_eq!(tables.len(), 4 * 256);
        assert_eq!(tables[255], 178);
        assert_eq!(tables[256], -227);
        assert_eq!(tables[2 * 256 + 128], 0);
        assert_eq!(tables[3 * 256 + 128], ONE_HALF);
    }

    #[test]
    fn only_the_reproduced_layouts_are_recognised() {
        let c = [(1, 1), (1, 1)];
        assert_eq!(
            ChromaSubsampling::from_factors((2, 2), c),
            Some(ChromaSubsampling::Quarter)
        );
        assert_eq!(
            ChromaSubsampling::from_factors((2, 1), c),
            Some(ChromaSubsampling::Half)
        );
        assert_eq!(
            ChromaSubsampling::from_factors((1, 2), c),
            Some(ChromaSubsampling::HalfRows)
        );
        assert_eq!(
            ChromaSubsampling::from_factors((1, 1), c),
            Some(ChromaSubsampling::None)
        );
        assert_eq!(ChromaSubsampling::from_factors((4, 1), c), None, "4:1:1");
        assert_eq!(ChromaSubsampling::from_factors((4, 2), c), None, "4:1:0");
        assert_eq!(
            ChromaSubsampling::from_factors((2, 2), [(2, 1), (2, 1)]),
            None,
            "4:2:2 written with unusual factors"
        );
        assert_eq!(ChromaSubsampling::Quarter.chroma_size(33, 31), (17, 16));
        assert_eq!(ChromaSubsampling::HalfRows.chroma_size(33, 31), (33, 16));
        assert_eq!(ChromaSubsampling::Gray.chroma_size(33, 31), (0, 0));
    }
}
