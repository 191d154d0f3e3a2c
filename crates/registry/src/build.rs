//! The one recipe from a model's weights to a ready [`Detector`]: rewrite the graph (when
//! the settings ask for it), fix its input shapes (for sessions that each run one shape),
//! build the ONNX Runtime sessions, wrap them in a detector. The server's loader and every
//! CLI command that runs a model go through it, so they cannot drift apart.

use std::borrow::Cow;

use peregrine_backend::{Backend, OrtBackend, PerBatchSize, SessionConfig};
use peregrine_engine::{run_sizes, Detector, DetectorConfig, EngineError};

use crate::graph::{fixed_shape_weights, rewritten_weights};
use crate::settings::ModelSettings;

/// A model that could not be made ready to run.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// Building a session or the detector around it failed.
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error("the graph rewrite does not fit this model: {0} (graph_rewrite = \"off\" runs it as exported)")]
    Rewrite(#[from] peregrine_onnx::RewriteError),
}

/// The sessions each detector gets. `None` graphs are the prepared weights themselves.
#[derive(Debug)]
enum Sessions {
    One(Option<Vec<u8>>),
    /// One per run batch size, ascending.
    PerBatchSize(Vec<(usize, Option<Vec<u8>>)>),
}

/// A model's graph prepared for its settings, once: every detector built from it (one per
/// instance) shares the rewritten and shape-fixed graphs.
#[derive(Debug)]
pub struct PreparedModel<'a> {
    /// Rewritten, or the weights as given.
    weights: Cow<'a, [u8]>,
    sessions: Sessions,
    session: SessionConfig,
    /// Each instance's device (see `ModelSettings::instance_devices`).
    devices: Vec<Option<i32>>,
    /// Run on the CPU when the session's provider cannot load.
    fallback: bool,
    detector: DetectorConfig,
}

impl<'a> PreparedModel<'a> {
    /// Rewrites and shape-fixes `weights` as `settings` ask; blocking (graph surgery).
    pub fn new(weights: &'a [u8], settings: &ModelSettings) -> Result<Self, LoadError> {
        let on_gpu = settings.gpu_device().is_some();
        let weights = match rewritten_weights(weights, settings.graph_rewrite, settings.top_k, on_gpu)? {
            Some(rewritten) => Cow::Owned(rewritten),
            None => Cow::Borrowed(weights),
        };
        let detector = settings.detector_config();
        let imgsz = detector.imgsz;
        let fixed = |sizes: &[usize]| fixed_shape_weights(&weights, sizes, imgsz);
        let sessions = if let Some(n) = settings.fixed_batch {
            Sessions::One(fixed(&[n])?.pop())
        } else if settings.session_per_batch_size {
            // Each per-size session sees one shape only, so its graph may get that shape
            // fixed (see `fixed_shape_weights`).
            let sizes = run_sizes(&detector);
            let graphs = if settings.fixed_input_shapes {
                fixed(&sizes)?.into_iter().map(Some).collect()
            } else {
                vec![None; sizes.len()]
            };
            Sessions::PerBatchSize(sizes.into_iter().zip(graphs).collect())
        } else {
            Sessions::One(None)
        };
        Ok(Self {
            weights,
            sessions,
            session: settings.session.clone(),
            devices: settings.instance_devices(),
            fallback: settings.provider_fallback,
            detector,
        })
    }

    /// Builds instance `instance`'s detector on its device: its sessions, then the
    /// pipeline around them. Blocking.
    pub fn detector(&self, instance: usize) -> Result<Detector, EngineError> {
        let session = match self.devices.get(instance).copied().flatten() {
            Some(device) => SessionConfig {
                provider: self.session.provider.on_device(device),
                ..self.session.clone()
            },
            None => self.session.clone(),
        };
        let open = |graph: &Option<Vec<u8>>| -> Result<Box<dyn Backend>, EngineError> {
            let weights = graph.as_deref().unwrap_or(&self.weights);
            Ok(Box::new(OrtBackend::from_bytes_or_cpu(
                weights,
                &session,
                self.fallback,
            )?))
        };
        let backend = match &self.sessions {
            Sessions::One(graph) => open(graph)?,
            Sessions::PerBatchSize(sizes) => {
                let sessions = sizes
                    .iter()
                    .map(|(n, graph)| Ok((*n, open(graph)?)))
                    .collect::<Result<Vec<_>, EngineError>>()?;
                Box::new(PerBatchSize::new(sessions)?)
            }
        };
        Detector::new(backend, &self.detector)
    }
}

/// The whole recipe for one detector: [`PreparedModel::new`], then
/// [`PreparedModel::detector`]. Blocking.
pub fn build_detector(weights: &[u8], settings: &ModelSettings) -> Result<Detector, LoadError> {
    Ok(PreparedModel::new(weights, settings)?.detector(0)?)
}
