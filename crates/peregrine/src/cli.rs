//! Command-line interface. Every flag has an environment variable; defaults live here.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

#[derive(Debug, Parser)]
#[command(
    name = "peregrine",
    version,
    about = "Real-time object detection server and tools"
)]
pub struct Cli {
    #[command(flatten)]
    pub log: LogArgs,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Args)]
pub struct LogArgs {
    /// Log filter, in tracing's EnvFilter syntax (e.g. `info`, `peregrine=debug`)
    /// [default: info for serve, warn otherwise].
    #[arg(long, env = "PEREGRINE_LOG", global = true)]
    pub log_level: Option<String>,
    /// Log line format on stderr [default: json for serve, text otherwise].
    #[arg(long, env = "PEREGRINE_LOG_FORMAT", value_enum, global = true)]
    pub log_format: Option<LogFormat>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Detect objects in image files and print the results.
    Detect(DetectArgs),
    /// Run the detection server (HTTP).
    Serve(Box<crate::serve_config::ServeArgs>),
    /// Load-test a running server with real images.
    Bench(crate::loadgen::BenchArgs),
    /// Measure the model alone (no server): images per second by batch size.
    BenchModel(crate::model_bench::ModelBenchArgs),
    /// Measure image preparation alone (decode and letterbox) on several threads.
    BenchDecode(crate::decode_bench::DecodeBenchArgs),
    /// Manage API keys (`keys new`).
    Keys(crate::auth_config::KeysArgs),
    /// Quantize a model to INT8 (QDQ) by calibrating on images.
    Quantize(Box<crate::quantize::QuantizeArgs>),
}

/// Options shared by everything that loads a model.
#[derive(Debug, Args, Clone)]
pub struct ModelArgs {
    /// ONNX model file; the embedded YOLO11n is used when absent.
    #[arg(long, env = "PEREGRINE_MODEL")]
    pub model: Option<PathBuf>,
    /// Model input size as HEIGHT[,WIDTH] for models with dynamic input size (default: the
    /// model's metadata, else 640).
    #[arg(long, env = "PEREGRINE_IMGSZ", value_parser = parse_imgsz)]
    pub imgsz: Option<(usize, usize)>,
    /// Threads ONNX Runtime uses within one operator (0: one per core).
    #[arg(long, env = "PEREGRINE_THREADS", default_value_t = 0)]
    pub threads: usize,
    /// Path of libonnxruntime.so; by default the copy fetched by `make setup` is used.
    #[arg(long, env = "ORT_DYLIB_PATH")]
    pub ort_lib: Option<PathBuf>,
    /// Write ONNX Runtime's per-node profile (Chrome trace JSON) to files starting with
    /// this path, one per session, when the sessions close.
    #[arg(long, env = "PEREGRINE_ORT_PROFILE")]
    pub ort_profile: Option<PathBuf>,
    #[command(flatten)]
    pub provider: crate::provider_args::ProviderArgs,
}

/// Detection thresholds.
#[derive(Debug, Args, Clone)]
pub struct ThresholdArgs {
    /// Minimum score of a detection, 0 to 1.
    #[arg(long, env = "PEREGRINE_CONF", default_value_t = 0.25)]
    pub conf: f32,
    /// IoU above which overlapping boxes of one class are merged, 0 to 1.
    #[arg(long, env = "PEREGRINE_IOU", default_value_t = 0.7)]
    pub iou: f32,
    /// Most detections per image.
    #[arg(long, env = "PEREGRINE_MAX_DET", default_value_t = 300)]
    pub max_det: usize,
    /// Keep only these classes: ids or names, comma separated (e.g. `person,car` or `0,2`).
    #[arg(long, env = "PEREGRINE_CLASSES", value_delimiter = ',')]
    pub classes: Vec<String>,
}

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum OutputFormat {
    /// One JSON object per image, one per line.
    Json,
    /// A table for people.
    Table,
}

#[derive(Debug, Args)]
pub struct DetectArgs {
    /// Image files, directories (searched recursively for images) or glob patterns.
    #[arg(required = true)]
    pub inputs: Vec<String>,
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub thresholds: ThresholdArgs,
    /// Output format on stdout.
    #[arg(long, env = "PEREGRINE_FORMAT", value_enum, default_value = "json")]
    pub format: OutputFormat,
    /// Write annotated copies of the images (boxes, labels, scores) into this directory.
    #[arg(long, env = "PEREGRINE_SAVE")]
    pub save: Option<PathBuf>,
    /// Images per model run.
    #[arg(long, env = "PEREGRINE_BATCH", default_value_t = 1)]
    pub batch: usize,
    /// Largest accepted image, in pixels (width x height), checked before decoding.
    #[arg(long, env = "PEREGRINE_MAX_PIXELS", default_value_t = 50_000_000)]
    pub max_pixels: u64,
}

pub fn parse_imgsz(s: &str) -> Result<(usize, usize), String> {
    let parts: Vec<&str> = s.split([',', 'x']).map(str::trim).collect();
    let num = |p: &str| {
        p.parse::<usize>()
            .map_err(|_| format!("{p:?} is not a whole number"))
    };
    match parts.as_slice() {
        [n] => num(n).map(|n| (n, n)),
        [h, w] => Ok((num(h)?, num(w)?)),
        _ => Err("expected HEIGHT or HEIGHT,WIDTH".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn imgsz_forms() {
        assert_eq!(parse_imgsz("640"), Ok((640, 640)));
        assert_eq!(parse_imgsz("480,640"), Ok((480, 640)));
        assert_eq!(parse_imgsz("480x640"), Ok((480, 640)));
        assert!(parse_imgsz("big").is_err());
    }

    #[test]
    fn cli_is_well_formed() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
