//! `peregrine bench`: a load generator for a running server.
//!
//! Closed loop (`--concurrency N`: N clients, each sending its next request when the last
//! is answered) or open loop (`--rate R`: R requests a second whatever the answers, with
//! latency measured from each request's scheduled start, so a stalled server cannot hide
//! its queueing). Real images, sent as raw bodies. Reports throughput, latency percentiles
//! and errors by kind; writes the same as JSON with `--output`. A `--profile` of open-loop
//! steps (`rate:seconds,...`) reports each step on its own, for step-load curves.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use bytes::Bytes;
use clap::Args;
use hdrhistogram::Histogram;
use serde::Serialize;

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Image files, directories or globs to send (round robin).
    #[arg(required = true)]
    pub images: Vec<String>,
    /// Server base URL.
    #[arg(long, env = "PEREGRINE_BENCH_URL", default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// Closed loop: clients sending back to back.
    #[arg(
        long,
        env = "PEREGRINE_BENCH_CONCURRENCY",
        default_value_t = 8,
        conflicts_with_all = ["rate", "profile"]
    )]
    pub concurrency: usize,
    /// Open loop: requests per second, whatever the server answers.
    #[arg(long, env = "PEREGRINE_BENCH_RATE", conflicts_with = "profile")]
    pub rate: Option<f64>,
    /// Open-loop steps, each `RATE:SECONDS`, comma-separated (e.g. `10:30,60:30,10:30`):
    /// one report per step; `--duration` and `--requests` do not apply.
    #[arg(long, env = "PEREGRINE_BENCH_PROFILE", value_parser = parse_profile)]
    pub profile: Option<Profile>,
    /// How long to send, in seconds.
    #[arg(long, env = "PEREGRINE_BENCH_DURATION", default_value_t = 30.0)]
    pub duration: f64,
    /// Stop after this many requests, if sooner.
    #[arg(long, env = "PEREGRINE_BENCH_REQUESTS")]
    pub requests: Option<u64>,
    /// Extra query string for /v1/detect, e.g. `conf=0.4&model=yolo11n`.
    #[arg(long, env = "PEREGRINE_BENCH_QUERY", default_value = "")]
    pub query: String,
    /// Deadline sent with each request (x-request-timeout-ms).
    #[arg(long, env = "PEREGRINE_BENCH_DEADLINE_MS")]
    pub deadline_ms: Option<u64>,
    /// Client-side timeout per request, in ms.
    #[arg(long, env = "PEREGRINE_BENCH_TIMEOUT_MS", default_value_t = 60_000)]
    pub timeout_ms: u64,
    /// Open loop only: most requests outstanding; beyond it the generator skips sends and
    /// counts them as `generator_overflow`.
    #[arg(long, env = "PEREGRINE_BENCH_MAX_OUTSTANDING", default_value_t = 4096)]
    pub max_outstanding: usize,
    /// Write the report as JSON to this file.
    #[arg(long, env = "PEREGRINE_BENCH_OUTPUT")]
    pub output: Option<PathBuf>,
}

/// Open-loop steps: (requests per second, seconds).
#[derive(Debug, Clone, PartialEq)]
pub struct Profile(pub Vec<(f64, f64)>);

fn parse_profile(text: &str) -> Result<Profile, String> {
    let step = |s: &str| -> Result<(f64, f64), String> {
        let (rate, secs) = s
            .split_once(':')
            .ok_or_else(|| format!("step {s:?} is not RATE:SECONDS"))?;
        let number = |v: &str, what: &str| match v.trim().parse::<f64>() {
            Ok(x) if x > 0.0 && x.is_finite() => Ok(x),
            _ => Err(format!("step {s:?}: {what} {v:?} is not a positive number")),
        };
        Ok((number(rate, "rate")?, number(secs, "seconds")?))
    };
    let steps = text.split(',').map(step).collect::<Result<Vec<_>, _>>()?;
    Ok(Profile(steps))
}

#[derive(Debug, Serialize)]
pub struct LatencyMs {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
    pub mean: f64,
}

impl LatencyMs {
    fn of(h: &Histogram<u64>) -> Self {
        let ms = |micros: u64| micros as f64 / 1e3;
        Self {
            p50: ms(h.value_at_quantile(0.50)),
            p90: ms(h.value_at_quantile(0.90)),
            p99: ms(h.value_at_quantile(0.99)),
            max: ms(h.max()),
            mean: h.mean() / 1e3,
        }
    }

    /// One report line: `LABEL ms: p50 ..  p90 ..  p99 ..  max ..  mean ..`.
    fn line(&self, label: &str) -> String {
        format!(
            "{label} ms: p50 {:.2}  p90 {:.2}  p99 {:.2}  max {:.2}  mean {:.2}",
            self.p50, self.p90, self.p99, self.max, self.mean
        )
    }
}

/// Medians and 99th percentiles of the server's own timing headers, in ms.
#[derive(Debug, Serialize)]
pub struct ServerTimesMs {
    pub decode_p50: f64,
    pub queue_p50: f64,
    pub queue_p99: f64,
    pub inference_p50: f64,
    pub total_p50: f64,
    pub total_p99: f64,
    /// Server total minus decode and model work (normalise + run + postprocess): HTTP
    /// handling, queueing and scheduling.
    pub overhead_p50: f64,
    pub overhead_p99: f64,
}

#[derive(Debug, Serialize)]
pub struct BenchReport {
    pub url: String,
    pub mode: &'static str,
    pub concurrency: Option<usize>,
    pub rate: Option<f64>,
    pub started_unix_s: u64,
    pub duration_s: f64,
    pub images: usize,
    pub requests: u64,
    pub successes: u64,
    pub throughput_rps: f64,
    /// Open loop: the rate requests actually went out at, from the first to the last
    /// (below `rate` if the generator fell behind its schedule or skipped sends).
    pub offered_rps: Option<f64>,
    /// Latency of successful requests.
    pub latency_ms: LatencyMs,
    /// Latency of refusals (429 and 503), which a server should answer at once; absent
    /// when there were none.
    pub refused_ms: Option<LatencyMs>,
    pub server_ms: ServerTimesMs,
    pub errors: BTreeMap<String, u64>,
}

/// What one successful response said about its time on the server, in microseconds.
#[derive(Debug, Default, Clone, Copy)]
struct ServerTimes {
    decode: u64,
    queue: u64,
    inference: u64,
    total: u64,
}

impl ServerTimes {
    fn from_headers(h: &reqwest::header::HeaderMap) -> Self {
        let micros = |name: &str| {
            h.get(name)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<f64>().ok())
                .map_or(0, |ms| (ms * 1e3).round() as u64)
        };
        Self {
            decode: micros("x-decode-time-ms"),
            queue: micros("x-queue-time-ms"),
            inference: micros("x-inference-time-ms"),
            total: micros("x-total-time-ms"),
        }
    }
}

/// Histograms of the server timings: decode, queue, inference, total, overhead.
struct ServerHistograms([Histogram<u64>; 5]);

struct Collector {
    latencies: Mutex<Histogram<u64>>,
    refusals: Mutex<Histogram<u64>>,
    server: Mutex<ServerHistograms>,
    errors: Mutex<BTreeMap<String, u64>>,
    sent: AtomicU64,
    ok: AtomicU64,
    failed: AtomicU64,
}

/// Whether an error kind of [`Target::send`] is the server refusing (429 or 503).
fn is_refusal(kind: &str) -> bool {
    kind == "http_429" || kind == "http_503"
}

fn micros(latency: Duration) -> u64 {
    u64::try_from(latency.as_micros()).unwrap_or(u64::MAX).max(1)
}

impl Collector {
    fn new() -> Result<Self> {
        let histogram = || Histogram::new_with_bounds(1, 3_600_000_000, 3);
        Ok(Self {
            latencies: Mutex::new(histogram()?),
            refusals: Mutex::new(histogram()?),
            server: Mutex::new(ServerHistograms([
                histogram()?,
                histogram()?,
                histogram()?,
                histogram()?,
                histogram()?,
            ])),
            errors: Mutex::new(BTreeMap::new()),
            sent: AtomicU64::new(0),
            ok: AtomicU64::new(0),
            failed: AtomicU64::new(0),
        })
    }

    /// One request's outcome, `latency` after it was due to start.
    fn record(&self, latency: Duration, outcome: Result<ServerTimes, String>) {
        match outcome {
            Ok(t) => {
                self.ok.fetch_add(1, Ordering::Relaxed);
                self.latencies
                    .lock()
                    .expect("histogram lock")
                    .saturating_record(micros(latency));
                let overhead = t.total.saturating_sub(t.decode + t.inference);
                let mut server = self.server.lock().expect("histogram lock");
                for (h, v) in server
                    .0
                    .iter_mut()
                    .zip([t.decode, t.queue, t.inference, t.total, overhead])
                {
                    h.saturating_record(v.max(1));
                }
            }
            Err(kind) => {
                self.failed.fetch_add(1, Ordering::Relaxed);
                if is_refusal(&kind) {
                    self.refusals
                        .lock()
                        .expect("histogram lock")
                        .saturating_record(micros(latency));
                }
                *self.errors.lock().expect("errors lock").entry(kind).or_default() += 1;
            }
        }
    }
}

struct Target {
    client: reqwest::Client,
    url: String,
    images: Vec<(Bytes, &'static str)>,
    next: AtomicUsize,
    deadline_ms: Option<u64>,
}

impl Target {
    async fn send(&self) -> Result<ServerTimes, String> {
        let (body, content_type) =
            &self.images[self.next.fetch_add(1, Ordering::Relaxed) % self.images.len()];
        let mut req = self
            .client
            .post(&self.url)
            .header("content-type", *content_type)
            .body(body.clone());
        if let Some(ms) = self.deadline_ms {
            req = req.header("x-request-timeout-ms", ms.to_string());
        }
        match req.send().await {
            Ok(resp) if resp.status().is_success() => {
                let times = ServerTimes::from_headers(resp.headers());
                resp.bytes().await.map(|_| times).map_err(|_| "body".to_string())
            }
            Ok(resp) => {
                let status = resp.status().as_u16();
                let _ = resp.bytes().await;
                Err(format!("http_{status}"))
            }
            Err(e) if e.is_timeout() => Err("timeout".into()),
            Err(e) if e.is_connect() => Err("connect".into()),
            Err(_) => Err("other".into()),
        }
    }
}

fn content_type(path: &std::path::Path) -> &'static str {
    match path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase)
        .as_deref()
    {
        Some("png") => "image/png",
        Some("webp") => "image/webp",
        Some("bmp") => "image/bmp",
        _ => "image/jpeg",
    }
}

pub fn run(args: BenchArgs) -> Result<ExitCode> {
    let (paths, problems) = crate::inputs::expand(&args.images);
    for p in &problems {
        eprintln!("peregrine: {p}");
    }
    anyhow::ensure!(!paths.is_empty(), "no images to send");
    anyhow::ensure!(args.duration > 0.0, "--duration must be positive");
    if let Some(rate) = args.rate {
        anyhow::ensure!(rate > 0.0 && rate.is_finite(), "--rate must be a positive number");
    }
    anyhow::ensure!(args.concurrency > 0, "--concurrency must be at least 1");
    let images = paths
        .iter()
        .map(|p| {
            Ok((
                Bytes::from(std::fs::read(p).with_context(|| format!("reading {}", p.display()))?),
                content_type(p),
            ))
        })
        .collect::<Result<Vec<_>>>()?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    // One client pool for the whole run, a profile's steps included.
    let target = runtime.block_on(async { target(&args, images) })?;
    let json = match &args.profile {
        None => {
            let report = runtime.block_on(generate(&args, &target, args.rate, args.duration))?;
            print_report(&report);
            serde_json::to_string_pretty(&report)?
        }
        Some(Profile(steps)) => {
            let mut reports = Vec::new();
            for (i, &(rate, secs)) in steps.iter().enumerate() {
                println!("step {} of {}:", i + 1, steps.len());
                let report = runtime.block_on(generate(&args, &target, Some(rate), secs))?;
                print_report(&report);
                reports.push(report);
            }
            serde_json::to_string_pretty(&serde_json::json!({ "steps": reports }))?
        }
    };
    if let Some(path) = &args.output {
        std::fs::write(path, json).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The server's detect URL and a client pooled for the load, shared by a profile's steps.
fn target(args: &BenchArgs, images: Vec<(Bytes, &'static str)>) -> Result<Arc<Target>> {
    let base = args.url.trim_end_matches('/');
    let url = if args.query.is_empty() {
        format!("{base}/v1/detect")
    } else {
        format!("{base}/v1/detect?{}", args.query.trim_start_matches('?'))
    };
    let open = args.rate.is_some() || args.profile.is_some();
    let pool = if open {
        args.max_outstanding.min(1024)
    } else {
        args.concurrency
    };
    let client = reqwest::Client::builder()
        .timeout(Duration::from_millis(args.timeout_ms))
        .pool_max_idle_per_host(pool)
        .build()?;
    Ok(Arc::new(Target {
        client,
        url,
        images,
        next: AtomicUsize::new(0),
        deadline_ms: args.deadline_ms,
    }))
}

/// One measured run against `target`: open loop at `rate`, else closed loop, for
/// `duration` seconds (or `--requests`, if sooner, outside a profile).
async fn generate(
    args: &BenchArgs,
    target: &Arc<Target>,
    rate: Option<f64>,
    duration: f64,
) -> Result<BenchReport> {
    let collector = Arc::new(Collector::new()?);
    let started_unix_s = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let start = Instant::now();
    let progress = tokio::spawn(show_progress(collector.clone(), start));
    let schedule = Schedule {
        start,
        stop_at: start + Duration::from_secs_f64(duration),
        limit: args
            .requests
            .filter(|_| args.profile.is_none())
            .unwrap_or(u64::MAX),
    };
    let offered_rps = match rate {
        Some(rate) => open_loop(rate, args.max_outstanding, &schedule, target, &collector).await,
        None => {
            closed_loop(args.concurrency, &schedule, target, &collector).await;
            None
        }
    };
    progress.abort();
    if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        eprintln!();
    }
    let elapsed = start.elapsed().as_secs_f64();
    let h = collector.latencies.lock().expect("histogram lock").clone();
    let refused = collector.refusals.lock().expect("histogram lock").clone();
    let ms = |micros: u64| micros as f64 / 1e3;
    let successes = collector.ok.load(Ordering::Relaxed);
    let errors = collector.errors.lock().expect("errors lock").clone();
    let server = &collector.server.lock().expect("histogram lock").0;
    let q = |i: usize, quantile: f64| ms(server[i].value_at_quantile(quantile));
    let server_ms = ServerTimesMs {
        decode_p50: q(0, 0.5),
        queue_p50: q(1, 0.5),
        queue_p99: q(1, 0.99),
        inference_p50: q(2, 0.5),
        total_p50: q(3, 0.5),
        total_p99: q(3, 0.99),
        overhead_p50: q(4, 0.5),
        overhead_p99: q(4, 0.99),
    };
    Ok(BenchReport {
        url: target.url.clone(),
        mode: if rate.is_some() { "open" } else { "closed" },
        concurrency: rate.is_none().then_some(args.concurrency),
        rate,
        started_unix_s,
        duration_s: elapsed,
        images: target.images.len(),
        requests: successes + collector.failed.load(Ordering::Relaxed),
        successes,
        throughput_rps: successes as f64 / elapsed,
        offered_rps,
        latency_ms: LatencyMs::of(&h),
        refused_ms: (!refused.is_empty()).then(|| LatencyMs::of(&refused)),
        server_ms,
        errors,
    })
}

/// When a run starts and ends: at `stop_at` or after `limit` requests, whichever is first.
struct Schedule {
    start: Instant,
    stop_at: Instant,
    limit: u64,
}

/// Sends `rate` requests a second whatever the answers; returns the rate they actually
/// went out at.
async fn open_loop(
    rate: f64,
    max_outstanding: usize,
    schedule: &Schedule,
    target: &Arc<Target>,
    collector: &Arc<Collector>,
) -> Option<f64> {
    let outstanding = Arc::new(AtomicUsize::new(0));
    let period = Duration::from_secs_f64(1.0 / rate);
    let mut tasks = Vec::new();
    let mut k: u64 = 0;
    // The first and the latest send, and how many went out.
    let mut dispatched: Option<(Instant, Instant, u64)> = None;
    while k < schedule.limit {
        let scheduled = schedule.start + period.mul_f64(k as f64);
        if scheduled >= schedule.stop_at {
            break;
        }
        tokio::time::sleep_until(tokio::time::Instant::from_std(scheduled)).await;
        k += 1;
        collector.sent.fetch_add(1, Ordering::Relaxed);
        if outstanding.load(Ordering::Relaxed) >= max_outstanding {
            collector.record(Duration::ZERO, Err("generator_overflow".into()));
            continue;
        }
        outstanding.fetch_add(1, Ordering::Relaxed);
        let now = Instant::now();
        let (first, _, n) = dispatched.unwrap_or((now, now, 0));
        dispatched = Some((first, now, n + 1));
        let (target, collector, outstanding) = (target.clone(), collector.clone(), outstanding.clone());
        tasks.push(tokio::spawn(async move {
            let outcome = target.send().await;
            collector.record(scheduled.elapsed(), outcome);
            outstanding.fetch_sub(1, Ordering::Relaxed);
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    dispatched
        .filter(|&(_, _, n)| n > 1)
        .map(|(first, last, n)| (n - 1) as f64 / (last - first).as_secs_f64().max(1e-9))
}

/// `concurrency` clients, each sending its next request when the last is answered.
async fn closed_loop(
    concurrency: usize,
    schedule: &Schedule,
    target: &Arc<Target>,
    collector: &Arc<Collector>,
) {
    let sent = Arc::new(AtomicU64::new(0));
    let (stop_at, limit) = (schedule.stop_at, schedule.limit);
    let workers: Vec<_> = (0..concurrency)
        .map(|_| {
            let (target, collector, sent) = (target.clone(), collector.clone(), sent.clone());
            tokio::spawn(async move {
                while Instant::now() < stop_at && sent.fetch_add(1, Ordering::Relaxed) < limit {
                    collector.sent.fetch_add(1, Ordering::Relaxed);
                    let t0 = Instant::now();
                    let outcome = target.send().await;
                    // A refused client waits a little before its next try, as a real
                    // one honouring Retry-After would, instead of turning refusals
                    // into a busy loop that starves the server it measures.
                    let refused = matches!(&outcome, Err(k) if is_refusal(k));
                    collector.record(t0.elapsed(), outcome);
                    if refused {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            })
        })
        .collect();
    for w in workers {
        let _ = w.await;
    }
}

async fn show_progress(c: Arc<Collector>, start: Instant) {
    use std::io::IsTerminal;
    if !std::io::stderr().is_terminal() {
        return;
    }
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        let secs = start.elapsed().as_secs_f64();
        let ok = c.ok.load(Ordering::Relaxed);
        eprint!(
            "\r[{secs:6.1} s] sent {} ok {ok} errors {} ({:.1} ok/s)   ",
            c.sent.load(Ordering::Relaxed),
            c.failed.load(Ordering::Relaxed),
            ok as f64 / secs.max(1e-9)
        );
    }
}

fn print_report(r: &BenchReport) {
    let load = match r.rate {
        Some(rate) => format!("open loop at {rate} req/s"),
        None => format!("closed loop, concurrency {}", r.concurrency.unwrap_or(0)),
    };
    println!("{}: {load}, {:.1} s, {} images", r.url, r.duration_s, r.images);
    println!(
        "requests {}  ok {}  throughput {:.2} req/s",
        r.requests, r.successes, r.throughput_rps
    );
    if let Some(offered) = r.offered_rps {
        println!("sent at {offered:.2} req/s");
    }
    println!("{}", r.latency_ms.line("latency"));
    if let Some(refused) = &r.refused_ms {
        println!("{}", refused.line("refusals"));
    }
    let s = &r.server_ms;
    println!(
        "server ms (p50): decode {:.2}  queue {:.2}  inference {:.2}  total {:.2}  overhead {:.2} (p99 {:.2})",
        s.decode_p50, s.queue_p50, s.inference_p50, s.total_p50, s.overhead_p50, s.overhead_p99
    );
    if r.errors.is_empty() {
        println!("errors: none");
    } else {
        let list: Vec<String> = r.errors.iter().map(|(k, v)| format!("{k} {v}")).collect();
        println!("errors: {}", list.join(", "));
    }
}

#[cfg(test)]
#[path = "loadgen_tests.rs"]
mod tests;
