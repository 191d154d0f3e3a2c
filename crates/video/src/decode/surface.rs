//! Pictures that stay on the GPU: a decoded NVDEC surface kept (FFmpeg's frame holds the
//! mapped surface until it is freed), described for the engine's kernels, and copied to the
//! host only when someone asks for its pixels (a snapshot, a live view, a model that does
//! not take GPU frames).

use std::ffi::c_int;

use ffmpeg_sys_next as ff;
use peregrine_vision::yuv::{Nv12Image, Nv12Planes, YuvToRgb};

use super::cuda::{self, Driver};
use super::ffmpeg::{error_text, sws_colorspace};
use super::DecodeError;
use crate::frame::DeviceSurface;

/// A decoded 8-bit 4:2:0 picture in GPU memory, as NVDEC left it.
pub struct GpuSurface {
    /// Our own reference to the decoder's frame: while it lives, the surface stays mapped
    /// and unchanged.
    frame: *mut ff::AVFrame,
    image: Nv12Image,
}

// SAFETY: the frame is reference-counted by FFmpeg (its buffers' release is thread-safe) and
// only read through this value; the surface is device memory, not tied to a host thread.
unsafe impl Send for GpuSurface {}
unsafe impl Sync for GpuSurface {}

impl Drop for GpuSurface {
    fn drop(&mut self) {
        // SAFETY: a frame we cloned and own; this unmaps the surface when it is the last
        // reference.
        unsafe { ff::av_frame_free(&mut self.frame) };
    }
}

/// Why a decoded picture cannot stay on the GPU as a [`GpuSurface`], or `None` if it can:
/// only 8-bit NV12 with an even height (where FFmpeg's x86 converter, which the GPU kernel
/// reproduces, takes its plain path) and a colour matrix that kernel applies.
pub(super) fn unsuitable(
    format: c_int,
    sw_format: ff::AVPixelFormat,
    height: c_int,
    colorspace: c_int,
) -> Option<&'static str> {
    if format != ff::AVPixelFormat::AV_PIX_FMT_CUDA as c_int {
        Some("not decoded by NVDEC")
    } else if sw_format != ff::AVPixelFormat::AV_PIX_FMT_NV12 {
        Some("not 8-bit 4:2:0 (NV12)")
    } else if height % 2 != 0 {
        Some("an odd height")
    } else if YuvToRgb::new(sws_colorspace(colorspace, height), false).is_none() {
        Some("a colour matrix the GPU conversion does not apply (YCgCo)")
    } else {
        None
    }
}

impl GpuSurface {
    /// Keeps `frame` (a decoded NVDEC picture) on GPU `device`, once `wait` has waited for
    /// the decoder's stream (FFmpeg maps the surface there; the engine reads it on
    /// another). `Ok(None)` for a picture that cannot stay (see [`unsuitable`]).
    ///
    /// # Safety
    /// `frame` must be a valid decoded frame.
    pub(super) unsafe fn keep(
        frame: *const ff::AVFrame,
        device: i32,
        wait: impl FnOnce(cuda::Context, cuda::Stream) -> Result<(), String>,
    ) -> Result<Option<Self>, DecodeError> {
        let f = &*frame;
        if f.hw_frames_ctx.is_null() {
            return Ok(None);
        }
        let frames = (*f.hw_frames_ctx).data as *const ff::AVHWFramesContext;
        if unsuitable(f.format, (*frames).sw_format, f.height, f.colorspace as c_int).is_some() {
            return Ok(None);
        }
        let full_range = f.color_range == ff::AVColorRange::AVCOL_RANGE_JPEG;
        let conversion = YuvToRgb::new(sws_colorspace(f.colorspace as c_int, f.height), full_range)
            .expect("checked by `unsuitable`");
        let hwctx = (*(*frames).device_ctx).hwctx as *const ff::AVCUDADeviceContext;
        wait(
            (*hwctx).cuda_ctx as cuda::Context,
            (*hwctx).stream as cuda::Stream,
        )
        .map_err(DecodeError::Download)?;
        let own = ff::av_frame_clone(frame);
        if own.is_null() {
            return Err(DecodeError::OutOfMemory);
        }
        let image = Nv12Image {
            device,
            width: f.width as usize,
            height: f.height as usize,
            luma: f.data[0] as u64,
            luma_pitch: f.linesize[0] as usize,
            chroma: f.data[1] as u64,
            chroma_pitch: f.linesize[1] as usize,
            conversion,
        };
        Ok(Some(Self { frame: own, image }))
    }
}

impl DeviceSurface for GpuSurface {
    fn image(&self) -> Nv12Image {
        self.image
    }

    fn download_rgb(&self, out: &mut [u8], stride: usize) -> Result<(), String> {
        let (w, h) = (self.image.width, self.image.height);
        if stride < w * 3 || out.len() < stride * h {
            return Err(DecodeError::OutputTooSmall.to_string());
        }
        // SAFETY: our frame is a valid NV12 CUDA frame; the host frame is ours and freed
        // below; av_hwframe_transfer_data waits for its copy before returning.
        unsafe {
            let mut host = ff::av_frame_alloc();
            if host.is_null() {
                return Err(DecodeError::OutOfMemory.to_string());
            }
            let rc = ff::av_hwframe_transfer_data(host, self.frame, 0);
            let result = if rc < 0 {
                Err(DecodeError::Download(error_text(rc)).to_string())
            } else {
                let hf = &*host;
                let planes = Nv12Planes {
                    y: std::slice::from_raw_parts(hf.data[0], hf.linesize[0] as usize * h),
                    y_stride: hf.linesize[0] as usize,
                    uv: std::slice::from_raw_parts(hf.data[1], hf.linesize[1] as usize * h.div_ceil(2)),
                    uv_stride: hf.linesize[1] as usize,
                };
                self.image.conversion.convert_nv12(planes, w, h, out, stride);
                Ok(())
            };
            ff::av_frame_free(&mut host);
            result
        }
    }
}

/// The event a decoder waits on for its stream before handing out a surface.
#[derive(Default)]
pub(super) struct StreamWait {
    event: Option<(cuda::Context, cuda::Event)>,
}

impl StreamWait {
    /// Waits, sleeping, until everything queued on `stream` (in `ctx`) so far has run.
    pub fn wait(&mut self, ctx: cuda::Context, stream: cuda::Stream) -> Result<(), String> {
        let driver = cuda::driver()?;
        driver.with_context(ctx, || {
            let event = match self.event {
                Some((c, e)) if c == ctx => e,
                _ => {
                    self.release(driver);
                    let e = driver.create_event()?;
                    self.event = Some((ctx, e));
                    e
                }
            };
            // SAFETY: the event and the stream belong to `ctx`, current here.
            unsafe { driver.wait_for(event, stream) }
        })
    }

    fn release(&mut self, driver: &Driver) {
        if let Some((ctx, event)) = self.event.take() {
            // SAFETY: made in `ctx` by `wait`, destroyed once.
            let _ = driver.with_context(ctx, || unsafe {
                driver.destroy_event(event);
                Ok(())
            });
        }
    }
}

impl Drop for StreamWait {
    fn drop(&mut self) {
        if let Ok(driver) = cuda::driver() {
            self.release(driver);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_8_bit_nv12_with_even_heights_and_a_known_matrix_stays_on_the_gpu() {
        let cuda = ff::AVPixelFormat::AV_PIX_FMT_CUDA as c_int;
        let nv12 = ff::AVPixelFormat::AV_PIX_FMT_NV12;
        // BT.709 (1) and unspecified (2) at 1080 lines.
        assert_eq!(unsuitable(cuda, nv12, 1080, 1), None);
        assert_eq!(unsuitable(cuda, nv12, 1080, 2), None);
        let yuv420p = ff::AVPixelFormat::AV_PIX_FMT_YUV420P as c_int;
        assert_eq!(unsuitable(yuv420p, nv12, 1080, 1), Some("not decoded by NVDEC"));
        let p010 = ff::AVPixelFormat::AV_PIX_FMT_P010LE;
        assert_eq!(unsuitable(cuda, p010, 1080, 1), Some("not 8-bit 4:2:0 (NV12)"));
        assert_eq!(unsuitable(cuda, nv12, 719, 1), Some("an odd height"));
        assert!(unsuitable(cuda, nv12, 720, 8).unwrap().contains("YCgCo"));
    }
}
