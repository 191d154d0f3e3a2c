//! `peregrine serve`: the HTTP server.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use peregrine_api::{ApiConfig, AppState};
use peregrine_backend::SessionConfig;
use peregrine_engine::{BatchPolicy, Detector, DetectorConfig, Engine, EngineConfig, EngineError};
use peregrine_vision::DecodeLimits;
use tokio::sync::watch;

use crate::model::EMBEDDED_MODEL;
use crate::serve_config::{ServeArgs, ServeSettings};

pub fn run(args: ServeArgs) -> Result<ExitCode> {
    let settings = args.resolve()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("peregrine-io")
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(serve(settings))
}

fn build_engine(s: &ServeSettings) -> Result<Engine> {
    let model_bytes: Arc<[u8]> = match &s.model {
        Some(path) => std::fs::read(path)
            .with_context(|| format!("reading model {}", path.display()))?
            .into(),
        None => EMBEDDED_MODEL.into(),
    };
    let session = SessionConfig {
        intra_threads: s.threads,
        intra_op_spinning: s.spin_wait,
        runtime_path: s.ort_lib.clone(),
        provider: s.provider.provider(),
    };
    let fallback = s.provider.provider_fallback;
    let detector_config = DetectorConfig {
        imgsz: s.imgsz,
        max_batch: s.max_batch,
    };
    let factory = move || -> Result<Detector, EngineError> {
        let backend = crate::model::load_backend(&model_bytes, &session, fallback)?;
        Detector::new(Box::new(backend), &detector_config)
    };
    let config = EngineConfig {
        name: s.model_name(),
        version: s.model_version.clone(),
        instances: s.instances,
        policy: BatchPolicy {
            max_batch: s.max_batch,
            max_delay: Duration::from_micros(s.max_queue_delay_us),
            preferred: s.preferred_batch_sizes.clone(),
            capacity: s.queue_capacity,
        },
        max_in_flight: s.max_in_flight,
        preprocess_threads: s.preprocess_threads,
        decode_limits: DecodeLimits {
            max_pixels: s.max_pixels,
        },
        shed_on_backlog: s.shed_on_backlog,
    };
    Engine::start(config, &factory).with_context(|| format!("loading model {}", s.model_name()))
}

async fn serve(s: ServeSettings) -> Result<ExitCode> {
    let metrics = peregrine_api::install_metrics_recorder().map_err(|e| anyhow::anyhow!("metrics: {e}"))?;
    let engine = build_engine(&s)?;
    let name = engine.name().to_string();
    tracing::info!(model = %name, version = %engine.version(), input = ?(engine.spec().input_height, engine.spec().input_width),
        max_batch = engine.config().policy.max_batch, instances = s.instances, "model loaded; warming up");
    let draining = Arc::new(AtomicBool::new(false));
    let state = AppState {
        engines: Arc::new(BTreeMap::from([(name.clone(), engine)])),
        default_model: name,
        config: ApiConfig {
            max_body_bytes: s.max_body_bytes,
            default_timeout: Duration::from_millis(s.request_timeout_ms),
            max_timeout: Duration::from_millis(s.max_request_timeout_ms),
            body_timeout: Duration::from_millis(s.body_timeout_ms),
        },
        metrics,
        draining: draining.clone(),
    };
    let address = format!("{}:{}", s.host, s.port);
    let listener = tokio::net::TcpListener::bind(&address)
        .await
        .with_context(|| format!("listening on {address}"))?;
    let local = listener.local_addr()?;
    tracing::info!(address = %local, "listening");
    // Tests and scripts read this line to learn the port when started with --port 0.
    eprintln!("peregrine: listening on http://{local}");

    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        wait_for_signal().await;
        draining.store(true, Ordering::Relaxed);
        tracing::info!("shutdown signal received; draining in-flight requests");
        let _ = stop_tx.send(true);
    });
    let mut graceful = stop_rx.clone();
    let server = axum::serve(listener, peregrine_api::router(state)).with_graceful_shutdown(async move {
        let _ = graceful.wait_for(|stop| *stop).await;
    });
    let mut timer = stop_rx;
    let bound = Duration::from_secs(s.shutdown_timeout_s);
    tokio::select! {
        result = server => {
            result.context("serving HTTP")?;
            tracing::info!("drained; exiting");
            Ok(ExitCode::SUCCESS)
        }
        _ = async { let _ = timer.wait_for(|stop| *stop).await; tokio::time::sleep(bound).await } => {
            tracing::warn!(seconds = bound.as_secs(), "in-flight requests did not finish within the shutdown timeout; exiting anyway");
            Ok(ExitCode::FAILURE)
        }
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
