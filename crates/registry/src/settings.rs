//! How a model is served: the server's defaults, overlaid with the model's own
//! `config.toml` from the repository, validated once into [`ModelSettings`].

use std::path::{Path, PathBuf};
use std::time::Duration;

use peregrine_backend::{CudaOptions, ExecutionProvider, SessionConfig, TensorRtOptions};
use peregrine_engine::{DetectorConfig, EngineConfig};
use serde::Deserialize;

use crate::graph::GraphRewrite;

/// Which of the versions on disk are served.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VersionPolicy {
    /// The highest `n` version numbers.
    Latest(usize),
    /// Every version present.
    All,
    /// Exactly these versions (those present).
    Specific(Vec<u64>),
}

impl Default for VersionPolicy {
    fn default() -> Self {
        Self::Latest(1)
    }
}

impl VersionPolicy {
    /// The versions to serve out of those available (any order), highest first.
    pub fn select(&self, available: &[u64]) -> Vec<u64> {
        let mut sorted = available.to_vec();
        sorted.sort_unstable_by(|a, b| b.cmp(a));
        sorted.dedup();
        match self {
            Self::Latest(n) => sorted.into_iter().take(*n).collect(),
            Self::All => sorted,
            Self::Specific(wanted) => sorted.into_iter().filter(|v| wanted.contains(v)).collect(),
        }
    }
}

/// Everything needed to serve one model, besides its weights: the configurations of the
/// crates that run it, nested as they are (a new engine, session or detector setting is
/// added to its own crate's config and to the files that set it, never copied here), and
/// the registry's own choices around them.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelSettings {
    /// How each version's engine runs. Its `name` and `version` are not read from here:
    /// the loader fills in each version's own.
    pub engine: EngineConfig,
    /// How each instance's ONNX Runtime session is built.
    pub session: SessionConfig,
    /// The GPUs a GPU provider's instances are spread over, `engine.instances` on each
    /// (as Triton's `instance_group` counts them); empty: the provider's one device.
    pub gpus: Vec<i32>,
    /// How each instance's detector is built. Its `max_batch` is not read from here: a
    /// detector takes the batch policy's (`engine.policy.max_batch`), so one key sets both
    /// (see [`ModelSettings::detector_config`]).
    pub detector: DetectorConfig,
    /// Run on the CPU when the session's provider cannot load (logged).
    pub provider_fallback: bool,
    /// Rewrite the graph at load time (uint8 input, top-K candidates out).
    pub graph_rewrite: GraphRewrite,
    /// Candidate rows per image the rewritten graph returns.
    pub top_k: usize,
    /// One session per run batch size (`detector.run_sizes`), so that no session's input
    /// shape ever changes (GPU providers re-prepare their kernels on every change).
    pub session_per_batch_size: bool,
    /// With `session_per_batch_size`, fix each session's input shape in its graph, so that
    /// ONNX Runtime folds the model's shape arithmetic instead of running it on the CPU
    /// at every run (see `graph::fixed_shape_weights`).
    pub fixed_input_shapes: bool,
    /// One session whose graph's input is fixed at this many images, which every batch is
    /// padded to (`peregrine model-bench --fixed-shapes`; no config key sets it).
    pub fixed_batch: Option<usize>,
    pub version_policy: VersionPolicy,
    /// File name of the weights inside each version directory.
    pub model_file: String,
    /// Longest a new version may take to load and warm up before it counts as failed.
    pub load_timeout: Duration,
    /// Roll a new version out as a canary beside the serving one (`[rollout]`); `None`
    /// swaps it in at once.
    pub rollout: Option<crate::rollout::RolloutPolicy>,
    /// The model (of the same repository) that serves requests this one cannot answer
    /// within its objective or their deadline, unless they say `fallback=false`.
    pub fallback: Option<String>,
    /// Calibrate an INT8 version from the served canvases (`calibration`); `None`: off.
    pub calibration: Option<crate::calibration::OnlineCalibration>,
}

impl Default for ModelSettings {
    fn default() -> Self {
        Self {
            engine: EngineConfig::default(),
            session: SessionConfig {
                pinned_input: true,
                ..SessionConfig::default()
            },
            detector: DetectorConfig::default(),
            gpus: Vec::new(),
            provider_fallback: false,
            graph_rewrite: GraphRewrite::Auto,
            top_k: peregrine_onnx::DEFAULT_TOP_K,
            session_per_batch_size: false,
            fixed_input_shapes: true,
            fixed_batch: None,
            version_policy: VersionPolicy::default(),
            model_file: "model.onnx".into(),
            load_timeout: Duration::from_secs(300),
            rollout: None,
            fallback: None,
            calibration: None,
        }
    }
}

/// A model's `config.toml`: every key optional, each overriding the server's default.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ModelConfigFile {
    /// Instances on each device (each listed GPU with a GPU provider).
    pub instances: Option<usize>,
    /// `instances`, under the name that says it counts per GPU; give one or the other.
    pub instances_per_gpu: Option<usize>,
    pub threads: Option<usize>,
    pub spin_wait: Option<bool>,
    pub max_batch: Option<usize>,
    pub max_queue_delay_us: Option<u64>,
    pub preferred_batch_sizes: Option<Vec<usize>>,
    pub queue_capacity: Option<usize>,
    pub max_in_flight: Option<usize>,
    pub imgsz: Option<[usize; 2]>,
    pub conf: Option<f32>,
    pub iou: Option<f32>,
    pub max_det: Option<usize>,
    pub version_policy: Option<VersionPolicy>,
    pub model_file: Option<String>,
    pub load_timeout_s: Option<u64>,
    /// `auto`, `on` or `off`.
    pub graph_rewrite: Option<String>,
    pub top_k: Option<usize>,
    pub padded_batch_sizes: Option<Vec<usize>>,
    pub session_per_batch_size: Option<bool>,
    pub fixed_input_shapes: Option<bool>,
    pub jpeg_dct_scaling: Option<bool>,
    pub provider: Option<ProviderFile>,
    /// The latency objective (`[slo]`), over the server's.
    pub slo: Option<crate::slo::SloFile>,
    /// Roll new versions out as canaries (`[rollout]`).
    pub rollout: Option<crate::rollout::RolloutFile>,
    /// The model that takes requests this one cannot serve in time.
    pub fallback: Option<String>,
    /// Online INT8 calibration (`calibration = { mode = "online", ... }`).
    pub calibration: Option<crate::calibration::CalibrationFile>,
}

/// `[provider]` in a model's `config.toml`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ProviderFile {
    /// `cpu`, `cuda` or `tensorrt`.
    pub kind: String,
    pub fallback: Option<bool>,
    pub pinned_input: Option<bool>,
    pub device_io: Option<bool>,
    pub gpu_jpeg_decode: Option<bool>,
    pub gpu_frames: Option<bool>,
    pub device_id: i32,
    /// Spread the instances over these GPUs (instead of `device_id`'s one).
    pub gpus: Option<Vec<i32>>,
    pub memory_limit: Option<usize>,
    pub cudnn_exhaustive: bool,
    pub prefer_nhwc: bool,
    pub cuda_graph: bool,
    pub trt_fp16: bool,
    pub trt_int8: bool,
    /// Relative paths are taken from the model's directory.
    pub trt_int8_calibration_table: Option<PathBuf>,
    pub trt_engine_cache: Option<PathBuf>,
    pub trt_timing_cache: Option<PathBuf>,
}

/// A model's configuration that cannot be used, with what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SettingsError(pub String);

impl ModelConfigFile {
    pub fn parse(text: &str) -> Result<Self, SettingsError> {
        toml::from_str(text).map_err(|e| SettingsError(format!("config.toml: {}", e.message())))
    }
}

impl ProviderFile {
    fn provider(&self, model_dir: &Path) -> Result<ExecutionProvider, SettingsError> {
        let path = |p: &Option<PathBuf>| p.as_ref().map(|p| model_dir.join(p));
        Ok(match self.kind.as_str() {
            "" | "cpu" => ExecutionProvider::Cpu,
            "cuda" => ExecutionProvider::Cuda(CudaOptions {
                device_id: self.device_id,
                memory_limit: self.memory_limit,
                exhaustive_conv_search: self.cudnn_exhaustive,
                prefer_nhwc: self.prefer_nhwc,
                cuda_graph: self.cuda_graph,
            }),
            "tensorrt" => ExecutionProvider::TensorRt(TensorRtOptions {
                device_id: self.device_id,
                fp16: self.trt_fp16,
                int8: self.trt_int8,
                int8_calibration_table: path(&self.trt_int8_calibration_table),
                engine_cache: path(&self.trt_engine_cache),
                timing_cache: path(&self.trt_timing_cache),
            }),
            other => {
                return Err(SettingsError(format!(
                    "provider kind {other:?} is not one of cpu, cuda, tensorrt"
                )))
            }
        })
    }
}

impl ModelSettings {
    /// These settings with a model's file laid over them, validated. `model_dir` anchors
    /// relative paths in the file.
    pub fn overlay(&self, file: &ModelConfigFile, model_dir: &Path) -> Result<Self, SettingsError> {
        let mut s = self.clone();
        // `take!(table; key => place)` sets the place when the table has the key.
        macro_rules! take {
            ($table:expr; $($key:ident => $($place:ident).+),* $(,)?) => {
                $( if let Some(v) = $table.$key.clone() { s.$($place).+ = v; } )*
            };
        }
        take!(file;
            instances => engine.instances,
            max_in_flight => engine.max_in_flight,
            jpeg_dct_scaling => engine.jpeg_dct_scaling,
            max_batch => engine.policy.max_batch,
            preferred_batch_sizes => engine.policy.preferred,
            queue_capacity => engine.policy.capacity,
            conf => engine.defaults.conf,
            iou => engine.defaults.iou,
            max_det => engine.defaults.max_det,
            threads => session.intra_threads,
            padded_batch_sizes => detector.run_sizes,
            version_policy => version_policy,
            model_file => model_file,
            top_k => top_k,
            session_per_batch_size => session_per_batch_size,
            fixed_input_shapes => fixed_input_shapes,
        );
        match (file.instances, file.instances_per_gpu) {
            (Some(_), Some(_)) => {
                return Err(SettingsError(
                    "instances and instances_per_gpu are the same setting: give one".into(),
                ))
            }
            (None, Some(n)) => s.engine.instances = n,
            _ => {}
        }
        if let Some(v) = &file.graph_rewrite {
            s.graph_rewrite = v.parse().map_err(SettingsError)?;
        }
        if file.spin_wait.is_some() {
            s.session.intra_op_spinning = file.spin_wait;
        }
        if let Some(v) = file.max_queue_delay_us {
            s.engine.policy.max_delay = Duration::from_micros(v);
        }
        if let Some([h, w]) = file.imgsz {
            s.detector.imgsz = Some((h, w));
        }
        if let Some(v) = file.load_timeout_s {
            s.load_timeout = Duration::from_secs(v);
        }
        if let Some(slo) = &file.slo {
            slo.apply(&mut s.engine.objective)?;
        }
        if let Some(name) = &file.fallback {
            crate::store::check_name(name).map_err(|e| SettingsError(format!("fallback: {e}")))?;
            s.fallback = Some(name.clone());
        }
        if let Some(c) = &file.calibration {
            s.calibration = c.resolve(model_dir)?;
        }
        if let Some(r) = &file.rollout {
            s.rollout = Some(r.apply(&s.rollout.clone().unwrap_or_default())?);
        }
        if let Some(p) = &file.provider {
            s.session.provider = p.provider(model_dir)?;
            if let Some(gpus) = &p.gpus {
                if p.device_id != 0 {
                    return Err(SettingsError(
                        "[provider] gives both device_id and gpus: give gpus alone".into(),
                    ));
                }
                s.gpus = gpus.clone();
            }
            take!(p;
                fallback => provider_fallback,
                pinned_input => session.pinned_input,
                device_io => session.device_io,
                gpu_jpeg_decode => session.gpu_jpeg_decode,
                gpu_frames => session.gpu_frames,
            );
        }
        s.validate()?;
        Ok(s)
    }

    /// The detector configuration the settings call for: `detector`, at the batch policy's
    /// most images per run.
    pub fn detector_config(&self) -> DetectorConfig {
        DetectorConfig {
            max_batch: self.engine.policy.max_batch,
            ..self.detector.clone()
        }
    }

    /// The GPU the model runs on, if its provider is a GPU one (the first listed in
    /// `gpus`, when it lists several).
    pub fn gpu_device(&self) -> Option<i32> {
        self.gpu_devices().first().copied()
    }

    /// Every GPU the model runs on: `gpus`, or the provider's one device; none on the CPU.
    pub fn gpu_devices(&self) -> Vec<i32> {
        match self.session.provider.device() {
            None => Vec::new(),
            Some(_) if !self.gpus.is_empty() => self.gpus.clone(),
            Some(device) => vec![device],
        }
    }

    /// Each instance's device, by instance number: `engine.instances` per GPU, taken in
    /// turn (0, 1, 0, 1, ...) so that the first instances to ask for work, and so the
    /// first batches, land on different GPUs. `None` on the CPU.
    pub fn instance_devices(&self) -> Vec<Option<i32>> {
        let per_device = self.engine.instances.max(1);
        let gpus = self.gpu_devices();
        if gpus.is_empty() {
            return vec![None; per_device];
        }
        (0..per_device)
            .flat_map(|_| gpus.iter().map(|&g| Some(g)))
            .collect()
    }

    /// Checks every bound; messages name the key and what it must be.
    /// `gpus` lists each GPU once, numbers CUDA can have, and only with a GPU provider.
    fn validate_gpus(&self) -> Result<(), SettingsError> {
        if self.gpus.is_empty() {
            return Ok(());
        }
        if self.session.provider.device().is_none() {
            return Err(SettingsError(
                "gpus needs a GPU provider (cuda or tensorrt)".into(),
            ));
        }
        for (i, g) in self.gpus.iter().enumerate() {
            if *g < 0 {
                return Err(SettingsError(format!("gpus lists {g}: GPU numbers start at 0")));
            }
            if self.gpus[..i].contains(g) {
                return Err(SettingsError(format!(
                    "gpus lists GPU {g} twice: list each GPU once and set instances_per_gpu"
                )));
            }
        }
        Ok(())
    }

    pub fn validate(&self) -> Result<(), SettingsError> {
        if self.session.gpu_jpeg_decode && self.gpu_device().is_none() {
            return Err(SettingsError(
                "gpu_jpeg_decode needs a GPU provider (cuda or tensorrt)".into(),
            ));
        }
        if self.session.gpu_frames && self.gpu_device().is_none() {
            return Err(SettingsError(
                "gpu_frames needs a GPU provider (cuda or tensorrt)".into(),
            ));
        }
        self.validate_gpus()?;
        let engine = &self.engine;
        let positive = [
            ("instances", engine.instances),
            ("max_batch", engine.policy.max_batch),
            ("queue_capacity", engine.policy.capacity),
            ("max_in_flight", engine.max_in_flight),
            ("preprocess_threads", engine.preprocess_threads),
        ];
        for (name, v) in positive {
            if v == 0 {
                return Err(SettingsError(format!("{name} must be at least 1")));
            }
        }
        let max_batch = engine.policy.max_batch;
        let outside = |sizes: &[usize]| sizes.iter().copied().find(|&p| p == 0 || p > max_batch);
        if let Some(p) = outside(&engine.policy.preferred) {
            return Err(SettingsError(format!(
                "preferred batch size {p} is outside 1..={max_batch} (max_batch)"
            )));
        }
        if let Some(p) = outside(&self.detector.run_sizes) {
            return Err(SettingsError(format!(
                "padded batch size {p} is outside 1..={max_batch} (max_batch)"
            )));
        }
        if self.top_k == 0 {
            return Err(SettingsError("top_k must be at least 1".into()));
        }
        if matches!(self.version_policy, VersionPolicy::Latest(0)) {
            return Err(SettingsError("version_policy latest must be at least 1".into()));
        }
        if self.model_file.is_empty() || self.model_file.contains('/') || self.model_file == ".." {
            return Err(SettingsError(format!(
                "model_file {:?} must be a plain file name inside the version directory",
                self.model_file
            )));
        }
        engine
            .defaults
            .validate()
            .map_err(|e| SettingsError(format!("default thresholds: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_pick_versions_highest_first() {
        let on_disk = [3, 1, 10, 2];
        assert_eq!(VersionPolicy::Latest(1).select(&on_disk), [10]);
        assert_eq!(VersionPolicy::Latest(2).select(&on_disk), [10, 3]);
        assert_eq!(VersionPolicy::All.select(&on_disk), [10, 3, 2, 1]);
        assert_eq!(VersionPolicy::Specific(vec![2, 7]).select(&on_disk), [2]);
    }

    #[test]
    fn gpu_jpeg_decoding_needs_a_gpu_provider() {
        let mut cpu = ModelSettings::default();
        cpu.session.gpu_jpeg_decode = true;
        let err = cpu.validate().unwrap_err();
        assert!(
            err.to_string().contains("gpu_jpeg_decode needs a GPU provider"),
            "{err}"
        );
        let mut cuda = cpu;
        cuda.session.provider = ExecutionProvider::Cuda(Default::default());
        cuda.validate().unwrap();
    }

    #[test]
    fn gpu_frames_need_a_gpu_provider_and_come_from_the_provider_table() {
        let mut cpu = ModelSettings::default();
        cpu.session.gpu_frames = true;
        let err = cpu.validate().unwrap_err();
        assert!(
            err.to_string().contains("gpu_frames needs a GPU provider"),
            "{err}"
        );
        let file = ModelConfigFile::parse("[provider]\nkind = \"cuda\"\ngpu_frames = true\n").unwrap();
        let settings = ModelSettings::default().overlay(&file, std::path::Path::new("."));
        assert!(settings.unwrap().session.gpu_frames);
    }

    #[test]
    fn a_config_file_overrides_defaults_and_is_validated() {
        let file = ModelConfigFile::parse(
            r#"
max_batch = 8
preferred_batch_sizes = [4, 8]
max_queue_delay_us = 1500
instances = 2
imgsz = [320, 480]
conf = 0.4
version_policy = { latest = 2 }

[provider]
kind = "tensorrt"
trt_fp16 = true
trt_engine_cache = "trt-cache"
"#,
        )
        .unwrap();
        let s = ModelSettings::default()
            .overlay(&file, Path::new("/repo/m"))
            .unwrap();
        assert_eq!(s.engine.policy.max_batch, 8);
        assert_eq!(s.engine.policy.max_delay, Duration::from_micros(1500));
        assert_eq!((s.engine.instances, s.detector.imgsz), (2, Some((320, 480))));
        assert_eq!(s.engine.defaults.conf, 0.4);
        assert_eq!(s.version_policy, VersionPolicy::Latest(2));
        match s.session.provider {
            ExecutionProvider::TensorRt(o) => {
                assert!(o.fp16);
                assert_eq!(o.engine_cache, Some(PathBuf::from("/repo/m/trt-cache")));
            }
            other => panic!("{other:?}"),
        }
        let all = ModelConfigFile::parse("version_policy = \"all\"").unwrap();
        assert_eq!(all.version_policy, Some(VersionPolicy::All));
    }

    #[test]
    fn the_readme_example_is_a_valid_model_config() {
        let readme = include_str!("../../../README.md");
        let marker = "# DIR/<model>/config.toml";
        let start = readme.find(marker).expect("README has a model config example");
        let end = start + readme[start..].find("```").unwrap();
        let file = ModelConfigFile::parse(&readme[start..end]).unwrap();
        let s = ModelSettings::default()
            .overlay(&file, Path::new("/repo/m"))
            .unwrap();
        assert_eq!((s.engine.policy.max_batch, s.engine.instances), (8, 2));
        assert!(matches!(s.session.provider, ExecutionProvider::Cuda(_)));
        let objective = s.engine.objective.expect("the example sets an objective");
        assert_eq!(objective.p99, Duration::from_millis(100));
        assert!(objective.adaptive_batching);
        assert_eq!(s.fallback.as_deref(), Some("yolo11n-320"));
        let rollout = s.rollout.expect("the example rolls versions out");
        assert_eq!(
            (rollout.canary_percent, rollout.max_p99),
            (10, Some(Duration::from_millis(150)))
        );
    }

    #[test]
    fn bad_config_files_say_what_is_wrong() {
        let file = ModelConfigFile::parse("fallback = \"../other\"").unwrap();
        let err = ModelSettings::default()
            .overlay(&file, Path::new("."))
            .unwrap_err();
        assert!(
            err.0
                .starts_with("fallback: model name \"../other\" is not allowed"),
            "{err}"
        );
        let err = ModelConfigFile::parse("max_bach = 8").unwrap_err();
        assert!(err.0.contains("unknown field `max_bach`"), "{err}");
        let file = ModelConfigFile::parse("max_batch = 2\npreferred_batch_sizes = [4]").unwrap();
        let err = ModelSettings::default()
            .overlay(&file, Path::new("."))
            .unwrap_err();
        assert!(err.0.contains("preferred batch size 4 is outside 1..=2"), "{err}");
        let file = ModelConfigFile::parse("conf = 1.5").unwrap();
        let err = ModelSettings::default()
            .overlay(&file, Path::new("."))
            .unwrap_err();
        assert!(err.0.contains("conf"), "{err}");
        let file = ModelConfigFile::parse("[slo]\nwindow_s = 30").unwrap();
        let err = ModelSettings::default()
            .overlay(&file, Path::new("."))
            .unwrap_err();
        assert!(err.0.contains("set slo.p99_ms"), "{err}");
        let file = ModelConfigFile::parse("[provider]\nkind = \"rocm\"").unwrap();
        let err = ModelSettings::default()
            .overlay(&file, Path::new("."))
            .unwrap_err();
        assert!(
            err.0.contains("\"rocm\" is not one of cpu, cuda, tensorrt"),
            "{err}"
        );
    }

    fn overlaid(text: &str) -> Result<ModelSettings, SettingsError> {
        ModelSettings::default().overlay(&ModelConfigFile::parse(text)?, Path::new("."))
    }

    #[test]
    fn instances_are_spread_over_the_listed_gpus_in_turn() {
        let s = overlaid("instances_per_gpu = 2\n[provider]\nkind = \"cuda\"\ngpus = [1, 0]").unwrap();
        assert_eq!(s.gpu_devices(), vec![1, 0]);
        assert_eq!(s.instance_devices(), vec![Some(1), Some(0), Some(1), Some(0)]);
        assert_eq!(s.gpu_device(), Some(1));
        let one = overlaid("instances = 3\n[provider]\nkind = \"cuda\"\ndevice_id = 2").unwrap();
        assert_eq!(one.instance_devices(), vec![Some(2); 3]);
        let cpu = overlaid("instances = 2").unwrap();
        assert_eq!(cpu.instance_devices(), vec![None, None]);
    }

    #[test]
    fn bad_gpu_lists_say_what_is_wrong() {
        let err = |text: &str| overlaid(text).unwrap_err().0;
        assert!(err("[provider]\ngpus = [0, 1]").contains("gpus needs a GPU provider"));
        assert!(err("[provider]\nkind = \"cuda\"\ngpus = [0, 0]").contains("lists GPU 0 twice"));
        assert!(err("[provider]\nkind = \"cuda\"\ngpus = [-1]").contains("start at 0"));
        assert!(err("[provider]\nkind = \"cuda\"\ndevice_id = 1\ngpus = [0, 1]")
            .contains("both device_id and gpus"));
        assert!(err("instances = 1\ninstances_per_gpu = 2").contains("the same setting"));
    }
}
