//! Image preparation on the GPU: nvJPEG and the image kernels through
//! `peregrine_backend::cuda`, as `serve --gpu-jpeg-decode` runs them.

use std::sync::atomic::Ordering;

use anyhow::Result;
use peregrine_backend::cuda::jpeg::{ColourConversion, GpuJpegDecoder, JpegSlot};
use peregrine_backend::cuda::{self, CopyKind, DeviceBuffer, Placement};
use peregrine_vision::{resample_tables, Letterbox};

use super::Race;

/// Each image's geometry and resampling tables, as the engine builds them.
pub(super) struct Prepared {
    width: usize,
    height: usize,
    letterbox: Letterbox,
    columns: Vec<[i32; 4]>,
    rows: Vec<[i32; 4]>,
}

pub(super) fn prepare(decoder: &GpuJpegDecoder, images: &[Vec<u8>], imgsz: usize) -> Result<Vec<Prepared>> {
    images
        .iter()
        .map(|data| {
            let info = decoder.info(data)?;
            let letterbox = Letterbox::new(info.width, info.height, imgsz, imgsz);
            let (columns, rows) = resample_tables(info.width, info.height, &letterbox);
            Ok(Prepared {
                width: info.width,
                height: info.height,
                letterbox,
                columns,
                rows,
            })
        })
        .collect()
}

pub(super) fn slots<'a>(
    images: &'a [Vec<u8>],
    prepared: &'a [Prepared],
    first: usize,
    n: usize,
) -> Vec<JpegSlot<'a>> {
    (0..n)
        .map(|slot| {
            let i = (first + slot) % images.len();
            let p = &prepared[i];
            JpegSlot {
                data: &images[i],
                place: Placement {
                    slot,
                    width: p.width,
                    height: p.height,
                    scaled: (p.letterbox.scaled_width, p.letterbox.scaled_height),
                    offset: (p.letterbox.left, p.letterbox.top),
                    pad_value: Letterbox::PAD_VALUE,
                    columns: &p.columns,
                    rows: &p.rows,
                },
            }
        })
        .collect()
}

/// One GPU decoder thread's settings.
#[derive(Debug, Clone, Copy)]
pub struct GpuRun {
    /// Images per decode call.
    pub batch: usize,
    pub imgsz: usize,
    pub device: i32,
    pub conversion: ColourConversion,
}

impl GpuRun {
    /// Decodes and letterboxes `images` in batches, from image `thread * batch` on, with a
    /// decoder of its own, from the start line until `stop`.
    pub fn run_decoder(self, images: &[Vec<u8>], thread: usize, race: Race<'_>) -> Result<()> {
        let Race { start, stop, done } = race;
        let (batch, imgsz) = (self.batch, self.imgsz);
        let setup = || -> Result<_> {
            let decoder = GpuJpegDecoder::with_conversion(self.device, self.conversion)?;
            let canvas = DeviceBuffer::new(batch * imgsz * imgsz * 3)?;
            // Tables are built once here; the engine builds them per batch (microseconds).
            let prepared = prepare(&decoder, images, imgsz)?;
            Ok((decoder, canvas, prepared))
        };
        let setup = setup();
        // Failed or not, the others wait for this thread at the line.
        start.wait();
        let (mut decoder, canvas, prepared) = setup?;
        let mut first = thread * batch;
        while !stop.load(Ordering::Relaxed) {
            let slots = slots(images, &prepared, first, batch);
            // SAFETY: `canvas` holds `batch` canvases on this device and only this call writes it.
            unsafe { decoder.letterbox_into(&slots, canvas.ptr().cast(), imgsz, imgsz) }?;
            done.fetch_add(batch as u64, Ordering::Relaxed);
            first += batch;
        }
        Ok(())
    }
}

/// Letterboxes `images` on the GPU, all in one decode call, and copies their canvases back
/// (`images.len()` canvases of `imgsz` x `imgsz` x 3, one after another).
pub(super) fn canvases(decoder: &mut GpuJpegDecoder, images: &[Vec<u8>], imgsz: usize) -> Result<Vec<u8>> {
    let n = images.len();
    let slot_bytes = imgsz * imgsz * 3;
    let canvas = DeviceBuffer::new(n * slot_bytes)?;
    let prepared = prepare(decoder, images, imgsz)?;
    let slots = slots(images, &prepared, 0, n);
    // SAFETY: `canvas` holds `n` canvases on this device and only this call writes it.
    unsafe { decoder.letterbox_into(&slots, canvas.ptr().cast(), imgsz, imgsz) }?;
    let mut host = vec![0u8; n * slot_bytes];
    // SAFETY: both buffers hold `n` canvases; the stream is synchronised right after.
    unsafe {
        cuda::copy_async(
            host.as_mut_ptr().cast(),
            canvas.ptr(),
            host.len(),
            CopyKind::DeviceToHost,
            decoder.stream(),
        )
    }?;
    cuda::synchronize(decoder.stream())?;
    Ok(host)
}
