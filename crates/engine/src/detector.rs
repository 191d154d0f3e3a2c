//! The synchronous detection pipeline for one model instance.

use std::time::{Duration, Instant};

use peregrine_backend::{Backend, BackendError, InputBuffer, JpegSlot, OutputBuffer};
use peregrine_types::{DetectParams, Detection};
use peregrine_vision::normalize::rgb8_to_planar_f32;
use peregrine_vision::{
    decode_image, resample_tables, DecodeError, DecodeLimits, DetectorSpec, ImageView, InputForm, Letterbox,
    LetterboxCanvas, Postprocessor,
};

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

/// One image already letterboxed to the model's input size (by [`Detector::prepare`], on
/// any thread), ready to be normalised into a batch.
#[derive(Debug, Clone, Copy)]
pub struct PreparedInput<'a> {
    /// Interleaved RGB8, `input_height * input_width * 3` bytes.
    pub canvas: &'a [u8],
    pub letterbox: &'a Letterbox,
    pub params: &'a DetectParams,
}

/// One slot of a batch: a prepared image to detect in, or a caller's own input tensor
/// whose raw model output is wanted (the tensor interface of the model).
#[derive(Debug, Clone, Copy)]
pub enum BatchItem<'a> {
    Image(PreparedInput<'a>),
    /// One image's worth of model input as the model takes it, in little-endian bytes:
    /// `[3, height, width]` float32 already normalised by the caller, or `[height, width,
    /// 3]` uint8 for a rewritten graph.
    Tensor(&'a [u8]),
    /// A baseline JPEG (see `peregrine_vision::baseline_jpeg`) for a backend that decodes
    /// and letterboxes on the device ([`Detector::decodes_jpeg`]).
    Jpeg(JpegInput<'a>),
}

/// Per output column and per output row (see `peregrine_vision::resample_tables`).
type ResampleTables = (Vec<[i32; 4]>, Vec<[i32; 4]>);

/// A JPEG slot: the file and the geometry its header gave.
#[derive(Debug, Clone, Copy)]
pub struct JpegInput<'a> {
    pub data: &'a [u8],
    pub width: usize,
    pub height: usize,
    /// `Letterbox::new(width, height, ...)` for the model's input size.
    pub letterbox: &'a Letterbox,
    pub params: &'a DetectParams,
}

/// What one slot of a batch produced.
#[derive(Debug, Clone, PartialEq)]
pub enum ItemOutput {
    /// Detections in original-image pixels, best first.
    Detections(Vec<Detection>),
    /// The model's first output for this slot, as it came out (float32, row-major).
    Tensor(Vec<f32>),
    /// A JPEG slot that turned out undecodable (found when the device could not decode the
    /// batch and its JPEGs were decoded on the host).
    Rejected(DecodeError),
}

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

    /// Whether JPEG slots ([`BatchItem::Jpeg`]) are decoded on the device.
    pub fn decodes_jpeg(&self) -> bool {
        self.backend.decodes_jpeg() && self.spec.input_form == InputForm::InterleavedU8
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
        for chunk in images.chunks(self.batch_size) {
            let started = Instant::now();
            canvases.resize_with(chunk.len().max(canvases.len()), Vec::new);
            let letterboxes: Vec<Letterbox> = chunk
                .iter()
                .zip(canvases.iter_mut())
                .map(|(img, out)| Self::prepare(&self.spec, *img, &mut self.canvas, out))
                .collect();
            timings.preprocess += started.elapsed();
            let inputs: Vec<PreparedInput<'_>> = canvases
                .iter()
                .zip(&letterboxes)
                .map(|(c, lb)| PreparedInput {
                    canvas: c,
                    letterbox: lb,
                    params,
                })
                .collect();
            let (dets, t) = self.run_prepared(&inputs)?;
            results.extend(dets);
            timings += t;
        }
        Ok((results, timings))
    }

    /// Runs one batch of prepared images (at most [`Detector::batch_size`]) and returns
    /// each image's detections, in order.
    pub fn run_prepared(
        &mut self,
        images: &[PreparedInput<'_>],
    ) -> Result<(Vec<Vec<Detection>>, StageTimings), EngineError> {
        let items: Vec<BatchItem<'_>> = images.iter().copied().map(BatchItem::Image).collect();
        let (outputs, timings) = self.run_batch(&items)?;
        let detections = outputs
            .into_iter()
            .map(|o| match o {
                ItemOutput::Detections(d) => d,
                ItemOutput::Tensor(_) | ItemOutput::Rejected(_) => {
                    unreachable!("prepared image slots yield detections")
                }
            })
            .collect();
        Ok((detections, timings))
    }

    /// Floats of one slot's raw model output, and its shape without the batch dimension,
    /// as of the last batch run.
    pub fn output_item_shape(&self) -> &[usize] {
        self.output.shape.get(1..).unwrap_or(&[])
    }

    /// Runs one batch (at most [`Detector::batch_size`] slots): normalise images and copy
    /// tensors into the batch buffer, run the model, then postprocess each image with its
    /// own parameters and hand each tensor slot its raw output.
    pub fn run_batch(
        &mut self,
        items: &[BatchItem<'_>],
    ) -> Result<(Vec<ItemOutput>, StageTimings), EngineError> {
        let started = Instant::now();
        let n = items.len();
        if n == 0 || n > self.batch_size {
            return Err(EngineError::BatchSize {
                got: n,
                max: self.batch_size,
            });
        }
        let run_n = self.run_size(n);
        let (h, w) = (self.spec.input_height, self.spec.input_width);
        let slot = self.spec.image_len();
        let shape = match self.spec.input_form {
            InputForm::PlanarF32 => [run_n, 3, h, w],
            InputForm::InterleavedU8 => [run_n, h, w, 3],
        };
        let tensor_bytes = slot * self.spec.input_form.element_size();
        for item in items {
            match item {
                BatchItem::Image(img) if img.canvas.len() != slot => {
                    return Err(EngineError::CanvasSize {
                        got: img.canvas.len(),
                        want: slot,
                    })
                }
                BatchItem::Tensor(bytes) if bytes.len() != tensor_bytes => {
                    return Err(EngineError::TensorSize {
                        got: bytes.len(),
                        want: tensor_bytes,
                    })
                }
                _ => {}
            }
        }
        match self.backend.input(shape)? {
            InputBuffer::F32(input) => {
                for (item, dst) in items.iter().zip(input.chunks_exact_mut(slot)) {
                    match item {
                        BatchItem::Image(img) => rgb8_to_planar_f32(img.canvas, dst),
                        BatchItem::Jpeg(_) => {
                            return Err(EngineError::Backend(BackendError::Inference(
                                "JPEG slots need a model with a uint8 canvas input".into(),
                            )))
                        }
                        BatchItem::Tensor(bytes) => {
                            for (d, s) in dst.iter_mut().zip(bytes.chunks_exact(4)) {
                                *d = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
                            }
                        }
                    }
                }
                // Unused slots of a fixed-size batch are computed and ignored; zero them so
                // they cost the same every time.
                input[n * slot..].fill(0.0);
            }
            InputBuffer::U8(input) => {
                // A rewritten graph takes the canvases as they are: one copy each, straight
                // into the memory the runtime reads.
                for (item, dst) in items.iter().zip(input.chunks_exact_mut(slot)) {
                    match item {
                        BatchItem::Image(img) => dst.copy_from_slice(img.canvas),
                        BatchItem::Tensor(bytes) => dst.copy_from_slice(bytes),
                        // Written on the device.
                        BatchItem::Jpeg(_) => {}
                    }
                }
                input[n * slot..].fill(0);
            }
        }
        let preprocessed = Instant::now();

        let mut rejected: Vec<(usize, DecodeError)> = Vec::new();
        // The device resamples with the CPU letterbox's own tables, so canvases match.
        let tables: Vec<(usize, &JpegInput<'_>, ResampleTables)> = items
            .iter()
            .enumerate()
            .filter_map(|(slot, item)| match item {
                BatchItem::Jpeg(j) => Some((slot, j, resample_tables(j.width, j.height, j.letterbox))),
                _ => None,
            })
            .collect();
        let jpegs: Vec<JpegSlot<'_>> = tables
            .iter()
            .map(|(slot, j, (columns, rows))| JpegSlot {
                slot: *slot,
                data: j.data,
                width: j.width,
                height: j.height,
                scaled: (j.letterbox.scaled_width, j.letterbox.scaled_height),
                offset: (j.letterbox.left, j.letterbox.top),
                pad_value: Letterbox::PAD_VALUE,
                columns,
                rows,
            })
            .collect();
        match self.backend.run_with_jpegs(shape, &jpegs, &mut self.output) {
            Err(BackendError::DeviceDecode(why)) => {
                // One bad file fails the device's whole batch call: decode this batch's
                // JPEGs here instead, so only the bad ones fail, each with its own error.
                tracing::warn!(error = %why, jpegs = jpegs.len(), "GPU JPEG decoding failed; decoding this batch's JPEGs on the CPU");
                rejected = self.decode_jpegs_on_host(shape, items)?;
                self.backend.run(shape, &mut self.output)?;
            }
            other => other?,
        }
        let inferred = Instant::now();

        let got = self.output.shape.first().copied().unwrap_or(0);
        if got != run_n {
            return Err(EngineError::BatchMismatch { got, want: run_n });
        }
        let per_image = self.output.data.len() / got.max(1);
        let wants_detections = items
            .iter()
            .any(|i| matches!(i, BatchItem::Image(_) | BatchItem::Jpeg(_)));
        let rows = if wants_detections {
            self.spec.layout.candidates_per_image(&self.output.shape)?
        } else {
            0
        };
        let mut results = Vec::with_capacity(n);
        for (i, item) in items.iter().enumerate() {
            let out = &self.output.data[i * per_image..(i + 1) * per_image];
            results.push(match item {
                BatchItem::Image(img) => {
                    let mut dets = Vec::new();
                    self.post
                        .process(self.spec.layout, out, rows, img.params, img.letterbox, &mut dets);
                    ItemOutput::Detections(dets)
                }
                BatchItem::Jpeg(j) => match rejected.iter().position(|(s, _)| *s == i) {
                    Some(at) => ItemOutput::Rejected(rejected.swap_remove(at).1),
                    None => {
                        let mut dets = Vec::new();
                        self.post
                            .process(self.spec.layout, out, rows, j.params, j.letterbox, &mut dets);
                        ItemOutput::Detections(dets)
                    }
                },
                BatchItem::Tensor(_) => ItemOutput::Tensor(out.to_vec()),
            });
        }
        let done = Instant::now();
        let timings = StageTimings {
            preprocess: preprocessed - started,
            inference: inferred - preprocessed,
            postprocess: done - inferred,
        };
        Ok((results, timings))
    }
}

impl Detector {
    /// Decodes and letterboxes the JPEG slots of `items` into the host input buffer (the
    /// other slots are already there); returns the slots that could not be decoded, whose
    /// canvases are left gray.
    fn decode_jpegs_on_host(
        &mut self,
        shape: [usize; 4],
        items: &[BatchItem<'_>],
    ) -> Result<Vec<(usize, DecodeError)>, EngineError> {
        let slot_len = self.spec.image_len();
        let (w, h) = (self.spec.input_width, self.spec.input_height);
        let mut rejected = Vec::new();
        let InputBuffer::U8(input) = self.backend.input(shape)? else {
            return Err(EngineError::Backend(BackendError::Inference(
                "JPEG slots need a model with a uint8 canvas input".into(),
            )));
        };
        let mut canvas = Vec::new();
        for (i, item) in items.iter().enumerate() {
            let BatchItem::Jpeg(j) = item else { continue };
            let dst = &mut input[i * slot_len..(i + 1) * slot_len];
            // The request's header check already held the image to the engine's limits.
            let unlimited = DecodeLimits { max_pixels: u64::MAX };
            match decode_image(j.data, unlimited) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use peregrine_backend::{BackendError, ModelDescription};
    use peregrine_types::model::ElementType;
    use peregrine_types::{Dim, TensorDescription};
    use std::sync::{Arc, Mutex};

    /// A backend that returns a fixed end-to-end row per image and records batch shapes.
    struct FakeBackend {
        description: ModelDescription,
        seen: Arc<Mutex<Vec<[usize; 4]>>>,
        input: Vec<f32>,
    }

    impl FakeBackend {
        fn new(batch: Dim) -> (Self, Arc<Mutex<Vec<[usize; 4]>>>) {
            let seen = Arc::new(Mutex::new(Vec::new()));
            let t = |name: &str, dims| TensorDescription {
                name: name.into(),
                element: ElementType::F32,
                dims,
            };
            let description = ModelDescription {
                inputs: vec![t(
                    "images",
                    vec![batch, Dim::Fixed(3), Dim::Fixed(64), Dim::Fixed(64)],
                )],
                outputs: vec![t("output0", vec![batch, Dim::Fixed(2), Dim::Fixed(6)])],
                metadata: [("end2end".to_string(), "True".to_string())].into(),
            };
            (
                Self {
                    description,
                    seen: seen.clone(),
                    input: Vec::new(),
                },
                seen,
            )
        }
    }

    impl Backend for FakeBackend {
        fn description(&self) -> &ModelDescription {
            &self.description
        }

        fn input(&mut self, shape: [usize; 4]) -> Result<InputBuffer<'_>, BackendError> {
            self.input.resize(shape.iter().product(), f32::NAN);
            Ok(InputBuffer::F32(&mut self.input))
        }

        fn run(&mut self, shape: [usize; 4], output: &mut OutputBuffer) -> Result<(), BackendError> {
            self.seen.lock().unwrap().push(shape);
            let n = shape[0];
            output.shape = vec![n, 2, 6];
            output.data.clear();
            for i in 0..n {
                // The mean of the image's first plane tells images apart.
                let plane = &self.input[i * 3 * 64 * 64..][..64 * 64];
                let mean = plane.iter().sum::<f32>() / plane.len() as f32;
                output.data.extend_from_slice(&[0.0, 0.0, 32.0, 32.0, mean, 1.0]);
                output.data.extend_from_slice(&[0.0, 0.0, 1.0, 1.0, 0.01, 0.0]);
            }
            Ok(())
        }
    }

    fn gray(v: u8) -> Vec<u8> {
        vec![v; 64 * 64 * 3]
    }

    #[test]
    fn batches_are_split_and_results_stay_in_order() {
        let (backend, seen) = FakeBackend::new(Dim::Dynamic);
        let mut det = Detector::new(
            Box::new(backend),
            &DetectorConfig {
                imgsz: None,
                max_batch: 2,
                run_sizes: vec![],
            },
        )
        .unwrap();
        let pixels = [gray(255), gray(128), gray(200)];
        let views: Vec<_> = pixels
            .iter()
            .map(|p| ImageView::packed(p, 64, 64).unwrap())
            .collect();
        let (res, _) = det.detect(&views, &DetectParams::default()).unwrap();
        assert_eq!(*seen.lock().unwrap(), [[2, 3, 64, 64], [1, 3, 64, 64]]);
        let scores: Vec<f32> = res.iter().map(|d| d[0].score).collect();
        assert!((scores[0] - 1.0).abs() < 1e-3 && (scores[1] - 128.0 / 255.0).abs() < 1e-3);
        assert!((scores[2] - 200.0 / 255.0).abs() < 1e-3);
        assert!(res.iter().all(|d| d.len() == 1), "the 0.01 row is under conf");
    }

    #[test]
    fn batches_are_padded_up_to_the_next_run_size() {
        let (backend, seen) = FakeBackend::new(Dim::Dynamic);
        let mut det = Detector::new(
            Box::new(backend),
            &DetectorConfig {
                imgsz: None,
                max_batch: 8,
                run_sizes: vec![1, 4],
            },
        )
        .unwrap();
        assert_eq!(det.run_sizes(8), [1, 4, 8]);
        assert_eq!(det.run_sizes(3), [1, 4]);
        let pixels: Vec<Vec<u8>> = (0..5u8).map(|v| gray(100 + v)).collect();
        let views: Vec<_> = pixels
            .iter()
            .map(|p| ImageView::packed(p, 64, 64).unwrap())
            .collect();
        let (res, _) = det.detect(&views[..3], &DetectParams::default()).unwrap();
        let (res5, _) = det.detect(&views, &DetectParams::default()).unwrap();
        assert_eq!(*seen.lock().unwrap(), [[4, 3, 64, 64], [8, 3, 64, 64]]);
        assert_eq!((res.len(), res5.len()), (3, 5), "padding slots give no results");
        assert!((res5[4][0].score - 104.0 / 255.0).abs() < 1e-3);
    }

    #[test]
    fn fixed_batch_models_get_padded_batches() {
        let (backend, seen) = FakeBackend::new(Dim::Fixed(4));
        let mut det = Detector::new(Box::new(backend), &DetectorConfig::default()).unwrap();
        assert_eq!(det.batch_size(), 4);
        let p = gray(255);
        let (res, _) = det
            .detect(
                &[ImageView::packed(&p, 64, 64).unwrap()],
                &DetectParams::default(),
            )
            .unwrap();
        assert_eq!(*seen.lock().unwrap(), [[4, 3, 64, 64]]);
        assert_eq!(res.len(), 1);
    }
}
