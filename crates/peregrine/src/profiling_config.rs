//! `[profiling]` of the serve settings: whether the admin route that records CPU profiles
//! of the running server (`/debug/pprof/profile`) answers. Off by default: a profile costs
//! CPU while it runs and shows the code's shape to whoever holds an admin key.

use std::sync::Arc;

use clap::Args;
use peregrine_api::profiling::Profiler;
use serde::Deserialize;

#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct ProfilingSettings {
    pub enabled: bool,
}

/// Flags for the server's `[profiling]`; each overrides the config file.
#[derive(Debug, Args, Default)]
pub struct ProfilingArgs {
    /// Answer `GET /debug/pprof/profile?seconds=N&format=svg|pprof` (admin scope): a CPU
    /// profile of the whole server over N seconds (1 to 60), as a flamegraph or pprof
    /// protobuf, one at a time. Nothing is sampled until a profile is asked for
    /// [default: false].
    #[arg(long = "profiling", env = "PEREGRINE_PROFILING")]
    pub enabled: Option<bool>,
}

impl ProfilingArgs {
    pub fn apply(self, s: &mut ProfilingSettings) {
        if let Some(enabled) = self.enabled {
            s.enabled = enabled;
        }
    }
}

impl ProfilingSettings {
    /// The API's profiler: `None` keeps the route answering 404.
    pub fn profiler(&self) -> Option<Arc<Profiler>> {
        self.enabled.then(Arc::default)
    }
}
