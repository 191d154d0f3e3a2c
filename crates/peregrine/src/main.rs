//! The `peregrine` binary: command-line parsing, configuration and wiring. Everything it
//! does is delegated to the library crates; this is the only crate that uses `anyhow`.

mod auth_config;
mod cli;
mod decode_bench;
mod detect;
mod events_config;
mod inputs;
mod loadgen;
mod model;
mod model_bench;
mod provider_args;
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
    init_logging(&cli.log, default_level, default_format);
    let result = match cli.command {
        cli::Command::Detect(args) => detect::run(args),
        cli::Command::Serve(args) => serve::run(*args),
        cli::Command::Bench(args) => loadgen::run(args),
        cli::Command::BenchModel(args) => model_bench::run(args),
        cli::Command::BenchDecode(args) => decode_bench::run(args),
        cli::Command::Keys(args) => auth_config::run_keys(args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("peregrine: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn init_logging(log: &cli::LogArgs, default_level: &str, default_format: cli::LogFormat) {
    use tracing_subscriber::EnvFilter;
    let level = log.log_level.as_deref().unwrap_or(default_level);
    let filter = EnvFilter::try_new(level).unwrap_or_else(|_| EnvFilter::new(default_level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match log.log_format.unwrap_or(default_format) {
        cli::LogFormat::Json => builder.json().init(),
        cli::LogFormat::Text => builder.init(),
    }
}
