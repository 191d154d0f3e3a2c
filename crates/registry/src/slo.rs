//! `[slo]`: a model's latency objective as the server's config file and a model's
//! `config.toml` spell it, laid over the objective it inherits.

use std::time::Duration;

use peregrine_engine::adaptive::DEFAULT_WINDOW;
use peregrine_engine::Objective;
use serde::Deserialize;

use crate::settings::SettingsError;

/// `[slo]`: every key optional, each overriding the inherited objective.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct SloFile {
    /// End-to-end P99 (decode wait, decoding, queue, inference, postprocessing) to keep,
    /// in milliseconds; 0 removes an inherited objective.
    pub p99_ms: Option<u64>,
    /// The window P99 is measured over, in seconds [default: 10].
    pub window_s: Option<u64>,
    /// Adjust the batch limit and delay to keep the objective [default: true once an
    /// objective is set].
    pub adaptive_batching: Option<bool>,
}

impl SloFile {
    /// Lays these keys over `objective` (the server's, for a model's file) and checks the
    /// result; errors name the key.
    pub fn apply(&self, objective: &mut Option<Objective>) -> Result<(), SettingsError> {
        match self.p99_ms {
            Some(0) => *objective = None,
            Some(ms) => {
                let o = objective.get_or_insert_with(|| Objective {
                    p99: Duration::ZERO,
                    window: DEFAULT_WINDOW,
                    adaptive_batching: true,
                });
                o.p99 = Duration::from_millis(ms);
            }
            None => {}
        }
        let Some(o) = objective.as_mut() else {
            if self.window_s.is_some() || self.adaptive_batching.is_some() {
                return Err(SettingsError(
                    "slo.window_s and slo.adaptive_batching need an objective: set slo.p99_ms".into(),
                ));
            }
            return Ok(());
        };
        if let Some(s) = self.window_s {
            o.window = Duration::from_secs(s);
        }
        if let Some(on) = self.adaptive_batching {
            o.adaptive_batching = on;
        }
        // Only the window can be out of range here: a P99 of 0 removed the objective.
        o.validate()
            .map_err(|e| SettingsError(format!("slo.window_s: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> SloFile {
        toml::from_str(text).unwrap()
    }

    #[test]
    fn a_model_file_overrides_the_servers_objective_key_by_key() {
        let mut o = None;
        parse("p99_ms = 100").apply(&mut o).unwrap();
        let server = o.clone().unwrap();
        assert_eq!(
            (server.p99, server.window, server.adaptive_batching),
            (Duration::from_millis(100), DEFAULT_WINDOW, true)
        );
        parse("window_s = 30\nadaptive_batching = false")
            .apply(&mut o)
            .unwrap();
        let model = o.clone().unwrap();
        assert_eq!(model.p99, Duration::from_millis(100), "inherited");
        assert_eq!(
            (model.window, model.adaptive_batching),
            (Duration::from_secs(30), false)
        );
        parse("p99_ms = 0").apply(&mut o).unwrap();
        assert_eq!(o, None, "0 removes the objective");
        SloFile::default().apply(&mut o).unwrap();
        assert_eq!(o, None);
    }

    #[test]
    fn bad_objectives_are_refused_with_the_key() {
        let err = |text: &str| parse(text).apply(&mut None).unwrap_err().0;
        assert!(err("window_s = 5").contains("set slo.p99_ms"));
        assert!(err("p99_ms = 50\nwindow_s = 0").contains("slo.window_s: the window must be"));
        assert!(
            toml::from_str::<SloFile>("p99 = 5").is_err(),
            "unknown keys are refused"
        );
    }
}
