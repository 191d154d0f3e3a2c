//! NVDEC through FFmpeg's CUDA hwaccel: one CUDA device context per GPU shared by every
//! stream's decoder, the pixel-format choice that turns the hardware on or falls back, and
//! the copy of a decoded surface to the host for the RGB conversion.
//!
//! FFmpeg loads `libcuda` and `libnvcuvid` itself when a device or decoder is made, so
//! nothing here needs CUDA at build time and a machine without a GPU gets a reason, not a
//! crash.

use std::collections::HashMap;
use std::ffi::{c_int, CString};
use std::ptr;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};

use ffmpeg_sys_next as ff;

use super::ffmpeg::error_text;
use super::DecodeError;

/// A reference to FFmpeg's CUDA device context for one GPU, kept for the process's life.
struct SharedDevice(*mut ff::AVBufferRef);

// SAFETY: an AVHWDeviceContext may be referenced from any thread; FFmpeg's CUDA code pushes
// and pops the context around each use, and the reference count is atomic.
unsafe impl Send for SharedDevice {}

/// Devices made so far, or why one could not be: a missing driver does not come back, so
/// it is tried once per GPU, not once per stream and reconnect.
static DEVICES: OnceLock<Mutex<HashMap<i32, Result<SharedDevice, String>>>> = OnceLock::new();

/// A new reference to GPU `device`'s CUDA context (the caller owns it), made on first use
/// on the device's primary context, the one ONNX Runtime's CUDA provider uses too.
pub(super) fn device_ref(device: i32) -> Result<*mut ff::AVBufferRef, String> {
    let mut devices = DEVICES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    match devices.entry(device).or_insert_with(|| create_device(device)) {
        // SAFETY: the shared reference is valid for the process's life.
        Ok(shared) => match unsafe { ff::av_buffer_ref(shared.0) } {
            r if r.is_null() => Err("FFmpeg could not allocate memory".into()),
            r => Ok(r),
        },
        Err(reason) => Err(reason.clone()),
    }
}

fn create_device(device: i32) -> Result<SharedDevice, String> {
    let name = CString::new(device.to_string()).map_err(|e| e.to_string())?;
    let mut options: *mut ff::AVDictionary = ptr::null_mut();
    let mut ctx: *mut ff::AVBufferRef = ptr::null_mut();
    // SAFETY: plain FFmpeg calls with valid C strings; the dictionary is freed here.
    let rc = unsafe {
        ff::av_dict_set(&mut options, c"primary_ctx".as_ptr(), c"1".as_ptr(), 0);
        let rc = ff::av_hwdevice_ctx_create(
            &mut ctx,
            ff::AVHWDeviceType::AV_HWDEVICE_TYPE_CUDA,
            name.as_ptr(),
            options,
            0,
        );
        ff::av_dict_free(&mut options);
        rc
    };
    if rc < 0 || ctx.is_null() {
        return Err(format!(
            "no CUDA device {device} for NVDEC ({}; is the NVIDIA driver installed?)",
            error_text(rc)
        ));
    }
    Ok(SharedDevice(ctx))
}

/// What the decoder's pixel-format choice came to (read by the decode thread).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FormatOutcome {
    /// No format chosen yet (no picture's parameters seen).
    Pending,
    /// NVDEC decodes.
    Hardware,
    /// FFmpeg did not offer NVDEC for this stream (codec profile, bit depth, size, or
    /// `libnvcuvid` missing): software decoding, or nothing when NVDEC was required.
    NotOffered,
}

/// Owned by a decoder; FFmpeg's `get_format` callback reaches it through `opaque`.
pub(super) struct FormatChoice {
    required: bool,
    outcome: AtomicU8,
}

impl FormatChoice {
    pub(super) fn new(required: bool) -> Box<Self> {
        Box::new(Self {
            required,
            outcome: AtomicU8::new(0),
        })
    }

    pub(super) fn outcome(&self) -> FormatOutcome {
        match self.outcome.load(Ordering::Acquire) {
            0 => FormatOutcome::Pending,
            1 => FormatOutcome::Hardware,
            _ => FormatOutcome::NotOffered,
        }
    }
}

/// FFmpeg's `get_format`: CUDA surfaces when offered. FFmpeg calls it again without CUDA
/// when the hwaccel fails to start, which lands in the software branch.
///
/// # Safety
/// Called by FFmpeg with a context whose `opaque` is a live [`FormatChoice`] and a list
/// ending in `AV_PIX_FMT_NONE`.
pub(super) unsafe extern "C" fn choose_format(
    ctx: *mut ff::AVCodecContext,
    formats: *const ff::AVPixelFormat,
) -> ff::AVPixelFormat {
    let choice = &*((*ctx).opaque as *const FormatChoice);
    let mut software = ff::AVPixelFormat::AV_PIX_FMT_NONE;
    let mut p = formats;
    while *p != ff::AVPixelFormat::AV_PIX_FMT_NONE {
        if *p == ff::AVPixelFormat::AV_PIX_FMT_CUDA {
            choice.outcome.store(1, Ordering::Release);
            return *p;
        }
        let desc = ff::av_pix_fmt_desc_get(*p);
        let hardware = !desc.is_null() && (*desc).flags & ff::AV_PIX_FMT_FLAG_HWACCEL as u64 != 0;
        if software == ff::AVPixelFormat::AV_PIX_FMT_NONE && !hardware {
            software = *p;
        }
        p = p.add(1);
    }
    choice.outcome.store(2, Ordering::Release);
    if choice.required {
        ff::AVPixelFormat::AV_PIX_FMT_NONE
    } else {
        software
    }
}

/// The planes swscale reads: a software frame's own, or a downloaded surface's.
pub(super) struct Planes {
    pub format: ff::AVPixelFormat,
    pub data: [*const u8; 8],
    pub linesize: [c_int; 8],
}

/// A decoded CUDA surface copied to the host: the download frame is reused while the size
/// and format stay, and NV12's interleaved chroma is split into the I420 planes FFmpeg's
/// software decoder gives, so that swscale takes the very path (and arithmetic) of CPU
/// decoding and NVDEC's pixels, bit-exact by the codec's definition, give the same RGB.
pub(super) struct HostCopy {
    frame: *mut ff::AVFrame,
    u: Vec<u8>,
    v: Vec<u8>,
}

impl Default for HostCopy {
    fn default() -> Self {
        Self {
            frame: ptr::null_mut(),
            u: Vec::new(),
            v: Vec::new(),
        }
    }
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
        let sw_format = (*((*s.hw_frames_ctx).data as *const ff::AVHWFramesContext)).sw_format;
        self.ensure_frame(sw_format, s.width, s.height)?;
        let rc = ff::av_hwframe_transfer_data(self.frame, surface, 0);
        if rc < 0 {
            return Err(DecodeError::Download(error_text(rc)));
        }
        let f = &*self.frame;
        if sw_format != ff::AVPixelFormat::AV_PIX_FMT_NV12 {
            // 10-bit (P010/P016) goes to swscale as it is.
            return Ok(Planes {
                format: sw_format,
                data: f.data.map(|p| p as *const u8),
                linesize: f.linesize,
            });
        }
        let (width, height) = (f.width as usize, f.height as usize);
        let (chroma_w, chroma_h) = (width.div_ceil(2), height.div_ceil(2));
        self.u.resize(chroma_w * chroma_h, 0);
        self.v.resize(chroma_w * chroma_h, 0);
        let stride = f.linesize[1] as usize;
        let interleaved = std::slice::from_raw_parts(f.data[1], stride * (chroma_h - 1) + chroma_w * 2);
        split_interleaved_chroma(interleaved, stride, chroma_w, chroma_h, &mut self.u, &mut self.v);
        let chroma_stride = c_int::try_from(chroma_w).map_err(|_| DecodeError::OutputTooSmall)?;
        Ok(Planes {
            format: ff::AVPixelFormat::AV_PIX_FMT_YUV420P,
            data: [
                f.data[0],
                self.u.as_ptr(),
                self.v.as_ptr(),
                ptr::null(),
                ptr::null(),
                ptr::null(),
                ptr::null(),
                ptr::null(),
            ],
            linesize: [f.linesize[0], chroma_stride, chroma_stride, 0, 0, 0, 0, 0],
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
    fn a_machine_without_the_driver_gets_a_reason_not_a_crash() {
        // CI has no NVIDIA driver; on a GPU machine device 0 exists and this checks nothing.
        match device_ref(0) {
            Ok(mut r) => unsafe { ff::av_buffer_unref(&mut r) },
            Err(reason) => assert!(reason.contains("no CUDA device 0"), "{reason}"),
        }
        // A device that exists nowhere fails on every machine, and the failure is kept.
        let first = device_ref(4096).unwrap_err();
        assert_eq!(device_ref(4096).unwrap_err(), first);
    }
}
