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
use peregrine_engine::PreparedInput;
use peregrine_types::DetectParams;
use peregrine_vision::{decode_image, ImageView, Letterbox, LetterboxCanvas};
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
    /// Write the results as JSON to this file.
    #[arg(long, env = "PEREGRINE_BENCH_OUTPUT")]
    pub output: Option<PathBuf>,
}

#[derive(Debug, Serialize)]
pub struct BatchFigures {
    pub batch: usize,
    pub runs: usize,
    pub images_per_s: f64,
    pub batch_ms_p50: f64,
    pub batch_ms_p99: f64,
    pub normalize_ms_mean: f64,
    pub model_ms_mean: f64,
    pub postprocess_ms_mean: f64,
}

fn percentile(sorted: &[Duration], q: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted.get(i).map_or(0.0, |d| d.as_secs_f64() * 1e3)
}

pub fn run(args: ModelBenchArgs) -> Result<ExitCode> {
    anyhow::ensure!(
        !args.batch.is_empty() && args.batch.iter().all(|&b| b > 0),
        "--batch sizes must be at least 1"
    );
    anyhow::ensure!(args.seconds > 0.0, "--seconds must be positive");
    let max_batch = args.batch.iter().copied().max().unwrap_or(1);
    let mut detector = crate::model::load_detector(&args.model, max_batch)?;
    let spec = detector.spec().clone();
    let mut scratch = LetterboxCanvas::new();
    let (paths, problems) = crate::inputs::expand(&args.images);
    anyhow::ensure!(problems.is_empty(), "{}", problems.join("; "));
    let mut prepared: Vec<(Vec<u8>, Letterbox)> = Vec::new();
    for p in &paths {
        let bytes = std::fs::read(p).with_context(|| format!("reading {}", p.display()))?;
        let img = decode_image(&bytes, Default::default()).with_context(|| p.display().to_string())?;
        let mut canvas = Vec::new();
        let lb =
            peregrine_engine::Detector::prepare(&spec, ImageView::from(&img.rgb), &mut scratch, &mut canvas);
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
    let params = DetectParams::default();
    let mut figures = Vec::new();
    for &batch in &args.batch {
        anyhow::ensure!(
            batch <= detector.batch_size(),
            "batch {batch} is over the model's fixed batch size"
        );
        let inputs: Vec<PreparedInput<'_>> = (0..batch)
            .map(|i| {
                let (canvas, lb) = &prepared[i % prepared.len()];
                PreparedInput {
                    canvas,
                    letterbox: lb,
                    params: &params,
                }
            })
            .collect();
        for _ in 0..2 {
            detector.run_prepared(&inputs)?;
        }
        let mut times = Vec::new();
        let (mut norm, mut model, mut post) = (Duration::ZERO, Duration::ZERO, Duration::ZERO);
        let start = Instant::now();
        while start.elapsed().as_secs_f64() < args.seconds {
            let t0 = Instant::now();
            let (_, t) = detector.run_prepared(&inputs)?;
            times.push(t0.elapsed());
            norm += t.preprocess;
            model += t.inference;
            post += t.postprocess;
        }
        let elapsed = start.elapsed().as_secs_f64();
        times.sort();
        let runs = times.len();
        let mean = |d: Duration| d.as_secs_f64() * 1e3 / runs as f64;
        let f = BatchFigures {
            batch,
            runs,
            images_per_s: (runs * batch) as f64 / elapsed,
            batch_ms_p50: percentile(&times, 0.5),
            batch_ms_p99: percentile(&times, 0.99),
            normalize_ms_mean: mean(norm),
            model_ms_mean: mean(model),
            postprocess_ms_mean: mean(post),
        };
        println!(
            "batch {:>3}: {:>8.2} img/s  batch p50 {:>8.2} ms  p99 {:>8.2} ms  (normalize {:.2}, model {:.2}, postprocess {:.2} ms)",
            f.batch, f.images_per_s, f.batch_ms_p50, f.batch_ms_p99, f.normalize_ms_mean, f.model_ms_mean, f.postprocess_ms_mean
        );
        figures.push(f);
    }
    if let Some(path) = &args.output {
        std::fs::write(path, serde_json::to_string_pretty(&figures)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(ExitCode::SUCCESS)
}
