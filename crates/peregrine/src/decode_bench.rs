//! `peregrine bench-decode`: the server's image preparation alone (decode and letterbox),
//! on several threads at once, as its blocking pool runs it.
//!
//! End to end on a GPU the server is bound by this work on its CPU cores, so this is its
//! yardstick, as `bench-model` is the model's. Reports images per second and the CPU time
//! split into user and kernel (system) time: page faults from per-image allocations show
//! up as system time.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Args;
use peregrine_vision::{decode_image_with, DecodeLimits, DecodeOptions, ImageView, LetterboxCanvas};
use serde::Serialize;

use crate::provider_args::GpuJpegColour;

#[derive(Debug, Args)]
pub struct DecodeBenchArgs {
    /// Image files, directories or glob patterns, cycled through by every thread.
    #[arg(required = true)]
    pub images: Vec<String>,
    /// Thread counts to measure, comma separated.
    #[arg(
        long,
        env = "PEREGRINE_BENCH_THREADS",
        value_delimiter = ',',
        default_value = "1"
    )]
    pub threads: Vec<usize>,
    /// Seconds to run each thread count.
    #[arg(long, env = "PEREGRINE_BENCH_SECONDS", default_value_t = 5.0)]
    pub seconds: f64,
    /// Letterbox size (square), as the model's input.
    #[arg(long, env = "PEREGRINE_BENCH_IMGSZ", default_value_t = 640)]
    pub imgsz: usize,
    /// Decode every image into the thread's reused buffer, as the server does; false
    /// allocates a fresh one per image (the server before 2026-12-01).
    #[arg(long, env = "PEREGRINE_BENCH_REUSE_BUFFERS", default_value_t = true, action = clap::ArgAction::Set)]
    pub reuse_buffers: bool,
    /// Let large JPEGs decode at reduced scale, as `serve --jpeg-dct-scaling`.
    #[arg(long, env = "PEREGRINE_JPEG_DCT_SCALING", default_value_t = false, action = clap::ArgAction::Set)]
    pub jpeg_dct_scaling: bool,
    /// glibc's mmap threshold, as `serve --malloc-mmap-threshold` sets it (0: glibc's
    /// adaptive default).
    #[arg(long, env = "PEREGRINE_MALLOC_MMAP_THRESHOLD", default_value_t = 1 << 20)]
    pub malloc_mmap_threshold: usize,
    /// Decode on the GPU instead (nvJPEG and the letterbox kernel, as `serve --gpu-jpeg-decode`), this many
    /// images per call; each of `--threads` runs its own decoder. 0: on the CPU.
    #[arg(long, env = "PEREGRINE_BENCH_GPU_BATCH", default_value_t = 0)]
    pub gpu_batch: usize,
    /// With `--gpu-batch`: who converts nvJPEG's output to RGB, as `serve --gpu-jpeg-colour`
    /// (exact: libjpeg-turbo's arithmetic in our kernel; nvjpeg: nvJPEG's own RGB).
    #[arg(long, env = "PEREGRINE_GPU_JPEG_COLOUR", value_enum, default_value_t = GpuJpegColour::Exact)]
    pub gpu_jpeg_colour: GpuJpegColour,
    /// With `--gpu-batch`: print the GPU's canvases' differences from the CPU's over the
    /// images (stage by stage, both colour conversions) and skip the timing.
    #[arg(long, env = "PEREGRINE_BENCH_PARITY_ONLY", default_value_t = false, action = clap::ArgAction::Set)]
    pub parity_only: bool,
    /// GPU to decode on.
    #[arg(long, env = "PEREGRINE_DEVICE_ID", default_value_t = 0)]
    pub device_id: i32,
    /// Write the results as JSON to this file.
    #[arg(long, env = "PEREGRINE_BENCH_OUTPUT")]
    pub output: Option<PathBuf>,
}

#[derive(Debug, Serialize)]
pub struct DecodeFigures {
    pub threads: usize,
    pub images: u64,
    pub images_per_s: f64,
    /// CPU milliseconds per image, user and system.
    pub user_ms_per_image: f64,
    pub system_ms_per_image: f64,
    pub reuse_buffers: bool,
    pub jpeg_dct_scaling: bool,
    /// Images per GPU decode call; 0 for the CPU.
    pub gpu_batch: usize,
}

/// This process's user and system CPU time so far.
fn cpu_times() -> Result<(Duration, Duration)> {
    let stat = std::fs::read_to_string("/proc/self/stat").context("reading /proc/self/stat")?;
    // Fields after the command name, which is in parentheses and may hold spaces.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line: 11 and 12 after the name.
    let ticks = |i: usize| -> Result<u64> {
        fields
            .get(i)
            .and_then(|v| v.parse().ok())
            .context("unexpected /proc/self/stat format")
    };
    // SAFETY: sysconf only reads a system constant.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let t = |n: u64| Duration::from_secs_f64(n as f64 / hz);
    Ok((t(ticks(11)?), t(ticks(12)?)))
}

/// Every image the arguments name, read into memory.
fn read_images(args: &[String]) -> Result<Vec<(PathBuf, Vec<u8>)>> {
    let (paths, problems) = crate::inputs::expand(args);
    anyhow::ensure!(problems.is_empty(), "{}", problems.join("; "));
    let files: Vec<(PathBuf, Vec<u8>)> = paths
        .into_iter()
        .map(|p| {
            let bytes = std::fs::read(&p).with_context(|| format!("reading {}", p.display()))?;
            Ok((p, bytes))
        })
        .collect::<Result<_>>()?;
    anyhow::ensure!(!files.is_empty(), "no images found");
    Ok(files)
}

/// What every decode thread shares: the start line, the stop flag and the image count.
pub(crate) struct Race<'a> {
    /// Passed by every thread once it is set up, and by the timer: setup (a GPU decoder's
    /// kernels and nvJPEG handle) is not timed.
    pub start: &'a Barrier,
    pub stop: &'a AtomicBool,
    pub done: &'a AtomicU64,
}

/// One CPU decoder thread: decode and letterbox images in turn, from image `first` on,
/// as the server's decode pool does, until `stop`.
fn cpu_decoder(
    images: &[Vec<u8>],
    reuse: bool,
    fit: Option<(usize, usize)>,
    imgsz: usize,
    first: usize,
    race: Race<'_>,
) -> Result<()> {
    let Race { start, stop, done } = race;
    start.wait();
    let mut canvas = LetterboxCanvas::new();
    let mut out = Vec::new();
    let mut buffer = Vec::new();
    let mut i = first;
    while !stop.load(Ordering::Relaxed) {
        let mut options = DecodeOptions {
            buffer: if reuse {
                std::mem::take(&mut buffer)
            } else {
                Vec::new()
            },
            fit_within: fit,
        };
        let img = decode_image_with(&images[i % images.len()], DecodeLimits::default(), &mut options)?;
        let size = (img.width() as usize, img.height() as usize);
        canvas.fill_into_from(ImageView::from(&img.rgb), size, imgsz, imgsz, &mut out);
        if reuse {
            buffer = img.rgb.into_raw();
        }
        done.fetch_add(1, Ordering::Relaxed);
        i += 1;
    }
    Ok(())
}

pub fn run(args: DecodeBenchArgs) -> Result<ExitCode> {
    anyhow::ensure!(
        !args.threads.is_empty() && args.threads.iter().all(|&t| t > 0),
        "--threads counts must be at least 1"
    );
    anyhow::ensure!(args.seconds > 0.0, "--seconds must be positive");
    anyhow::ensure!(args.imgsz > 0, "--imgsz must be at least 1");
    crate::serve::keep_large_allocations_out_of_the_heap(args.malloc_mmap_threshold);
    let files = read_images(&args.images)?;
    anyhow::ensure!(
        !args.parity_only || args.gpu_batch > 0,
        "--parity-only compares the GPU's canvases with the CPU's: give --gpu-batch too"
    );
    if args.gpu_batch > 0 {
        parity::report(&files, args.imgsz, args.device_id, args.gpu_batch)?;
        if args.parity_only {
            return Ok(ExitCode::SUCCESS);
        }
    }
    let images: Vec<Vec<u8>> = files.into_iter().map(|(_, bytes)| bytes).collect();
    let fit = args.jpeg_dct_scaling.then_some((args.imgsz, args.imgsz));
    let mut figures = Vec::new();
    for &threads in &args.threads {
        let stop = AtomicBool::new(false);
        let done = AtomicU64::new(0);
        let barrier = Barrier::new(threads + 1);
        let mut cpu0 = (Duration::ZERO, Duration::ZERO);
        let mut start = Instant::now();
        std::thread::scope(|scope| -> Result<()> {
            let workers: Vec<_> = (0..threads)
                .map(|t| {
                    let images = &images;
                    let race = Race {
                        start: &barrier,
                        stop: &stop,
                        done: &done,
                    };
                    if args.gpu_batch > 0 {
                        let gpu = gpu::GpuRun {
                            batch: args.gpu_batch,
                            imgsz: args.imgsz,
                            device: args.device_id,
                            conversion: args.gpu_jpeg_colour.into(),
                        };
                        return scope.spawn(move || gpu.run_decoder(images, t, race));
                    }
                    let (reuse, imgsz) = (args.reuse_buffers, args.imgsz);
                    scope.spawn(move || cpu_decoder(images, reuse, fit, imgsz, t, race))
                })
                .collect();
            // Every thread reaches the line, its setup failed or not (the error comes back
            // from its join).
            barrier.wait();
            cpu0 = cpu_times()?;
            start = Instant::now();
            std::thread::sleep(Duration::from_secs_f64(args.seconds));
            stop.store(true, Ordering::Relaxed);
            for w in workers {
                w.join().expect("a decode thread panicked")?;
            }
            Ok(())
        })?;
        let elapsed = start.elapsed().as_secs_f64();
        let (user1, sys1) = cpu_times()?;
        let (user0, sys0) = cpu0;
        let n = done.load(Ordering::Relaxed).max(1);
        let per = |d: Duration| d.as_secs_f64() * 1e3 / n as f64;
        let f = DecodeFigures {
            threads,
            images: n,
            images_per_s: n as f64 / elapsed,
            user_ms_per_image: per(user1.saturating_sub(user0)),
            system_ms_per_image: per(sys1.saturating_sub(sys0)),
            reuse_buffers: args.reuse_buffers,
            jpeg_dct_scaling: args.jpeg_dct_scaling,
            gpu_batch: args.gpu_batch,
        };
        println!(
            "threads {:>3}: {:>9.1} img/s  cpu per image: user {:.3} ms, system {:.3} ms",
            f.threads, f.images_per_s, f.user_ms_per_image, f.system_ms_per_image
        );
        figures.push(f);
    }
    if let Some(path) = &args.output {
        std::fs::write(path, serde_json::to_string_pretty(&figures)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The GPU path: nvJPEG and the image kernels through `peregrine_backend::cuda`.
mod gpu;
/// The GPU's canvases against the CPU's, stage by stage.
mod parity;
