//! The only unsafe code in the crate: FFmpeg's H.264/H.265 decoders and swscale, through
//! ffmpeg-sys-next's generated bindings, behind an owned [`VideoDecoder`].
//!
//! FFmpeg is linked statically (built by `scripts/fetch-ffmpeg.sh`), so these calls reach the
//! minimal build made there: two decoders, their parsers and NVDEC hwaccels, swscale and
//! pthreads. The NVDEC specifics are in [`super::nvdec`].

use std::ffi::{c_int, CStr};
use std::ptr;

use ffmpeg_sys_next as ff;

use super::download::{HostCopy, Planes};
use super::nvdec::{self, FormatChoice, FormatOutcome};
use super::surface::{GpuSurface, StreamWait};
use super::DecodeError;

/// Compressed formats the decoder takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Codec {
    H264,
    H265,
}

impl Codec {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::H264 => "h264",
            Self::H265 => "h265",
        }
    }

    fn id(self) -> ff::AVCodecID {
        match self {
            Self::H264 => ff::AVCodecID::AV_CODEC_ID_H264,
            Self::H265 => ff::AVCodecID::AV_CODEC_ID_HEVC,
        }
    }
}

/// What a decoder is opened with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecoderConfig {
    pub codec: Codec,
    /// An avcC/hvcC record (MP4 style: access units are then 4-byte length-prefixed NAL
    /// units), or `None` for Annex B access units carrying their own parameter sets.
    pub extradata: Option<Vec<u8>>,
    /// FFmpeg frame threads; 0 lets FFmpeg pick (one per core, plus one). Each thread adds
    /// one frame of decoding delay, which is why streams default to a small number.
    pub threads: usize,
}

/// Where a decoder runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Hardware {
    #[default]
    Cpu,
    /// NVDEC on GPU `device`; unless `required`, FFmpeg's software decoder takes over for a
    /// stream NVDEC does not decode. `held_frames`: pictures the caller keeps on the GPU
    /// ([`DecodedPicture::keep_on_gpu`]) at once at most, each holding a mapped surface,
    /// which NVDEC must have beyond those it decodes with.
    Nvdec {
        device: i32,
        required: bool,
        held_frames: usize,
    },
}

pub(super) fn error_text(code: c_int) -> String {
    let mut buf = [0 as std::ffi::c_char; 128];
    // SAFETY: `buf` is writable for its whole length and av_strerror NUL-terminates it.
    unsafe {
        ff::av_strerror(code, buf.as_mut_ptr(), buf.len());
        CStr::from_ptr(buf.as_ptr()).to_string_lossy().into_owned()
    }
}

/// One opened FFmpeg decoder with its packet, frame and scaler. Owned by one thread at a
/// time (it is `Send`, not `Sync`).
pub struct VideoDecoder {
    ctx: *mut ff::AVCodecContext,
    packet: *mut ff::AVPacket,
    frame: *mut ff::AVFrame,
    scaler: Scaler,
    /// Set for NVDEC: FFmpeg's `get_format` callback records its choice here (`opaque`).
    hardware: Option<Box<FormatChoice>>,
    host: HostCopy,
    /// Waits for the decoder's stream before a surface is handed out on the GPU.
    wait: StreamWait,
    /// FFmpeg reads up to AV_INPUT_BUFFER_PADDING_SIZE bytes past a packet's end, so every
    /// access unit is copied into this zero-padded buffer first.
    padded: Vec<u8>,
    codec: Codec,
}

// SAFETY: the FFmpeg objects are exclusively owned by this value and FFmpeg's decoder may be
// driven from any thread as long as calls are not concurrent, which `&mut self` ensures.
unsafe impl Send for VideoDecoder {}

impl std::fmt::Debug for VideoDecoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VideoDecoder")
            .field("codec", &self.codec)
            .finish()
    }
}

impl VideoDecoder {
    /// A decoder on the CPU.
    pub fn open(config: &DecoderConfig) -> Result<Self, DecodeError> {
        Self::open_on(config, Hardware::Cpu)
    }

    /// A decoder on `hardware`. NVDEC is an error here only when the GPU cannot be reached
    /// at all; whether it takes this stream shows with the first picture
    /// ([`Self::hardware_outcome`]).
    pub fn open_on(config: &DecoderConfig, hardware: Hardware) -> Result<Self, DecodeError> {
        super::ffmpeg_log::route_to_tracing();
        // SAFETY: plain FFmpeg allocation calls; every pointer is checked before use and
        // owned by `Self` (freed in Drop) from the moment the struct is built.
        unsafe {
            let codec = ff::avcodec_find_decoder(config.codec.id());
            if codec.is_null() {
                return Err(DecodeError::Unsupported(config.codec.as_str()));
            }
            let ctx = ff::avcodec_alloc_context3(codec);
            let packet = ff::av_packet_alloc();
            let frame = ff::av_frame_alloc();
            let mut this = Self {
                ctx,
                packet,
                frame,
                scaler: Scaler::default(),
                hardware: None,
                host: HostCopy::default(),
                wait: StreamWait::default(),
                padded: Vec::new(),
                codec: config.codec,
            };
            if ctx.is_null() || packet.is_null() || frame.is_null() {
                return Err(DecodeError::OutOfMemory);
            }
            if let Some(extra) = &config.extradata {
                let size = c_int::try_from(extra.len()).map_err(|_| DecodeError::BadExtradata)?;
                let padded_len = extra.len() + ff::AV_INPUT_BUFFER_PADDING_SIZE as usize;
                let data = ff::av_mallocz(padded_len) as *mut u8;
                if data.is_null() {
                    return Err(DecodeError::OutOfMemory);
                }
                ptr::copy_nonoverlapping(extra.as_ptr(), data, extra.len());
                (*ctx).extradata = data;
                (*ctx).extradata_size = size;
            }
            (*ctx).thread_count = c_int::try_from(config.threads).unwrap_or(0);
            (*ctx).thread_type = ff::FF_THREAD_FRAME as c_int;
            if let Hardware::Nvdec {
                device,
                required,
                held_frames,
            } = hardware
            {
                (*ctx).hw_device_ctx = nvdec::device_ref(device).map_err(DecodeError::NvdecUnavailable)?;
                let choice = this.hardware.insert(FormatChoice::new(required));
                (*ctx).opaque = &mut **choice as *mut FormatChoice as *mut std::ffi::c_void;
                (*ctx).get_format = Some(nvdec::choose_format);
                // NVDEC decodes asynchronously on its own; frame threads would only add
                // delay and surfaces.
                (*ctx).thread_count = 1;
                // Output surfaces for the pictures kept on the GPU, over FFmpeg's own.
                (*ctx).extra_hw_frames = c_int::try_from(held_frames).unwrap_or(c_int::MAX);
            }
            let rc = ff::avcodec_open2(ctx, codec, ptr::null_mut());
            if rc < 0 {
                return Err(DecodeError::Open(error_text(rc)));
            }
            Ok(this)
        }
    }

    pub fn codec(&self) -> Codec {
        self.codec
    }

    /// `None` for a CPU decoder; for NVDEC, whether it took the stream.
    pub fn hardware_outcome(&self) -> Option<FormatOutcome> {
        self.hardware.as_ref().map(|h| h.outcome())
    }

    /// Feeds one access unit (`pts` in the caller's units, handed back with each picture)
    /// and calls `on_picture` for every picture the decoder releases, in display order.
    /// A damaged access unit is an error for that unit only; the decoder stays usable.
    pub fn decode(
        &mut self,
        access_unit: &[u8],
        pts: i64,
        on_picture: &mut dyn FnMut(DecodedPicture<'_>),
    ) -> Result<(), DecodeError> {
        let size = c_int::try_from(access_unit.len()).map_err(|_| DecodeError::PacketTooLarge)?;
        self.padded.clear();
        self.padded.extend_from_slice(access_unit);
        self.padded
            .resize(access_unit.len() + ff::AV_INPUT_BUFFER_PADDING_SIZE as usize, 0);
        // SAFETY: the packet points into `self.padded`, which outlives the send call (FFmpeg
        // copies non-refcounted packet data before returning) and has the required padding.
        let rc = unsafe {
            (*self.packet).data = self.padded.as_mut_ptr();
            (*self.packet).size = size;
            (*self.packet).pts = pts;
            (*self.packet).dts = ff::AV_NOPTS_VALUE;
            let rc = ff::avcodec_send_packet(self.ctx, self.packet);
            (*self.packet).data = ptr::null_mut();
            (*self.packet).size = 0;
            rc
        };
        if rc == ff::AVERROR(ff::EAGAIN) {
            // Output must be drained first; drain, then the unit is sent again.
            self.drain(on_picture)?;
            return self.decode(access_unit, pts, on_picture);
        }
        if rc < 0 {
            // Drain whatever earlier units produced before reporting this unit's damage.
            self.drain(on_picture)?;
            return Err(DecodeError::Corrupt(error_text(rc)));
        }
        self.drain(on_picture)
    }

    /// Signals the end of the stream and releases the pictures still held for reordering or
    /// by frame threads. The decoder must be reopened afterwards.
    pub fn finish(&mut self, on_picture: &mut dyn FnMut(DecodedPicture<'_>)) -> Result<(), DecodeError> {
        // SAFETY: a null packet is FFmpeg's documented flush request.
        unsafe { ff::avcodec_send_packet(self.ctx, ptr::null()) };
        self.drain(on_picture)
    }

    fn drain(&mut self, on_picture: &mut dyn FnMut(DecodedPicture<'_>)) -> Result<(), DecodeError> {
        loop {
            // SAFETY: ctx and frame are valid; receive_frame unrefs the frame before filling.
            let rc = unsafe { ff::avcodec_receive_frame(self.ctx, self.frame) };
            if rc == ff::AVERROR(ff::EAGAIN) || rc == ff::AVERROR_EOF {
                return Ok(());
            }
            if rc < 0 {
                return Err(DecodeError::Corrupt(error_text(rc)));
            }
            // SAFETY: a successfully received frame has valid dimensions and timestamps.
            let (width, height, pts) = unsafe {
                let f = &*self.frame;
                let pts = if f.best_effort_timestamp != ff::AV_NOPTS_VALUE {
                    f.best_effort_timestamp
                } else {
                    f.pts
                };
                (f.width, f.height, pts)
            };
            let (Ok(width), Ok(height)) = (u32::try_from(width), u32::try_from(height)) else {
                continue;
            };
            on_picture(DecodedPicture {
                frame: self.frame,
                scaler: &mut self.scaler,
                host: &mut self.host,
                wait: &mut self.wait,
                width,
                height,
                pts,
            });
            // SAFETY: the picture borrow has ended; release its buffers for reuse.
            unsafe { ff::av_frame_unref(self.frame) };
        }
    }
}

impl Drop for VideoDecoder {
    fn drop(&mut self) {
        // SAFETY: each pointer is null or owned by us; the free functions accept null and
        // take a pointer to the pointer, which they reset.
        unsafe {
            ff::av_frame_free(&mut self.frame);
            ff::av_packet_free(&mut self.packet);
            ff::avcodec_free_context(&mut self.ctx);
        }
    }
}

/// A picture the decoder has released, valid until the callback returns. Converting it is
/// optional: frames that sampling skips never pay for the colour conversion.
pub struct DecodedPicture<'a> {
    frame: *const ff::AVFrame,
    scaler: &'a mut Scaler,
    host: &'a mut HostCopy,
    wait: &'a mut StreamWait,
    pub width: u32,
    pub height: u32,
    /// The `pts` given with the access unit this picture came from.
    pub pts: i64,
}

impl DecodedPicture<'_> {
    /// Keeps this picture in GPU `device`'s memory instead of converting it, once the
    /// decoder's work on it is done: `None` when it is not one that can stay there (see
    /// [`super::surface::unsuitable`]: a CPU-decoded picture, 10-bit, odd height).
    pub fn keep_on_gpu(&mut self, device: i32) -> Result<Option<GpuSurface>, DecodeError> {
        let wait = &mut *self.wait;
        // SAFETY: the frame is a valid decoded picture for the duration of this borrow.
        unsafe { GpuSurface::keep(self.frame, device, |ctx, stream| wait.wait(ctx, stream)) }
    }

    /// Converts to packed RGB8 into `out`: `height` rows of `stride` bytes.
    pub fn to_rgb(&mut self, out: &mut [u8], stride: usize) -> Result<(), DecodeError> {
        let rows = self.height as usize;
        if stride < self.width as usize * 3 || out.len() < stride * rows {
            return Err(DecodeError::OutputTooSmall);
        }
        let stride_c = c_int::try_from(stride).map_err(|_| DecodeError::OutputTooSmall)?;
        // SAFETY: the frame is a valid decoded picture for the duration of this borrow; `out`
        // holds `rows` rows of `stride` bytes, which is all swscale writes for one plane.
        unsafe {
            let f = &*self.frame;
            let planes = if f.format == ff::AVPixelFormat::AV_PIX_FMT_CUDA as c_int {
                self.host.download(self.frame)?
            } else {
                Planes {
                    format: pixel_format(f.format)?,
                    data: f.data.map(|p| p as *const u8),
                    linesize: f.linesize,
                }
            };
            let sws = self.scaler.prepare(f, planes.format)?;
            let dst = [
                out.as_mut_ptr(),
                ptr::null_mut(),
                ptr::null_mut(),
                ptr::null_mut(),
            ];
            let dst_stride = [stride_c, 0, 0, 0];
            let done = ff::sws_scale(
                sws,
                planes.data.as_ptr(),
                planes.linesize.as_ptr(),
                0,
                f.height,
                dst.as_ptr(),
                dst_stride.as_ptr(),
            );
            if done != f.height {
                return Err(DecodeError::Convert);
            }
        }
        Ok(())
    }
}

/// A decoded frame's `format` as the enum.
fn pixel_format(format: c_int) -> Result<ff::AVPixelFormat, DecodeError> {
    if format < 0 {
        return Err(DecodeError::Convert);
    }
    // SAFETY: a non-negative `format` of a decoded frame is one of FFmpeg's own values.
    Ok(unsafe { std::mem::transmute::<c_int, ff::AVPixelFormat>(format) })
}

/// swscale's context, rebuilt only when the input's size, format or colour description
/// changes.
struct Scaler {
    ctx: *mut ff::SwsContext,
    key: (c_int, c_int, c_int, c_int, c_int),
}

impl Default for Scaler {
    fn default() -> Self {
        Self {
            ctx: ptr::null_mut(),
            key: (0, 0, -1, -1, -1),
        }
    }
}

impl Scaler {
    /// # Safety
    /// `f` must be a valid decoded frame, its pixels (or a host copy's) in `src_format`.
    unsafe fn prepare(
        &mut self,
        f: &ff::AVFrame,
        src_format: ff::AVPixelFormat,
    ) -> Result<*mut ff::SwsContext, DecodeError> {
        let key = (
            f.width,
            f.height,
            src_format as c_int,
            f.colorspace as c_int,
            f.color_range as c_int,
        );
        if !self.ctx.is_null() && key == self.key {
            return Ok(self.ctx);
        }
        // Same size in and out: swscale takes its unscaled YUV-to-RGB path.
        let ctx = ff::sws_getCachedContext(
            self.ctx,
            f.width,
            f.height,
            src_format,
            f.width,
            f.height,
            ff::AVPixelFormat::AV_PIX_FMT_RGB24,
            ff::SWS_BILINEAR as c_int,
            ptr::null_mut(),
            ptr::null_mut(),
            ptr::null(),
        );
        if ctx.is_null() {
            self.ctx = ptr::null_mut();
            return Err(DecodeError::Convert);
        }
        let colorspace = sws_colorspace(f.colorspace as c_int, f.height);
        let coefficients = ff::sws_getCoefficients(colorspace);
        let full_range = c_int::from(f.color_range == ff::AVColorRange::AVCOL_RANGE_JPEG);
        let rgb_table = ff::sws_getCoefficients(ff::SWS_CS_DEFAULT as c_int);
        ff::sws_setColorspaceDetails(ctx, coefficients, full_range, rgb_table, 1, 0, 1 << 16, 1 << 16);
        self.ctx = ctx;
        self.key = key;
        Ok(ctx)
    }
}

/// The colour matrix (`SWS_CS_*`) a frame is converted with: the stream's own, or when it
/// says none (RGB or unspecified), BT.709 for HD pictures and BT.601 otherwise.
pub(crate) fn sws_colorspace(frame_colorspace: c_int, height: c_int) -> c_int {
    match frame_colorspace {
        0 | 2 if height >= 720 => ff::SWS_CS_ITU709 as c_int,
        0 | 2 => ff::SWS_CS_DEFAULT as c_int,
        c => c,
    }
}

impl Drop for Scaler {
    fn drop(&mut self) {
        // SAFETY: null or a context we own.
        unsafe { ff::sws_freeContext(self.ctx) };
    }
}

#[cfg(test)]
#[path = "ffmpeg_rgb_tests.rs"]
mod rgb_tests;
