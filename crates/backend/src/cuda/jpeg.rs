//! JPEG decoding and letterboxing on the GPU: nvJPEG (the hardware decoder where the GPU
//! has one, A100/H100/H200; its CUDA decoder elsewhere) into per-slot device buffers, then
//! the letterbox kernel (the CPU letterbox's own fixed-point bilinear, from tables the
//! host builds) straight into the model's device input, padded with the letterbox's gray.
//! No pixel crosses PCIe: only the compressed bytes and the small tables go in.

use std::ffi::{c_int, c_void};

use super::ffi::{Handle, NvjpegImage};
use super::kernel::LetterboxKernel;
use super::{api, check, CopyKind, CudaError, DeviceBuffer, Stream};

const NVJPEG_BACKEND_DEFAULT: c_int = 0;
const NVJPEG_BACKEND_HARDWARE: c_int = 3;
const NVJPEG_OUTPUT_RGBI: c_int = 5;

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

/// The image header as nvJPEG reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JpegInfo {
    pub width: usize,
    pub height: usize,
    pub components: usize,
}

pub struct GpuJpegDecoder {
    handle: Handle,
    state: Handle,
    hardware: bool,
    stream: Stream,
    kernel: LetterboxKernel,
    /// Every slot's resampling tables for the current batch, on the device.
    tables: DeviceBuffer,
    /// Decoded pixels, one buffer per position in the decode call, grown as needed.
    decoded: Vec<DeviceBuffer>,
    /// The batch size nvJPEG's batched state was last initialised for.
    initialized_for: usize,
}

// SAFETY: the nvJPEG handle and state are owned by this value and used through `&mut self`.
unsafe impl Send for GpuJpegDecoder {}

impl Drop for GpuJpegDecoder {
    fn drop(&mut self) {
        if let Ok(api) = api() {
            // SAFETY: both were created in `new` and are destroyed once.
            unsafe {
                (api.nvjpeg_jpeg_state_destroy)(self.state);
                (api.nvjpeg_destroy)(self.handle);
            }
        }
    }
}

impl GpuJpegDecoder {
    /// A decoder on `device`.
    pub fn new(device: i32) -> Result<Self, CudaError> {
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
        let mut state: Handle = std::ptr::null_mut();
        // SAFETY: writes a state for `handle`.
        if let Err(e) = nvjpeg_check("nvjpegJpegStateCreate", unsafe {
            (api.nvjpeg_jpeg_state_create)(handle, &mut state)
        }) {
            // SAFETY: destroy what was created.
            unsafe { (api.nvjpeg_destroy)(handle) };
            return Err(e);
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
        let kernel = LetterboxKernel::compile(attr(75)?, attr(76)?)?;
        Ok(Self {
            handle,
            state,
            hardware,
            stream,
            kernel,
            tables: DeviceBuffer::new(0)?,
            decoded: Vec::new(),
            initialized_for: 0,
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
        Ok(JpegInfo {
            width: widths[0].max(0) as usize,
            height: heights[0].max(0) as usize,
            components: components.max(0) as usize,
        })
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
        if self.initialized_for != n {
            // SAFETY: re-initialises the batched state for `n` images, RGB interleaved.
            nvjpeg_check("nvjpegDecodeBatchedInitialize", unsafe {
                (api.nvjpeg_decode_batched_initialize)(
                    self.handle,
                    self.state,
                    n as c_int,
                    1,
                    NVJPEG_OUTPUT_RGBI,
                )
            })?;
            self.initialized_for = n;
        }
        while self.decoded.len() < n {
            self.decoded.push(DeviceBuffer::new(0)?);
        }
        let mut outputs = Vec::with_capacity(n);
        for (i, s) in slots.iter().enumerate() {
            let bytes = s.width * s.height * 3;
            if self.decoded[i].len() < bytes {
                self.decoded[i] = DeviceBuffer::new(bytes)?;
            }
            let mut image = NvjpegImage {
                channel: [std::ptr::null_mut(); 4],
                pitch: [0; 4],
            };
            image.channel[0] = self.decoded[i].ptr().cast();
            image.pitch[0] = s.width * 3;
            outputs.push(image);
        }
        let data: Vec<*const u8> = slots.iter().map(|s| s.data.as_ptr()).collect();
        let lengths: Vec<usize> = slots.iter().map(|s| s.data.len()).collect();
        // SAFETY: `data`/`lengths` describe `n` live JPEGs; each output buffer holds its
        // image at the pitch given.
        nvjpeg_check("nvjpegDecodeBatched", unsafe {
            (api.nvjpeg_decode_batched)(
                self.handle,
                self.state,
                data.as_ptr(),
                lengths.as_ptr(),
                outputs.as_mut_ptr(),
                self.stream.0,
            )
        })?;
        // All slots' tables in one upload: columns then rows, slot after slot.
        let mut tables: Vec<[i32; 4]> = Vec::new();
        let mut table_at = Vec::with_capacity(n);
        for s in slots {
            table_at.push(tables.len());
            tables.extend_from_slice(s.columns);
            tables.extend_from_slice(s.rows);
        }
        let table_bytes = tables.len() * 16;
        if self.tables.len() < table_bytes {
            self.tables = DeviceBuffer::new(table_bytes.next_power_of_two())?;
        }
        // SAFETY: `tables` stays alive until the stream is synchronised below.
        unsafe {
            super::copy_async(
                self.tables.ptr(),
                tables.as_ptr().cast(),
                table_bytes,
                CopyKind::HostToDevice,
                &self.stream,
            )
        }?;
        let slot_bytes = canvas_width * canvas_height * 3;
        let row_bytes = canvas_width * 3;
        for (i, s) in slots.iter().enumerate() {
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
            // SAFETY (all three calls): the caller vouches for the canvas; the source is
            // this decoder's buffer for image `i`, written by the decode above on the same
            // stream; the tables were uploaded above on that stream.
            let base = unsafe { canvas.add(s.slot * slot_bytes) };
            check(api, "cudaMemsetAsync", unsafe {
                (api.cuda_memset_async)(base.cast(), c_int::from(s.pad_value), slot_bytes, self.stream.0)
            })?;
            let dst = unsafe { base.add(top * row_bytes + left * 3) };
            let src = self.decoded[i].ptr() as *const u8;
            if !resized {
                check(api, "cudaMemcpy2DAsync", unsafe {
                    (api.cuda_memcpy_2d_async)(
                        dst.cast(),
                        row_bytes,
                        src as *const c_void,
                        s.width * 3,
                        s.width * 3,
                        s.height,
                        CopyKind::DeviceToDevice as c_int,
                        self.stream.0,
                    )
                })?;
            } else {
                let columns = unsafe { self.tables.ptr().cast::<i32>().add(table_at[i] * 4) };
                let rows = unsafe { columns.add(sw * 4) };
                unsafe {
                    self.kernel.launch(
                        src,
                        s.width * 3,
                        columns,
                        rows,
                        (sw, sh),
                        dst,
                        row_bytes,
                        &self.stream,
                    )
                }?;
            }
        }
        super::synchronize(&self.stream)
    }
}
