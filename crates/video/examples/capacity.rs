//! Capacity benchmark: how many 720p25 camera streams this machine decodes and detects on.
//!
//! Runs N streams of a looped clip (bigbuckbunny.mp4, 1280x720 at 25 fps, paced like a
//! camera) through the whole pipeline (file source, decode thread, sampling, latest-frame
//! slot, detector, event fan-out) for each N asked for, and prints per second and in total:
//! frames decoded, detected and dropped per second, and glass-to-result latency P50/P99.
//!
//! ```text
//! cargo run --release --example capacity -- --streams 1,2,4 --fps 5 --detector fake
//! cargo run --release --example capacity -- --streams 1,2 --fps 0 --detector cpu --model-threads 2
//! cargo run --release --example capacity -- --streams 50,100 --fps 0 --decoder nvdec --clip street-1080p.mp4
//! ```
//!
//! `--decoder cpu|nvdec|auto` picks the streams' decoder (auto as on a GPU server); the
//! table gives the process's CPU use (from /proc) beside the frame rates. `--gpu-frames`
//! leaves NVDEC's pictures in GPU memory as a server with `--gpu-frames` does (nothing is
//! converted on the host: with `--detector fake`, the decoding's own cost).
//!
//! `--fps 0` detects every frame. `--detector fake` answers at once with nothing (decode
//! capacity); `--detector cpu` runs yolo11n on ONNX Runtime's CPU provider (set
//! ORT_DYLIB_PATH, or run scripts/setup.sh first).

#[path = "common/cpu_time.rs"]
mod cpu_time;
#[path = "../tests/support/engine_detector.rs"]
mod engine_detector;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use hdrhistogram::Histogram;
use peregrine_types::Detection;
use peregrine_video::{CounterSnapshot, DecoderDefaults, DecoderKind, DropReason};
use peregrine_video::{DetectError, Frame, FrameDetector, ManagerOptions, StreamConfig, StreamManager};

/// Costs nothing: measures everything but the model.
struct ZeroCostDetector;

impl FrameDetector for ZeroCostDetector {
    fn detect(
        &self,
        frame: std::sync::Arc<Frame>,
        _: std::time::Instant,
    ) -> BoxFuture<'static, Result<Vec<Detection>, DetectError>> {
        drop(frame);
        Box::pin(async { Ok(Vec::new()) })
    }
}

struct Args {
    streams: Vec<usize>,
    fps: f64,
    detector: String,
    seconds: u64,
    warmup: u64,
    clip: PathBuf,
    decode_threads: usize,
    model_threads: usize,
    max_batch: usize,
    staleness_ms: u64,
    decoder: DecoderKind,
    gpu_frames: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        streams: vec![1],
        fps: 5.0,
        detector: "fake".into(),
        seconds: 20,
        warmup: 3,
        clip: PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/videos/bigbuckbunny.mp4"),
        decode_threads: 1,
        model_threads: 0,
        max_batch: 4,
        staleness_ms: 1000,
        decoder: DecoderKind::Cpu,
        gpu_frames: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        let num = |v: String| v.parse::<u64>().map_err(|e| format!("{flag}: {e}"));
        match flag.as_str() {
            "--streams" => {
                a.streams = value()?
                    .split(',')
                    .map(|s| s.trim().parse().map_err(|e| format!("--streams: {e}")))
                    .collect::<Result<_, _>>()?
            }
            "--fps" => a.fps = value()?.parse().map_err(|e| format!("--fps: {e}"))?,
            "--detector" => a.detector = value()?,
            "--seconds" => a.seconds = num(value()?)?,
            "--warmup" => a.warmup = num(value()?)?,
            "--clip" => a.clip = value()?.into(),
            "--decode-threads" => a.decode_threads = num(value()?)? as usize,
            "--model-threads" => a.model_threads = num(value()?)? as usize,
            "--max-batch" => a.max_batch = num(value()?)? as usize,
            "--staleness-ms" => a.staleness_ms = num(value()?)?,
            "--decoder" => a.decoder = value()?.parse()?,
            "--gpu-frames" => a.gpu_frames = true,
            other => return Err(format!("unknown flag {other} (see the example's doc comment)")),
        }
    }
    Ok(a)
}

fn sum(snapshots: &[CounterSnapshot]) -> CounterSnapshot {
    let mut total = CounterSnapshot {
        frames_dropped: DropReason::ALL.iter().map(|r| (*r, 0)).collect(),
        ..CounterSnapshot::default()
    };
    for s in snapshots {
        total.frames_received += s.frames_received;
        total.frames_decoded += s.frames_decoded;
        total.frames_detected += s.frames_detected;
        total.reconnects += s.reconnects;
        for (i, (_, n)) in s.frames_dropped.iter().enumerate() {
            total.frames_dropped[i].1 += n;
        }
    }
    total
}

async fn snapshot(manager: &peregrine_video::StreamManagerHandle, n: usize) -> CounterSnapshot {
    let mut all = Vec::with_capacity(n);
    for i in 0..n {
        if let Ok(r) = manager.status(&format!("cam{i}")).await {
            all.push(r.counters);
        }
    }
    sum(&all)
}

fn drops_text(d: &CounterSnapshot, base: &CounterSnapshot, secs: f64) -> String {
    DropReason::ALL
        .iter()
        .filter_map(|r| {
            let n = d.dropped(*r) - base.dropped(*r);
            (n > 0).then(|| format!("{}={:.1}", r.as_str(), n as f64 / secs))
        })
        .collect::<Vec<_>>()
        .join(" ")
}

async fn run(args: &Args, detector: Arc<dyn FrameDetector>, n: usize) -> String {
    let streams = (0..n)
        .map(|i| {
            let mut c = StreamConfig::new(format!("cam{i}"), args.clip.display().to_string());
            c.looped = true;
            c.fps = (args.fps > 0.0).then_some(args.fps);
            c.decode_threads = args.decode_threads;
            c.staleness_ms = args.staleness_ms;
            c
        })
        .collect();
    let mut options = ManagerOptions::new(detector);
    options.decoder = DecoderDefaults {
        kind: args.decoder,
        model_gpus: vec![0],
        gpu_frames: args.gpu_frames,
    };
    // The clip's folder is the one file root the streams need.
    let folder = args.clip.parent().filter(|p| !p.as_os_str().is_empty());
    options.stream_policy.file_roots = vec![folder.unwrap_or(std::path::Path::new(".")).to_path_buf()];
    let manager = StreamManager::start(options, streams)
        .await
        .expect("streams start");
    let mut events = manager.subscribe_all().await.expect("feed");
    let latency = Arc::new(std::sync::Mutex::new(
        Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("histogram"),
    ));
    let measuring = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (lat, meas) = (latency.clone(), measuring.clone());
    let collector = tokio::spawn(async move {
        while let Some(e) = events.recv().await {
            if meas.load(std::sync::atomic::Ordering::Relaxed) {
                let us = u64::try_from(e.latency.as_micros()).unwrap_or(u64::MAX).max(1);
                let _ = lat.lock().map(|mut h| h.saturating_record(us));
            }
        }
    });
    tokio::time::sleep(Duration::from_secs(args.warmup)).await;
    measuring.store(true, std::sync::atomic::Ordering::Relaxed);
    if let Ok(r) = manager.status("cam0").await {
        println!("  cam0's decoder: {:?}", r.decoder);
    }
    let start = snapshot(&manager, n).await;
    let cpu_start = cpu_time::cpu_seconds();
    let started = Instant::now();
    let mut last = start.clone();
    for _ in 0..args.seconds {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = snapshot(&manager, n).await;
        println!(
            "  n={n:<2} decoded/s {:>6.1}  detected/s {:>6.1}  dropped/s {}",
            (now.frames_decoded - last.frames_decoded) as f64,
            (now.frames_detected - last.frames_detected) as f64,
            drops_text(&now, &last, 1.0)
        );
        last = now;
    }
    let secs = started.elapsed().as_secs_f64();
    let cores = (cpu_time::cpu_seconds() - cpu_start) / secs;
    let end = snapshot(&manager, n).await;
    manager.shutdown().await.expect("shutdown");
    collector.abort();
    let h = latency.lock().map(|h| h.clone()).expect("histogram");
    let target = n as f64 * if args.fps > 0.0 { args.fps.min(25.0) } else { 25.0 };
    let decoded = (end.frames_decoded - start.frames_decoded) as f64 / secs;
    let detected = (end.frames_detected - start.frames_detected) as f64 / secs;
    let keeps_up = decoded >= 0.97 * n as f64 * 25.0 && detected >= 0.95 * target;
    format!(
        "| {n} | {decoded:.1} | {detected:.1} / {target:.0} | {} | {:.1} | {:.1} | {cores:.2} ({:.3}) | {} |",
        match drops_text(&end, &start, secs) {
            s if s.is_empty() => "-".to_string(),
            s => s,
        },
        h.value_at_quantile(0.5) as f64 / 1000.0,
        h.value_at_quantile(0.99) as f64 / 1000.0,
        cores / n as f64,
        if keeps_up { "yes" } else { "no" }
    )
}

#[tokio::main]
async fn main() {
    // FFmpeg's lines come through `tracing` (an NVDEC refusal, a damaged picture): show
    // its warnings and errors on stderr, as the scripts keep stderr as the run's log.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(tracing_subscriber::filter::LevelFilter::WARN)
        .init();
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("capacity: {e}");
            std::process::exit(2);
        }
    };
    let detector: Arc<dyn FrameDetector> = match args.detector.as_str() {
        "fake" => Arc::new(ZeroCostDetector),
        "cpu" => {
            let (model, runtime) = match engine_detector::repo_model() {
                Ok(found) => found,
                Err(e) => {
                    eprintln!("capacity: {e}");
                    std::process::exit(2);
                }
            };
            match engine_detector::EngineDetector::start(
                &model,
                Some(&runtime),
                args.model_threads,
                args.max_batch,
            ) {
                Ok(d) => d,
                Err(e) => {
                    eprintln!("capacity: cannot load the model: {e}");
                    std::process::exit(2);
                }
            }
        }
        other => {
            eprintln!("capacity: --detector is fake or cpu, not {other}");
            std::process::exit(2);
        }
    };
    let mode = if args.fps > 0.0 {
        format!("{} fps per stream", args.fps)
    } else {
        "every frame".into()
    };
    println!(
        "clip {} looped at its own rate; detector {}; {mode}; {} s measured after {} s warm-up",
        args.clip.display(),
        args.detector,
        args.seconds,
        args.warmup
    );
    let mut rows = Vec::new();
    for &n in &args.streams {
        rows.push(run(&args, detector.clone(), n).await);
    }
    println!("\n| streams | decoded/s | detected/s (target) | dropped/s by reason | glass-to-result P50 ms | P99 ms | CPU cores (per stream) | keeps up |");
    println!("|---|---|---|---|---|---|---|---|");
    for r in rows {
        println!("{r}");
    }
}
