//! Ultralytics-compatible letterbox: scale to fit, centre, pad with gray 114.
//!
//! Resampling follows OpenCV's `INTER_LINEAR` for 8-bit images (half-pixel centres, edge
//! clamping, 11-bit fixed-point weights, two passes with a cache of horizontally resampled
//! rows), because the reference pipeline uses `cv2.resize` and parity is measured against it.

use peregrine_types::BBox;

/// Borrowed interleaved RGB8 pixels.
#[derive(Debug, Clone, Copy)]
pub struct ImageView<'a> {
    pub data: &'a [u8],
    pub width: usize,
    pub height: usize,
    /// Bytes from one row to the next (at least `width * 3`).
    pub stride: usize,
}

impl<'a> ImageView<'a> {
    /// A tightly packed view; `None` if `data` is shorter than `width * height * 3`.
    pub fn packed(data: &'a [u8], width: usize, height: usize) -> Option<Self> {
        (data.len() >= width * height * 3).then_some(Self {
            data,
            width,
            height,
            stride: width * 3,
        })
    }

    fn row(&self, y: usize) -> &'a [u8] {
        &self.data[y * self.stride..y * self.stride + self.width * 3]
    }
}

impl<'a> From<&'a image::RgbImage> for ImageView<'a> {
    fn from(img: &'a image::RgbImage) -> Self {
        let (w, h) = (img.width() as usize, img.height() as usize);
        Self {
            data: img.as_raw(),
            width: w,
            height: h,
            stride: w * 3,
        }
    }
}

/// Where an image landed inside the model input, and how to map boxes back.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Letterbox {
    pub src_width: usize,
    pub src_height: usize,
    pub dst_width: usize,
    pub dst_height: usize,
    /// Size of the scaled image inside the canvas.
    pub scaled_width: usize,
    pub scaled_height: usize,
    /// Padding before the scaled image.
    pub left: usize,
    pub top: usize,
    /// Scale factor from original pixels to model pixels.
    pub gain: f64,
}

/// Python's `round` (half to even), which the reference pipeline's geometry uses.
fn py_round(x: f64) -> f64 {
    x.round_ties_even()
}

impl Letterbox {
    pub const PAD_VALUE: u8 = 114;

    /// The geometry for fitting `src` into `dst`, as Ultralytics' `LetterBox(auto=False,
    /// scaleup=True, center=True)` computes it.
    pub fn new(src_width: usize, src_height: usize, dst_width: usize, dst_height: usize) -> Self {
        let gain = (dst_height as f64 / src_height as f64).min(dst_width as f64 / src_width as f64);
        let scaled_width = (py_round(src_width as f64 * gain) as usize).clamp(1, dst_width);
        let scaled_height = (py_round(src_height as f64 * gain) as usize).clamp(1, dst_height);
        let dw = (dst_width - scaled_width) as f64 / 2.0;
        let dh = (dst_height - scaled_height) as f64 / 2.0;
        let left = py_round(dw - 0.1).max(0.0) as usize;
        let top = py_round(dh - 0.1).max(0.0) as usize;
        Self {
            src_width,
            src_height,
            dst_width,
            dst_height,
            scaled_width,
            scaled_height,
            left,
            top,
            gain,
        }
    }

    /// Maps a box from model-input pixels back to original pixels, clipped to the image,
    /// as Ultralytics' `scale_boxes` does.
    pub fn to_original(&self, b: &BBox) -> BBox {
        let pad_x = py_round((self.dst_width as f64 - self.src_width as f64 * self.gain) / 2.0 - 0.1);
        let pad_y = py_round((self.dst_height as f64 - self.src_height as f64 * self.gain) / 2.0 - 0.1);
        let inv = 1.0 / self.gain;
        let map_x = |x: f32| ((f64::from(x) - pad_x) * inv) as f32;
        let map_y = |y: f32| ((f64::from(y) - pad_y) * inv) as f32;
        BBox::new(map_x(b.x1), map_y(b.y1), map_x(b.x2), map_y(b.y2))
            .clipped(self.src_width as f32, self.src_height as f32)
    }
}

const COEF_BITS: u32 = 11;
const COEF_SCALE: f32 = (1 << COEF_BITS) as f32;

/// Blends two horizontally resampled values with vertical weights, the way OpenCV's
/// vectorised 8-bit path does (`VResizeLinearVec_32s8u`): the rows arrive already shifted
/// right by 4 (see [`LetterboxCanvas::ensure_row`]), then a 16-bit multiply-high per row and
/// a rounding shift by 2. Its rounding differs from the exact `(a*b0 + b*b1 + 2^21) >> 22`
/// by one level at times, and parity wants OpenCV's.
#[inline(always)]
fn vertical_blend(a: i16, b: i16, b0: i32, b1: i32) -> u8 {
    let t0 = (i32::from(a) * b0) >> 16;
    let t1 = (i32::from(b) * b1) >> 16;
    ((t0 + t1 + 2) >> 2).clamp(0, 255) as u8
}

/// One output row from two resampled source rows; a loop over equal-length slices that
/// vectorises, with an AVX2 version chosen at run time where the CPU has it.
#[multiversion::multiversion(targets("x86_64+avx2+fma", "x86_64+sse4.1"))]
fn blend_rows(out: &mut [u8], r0: &[i16], r1: &[i16], b0: i32, b1: i32) {
    let n = out.len();
    let (r0, r1) = (&r0[..n], &r1[..n]);
    for i in 0..n {
        out[i] = vertical_blend(r0[i], r1[i], b0, b1);
    }
}

/// The horizontal pass over one source row: two taps per output pixel and channel.
#[multiversion::multiversion(targets("x86_64+avx2+fma", "x86_64+sse4.1"))]
fn resample_row(out: &mut [i16], row: &[u8], taps: &[[u32; 2]], weights: &[[i32; 2]]) {
    for ((o, &[t0, t1]), &[w0, w1]) in out.chunks_exact_mut(3).zip(taps).zip(weights) {
        let (a, b) = (
            &row[t0 as usize..t0 as usize + 3],
            &row[t1 as usize..t1 as usize + 3],
        );
        // At most 255 * 2^11 * 2 (weights may sum to 2^11 + 1), which >> 4 fits an i16.
        o[0] = ((i32::from(a[0]) * w0 + i32::from(b[0]) * w1) >> 4) as i16;
        o[1] = ((i32::from(a[1]) * w0 + i32::from(b[1]) * w1) >> 4) as i16;
        o[2] = ((i32::from(a[2]) * w0 + i32::from(b[2]) * w1) >> 4) as i16;
    }
}

/// Per-axis sampling table: source index and fixed-point weights for each output position.
#[derive(Debug, Default, Clone)]
struct AxisTable {
    index: Vec<u32>,
    weights: Vec<[i32; 2]>,
    /// Byte offsets of both taps in an RGB row (horizontal use only).
    taps: Vec<[u32; 2]>,
}

impl AxisTable {
    fn build(&mut self, src: usize, dst: usize) {
        self.index.clear();
        self.weights.clear();
        self.taps.clear();
        let scale = src as f64 / dst as f64;
        for d in 0..dst {
            let f = ((d as f64 + 0.5) * scale - 0.5) as f32;
            let mut s = f.floor() as i64;
            let mut frac = f - s as f32;
            if s < 0 {
                s = 0;
                frac = 0.0;
            }
            if s >= src as i64 - 1 {
                s = src as i64 - 1;
                frac = 0.0;
            }
            // OpenCV rounds each weight on its own (they may not sum to exactly 2^11).
            let w0 = ((1.0 - frac) * COEF_SCALE).round_ties_even() as i32;
            let w1 = (frac * COEF_SCALE).round_ties_even() as i32;
            self.index.push(s as u32);
            self.weights.push([w0, w1]);
            let next = (s as usize + 1).min(src - 1);
            self.taps.push([s as u32 * 3, next as u32 * 3]);
        }
    }
}

/// The resampling a letterbox of a `src_width` x `src_height` image into `lb` does, as
/// tables for another implementation of the same arithmetic (the GPU's): one row per output
/// column, `[first tap byte offset, second tap byte offset, weight 0, weight 1]` in an RGB
/// row, and one per output row, `[first source row, second source row, weight 0,
/// weight 1]`. With these, each output value is
/// `clamp((((a0*w0 + a1*w1) >> 4) * v0 >> 16) + (((b0*w0 + b1*w1) >> 4) * v1 >> 16) + 2) >> 2`
/// for taps `a` on the first row and `b` on the second, as [`LetterboxCanvas`] computes it.
pub fn resample_tables(
    src_width: usize,
    src_height: usize,
    lb: &Letterbox,
) -> (Vec<[i32; 4]>, Vec<[i32; 4]>) {
    let (mut xs, mut ys) = (AxisTable::default(), AxisTable::default());
    xs.build(src_width, lb.scaled_width);
    ys.build(src_height, lb.scaled_height);
    let columns = xs
        .taps
        .iter()
        .zip(&xs.weights)
        .map(|(&[t0, t1], &[w0, w1])| [t0 as i32, t1 as i32, w0, w1])
        .collect();
    let rows = ys
        .index
        .iter()
        .zip(&ys.weights)
        .map(|(&s, &[w0, w1])| [s as i32, (s as usize + 1).min(src_height - 1) as i32, w0, w1])
        .collect();
    (columns, rows)
}

/// A reusable letterbox target: the padded RGB8 canvas plus the scratch the resampler needs.
/// After warm-up, letterboxing allocates nothing.
#[derive(Debug, Default)]
pub struct LetterboxCanvas {
    pixels: Vec<u8>,
    width: usize,
    height: usize,
    xs: AxisTable,
    ys: AxisTable,
    /// Two horizontally resampled rows (scaled by 2^11, then shifted right by 4 as the
    /// vertical pass wants them, which fits 16 bits), with the source row each holds.
    rows: [Vec<i16>; 2],
    row_src: [Option<usize>; 2],
}

impl LetterboxCanvas {
    pub fn new() -> Self {
        Self::default()
    }

    /// The canvas of the last [`LetterboxCanvas::fill`]: `height` rows of `width * 3` bytes.
    pub fn pixels(&self) -> &[u8] {
        &self.pixels
    }

    pub fn width(&self) -> usize {
        self.width
    }

    pub fn height(&self) -> usize {
        self.height
    }

    /// Letterboxes `src` into this canvas, `dst_width` x `dst_height`.
    pub fn fill(&mut self, src: ImageView<'_>, dst_width: usize, dst_height: usize) -> Letterbox {
        let mut pixels = std::mem::take(&mut self.pixels);
        let lb = self.fill_into(src, dst_width, dst_height, &mut pixels);
        self.pixels = pixels;
        lb
    }

    /// Letterboxes `src` into `out` (resized to `dst_width * dst_height * 3` bytes), using
    /// this canvas only for scratch: for callers that keep their own pooled buffers.
    pub fn fill_into(
        &mut self,
        src: ImageView<'_>,
        dst_width: usize,
        dst_height: usize,
        out: &mut Vec<u8>,
    ) -> Letterbox {
        self.fill_into_from(src, (src.width, src.height), dst_width, dst_height, out)
    }

    /// [`LetterboxCanvas::fill_into`] for a picture of `source_size` that `src` holds at a
    /// reduced scale (a JPEG decoded with DCT scaling): the geometry, and so the mapping of
    /// boxes back, is the full-size picture's; the pixels are resampled from `src`.
    pub fn fill_into_from(
        &mut self,
        src: ImageView<'_>,
        source_size: (usize, usize),
        dst_width: usize,
        dst_height: usize,
        out: &mut Vec<u8>,
    ) -> Letterbox {
        let lb = Letterbox::new(source_size.0, source_size.1, dst_width, dst_height);
        self.width = dst_width;
        self.height = dst_height;
        out.resize(dst_width * dst_height * 3, 0);
        fill_padding(out, &lb);
        if lb.scaled_width == src.width && lb.scaled_height == src.height {
            copy_unscaled(out, src, &lb);
        } else {
            self.resample(out, src, &lb);
        }
        lb
    }

    fn resample(&mut self, pixels: &mut [u8], src: ImageView<'_>, lb: &Letterbox) {
        let (sw, dw) = (lb.scaled_width, lb.dst_width);
        self.xs.build(src.width, sw);
        self.ys.build(src.height, lb.scaled_height);
        for r in &mut self.rows {
            r.resize(sw * 3, 0);
        }
        self.row_src = [None, None];
        let row_bytes = dw * 3;
        for dy in 0..lb.scaled_height {
            let sy0 = self.ys.index[dy] as usize;
            let sy1 = (sy0 + 1).min(src.height - 1);
            let [b0, b1] = self.ys.weights[dy];
            self.ensure_row(0, sy0, src);
            let out_start = (lb.top + dy) * row_bytes + lb.left * 3;
            let out = &mut pixels[out_start..out_start + sw * 3];
            if b1 == 0 {
                // The second row has no weight (edges, exact ratios): skip resampling it.
                blend_rows(out, &self.rows[0], &self.rows[0], b0, 0);
                continue;
            }
            self.ensure_row(1, sy1, src);
            blend_rows(out, &self.rows[0], &self.rows[1], b0, b1);
        }
    }

    /// Makes cache slot `slot` hold source row `sy`, reusing the other slot's work if it
    /// already has that row (the common case when scaling up).
    fn ensure_row(&mut self, slot: usize, sy: usize, src: ImageView<'_>) {
        if self.row_src[slot] == Some(sy) {
            return;
        }
        let other = 1 - slot;
        if self.row_src[other] == Some(sy) {
            if slot == 0 {
                // Row moves down from slot 1 to slot 0; slot 1 will be refilled next.
                self.rows.swap(0, 1);
                self.row_src.swap(0, 1);
            } else {
                let (a, b) = self.rows.split_at_mut(1);
                b[0].copy_from_slice(&a[0]);
                self.row_src[1] = Some(sy);
            }
            return;
        }
        resample_row(&mut self.rows[slot], src.row(sy), &self.xs.taps, &self.xs.weights);
        self.row_src[slot] = Some(sy);
    }
}

fn fill_padding(pixels: &mut [u8], lb: &Letterbox) {
    let row_bytes = lb.dst_width * 3;
    let pad = Letterbox::PAD_VALUE;
    let body_end = lb.top + lb.scaled_height;
    pixels[..lb.top * row_bytes].fill(pad);
    pixels[body_end * row_bytes..].fill(pad);
    let right_start = (lb.left + lb.scaled_width) * 3;
    for y in lb.top..body_end {
        let row = &mut pixels[y * row_bytes..(y + 1) * row_bytes];
        row[..lb.left * 3].fill(pad);
        row[right_start..].fill(pad);
    }
}

fn copy_unscaled(pixels: &mut [u8], src: ImageView<'_>, lb: &Letterbox) {
    let row_bytes = lb.dst_width * 3;
    for y in 0..src.height {
        let start = (lb.top + y) * row_bytes + lb.left * 3;
        pixels[start..start + src.width * 3].copy_from_slice(src.row(y));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resample_tables_reproduce_the_letterbox() {
        let (w, h) = (203, 117);
        let src: Vec<u8> = (0..w * h * 3).map(|i| ((i * 7919) % 251) as u8).collect();
        let view = ImageView::packed(&src, w, h).unwrap();
        let mut canvas = LetterboxCanvas::new();
        let lb = canvas.fill(view, 64, 64);
        let (columns, rows) = resample_tables(w, h, &lb);
        assert_eq!((columns.len(), rows.len()), (lb.scaled_width, lb.scaled_height));
        for (dy, &[r0, r1, v0, v1]) in rows.iter().enumerate() {
            for (dx, &[t0, t1, w0, w1]) in columns.iter().enumerate() {
                for c in 0..3 {
                    let tap = |row: i32, t: i32| i32::from(src[row as usize * w * 3 + t as usize + c]);
                    let a = ((tap(r0, t0) * w0 + tap(r0, t1) * w1) >> 4) as i16;
                    let b = ((tap(r1, t0) * w0 + tap(r1, t1) * w1) >> 4) as i16;
                    let v = (((i32::from(a) * v0) >> 16) + ((i32::from(b) * v1) >> 16) + 2) >> 2;
                    let at = ((lb.top + dy) * 64 + lb.left + dx) * 3 + c;
                    assert_eq!(
                        canvas.pixels()[at],
                        v.clamp(0, 255) as u8,
                        "({dx}, {dy}) channel {c}"
                    );
                }
            }
        }
    }

    #[test]
    fn geometry_matches_ultralytics_for_landscape_and_portrait() {
        // bus.jpg: 810x1080 -> gain 0.5926, scaled 480x640, padded 80 left/right.
        let lb = Letterbox::new(810, 1080, 640, 640);
        assert_eq!((lb.scaled_width, lb.scaled_height), (480, 640));
        assert_eq!((lb.left, lb.top), (80, 0));
        // zidane.jpg: 1280x720 -> 640x360, 140 above and below.
        let lb = Letterbox::new(1280, 720, 640, 640);
        assert_eq!((lb.scaled_width, lb.scaled_height), (640, 360));
        assert_eq!((lb.left, lb.top), (0, 140));
        // Odd padding: 451x300 -> 640x426 (425.7 rounds up), 214 to split: 107 each.
        let lb = Letterbox::new(451, 300, 640, 640);
        assert_eq!((lb.scaled_width, lb.scaled_height), (640, 426));
        assert_eq!(lb.top, 107);
        // Odd split: 640x427 stays, 213 to split: round(106.4) = 106 on top.
        let lb = Letterbox::new(640, 427, 640, 640);
        assert_eq!((lb.scaled_height, lb.top), (427, 106));
    }

    #[test]
    fn small_images_are_scaled_up() {
        let lb = Letterbox::new(32, 16, 640, 640);
        assert_eq!((lb.scaled_width, lb.scaled_height), (640, 320));
        assert!((lb.gain - 20.0).abs() < 1e-9);
    }

    #[test]
    fn box_mapping_round_trips() {
        let lb = Letterbox::new(1280, 720, 640, 640);
        // A box covering the whole scaled image maps to the whole original.
        let b = lb.to_original(&BBox::new(0.0, 140.0, 640.0, 500.0));
        assert!((b.x1 - 0.0).abs() < 1e-3 && (b.y1 - 0.0).abs() < 1e-3);
        assert!((b.x2 - 1280.0).abs() < 1e-3 && (b.y2 - 720.0).abs() < 1e-3);
        // A box in the padding is clipped into the image.
        let b = lb.to_original(&BBox::new(-10.0, 0.0, 700.0, 100.0));
        assert_eq!((b.x1, b.y1, b.x2, b.y2), (0.0, 0.0, 1280.0, 0.0));
        // An interior point scales by 1/gain around the padding.
        let b = lb.to_original(&BBox::new(100.0, 240.0, 200.0, 340.0));
        assert!((b.x1 - 200.0).abs() < 1e-3 && (b.y1 - 200.0).abs() < 1e-3);
    }

    fn solid(w: usize, h: usize, rgb: [u8; 3]) -> Vec<u8> {
        rgb.iter().copied().cycle().take(w * h * 3).collect()
    }

    #[test]
    fn padding_is_114_and_content_is_placed_centered() {
        let data = solid(64, 32, [10, 20, 30]);
        let mut canvas = LetterboxCanvas::new();
        let lb = canvas.fill(ImageView::packed(&data, 64, 32).unwrap(), 128, 128);
        assert_eq!((lb.scaled_width, lb.scaled_height, lb.top), (128, 64, 32));
        let px = |x: usize, y: usize| &canvas.pixels()[(y * 128 + x) * 3..(y * 128 + x) * 3 + 3];
        assert_eq!(px(0, 0), [114, 114, 114]);
        assert_eq!(px(127, 31), [114, 114, 114]);
        assert_eq!(px(0, 32), [10, 20, 30]);
        assert_eq!(px(127, 95), [10, 20, 30]);
        assert_eq!(px(64, 96), [114, 114, 114]);
    }

    #[test]
    fn unscaled_copy_respects_stride() {
        // 2x2 image stored with a stride of 9 bytes (3 bytes of junk per row).
        let data = [1, 2, 3, 4, 5, 6, 99, 99, 99, 7, 8, 9, 10, 11, 12, 99, 99, 99];
        let view = ImageView {
            data: &data,
            width: 2,
            height: 2,
            stride: 9,
        };
        let mut canvas = LetterboxCanvas::new();
        canvas.fill(view, 2, 4);
        assert_eq!(
            canvas.pixels(),
            [
                114, 114, 114, 114, 114, 114, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 114, 114, 114, 114, 114,
                114
            ]
        );
    }

    #[test]
    fn bilinear_downscale_by_two_averages_pairs() {
        // A horizontal ramp 0, 10, 20, ... halved: each output is the mean of a pair.
        let w = 8;
        let data: Vec<u8> = (0..w).flat_map(|x| [(x * 10) as u8; 3]).collect();
        let mut canvas = LetterboxCanvas::new();
        let view = ImageView::packed(&data, w, 1).unwrap();
        let lb = canvas.fill(view, 4, 1);
        assert_eq!((lb.scaled_width, lb.scaled_height), (4, 1));
        let reds: Vec<u8> = canvas.pixels().chunks(3).map(|p| p[0]).collect();
        assert_eq!(reds, [5, 25, 45, 65]);
    }

    #[test]
    fn bilinear_upscale_interpolates_and_clamps_edges() {
        // 2 pixels (0 and 100) to 4: OpenCV gives 0, 25, 75, 100.
        let data = [0, 0, 0, 100, 100, 100];
        let mut canvas = LetterboxCanvas::new();
        canvas.fill(ImageView::packed(&data, 2, 1).unwrap(), 4, 2);
        let row: Vec<u8> = canvas.pixels()[..12].chunks(3).map(|p| p[0]).collect();
        assert_eq!(row, [0, 25, 75, 100]);
        let row2: Vec<u8> = canvas.pixels()[12..].chunks(3).map(|p| p[0]).collect();
        assert_eq!(row2, [0, 25, 75, 100]);
    }

    #[test]
    fn canvas_reuse_gives_identical_output() {
        let a = solid(300, 200, [1, 2, 3]);
        let b: Vec<u8> = (0..500 * 100 * 3).map(|i| (i % 251) as u8).collect();
        let mut reused = LetterboxCanvas::new();
        reused.fill(ImageView::packed(&a, 300, 200).unwrap(), 64, 64);
        reused.fill(ImageView::packed(&b, 500, 100).unwrap(), 64, 64);
        let mut fresh = LetterboxCanvas::new();
        fresh.fill(ImageView::packed(&b, 500, 100).unwrap(), 64, 64);
        assert_eq!(reused.pixels(), fresh.pixels());
    }
}
