//! Video frames that never leave the GPU: NVDEC's NV12 surfaces letterboxed straight into
//! the model's device input by `letterbox_nv12`, which converts each tap with FFmpeg's x86
//! arithmetic (`peregrine_vision::yuv`) and resamples with the CPU letterbox's tables, so
//! no full-size RGB picture is made. Given the same decoded pixels, the canvas is the CPU
//! path's (swscale's RGB, then the letterbox), byte for byte.

use peregrine_vision::yuv::Nv12Image;

use super::canvas::{CanvasWriter, Placement};
use super::kernel::ImageKernels;
use super::{CudaError, Stream};

/// One video frame of a batch: the NV12 picture and where it goes.
#[derive(Debug, Clone, Copy)]
pub struct FrameSlot<'a> {
    pub image: &'a Nv12Image,
    /// The picture's size and its place on the canvas.
    pub place: Placement<'a>,
}

/// Letterboxes NV12 frames already on the device into a batch's canvases.
pub struct GpuFrameLetterboxer {
    device: i32,
    stream: Stream,
    kernels: ImageKernels,
    writer: CanvasWriter,
}

// SAFETY: owned by one session's input path and used through `&mut self`.
unsafe impl Send for GpuFrameLetterboxer {}

impl GpuFrameLetterboxer {
    /// Compiles (once per process) and loads the kernels on `device`.
    pub fn new(device: i32) -> Result<Self, CudaError> {
        super::set_device(device)?;
        let kernels = ImageKernels::for_device(device)?;
        Ok(Self {
            device,
            stream: super::create_stream()?,
            kernels,
            writer: CanvasWriter::new()?,
        })
    }

    /// Converts and letterboxes every slot's frame into its place in `canvas`: device
    /// memory holding `[N, canvas_height, canvas_width, 3]` uint8. The slots' whole
    /// canvases are overwritten (padding included); other slots are left alone. Returns
    /// once the canvas is written (the stream is synchronised), after which the frames may
    /// be released.
    ///
    /// # Safety
    /// `canvas` must be device memory on this letterboxer's device, large enough for every
    /// slot index given, and not written by anything else until this returns. Each frame's
    /// planes must be device memory on the same device, complete (no work pending on
    /// another stream) and unchanged until this returns.
    pub unsafe fn letterbox_into(
        &mut self,
        slots: &[FrameSlot<'_>],
        canvas: *mut u8,
        canvas_width: usize,
        canvas_height: usize,
    ) -> Result<(), CudaError> {
        if slots.is_empty() {
            return Ok(());
        }
        for s in slots {
            check_frame(s, self.device)?;
        }
        let placements: Vec<Placement<'_>> = slots.iter().map(|s| s.place).collect();
        // SAFETY: as the caller vouches.
        let targets = unsafe {
            self.writer
                .prepare(&placements, canvas, (canvas_width, canvas_height), &self.stream)
        }?;
        for (s, target) in slots.iter().zip(&targets) {
            let (image, out, pitch) = (s.image, target.image, target.row_bytes);
            if !s.place.resized() {
                // SAFETY: the caller vouches for the frame; the target holds it at `pitch`.
                unsafe { self.kernels.nv12_to_rgb(image, out, pitch, &self.stream) }?;
                continue;
            }
            // Converted tap by tap as it is resampled: no full-size RGB in between.
            let (columns, rows) = self.writer.tables(&s.place, target);
            // SAFETY: as above; the tables were uploaded on this stream by `prepare`.
            unsafe {
                self.kernels
                    .letterbox_nv12(image, columns, rows, s.place.scaled, out, pitch, &self.stream)
            }?;
        }
        super::synchronize(&self.stream)
    }
}

/// Refuses a frame on another GPU, or whose description and placement disagree.
fn check_frame(s: &FrameSlot<'_>, device: i32) -> Result<(), CudaError> {
    let slot = s.place.slot;
    if s.image.device != device {
        return Err(CudaError(format!(
            "slot {slot}: a frame on GPU {} cannot be letterboxed on GPU {device}",
            s.image.device
        )));
    }
    s.image
        .check()
        .map_err(|e| CudaError(format!("slot {slot}: {e}")))?;
    if (s.image.width, s.image.height) != (s.place.width, s.place.height) {
        return Err(CudaError(format!(
            "slot {slot}: a {}x{} frame placed as {}x{}",
            s.image.width, s.image.height, s.place.width, s.place.height
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use peregrine_vision::yuv::YuvToRgb;

    use super::*;

    fn frame(device: i32, width: usize) -> Nv12Image {
        Nv12Image {
            device,
            width,
            height: 720,
            luma: 0x1000,
            luma_pitch: 1280,
            chroma: 0x9000,
            chroma_pitch: 1280,
            conversion: YuvToRgb::new(1, false).unwrap(),
        }
    }

    fn slot(image: &Nv12Image) -> FrameSlot<'_> {
        FrameSlot {
            image,
            place: Placement {
                slot: 2,
                width: 1280,
                height: 720,
                scaled: (640, 360),
                offset: (0, 140),
                pad_value: 114,
                columns: &[],
                rows: &[],
            },
        }
    }

    #[test]
    fn frames_must_be_on_this_gpu_and_match_their_placement() {
        let ok = frame(0, 1280);
        assert!(check_frame(&slot(&ok), 0).is_ok());
        let err = check_frame(&slot(&ok), 1).unwrap_err();
        assert!(err.0.contains("on GPU 0 cannot be letterboxed on GPU 1"), "{err}");
        let narrow = frame(0, 1278);
        let err = check_frame(&slot(&narrow), 0).unwrap_err();
        assert!(err.0.contains("a 1278x720 frame placed as 1280x720"), "{err}");
        let null = Nv12Image { luma: 0, ..ok };
        assert!(check_frame(&slot(&null), 0)
            .unwrap_err()
            .0
            .starts_with("slot 2: "));
    }
}
