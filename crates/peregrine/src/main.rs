//! The `peregrine` binary: command-line parsing, configuration and wiring. Everything it
//! does is delegated to the library crates; this is the only crate that uses `anyhow`.

mod auth_config;
mod cli;
mod decode_bench;
mod detect;
mod error_chain;
mod events_config;
mod gb28181_config;
mod inputs;
mod loadgen;
mod model;
mod model_bench;
mod otel;
mod profiling_config;
mod provider_args;
mod quantize;
mod quantize_report;
mod quantize_search;
mod report;
mod serve;
mod serve_config;
mod shard_config;
mod slo_config;
mod stream_policy_config;
mod tls_config;
mod video;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    let (default_level, default_format) = match cli.command {
        cli::Command::Serve(_) => ("info", cli::LogFormat::Json),
        _ => ("warn", cli::LogFormat::Text),
    };
    // Only the server has requests to trace.
    let traces = match &cli.command {
        cli::Command::Serve(_) => match start_traces() {
            Ok(traces) => traces,
            Err(e) => {
                eprintln!("peregrine: {}", error_chain::one_line(&e));
                return ExitCode::FAILURE;
            }
        },
        _ => None,
    };
    init_logging(&cli.log, default_level, default_format, traces.as_ref());
    let result = match cli.command {
        cli::Command::Detect(args) => detect::run(args),
        cli::Command::Serve(args) => serve::run(*args),
        cli::Command::Bench(args) => loadgen::run(args),
        cli::Command::BenchModel(args) => model_bench::run(args),
        cli::Command::BenchDecode(args) => decode_bench::run(args),
        cli::Command::Keys(args) => auth_config::run_keys(args),
        cli::Command::Quantize(args) => quantize::run(*args),
    };
    if let Some(traces) = traces {
        traces.shutdown();
    }
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("peregrine: {}", error_chain::one_line(&e));
            ExitCode::FAILURE
        }
    }
}

fn start_traces() -> anyhow::Result<Option<otel::Traces>> {
    match otel::TracesSetting::from_env(|name| std::env::var(name).ok())? {
        otel::TracesSetting::Off => Ok(None),
        otel::TracesSetting::Otlp => otel::Traces::start().map(Some),
    }
}

/// The log on stderr, and the traces' layer beside it when traces are exported. Each has
/// its own filter: the log never shows the spans made for traces
/// (`peregrine_engine::spans::TARGET`), and the traces take Peregrine's spans (and its
/// warnings and errors, as span events) and nothing of other crates.
fn init_logging(
    log: &cli::LogArgs,
    default_level: &str,
    default_format: cli::LogFormat,
    traces: Option<&otel::Traces>,
) {
    use tracing_subscriber::filter::{filter_fn, EnvFilter};
    use tracing_subscriber::prelude::*;
    let level = log.log_level.as_deref().unwrap_or(default_level);
    let trace_spans_off = format!("{}=off", peregrine_engine::spans::TARGET)
        .parse()
        .expect("a valid directive");
    let filter = EnvFilter::try_new(level)
        .unwrap_or_else(|_| EnvFilter::new(default_level))
        .add_directive(trace_spans_off);
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let fmt = match log.log_format.unwrap_or(default_format) {
        cli::LogFormat::Json => fmt.json().with_filter(filter).boxed(),
        cli::LogFormat::Text => fmt.with_filter(filter).boxed(),
    };
    let traces = traces.map(|traces| {
        tracing_opentelemetry::layer()
            .with_tracer(traces.tracer())
            .with_tracked_inactivity(false)
            .with_threads(false)
            .with_location(false)
            .with_level(false)
            .with_target(false)
            .with_filter(filter_fn(|meta| {
                let ours = meta.target().starts_with("peregrine");
                ours && (meta.is_span() || *meta.level() <= tracing::Level::WARN)
            }))
    });
    tracing_subscriber::registry().with(fmt).with(traces).init();
}
