//! `peregrine serve`: the HTTP server.

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use futures_util::FutureExt as _;
use peregrine_api::drain::Drain;
use peregrine_api::grpc::GrpcListener;
use peregrine_api::tls::{Protocol, TlsListener};
use peregrine_api::{ApiConfig, AppState};
use peregrine_eventstore::EventStore;
use peregrine_registry::{
    FixedModel, ModelConfigFile, ModelRegistry, ModelSource, OrtLoader, RegistryConfig, Startup, Weights,
};
use peregrine_video::{ConfiguredSinks, StoreSink};
use peregrine_video::{ManagerOptions, StreamManager, StreamManagerHandle, VideoConfig};
use tokio::sync::watch;

use crate::video::EngineFrames;

use crate::model::EMBEDDED_MODEL;
use crate::serve_config::{ServeArgs, ServeSettings};

pub fn run(args: ServeArgs) -> Result<ExitCode> {
    let settings = args.resolve()?;
    keep_large_allocations_out_of_the_heap(settings.malloc_mmap_threshold);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("peregrine-io")
        .build()
        .context("starting the async runtime")?;
    let outcome = runtime.block_on(serve(settings));
    // Stopping the runtime drops the registry and its engines; their instance threads then
    // free their sessions. Waiting for them keeps GPU sessions from being freed after the
    // CUDA driver has started shutting down at exit, which aborts the process.
    runtime.shutdown_timeout(Duration::from_secs(5));
    let started = std::time::Instant::now();
    while peregrine_engine::live_instances() > 0 && started.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(10));
    }
    outcome
}

/// Sessions allocate and free hundreds of megabytes on load and unload. glibc's default
/// raises its mmap threshold each time a large block is freed, after which such blocks
/// come from the heap and fragment it: measured here, resident memory grew by 40% over
/// 100 load/unload cycles. A fixed threshold keeps blocks of 1 MiB and more in their own
/// mappings, which go back to the system when freed (docs/benchmarks.md).
pub(crate) fn keep_large_allocations_out_of_the_heap(threshold: usize) {
    if threshold == 0 {
        return;
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets an allocator parameter; it is called before any other
    // thread exists.
    unsafe {
        libc::mallopt(
            libc::M_MMAP_THRESHOLD,
            i32::try_from(threshold).unwrap_or(i32::MAX),
        );
    }
}

fn registry_config(s: &ServeSettings) -> RegistryConfig {
    let source = match &s.model_repository {
        Some(dir) => ModelSource::Directory(dir.clone()),
        None => ModelSource::Fixed(vec![FixedModel {
            name: s.model_name(),
            version: s.model_version,
            weights: match &s.model {
                Some(path) => Weights::File(path.clone()),
                None => Weights::Static(EMBEDDED_MODEL),
            },
            config: ModelConfigFile::default(),
        }]),
    };
    RegistryConfig {
        source,
        defaults: s.model_defaults(),
        poll_interval: (s.repository_poll_secs > 0).then(|| Duration::from_secs(s.repository_poll_secs)),
        startup: if s.load_model.is_empty() {
            Startup::All
        } else {
            Startup::Only(s.load_model.clone())
        },
        unload_wait: Duration::from_secs(s.shutdown_timeout_s),
    }
}

async fn bind(host: &str, port: u16, what: &str) -> Result<tokio::net::TcpListener> {
    let address = format!("{host}:{port}");
    tokio::net::TcpListener::bind(&address)
        .await
        .with_context(|| format!("listening for {what} on {address}"))
}

/// NVML's view of the GPUs for `/metrics`, where there is an NVIDIA driver.
fn gpu_telemetry() -> Option<Arc<peregrine_api::gpu_metrics::GpuTelemetry>> {
    match peregrine_api::gpu_metrics::GpuTelemetry::open() {
        Ok(t) => {
            tracing::info!(gpus = t.devices(), "GPU telemetry on /metrics (NVML)");
            Some(Arc::new(t))
        }
        Err(reason) => {
            tracing::debug!(%reason, "no GPU telemetry");
            None
        }
    }
}

async fn serve(s: ServeSettings) -> Result<ExitCode> {
    // Before anything starts: a server that may not listen as configured stops here.
    let access = s.auth.access(&s.host)?;
    s.auth.spawn_reload(access.clone());
    let metrics = peregrine_api::install_metrics_recorder().map_err(|e| anyhow::anyhow!("metrics: {e}"))?;
    let registry = ModelRegistry::start(registry_config(&s), Arc::new(OrtLoader));
    let events = s.events.open().await?;
    let gb28181 = s.gb28181.start().await?;
    let (sinks, streams) = start_video(
        &s,
        &registry,
        events.clone(),
        gb28181.as_ref().map(|g| g.live_play.clone()),
    )
    .await?;
    let drain = Arc::new(Drain::default());
    let state = AppState {
        registry: registry.clone(),
        streams: streams.clone(),
        events,
        default_model: s.default_model.clone(),
        config: ApiConfig {
            max_body_bytes: s.max_body_bytes,
            default_timeout: Duration::from_millis(s.request_timeout_ms),
            max_timeout: Duration::from_millis(s.max_request_timeout_ms),
            body_timeout: Duration::from_millis(s.body_timeout_ms),
        },
        metrics,
        drain: drain.clone(),
        access,
        gpu: gpu_telemetry(),
        profiler: s.profiling.profiler(),
        gb28181: gb28181.map(|g| g.service),
    };
    let tls = s.tls.start()?;
    let (listener, grpc_listener) = listen(&s, tls.is_some()).await?;

    let (stop_tx, stop_rx) = watch::channel(false);
    let failed_start = Arc::new(AtomicBool::new(false));
    spawn_shutdown_triggers(&registry, &drain, &streams, stop_tx, &stop_rx, &failed_start);
    // The listeners stay open while draining, so that load balancers see the 503s and
    // NOT_SERVING, and close once the last admitted request is answered.
    let grpc = match grpc_listener {
        None => None,
        Some(tcp) => {
            let listener = match &tls {
                None => GrpcListener::Plain(tcp),
                Some(tls) => GrpcListener::Tls(TlsListener::new(
                    tcp,
                    tls.config.clone(),
                    Protocol::Grpc,
                    tls.handshake_timeout,
                )?),
            };
            let drain = drain.clone();
            let shutdown = async move { drain.finished().await };
            Some(tokio::spawn(peregrine_api::grpc::serve(
                listener,
                state.clone(),
                shutdown,
            )))
        }
    };
    let router = peregrine_api::router(state);
    let server = match &tls {
        // Small responses go out at once rather than waiting on a delayed ACK (Nagle).
        None => serve_http(
            axum::serve::ListenerExt::tap_io(listener, |tcp| {
                let _ = tcp.set_nodelay(true);
            }),
            router,
            drain,
        )
        .boxed(),
        Some(tls) => serve_http(
            TlsListener::new(
                listener,
                tls.config.clone(),
                Protocol::Http1,
                tls.handshake_timeout,
            )?,
            router,
            drain,
        )
        .boxed(),
    };
    let both = async move {
        server.await.context("serving HTTP")?;
        if let Some(grpc) = grpc {
            grpc.await
                .context("the gRPC server task failed")?
                .context("serving gRPC")?;
        }
        anyhow::Ok(())
    };
    let mut timer = stop_rx;
    let bound = Duration::from_secs(s.shutdown_timeout_s);
    let outcome = tokio::select! {
        result = both => {
            result?;
            if failed_start.load(Ordering::Relaxed) {
                return Ok(ExitCode::FAILURE);
            }
            tracing::info!("drained; exiting");
            Ok(ExitCode::SUCCESS)
        }
        _ = async { let _ = timer.wait_for(|stop| *stop).await; tokio::time::sleep(bound).await } => {
            tracing::warn!(seconds = bound.as_secs(), "in-flight requests did not finish within the shutdown timeout; exiting anyway");
            Ok(ExitCode::FAILURE)
        }
    };
    // The sinks flush what the stopped streams left (MQTT then says `offline`).
    sinks.shut_down().await;
    outcome
}

/// Serves HTTP on `listener` until the drain has answered every admitted request.
async fn serve_http<L>(listener: L, router: axum::Router, drain: Arc<Drain>) -> std::io::Result<()>
where
    L: axum::serve::Listener,
    L::Addr: std::fmt::Debug,
{
    axum::serve(listener, router)
        .with_graceful_shutdown(async move {
            drain.finished().await;
            tracing::info!("every admitted request is answered; closing the listeners");
        })
        .await
}

/// Every sink of the video streams: the configured ones and the event store's.
struct Sinks {
    configured: ConfiguredSinks,
    store: Option<StoreSink>,
}

impl Sinks {
    async fn shut_down(self) {
        self.configured.shut_down().await;
        if let Some(store) = self.store {
            store.shut_down().await;
        }
    }
}

/// The sinks and the stream manager, whose streams detect through the registry's engines.
async fn start_video(
    s: &ServeSettings,
    registry: &ModelRegistry,
    events: Option<EventStore>,
    live_play: Option<Arc<dyn peregrine_video::LivePlay>>,
) -> Result<(Sinks, StreamManagerHandle)> {
    let video = VideoConfig {
        streams: s.streams.clone(),
        mqtt: s.mqtt.clone(),
        webhooks: s.webhooks.clone(),
    };
    let configured = ConfiguredSinks::start(&video, events.is_some()).context("starting the video sinks")?;
    let store = events.map(|e| StoreSink::start(e, s.events.snapshots_dir.clone()));
    let mut options = ManagerOptions::new(Arc::new(EngineFrames {
        registry: registry.clone(),
        model: s.stream_model.clone(),
    }));
    options.stream_policy = s.stream_policy.clone();
    if live_play.is_some()
        && !options
            .stream_policy
            .allowed_schemes
            .iter()
            .any(|x| x == "gb28181")
    {
        // Turning GB28181 on is the permission: such streams reach only registered,
        // authenticated devices, never an address a request names.
        options.stream_policy.allowed_schemes.push("gb28181".into());
    }
    options.live_play = live_play;
    options.decoder = peregrine_video::DecoderDefaults {
        kind: s.video_decoder,
        model_gpus: s.model_defaults().gpu_devices(),
        gpu_frames: s.model_defaults().session.gpu_frames,
    };
    options.sinks = configured.queues();
    options.sinks.extend(store.as_ref().map(StoreSink::queue));
    options.shard = s.shard.assignment()?;
    let streams = StreamManager::start(options, video.streams.clone())
        .await
        .context("starting the video streams")?;
    let placement = streams.placement();
    if placement.shard.count() > 1 {
        tracing::info!(
            shard = placement.shard.index(),
            count = placement.shard.count(),
            skipped = placement.skipped.len(),
            "this shard runs only its own configured streams"
        );
    }
    Ok((Sinks { configured, store }, streams))
}

/// The HTTP listener and, unless gRPC is off, the gRPC one.
async fn listen(
    s: &ServeSettings,
    tls: bool,
) -> Result<(tokio::net::TcpListener, Option<tokio::net::TcpListener>)> {
    let listener = bind(&s.host, s.port, "HTTP").await?;
    let local = listener.local_addr()?;
    let scheme = if tls { "https" } else { "http" };
    tracing::info!(address = %local, tls, "HTTP listening");
    // Tests and scripts read these lines to learn the ports when started with port 0.
    eprintln!("peregrine: listening on {scheme}://{local}");
    let grpc_listener = match s.allow_grpc {
        true => {
            let l = bind(&s.host, s.grpc_port, "gRPC").await?;
            let grpc_local = l.local_addr()?;
            tracing::info!(address = %grpc_local, tls, "gRPC listening");
            eprintln!("peregrine: gRPC listening on {grpc_local}");
            Some(l)
        }
        false => None,
    };
    Ok((listener, grpc_listener))
}

/// What starts the drain: models failing at start-up (then the process exits with an
/// error) or a signal; and what the drain stops at once: the streams.
fn spawn_shutdown_triggers(
    registry: &ModelRegistry,
    drain: &Arc<Drain>,
    streams: &StreamManagerHandle,
    stop_tx: watch::Sender<bool>,
    stop_rx: &watch::Receiver<bool>,
    failed_start: &Arc<AtomicBool>,
) {
    {
        let (registry, stop_tx, failed) = (registry.clone(), stop_tx.clone(), failed_start.clone());
        let drain = drain.clone();
        tokio::spawn(async move {
            let errors = registry.wait_started().await;
            if errors.is_empty() {
                tracing::info!("every start-up model is loaded and warmed up; ready");
                return;
            }
            for e in &errors {
                eprintln!("peregrine: {e}");
            }
            tracing::error!(
                failures = errors.len(),
                "models failed to load at start-up; stopping"
            );
            failed.store(true, Ordering::Relaxed);
            drain.start();
            let _ = stop_tx.send(true);
        });
    }
    {
        let drain = drain.clone();
        tokio::spawn(async move {
            wait_for_signal().await;
            drain.start();
            tracing::info!(
                in_flight = drain.in_flight(),
                "shutdown signal received; new requests get 503 while in-flight ones finish"
            );
            let _ = stop_tx.send(true);
        });
    }
    {
        // Streams stop as soon as shutdown begins: their event feeds (SSE) end, so the HTTP
        // drain does not wait on them, and no new frames reach the engines.
        let (streams, mut stop) = (streams.clone(), stop_rx.clone());
        tokio::spawn(async move {
            let _ = stop.wait_for(|stop| *stop).await;
            let _ = streams.shutdown().await;
        });
    }
}

async fn wait_for_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}
