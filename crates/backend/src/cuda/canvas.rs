//! Putting an image already in device memory (RGB rows) onto its canvas of the batch's
//! device input: the pad gray, then a copy or the letterbox kernel with the CPU letterbox's
//! own tables. Shared by the JPEG decoder and the NVDEC frame path, which differ only in
//! how they make the RGB.

use std::ffi::{c_int, c_void};

use super::kernel::ImageKernels;
use super::{api, check, CopyKind, CudaError, DeviceBuffer, Stream};

/// Where one image of a batch goes, and how it is resampled to get there.
#[derive(Debug, Clone, Copy)]
pub struct Placement<'a> {
    /// Index of the image in the batch tensor.
    pub slot: usize,
    /// The image's own size.
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

impl Placement<'_> {
    pub(crate) fn resized(&self) -> bool {
        self.scaled != (self.width, self.height)
    }

    /// Refuses an image that does not fit its canvas, or tables that do not fit its size.
    pub(crate) fn check(&self, canvas_width: usize, canvas_height: usize) -> Result<(), CudaError> {
        let (sw, sh) = self.scaled;
        let (left, top) = self.offset;
        if sw + left > canvas_width || sh + top > canvas_height || sw == 0 || sh == 0 {
            return Err(CudaError(format!(
                "slot {}: a {sw}x{sh} image at ({left}, {top}) does not fit a {canvas_width}x{canvas_height} canvas",
                self.slot
            )));
        }
        if self.resized() && (self.columns.len() != sw || self.rows.len() != sh) {
            return Err(CudaError(format!(
                "slot {}: resampling tables for {}x{} given for a {sw}x{sh} image",
                self.slot,
                self.columns.len(),
                self.rows.len()
            )));
        }
        Ok(())
    }
}

/// The device memory a batch's placements need, reused from batch to batch.
pub(crate) struct CanvasWriter {
    /// Every slot's resampling tables for the current batch, on the host (kept until the
    /// next batch, so the asynchronous upload never reads freed memory) and on the device.
    host_tables: Vec<[i32; 4]>,
    tables: DeviceBuffer,
    /// Full-size RGB per position in the batch, for images that are then resized.
    rgb: Vec<DeviceBuffer>,
}

/// Where one slot's image goes: its canvas and the place on it the image starts.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Target {
    pub image: *mut u8,
    pub row_bytes: usize,
    table_at: usize,
}

impl CanvasWriter {
    pub fn new() -> Result<Self, CudaError> {
        Ok(Self {
            host_tables: Vec::new(),
            tables: DeviceBuffer::new(0)?,
            rgb: Vec::new(),
        })
    }

    /// Checks every placement, uploads their tables in one copy and fills each slot's
    /// canvas with its pad gray, on `stream`. Returns where each image goes, in order.
    ///
    /// # Safety
    /// `canvas` must be device memory holding `[N, canvas_height, canvas_width, 3]` uint8
    /// for every slot index given, written by nothing else until `stream` is synchronised.
    pub unsafe fn prepare(
        &mut self,
        placements: &[Placement<'_>],
        canvas: *mut u8,
        canvas_size: (usize, usize),
        stream: &Stream,
    ) -> Result<Vec<Target>, CudaError> {
        let api = api()?;
        let (canvas_width, canvas_height) = canvas_size;
        for p in placements {
            p.check(canvas_width, canvas_height)?;
        }
        let table_at = self.upload_tables(placements, stream)?;
        let slot_bytes = canvas_width * canvas_height * 3;
        let row_bytes = canvas_width * 3;
        let mut targets = Vec::with_capacity(placements.len());
        for (p, table_at) in placements.iter().zip(table_at) {
            // SAFETY: the caller vouches for the canvas; `check` kept the image inside it.
            let base = unsafe { canvas.add(p.slot * slot_bytes) };
            // SAFETY: as above.
            check(api, "cudaMemsetAsync", unsafe {
                (api.cuda_memset_async)(base.cast(), c_int::from(p.pad_value), slot_bytes, stream.0)
            })?;
            targets.push(Target {
                // SAFETY: inside the slot, as `check` made sure.
                image: unsafe { base.add(p.offset.1 * row_bytes + p.offset.0 * 3) },
                row_bytes,
                table_at,
            });
        }
        Ok(targets)
    }

    /// Where position `i` of the batch should write its full-size RGB (rows of `width * 3`
    /// bytes): straight onto the canvas when it is not resized, else a buffer of its own.
    pub fn rgb_target(
        &mut self,
        i: usize,
        p: &Placement<'_>,
        target: &Target,
    ) -> Result<(*mut u8, usize), CudaError> {
        if !p.resized() {
            return Ok((target.image, target.row_bytes));
        }
        while self.rgb.len() <= i {
            self.rgb.push(DeviceBuffer::new(0)?);
        }
        grow(&mut self.rgb[i], p.width * p.height * 3)?;
        Ok((self.rgb[i].ptr().cast(), p.width * 3))
    }

    /// Resamples `rgb` (the image's RGB, rows of `width * 3` bytes, written on `stream`)
    /// onto its canvas; nothing to do for an image that was written there directly.
    ///
    /// # Safety
    /// `rgb` must hold the image; `target` must come from [`Self::prepare`] of this batch.
    pub unsafe fn place(
        &self,
        kernels: &ImageKernels,
        p: &Placement<'_>,
        rgb: *const u8,
        target: &Target,
        stream: &Stream,
    ) -> Result<(), CudaError> {
        if !p.resized() {
            if rgb == target.image.cast_const() {
                return Ok(());
            }
            let api = api()?;
            // SAFETY: as the caller vouches.
            return check(api, "cudaMemcpy2DAsync", unsafe {
                (api.cuda_memcpy_2d_async)(
                    target.image.cast(),
                    target.row_bytes,
                    rgb as *const c_void,
                    p.width * 3,
                    p.width * 3,
                    p.height,
                    CopyKind::DeviceToDevice as c_int,
                    stream.0,
                )
            });
        }
        let (columns, rows) = self.tables(p, target);
        // SAFETY: as the caller vouches.
        unsafe {
            kernels.letterbox(
                rgb,
                p.width * 3,
                columns,
                rows,
                p.scaled,
                target.image,
                target.row_bytes,
                stream,
            )
        }
    }

    /// The device addresses of a placement's column and row tables, uploaded by
    /// [`Self::prepare`] for `target`.
    pub fn tables(&self, p: &Placement<'_>, target: &Target) -> (*const i32, *const i32) {
        let base = self.tables.ptr().cast::<i32>().cast_const();
        // Offsets inside the buffer `prepare` filled: the slot's columns, then its rows.
        let columns = base.wrapping_add(target.table_at * 4);
        (columns, columns.wrapping_add(p.scaled.0 * 4))
    }

    /// All slots' resampling tables in one upload: columns then rows, slot after slot.
    /// Returns where each slot's start (in rows of four i32).
    fn upload_tables(
        &mut self,
        placements: &[Placement<'_>],
        stream: &Stream,
    ) -> Result<Vec<usize>, CudaError> {
        let tables = &mut self.host_tables;
        tables.clear();
        let mut table_at = Vec::with_capacity(placements.len());
        for p in placements {
            table_at.push(tables.len());
            tables.extend_from_slice(p.columns);
            tables.extend_from_slice(p.rows);
        }
        let table_bytes = tables.len() * 16;
        if self.tables.len() < table_bytes {
            self.tables = DeviceBuffer::new(table_bytes.next_power_of_two())?;
        }
        if table_bytes == 0 {
            return Ok(table_at);
        }
        // SAFETY: `host_tables` is left alone until the next batch, after this one's
        // stream has been synchronised.
        unsafe {
            super::copy_async(
                self.tables.ptr(),
                tables.as_ptr().cast(),
                table_bytes,
                CopyKind::HostToDevice,
                stream,
            )
        }?;
        Ok(table_at)
    }
}

/// Makes `buffer` hold at least `bytes` of one image's pixels, re-allocating only when it
/// is too small, to [`image_capacity`].
pub(crate) fn grow(buffer: &mut DeviceBuffer, bytes: usize) -> Result<(), CudaError> {
    if buffer.len() < bytes {
        *buffer = DeviceBuffer::new(image_capacity(bytes))?;
    }
    Ok(())
}

/// Bytes of the smallest per-image buffer: a 1920x1088 image's three full planes (or RGB),
/// so that camera-sized images (up to 1080p) never make a buffer grow after the warm-up.
const MIN_IMAGE_BYTES: usize = 1920 * 1088 * 3;

/// How much to allocate for an image of `bytes`: at least [`MIN_IMAGE_BYTES`], and a power
/// of two above that, so a buffer grows a few times at most. Growing frees the old buffer,
/// and `cudaFree` waits for the whole device: every instance's work stalls behind it. With
/// exact sizes, each of 8 instances' buffers grew at every larger image for the first
/// minute of traffic, which was the server's warm-up tail (docs/benchmarks.md).
fn image_capacity(bytes: usize) -> usize {
    bytes.max(MIN_IMAGE_BYTES).next_power_of_two()
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

    fn placement<'a>(columns: &'a [[i32; 4]], rows: &'a [[i32; 4]]) -> Placement<'a> {
        Placement {
            slot: 1,
            width: 1280,
            height: 720,
            scaled: (640, 360),
            offset: (0, 140),
            pad_value: 114,
            columns,
            rows,
        }
    }

    #[test]
    fn placements_must_fit_the_canvas_and_bring_their_tables() {
        let (columns, rows) = (vec![[0; 4]; 640], vec![[0; 4]; 360]);
        assert!(placement(&columns, &rows).check(640, 640).is_ok());
        let err = placement(&columns, &rows).check(640, 480).unwrap_err();
        assert!(err.0.contains("does not fit a 640x480 canvas"), "{err}");
        let err = placement(&columns[..10], &rows).check(640, 640).unwrap_err();
        assert!(err.0.contains("tables for 10x360"), "{err}");
        let same_size = Placement {
            width: 640,
            height: 360,
            ..placement(&[], &[])
        };
        assert!(
            same_size.check(640, 640).is_ok(),
            "no tables needed without resizing"
        );
    }
}
