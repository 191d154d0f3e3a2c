//! The synchronous detection pipeline for one model instance.

use std::time::{Duration, Instant};

use peregrine_backend::{
    Backend, BackendError, DeviceSlots, FrameSlot, InputBuffer, JpegSlot, OutputBuffer, Placement,
};
use peregrine_types::{DetectParams, Detection};
use peregrine_vision::normalize::rgb8_to_planar_f32;
use peregrine_vision::{
    decode_image, resample_tables, DecodeError, DecodeLimits, DetectorSpec, ImageView, InputForm, Letterbox,
    LetterboxCanvas, Postprocessor,
};

use crate::slot::{Slot, SlotOutput};
use crate::spans::{self, Stage};
use crate::EngineError;

/// Choices made when a detector is built.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DetectorConfig {
    /// Input (height, width) for models with dynamic spatial dimensions; `None` uses the
    /// model's metadata, then 640x640.
    pub imgsz: Option<(usize, usize)>,
    /// Most images per model run; 0 means 1. A model with a fixed batch dimension runs at
    /// exactly that size.
    pub max_batch: usize,
    /// Batch sizes the model is run at: a smaller batch is padded up to the next of them
    /// (and `max_batch` is always one). Few distinct shapes mean few warm-up runs and few
    /// per-shape kernel searches on a GPU. Empty runs every batch at its own size.
    pub run_sizes: Vec<usize>,
}

/// Where the time of one [`Detector::detect`] call went.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StageTimings {
    pub preprocess: Duration,
    pub inference: Duration,
    pub postprocess: Duration,
}

impl std::ops::AddAssign for StageTimings {
    fn add_assign(&mut self, other: Self) {
        self.preprocess += other.preprocess;
        self.inference += other.inference;
        self.postprocess += other.postprocess;
    }
}

impl StageTimings {
    pub fn total(&self) -> Duration {
        self.preprocess + self.inference + self.postprocess
    }
}

/// Per output column and per output row (see `peregrine_vision::resample_tables`).
type ResampleTables = (Vec<[i32; 4]>, Vec<[i32; 4]>);

/// One model instance with its reusable buffers.
pub struct Detector {
    backend: Box<dyn Backend>,
    spec: DetectorSpec,
    batch_size: usize,
    /// Ascending; the last is `batch_size`.
    run_sizes: Vec<usize>,
    canvas: LetterboxCanvas,
    /// Letterboxed images of the current [`Detector::detect`] chunk.
    chunk_canvases: Vec<Vec<u8>>,
    output: OutputBuffer,
    post: Postprocessor,
}

impl std::fmt::Debug for Detector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Detector")
            .field("spec", &self.spec)
            .field("batch_size", &self.batch_size)
            .finish_non_exhaustive()
    }
}

/// The batch sizes a model with a dynamic batch dimension runs at under `config`:
/// ascending, ending with the largest.
pub fn run_sizes(config: &DetectorConfig) -> Vec<usize> {
    let max = config.max_batch.max(1);
    let mut sizes: Vec<usize> = config
        .run_sizes
        .iter()
        .copied()
        .filter(|&s| s >= 1 && s < max)
        .collect();
    if sizes.is_empty() {
        return (1..=max).collect();
    }
    sizes.push(max);
    sizes.sort_unstable();
    sizes.dedup();
    sizes
}

impl Detector {
    pub fn new(backend: Box<dyn Backend>, config: &DetectorConfig) -> Result<Self, EngineError> {
        let spec = DetectorSpec::from_model(backend.description(), config.imgsz)?;
        let (batch_size, run_sizes) = match spec.fixed_batch {
            Some(n) => (n.max(1), vec![n.max(1)]),
            None => (config.max_batch.max(1), run_sizes(config)),
        };
        Ok(Self {
            backend,
            spec,
            batch_size,
            run_sizes,
            canvas: LetterboxCanvas::new(),
            chunk_canvases: Vec::new(),
            output: OutputBuffer::default(),
            post: Postprocessor::new(),
        })
    }

    /// Runs of each batch size before one costs what later runs will (see
    /// [`peregrine_backend::Backend::warm_up_runs`]).
    pub fn warm_up_runs(&self) -> usize {
        self.backend.warm_up_runs().max(1)
    }

    /// The GPU the instance runs on, `None` on the CPU.
    pub fn device(&self) -> Option<i32> {
        self.backend.device()
    }

    /// Whether JPEG slots ([`Slot::Jpeg`]) are decoded on the device.
    pub fn decodes_jpeg(&self) -> bool {
        self.backend.decodes_jpeg() && self.spec.input_form == InputForm::InterleavedU8
    }

    /// The GPU whose frames ([`Slot::Frame`]) this detector takes, converted and
    /// letterboxed there.
    pub fn frames_device(&self) -> Option<i32> {
        self.backend
            .frames_device()
            .filter(|_| self.spec.input_form == InputForm::InterleavedU8)
    }

    pub fn spec(&self) -> &DetectorSpec {
        &self.spec
    }

    /// The model's tensors and metadata, as the backend reports them.
    pub fn description(&self) -> &peregrine_backend::ModelDescription {
        self.backend.description()
    }

    /// The batch size a batch of `n` images runs at: the smallest run size that holds it.
    pub fn run_size(&self, n: usize) -> usize {
        self.run_sizes
            .iter()
            .copied()
            .find(|&s| s >= n)
            .unwrap_or(self.batch_size)
    }

    /// Every batch size the model runs at, up to `max`, for warm-up.
    pub fn run_sizes(&self, max: usize) -> Vec<usize> {
        let mut sizes: Vec<usize> = self.run_sizes.iter().copied().filter(|&s| s <= max).collect();
        let top = self.run_size(max);
        if !sizes.contains(&top) {
            sizes.push(top);
        }
        sizes
    }

    /// Most images one model run takes.
    pub fn batch_size(&self) -> usize {
        self.batch_size
    }

    /// Letterboxes `image` for a model with this `spec` into `out`, using `scratch`. Needs
    /// no detector, so it runs on whichever thread decoded the image.
    pub fn prepare(
        spec: &DetectorSpec,
        image: ImageView<'_>,
        scratch: &mut LetterboxCanvas,
        out: &mut Vec<u8>,
    ) -> Letterbox {
        scratch.fill_into(image, spec.input_width, spec.input_height, out)
    }

    /// Detects objects in each image; the result has one list per image, in order, each
    /// best first. Runs the model as many times as the batch size requires.
    pub fn detect(
        &mut self,
        images: &[ImageView<'_>],
        params: &DetectParams,
    ) -> Result<(Vec<Vec<Detection>>, StageTimings), EngineError> {
        // The canvases are taken out of `self` while `run_prepared` borrows it mutably, and
        // put back whatever the outcome, so their allocations survive to the next call.
        let mut canvases = std::mem::take(&mut self.chunk_canvases);
        let outcome = self.detect_with(images, params, &mut canvases);
        self.chunk_canvases = canvases;
        outcome
    }

    fn detect_with(
        &mut self,
        images: &[ImageView<'_>],
        params: &DetectParams,
        canvases: &mut Vec<Vec<u8>>,
    ) -> Result<(Vec<Vec<Detection>>, StageTimings), EngineError> {
        let mut results = Vec::with_capacity(images.len());
        let mut timings = StageTimings::default();
        let mut slots = Vec::with_capacity(self.batch_size.min(images.len()));
        for chunk in images.chunks(self.batch_size) {
            let started = Instant::now();
            canvases.resize_with(chunk.len().max(canvases.len()), Vec::new);
            for (image, kept) in chunk.iter().zip(canvases.iter_mut()) {
                let mut canvas = std::mem::take(kept);
                let letterbox = Self::prepare(&self.spec, *image, &mut self.canvas, &mut canvas);
                slots.push(Slot::Canvas {
                    canvas,
                    letterbox,
                    params: params.clone(),
                });
            }
            timings.preprocess += started.elapsed();
            let outcome = self.run_prepared(&slots);
            // The canvases go back whatever the outcome, so their allocations are reused.
            for (slot, kept) in slots.drain(..).zip(canvases.iter_mut()) {
                if let Some(canvas) = slot.into_canvas() {
                    *kept = canvas;
                }
            }
            let (detections, t) = outcome?;
            results.extend(detections);
            timings += t;
        }
        Ok((results, timings))
    }

    /// Runs one batch of image slots (at most [`Detector::batch_size`]) and returns each
    /// image's detections, in order.
    pub fn run_prepared(
        &mut self,
        slots: &[Slot],
    ) -> Result<(Vec<Vec<Detection>>, StageTimings), EngineError> {
        let (outputs, timings) = self.run_batch(slots)?;
        let detections = outputs
            .into_iter()
            .enumerate()
            .map(|(slot, output)| match output {
                SlotOutput::Detections(d) => Ok(d),
                SlotOutput::Tensor(_) | SlotOutput::Rejected(_) => Err(EngineError::NotDetections { slot }),
            })
            .collect::<Result<_, _>>()?;
        Ok((detections, timings))
    }

    /// Floats of one slot's raw model output, and its shape without the batch dimension,
    /// as of the last batch run.
    pub fn output_item_shape(&self) -> &[usize] {
        self.output.shape.get(1..).unwrap_or(&[])
    }

    /// Runs one batch (at most [`Detector::batch_size`] slots): fill the input (normalise
    /// images, copy tensors), run the model (the device decodes JPEG slots), then read each
    /// slot's output: detections with its own parameters, or its raw tensor.
    pub fn run_batch(&mut self, slots: &[Slot]) -> Result<(Vec<SlotOutput>, StageTimings), EngineError> {
        let started = Instant::now();
        let shape = self.batch_shape(slots)?;
        spans::stage(Stage::Preprocess).in_scope(|| self.fill_input(shape, slots))?;
        let preprocessed = Instant::now();
        let rejected = spans::stage(Stage::Inference).in_scope(|| self.run_model(shape, slots))?;
        let inferred = Instant::now();
        let outputs =
            spans::stage(Stage::Postprocess).in_scope(|| self.read_outputs(shape[0], slots, rejected))?;
        let timings = StageTimings {
            preprocess: preprocessed - started,
            inference: inferred - preprocessed,
            postprocess: inferred.elapsed(),
        };
        Ok((outputs, timings))
    }

    /// The input shape a batch of `slots` runs at, once each slot is known to fit it.
    fn batch_shape(&self, slots: &[Slot]) -> Result<[usize; 4], EngineError> {
        let n = slots.len();
        if n == 0 || n > self.batch_size {
            return Err(EngineError::BatchSize {
                got: n,
                max: self.batch_size,
            });
        }
        let slot_len = self.spec.image_len();
        let tensor_bytes = slot_len * self.spec.input_form.element_size();
        for slot in slots {
            match slot {
                Slot::Canvas { canvas, .. } if canvas.len() != slot_len => {
                    return Err(EngineError::CanvasSize {
                        got: canvas.len(),
                        want: slot_len,
                    })
                }
                Slot::Tensor(bytes) if bytes.len() != tensor_bytes => {
                    return Err(EngineError::TensorSize {
                        got: bytes.len(),
                        want: tensor_bytes,
                    })
                }
                _ => {}
            }
        }
        let (run_n, h, w) = (self.run_size(n), self.spec.input_height, self.spec.input_width);
        Ok(match self.spec.input_form {
            InputForm::PlanarF32 => [run_n, 3, h, w],
            InputForm::InterleavedU8 => [run_n, h, w, 3],
        })
    }

    /// Writes every slot but the JPEG ones (decoded on the device) into the backend's input.
    fn fill_input(&mut self, shape: [usize; 4], slots: &[Slot]) -> Result<(), EngineError> {
        let slot_len = self.spec.image_len();
        match self.backend.input(shape)? {
            InputBuffer::F32(input) => fill_planar_f32(input, slots, slot_len),
            InputBuffer::U8(input) => {
                fill_canvas_u8(input, slots, slot_len);
                Ok(())
            }
        }
    }

    /// Runs the model; JPEG slots go to the device decoder, frame slots to the device's
    /// letterbox. Returns the JPEG slots that could not be decoded (their canvases left
    /// gray, their outputs to be ignored).
    fn run_model(
        &mut self,
        shape: [usize; 4],
        slots: &[Slot],
    ) -> Result<Vec<(usize, DecodeError)>, EngineError> {
        // The device resamples with the CPU letterbox's own tables, so canvases match.
        let tables: Vec<(usize, ResampleTables)> = slots
            .iter()
            .enumerate()
            .filter_map(|(i, slot)| {
                let (width, height, letterbox) = device_geometry(slot)?;
                Some((i, resample_tables(width, height, letterbox)))
            })
            .collect();
        let mut jpegs = Vec::new();
        let mut frames = Vec::new();
        for (i, (columns, rows)) in &tables {
            let Some((width, height, letterbox)) = device_geometry(&slots[*i]) else {
                continue;
            };
            let place = Placement {
                slot: *i,
                width,
                height,
                scaled: (letterbox.scaled_width, letterbox.scaled_height),
                offset: (letterbox.left, letterbox.top),
                pad_value: Letterbox::PAD_VALUE,
                columns,
                rows,
            };
            match &slots[*i] {
                Slot::Jpeg { data, .. } => jpegs.push(JpegSlot { data, place }),
                Slot::Frame { image, .. } => frames.push(FrameSlot { image, place }),
                _ => {}
            }
        }
        let device = DeviceSlots {
            jpegs: &jpegs,
            frames: &frames,
        };
        match self
            .backend
            .run_with_device_slots(shape, device, &mut self.output)
        {
            Err(BackendError::DeviceDecode(why)) => {
                // One bad file fails the device's whole batch call: decode this batch's
                // JPEGs here instead, so only the bad ones fail, each with its own error.
                tracing::warn!(error = %why, jpegs = jpegs.len(), "GPU JPEG decoding failed; decoding this batch's JPEGs on the CPU");
                let rejected = self.decode_jpegs_on_host(shape, slots)?;
                let frames_only = DeviceSlots {
                    jpegs: &[],
                    frames: &frames,
                };
                self.backend
                    .run_with_device_slots(shape, frames_only, &mut self.output)?;
                Ok(rejected)
            }
            other => {
                other?;
                Ok(Vec::new())
            }
        }
    }

    /// Splits the model's output into one [`SlotOutput`] per slot.
    fn read_outputs(
        &mut self,
        run_n: usize,
        slots: &[Slot],
        mut rejected: Vec<(usize, DecodeError)>,
    ) -> Result<Vec<SlotOutput>, EngineError> {
        let got = self.output.shape.first().copied().unwrap_or(0);
        if got != run_n {
            return Err(EngineError::BatchMismatch { got, want: run_n });
        }
        let per_image = self.output.data.len() / got.max(1);
        let wants_detections = slots.iter().any(|s| s.detection_request().is_some());
        let rows = if wants_detections {
            self.spec.layout.candidates_per_image(&self.output.shape)?
        } else {
            0
        };
        let mut outputs = Vec::with_capacity(slots.len());
        for (i, slot) in slots.iter().enumerate() {
            let out = &self.output.data[i * per_image..(i + 1) * per_image];
            let output = if let Some(at) = rejected.iter().position(|(s, _)| *s == i) {
                SlotOutput::Rejected(rejected.swap_remove(at).1)
            } else if let Some((letterbox, params)) = slot.detection_request() {
                let mut detections = Vec::new();
                self.post
                    .process(self.spec.layout, out, rows, params, letterbox, &mut detections);
                SlotOutput::Detections(detections)
            } else {
                SlotOutput::Tensor(out.to_vec())
            };
            outputs.push(output);
        }
        Ok(outputs)
    }

    /// Decodes and letterboxes the JPEG slots into the host input buffer (the other slots
    /// are already there); returns the slots that could not be decoded, whose canvases are
    /// left gray.
    fn decode_jpegs_on_host(
        &mut self,
        shape: [usize; 4],
        slots: &[Slot],
    ) -> Result<Vec<(usize, DecodeError)>, EngineError> {
        let slot_len = self.spec.image_len();
        let (w, h) = (self.spec.input_width, self.spec.input_height);
        let mut rejected = Vec::new();
        let InputBuffer::U8(input) = self.backend.input(shape)? else {
            return Err(jpeg_needs_u8());
        };
        let mut canvas = Vec::new();
        for (i, slot) in slots.iter().enumerate() {
            let Slot::Jpeg { data, .. } = slot else { continue };
            let dst = &mut input[i * slot_len..(i + 1) * slot_len];
            // The request's header check already held the image to the engine's limits.
            let unlimited = DecodeLimits { max_pixels: u64::MAX };
            match decode_image(data, unlimited) {
                Ok(img) => {
                    self.canvas
                        .fill_into(ImageView::from(&img.rgb), w, h, &mut canvas);
                    dst.copy_from_slice(&canvas);
                }
                Err(e) => {
                    dst.fill(Letterbox::PAD_VALUE);
                    rejected.push((i, e));
                }
            }
        }
        Ok(rejected)
    }
}

/// The size and letterbox of a slot the device writes itself (a JPEG or a frame).
fn device_geometry(slot: &Slot) -> Option<(usize, usize, &Letterbox)> {
    match slot {
        Slot::Jpeg {
            width,
            height,
            letterbox,
            ..
        } => Some((*width, *height, letterbox)),
        Slot::Frame { image, letterbox, .. } => Some((image.width, image.height, letterbox)),
        Slot::Canvas { .. } | Slot::Tensor(_) => None,
    }
}

fn jpeg_needs_u8() -> EngineError {
    EngineError::Backend(BackendError::Inference(
        "JPEG and GPU frame slots need a model with a uint8 canvas input".into(),
    ))
}

/// Normalises image slots and copies tensor slots into a float32 planar input.
fn fill_planar_f32(input: &mut [f32], slots: &[Slot], slot_len: usize) -> Result<(), EngineError> {
    for (slot, dst) in slots.iter().zip(input.chunks_exact_mut(slot_len)) {
        match slot {
            Slot::Canvas { canvas, .. } => rgb8_to_planar_f32(canvas, dst),
            Slot::Tensor(bytes) => {
                for (d, s) in dst.iter_mut().zip(bytes.chunks_exact(4)) {
                    *d = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
                }
            }
            Slot::Jpeg { .. } | Slot::Frame { .. } => return Err(jpeg_needs_u8()),
        }
    }
    // Unused slots of a fixed-size batch are computed and ignored; zero them so they cost
    // the same every time.
    input[slots.len() * slot_len..].fill(0.0);
    Ok(())
}

/// A rewritten graph takes the canvases as they are: one copy each, straight into the
/// memory the runtime reads. JPEG slots are written on the device.
fn fill_canvas_u8(input: &mut [u8], slots: &[Slot], slot_len: usize) {
    for (slot, dst) in slots.iter().zip(input.chunks_exact_mut(slot_len)) {
        match slot {
            Slot::Canvas { canvas, .. } => dst.copy_from_slice(canvas),
            Slot::Tensor(bytes) => dst.copy_from_slice(bytes),
            Slot::Jpeg { .. } | Slot::Frame { .. } => {}
        }
    }
    input[slots.len() * slot_len..].fill(0);
}

#[cfg(test)]
#[path = "detector_tests.rs"]
mod tests;
