//! Model execution behind a small synchronous trait.
//!
//! [`Backend`] is what the engine's model threads call: one batch in, one output tensor out,
//! blocking. [`OrtBackend`] implements it with ONNX Runtime through the `ort` crate, loading
//! the runtime library at run time ([`runtime`] finds it and says exactly what to do when it
//! is missing or too old). Nothing here knows about images or boxes. [`nvtx`] names the GPU
//! stages on NVIDIA profilers' timelines when one is attached (one-line guards in `cuda`,
//! `device_io` and `staging`). [`activations`] runs a calibration graph and hands out its
//! intermediate tensors by name (for `peregrine quantize`).

pub mod activations;
pub mod cuda;
mod device_io;
mod error;
pub mod nvtx;
mod ort_backend;
pub mod runtime;
mod staging;

pub use cuda::frames::FrameSlot;
pub use cuda::jpeg::{ColourConversion, JpegSlot};
pub use cuda::Placement;
pub use error::{is_sticky_cuda_error, BackendError};
pub use ort_backend::{describe, CudaOptions, ExecutionProvider, OrtBackend, SessionConfig, TensorRtOptions};
use peregrine_types::model::Dim;
pub use peregrine_types::ModelDescription;

/// Where the next batch's input is written, in the model's input element type: float32
/// `[N, 3, H, W]`, or uint8 `[N, H, W, 3]` for a rewritten graph.
#[derive(Debug)]
pub enum InputBuffer<'a> {
    F32(&'a mut [f32]),
    U8(&'a mut [u8]),
}

/// The model's detection output, copied into a buffer the caller owns and reuses.
#[derive(Debug, Default, Clone)]
pub struct OutputBuffer {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

/// Slots of a batch the device writes itself instead of reading them from the input
/// buffer: JPEGs it decodes, and video frames already in its memory.
#[derive(Debug, Default, Clone, Copy)]
pub struct DeviceSlots<'a> {
    pub jpegs: &'a [JpegSlot<'a>],
    pub frames: &'a [FrameSlot<'a>],
}

impl DeviceSlots<'_> {
    pub fn is_empty(&self) -> bool {
        self.jpegs.is_empty() && self.frames.is_empty()
    }
}

/// A loaded model that runs batches, one at a time, on the calling thread.
///
/// The backend owns its input buffer, so that a GPU backend can hand out page-locked
/// memory the device reads directly: the caller writes a batch into
/// [`Backend::input`], then calls [`Backend::run`].
///
/// Implementations are `Send` so the engine can move them onto a dedicated thread; they
/// need not be `Sync`, as one instance never runs two batches at once.
pub trait Backend: Send {
    /// The model's tensors and metadata.
    fn description(&self) -> &ModelDescription;

    /// The buffer for a batch of `shape` (`shape`'s product elements), to be filled before
    /// the next [`Backend::run`]. Its contents are unspecified until written.
    fn input(&mut self, shape: [usize; 4]) -> Result<InputBuffer<'_>, BackendError>;

    /// Runs the batch last written into [`Backend::input`] (of the same `shape`) and writes
    /// the first output into `output`, reusing its allocation.
    fn run(&mut self, shape: [usize; 4], output: &mut OutputBuffer) -> Result<(), BackendError>;

    /// Whether [`Backend::run_with_device_slots`] takes JPEG slots (decoded on the device).
    fn decodes_jpeg(&self) -> bool {
        false
    }

    /// The GPU whose NV12 frames [`Backend::run_with_device_slots`] takes (converted and
    /// letterboxed there), if any.
    fn frames_device(&self) -> Option<i32> {
        None
    }

    /// The GPU the model runs on (CUDA's device number), `None` on the CPU.
    fn device(&self) -> Option<i32> {
        None
    }

    /// Runs of one batch size before a run costs what later ones will: two by default (the
    /// first may pay one-time setup), more for a session that captures a CUDA graph.
    fn warm_up_runs(&self) -> usize {
        2
    }

    /// [`Backend::run`], with the slots listed in `device` written on the device: JPEG
    /// files decoded and letterboxed there, NV12 frames converted and letterboxed there
    /// (their part of the input buffer is not read). JPEGs only for backends whose
    /// [`Backend::decodes_jpeg`] is true, frames only for those with a
    /// [`Backend::frames_device`]; others accept empty lists only.
    fn run_with_device_slots(
        &mut self,
        shape: [usize; 4],
        device: DeviceSlots<'_>,
        output: &mut OutputBuffer,
    ) -> Result<(), BackendError> {
        run_without_device_slots(self, shape, device, output)
    }
}

/// [`Backend::run_with_device_slots`] for a backend that writes nothing on a device: a
/// batch without device slots is an ordinary run, one with any is an error.
pub(crate) fn run_without_device_slots<B: Backend + ?Sized>(
    backend: &mut B,
    shape: [usize; 4],
    device: DeviceSlots<'_>,
    output: &mut OutputBuffer,
) -> Result<(), BackendError> {
    if !device.jpegs.is_empty() {
        return Err(BackendError::Inference(
            "this backend does not decode JPEGs".into(),
        ));
    }
    if !device.frames.is_empty() {
        return Err(BackendError::Inference(
            "this backend does not take frames in GPU memory".into(),
        ));
    }
    backend.run(shape, output)
}

/// Several sessions of one model, each run at one batch size only.
///
/// ONNX Runtime's CUDA convolutions prepare their kernels for the input shape of the last
/// run; a session whose batch size changes from run to run prepares them again every time,
/// which measured on an H200 made batches of 8 to 16 images take 1 to 2 s instead of a few
/// milliseconds. With the engine padding batches to a few sizes and one session per size,
/// every session always sees the same shape.
pub struct PerBatchSize {
    /// Ascending by batch size.
    sessions: Vec<(usize, Box<dyn Backend>)>,
    /// The sessions' model, with the batch dimension dynamic: each session may have its
    /// own batch size fixed in its graph, but together they take every size listed.
    description: ModelDescription,
}

impl PerBatchSize {
    /// `sessions` pairs each batch size with the backend that runs it; they must describe
    /// the same model.
    pub fn new(mut sessions: Vec<(usize, Box<dyn Backend>)>) -> Result<Self, BackendError> {
        if sessions.is_empty() {
            return Err(BackendError::ModelLoad(
                "no batch sizes to build sessions for".into(),
            ));
        }
        sessions.sort_by_key(|(n, _)| *n);
        let mut description = sessions[0].1.description().clone();
        for tensor in description
            .inputs
            .iter_mut()
            .chain(description.outputs.iter_mut())
        {
            if let Some(first) = tensor.dims.first_mut() {
                *first = Dim::Dynamic;
            }
        }
        Ok(Self {
            sessions,
            description,
        })
    }

    fn session(&mut self, shape: [usize; 4]) -> Result<&mut Box<dyn Backend>, BackendError> {
        let sizes: Vec<usize> = self.sessions.iter().map(|(n, _)| *n).collect();
        self.sessions
            .iter_mut()
            .find(|(n, _)| *n == shape[0])
            .map(|(_, b)| b)
            .ok_or_else(|| {
                BackendError::Inference(format!(
                    "no session runs batches of {}; the sessions run {sizes:?}",
                    shape[0]
                ))
            })
    }
}

impl Backend for PerBatchSize {
    fn description(&self) -> &ModelDescription {
        &self.description
    }

    fn input(&mut self, shape: [usize; 4]) -> Result<InputBuffer<'_>, BackendError> {
        self.session(shape)?.input(shape)
    }

    fn run(&mut self, shape: [usize; 4], output: &mut OutputBuffer) -> Result<(), BackendError> {
        self.session(shape)?.run(shape, output)
    }

    fn decodes_jpeg(&self) -> bool {
        self.sessions.iter().all(|(_, b)| b.decodes_jpeg())
    }

    fn frames_device(&self) -> Option<i32> {
        let first = self.sessions.first()?.1.frames_device()?;
        self.sessions
            .iter()
            .all(|(_, b)| b.frames_device() == Some(first))
            .then_some(first)
    }

    fn device(&self) -> Option<i32> {
        self.sessions.first().and_then(|(_, b)| b.device())
    }

    fn warm_up_runs(&self) -> usize {
        self.sessions
            .iter()
            .map(|(_, b)| b.warm_up_runs())
            .max()
            .unwrap_or(2)
    }

    fn run_with_device_slots(
        &mut self,
        shape: [usize; 4],
        device: DeviceSlots<'_>,
        output: &mut OutputBuffer,
    ) -> Result<(), BackendError> {
        self.session(shape)?.run_with_device_slots(shape, device, output)
    }
}
