//! JPEG decoding and letterboxing on the GPU: nvJPEG (the hardware decoder where the GPU
//! has one, A100/H100/H200; its CUDA decoder elsewhere) into per-slot planar Y/Cb/Cr
//! buffers, then the `ycc_to_rgb` kernel (libjpeg-turbo's own chroma upsampling and colour
//! tables) and the letterbox kernel (the CPU letterbox's own fixed-point bilinear, from
//! tables the host builds) straight into the model's device input, padded with the
//! letterbox's gray. No pixel crosses PCIe: only the compressed bytes and the small tables
//! go in. What remains different from the CPU is nvJPEG's IDCT.

use std::ffi::{c_int, c_void};

use peregrine_vision::jpeg_planes::{DecodedPlanes, YccToRgb};

use super::batched::BatchedStates;
use super::ffi::{Handle, NvjpegImage};
use super::kernel::{DevicePlanes, ImageKernels};
pub use super::planes::JpegInfo;
use super::planes::{chroma_allocation, kernel_layout};
use super::{api, check, CopyKind, CudaError, DeviceBuffer, Stream};

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

/// One image of a batch: where it goes and at what size.
#[derive(Debug, Clone, Copy)]
pub struct JpegSlot<'a> {
    /// Index of the image in the batch tensor.
    pub slot: usize,
    pub data: &'a [u8],
    /// The image's size as the header states it.
    pub width: usize,
    pub height: usize,
    /// The size it is resized to, and where that goes on the canvas.
    pub scaled: (usize, usize),
    pub offset: (usize, usize),
    /// The gray the rest of the canvas is filled with.
    pub pad_value: u8,
    /// The resampling, as `peregrine_vision::resample_tables` gives it: one row per output
    /// column and one per output row (unused when `scaled` is the image's own size).
    pub columns: &'a [[i32; 4]],
    pub rows: &'a [[i32; 4]],
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
    /// Every slot's resampling tables for the current batch, on the host (kept until the
    /// next batch, so the asynchronous upload never reads freed memory) and on the device.
    host_tables: Vec<[i32; 4]>,
    tables: DeviceBuffer,
    /// nvJPEG's output, one buffer per position in the decode call, grown as needed.
    decoded: Vec<DeviceBuffer>,
    /// RGB converted from the planes, for images that are then resized.
    rgb: Vec<DeviceBuffer>,
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
        let attr = |a: c_int| -> Result<c_int, CudaError> {
            let mut v = 0;
            // SAFETY: writes one attribute value.
            check(api, "cudaDeviceGetAttribute", unsafe {
                (api.cuda_device_get_attribute)(&mut v, a, device)
            })?;
            Ok(v)
        };
        // cudaDevAttrComputeCapabilityMajor / Minor (driver_types.h).
        let kernels = ImageKernels::compile(attr(75)?, attr(76)?)?;
        let colour_tables = upload_colour_tables(&stream)?;
        Ok(Self {
            handle,
            batched: BatchedStates::new(),
            hardware,
            stream,
            kernels,
            conversion,
            colour_tables,
            host_tables: Vec::new(),
            tables: DeviceBuffer::new(0)?,
            decoded: Vec::new(),
            rgb: Vec::new(),
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
        let api = api()?;
        let n = slots.len();
        for s in slots {
            check_geometry(s, canvas_width, canvas_height)?;
        }
        let images: Vec<&[u8]> = slots.iter().map(|s| s.data).collect();
        let decoded = self.decode(&images)?;
        for (s, (info, _)) in slots.iter().zip(&decoded) {
            if (info.width, info.height) != (s.width, s.height) {
                return Err(CudaError(format!(
                    "slot {}: nvJPEG reads a {}x{} image where the header check read {}x{}",
                    s.slot, info.width, info.height, s.width, s.height
                )));
            }
        }
        while self.rgb.len() < n {
            self.rgb.push(DeviceBuffer::new(0)?);
        }
        let table_at = self.upload_resampling_tables(slots)?;
        let slot_bytes = canvas_width * canvas_height * 3;
        let row_bytes = canvas_width * 3;
        for (i, (s, (_, decoded))) in slots.iter().zip(&decoded).enumerate() {
            // SAFETY: the caller vouches for the canvas; `check_geometry` kept the image
            // inside its slot.
            let base = unsafe { canvas.add(s.slot * slot_bytes) };
            // SAFETY: as above.
            check(api, "cudaMemsetAsync", unsafe {
                (api.cuda_memset_async)(base.cast(), c_int::from(s.pad_value), slot_bytes, self.stream.0)
            })?;
            let dst = unsafe { base.add(s.offset.1 * row_bytes + s.offset.0 * 3) };
            let resized = s.scaled != (s.width, s.height);
            // The RGB the letterbox reads: nvJPEG's, or ours converted from the planes
            // (straight into the canvas when there is nothing to resize).
            let rgb: *const u8 = match *decoded {
                Decoded::Rgb(rgb) => rgb,
                Decoded::Planes(planes) => {
                    let (out, pitch) = if resized {
                        grow(&mut self.rgb[i], s.width * s.height * 3)?;
                        (self.rgb[i].ptr().cast::<u8>(), s.width * 3)
                    } else {
                        (dst, row_bytes)
                    };
                    let tables = self.colour_tables.ptr().cast::<i32>();
                    // SAFETY: the planes were written by the decode on this stream; `out`
                    // holds the image at `pitch`.
                    unsafe { self.kernels.ycc_to_rgb(&planes, tables, out, pitch, &self.stream) }?;
                    if !resized {
                        continue;
                    }
                    out
                }
            };
            // SAFETY: `rgb` holds the image's RGB rows of `width * 3` bytes, written on this
            // stream; the tables were uploaded on it; the destination is inside the slot.
            unsafe { self.place(s, rgb, table_at[i], dst, row_bytes) }?;
        }
        super::synchronize(&self.stream)
    }

    /// Copies or resamples one slot's RGB into its place on the canvas.
    ///
    /// # Safety
    /// As [`Self::letterbox_into`]'s loop says.
    unsafe fn place(
        &self,
        s: &JpegSlot<'_>,
        rgb: *const u8,
        table_at: usize,
        dst: *mut u8,
        row_bytes: usize,
    ) -> Result<(), CudaError> {
        let api = api()?;
        let (sw, sh) = s.scaled;
        if s.scaled == (s.width, s.height) {
            // SAFETY: as the caller vouches.
            return check(api, "cudaMemcpy2DAsync", unsafe {
                (api.cuda_memcpy_2d_async)(
                    dst.cast(),
                    row_bytes,
                    rgb as *const c_void,
                    s.width * 3,
                    s.width * 3,
                    s.height,
                    CopyKind::DeviceToDevice as c_int,
                    self.stream.0,
                )
            });
        }
        let columns = unsafe { self.tables.ptr().cast::<i32>().add(table_at * 4) };
        let rows = unsafe { columns.add(sw * 4) };
        // SAFETY: as the caller vouches.
        unsafe {
            self.kernels.letterbox(
                rgb,
                s.width * 3,
                columns,
                rows,
                (sw, sh),
                dst,
                row_bytes,
                &self.stream,
            )
        }
    }

    /// All slots' resampling tables in one upload: columns then rows, slot after slot.
    /// Returns where each slot's start (in rows of four i32).
    fn upload_resampling_tables(&mut self, slots: &[JpegSlot<'_>]) -> Result<Vec<usize>, CudaError> {
        let tables = &mut self.host_tables;
        tables.clear();
        let mut table_at = Vec::with_capacity(slots.len());
        for s in slots {
            table_at.push(tables.len());
            tables.extend_from_slice(s.columns);
            tables.extend_from_slice(s.rows);
        }
        let table_bytes = tables.len() * 16;
        if self.tables.len() < table_bytes {
            self.tables = DeviceBuffer::new(table_bytes.next_power_of_two())?;
        }
        // SAFETY: `host_tables` is left alone until the next batch, after this one's
        // stream has been synchronised.
        unsafe {
            super::copy_async(
                self.tables.ptr(),
                tables.as_ptr().cast(),
                table_bytes,
                CopyKind::HostToDevice,
                &self.stream,
            )
        }?;
        Ok(table_at)
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

/// Replaces `buffer` with a larger one when it holds fewer than `bytes`.
/// Makes `buffer` hold at least `bytes` of one image's pixels, re-allocating only when it
/// is too small, to [`image_capacity`].
fn grow(buffer: &mut DeviceBuffer, bytes: usize) -> Result<(), CudaError> {
    if buffer.len() < bytes {
        *buffer = DeviceBuffer::new(image_capacity(bytes))?;
    }
    Ok(())
}

/// Bytes of the smallest per-image buffer: a 1920x1088 image's three full planes (or RGB),
/// so that camera-sized JPEGs (up to 1080p) never make a buffer grow after the warm-up.
const MIN_IMAGE_BYTES: usize = 1920 * 1088 * 3;

/// How much to allocate for an image of `bytes`: at least [`MIN_IMAGE_BYTES`], and a power
/// of two above that, so a buffer grows a few times at most. Growing frees the old buffer,
/// and `cudaFree` waits for the whole device: every instance's work stalls behind it. With
/// exact sizes, each of 8 instances' buffers grew at every larger image for the first
/// minute of traffic, which was the server's warm-up tail (docs/benchmarks.md).
fn image_capacity(bytes: usize) -> usize {
    bytes.max(MIN_IMAGE_BYTES).next_power_of_two()
}

/// Refuses a slot whose image does not fit its canvas or whose tables do not fit its size.
fn check_geometry(s: &JpegSlot<'_>, canvas_width: usize, canvas_height: usize) -> Result<(), CudaError> {
    let (sw, sh) = s.scaled;
    let (left, top) = s.offset;
    if sw + left > canvas_width || sh + top > canvas_height || sw == 0 || sh == 0 {
        return Err(CudaError(format!(
            "slot {}: a {sw}x{sh} image at ({left}, {top}) does not fit a {canvas_width}x{canvas_height} canvas",
            s.slot
        )));
    }
    let resized = (sw, sh) != (s.width, s.height);
    if resized && (s.columns.len() != sw || s.rows.len() != sh) {
        return Err(CudaError(format!(
            "slot {}: resampling tables for {}x{} given for a {sw}x{sh} image",
            s.slot,
            s.columns.len(),
            s.rows.len()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_buffers_hold_a_1080p_frame_at_least_and_grow_by_doubling() {
        assert_eq!(image_capacity(1), 8 << 20);
        assert_eq!(image_capacity(640 * 640 * 3), 8 << 20);
        assert!(image_capacity(1920 * 1080 * 3) >= 1920 * 1080 * 3);
        assert_eq!(image_capacity(3000 * 2000 * 3), 32 << 20);
        assert_eq!(image_capacity(32 << 20), 32 << 20);
    }
}
