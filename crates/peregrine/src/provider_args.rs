//! Execution-provider flags, shared by every command that loads a model.

use std::path::PathBuf;

use clap::{Args, ValueEnum};
use peregrine_backend::{ColourConversion, CudaOptions, ExecutionProvider, TensorRtOptions};
use peregrine_registry::{GraphRewrite, ModelSettings};

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq, Default)]
pub enum ProviderKind {
    #[default]
    Cpu,
    Cuda,
    Tensorrt,
}

#[derive(Debug, Clone, Args)]
pub struct ProviderArgs {
    /// Where the model runs. cuda and tensorrt need the GPU build of ONNX Runtime
    /// (ORT_DYLIB_PATH); a provider that cannot load is an error unless --provider-fallback.
    #[arg(long, env = "PEREGRINE_PROVIDER", value_enum, default_value = "cpu")]
    pub provider: ProviderKind,
    /// Run on the CPU instead when the chosen provider cannot load (logged as a warning).
    #[arg(long, env = "PEREGRINE_PROVIDER_FALLBACK")]
    pub provider_fallback: bool,
    /// GPU to use (cuda, tensorrt).
    #[arg(long, env = "PEREGRINE_DEVICE_ID", default_value_t = 0)]
    pub device_id: i32,
    /// Spread the model's instances over these GPUs, --instances on each, taken in turn
    /// (cuda, tensorrt; e.g. `0,1`); instead of --device-id. Video streams' NVDEC
    /// decoders go to the listed GPU with the fewest streams.
    #[arg(
        long,
        env = "PEREGRINE_GPUS",
        value_delimiter = ',',
        conflicts_with = "device_id"
    )]
    pub gpus: Vec<i32>,
    /// Cap on the CUDA memory arena, in bytes.
    #[arg(long, env = "PEREGRINE_GPU_MEM_LIMIT")]
    pub gpu_mem_limit: Option<usize>,
    /// Benchmark every cuDNN convolution algorithm at the first run of each input shape
    /// (cuda; slower warm-up, sometimes faster runs); otherwise cuDNN's heuristics choose.
    #[arg(long, env = "PEREGRINE_CUDNN_EXHAUSTIVE")]
    pub cudnn_exhaustive: bool,
    /// Prefer NHWC convolution kernels (cuda).
    #[arg(long, env = "PEREGRINE_PREFER_NHWC")]
    pub prefer_nhwc: bool,
    /// Capture runs as CUDA graphs (cuda; fixed input shapes only).
    #[arg(long, env = "PEREGRINE_CUDA_GRAPH")]
    pub cuda_graph: bool,
    /// Build FP16 engines (tensorrt).
    #[arg(long, env = "PEREGRINE_TRT_FP16")]
    pub trt_fp16: bool,
    /// Build INT8 engines (tensorrt); give a calibration table.
    #[arg(long, env = "PEREGRINE_TRT_INT8")]
    pub trt_int8: bool,
    /// INT8 calibration table file (tensorrt).
    #[arg(long, env = "PEREGRINE_TRT_INT8_CALIBRATION_TABLE")]
    pub trt_int8_calibration_table: Option<PathBuf>,
    /// Directory to cache built engines in (tensorrt).
    #[arg(long, env = "PEREGRINE_TRT_ENGINE_CACHE")]
    pub trt_engine_cache: Option<PathBuf>,
    /// Directory for TensorRT's timing cache (tensorrt).
    #[arg(long, env = "PEREGRINE_TRT_TIMING_CACHE")]
    pub trt_timing_cache: Option<PathBuf>,
    /// Rewrite the model's graph at load time so the accelerator normalises the uint8
    /// canvas and returns only the top-K candidate rows: auto (on GPU providers), on, off.
    /// On the CPU provider (auto or on) the head's box decoding is also refolded without
    /// its slow softmax (same boxes within 0.001 px); off runs the model as exported.
    #[arg(long, env = "PEREGRINE_GRAPH_REWRITE", default_value = "auto")]
    pub graph_rewrite: GraphRewrite,
    /// Candidate rows per image the rewritten graph returns.
    #[arg(long, env = "PEREGRINE_TOP_K", default_value_t = peregrine_onnx_top_k())]
    pub top_k: usize,
    /// Stage inputs in page-locked host memory on GPU providers (faster copies to the GPU).
    #[arg(long, env = "PEREGRINE_PINNED_INPUT", default_value_t = true, action = clap::ArgAction::Set)]
    pub pinned_input: bool,
    /// Keep the model's input and output in GPU memory at fixed addresses, copied in and
    /// out explicitly (cuda, tensorrt); implied by --cuda-graph, which replays those addresses.
    #[arg(long, env = "PEREGRINE_DEVICE_IO")]
    pub device_io: bool,
    /// Decode baseline JPEGs on the GPU (nvJPEG, the hardware decoder where there is one)
    /// and letterbox them there instead of on the CPU cores (cuda; needs the rewritten
    /// graph; implies --device-io). Other images are still decoded on the CPU.
    #[arg(long, env = "PEREGRINE_GPU_JPEG_DECODE")]
    pub gpu_jpeg_decode: bool,
    /// With --gpu-jpeg-decode, who turns nvJPEG's planes into RGB: `exact` runs
    /// libjpeg-turbo's chroma upsampling and colour tables on the GPU (the CPU path's
    /// pixels, so Ultralytics' detections); `nvjpeg` takes nvJPEG's own RGB, which moves
    /// pixels and so detections, at the same speed on an H200 (docs/benchmarks.md).
    #[arg(long, env = "PEREGRINE_GPU_JPEG_COLOUR", value_enum, default_value_t = GpuJpegColour::Exact)]
    pub gpu_jpeg_colour: GpuJpegColour,
    /// Leave video frames decoded by NVDEC in GPU memory and letterbox them there, straight
    /// into the model's input, instead of copying each one to the host for conversion
    /// (cuda; needs the rewritten graph; implies --device-io). Frames go to the host only
    /// for snapshots and live views.
    #[arg(long, env = "PEREGRINE_GPU_FRAMES")]
    pub gpu_frames: bool,
}

/// `--gpu-jpeg-colour`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum GpuJpegColour {
    Exact,
    Nvjpeg,
}

impl From<GpuJpegColour> for ColourConversion {
    fn from(c: GpuJpegColour) -> Self {
        match c {
            GpuJpegColour::Exact => ColourConversion::LibjpegTurbo,
            GpuJpegColour::Nvjpeg => ColourConversion::Nvjpeg,
        }
    }
}

impl Default for ProviderArgs {
    /// The same as the flags' defaults.
    fn default() -> Self {
        Self {
            provider: ProviderKind::Cpu,
            provider_fallback: false,
            device_id: 0,
            gpus: Vec::new(),
            gpu_mem_limit: None,
            cudnn_exhaustive: false,
            prefer_nhwc: false,
            cuda_graph: false,
            trt_fp16: false,
            trt_int8: false,
            trt_int8_calibration_table: None,
            trt_engine_cache: None,
            trt_timing_cache: None,
            graph_rewrite: GraphRewrite::Auto,
            top_k: peregrine_onnx_top_k(),
            pinned_input: true,
            device_io: false,
            gpu_jpeg_decode: false,
            gpu_jpeg_colour: GpuJpegColour::Exact,
            gpu_frames: false,
        }
    }
}

/// The rewrite's default row count, named once.
fn peregrine_onnx_top_k() -> usize {
    ModelSettings::default().top_k
}

impl ProviderArgs {
    pub fn provider(&self) -> ExecutionProvider {
        match self.provider {
            ProviderKind::Cpu => ExecutionProvider::Cpu,
            ProviderKind::Cuda => ExecutionProvider::Cuda(CudaOptions {
                device_id: self.device_id,
                memory_limit: self.gpu_mem_limit,
                exhaustive_conv_search: self.cudnn_exhaustive,
                prefer_nhwc: self.prefer_nhwc,
                cuda_graph: self.cuda_graph,
            }),
            ProviderKind::Tensorrt => ExecutionProvider::TensorRt(TensorRtOptions {
                device_id: self.device_id,
                fp16: self.trt_fp16,
                int8: self.trt_int8,
                int8_calibration_table: self.trt_int8_calibration_table.clone(),
                engine_cache: self.trt_engine_cache.clone(),
                timing_cache: self.trt_timing_cache.clone(),
            }),
        }
    }

    /// Sets what these flags decide in a model's settings: the provider and its session
    /// options, and the graph rewrite.
    pub fn apply_to(&self, settings: &mut ModelSettings) {
        let session = &mut settings.session;
        session.provider = self.provider();
        session.pinned_input = self.pinned_input;
        session.device_io = self.device_io;
        session.gpu_jpeg_decode = self.gpu_jpeg_decode;
        session.gpu_jpeg_colour = self.gpu_jpeg_colour.into();
        session.gpu_frames = self.gpu_frames;
        settings.gpus = self.gpus.clone();
        settings.provider_fallback = self.provider_fallback;
        settings.graph_rewrite = self.graph_rewrite;
        settings.top_k = self.top_k;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        provider: ProviderArgs,
    }

    fn session_for(args: &[&str]) -> peregrine_backend::SessionConfig {
        let cli = Cli::try_parse_from(std::iter::once("peregrine").chain(args.iter().copied())).unwrap();
        let mut settings = ModelSettings::default();
        cli.provider.apply_to(&mut settings);
        settings.session
    }

    #[test]
    fn gpu_jpeg_colour_is_exact_unless_nvjpeg_is_asked_for() {
        let exact = session_for(&["--gpu-jpeg-decode"]);
        assert!(exact.gpu_jpeg_decode);
        assert_eq!(exact.gpu_jpeg_colour, ColourConversion::LibjpegTurbo);
        let fast = session_for(&["--gpu-jpeg-decode", "--gpu-jpeg-colour", "nvjpeg"]);
        assert_eq!(fast.gpu_jpeg_colour, ColourConversion::Nvjpeg);
        assert!(Cli::try_parse_from(["peregrine", "--gpu-jpeg-colour", "fast"]).is_err());
    }

    #[test]
    fn gpus_spread_the_instances_and_exclude_device_id() {
        let parse =
            |args: &[&str]| Cli::try_parse_from(std::iter::once("peregrine").chain(args.iter().copied()));
        let cli = parse(&["--provider", "cuda", "--gpus", "0,1"]).unwrap();
        let mut settings = ModelSettings::default();
        settings.engine.instances = 2;
        cli.provider.apply_to(&mut settings);
        assert_eq!(settings.gpu_devices(), vec![0, 1]);
        assert_eq!(
            settings.instance_devices(),
            vec![Some(0), Some(1), Some(0), Some(1)]
        );
        assert!(parse(&["--gpus", "0,1", "--device-id", "1"]).is_err());
        let cpu = parse(&["--gpus", "0"]).unwrap();
        let mut settings = ModelSettings::default();
        cpu.provider.apply_to(&mut settings);
        assert!(settings.gpu_devices().is_empty());
    }
}
