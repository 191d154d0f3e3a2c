//! How one version's weights become a running [`Engine`]: the registry's only contact
//! with a runtime, behind a trait so its lifecycle is tested with fake engines.

use peregrine_backend::{Backend, OrtBackend, PerBatchSize, SessionConfig};

use super::settings::ModelSettings;
use crate::detector::run_sizes;
use crate::graph::{fixed_shape_weights, rewritten_weights};
use crate::{Detector, DetectorConfig, Engine, EngineConfig, EngineError};

/// Builds engines for the registry.
pub trait EngineLoader: Send + Sync + 'static {
    /// Builds every instance of one version and starts its engine (which warms up on its
    /// own threads). Blocking: the registry calls it on the blocking pool, inside the
    /// runtime.
    fn load(
        &self,
        name: &str,
        version: u64,
        weights: &[u8],
        settings: &ModelSettings,
    ) -> Result<Engine, EngineError>;
}

/// Loads ONNX models with ONNX Runtime.
#[derive(Debug, Default)]
pub struct OrtLoader;

/// The engine configuration a model's settings call for.
pub fn engine_config(name: &str, version: u64, settings: &ModelSettings) -> EngineConfig {
    EngineConfig {
        name: name.to_string(),
        version: version.to_string(),
        instances: settings.instances,
        policy: settings.policy.clone(),
        max_in_flight: settings.max_in_flight,
        preprocess_threads: settings.preprocess_threads,
        decode_limits: settings.decode_limits,
        jpeg_dct_scaling: settings.jpeg_dct_scaling,
        shed_on_backlog: settings.shed_on_backlog,
        defaults: settings.defaults.clone(),
    }
}

impl EngineLoader for OrtLoader {
    fn load(
        &self,
        name: &str,
        version: u64,
        weights: &[u8],
        settings: &ModelSettings,
    ) -> Result<Engine, EngineError> {
        let session = SessionConfig {
            intra_threads: settings.threads,
            intra_op_spinning: settings.spin_wait,
            runtime_path: settings.runtime_path.clone(),
            provider: settings.provider.clone(),
            pinned_input: settings.pinned_input,
            device_io: settings.device_io,
            gpu_jpeg_decode: settings.gpu_jpeg_decode,
            profile: None,
        };
        let rewritten = rewritten_weights(
            weights,
            settings.graph_rewrite,
            settings.top_k,
            settings.gpu_device().is_some(),
        )?;
        let weights = rewritten.as_deref().unwrap_or(weights);
        let detector_config = DetectorConfig {
            imgsz: settings.imgsz,
            max_batch: settings.policy.max_batch,
            run_sizes: settings.padded_batch_sizes.clone(),
        };
        let fallback = settings.provider_fallback;
        let per_size = settings.session_per_batch_size;
        // Each per-size session sees one shape only, so its graph may get that shape fixed
        // (see `fixed_shape_weights`); built once here, shared by every instance.
        let per_size_weights: Vec<(usize, Option<Vec<u8>>)> = if !per_size {
            Vec::new()
        } else {
            let sizes = run_sizes(&detector_config);
            let fixed = if settings.fixed_input_shapes {
                fixed_shape_weights(weights, &sizes, settings.imgsz)?
                    .into_iter()
                    .map(Some)
                    .collect()
            } else {
                vec![None; sizes.len()]
            };
            sizes.into_iter().zip(fixed).collect()
        };
        let factory = move || -> Result<Detector, EngineError> {
            let backend: Box<dyn Backend> = if per_size {
                let sessions = per_size_weights
                    .iter()
                    .map(|(n, fixed)| {
                        let weights = fixed.as_deref().unwrap_or(weights);
                        let b: Box<dyn Backend> =
                            Box::new(OrtBackend::from_bytes_or_cpu(weights, &session, fallback)?);
                        Ok((*n, b))
                    })
                    .collect::<Result<Vec<_>, EngineError>>()?;
                Box::new(PerBatchSize::new(sessions)?)
            } else {
                Box::new(OrtBackend::from_bytes_or_cpu(weights, &session, fallback)?)
            };
            Detector::new(backend, &detector_config)
        };
        Engine::start(engine_config(name, version, settings), factory)
    }
}
