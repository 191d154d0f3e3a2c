//! [`Backend`] over an ONNX Runtime session.

use std::collections::BTreeMap;
use std::path::PathBuf;

use ort::session::builder::GraphOptimizationLevel;
use ort::session::Session;
use ort::value::{TensorElementType, TensorRef, ValueType};
use peregrine_types::model::ElementType;
use peregrine_types::{Dim, ModelDescription, TensorDescription};

use crate::{runtime, Backend, BackendError, InputBatch, OutputBuffer};

/// Where the model's graph runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ExecutionProvider {
    /// ONNX Runtime's own CPU kernels: always available.
    #[default]
    Cpu,
}

/// How one ONNX Runtime session is built.
#[derive(Debug, Clone, Default)]
pub struct SessionConfig {
    /// Threads for one operator; 0 lets ONNX Runtime choose (one per physical core).
    pub intra_threads: usize,
    /// Let idle intra-op threads spin instead of sleeping. ONNX Runtime's default (`None`)
    /// spins, which is fastest when the model has the cores to itself; turn it off when
    /// decoding shares the same cores.
    pub intra_op_spinning: Option<bool>,
    pub provider: ExecutionProvider,
    /// The ONNX Runtime library to load; `None` searches the usual places.
    pub runtime_path: Option<PathBuf>,
}

pub struct OrtBackend {
    session: Session,
    description: ModelDescription,
}

impl std::fmt::Debug for OrtBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OrtBackend")
            .field("description", &self.description)
            .finish()
    }
}

fn load_err(e: impl std::fmt::Display) -> BackendError {
    BackendError::ModelLoad(e.to_string())
}

impl OrtBackend {
    /// Builds a session from an in-memory ONNX model.
    pub fn from_bytes(model: &[u8], config: &SessionConfig) -> Result<Self, BackendError> {
        let env = runtime::environment(config.runtime_path.as_deref())?;
        let mut builder = Session::builder(&env)
            .map_err(load_err)?
            .with_optimization_level(GraphOptimizationLevel::All)
            .map_err(load_err)?;
        if config.intra_threads > 0 {
            builder = builder
                .with_intra_threads(config.intra_threads)
                .map_err(load_err)?;
        }
        match config.provider {
            ExecutionProvider::Cpu => {}
        }
        let session = builder.commit_from_memory(model).map_err(load_err)?;
        let description = describe(&session)?;
        Ok(Self { session, description })
    }

    /// Builds a session from an ONNX file.
    pub fn from_file(path: &std::path::Path, config: &SessionConfig) -> Result<Self, BackendError> {
        let bytes = std::fs::read(path)
            .map_err(|e| BackendError::ModelLoad(format!("cannot read {}: {e}", path.display())))?;
        Self::from_bytes(&bytes, config)
    }
}

fn element(ty: TensorElementType) -> ElementType {
    match ty {
        TensorElementType::Float32 => ElementType::F32,
        TensorElementType::Float16 => ElementType::F16,
        TensorElementType::Uint8 => ElementType::U8,
        other => ElementType::Other(format!("{other:?}").to_lowercase()),
    }
}

fn tensor(name: &str, ty: &ValueType) -> Result<TensorDescription, BackendError> {
    match ty {
        ValueType::Tensor { ty, shape, .. } => Ok(TensorDescription {
            name: name.to_string(),
            element: element(*ty),
            dims: shape
                .iter()
                .map(|&d| {
                    if d >= 0 {
                        Dim::Fixed(d as usize)
                    } else {
                        Dim::Dynamic
                    }
                })
                .collect(),
        }),
        other => Err(BackendError::ModelLoad(format!(
            "{name:?} is a {other:?}, not a tensor; only tensor inputs and outputs are supported"
        ))),
    }
}

fn describe(session: &Session) -> Result<ModelDescription, BackendError> {
    let inputs = session
        .inputs()
        .iter()
        .map(|o| tensor(o.name(), o.dtype()))
        .collect::<Result<_, _>>()?;
    let outputs = session
        .outputs()
        .iter()
        .map(|o| tensor(o.name(), o.dtype()))
        .collect::<Result<_, _>>()?;
    let meta = session.metadata().map_err(load_err)?;
    let mut metadata = BTreeMap::new();
    for key in meta.custom_keys().map_err(load_err)? {
        if let Some(v) = meta.custom(&key) {
            metadata.insert(key, v);
        }
    }
    Ok(ModelDescription {
        inputs,
        outputs,
        metadata,
    })
}

impl Backend for OrtBackend {
    fn description(&self) -> &ModelDescription {
        &self.description
    }

    fn run(&mut self, input: InputBatch<'_>, output: &mut OutputBuffer) -> Result<(), BackendError> {
        if input.shape.iter().product::<usize>() != input.data.len() {
            return Err(BackendError::InputSize {
                shape: input.shape,
                len: input.data.len(),
            });
        }
        let tensor = TensorRef::from_array_view((input.shape, input.data))
            .map_err(|e| BackendError::Inference(e.to_string()))?;
        let outputs = self
            .session
            .run(ort::inputs![tensor])
            .map_err(|e| BackendError::Inference(e.to_string()))?;
        let (shape, data) = outputs[0]
            .try_extract_tensor::<f32>()
            .map_err(|e| BackendError::Output(e.to_string()))?;
        output.shape.clear();
        output.shape.extend(shape.iter().map(|&d| d.max(0) as usize));
        output.data.clear();
        output.data.extend_from_slice(data);
        Ok(())
    }
}
