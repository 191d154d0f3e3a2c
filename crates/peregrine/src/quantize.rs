//! `peregrine quantize`: post-training INT8 quantization of a detection model.
//!
//! Calibration images go through the server's own letterbox (the canvases `serve` feeds),
//! the calibration graph returns every activation the quantized nodes read or write, and
//! each tensor's histogram gives its range by the chosen method. The QDQ model is written
//! by `peregrine_onnx::quantize`; the summary then measures it on the held-out images
//! (parity with the float model) and on the CPU (speed against the float model).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use peregrine_onnx::quantize::{
    calibration_graph, calibration_table, quantize_qdq, ActivationType, CalibrationMethod, QdqOptions,
    Selection,
};
use peregrine_registry::calibration::Calibrator;
use peregrine_vision::{decode_image, DetectorSpec, ImageView, LetterboxCanvas};
use sha2::Digest;

use crate::cli::ModelArgs;
use crate::model_bench::gray_images_per_s;
use crate::quantize_report::{self, Held};
use crate::quantize_search;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Method {
    /// Clip each tensor where the KL divergence to its 8-bit version is least (TensorRT's
    /// entropy calibration).
    Entropy,
    /// Clip `|x|` at `--percentile` of the values seen.
    Percentile,
    /// The extremes seen.
    MinMax,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Activations {
    /// Asymmetric uint8 (ONNX Runtime's fastest CPU kernels).
    Uint8,
    /// Symmetric int8 (what TensorRT expects).
    Int8,
}

#[derive(Debug, Args)]
pub struct QuantizeArgs {
    /// The float32 ONNX model to quantize.
    #[arg(long, env = "PEREGRINE_MODEL")]
    pub model: PathBuf,
    /// Calibration images: files, directories (searched recursively) or glob patterns,
    /// comma separated. Sorted by path; the last `--held-out` are kept for the summary.
    #[arg(long, env = "PEREGRINE_CALIBRATION", value_delimiter = ',', required = true)]
    pub calibration: Vec<String>,
    /// Where to write the quantized model.
    #[arg(long, env = "PEREGRINE_QUANTIZE_OUT")]
    pub out: PathBuf,
    /// Most images to calibrate on (the rest of the set, after the held-out ones, is unused).
    #[arg(long, env = "PEREGRINE_QUANTIZE_SAMPLES", default_value_t = 500)]
    pub samples: usize,
    /// Images held out of calibration to measure parity with the float model on.
    #[arg(long, env = "PEREGRINE_QUANTIZE_HELD_OUT", default_value_t = 0)]
    pub held_out: usize,
    /// How each tensor's range is chosen.
    #[arg(
        long,
        env = "PEREGRINE_QUANTIZE_METHOD",
        value_enum,
        default_value = "min-max"
    )]
    pub method: Method,
    /// The percentile of `|x|` that `--method percentile` clips at.
    #[arg(long, env = "PEREGRINE_QUANTIZE_PERCENTILE", default_value_t = 99.99)]
    pub percentile: f64,
    /// How activations are stored.
    #[arg(
        long,
        env = "PEREGRINE_QUANTIZE_ACTIVATIONS",
        value_enum,
        default_value = "uint8"
    )]
    pub activations: Activations,
    /// Nodes kept float, comma separated: a node whose name starts with an entry (e.g.
    /// `/model.23/` keeps the whole head float; `''` keeps none). The default keeps the
    /// attention block of Ultralytics' C2PSA (YOLO11's layer 10) float: measured, it
    /// costs no speed and gains parity (docs/benchmarks.md).
    #[arg(
        long,
        env = "PEREGRINE_QUANTIZE_EXCLUDE",
        value_delimiter = ',',
        default_value = peregrine_onnx::quantize::DEFAULT_EXCLUDE
    )]
    pub exclude: Vec<String>,
    /// Keep the output convolutions (those after which no convolution follows) float.
    #[arg(
        long,
        env = "PEREGRINE_QUANTIZE_KEEP_OUTPUT_CONVS_FLOAT",
        default_value_t = true,
        action = clap::ArgAction::Set
    )]
    pub keep_output_convs_float: bool,
    /// Quantize the operators between convolutions (SiLU, Add, Concat, Split, MaxPool,
    /// Resize) too, so data stays 8-bit from one convolution to the next.
    #[arg(
        long,
        env = "PEREGRINE_QUANTIZE_ACTIVATION_OPS",
        default_value_t = true,
        action = clap::ArgAction::Set
    )]
    pub quantize_activation_ops: bool,
    /// Also write the ranges as a TensorRT calibration cache (for
    /// `--trt-int8-calibration-table`).
    #[arg(long, env = "PEREGRINE_TRT_CALIBRATION_TABLE")]
    pub trt_calibration_table: Option<PathBuf>,
    /// TensorRT version written in the cache's first line (major*10000 + minor*100 +
    /// patch for TensorRT 10).
    #[arg(long, env = "PEREGRINE_TRT_VERSION", default_value = "100900")]
    pub trt_version: String,
    /// Search for up to this many layer groups (Ultralytics' modules, `/model.N/`) to keep
    /// float as well, one per round, each chosen for the parity it buys with the float
    /// model on the `--held-out` images (0: no search; needs `--held-out`). Each round
    /// quantizes and measures the model once per group, so it takes minutes.
    #[arg(long, env = "PEREGRINE_QUANTIZE_SEARCH_FLOAT", default_value_t = 0)]
    pub search_float: usize,
    /// The search stops once recall and precision on the held-out images both reach this.
    #[arg(long, env = "PEREGRINE_QUANTIZE_SEARCH_TARGET", default_value_t = 0.97)]
    pub search_target: f64,
    /// Seconds to time each model at batch 1 and 4 on the CPU for the summary (0: skip):
    /// one instance with `--threads`, then, on a machine of several cores, one single-thread
    /// instance per core (at most 16) side by side (the shape INT8 serves fastest in).
    #[arg(long, env = "PEREGRINE_QUANTIZE_BENCH_SECONDS", default_value_t = 5.0)]
    pub bench_seconds: f64,
    /// Threads ONNX Runtime uses within one operator (0: one per core).
    #[arg(long, env = "PEREGRINE_THREADS", default_value_t = 0)]
    pub threads: usize,
    /// Path of libonnxruntime.so; by default the copy fetched by `make setup` is used.
    #[arg(long, env = "ORT_DYLIB_PATH")]
    pub ort_lib: Option<PathBuf>,
}

impl QuantizeArgs {
    fn method(&self) -> CalibrationMethod {
        match self.method {
            Method::Entropy => CalibrationMethod::Entropy,
            Method::Percentile => CalibrationMethod::Percentile(self.percentile),
            Method::MinMax => CalibrationMethod::MinMax,
        }
    }

    fn selection(&self) -> Selection {
        Selection {
            exclude: self.exclude.clone(),
            keep_output_convs_float: self.keep_output_convs_float,
            quantize_activation_ops: self.quantize_activation_ops,
        }
    }

    /// Model arguments for loading `path` on the CPU as `detect` would.
    fn model_args(&self, path: &Path) -> Result<ModelArgs> {
        use clap::Parser;
        #[derive(Parser)]
        struct Wrap {
            #[command(flatten)]
            model: ModelArgs,
        }
        let mut model = Wrap::try_parse_from(["quantize"])?.model;
        model.model = Some(path.to_path_buf());
        model.threads = self.threads;
        model.ort_lib = self.ort_lib.clone();
        Ok(model)
    }
}

pub fn run(args: QuantizeArgs) -> Result<ExitCode> {
    anyhow::ensure!(args.samples > 0, "--samples must be at least 1");
    anyhow::ensure!(
        args.search_float == 0 || args.held_out > 0,
        "--search-float measures parity on held-out images: give --held-out too"
    );
    anyhow::ensure!(
        (0.0..=1.0).contains(&args.search_target),
        "--search-target is a share of detections, between 0 and 1 (got {})",
        args.search_target
    );
    let started = Instant::now();
    let bytes =
        std::fs::read(&args.model).with_context(|| format!("cannot read {}", args.model.display()))?;
    let (paths, problems) = crate::inputs::expand(&args.calibration);
    anyhow::ensure!(problems.is_empty(), "{}", problems.join("; "));
    let mut paths = paths;
    paths.sort();
    anyhow::ensure!(
        paths.len() > args.held_out,
        "--calibration names {} images, not enough to hold {} out and calibrate on the rest",
        paths.len(),
        args.held_out
    );
    let held_paths = paths.split_off(paths.len() - args.held_out);
    paths.truncate(args.samples);

    let (plan, calibration_model) = calibration_graph(&bytes, &args.selection())
        .with_context(|| format!("cannot quantize {}", args.model.display()))?;
    let float = crate::model::load_detector(&args.model_args(&args.model)?, 4, None)
        .context("loading the float model")?;
    let spec = float.spec().clone();
    let method = args.method();
    let mut calibrator = Calibrator::new(
        &calibration_model,
        &plan.tensors,
        method,
        args.threads,
        args.ort_lib.as_deref(),
        (spec.input_width, spec.input_height),
    )
    .context("building the calibration session")?;
    calibrate(&mut calibrator, &spec, &paths)?;
    let calibration_s = started.elapsed().as_secs_f64();
    let ranges = calibrator.ranges();
    let mut options = QdqOptions {
        selection: args.selection(),
        activations: match args.activations {
            Activations::Uint8 => ActivationType::Uint8,
            Activations::Int8 => ActivationType::Int8,
        },
        metadata: vec![
            ("method".into(), method.name()),
            ("samples".into(), paths.len().to_string()),
            ("date".into(), jiff::Timestamp::now().to_string()),
            ("source_sha256".into(), hex::encode(sha2::Sha256::digest(&bytes))),
        ],
    };
    let mut float = float;
    let held = Held::load(&held_paths)?;
    if args.search_float > 0 {
        let kept = search_float(&args, &bytes, &ranges, &options, &held, &mut float)?;
        options.metadata.push(("kept_float".into(), kept.join(",")));
        options.selection.exclude.extend(kept);
    }
    let quantized = quantize_qdq(&bytes, &ranges, &options).context("writing the QDQ model")?;
    std::fs::write(&args.out, &quantized.model).with_context(|| format!("writing {}", args.out.display()))?;
    let ordered: Vec<(String, (f32, f32))> = plan.tensors.iter().map(|t| (t.clone(), ranges[t])).collect();
    if let Some(path) = &args.trt_calibration_table {
        std::fs::write(path, calibration_table(&args.trt_version, &ordered))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    println!(
        "quantized {} nodes of {} ({} activations calibrated on {} images by {} in {:.1} s) -> {}",
        quantized.nodes.len(),
        args.model.display(),
        ordered.len(),
        paths.len(),
        method.name(),
        calibration_s,
        args.out.display()
    );
    println!(
        "{:<64} {:>10} {:>10} {:>10} {:>4}",
        "tensor", "low", "high", "scale", "zp"
    );
    for (name, p) in &quantized.activations {
        let (low, high) = ranges.get(name).copied().unwrap_or_default();
        println!(
            "{name:<64} {low:>10.4} {high:>10.4} {:>10.6} {:>4}",
            p.scale, p.zero_point
        );
    }
    if let Some(path) = &args.trt_calibration_table {
        println!(
            "TensorRT calibration cache -> {} (written for TensorRT {}; TensorRT was not run)",
            path.display(),
            args.trt_version
        );
    }
    compare_with_float(&args, &mut float, &held)?;
    Ok(ExitCode::SUCCESS)
}

/// The summary's last lines: the written model's parity with the float model on the
/// held-out images, and both models' speed on the CPU.
fn compare_with_float(
    args: &QuantizeArgs,
    float: &mut peregrine_engine::Detector,
    held: &Held,
) -> Result<()> {
    let mut int8 = crate::model::load_detector(&args.model_args(&args.out)?, 4, None)
        .context("loading the quantized model")?;
    if args.held_out > 0 {
        let parity = quantize_report::parity(float, &mut int8, held)?;
        println!("{parity}");
    }
    if args.bench_seconds <= 0.0 {
        return Ok(());
    }
    let batches: Vec<usize> = [1, 4].into_iter().filter(|&b| b <= float.batch_size()).collect();
    for &batch in &batches {
        let f = gray_images_per_s(std::slice::from_mut(float), batch, args.bench_seconds)?;
        let q = gray_images_per_s(std::slice::from_mut(&mut int8), batch, args.bench_seconds)?;
        print_speed(&format!("batch {batch}"), f, q);
    }
    drop(int8);
    // The shape README's INT8 section recommends: INT8's many small integer operators gain
    // most when none of them waits for other threads (docs/benchmarks.md). Capped, since
    // each instance is a session with its own arena and warm-up: the ratio is the point.
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let instances = cores.min(MAX_TIMED_INSTANCES);
    if instances > 1 && args.threads != 1 {
        let float = instances_speed(args, &args.model, instances, &batches)?;
        let int8 = instances_speed(args, &args.out, instances, &batches)?;
        for ((batch, f), q) in batches.iter().zip(float).zip(int8) {
            print_speed(&format!("batch {batch}, {instances} instances x 1 thread"), f, q);
        }
    }
    Ok(())
}

/// Most single-thread instances the summary times side by side.
const MAX_TIMED_INSTANCES: usize = 16;

fn print_speed(shape: &str, float: f64, int8: f64) {
    println!(
        "speed {shape}: float {float:.2} img/s, int8 {int8:.2} img/s, {:.2}x",
        int8 / float.max(1e-9)
    );
}

/// `path`'s images per second at each of `batches` as `instances` one-thread sessions
/// running side by side, loaded for the measurement and dropped after it.
fn instances_speed(
    args: &QuantizeArgs,
    path: &Path,
    instances: usize,
    batches: &[usize],
) -> Result<Vec<f64>> {
    let mut model = args.model_args(path)?;
    model.threads = 1;
    let mut detectors = (0..instances)
        .map(|_| crate::model::load_detector(&model, 4, None))
        .collect::<Result<Vec<_>>>()
        .with_context(|| format!("loading {instances} instances of {}", path.display()))?;
    batches
        .iter()
        .map(|&batch| gray_images_per_s(&mut detectors, batch, args.bench_seconds))
        .collect()
}

/// `--search-float`: the layer groups to keep float as well, chosen on the held-out images.
fn search_float(
    args: &QuantizeArgs,
    bytes: &[u8],
    ranges: &HashMap<String, (f32, f32)>,
    options: &QdqOptions,
    held: &Held,
    float: &mut peregrine_engine::Detector,
) -> Result<Vec<String>> {
    let scratch = args.out.with_extension("search.onnx");
    let inputs = quantize_search::SearchInputs {
        model: bytes,
        ranges,
        options,
        held,
        scratch: &scratch,
        rounds: args.search_float,
        target: args.search_target,
    };
    let load = |path: &Path| {
        crate::model::load_detector(&args.model_args(path)?, 1, None).context("loading a search candidate")
    };
    let search = quantize_search::run(&inputs, float, &load)?;
    println!(
        "search: kept float as well: {} ({})",
        if search.kept().is_empty() {
            "nothing".to_string()
        } else {
            search.kept().join(", ")
        },
        search.parity()
    );
    Ok(search.kept())
}

/// Runs every calibration image, through the server's letterbox, into `calibrator`.
fn calibrate(calibrator: &mut Calibrator, spec: &DetectorSpec, paths: &[PathBuf]) -> Result<()> {
    let progress = ProgressBar::new(paths.len() as u64);
    progress.set_style(
        ProgressStyle::with_template("calibrating {bar:40} {pos}/{len} images, {per_sec}, eta {eta}")
            .expect("the template is valid"),
    );
    let mut scratch = LetterboxCanvas::new();
    let mut canvas = Vec::new();
    for path in paths {
        let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        let img = decode_image(&bytes, Default::default()).with_context(|| path.display().to_string())?;
        peregrine_engine::Detector::prepare(spec, ImageView::from(&img.rgb), &mut scratch, &mut canvas);
        calibrator.add(&canvas)?;
        progress.inc(1);
    }
    progress.finish_and_clear();
    Ok(())
}
