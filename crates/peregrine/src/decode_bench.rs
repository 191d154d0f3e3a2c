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
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Args;
use peregrine_vision::{decode_image_with, DecodeLimits, DecodeOptions, ImageView, LetterboxCanvas};
use serde::Serialize;

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

pub fn run(args: DecodeBenchArgs) -> Result<ExitCode> {
    anyhow::ensure!(
        !args.threads.is_empty() && args.threads.iter().all(|&t| t > 0),
        "--threads counts must be at least 1"
    );
    anyhow::ensure!(args.seconds > 0.0, "--seconds must be positive");
    anyhow::ensure!(args.imgsz > 0, "--imgsz must be at least 1");
    crate::serve::keep_large_allocations_out_of_the_heap(args.malloc_mmap_threshold);
    let (paths, problems) = crate::inputs::expand(&args.images);
    anyhow::ensure!(problems.is_empty(), "{}", problems.join("; "));
    let images: Vec<Vec<u8>> = paths
        .iter()
        .map(|p| std::fs::read(p).with_context(|| format!("reading {}", p.display())))
        .collect::<Result<_>>()?;
    anyhow::ensure!(!images.is_empty(), "no images found");
    let fit = args.jpeg_dct_scaling.then_some((args.imgsz, args.imgsz));
    if args.gpu_batch > 0 {
        gpu::report_parity(&images, args.imgsz, args.device_id)?;
    }
    let mut figures = Vec::new();
    for &threads in &args.threads {
        let stop = AtomicBool::new(false);
        let done = AtomicU64::new(0);
        let (user0, sys0) = cpu_times()?;
        let start = Instant::now();
        std::thread::scope(|scope| -> Result<()> {
            let workers: Vec<_> = (0..threads)
                .map(|t| {
                    let (images, stop, done) = (&images, &stop, &done);
                    if args.gpu_batch > 0 {
                        let (batch, imgsz, device) = (args.gpu_batch, args.imgsz, args.device_id);
                        return scope
                            .spawn(move || gpu::run_decoder(images, batch, imgsz, device, t, stop, done));
                    }
                    let reuse = args.reuse_buffers;
                    let imgsz = args.imgsz;
                    scope.spawn(move || -> Result<()> {
                        let mut canvas = LetterboxCanvas::new();
                        let mut out = Vec::new();
                        let mut buffer = Vec::new();
                        let mut i = t;
                        while !stop.load(Ordering::Relaxed) {
                            let mut options = DecodeOptions {
                                buffer: if reuse {
                                    std::mem::take(&mut buffer)
                                } else {
                                    Vec::new()
                                },
                                fit_within: fit,
                            };
                            let img = decode_image_with(
                                &images[i % images.len()],
                                DecodeLimits::default(),
                                &mut options,
                            )?;
                            let size = (img.width() as usize, img.height() as usize);
                            canvas.fill_into_from(ImageView::from(&img.rgb), size, imgsz, imgsz, &mut out);
                            if reuse {
                                buffer = img.rgb.into_raw();
                            }
                            done.fetch_add(1, Ordering::Relaxed);
                            i += 1;
                        }
                        Ok(())
                    })
                })
                .collect();
            std::thread::sleep(Duration::from_secs_f64(args.seconds));
            stop.store(true, Ordering::Relaxed);
            for w in workers {
                w.join().expect("a decode thread panicked")?;
            }
            Ok(())
        })?;
        let elapsed = start.elapsed().as_secs_f64();
        let (user1, sys1) = cpu_times()?;
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

/// The GPU path: nvJPEG and the letterbox kernel through `peregrine_backend::cuda`.
mod gpu {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    use anyhow::{Context, Result};
    use peregrine_backend::cuda::jpeg::{GpuJpegDecoder, JpegSlot};
    use peregrine_backend::cuda::{self, CopyKind, DeviceBuffer};
    use peregrine_vision::{decode_image, resample_tables, ImageView, Letterbox, LetterboxCanvas};

    /// Each image's geometry and resampling tables, as the engine builds them.
    struct Prepared {
        width: usize,
        height: usize,
        letterbox: Letterbox,
        columns: Vec<[i32; 4]>,
        rows: Vec<[i32; 4]>,
    }

    fn prepare(decoder: &GpuJpegDecoder, images: &[Vec<u8>], imgsz: usize) -> Result<Vec<Prepared>> {
        images
            .iter()
            .map(|data| {
                let info = decoder.info(data)?;
                let letterbox = Letterbox::new(info.width, info.height, imgsz, imgsz);
                let (columns, rows) = resample_tables(info.width, info.height, &letterbox);
                Ok(Prepared {
                    width: info.width,
                    height: info.height,
                    letterbox,
                    columns,
                    rows,
                })
            })
            .collect()
    }

    fn slots<'a>(
        images: &'a [Vec<u8>],
        prepared: &'a [Prepared],
        first: usize,
        n: usize,
    ) -> Vec<JpegSlot<'a>> {
        (0..n)
            .map(|slot| {
                let i = (first + slot) % images.len();
                let p = &prepared[i];
                JpegSlot {
                    slot,
                    data: &images[i],
                    width: p.width,
                    height: p.height,
                    scaled: (p.letterbox.scaled_width, p.letterbox.scaled_height),
                    offset: (p.letterbox.left, p.letterbox.top),
                    pad_value: Letterbox::PAD_VALUE,
                    columns: &p.columns,
                    rows: &p.rows,
                }
            })
            .collect()
    }

    pub fn run_decoder(
        images: &[Vec<u8>],
        batch: usize,
        imgsz: usize,
        device: i32,
        thread: usize,
        stop: &AtomicBool,
        done: &AtomicU64,
    ) -> Result<()> {
        let mut decoder = GpuJpegDecoder::new(device)?;
        let canvas = DeviceBuffer::new(batch * imgsz * imgsz * 3)?;
        // Tables are built once here; the engine builds them per batch (microseconds).
        let prepared = prepare(&decoder, images, imgsz)?;
        let mut first = thread * batch;
        while !stop.load(Ordering::Relaxed) {
            let slots = slots(images, &prepared, first, batch);
            // SAFETY: `canvas` holds `batch` canvases on this device and only this call writes it.
            unsafe { decoder.letterbox_into(&slots, canvas.ptr().cast(), imgsz, imgsz) }?;
            done.fetch_add(batch as u64, Ordering::Relaxed);
            first += batch;
        }
        Ok(())
    }

    /// Letterboxes every image on the GPU and on the CPU and prints how far apart they are.
    pub fn report_parity(images: &[Vec<u8>], imgsz: usize, device: i32) -> Result<()> {
        let mut decoder = GpuJpegDecoder::new(device)?;
        println!(
            "GPU JPEG decoder: {}",
            if decoder.is_hardware() {
                "hardware"
            } else {
                "CUDA (no hardware decoder)"
            }
        );
        let n = images.len();
        let slot_bytes = imgsz * imgsz * 3;
        let canvas = DeviceBuffer::new(n * slot_bytes)?;
        let prepared = prepare(&decoder, images, imgsz)?;
        let slots = slots(images, &prepared, 0, n);
        // SAFETY: as in `run_decoder`.
        unsafe { decoder.letterbox_into(&slots, canvas.ptr().cast(), imgsz, imgsz) }?;
        let mut host = vec![0u8; n * slot_bytes];
        // SAFETY: both buffers hold `n` canvases; the stream is synchronised right after.
        unsafe {
            cuda::copy_async(
                host.as_mut_ptr().cast(),
                canvas.ptr(),
                host.len(),
                CopyKind::DeviceToHost,
                decoder.stream(),
            )
        }?;
        cuda::synchronize(decoder.stream())?;
        let mut scratch = LetterboxCanvas::new();
        for (i, bytes) in images.iter().enumerate() {
            let img = decode_image(bytes, Default::default()).context("decoding on the CPU")?;
            let mut cpu = Vec::new();
            scratch.fill_into(ImageView::from(&img.rgb), imgsz, imgsz, &mut cpu);
            let gpu = &host[i * slot_bytes..(i + 1) * slot_bytes];
            let diffs: Vec<u8> = cpu.iter().zip(gpu).map(|(a, b)| a.abs_diff(*b)).collect();
            let mean = diffs.iter().map(|&d| f64::from(d)).sum::<f64>() / diffs.len() as f64;
            let over8 = diffs.iter().filter(|&&d| d > 8).count() as f64 / diffs.len() as f64;
            println!(
                "image {i} ({}x{}): GPU vs CPU letterbox mean |diff| {mean:.2}, max {}, over 8 levels {:.3}%",
                img.width(),
                img.height(),
                diffs.iter().max().unwrap_or(&0),
                over8 * 100.0
            );
        }
        Ok(())
    }
}
