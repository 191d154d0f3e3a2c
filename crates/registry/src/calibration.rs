//! Online INT8 calibration (`calibration = { mode = "online", ... }` in a model's
//! `config.toml`): while a float version serves, a bounded sample of the canvases it
//! letterboxes (real requests and video frames) runs through the calibration graph on one
//! low-priority thread; the quantized model is then written into the repository as the
//! model's next version, which loads like any new version (a canary first when the model
//! has a `[rollout]`).
//!
//! This module is the setting; `worker` is the thread. The owner starts a worker for each
//! float version it loads, and the worker first checks that no version of the model was
//! already calibrated from the same weights (the quantized file records its source's
//! SHA-256), so a restart, a reload or the published version itself starts nothing.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use peregrine_backend::activations::ActivationSession;
use peregrine_backend::BackendError;
use peregrine_onnx::quantize::{
    ActivationType, CalibrationMethod, Selection, TensorHistogram, DEFAULT_EXCLUDE,
};
use serde::Deserialize;

use crate::settings::SettingsError;

pub(crate) mod worker;

/// Most canvases one calibration may ask for (each run once through the calibration
/// graph; 500 take about a minute of one core at 640x640).
const MAX_SAMPLES: usize = 100_000;

/// Each calibrated tensor's range, by name.
pub type Ranges = HashMap<String, (f32, f32)>;

/// Canvases through a model's calibration graph (`peregrine_onnx::quantize::
/// calibration_graph`), each measured tensor's statistics kept for `method`: what both
/// `peregrine quantize` and the online worker feed their canvases to.
pub struct Calibrator {
    session: ActivationSession,
    histograms: HashMap<String, TensorHistogram>,
    method: CalibrationMethod,
    /// One canvas as the graph's planar float input.
    input: Vec<f32>,
    shape: [usize; 4],
}

impl Calibrator {
    /// A CPU session of `graph` with `threads` intra-op threads, measuring `tensors`, for
    /// canvases of `width` x `height`.
    pub fn new(
        graph: &[u8],
        tensors: &[String],
        method: CalibrationMethod,
        threads: usize,
        runtime_path: Option<&Path>,
        (width, height): (usize, usize),
    ) -> Result<Self, BackendError> {
        Ok(Self {
            session: ActivationSession::from_bytes(graph, threads, runtime_path)?,
            histograms: tensors
                .iter()
                .map(|t| (t.clone(), TensorHistogram::for_method(method)))
                .collect(),
            method,
            input: vec![0f32; 3 * width * height],
            shape: [1, 3, height, width],
        })
    }

    /// Runs one letterboxed canvas (interleaved RGB8) and adds what each tensor held.
    pub fn add(&mut self, canvas: &[u8]) -> Result<(), BackendError> {
        peregrine_vision::normalize::rgb8_to_planar_f32(canvas, &mut self.input);
        let histograms = &mut self.histograms;
        self.session.run(&self.input, self.shape, |name, values| {
            if let Some(h) = histograms.get_mut(name) {
                h.add(values);
            }
        })
    }

    /// Each tensor's range by the method.
    pub fn ranges(&self) -> Ranges {
        self.histograms
            .iter()
            .map(|(name, h)| (name.clone(), h.range(self.method)))
            .collect()
    }
}

/// `calibration = { ... }` as a model's `config.toml` spells it.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct CalibrationFile {
    /// `online` or `off` [default: off].
    pub mode: Option<String>,
    /// Canvases to calibrate on [default: 500].
    pub samples: Option<usize>,
    /// Take one canvas of every `every` letterboxed [default: 1, the first ones].
    pub every: Option<u64>,
    /// `min-max` (default), `entropy` or `percentile`.
    pub method: Option<String>,
    /// The percentile of `|x|` that `method = "percentile"` clips at [default: 99.99].
    pub percentile: Option<f64>,
    /// `uint8` (default) or `int8`.
    pub activations: Option<String>,
    /// Nodes kept float, by name prefix (as `peregrine quantize --exclude`).
    pub exclude: Option<Vec<String>>,
    /// ONNX Runtime threads of the calibration session [default: 1].
    pub threads: Option<usize>,
    /// Canvases sampled after the calibration ones, on which the INT8 model's detections
    /// are compared with the float model's [default: 20; 0 skips the comparison].
    pub held_out: Option<usize>,
    /// Publish only when recall and precision against the float model on the held-out
    /// canvases both reach this share (0 to 1) [default: publish whatever they are].
    pub min_agreement: Option<f64>,
}

/// A model's online calibration, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct OnlineCalibration {
    pub samples: usize,
    pub every: u64,
    pub method: CalibrationMethod,
    pub activations: ActivationType,
    pub selection: Selection,
    pub threads: usize,
    pub held_out: usize,
    pub min_agreement: Option<f64>,
    /// The model's directory in the repository, where the result is published.
    pub model_dir: PathBuf,
}

impl CalibrationFile {
    /// The calibration these keys ask for (`None` when off), for the model at `model_dir`.
    pub fn resolve(&self, model_dir: &Path) -> Result<Option<OnlineCalibration>, SettingsError> {
        match self.mode.as_deref() {
            None | Some("off") => return Ok(None),
            Some("online") => {}
            Some(other) => {
                return Err(SettingsError(format!(
                    "calibration.mode {other:?} is not one of online, off"
                )))
            }
        }
        let samples = self.samples.unwrap_or(500);
        if !(1..=MAX_SAMPLES).contains(&samples) {
            return Err(SettingsError(format!(
                "calibration.samples is {samples}: give 1 to {MAX_SAMPLES}"
            )));
        }
        let every = self.every.unwrap_or(1);
        if every == 0 {
            return Err(SettingsError("calibration.every must be at least 1".into()));
        }
        let percentile = self.percentile.unwrap_or(99.99);
        if self.percentile.is_some() && self.method.as_deref() != Some("percentile") {
            return Err(SettingsError(
                "calibration.percentile is read only with method = \"percentile\"".into(),
            ));
        }
        let method = match self.method.as_deref().unwrap_or("min-max") {
            "min-max" => CalibrationMethod::MinMax,
            "entropy" => CalibrationMethod::Entropy,
            "percentile" if percentile > 0.0 && percentile <= 100.0 => {
                CalibrationMethod::Percentile(percentile)
            }
            "percentile" => {
                return Err(SettingsError(format!(
                    "calibration.percentile is {percentile}: give a share of values above 0 and at most 100"
                )))
            }
            other => {
                return Err(SettingsError(format!(
                    "calibration.method {other:?} is not one of min-max, entropy, percentile"
                )))
            }
        };
        let activations = match self.activations.as_deref().unwrap_or("uint8") {
            "uint8" => ActivationType::Uint8,
            "int8" => ActivationType::Int8,
            other => {
                return Err(SettingsError(format!(
                    "calibration.activations {other:?} is not one of uint8, int8"
                )))
            }
        };
        let threads = self.threads.unwrap_or(1);
        if threads == 0 {
            return Err(SettingsError("calibration.threads must be at least 1".into()));
        }
        let held_out = self.held_out.unwrap_or(20);
        if held_out > MAX_SAMPLES {
            return Err(SettingsError(format!(
                "calibration.held_out is {held_out}: give at most {MAX_SAMPLES}"
            )));
        }
        if let Some(min) = self.min_agreement {
            if !(0.0..=1.0).contains(&min) {
                return Err(SettingsError(format!(
                    "calibration.min_agreement is {min}: give a share between 0 and 1"
                )));
            }
            if held_out == 0 {
                return Err(SettingsError(
                    "calibration.min_agreement is judged on held-out canvases: held_out must be at least 1"
                        .into(),
                ));
            }
        }
        Ok(Some(OnlineCalibration {
            samples,
            every,
            method,
            activations,
            selection: Selection {
                exclude: self
                    .exclude
                    .clone()
                    .unwrap_or_else(|| vec![DEFAULT_EXCLUDE.to_string()]),
                ..Selection::default()
            },
            threads,
            held_out,
            min_agreement: self.min_agreement,
            model_dir: model_dir.to_path_buf(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve(text: &str) -> Result<Option<OnlineCalibration>, SettingsError> {
        #[derive(Deserialize)]
        struct Wrap {
            calibration: CalibrationFile,
        }
        let file: Wrap = toml::from_str(text).map_err(|e| SettingsError(e.message().to_string()))?;
        file.calibration.resolve(Path::new("/repo/m"))
    }

    #[test]
    fn online_takes_the_defaults_of_the_command() {
        let c = resolve("calibration = { mode = \"online\" }").unwrap().unwrap();
        assert_eq!((c.samples, c.every, c.threads, c.held_out), (500, 1, 1, 20));
        assert_eq!(c.min_agreement, None);
        assert_eq!(c.method, CalibrationMethod::MinMax);
        assert_eq!(c.activations, ActivationType::Uint8);
        assert_eq!(c.selection.exclude, [DEFAULT_EXCLUDE]);
        assert_eq!(c.model_dir, Path::new("/repo/m"));
        let c = resolve(
            "calibration = { mode = \"online\", samples = 50, every = 3, method = \"percentile\", \
             percentile = 99.9, activations = \"int8\", exclude = [\"/model.23/\"], threads = 2, \
             held_out = 5, min_agreement = 0.8 }",
        )
        .unwrap()
        .unwrap();
        assert_eq!((c.samples, c.every, c.threads), (50, 3, 2));
        assert_eq!(c.method, CalibrationMethod::Percentile(99.9));
        assert_eq!(c.activations, ActivationType::Int8);
        assert_eq!(c.selection.exclude, ["/model.23/"]);
        assert_eq!((c.held_out, c.min_agreement), (5, Some(0.8)));
    }

    #[test]
    fn the_readme_example_is_a_valid_calibration() {
        let readme = include_str!("../../../README.md");
        let marker = "calibrate an INT8 version from live requests";
        let start = readme
            .find(marker)
            .expect("README has an online calibration example");
        let text = &readme[start + marker.len()..];
        let text = &text[..text.find("```").unwrap()];
        let c = resolve(text).unwrap().expect("the example turns calibration on");
        assert_eq!(c.samples, 500);
    }

    #[test]
    fn off_or_absent_mode_calibrates_nothing() {
        assert_eq!(resolve("calibration = { mode = \"off\" }").unwrap(), None);
        assert_eq!(resolve("calibration = { samples = 10 }").unwrap(), None);
    }

    #[test]
    fn bad_keys_say_what_is_wrong() {
        let err = |text: &str| resolve(text).unwrap_err().0;
        assert!(err("calibration = { mode = \"offline\" }").contains("not one of online, off"));
        assert!(err("calibration = { mode = \"online\", samples = 0 }").contains("give 1 to"));
        assert!(err("calibration = { mode = \"online\", every = 0 }").contains("every must be"));
        assert!(err("calibration = { mode = \"online\", method = \"kl\" }")
            .contains("not one of min-max, entropy, percentile"));
        assert!(err("calibration = { mode = \"online\", percentile = 99.0 }")
            .contains("only with method = \"percentile\""));
        assert!(
            err("calibration = { mode = \"online\", method = \"percentile\", percentile = 0.0 }")
                .contains("above 0 and at most 100")
        );
        assert!(err("calibration = { mode = \"online\", activations = \"fp8\" }")
            .contains("not one of uint8, int8"));
        assert!(err("calibration = { mode = \"online\", threads = 0 }").contains("threads must be"));
        assert!(err("calibration = { mode = \"online\", min_agreement = 1.5 }").contains("between 0 and 1"));
        assert!(
            err("calibration = { mode = \"online\", held_out = 0, min_agreement = 0.5 }")
                .contains("held_out must be at least 1")
        );
        assert!(err("calibration = { mode = \"online\", sample = 5 }").contains("unknown field `sample`"));
    }
}
