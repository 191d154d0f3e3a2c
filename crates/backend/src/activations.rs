//! Running a calibration graph (a model with intermediate tensors added as outputs) on
//! ONNX Runtime's CPU provider, to hand each activation to a calibrator.
//!
//! Separate from [`crate::OrtBackend`]: calibration wants every output by name, once per
//! image, not one detection tensor into a reused buffer.

use std::path::Path;

use ort::session::builder::GraphOptimizationLevel;
use ort::session::Session;
use ort::value::TensorRef;

use crate::{runtime, BackendError};

/// A session that returns named float activations.
pub struct ActivationSession {
    session: Session,
    outputs: Vec<String>,
}

impl std::fmt::Debug for ActivationSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ActivationSession")
            .field("outputs", &self.outputs.len())
            .finish()
    }
}

impl ActivationSession {
    /// Builds a CPU session of `model` (ONNX bytes). Graph optimisations are limited to
    /// the basic ones, which keep every named intermediate tensor (fusions could remove
    /// the very values calibration asks for).
    pub fn from_bytes(
        model: &[u8],
        intra_threads: usize,
        runtime_path: Option<&Path>,
    ) -> Result<Self, BackendError> {
        let env = runtime::environment(runtime_path)?;
        // Every activation is an output here, each run allocating them all. Without ONNX
        // Runtime's arena and memory pattern that memory goes back after each run instead of
        // staying held (yolo11n at 640x640: `quantize` peaked at 351 MiB instead of 377 at
        // the same speed; a serving process calibrating online held +265 MiB throughout
        // before, +195-245 MiB while a run is under way after, 2026-12-07).
        let mut builder = Session::builder(&env)
            .map_err(load_err)?
            .with_optimization_level(GraphOptimizationLevel::Level1)
            .map_err(load_err)?
            .with_memory_pattern(false)
            .map_err(load_err)?
            .with_execution_providers([ort::ep::CPU::default().with_arena_allocator(false).build()])
            .map_err(load_err)?;
        if intra_threads > 0 {
            builder = builder.with_intra_threads(intra_threads).map_err(load_err)?;
        }
        let session = builder.commit_from_memory(model).map_err(load_err)?;
        let outputs = session.outputs().iter().map(|o| o.name().to_string()).collect();
        Ok(Self { session, outputs })
    }

    /// The names of the session's outputs, in order.
    pub fn outputs(&self) -> &[String] {
        &self.outputs
    }

    /// Runs one float `[N, 3, H, W]` batch and calls `each(name, values)` for every
    /// float32 output (others are skipped).
    pub fn run(
        &mut self,
        input: &[f32],
        shape: [usize; 4],
        mut each: impl FnMut(&str, &[f32]),
    ) -> Result<(), BackendError> {
        let n: usize = shape.iter().product();
        if n != input.len() {
            return Err(BackendError::InputSize {
                shape,
                len: input.len(),
            });
        }
        let value = TensorRef::from_array_view((shape, input)).map_err(fail_err)?;
        let outputs = self.session.run(ort::inputs![value]).map_err(fail_err)?;
        for (name, value) in outputs.iter() {
            if let Ok((_, data)) = value.try_extract_tensor::<f32>() {
                each(name, data);
            }
        }
        Ok(())
    }
}

fn load_err(e: impl std::fmt::Display) -> BackendError {
    BackendError::ModelLoad(e.to_string())
}

fn fail_err(e: impl std::fmt::Display) -> BackendError {
    BackendError::Inference(e.to_string())
}
