//! `peregrine_vision::yuv` (the reference a GPU kernel for NVDEC's surfaces follows)
//! against `sws_scale` as the decoder runs it: every (U, V) pair with pseudo-random luma,
//! each colour matrix and range the decoder meets, and odd widths.

use ff::AVColorSpace as Cs;
use peregrine_vision::yuv::{Planes420, YuvToRgb};

use super::*;

/// A `yuv420p` frame that frees itself.
struct Picture(*mut ff::AVFrame);

impl Drop for Picture {
    fn drop(&mut self) {
        // SAFETY: allocated by `av_frame_alloc` in `picture` and freed once.
        unsafe { ff::av_frame_free(&mut self.0) };
    }
}

/// Fills a frame's planes: `fill(plane, x, y)` for luma (0) and chroma (1, 2).
fn picture(
    width: i32,
    height: i32,
    colorspace: Cs,
    full_range: bool,
    fill: impl Fn(usize, usize, usize) -> u8,
) -> Picture {
    // SAFETY: a fresh frame, its buffers allocated by FFmpeg for the size and format set,
    // written within each plane's `linesize` x rows.
    unsafe {
        let f = ff::av_frame_alloc();
        assert!(!f.is_null());
        (*f).width = width;
        (*f).height = height;
        (*f).format = ff::AVPixelFormat::AV_PIX_FMT_YUV420P as c_int;
        (*f).colorspace = colorspace;
        (*f).color_range = if full_range {
            ff::AVColorRange::AVCOL_RANGE_JPEG
        } else {
            ff::AVColorRange::AVCOL_RANGE_MPEG
        };
        assert_eq!(ff::av_frame_get_buffer(f, 0), 0);
        let sizes = [
            (width as usize, height as usize),
            ((width as usize).div_ceil(2), (height as usize).div_ceil(2)),
            ((width as usize).div_ceil(2), (height as usize).div_ceil(2)),
        ];
        for (plane, (w, h)) in sizes.into_iter().enumerate() {
            let stride = (*f).linesize[plane] as usize;
            for y in 0..h {
                for x in 0..w {
                    *(*f).data[plane].add(y * stride + x) = fill(plane, x, y);
                }
            }
        }
        Picture(f)
    }
}

/// The decoder's own conversion (`DecodedPicture::to_rgb`), into rows padded as frames are.
fn swscale(p: &Picture) -> (Vec<u8>, usize) {
    // SAFETY: a valid frame, read for its size.
    let (width, height) = unsafe { ((*p.0).width as u32, (*p.0).height as u32) };
    let stride = (width as usize * 3).next_multiple_of(crate::frame::ROW_ALIGN);
    let mut out = vec![0u8; stride * height as usize];
    let (mut scaler, mut host) = (Scaler::default(), HostCopy::default());
    let mut wait = StreamWait::default();
    let mut picture = DecodedPicture {
        frame: p.0,
        scaler: &mut scaler,
        host: &mut host,
        wait: &mut wait,
        width,
        height,
        pts: 0,
    };
    picture.to_rgb(&mut out, stride).unwrap();
    (out, stride)
}

/// The reference's conversion of the same frame, as the decoder would choose it.
fn reference(p: &Picture) -> Vec<u8> {
    // SAFETY: `p` is a valid yuv420p frame whose planes hold the sizes given.
    unsafe {
        let f = &*p.0;
        let (w, h) = (f.width as usize, f.height as usize);
        let ch = h.div_ceil(2);
        let plane =
            |i: usize, rows: usize| std::slice::from_raw_parts(f.data[i], f.linesize[i] as usize * rows);
        let planes = Planes420 {
            y: plane(0, h),
            y_stride: f.linesize[0] as usize,
            u: plane(1, ch),
            u_stride: f.linesize[1] as usize,
            v: plane(2, ch),
            v_stride: f.linesize[2] as usize,
        };
        let full = f.color_range == ff::AVColorRange::AVCOL_RANGE_JPEG;
        let conversion = YuvToRgb::new(sws_colorspace(f.colorspace as c_int, f.height), full).unwrap();
        let stride = (w * 3).next_multiple_of(crate::frame::ROW_ALIGN);
        let mut out = vec![0u8; stride * h];
        conversion.convert_420(planes, w, h, &mut out, stride);
        out
    }
}

/// Pseudo-random bytes (xorshift), the same for a seed.
fn noise(seed: u64) -> impl Fn(usize, usize, usize) -> u8 {
    move |plane, x, y| {
        let mut s = seed ^ ((plane as u64) << 48) ^ ((y as u64) << 24) ^ x as u64;
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s = s.wrapping_mul(0x2545_f491_4f6c_dd1d);
        (s >> 56) as u8
    }
}

/// Compares the visible pixels of both conversions; reports the first difference.
fn assert_same(p: &Picture, what: &str) {
    let (sws, stride) = swscale(p);
    let ours = reference(p);
    // SAFETY: a valid frame.
    let (w, h) = unsafe { ((*p.0).width as usize, (*p.0).height as usize) };
    for y in 0..h {
        let (a, b) = (&sws[y * stride..][..w * 3], &ours[y * stride..][..w * 3]);
        if let Some(i) = a.iter().zip(b).position(|(a, b)| a != b) {
            panic!(
                "{what}: pixel ({}, {y}) channel {}: swscale {} reference {}",
                i / 3,
                i % 3,
                a[i],
                b[i]
            );
        }
    }
}

#[test]
fn every_chroma_pair_matches_swscale_for_each_matrix_and_range() {
    for (cs, name) in [
        (Cs::AVCOL_SPC_BT709, "bt709"),
        (Cs::AVCOL_SPC_BT470BG, "bt601"),
        (Cs::AVCOL_SPC_SMPTE170M, "smpte170m"),
        (Cs::AVCOL_SPC_SMPTE240M, "smpte240m"),
        (Cs::AVCOL_SPC_FCC, "fcc"),
        (Cs::AVCOL_SPC_BT2020_NCL, "bt2020"),
    ] {
        for full in [false, true] {
            let luma = noise(cs as u64 * 2 + u64::from(full));
            // 256 x 256 chroma blocks: U is the block's column, V its row.
            let p = picture(512, 512, cs, full, |plane, x, y| match plane {
                0 => luma(0, x, y),
                1 => x as u8,
                _ => y as u8,
            });
            assert_same(&p, &format!("{name}, full range {full}"));
        }
    }
}

#[test]
fn unspecified_matrices_and_odd_widths_match_swscale() {
    // Unspecified: BT.709 from 720 rows up, BT.601 below (`sws_colorspace`).
    for (w, h) in [(333, 270), (1282, 720), (65, 2)] {
        let p = picture(w, h, Cs::AVCOL_SPC_UNSPECIFIED, false, noise(w as u64));
        assert_same(&p, &format!("{w}x{h} unspecified"));
    }
}
