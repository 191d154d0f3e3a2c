//! How one version's weights become a running [`Engine`]: the registry's only contact
//! with a runtime, behind a trait so its lifecycle is tested with fake engines.

use peregrine_engine::{Engine, EngineConfig};

use crate::build::{LoadError, PreparedModel};
use crate::settings::ModelSettings;

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
    ) -> Result<Engine, LoadError>;
}

/// Loads ONNX models with ONNX Runtime.
#[derive(Debug, Default)]
pub struct OrtLoader;

/// The engine configuration of one version under a model's settings: every placed
/// instance (`instances` per GPU). A change of the model's fallback is a change of its
/// settings, so its versions reload with the new one.
pub fn engine_config(name: &str, version: u64, settings: &ModelSettings) -> EngineConfig {
    EngineConfig {
        name: name.to_string(),
        version: version.to_string(),
        has_fallback: settings.fallback.as_deref().is_some_and(|f| f != name),
        instances: settings.instance_devices().len(),
        ..settings.engine.clone()
    }
}

impl EngineLoader for OrtLoader {
    fn load(
        &self,
        name: &str,
        version: u64,
        weights: &[u8],
        settings: &ModelSettings,
    ) -> Result<Engine, LoadError> {
        // Prepared once, shared by every instance.
        let model = PreparedModel::new(weights, settings)?;
        Ok(Engine::start(engine_config(name, version, settings), |i| {
            model.detector(i)
        })?)
    }
}
