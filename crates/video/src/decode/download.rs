//! Copying a decoded NVDEC surface to the host for the RGB conversion: 8- and 16-bit 4:2:0
//! surfaces go into page-locked memory on the decoder's own stream, waited for on an event
//! that sleeps rather than spins; other layouts go through FFmpeg's generic transfer.
//!
//! NV12's interleaved chroma is split into the I420 planes FFmpeg's software decoder gives,
//! so that swscale takes the very path (and arithmetic) of CPU decoding and NVDEC's pixels,
//! bit-exact by the codec's definition, give the same RGB.

use std::ffi::c_int;
use std::ptr;

use ffmpeg_sys_next as ff;

use super::cuda::{self, Driver, PlaneCopy};
use super::ffmpeg::error_text;
use super::DecodeError;

/// The planes swscale reads: a software frame's own, or a downloaded surface's.
pub(super) struct Planes {
    pub format: ff::AVPixelFormat,
    pub data: [*const u8; 8],
    pub linesize: [c_int; 8],
}

/// Page-locked memory for one picture and the event its copy is waited on, in one context.
struct Pinned {
    ctx: cuda::Context,
    buffer: *mut u8,
    bytes: usize,
    event: cuda::Event,
}

impl Drop for Pinned {
    fn drop(&mut self) {
        if let Ok(driver) = cuda::driver() {
            // SAFETY: both were made in `ctx` by this value and are released once.
            let _ = driver.with_context(self.ctx, || unsafe {
                driver.destroy_event(self.event);
                driver.host_free(self.buffer);
                Ok(())
            });
        }
    }
}

/// Reused buffers of one decoder's downloads.
pub(super) struct HostCopy {
    pinned: Option<Pinned>,
    /// The generic path's frame, reused while the size and format stay.
    frame: *mut ff::AVFrame,
    u: Vec<u8>,
    v: Vec<u8>,
}

impl Default for HostCopy {
    fn default() -> Self {
        Self {
            pinned: None,
            frame: ptr::null_mut(),
            u: Vec::new(),
            v: Vec::new(),
        }
    }
}

/// Rows padded to 64 bytes, which swscale's vector code reads fastest.
fn pitch(row_bytes: usize) -> usize {
    row_bytes.next_multiple_of(64)
}

impl HostCopy {
    /// Downloads `surface` (a decoded frame in `AV_PIX_FMT_CUDA`) and returns its planes.
    ///
    /// # Safety
    /// `surface` must be a valid decoded CUDA frame with a frames context.
    pub(super) unsafe fn download(&mut self, surface: *const ff::AVFrame) -> Result<Planes, DecodeError> {
        let s = &*surface;
        if s.hw_frames_ctx.is_null() {
            return Err(DecodeError::Download("the surface has no frames context".into()));
        }
        let frames = (*s.hw_frames_ctx).data as *const ff::AVHWFramesContext;
        let sw_format = (*frames).sw_format;
        let bytes_per_sample = match sw_format {
            ff::AVPixelFormat::AV_PIX_FMT_NV12 => 1,
            ff::AVPixelFormat::AV_PIX_FMT_P010LE | ff::AVPixelFormat::AV_PIX_FMT_P016LE => 2,
            _ => return self.download_generic(surface, sw_format),
        };
        let hwctx = (*(*frames).device_ctx).hwctx as *const ff::AVCUDADeviceContext;
        let (ctx, stream) = (
            (*hwctx).cuda_ctx as cuda::Context,
            (*hwctx).stream as cuda::Stream,
        );
        let (width, height) = (s.width as usize, s.height as usize);
        let (chroma_w, chroma_h) = (width.div_ceil(2), height.div_ceil(2));
        // 4:2:0 with interleaved chroma: a luma plane, then rows of U,V pairs.
        let (luma_row, chroma_row) = (width * bytes_per_sample, chroma_w * 2 * bytes_per_sample);
        let (luma_pitch, chroma_pitch) = (pitch(luma_row), pitch(chroma_row));
        let driver = cuda::driver().map_err(DecodeError::Download)?;
        let (buffer, event) =
            self.pinned_buffer(driver, ctx, luma_pitch * height + chroma_pitch * chroma_h)?;
        let luma = buffer;
        let chroma = buffer.add(luma_pitch * height);
        driver
            .with_context(ctx, || {
                let luma_plane = PlaneCopy {
                    src: s.data[0] as u64,
                    src_pitch: s.linesize[0] as usize,
                    dst: luma,
                    dst_pitch: luma_pitch,
                    row_bytes: luma_row,
                    rows: height,
                };
                let chroma_plane = PlaneCopy {
                    src: s.data[1] as u64,
                    src_pitch: s.linesize[1] as usize,
                    dst: chroma,
                    dst_pitch: chroma_pitch,
                    row_bytes: chroma_row,
                    rows: chroma_h,
                };
                driver.copy_to_host(&luma_plane, stream)?;
                driver.copy_to_host(&chroma_plane, stream)?;
                driver.wait_for(event, stream)
            })
            .map_err(DecodeError::Download)?;
        let luma_linesize = c_int::try_from(luma_pitch).map_err(|_| DecodeError::OutputTooSmall)?;
        if bytes_per_sample == 2 {
            // 10-bit (P010/P016) goes to swscale as it is.
            let chroma_linesize = c_int::try_from(chroma_pitch).map_err(|_| DecodeError::OutputTooSmall)?;
            return Ok(planes(
                sw_format,
                [luma, chroma, ptr::null()],
                [luma_linesize, chroma_linesize, 0],
            ));
        }
        let interleaved = std::slice::from_raw_parts(chroma, chroma_pitch * chroma_h);
        self.split(luma, luma_linesize, interleaved, chroma_pitch, chroma_w, chroma_h)
    }

    /// The page-locked buffer, at least `bytes` long, made in `ctx`, and its event.
    fn pinned_buffer(
        &mut self,
        driver: &Driver,
        ctx: cuda::Context,
        bytes: usize,
    ) -> Result<(*mut u8, cuda::Event), DecodeError> {
        if let Some(p) = &self.pinned {
            if p.ctx == ctx && p.bytes >= bytes {
                return Ok((p.buffer, p.event));
            }
        }
        self.pinned = None;
        let pinned = driver
            .with_context(ctx, || {
                let buffer = driver.host_alloc(bytes)?;
                match driver.create_event() {
                    Ok(event) => Ok(Pinned {
                        ctx,
                        buffer,
                        bytes,
                        event,
                    }),
                    Err(e) => {
                        // SAFETY: allocated just above and not handed out.
                        unsafe { driver.host_free(buffer) };
                        Err(e)
                    }
                }
            })
            .map_err(DecodeError::Download)?;
        let pinned = self.pinned.insert(pinned);
        Ok((pinned.buffer, pinned.event))
    }

    /// NV12's luma with its chroma split into I420's planes.
    fn split(
        &mut self,
        luma: *const u8,
        luma_linesize: c_int,
        interleaved: &[u8],
        stride: usize,
        chroma_w: usize,
        chroma_h: usize,
    ) -> Result<Planes, DecodeError> {
        self.u.resize(chroma_w * chroma_h, 0);
        self.v.resize(chroma_w * chroma_h, 0);
        split_interleaved_chroma(interleaved, stride, chroma_w, chroma_h, &mut self.u, &mut self.v);
        let chroma_stride = c_int::try_from(chroma_w).map_err(|_| DecodeError::OutputTooSmall)?;
        Ok(planes(
            ff::AVPixelFormat::AV_PIX_FMT_YUV420P,
            [luma, self.u.as_ptr(), self.v.as_ptr()],
            [luma_linesize, chroma_stride, chroma_stride],
        ))
    }

    /// Any other surface layout (4:4:4, for instance) through `av_hwframe_transfer_data`.
    unsafe fn download_generic(
        &mut self,
        surface: *const ff::AVFrame,
        sw_format: ff::AVPixelFormat,
    ) -> Result<Planes, DecodeError> {
        let s = &*surface;
        self.ensure_frame(sw_format, s.width, s.height)?;
        let rc = ff::av_hwframe_transfer_data(self.frame, surface, 0);
        if rc < 0 {
            return Err(DecodeError::Download(error_text(rc)));
        }
        let f = &*self.frame;
        Ok(Planes {
            format: sw_format,
            data: f.data.map(|p| p as *const u8),
            linesize: f.linesize,
        })
    }

    unsafe fn ensure_frame(
        &mut self,
        format: ff::AVPixelFormat,
        width: c_int,
        height: c_int,
    ) -> Result<(), DecodeError> {
        if !self.frame.is_null() {
            let f = &*self.frame;
            if f.format == format as c_int && f.width == width && f.height == height {
                return Ok(());
            }
            ff::av_frame_free(&mut self.frame);
        }
        self.frame = ff::av_frame_alloc();
        if self.frame.is_null() {
            return Err(DecodeError::OutOfMemory);
        }
        (*self.frame).format = format as c_int;
        (*self.frame).width = width;
        (*self.frame).height = height;
        let rc = ff::av_frame_get_buffer(self.frame, 0);
        if rc < 0 {
            ff::av_frame_free(&mut self.frame);
            return Err(DecodeError::Download(error_text(rc)));
        }
        Ok(())
    }
}

impl Drop for HostCopy {
    fn drop(&mut self) {
        // SAFETY: null or a frame we own.
        unsafe { ff::av_frame_free(&mut self.frame) };
    }
}

fn planes(format: ff::AVPixelFormat, data: [*const u8; 3], linesize: [c_int; 3]) -> Planes {
    let mut all = Planes {
        format,
        data: [ptr::null(); 8],
        linesize: [0; 8],
    };
    all.data[..3].copy_from_slice(&data);
    all.linesize[..3].copy_from_slice(&linesize);
    all
}

/// NV12's chroma plane (rows of `width` interleaved U,V pairs, `stride` bytes apart) into
/// separate U and V planes of `width` x `height`.
pub fn split_interleaved_chroma(
    interleaved: &[u8],
    stride: usize,
    width: usize,
    height: usize,
    u: &mut [u8],
    v: &mut [u8],
) {
    for row in 0..height {
        let src = &interleaved[row * stride..row * stride + width * 2];
        let (u_row, v_row) = (&mut u[row * width..][..width], &mut v[row * width..][..width]);
        for ((pair, u), v) in src.chunks_exact(2).zip(u_row).zip(v_row) {
            *u = pair[0];
            *v = pair[1];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interleaved_chroma_splits_into_planes_ignoring_the_row_padding() {
        // 3 x 2 chroma samples, rows 8 bytes apart (2 bytes of padding each).
        let interleaved = [
            1, 101, 2, 102, 3, 103, 0xEE, 0xEE, //
            4, 104, 5, 105, 6, 106, 0xEE, 0xEE,
        ];
        let (mut u, mut v) = (vec![0; 6], vec![0; 6]);
        split_interleaved_chroma(&interleaved[..14], 8, 3, 2, &mut u, &mut v);
        assert_eq!(u, [1, 2, 3, 4, 5, 6]);
        assert_eq!(v, [101, 102, 103, 104, 105, 106]);
    }

    #[test]
    fn rows_are_padded_for_swscale() {
        assert_eq!(pitch(1920), 1920);
        assert_eq!(pitch(322), 384);
        assert_eq!(pitch(1), 64);
    }
}
