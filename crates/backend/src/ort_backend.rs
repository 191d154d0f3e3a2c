//! [`Backend`] over an ONNX Runtime session.

use std::collections::BTreeMap;
use std::path::PathBuf;

use ort::session::builder::GraphOptimizationLevel;
use ort::session::Session;
use ort::value::{TensorElementType, TensorValueTypeMarker, Value, ValueType};
use peregrine_types::model::ElementType;
use peregrine_types::{Dim, ModelDescription, TensorDescription};

use crate::cuda::capture::{self, CaptureTurns};
use crate::cuda::jpeg::ColourConversion;
use crate::device_io::DeviceIo;
use crate::staging::{Element, Staging};
use crate::{runtime, Backend, BackendError, DeviceSlots, InputBuffer, OutputBuffer};

/// Where the model's graph runs.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ExecutionProvider {
    /// ONNX Runtime's own CPU kernels: always available.
    #[default]
    Cpu,
    /// NVIDIA GPUs through CUDA and cuDNN (needs the GPU build of ONNX Runtime).
    Cuda(CudaOptions),
    /// NVIDIA TensorRT (needs TensorRT's libraries beside the GPU build of ONNX Runtime).
    TensorRt(TensorRtOptions),
}

impl ExecutionProvider {
    pub fn name(&self) -> &'static str {
        match self {
            Self::Cpu => "cpu",
            Self::Cuda(_) => "cuda",
            Self::TensorRt(_) => "tensorrt",
        }
    }

    /// The GPU a GPU provider runs on; `None` for the CPU.
    pub fn device(&self) -> Option<i32> {
        match self {
            Self::Cpu => None,
            Self::Cuda(o) => Some(o.device_id),
            Self::TensorRt(o) => Some(o.device_id),
        }
    }

    /// The same provider on GPU `device` (the CPU stays the CPU).
    pub fn on_device(&self, device: i32) -> Self {
        let mut moved = self.clone();
        match &mut moved {
            Self::Cpu => {}
            Self::Cuda(o) => o.device_id = device,
            Self::TensorRt(o) => o.device_id = device,
        }
        moved
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CudaOptions {
    pub device_id: i32,
    /// Cap on the provider's memory arena, in bytes.
    pub memory_limit: Option<usize>,
    /// Benchmark every cuDNN convolution algorithm on first use (slower start, faster runs).
    pub exhaustive_conv_search: bool,
    /// Prefer NHWC kernels where cuDNN has them.
    pub prefer_nhwc: bool,
    /// Capture the run as a CUDA graph (fixed shapes only).
    pub cuda_graph: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TensorRtOptions {
    pub device_id: i32,
    pub fp16: bool,
    pub int8: bool,
    /// INT8 calibration table (TensorRT's or ONNX Runtime's format).
    pub int8_calibration_table: Option<PathBuf>,
    /// Directory for built engines, so later starts skip the build.
    pub engine_cache: Option<PathBuf>,
    /// Directory for TensorRT's timing cache.
    pub timing_cache: Option<PathBuf>,
}

/// How one ONNX Runtime session is built.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionConfig {
    /// Threads for one operator; 0 lets ONNX Runtime choose (one per physical core).
    pub intra_threads: usize,
    /// Let idle intra-op threads spin instead of sleeping. ONNX Runtime's default (`None`)
    /// spins, which is fastest when the model has the cores to itself; turn it off when
    /// decoding shares the same cores.
    pub intra_op_spinning: Option<bool>,
    pub provider: ExecutionProvider,
    /// The ONNX Runtime library to load; `None` searches the usual places.
    pub runtime_path: Option<PathBuf>,
    /// On a GPU provider, write inputs into page-locked host memory, which the device
    /// copies by DMA; ignored on the CPU.
    pub pinned_input: bool,
    /// On a GPU provider, keep the model's input and output in device memory at fixed
    /// addresses, copied in and out explicitly (see `device_io`); needed by CUDA graphs,
    /// and implied by them. Ignored on the CPU.
    pub device_io: bool,
    /// On a CUDA provider, decode JPEGs handed to [`Backend::run_with_jpegs`] on the GPU
    /// (nvJPEG) and letterbox them there (our NVRTC-compiled kernel); implies `device_io` and needs the rewritten
    /// graph's uint8 input.
    pub gpu_jpeg_decode: bool,
    /// With `gpu_jpeg_decode`: whose chroma upsampling and colour conversion make the RGB
    /// (libjpeg-turbo's, exact, by default; or nvJPEG's, faster).
    pub gpu_jpeg_colour: ColourConversion,
    /// On a CUDA provider, take video frames that are in GPU memory (NV12 surfaces from
    /// NVDEC) in [`Backend::run_with_device_slots`]: converted and letterboxed by our kernels
    /// straight into the device input. Implies `device_io`; needs the rewritten graph's
    /// uint8 input.
    pub gpu_frames: bool,
    /// Write ONNX Runtime's per-node profile (Chrome trace JSON) to a file starting with
    /// this path, once the session is dropped.
    pub profile: Option<PathBuf>,
}

/// How a batch reaches the session.
enum Io {
    /// Host memory (ordinary or pinned), copied to the device by ONNX Runtime per run.
    Staged(Staging),
    /// Device tensors at fixed addresses.
    Device(Box<DeviceIo>),
}

pub struct OrtBackend {
    session: Session,
    description: ModelDescription,
    io: Io,
    profiling: bool,
    /// The GPU the session runs on (its runs call CUDA on the running thread), if any.
    device: Option<i32>,
    /// Whether the session captures its runs as a CUDA graph.
    cuda_graph: bool,
    /// Which runs hold the process-wide capture turn (see [`capture`]).
    capture_turns: CaptureTurns,
}

impl Drop for OrtBackend {
    fn drop(&mut self) {
        if self.device.is_some() {
            // Freeing device memory is a call another thread's capture must not see.
            capture::isolate_this_thread();
        }
        if self.profiling {
            match self.session.end_profiling() {
                Ok(file) => tracing::info!(%file, "ONNX Runtime profile written"),
                Err(e) => tracing::warn!(error = %e, "ONNX Runtime profile not written"),
            }
        }
    }
}

impl std::fmt::Debug for OrtBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OrtBackend")
            .field("description", &self.description)
            .finish()
    }
}

fn load_err(e: impl std::fmt::Display) -> BackendError {
    BackendError::ModelLoad(e.to_string())
}

impl OrtBackend {
    /// Builds a session from an in-memory ONNX model.
    pub fn from_bytes(model: &[u8], config: &SessionConfig) -> Result<Self, BackendError> {
        if config.provider != ExecutionProvider::Cpu {
            // Building a session allocates device memory: unsafe beside another thread's
            // graph capture unless this thread is isolated from it.
            capture::isolate_this_thread();
        }
        let env = runtime::environment(config.runtime_path.as_deref())?;
        let mut builder = Session::builder(&env)
            .map_err(load_err)?
            .with_optimization_level(GraphOptimizationLevel::All)
            .map_err(load_err)?;
        if config.intra_threads > 0 {
            builder = builder
                .with_intra_threads(config.intra_threads)
                .map_err(load_err)?;
        }
        if config.provider == ExecutionProvider::Cpu {
            // The memory pattern plans one block per input shape and keeps every plan's
            // block in the CPU arena; a session that runs batches of 1 to 4 then holds four
            // of them. Off, yolo11n at batches of 1-4 settles at 243 MiB instead of 359 MiB,
            // at the same speed (docs/benchmarks.md, issue 22). GPU sessions run one shape
            // each, so their pattern is one block and stays.
            builder = builder.with_memory_pattern(false).map_err(load_err)?;
            // Quantized models: x86 CPUs without VNNI multiply uint8 by int8 in 16-bit pairs
            // that saturate, which cost an int8 yolo11n most of its detections on an AVX2
            // EPYC (recall 39% against 80% with VNNI). This makes ONNX Runtime use its exact
            // uint8 x uint8 kernels there. Only there: ONNX Runtime applies it on VNNI cores
            // too (its overflow test compares dispatch tables, which differ there as well),
            // where it made INT8 slower than float (0.7-0.9x on an AMX Xeon, 2026-12-07).
            if quantized_products_saturate() {
                builder = builder
                    .with_config_entry("session.x64quantprecision", "1")
                    .map_err(load_err)?;
            }
        }
        if let Some(prefix) = &config.profile {
            builder = builder.with_profiling(prefix).map_err(load_err)?;
        }
        if let Some(ep) = provider_dispatch(&config.provider) {
            // error_on_failure: a provider that cannot load is an error, never a silent
            // fallback to the CPU; falling back is the caller's decision.
            builder = builder
                .with_execution_providers([ep.error_on_failure()])
                .map_err(|e| BackendError::ProviderUnavailable {
                    provider: config.provider.name().to_string(),
                    reason: e.to_string(),
                })?;
        }
        let session = builder.commit_from_memory(model).map_err(load_err)?;
        let description = describe(&session)?;
        let element = match description.inputs.first().map(|i| &i.element) {
            Some(ElementType::U8) => Element::U8,
            _ => Element::F32,
        };
        let device = config.provider.device();
        let cuda_graph = matches!(&config.provider, ExecutionProvider::Cuda(o) if o.cuda_graph);
        let io = match device {
            // No silent fallback here: CUDA graphs replay fixed addresses, which only device
            // IO gives.
            Some(device) if config.device_io || config.gpu_jpeg_decode || config.gpu_frames || cuda_graph => {
                Io::Device(Box::new(DeviceIo::new(
                    &session,
                    element,
                    device,
                    config.gpu_jpeg_decode.then_some(config.gpu_jpeg_colour),
                    config.gpu_frames,
                )?))
            }
            Some(device) if config.pinned_input => Io::Staged(
                Staging::pinned(&session, element, device).unwrap_or_else(|e| {
                    tracing::warn!(error = %e, "no pinned host memory; inputs are copied from ordinary memory");
                    Staging::host(element)
                }),
            ),
            _ => Io::Staged(Staging::host(element)),
        };
        Ok(Self {
            session,
            description,
            io,
            profiling: config.profile.is_some(),
            device,
            cuda_graph,
            capture_turns: CaptureTurns::new(cuda_graph),
        })
    }

    /// Whether inputs go through page-locked memory.
    pub fn pinned_input(&self) -> bool {
        match &self.io {
            Io::Staged(s) => s.is_pinned(),
            Io::Device(_) => true,
        }
    }

    /// Whether inputs and outputs are bound in device memory.
    pub fn device_io(&self) -> bool {
        matches!(self.io, Io::Device(_))
    }

    /// Builds a session with the configured provider, falling back to the CPU only when
    /// `fallback` says so (and saying so in the log).
    pub fn from_bytes_or_cpu(
        model: &[u8],
        config: &SessionConfig,
        fallback: bool,
    ) -> Result<Self, BackendError> {
        match Self::from_bytes(model, config) {
            Err(BackendError::ProviderUnavailable { provider, reason }) if fallback => {
                tracing::warn!(%provider, %reason, "execution provider unavailable; falling back to the CPU");
                let cpu = SessionConfig {
                    provider: ExecutionProvider::Cpu,
                    ..config.clone()
                };
                Self::from_bytes(model, &cpu)
            }
            other => other,
        }
    }

    /// Builds a session from an ONNX file.
    pub fn from_file(path: &std::path::Path, config: &SessionConfig) -> Result<Self, BackendError> {
        let bytes = std::fs::read(path)
            .map_err(|e| BackendError::ModelLoad(format!("cannot read {}: {e}", path.display())))?;
        Self::from_bytes(&bytes, config)
    }
}

impl OrtBackend {
    /// Readies the calling thread for a run: isolated from other threads' graph captures
    /// when on a GPU, and holding the capture turn while this session's graph is captured.
    fn prepare_run(&mut self) -> Result<Option<std::sync::MutexGuard<'static, ()>>, BackendError> {
        if let Some(device) = self.device {
            capture::isolate_this_thread();
            if matches!(self.io, Io::Device(_)) {
                // Our own copies and kernels run on the calling thread's current device,
                // which is device 0 until set: an instance on another GPU must say so
                // before its first run (ONNX Runtime sets it only inside the run).
                crate::cuda::set_device(device).map_err(|e| BackendError::Inference(e.to_string()))?;
            }
        }
        Ok(self.capture_turns.take())
    }
}

impl OrtBackend {
    /// [`Backend::run`], with errors as ONNX Runtime and CUDA gave them (the trait method
    /// tells a lost GPU from them, once).
    fn run_session(&mut self, shape: [usize; 4], output: &mut OutputBuffer) -> Result<(), BackendError> {
        let _turn = self.prepare_run()?;
        let staging = match &mut self.io {
            Io::Staged(s) => s,
            Io::Device(d) => return d.run(&mut self.session, shape, output),
        };
        let outputs = staging.run(&mut self.session, shape)?;
        read_output(&outputs[0], output)
    }

    /// [`Backend::run_with_device_slots`], with errors as given (see [`Self::run_session`]).
    fn run_session_with_device_slots(
        &mut self,
        shape: [usize; 4],
        device: DeviceSlots<'_>,
        output: &mut OutputBuffer,
    ) -> Result<(), BackendError> {
        let _turn = self.prepare_run()?;
        match &mut self.io {
            Io::Device(d) => d.run_with_device_slots(&mut self.session, shape, device, output),
            Io::Staged(_) => crate::run_without_device_slots(self, shape, device, output),
        }
    }
}

fn provider_dispatch(provider: &ExecutionProvider) -> Option<ort::ep::ExecutionProviderDispatch> {
    use ort::ep;
    match provider {
        ExecutionProvider::Cpu => None,
        ExecutionProvider::Cuda(o) => {
            let mut cuda = ep::CUDA::default()
                .with_device_id(o.device_id)
                .with_prefer_nhwc(o.prefer_nhwc)
                .with_cuda_graph(o.cuda_graph);
            if let Some(limit) = o.memory_limit {
                cuda = cuda.with_memory_limit(limit);
            }
            // ONNX Runtime's own default is the exhaustive search, which benchmarks every
            // convolution algorithm for every new input shape; it is opt-in here.
            cuda = cuda.with_conv_algorithm_search(if o.exhaustive_conv_search {
                ep::cuda::ConvAlgorithmSearch::Exhaustive
            } else {
                ep::cuda::ConvAlgorithmSearch::Heuristic
            });
            Some(cuda.build())
        }
        ExecutionProvider::TensorRt(o) => {
            let mut trt = ep::TensorRT::default()
                .with_device_id(o.device_id)
                .with_fp16(o.fp16)
                .with_int8(o.int8);
            if let Some(table) = &o.int8_calibration_table {
                trt = trt.with_int8_calibration_table_name(table.display());
            }
            if let Some(dir) = &o.engine_cache {
                trt = trt.with_engine_cache(true).with_engine_cache_path(dir.display());
            }
            if let Some(dir) = &o.timing_cache {
                trt = trt.with_timing_cache(true).with_timing_cache_path(dir.display());
            }
            Some(trt.build())
        }
    }
}

fn element(ty: TensorElementType) -> ElementType {
    match ty {
        TensorElementType::Float32 => ElementType::F32,
        TensorElementType::Float16 => ElementType::F16,
        TensorElementType::Uint8 => ElementType::U8,
        other => ElementType::Other(format!("{other:?}").to_lowercase()),
    }
}

fn tensor(name: &str, ty: &ValueType) -> Result<TensorDescription, BackendError> {
    match ty {
        ValueType::Tensor { ty, shape, .. } => Ok(TensorDescription {
            name: name.to_string(),
            element: element(*ty),
            dims: shape
                .iter()
                .map(|&d| {
                    if d >= 0 {
                        Dim::Fixed(d as usize)
                    } else {
                        Dim::Dynamic
                    }
                })
                .collect(),
        }),
        other => Err(BackendError::ModelLoad(format!(
            "{name:?} is a {other:?}, not a tensor; only tensor inputs and outputs are supported"
        ))),
    }
}

/// What `session` takes and gives, and the model's metadata, as the engine reads them.
pub fn describe(session: &Session) -> Result<ModelDescription, BackendError> {
    let inputs = session
        .inputs()
        .iter()
        .map(|o| tensor(o.name(), o.dtype()))
        .collect::<Result<_, _>>()?;
    let outputs = session
        .outputs()
        .iter()
        .map(|o| tensor(o.name(), o.dtype()))
        .collect::<Result<_, _>>()?;
    let meta = session.metadata().map_err(load_err)?;
    let mut metadata = BTreeMap::new();
    for key in meta.custom_keys().map_err(load_err)? {
        if let Some(v) = meta.custom(&key) {
            metadata.insert(key, v);
        }
    }
    Ok(ModelDescription {
        inputs,
        outputs,
        metadata,
    })
}

impl Backend for OrtBackend {
    fn description(&self) -> &ModelDescription {
        &self.description
    }

    fn input(&mut self, shape: [usize; 4]) -> Result<InputBuffer<'_>, BackendError> {
        let len = shape.iter().product();
        match &mut self.io {
            Io::Staged(s) => s.buffer(len),
            Io::Device(d) => d.buffer(len),
        }
    }

    fn decodes_jpeg(&self) -> bool {
        matches!(&self.io, Io::Device(d) if d.decodes_jpeg())
    }

    fn frames_device(&self) -> Option<i32> {
        match &self.io {
            Io::Device(d) => d.frames_device(),
            Io::Staged(_) => None,
        }
    }

    fn warm_up_runs(&self) -> usize {
        CaptureTurns::warm_up_runs(self.cuda_graph)
    }

    fn run_with_device_slots(
        &mut self,
        shape: [usize; 4],
        device: DeviceSlots<'_>,
        output: &mut OutputBuffer,
    ) -> Result<(), BackendError> {
        self.run_session_with_device_slots(shape, device, output)
            .map_err(|e| e.on_device(self.device))
    }

    fn run(&mut self, shape: [usize; 4], output: &mut OutputBuffer) -> Result<(), BackendError> {
        self.run_session(shape, output)
            .map_err(|e| e.on_device(self.device))
    }

    fn device(&self) -> Option<i32> {
        self.device
    }
}

/// Copies a host output tensor into `output`. Models exported for GPUs may keep float16 at
/// the output; it is widened here so everything downstream sees float32.
pub(crate) fn read_output<T: TensorValueTypeMarker + ?Sized>(
    value: &Value<T>,
    output: &mut OutputBuffer,
) -> Result<(), BackendError> {
    output.shape.clear();
    output.data.clear();
    if let Ok((shape, data)) = value.try_extract_tensor::<f32>() {
        output.shape.extend(shape.iter().map(|&d| d.max(0) as usize));
        output.data.extend_from_slice(data);
    } else {
        let (shape, data) = value
            .try_extract_tensor::<half::f16>()
            .map_err(|e| BackendError::Output(format!("expected a float32 or float16 tensor: {e}")))?;
        output.shape.extend(shape.iter().map(|&d| d.max(0) as usize));
        output.data.extend(data.iter().map(|v| v.to_f32()));
    }
    Ok(())
}

/// Whether this CPU's fast uint8 x int8 kernels can saturate: x86 without VNNI (AVX-512
/// VNNI or AVX-VNNI), where ONNX Runtime sums products in 16-bit pairs. Not x86: no.
pub fn quantized_products_saturate() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        !(std::arch::is_x86_feature_detected!("avx512vnni") || std::arch::is_x86_feature_detected!("avxvnni"))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The exact kernels are asked for exactly where the kernel reports no VNNI, read
    /// independently from the kernel's own list of CPU flags.
    #[cfg(target_os = "linux")]
    #[test]
    fn exact_quantized_kernels_only_without_vnni() {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").expect("/proc/cpuinfo is readable");
        let flags: Vec<&str> = cpuinfo
            .lines()
            .find(|l| l.starts_with("flags"))
            .map(|l| l.split_whitespace().collect())
            .unwrap_or_default();
        let vnni = flags.contains(&"avx512_vnni") || flags.contains(&"avx_vnni");
        let x86 = cfg!(target_arch = "x86_64");
        assert_eq!(quantized_products_saturate(), x86 && !vnni, "flags: {flags:?}");
    }
}
