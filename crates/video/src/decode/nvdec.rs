//! NVDEC through FFmpeg's CUDA hwaccel: a device context per decoder on the GPU's primary
//! context with a stream of its own, and the pixel-format choice that turns the hardware on
//! or falls back. The copy of a decoded surface to the host is [`super::download`]'s.
//!
//! FFmpeg loads `libcuda` and `libnvcuvid` itself when a device or decoder is made, so
//! nothing here needs CUDA at build time and a machine without a GPU gets a reason, not a
//! crash.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};

use ffmpeg_sys_next as ff;

use super::cuda;
use super::ffmpeg::error_text;

/// GPU `device`'s primary context, retained for the process's life, or why it could not be.
struct PrimaryContext(cuda::Context);

// SAFETY: a CUDA context may be made current on any thread.
unsafe impl Send for PrimaryContext {}

/// Contexts retained so far, or why one could not be: a missing driver does not come back,
/// so it is tried once per GPU, not once per stream and reconnect.
static CONTEXTS: OnceLock<Mutex<HashMap<i32, Result<PrimaryContext, String>>>> = OnceLock::new();

fn primary_context(device: i32) -> Result<cuda::Context, String> {
    let mut contexts = CONTEXTS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    let entry = contexts.entry(device).or_insert_with(|| {
        cuda::driver()
            .and_then(|driver| driver.retain_primary_context(device))
            .map(PrimaryContext)
            .map_err(|e| format!("no CUDA device {device} for NVDEC ({e}; is the NVIDIA driver installed?)"))
    });
    match entry {
        Ok(ctx) => Ok(ctx.0),
        Err(reason) => Err(reason.clone()),
    }
}

/// A new FFmpeg CUDA device context for one decoder (the caller owns the reference): on
/// GPU `device`'s primary context, which ONNX Runtime's CUDA provider uses too (FFmpeg's
/// own `primary_ctx` option refuses a primary context another library started with other
/// scheduling flags), with a non-blocking stream of its own so that decoders do not queue
/// behind each other's surface maps and copies on the context's default stream.
pub(super) fn device_ref(device: i32) -> Result<*mut ff::AVBufferRef, String> {
    let ctx = primary_context(device)?;
    let driver = cuda::driver()?;
    let stream = driver.with_context(ctx, || driver.create_stream())?;
    // SAFETY: the allocation is checked; hwctx of a CUDA device context is an
    // AVCUDADeviceContext, filled before av_hwdevice_ctx_init as hwcontext_cuda.h says. From
    // the moment `free` is set, FFmpeg's release of the context destroys the stream.
    unsafe {
        let mut reference = ff::av_hwdevice_ctx_alloc(ff::AVHWDeviceType::AV_HWDEVICE_TYPE_CUDA);
        if reference.is_null() {
            driver.destroy_stream(ctx, stream)?;
            return Err("FFmpeg could not allocate memory".into());
        }
        let device_ctx = (*reference).data as *mut ff::AVHWDeviceContext;
        let hwctx = (*device_ctx).hwctx as *mut ff::AVCUDADeviceContext;
        (*hwctx).cuda_ctx = ctx.cast();
        (*hwctx).stream = stream.cast();
        (*device_ctx).free = Some(release_stream);
        let rc = ff::av_hwdevice_ctx_init(reference);
        if rc < 0 {
            ff::av_buffer_unref(&mut reference);
            return Err(format!(
                "FFmpeg could not use CUDA device {device}: {}",
                error_text(rc)
            ));
        }
        Ok(reference)
    }
}

/// The device context's `free`: FFmpeg calls it once every frame and decoder using the
/// context is gone. The context itself stays retained.
unsafe extern "C" fn release_stream(device_ctx: *mut ff::AVHWDeviceContext) {
    let hwctx = (*device_ctx).hwctx as *const ff::AVCUDADeviceContext;
    let (ctx, stream) = (
        (*hwctx).cuda_ctx as cuda::Context,
        (*hwctx).stream as cuda::Stream,
    );
    if let Ok(driver) = cuda::driver() {
        let _ = driver.destroy_stream(ctx, stream);
    }
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

#[cfg(test)]
mod tests {
    use super::*;

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
