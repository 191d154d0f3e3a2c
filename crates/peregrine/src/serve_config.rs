//! `peregrine serve` settings: defaults, the optional TOML file, then flags and env vars.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use peregrine_engine::BatchPolicy;
use peregrine_registry::ModelSettings;
use peregrine_vision::DecodeLimits;
use serde::Deserialize;

/// Every serve setting, as the config file spells it. Missing keys take the defaults.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServeSettings {
    pub host: String,
    pub port: u16,
    pub grpc_port: u16,
    pub allow_grpc: bool,
    /// ONNX model file; empty for the embedded YOLO11n.
    pub model: Option<PathBuf>,
    pub model_name: Option<String>,
    pub model_version: u64,
    pub model_repository: Option<PathBuf>,
    pub repository_poll_secs: u64,
    pub load_model: Vec<String>,
    pub default_model: Option<String>,
    pub imgsz: Option<(usize, usize)>,
    pub instances: usize,
    pub threads: usize,
    pub spin_wait: Option<bool>,
    pub max_batch: usize,
    pub max_queue_delay_us: u64,
    pub preferred_batch_sizes: Vec<usize>,
    pub padded_batch_sizes: Vec<usize>,
    pub session_per_batch_size: bool,
    pub fixed_input_shapes: bool,
    pub queue_capacity: usize,
    pub max_in_flight: usize,
    pub preprocess_threads: usize,
    pub request_timeout_ms: u64,
    pub max_request_timeout_ms: u64,
    pub max_body_bytes: usize,
    pub body_timeout_ms: u64,
    pub max_pixels: u64,
    pub jpeg_dct_scaling: bool,
    pub shed_on_backlog: bool,
    pub shutdown_timeout_s: u64,
    pub malloc_mmap_threshold: usize,
    pub ort_lib: Option<PathBuf>,
    /// Model the video streams' frames go to [default: the only model].
    pub stream_model: Option<String>,
    /// Decoder of the streams that name none: auto, cpu or nvdec.
    pub video_decoder: peregrine_video::DecoderKind,
    /// Video streams started with the server (`[[streams]]`; more can be added at run time).
    pub streams: Vec<peregrine_video::StreamConfig>,
    /// MQTT broker the streams' detections are published to (`[mqtt]`).
    pub mqtt: Option<peregrine_video::MqttConfig>,
    /// HTTP endpoints the streams' detections are POSTed to (`[[webhooks]]`).
    pub webhooks: Vec<peregrine_video::WebhookConfig>,
    /// Where object events and snapshots are kept (`[events]`).
    pub events: crate::events_config::EventsSettings,
    /// HTTPS and gRPC over TLS (`[tls]`).
    pub tls: crate::tls_config::TlsSettings,
    /// Which of the configured streams this server runs (`[shard]`).
    pub shard: crate::shard_config::ShardSettings,
    /// Which stream URLs may be opened (`[stream_policy]`).
    pub stream_policy: crate::stream_policy_config::StreamPolicySettings,
    /// The GB28181 SIP server for `gb28181://` streams (`[gb28181]`; off by default).
    pub gb28181: crate::gb28181_config::Gb28181Settings,
    /// API keys and what may be served without them (`[auth]`).
    pub auth: crate::auth_config::AuthSettings,
    /// Every model's latency objective unless its config.toml sets its own (`[slo]`).
    pub slo: peregrine_registry::SloFile,
    /// Live CPU profiles over the admin API (`[profiling]`).
    pub profiling: crate::profiling_config::ProfilingSettings,
    #[serde(skip)]
    pub provider: crate::provider_args::ProviderArgs,
}

impl Default for ServeSettings {
    /// A model's defaults are the registry's (`ModelSettings::default`), except where the
    /// server knows better.
    fn default() -> Self {
        let model = ModelSettings::default();
        let engine = &model.engine;
        Self {
            host: "127.0.0.1".into(),
            port: 8080,
            grpc_port: 8001,
            allow_grpc: true,
            model: None,
            model_name: None,
            model_version: 1,
            model_repository: None,
            repository_poll_secs: 0,
            load_model: Vec::new(),
            default_model: None,
            imgsz: model.detector.imgsz,
            instances: engine.instances,
            threads: model.session.intra_threads,
            // Measured on the 2-core VM (docs/benchmarks.md): with decoding on the same cores,
            // sleeping idle threads beat spinning ones.
            spin_wait: Some(false),
            max_batch: engine.policy.max_batch,
            max_queue_delay_us: u64::try_from(engine.policy.max_delay.as_micros()).unwrap_or(u64::MAX),
            preferred_batch_sizes: engine.policy.preferred.clone(),
            padded_batch_sizes: model.detector.run_sizes.clone(),
            session_per_batch_size: model.session_per_batch_size,
            fixed_input_shapes: model.fixed_input_shapes,
            queue_capacity: engine.policy.capacity,
            max_in_flight: engine.max_in_flight,
            preprocess_threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
            request_timeout_ms: 10_000,
            max_request_timeout_ms: 60_000,
            max_body_bytes: 32 << 20,
            body_timeout_ms: 30_000,
            max_pixels: engine.decode_limits.max_pixels,
            jpeg_dct_scaling: engine.jpeg_dct_scaling,
            shed_on_backlog: engine.shed_on_backlog,
            shutdown_timeout_s: 30,
            malloc_mmap_threshold: 1 << 20,
            ort_lib: model.session.runtime_path.clone(),
            stream_model: None,
            video_decoder: Default::default(),
            streams: Vec::new(),
            mqtt: None,
            webhooks: Vec::new(),
            events: Default::default(),
            tls: Default::default(),
            shard: Default::default(),
            stream_policy: Default::default(),
            gb28181: Default::default(),
            auth: Default::default(),
            slo: Default::default(),
            profiling: Default::default(),
            provider: Default::default(),
        }
    }
}

/// Flags of `peregrine serve`. Each overrides the config file; unset ones keep it.
#[derive(Debug, Args, Default)]
pub struct ServeArgs {
    /// TOML file with any of the settings below (same names, with underscores).
    #[arg(long, env = "PEREGRINE_CONFIG")]
    pub config: Option<PathBuf>,
    /// Address to listen on; any other than loopback needs API keys (or --allow-anonymous)
    /// [default: 127.0.0.1].
    #[arg(long, env = "PEREGRINE_HOST")]
    pub host: Option<String>,
    /// HTTP port (REST: /v1 and KServe v2) [default: 8080].
    #[arg(long, env = "PEREGRINE_PORT")]
    pub port: Option<u16>,
    /// gRPC port (KServe v2 / Triton's GRPCInferenceService and grpc.health.v1)
    /// [default: 8001].
    #[arg(long, env = "PEREGRINE_GRPC_PORT")]
    pub grpc_port: Option<u16>,
    /// Serve gRPC at all [default: true].
    #[arg(long, env = "PEREGRINE_ALLOW_GRPC")]
    pub allow_grpc: Option<bool>,
    /// ONNX model file, served alone [default: the embedded YOLO11n]. Not with
    /// --model-repository.
    #[arg(long, env = "PEREGRINE_MODEL", conflicts_with = "model_repository")]
    pub model: Option<PathBuf>,
    /// Name clients use for the model of --model [default: the file's stem, or yolo11n].
    #[arg(long, env = "PEREGRINE_MODEL_NAME")]
    pub model_name: Option<String>,
    /// Version of the model of --model [default: 1].
    #[arg(long, env = "PEREGRINE_MODEL_VERSION")]
    pub model_version: Option<u64>,
    /// A Triton-style model repository: DIR/<model>/<version>/model.onnx, each model with
    /// an optional DIR/<model>/config.toml. Models load, reload and unload through the
    /// repository API (and by polling, with --repository-poll-secs).
    #[arg(long, env = "PEREGRINE_MODEL_REPOSITORY")]
    pub model_repository: Option<PathBuf>,
    /// Rescan the repository this often, in seconds, loading new and changed versions and
    /// models and unloading removed ones; 0 loads only at start and on request
    /// [default: 0].
    #[arg(long, env = "PEREGRINE_REPOSITORY_POLL_SECS")]
    pub repository_poll_secs: Option<u64>,
    /// Load only these repository models at start (repeat, or comma separated); the others
    /// wait for a load request [default: every model].
    #[arg(long, env = "PEREGRINE_LOAD_MODEL", value_delimiter = ',')]
    pub load_model: Option<Vec<String>>,
    /// Model the video streams' frames go to [default: the only model]. Streams themselves
    /// are defined in the config file (`[[streams]]`) or added at run time (POST
    /// /v1/streams).
    #[arg(long, env = "PEREGRINE_STREAM_MODEL")]
    pub stream_model: Option<String>,
    /// Decoder of the video streams that name none (a stream's own `decoder` wins): `auto`
    /// decodes with NVDEC on the models' GPU (cuda, tensorrt providers) where NVDEC takes
    /// the stream and on the CPU otherwise; `cpu`; `nvdec` (no fallback) [default: auto].
    #[arg(long, env = "PEREGRINE_VIDEO_DECODER")]
    pub video_decoder: Option<peregrine_video::DecoderKind>,
    /// Model of /v1/detect requests that name none [default: the only model, when there is
    /// one].
    #[arg(long, env = "PEREGRINE_DEFAULT_MODEL")]
    pub default_model: Option<String>,
    /// Input size HEIGHT[,WIDTH] for models with dynamic input size.
    #[arg(long, env = "PEREGRINE_IMGSZ", value_parser = crate::cli::parse_imgsz)]
    pub imgsz: Option<(usize, usize)>,
    /// Model instances (ONNX Runtime sessions), each on its own thread [default: 1].
    #[arg(long, env = "PEREGRINE_INSTANCES")]
    pub instances: Option<usize>,
    /// ONNX Runtime intra-op threads per instance, 0 for one per core [default: 0].
    #[arg(long, env = "PEREGRINE_THREADS")]
    pub threads: Option<usize>,
    /// Whether ONNX Runtime's idle intra-op threads spin (true) or sleep (false)
    /// [default: false, since decoding shares the cores].
    #[arg(long, env = "PEREGRINE_SPIN_WAIT")]
    pub spin_wait: Option<bool>,
    /// Most images in one model run [default: 4].
    #[arg(long, env = "PEREGRINE_MAX_BATCH")]
    pub max_batch: Option<usize>,
    /// Longest a request waits for others to batch with, in microseconds. With 0, batches
    /// form only from requests already waiting, which adds no latency at low load; GPUs
    /// want 1000-2000 [default: 0].
    #[arg(long, env = "PEREGRINE_MAX_QUEUE_DELAY_US")]
    pub max_queue_delay_us: Option<u64>,
    /// Batch sizes to prefer when the delay expires, comma separated.
    #[arg(long, env = "PEREGRINE_PREFERRED_BATCH_SIZES", value_delimiter = ',')]
    pub preferred_batch_sizes: Option<Vec<usize>>,
    /// Batch sizes the model runs at, comma separated: a smaller batch is padded up to the
    /// next (max batch is always one). Fewer shapes warm up faster on GPUs [default: every
    /// size from 1 to max batch].
    #[arg(long, env = "PEREGRINE_PADDED_BATCH_SIZES", value_delimiter = ',')]
    pub padded_batch_sizes: Option<Vec<usize>>,
    /// One ONNX Runtime session per padded batch size, so no session's input shape ever
    /// changes: CUDA re-prepares its convolutions on every change, which costs seconds per
    /// batch when sizes alternate [default: false].
    #[arg(long, env = "PEREGRINE_SESSION_PER_BATCH_SIZE")]
    pub session_per_batch_size: Option<bool>,
    /// With one session per batch size, fix each session's input shape in its graph, so
    /// ONNX Runtime folds the model's shape arithmetic instead of computing it on the CPU
    /// (with copies to and from the GPU) at every run [default: true].
    #[arg(long, env = "PEREGRINE_FIXED_INPUT_SHAPES")]
    pub fixed_input_shapes: Option<bool>,
    /// Images waiting for a model before new ones get 429 [default: 64].
    #[arg(long, env = "PEREGRINE_QUEUE_CAPACITY")]
    pub queue_capacity: Option<usize>,
    /// Requests admitted at once (reading, decoding, queued, running) before new ones get
    /// 429 [default: 128].
    #[arg(long, env = "PEREGRINE_MAX_IN_FLIGHT")]
    pub max_in_flight: Option<usize>,
    /// Images decoded and letterboxed at once [default: the number of cores].
    #[arg(long, env = "PEREGRINE_PREPROCESS_THREADS")]
    pub preprocess_threads: Option<usize>,
    /// Deadline of a request that sets none, in ms [default: 10000].
    #[arg(long, env = "PEREGRINE_REQUEST_TIMEOUT_MS")]
    pub request_timeout_ms: Option<u64>,
    /// Longest deadline a request may set, in ms [default: 60000].
    #[arg(long, env = "PEREGRINE_MAX_REQUEST_TIMEOUT_MS")]
    pub max_request_timeout_ms: Option<u64>,
    /// Largest request body, in bytes [default: 33554432].
    #[arg(long, env = "PEREGRINE_MAX_BODY_BYTES")]
    pub max_body_bytes: Option<usize>,
    /// Longest a client may take to send its body, in ms [default: 30000].
    #[arg(long, env = "PEREGRINE_BODY_TIMEOUT_MS")]
    pub body_timeout_ms: Option<u64>,
    /// Largest image in pixels, checked before decoding [default: 50000000].
    #[arg(long, env = "PEREGRINE_MAX_PIXELS")]
    pub max_pixels: Option<u64>,
    /// Decode JPEGs over twice the model's input size at 1/2, 1/4 or 1/8 scale
    /// (libjpeg-turbo's scaled IDCT) before letterboxing: far less decoding work for large
    /// photos and frames, pixels slightly different from Ultralytics' full decode and
    /// resize [default: false].
    #[arg(long, env = "PEREGRINE_JPEG_DCT_SCALING")]
    pub jpeg_dct_scaling: Option<bool>,
    /// Answer 429 at once when the queued work already exceeds a request's deadline,
    /// rather than queueing it to end in 504 [default: true].
    #[arg(long, env = "PEREGRINE_SHED_ON_BACKLOG")]
    pub shed_on_backlog: Option<bool>,
    /// Longest the server waits for in-flight requests after SIGTERM/SIGINT, in s
    /// [default: 30].
    #[arg(long, env = "PEREGRINE_SHUTDOWN_TIMEOUT_S")]
    pub shutdown_timeout_s: Option<u64>,
    /// Allocations of at least this many bytes get their own memory mapping, returned to
    /// the system when freed (keeps model reloads from fragmenting the heap); 0 keeps
    /// glibc's adaptive default [default: 1048576].
    #[arg(long, env = "PEREGRINE_MALLOC_MMAP_THRESHOLD")]
    pub malloc_mmap_threshold: Option<usize>,
    /// Path of libonnxruntime.so [default: the copy `make setup` fetched].
    #[arg(long, env = "ORT_DYLIB_PATH")]
    pub ort_lib: Option<PathBuf>,
    /// Execution provider (flags and environment only, not the config file).
    #[command(flatten)]
    pub provider: crate::provider_args::ProviderArgs,
    #[command(flatten)]
    pub events: crate::events_config::EventsArgs,
    #[command(flatten)]
    pub tls: crate::tls_config::TlsArgs,
    #[command(flatten)]
    pub shard: crate::shard_config::ShardArgs,
    #[command(flatten)]
    pub stream_policy: crate::stream_policy_config::StreamPolicyArgs,
    #[command(flatten)]
    pub gb28181: crate::gb28181_config::Gb28181Args,
    #[command(flatten)]
    pub auth: crate::auth_config::AuthArgs,
    #[command(flatten)]
    pub slo: crate::slo_config::SloArgs,
    #[command(flatten)]
    pub profiling: crate::profiling_config::ProfilingArgs,
}

fn read_file(path: &Path) -> Result<ServeSettings> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading config file {}", path.display()))?;
    toml::from_str(&text).with_context(|| format!("config file {}", path.display()))
}

impl ServeArgs {
    /// Defaults, then the file, then flags and environment.
    pub fn resolve(mut self) -> Result<ServeSettings> {
        let provider = std::mem::take(&mut self.provider);
        let events = std::mem::take(&mut self.events);
        let tls = std::mem::take(&mut self.tls);
        let shard = std::mem::take(&mut self.shard);
        let stream_policy = std::mem::take(&mut self.stream_policy);
        let gb28181 = std::mem::take(&mut self.gb28181);
        let auth = std::mem::take(&mut self.auth);
        let slo = std::mem::take(&mut self.slo);
        let profiling = std::mem::take(&mut self.profiling);
        let mut s = match &self.config {
            Some(p) => read_file(p)?,
            None => ServeSettings::default(),
        };
        macro_rules! take {
            ($($field:ident),*) => { $( if let Some(v) = self.$field { s.$field = v; } )* };
        }
        macro_rules! take_opt {
            ($($field:ident),*) => { $( if self.$field.is_some() { s.$field = self.$field; } )* };
        }
        take!(
            host,
            port,
            grpc_port,
            allow_grpc,
            repository_poll_secs,
            load_model,
            model_version,
            instances,
            threads,
            max_batch,
            max_queue_delay_us,
            preferred_batch_sizes,
            padded_batch_sizes,
            session_per_batch_size,
            fixed_input_shapes,
            queue_capacity,
            max_in_flight,
            preprocess_threads,
            request_timeout_ms,
            max_request_timeout_ms,
            max_body_bytes,
            body_timeout_ms,
            max_pixels,
            jpeg_dct_scaling,
            shed_on_backlog,
            malloc_mmap_threshold,
            shutdown_timeout_s,
            video_decoder
        );
        take_opt!(
            model,
            model_name,
            model_repository,
            default_model,
            stream_model,
            imgsz,
            ort_lib,
            spin_wait
        );
        s.provider = provider;
        events.apply(&mut s.events);
        tls.apply(&mut s.tls);
        shard.apply(&mut s.shard);
        stream_policy.apply(&mut s.stream_policy);
        gb28181.apply(&mut s.gb28181);
        auth.apply(&mut s.auth);
        slo.apply(&mut s.slo);
        profiling.apply(&mut s.profiling);
        s.validate()?;
        Ok(s)
    }
}

impl ServeSettings {
    fn validate(&self) -> Result<()> {
        self.events.validate()?;
        self.tls.validate()?;
        self.shard.assignment()?;
        crate::stream_policy_config::validate(&self.stream_policy)?;
        self.gb28181.validate()?;
        self.slo.apply(&mut None)?;
        let positive = [
            ("instances", self.instances),
            ("max_batch", self.max_batch),
            ("queue_capacity", self.queue_capacity),
            ("max_in_flight", self.max_in_flight),
            ("preprocess_threads", self.preprocess_threads),
            ("max_body_bytes", self.max_body_bytes),
        ];
        for (name, v) in positive {
            anyhow::ensure!(v > 0, "{name} must be at least 1");
        }
        anyhow::ensure!(
            self.request_timeout_ms > 0,
            "request_timeout_ms must be at least 1"
        );
        anyhow::ensure!(
            self.max_request_timeout_ms >= self.request_timeout_ms,
            "max_request_timeout_ms ({}) is below request_timeout_ms ({})",
            self.max_request_timeout_ms,
            self.request_timeout_ms
        );
        anyhow::ensure!(
            !(self.model.is_some() && self.model_repository.is_some()),
            "give either model (one file) or model_repository (a directory), not both"
        );
        anyhow::ensure!(self.model_version > 0, "model_version must be at least 1");
        // What only the model settings can check (the GPU list among them).
        self.model_defaults()
            .validate()
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        if let Some(p) = self
            .preferred_batch_sizes
            .iter()
            .find(|&&p| p == 0 || p > self.max_batch)
        {
            anyhow::bail!("preferred batch size {p} is outside 1..={}", self.max_batch);
        }
        Ok(())
    }

    /// What every model gets unless its own config.toml says otherwise.
    pub fn model_defaults(&self) -> ModelSettings {
        let mut m = ModelSettings::default();
        let engine = &mut m.engine;
        engine.instances = self.instances;
        engine.policy = BatchPolicy {
            max_batch: self.max_batch,
            max_delay: Duration::from_micros(self.max_queue_delay_us),
            preferred: self.preferred_batch_sizes.clone(),
            capacity: self.queue_capacity,
        };
        engine.max_in_flight = self.max_in_flight;
        engine.preprocess_threads = self.preprocess_threads;
        engine.decode_limits = DecodeLimits {
            max_pixels: self.max_pixels,
        };
        engine.jpeg_dct_scaling = self.jpeg_dct_scaling;
        engine.shed_on_backlog = self.shed_on_backlog;
        // `validate` has refused an objective that does not apply.
        let _ = self.slo.apply(&mut engine.objective);
        m.session.intra_threads = self.threads;
        m.session.intra_op_spinning = self.spin_wait;
        m.session.runtime_path = self.ort_lib.clone();
        m.detector.imgsz = self.imgsz;
        m.detector.run_sizes = self.padded_batch_sizes.clone();
        m.session_per_batch_size = self.session_per_batch_size;
        m.fixed_input_shapes = self.fixed_input_shapes;
        self.provider.apply_to(&mut m);
        m
    }

    /// The name the model is served under.
    pub fn model_name(&self) -> String {
        self.model_name.clone().unwrap_or_else(|| {
            self.model
                .as_ref()
                .and_then(|p| p.file_stem())
                .map_or_else(|| "yolo11n".into(), |s| s.to_string_lossy().into_owned())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_then_flags_override_defaults() {
        let dir = std::env::temp_dir().join(format!("peregrine-serve-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("serve.toml");
        std::fs::write(
            &file,
            "port = 9000\nmax_batch = 8\npreferred_batch_sizes = [4, 8]\n",
        )
        .unwrap();
        let args = ServeArgs {
            config: Some(file.clone()),
            max_batch: Some(6),
            ..Default::default()
        };
        let err = args.resolve().unwrap_err();
        assert!(
            err.to_string()
                .contains("preferred batch size 8 is outside 1..=6"),
            "{err}"
        );
        let args = ServeArgs {
            config: Some(file),
            instances: Some(2),
            ..Default::default()
        };
        let s = args.resolve().unwrap();
        assert_eq!(
            (s.port, s.max_batch, s.instances, s.host.as_str()),
            (9000, 8, 2, "127.0.0.1")
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_stream_model_flag_is_applied() {
        let args = ServeArgs {
            stream_model: Some("det".into()),
            ..Default::default()
        };
        assert_eq!(args.resolve().unwrap().stream_model.as_deref(), Some("det"));
    }

    #[test]
    fn the_video_decoder_defaults_to_auto_and_the_flag_sets_it() {
        use peregrine_video::DecoderKind;
        assert_eq!(
            ServeArgs::default().resolve().unwrap().video_decoder,
            DecoderKind::Auto
        );
        let args = ServeArgs {
            video_decoder: Some(DecoderKind::Cpu),
            ..Default::default()
        };
        assert_eq!(args.resolve().unwrap().video_decoder, DecoderKind::Cpu);
    }

    #[test]
    fn the_readme_example_config_is_valid() {
        let readme = include_str!("../../../README.md");
        let start = readme.find("```toml\n").expect("README has a TOML example") + "```toml\n".len();
        let end = start + readme[start..].find("```").unwrap();
        let parsed: ServeSettings = toml::from_str(&readme[start..end]).unwrap();
        assert_eq!((parsed.port, parsed.max_batch), (8080, 4));
    }

    #[test]
    fn the_readme_video_example_is_a_valid_config() {
        let readme = include_str!("../../../README.md");
        let start = readme
            .find("stream_model = ")
            .expect("README has a video example");
        let end = start + readme[start..].find("```").unwrap();
        let parsed: ServeSettings = toml::from_str(&readme[start..end]).unwrap();
        assert_eq!(parsed.streams.len(), 1);
        assert_eq!(parsed.streams[0].fps, Some(5.0));
        parsed.streams[0].validate().unwrap();
        assert_eq!(parsed.mqtt.unwrap().topic_prefix, "peregrine");
        assert_eq!(parsed.webhooks.len(), 1);
    }

    #[test]
    fn the_readme_analytics_example_is_a_valid_config_with_its_defaults() {
        let readme = include_str!("../../../README.md");
        let section = &readme[readme.find("## Video analytics").expect("README has the section")..];
        let start = section.find("```toml\n").unwrap() + "```toml\n".len();
        let end = start + section[start..].find("```").unwrap();
        let parsed: ServeSettings = toml::from_str(&section[start..end]).unwrap();
        let stream = &parsed.streams[0];
        stream.validate().unwrap();
        let a = &stream.analytics;
        assert_eq!((a.zones.len(), a.lines.len()), (1, 1));
        // The example spells out the defaults: keep them true.
        let defaults = peregrine_video::AnalyticsConfig::default();
        assert_eq!(a.tracker, defaults.tracker);
        assert_eq!(
            (a.hysteresis_frames, a.hysteresis_px),
            (defaults.hysteresis_frames, defaults.hysteresis_px)
        );
        assert_eq!(&a.anchor, &defaults.anchor);
        assert_eq!(parsed.events, crate::events_config::EventsSettings::default());
    }

    #[test]
    fn unknown_keys_in_the_file_are_errors() {
        let err = toml::from_str::<ServeSettings>("prot = 1").unwrap_err();
        assert!(err.to_string().contains("unknown field `prot`"), "{err}");
    }

    #[test]
    fn model_name_defaults_to_the_file_stem() {
        let s = ServeSettings {
            model: Some("/m/yolo26n-e2e.onnx".into()),
            ..Default::default()
        };
        assert_eq!(s.model_name(), "yolo26n-e2e");
        assert_eq!(ServeSettings::default().model_name(), "yolo11n");
    }
}
