//! JPEG decoding and letterboxing on the GPU: nvJPEG (the hardware decoder where the GPU
//! has one, A100/H100/H200; its CUDA decoder elsewhere) into per-slot planar Y/Cb/Cr
//! buffers, then the `ycc_to_rgb` kernel (libjpeg-turbo's own chroma upsampling and colour
//! tables) and the letterbox kernel (the CPU letterbox's own fixed-point bilinear, from
//! tables the host builds) straight into the model's device input, padded with the
//! letterbox's gray. No pixel crosses PCIe: only the compressed bytes and the small tables
//! go in. What remains different from the CPU is nvJPEG's IDCT.

use std::ffi::c_int;

use peregrine_vision::jpeg_planes::{DecodedPlanes, YccToRgb};

use super::batched::BatchedStates;
use super::canvas::{grow, CanvasWriter, Placement};
use super::ffi::{Handle, NvjpegImage};
use super::kernel::{DevicePlanes, ImageKernels};
pub use super::planes::JpegInfo;
use super::planes::{chroma_allocation, kernel_layout};
use super::{api, CopyKind, CudaError, DeviceBuffer, Stream};

const NVJPEG_BACKEND_DEFAULT: c_int = 0;
const NVJPEG_BACKEND_HARDWARE: c_int = 3;
const NVJPEG_OUTPUT_UNCHANGED: c_int = 0;
const NVJPEG_OUTPUT_YUV: c_int = 1;
const NVJPEG_OUTPUT_RGBI: c_int = 5;

/// Who turns the decoded planes into RGB.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ColourConversion {
    /// Our kernel, with libjpeg-turbo's upsampling and tables: the CPU path's pixels but
    /// for nvJPEG's IDCT. The server's default.
    #[default]
    LibjpegTurbo,
    /// nvJPEG's own (interleaved RGB output): its chroma upsampling and rounding differ
    /// from libjpeg-turbo's; as fast as the exact path since both pre-allocate nvJPEG's
    /// buffers (docs/benchmarks.md). `--gpu-jpeg-colour nvjpeg`, and for comparison in
    /// `peregrine bench-decode`.
    Nvjpeg,
}

/// What one image of a decode call left on the device.
#[derive(Debug, Clone, Copy)]
enum Decoded {
    Planes(DevicePlanes),
    /// Interleaved RGB, rows `width * 3` bytes.
    Rgb(*const u8),
}

fn nvjpeg_check(what: &str, code: c_int) -> Result<(), CudaError> {
    if code == 0 {
        return Ok(());
    }
    let name = match code {
        1 => "not initialized",
        2 => "invalid parameter",
        3 => "bad JPEG",
        4 => "JPEG not supported",
        5 => "allocator failure",
        6 => "execution failed",
        7 => "architecture mismatch",
        8 => "internal error",
        9 => "implementation not supported",
        10 => "incomplete bitstream",
        _ => "unknown status",
    };
    Err(CudaError(format!("{what}: nvJPEG status {code} ({name})")))
}

/// One image of a batch: the JPEG and where it goes.
#[derive(Debug, Clone, Copy)]
pub struct JpegSlot<'a> {
    pub data: &'a [u8],
    /// The image's size (as the header states it) and its place on the canvas.
    pub place: Placement<'a>,
}

pub struct GpuJpegDecoder {
    handle: Handle,
    /// nvJPEG's batched states, by batch size, with room pre-allocated.
    batched: BatchedStates,
    hardware: bool,
    stream: Stream,
    kernels: ImageKernels,
    conversion: ColourConversion,
    /// libjpeg-turbo's YCbCr->RGB tables, on the device.
    colour_tables: DeviceBuffer,
    /// nvJPEG's output, one buffer per position in the decode call, grown as needed.
    decoded: Vec<DeviceBuffer>,
    /// The pad, the tables and the RGB of images that are then resized.
    writer: CanvasWriter,
    /// The planar output asked of nvJPEG: YUV, or the same planes as "unchanged" where a
    /// backend refuses YUV.
    planar_format: c_int,
}

// SAFETY: the nvJPEG handle and states are owned by this value and used through `&mut self`.
unsafe impl Send for GpuJpegDecoder {}

impl Drop for GpuJpegDecoder {
    fn drop(&mut self) {
        if let Ok(api) = api() {
            // The states before their handle.
            self.batched.destroy(api);
            // SAFETY: created in `new`, destroyed once.
            unsafe { (api.nvjpeg_destroy)(self.handle) };
        }
    }
}

impl GpuJpegDecoder {
    /// A decoder on `device`, converting colour as libjpeg-turbo does.
    pub fn new(device: i32) -> Result<Self, CudaError> {
        Self::with_conversion(device, ColourConversion::LibjpegTurbo)
    }

    /// A decoder on `device` whose RGB comes from `conversion`.
    pub fn with_conversion(device: i32, conversion: ColourConversion) -> Result<Self, CudaError> {
        let api = api()?;
        super::set_device(device)?;
        let mut handle: Handle = std::ptr::null_mut();
        let null = std::ptr::null_mut();
        // SAFETY: writes a handle; default allocators.
        let mut hardware = true;
        let status = unsafe { (api.nvjpeg_create_ex)(NVJPEG_BACKEND_HARDWARE, null, null, 0, &mut handle) };
        if status != 0 {
            hardware = false;
            tracing::info!(
                status,
                "no hardware JPEG decoder on this GPU; nvJPEG's CUDA decoder is used"
            );
            // SAFETY: as above.
            nvjpeg_check("nvjpegCreateEx", unsafe {
                (api.nvjpeg_create_ex)(NVJPEG_BACKEND_DEFAULT, null, null, 0, &mut handle)
            })?;
        }
        let stream = super::create_stream()?;
        let kernels = ImageKernels::for_device(device)?;
        let colour_tables = upload_colour_tables(&stream)?;
        Ok(Self {
            handle,
            batched: BatchedStates::new(),
            hardware,
            stream,
            kernels,
            conversion,
            colour_tables,
            decoded: Vec::new(),
            writer: CanvasWriter::new()?,
            planar_format: NVJPEG_OUTPUT_YUV,
        })
    }

    /// Whether the GPU's hardware JPEG decoder is used.
    pub fn is_hardware(&self) -> bool {
        self.hardware
    }

    /// The stream every operation runs on.
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    /// Reads a JPEG's header (size, components) without decoding it.
    pub fn info(&self, data: &[u8]) -> Result<JpegInfo, CudaError> {
        let api = api()?;
        let (mut components, mut subsampling) = (0, 0);
        let (mut widths, mut heights) = ([0 as c_int; 4], [0 as c_int; 4]);
        // SAFETY: reads `data`, writes the outputs (arrays of four).
        nvjpeg_check("nvjpegGetImageInfo", unsafe {
            (api.nvjpeg_get_image_info)(
                self.handle,
                data.as_ptr(),
                data.len(),
                &mut components,
                &mut subsampling,
                widths.as_mut_ptr(),
                heights.as_mut_ptr(),
            )
        })?;
        let size = |i: usize| (widths[i].max(0) as usize, heights[i].max(0) as usize);
        Ok(JpegInfo {
            width: size(0).0,
            height: size(0).1,
            components: components.max(0) as usize,
            subsampling,
            chroma_size: size(1),
        })
    }

    /// Decodes `images` in one batched call into this decoder's buffers (planes or RGB, as
    /// its conversion says), on its stream; returns what each left where. Does not wait.
    fn decode(&mut self, images: &[&[u8]]) -> Result<Vec<(JpegInfo, Decoded)>, CudaError> {
        let _nvtx = crate::nvtx::range(c"jpeg decode");
        let n = images.len();
        while self.decoded.len() < n {
            self.decoded.push(DeviceBuffer::new(0)?);
        }
        let mut outputs = Vec::with_capacity(n);
        let mut decoded = Vec::with_capacity(n);
        for (i, data) in images.iter().enumerate() {
            let info = self
                .info(data)
                .map_err(|e| CudaError(format!("image {i}: {e}")))?;
            let (w, h) = (info.width, info.height);
            let mut image = NvjpegImage {
                channel: [std::ptr::null_mut(); 4],
                pitch: [0; 4],
            };
            if self.conversion == ColourConversion::Nvjpeg {
                grow(&mut self.decoded[i], w * h * 3)?;
                image.channel[0] = self.decoded[i].ptr().cast();
                image.pitch[0] = w * 3;
                decoded.push((info, Decoded::Rgb(image.channel[0])));
                outputs.push(image);
                continue;
            }
            let subsampling = info.layout().map_err(|e| CudaError(format!("image {i}: {e}")))?;
            grow(&mut self.decoded[i], info.plane_bytes(subsampling))?;
            let (cw, ch) = chroma_allocation(subsampling, w, h);
            let base = self.decoded[i].ptr().cast::<u8>();
            // SAFETY: the buffer holds the three packed planes (`plane_bytes`).
            let (cb, cr) = unsafe { (base.add(w * h), base.add(w * h + cw * ch)) };
            image.channel[..3].copy_from_slice(&[base, cb, cr]);
            image.pitch[..3].copy_from_slice(&[w, cw, cw]);
            outputs.push(image);
            decoded.push((
                info,
                Decoded::Planes(DevicePlanes {
                    size: (w, h),
                    layout: kernel_layout(subsampling),
                    luma: base,
                    luma_pitch: w,
                    cb,
                    cr,
                    chroma_pitch: cw,
                    chroma_size: subsampling.chroma_size(w, h),
                }),
            ));
        }
        let format = match self.conversion {
            ColourConversion::LibjpegTurbo => self.planar_format,
            ColourConversion::Nvjpeg => NVJPEG_OUTPUT_RGBI,
        };
        let sizes: Vec<(usize, usize)> = decoded
            .iter()
            .map(|(info, _)| (info.width, info.height))
            .collect();
        match self.decode_batched(images, &sizes, &mut outputs, format) {
            // Invalid parameter, not supported, implementation not supported: ask for the
            // same planes as they are coded instead (3-component JPEGs are coded as Y, Cb,
            // Cr at their own resolutions; gray as Y).
            Err(status) if format == NVJPEG_OUTPUT_YUV && matches!(status, 2 | 4 | 9) => {
                tracing::info!(
                    status,
                    "nvJPEG refused planar YUV output; asking for the planes unchanged"
                );
                self.planar_format = NVJPEG_OUTPUT_UNCHANGED;
                self.decode_batched(images, &sizes, &mut outputs, NVJPEG_OUTPUT_UNCHANGED)
            }
            other => other,
        }
        .or_else(|status| nvjpeg_check("nvjpegDecodeBatched", status))?;
        Ok(decoded)
    }

    /// One batched decode of `images` into `outputs` as `format`; the nvJPEG status of the
    /// call that failed.
    fn decode_batched(
        &mut self,
        images: &[&[u8]],
        sizes: &[(usize, usize)],
        outputs: &mut [NvjpegImage],
        format: c_int,
    ) -> Result<(), c_int> {
        let api = api().map_err(|_| 1)?;
        self.batched
            .decode(api, self.handle, images, sizes, outputs, format, &self.stream)
    }

    /// Decodes `images` and copies nvJPEG's planes back, before any upsampling or colour
    /// conversion: the IDCT's output, to compare with libjpeg-turbo's. Only for a decoder
    /// converting colour as libjpeg-turbo does.
    pub fn decode_to_host(&mut self, images: &[&[u8]]) -> Result<Vec<DecodedPlanes>, CudaError> {
        if self.conversion != ColourConversion::LibjpegTurbo {
            return Err(CudaError("only a decoder of planes has planes to return".into()));
        }
        let decoded = self.decode(images)?;
        let mut host = Vec::with_capacity(decoded.len());
        for (info, d) in &decoded {
            let Decoded::Planes(p) = d else {
                unreachable!("a planar decoder decodes planes");
            };
            let subsampling = info.layout()?;
            let (cw, ch) = subsampling.chroma_size(p.size.0, p.size.1);
            let mut planes = DecodedPlanes {
                width: p.size.0,
                height: p.size.1,
                subsampling,
                y: vec![0; p.size.0 * p.size.1],
                y_pitch: p.size.0,
                cb: vec![0; cw * ch],
                cr: vec![0; cw * ch],
                chroma_pitch: cw,
            };
            for (dst, src) in [
                (&mut planes.y, p.luma),
                (&mut planes.cb, p.cb),
                (&mut planes.cr, p.cr),
            ] {
                // SAFETY: each plane is packed at its width, `dst.len()` bytes; the stream
                // is synchronised before `dst` is read.
                unsafe {
                    super::copy_async(
                        dst.as_mut_ptr().cast(),
                        src.cast(),
                        dst.len(),
                        CopyKind::DeviceToHost,
                        &self.stream,
                    )
                }?;
            }
            host.push(planes);
        }
        super::synchronize(&self.stream)?;
        Ok(host)
    }

    /// Decodes every slot's JPEG and letterboxes it into its place in `canvas`: device
    /// memory holding `[N, canvas_height, canvas_width, 3]` uint8. The slots' whole canvases
    /// are overwritten (padding included); other slots are left alone. Returns once the
    /// canvas is written (the stream is synchronised).
    ///
    /// # Safety
    /// `canvas` must be device memory on this decoder's device, large enough for every
    /// slot index given, and not written by anything else until this returns.
    pub unsafe fn letterbox_into(
        &mut self,
        slots: &[JpegSlot<'_>],
        canvas: *mut u8,
        canvas_width: usize,
        canvas_height: usize,
    ) -> Result<(), CudaError> {
        if slots.is_empty() {
            return Ok(());
        }
        let placements: Vec<Placement<'_>> = slots.iter().map(|s| s.place).collect();
        // SAFETY: as the caller vouches.
        let targets = unsafe {
            self.writer
                .prepare(&placements, canvas, (canvas_width, canvas_height), &self.stream)
        }?;
        let images: Vec<&[u8]> = slots.iter().map(|s| s.data).collect();
        let decoded = self.decode(&images)?;
        for (s, (info, _)) in slots.iter().zip(&decoded) {
            let p = &s.place;
            if (info.width, info.height) != (p.width, p.height) {
                return Err(CudaError(format!(
                    "slot {}: nvJPEG reads a {}x{} image where the header check read {}x{}",
                    p.slot, info.width, info.height, p.width, p.height
                )));
            }
        }
        for (i, ((p, target), (_, decoded))) in placements.iter().zip(&targets).zip(&decoded).enumerate() {
            // The RGB the letterbox reads: nvJPEG's, or ours converted from the planes
            // (straight onto the canvas when there is nothing to resize).
            let rgb: *const u8 = match *decoded {
                Decoded::Rgb(rgb) => rgb,
                Decoded::Planes(planes) => {
                    let (out, pitch) = self.writer.rgb_target(i, p, target)?;
                    let tables = self.colour_tables.ptr().cast::<i32>();
                    // SAFETY: the planes were written by the decode on this stream; `out`
                    // holds the image at `pitch`.
                    unsafe { self.kernels.ycc_to_rgb(&planes, tables, out, pitch, &self.stream) }?;
                    out
                }
            };
            // SAFETY: `rgb` holds the image's RGB rows, written on this stream; the target
            // is this batch's.
            unsafe { self.writer.place(&self.kernels, p, rgb, target, &self.stream) }?;
        }
        super::synchronize(&self.stream)
    }
}

/// libjpeg-turbo's colour tables (`YccToRgb`), in device memory.
fn upload_colour_tables(stream: &Stream) -> Result<DeviceBuffer, CudaError> {
    let colour = YccToRgb::new().tables();
    let bytes = colour.len() * std::mem::size_of::<i32>();
    let buffer = DeviceBuffer::new(bytes)?;
    // SAFETY: the buffer holds the tables; the stream is synchronised before `colour` goes.
    unsafe {
        super::copy_async(
            buffer.ptr(),
            colour.as_ptr().cast(),
            bytes,
            CopyKind::HostToDevice,
            stream,
        )
    }?;
    super::synchronize(stream)?;
    Ok(buffer)
}
