//! `peregrine bench-model`: the model alone, batch by batch, with no server around it.
//!
//! The yardstick for the server's throughput: the same model, batch size and threads,
//! fed already letterboxed images, so only normalisation, the model run and
//! postprocessing are timed.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Args;
use peregrine_engine::Slot;
use peregrine_types::DetectParams;
use peregrine_vision::{decode_image, DetectorSpec, ImageView, Letterbox, LetterboxCanvas};
use serde::Serialize;

use crate::cli::ModelArgs;

#[derive(Debug, Args)]
pub struct ModelBenchArgs {
    /// Images to feed (cycled to fill each batch); gray frames when none are given.
    pub images: Vec<String>,
    #[command(flatten)]
    pub model: ModelArgs,
    /// Batch sizes to measure, comma separated.
    #[arg(
        long,
        env = "PEREGRINE_BENCH_BATCH",
        value_delimiter = ',',
        default_value = "1"
    )]
    pub batch: Vec<usize>,
    /// Seconds to run each batch size.
    #[arg(long, env = "PEREGRINE_BENCH_SECONDS", default_value_t = 10.0)]
    pub seconds: f64,
    /// Model instances (sessions) run side by side, each on its own thread, as the server
    /// runs them; figures are for all of them together.
    #[arg(long, env = "PEREGRINE_BENCH_INSTANCES", default_value_t = 1)]
    pub instances: usize,
    /// Give every batch size its own sessions with the input shape fixed in the graph, as
    /// the server's `--session-per-batch-size` does; otherwise one session with the
    /// model's dynamic shape runs every size.
    #[arg(long, env = "PEREGRINE_BENCH_FIXED_SHAPES")]
    pub fixed_shapes: bool,
    /// Write the results as JSON to this file.
    #[arg(long, env = "PEREGRINE_BENCH_OUTPUT")]
    pub output: Option<PathBuf>,
}

#[derive(Debug, Serialize)]
pub struct BatchFigures {
    pub batch: usize,
    pub instances: usize,
    pub runs: usize,
    pub images_per_s: f64,
    pub batch_ms_p50: f64,
    pub batch_ms_p99: f64,
    pub normalize_ms_mean: f64,
    pub model_ms_mean: f64,
    pub postprocess_ms_mean: f64,
}

/// One instance's runs over the measured time.
struct Measured {
    times: Vec<Duration>,
    /// From the first measured run's start to the last one's end (warm-up excluded: a
    /// session's first runs may take seconds, which would otherwise count as throughput).
    window: Duration,
    norm: Duration,
    model: Duration,
    post: Duration,
}

/// Runs `inputs` on `detector` (its warm-up runs unmeasured first: two, or through a CUDA
/// graph's capture) for `seconds`.
fn measure(detector: &mut peregrine_engine::Detector, inputs: &[Slot], seconds: f64) -> Result<Measured> {
    for _ in 0..detector.warm_up_runs() {
        detector.run_prepared(inputs)?;
    }
    let mut m = Measured {
        times: Vec::new(),
        window: Duration::ZERO,
        norm: Duration::ZERO,
        model: Duration::ZERO,
        post: Duration::ZERO,
    };
    let start = Instant::now();
    while start.elapsed().as_secs_f64() < seconds {
        let t0 = Instant::now();
        let (_, t) = detector.run_prepared(inputs)?;
        m.times.push(t0.elapsed());
        m.norm += t.preprocess;
        m.model += t.inference;
        m.post += t.postprocess;
    }
    m.window = start.elapsed();
    Ok(m)
}

fn percentile(sorted: &[Duration], q: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted.get(i).map_or(0.0, |d| d.as_secs_f64() * 1e3)
}

/// Every named image letterboxed for the model (a gray canvas when none is named).
fn prepare_canvases(images: &[String], spec: &DetectorSpec) -> Result<Vec<(Vec<u8>, Letterbox)>> {
    let mut scratch = LetterboxCanvas::new();
    let (paths, problems) = crate::inputs::expand(images);
    anyhow::ensure!(problems.is_empty(), "{}", problems.join("; "));
    let mut prepared: Vec<(Vec<u8>, Letterbox)> = Vec::new();
    for p in &paths {
        let bytes = std::fs::read(p).with_context(|| format!("reading {}", p.display()))?;
        let img = decode_image(&bytes, Default::default()).with_context(|| p.display().to_string())?;
        let mut canvas = Vec::new();
        let lb =
            peregrine_engine::Detector::prepare(spec, ImageView::from(&img.rgb), &mut scratch, &mut canvas);
        prepared.push((canvas, lb));
    }
    if prepared.is_empty() {
        let lb = Letterbox::new(
            spec.input_width,
            spec.input_height,
            spec.input_width,
            spec.input_height,
        );
        prepared.push((vec![Letterbox::PAD_VALUE; spec.image_len()], lb));
    }
    Ok(prepared)
}

/// Each instance's rate over its own measured window, summed.
fn images_per_s(runs: &[Measured], batch: usize) -> f64 {
    runs.iter()
        .map(|m| (m.times.len() * batch) as f64 / m.window.as_secs_f64().max(1e-9))
        .sum()
}

/// Runs `inputs` on every detector at once, each on its own thread (as the server runs its
/// instances), for `seconds` after its warm-up.
fn measure_instances(
    detectors: &mut [peregrine_engine::Detector],
    inputs: &[Slot],
    seconds: f64,
) -> Result<Vec<Measured>> {
    std::thread::scope(|scope| {
        let handles: Vec<_> = detectors
            .iter_mut()
            .map(|d| scope.spawn(move || measure(d, inputs, seconds)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a benchmark thread panicked"))
            .collect::<Result<Vec<_>>>()
    })
}

/// Images per second of all `detectors` together on gray canvases at `batch`, measured as
/// `bench-model --instances` measures them (for `peregrine quantize`'s summary).
pub(crate) fn gray_images_per_s(
    detectors: &mut [peregrine_engine::Detector],
    batch: usize,
    seconds: f64,
) -> Result<f64> {
    let spec = detectors.first().context("no detector to time")?.spec().clone();
    let (canvas, letterbox) = prepare_canvases(&[], &spec)?.swap_remove(0);
    let inputs: Vec<Slot> = (0..batch)
        .map(|_| Slot::Canvas {
            canvas: canvas.clone(),
            letterbox,
            params: DetectParams::default(),
        })
        .collect();
    Ok(images_per_s(
        &measure_instances(detectors, &inputs, seconds)?,
        batch,
    ))
}

/// One batch size's figures over every instance's measured runs.
fn figures_of(runs: &[Measured], batch: usize, instances: usize) -> BatchFigures {
    let mut times: Vec<Duration> = runs.iter().flat_map(|m| m.times.iter().copied()).collect();
    times.sort();
    let total = times.len();
    let sum = |f: fn(&Measured) -> Duration| runs.iter().map(f).sum::<Duration>();
    let mean = |d: Duration| d.as_secs_f64() * 1e3 / total as f64;
    BatchFigures {
        batch,
        instances,
        runs: total,
        images_per_s: images_per_s(runs, batch),
        batch_ms_p50: percentile(&times, 0.5),
        batch_ms_p99: percentile(&times, 0.99),
        normalize_ms_mean: mean(sum(|m| m.norm)),
        model_ms_mean: mean(sum(|m| m.model)),
        postprocess_ms_mean: mean(sum(|m| m.post)),
    }
}

pub fn run(args: ModelBenchArgs) -> Result<ExitCode> {
    anyhow::ensure!(
        !args.batch.is_empty() && args.batch.iter().all(|&b| b > 0),
        "--batch sizes must be at least 1"
    );
    anyhow::ensure!(args.seconds > 0.0, "--seconds must be positive");
    anyhow::ensure!(args.instances > 0, "--instances must be at least 1");
    let max_batch = args.batch.iter().copied().max().unwrap_or(1);
    let load = |batch: usize, fixed: Option<usize>| {
        (0..args.instances)
            .map(|_| crate::model::load_detector(&args.model, batch, fixed))
            .collect::<Result<Vec<_>>>()
    };
    let mut detectors = if args.fixed_shapes {
        load(args.batch[0], Some(args.batch[0]))?
    } else {
        load(max_batch, None)?
    };
    let mut loaded_for = args.batch[0];
    let spec = detectors[0].spec().clone();
    let prepared = prepare_canvases(&args.images, &spec)?;
    let params = DetectParams::default();
    let mut figures = Vec::new();
    for &batch in &args.batch {
        if args.fixed_shapes && batch != loaded_for {
            // Freed first: only one batch size's sessions hold device memory at a time.
            detectors.clear();
            detectors = load(batch, Some(batch))?;
            loaded_for = batch;
        }
        anyhow::ensure!(
            batch <= detectors[0].batch_size(),
            "batch {batch} is over the model's fixed batch size"
        );
        let inputs: Vec<Slot> = (0..batch)
            .map(|i| {
                let (canvas, lb) = &prepared[i % prepared.len()];
                Slot::Canvas {
                    canvas: canvas.clone(),
                    letterbox: *lb,
                    params: params.clone(),
                }
            })
            .collect();
        let runs = measure_instances(&mut detectors, &inputs, args.seconds)?;
        let f = figures_of(&runs, batch, args.instances);
        println!(
            "batch {:>3} x{}: {:>8.2} img/s  batch p50 {:>8.2} ms  p99 {:>8.2} ms  (normalize {:.2}, model {:.2}, postprocess {:.2} ms)",
            f.batch, f.instances, f.images_per_s, f.batch_ms_p50, f.batch_ms_p99, f.normalize_ms_mean, f.model_ms_mean, f.postprocess_ms_mean
        );
        figures.push(f);
    }
    if let Some(path) = &args.output {
        std::fs::write(path, serde_json::to_string_pretty(&figures)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(ExitCode::SUCCESS)
}
