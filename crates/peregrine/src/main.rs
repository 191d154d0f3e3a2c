//! The `peregrine` binary: command-line parsing, configuration and wiring. Everything it
//! does is delegated to the library crates; this is the only crate that uses `anyhow`.

mod cli;
mod detect;
mod inputs;
mod model;
mod report;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    init_logging(&cli.log);
    let result = match cli.command {
        cli::Command::Detect(args) => detect::run(args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("peregrine: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn init_logging(log: &cli::LogArgs) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_new(&log.log_level).unwrap_or_else(|_| EnvFilter::new("warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match log.log_format {
        cli::LogFormat::Json => builder.json().init(),
        cli::LogFormat::Text => builder.init(),
    }
}
