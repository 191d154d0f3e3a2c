//! `[slo]` of the serve settings: the latency objective every model gets unless its own
//! `config.toml` says otherwise (`peregrine_registry::SloFile`, the same keys in both).

use clap::Args;
use peregrine_registry::SloFile;

/// Flags for the server's `[slo]`; each overrides the config file.
#[derive(Debug, Args, Default)]
pub struct SloArgs {
    /// End-to-end P99 each model should keep inside the server (decode wait, decoding,
    /// queue, inference, postprocessing), in ms; drives adaptive batching. 0 or unset: no
    /// objective (P99 is still measured over 10 s and exported).
    #[arg(long = "slo-p99-ms", env = "PEREGRINE_SLO_P99_MS")]
    pub p99_ms: Option<u64>,
    /// The window P99 is measured over, in seconds [default: 10].
    #[arg(long = "slo-window-s", env = "PEREGRINE_SLO_WINDOW_S")]
    pub window_s: Option<u64>,
    /// Adjust each model's batch limit and delay to keep the objective: halved on a
    /// breach, grown back while P99 is well under it [default: true with an objective].
    #[arg(long = "adaptive-batching", env = "PEREGRINE_ADAPTIVE_BATCHING")]
    pub adaptive_batching: Option<bool>,
}

impl SloArgs {
    pub fn apply(self, s: &mut SloFile) {
        if self.p99_ms.is_some() {
            s.p99_ms = self.p99_ms;
        }
        if self.window_s.is_some() {
            s.window_s = self.window_s;
        }
        if self.adaptive_batching.is_some() {
            s.adaptive_batching = self.adaptive_batching;
        }
    }
}
