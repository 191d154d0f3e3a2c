//! Video streams run on the same engines as the image API: [`EngineFrames`] is the video
//! pipeline's detector, submitting each stream's frames to the serving engine of a model,
//! where they are batched with every other request (and with other streams' frames).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use futures_util::future::BoxFuture;
use peregrine_engine::{Engine, FrameOwner, RequestError};
use peregrine_registry::ModelRegistry;
use peregrine_types::{ClassNames, Detection};
use peregrine_video::{DetectError, Frame, FrameDetector};

/// Detects in video frames with the registry's serving version of `model` (or of the only
/// model, when none is named). A new version swapped in is picked up at the next frame.
pub struct EngineFrames {
    pub registry: ModelRegistry,
    pub model: Option<String>,
}

impl EngineFrames {
    fn engine(&self) -> Result<Engine, DetectError> {
        let snapshot = self.registry.snapshot();
        let served = snapshot.models.keys().map(String::as_str);
        let name = peregrine_types::named_or_only(self.model.as_deref(), served)
            .map_err(|e| DetectError::Unavailable(format!("streams need a model (stream_model); {e}")))?;
        snapshot
            .route(name, None)
            .map_err(|e| DetectError::Unavailable(e.to_string()))
    }
}

/// Says once per process that frames left on a GPU are being copied to the host for a
/// model that does not take them there: the slow path, which an operator should know of.
fn warn_frames_copied_down(engine: &Engine, device: i32) {
    static WARNED: AtomicBool = AtomicBool::new(false);
    if !WARNED.swap(true, Ordering::Relaxed) {
        tracing::warn!(
            model = %engine.config().name,
            frames_on = device,
            model_takes_frames_on = ?engine.frames_device(),
            "video frames left on the GPU are copied to the host for this model, which takes none \
             on that GPU (--gpu-frames needs the model's instances on the frames' GPU)"
        );
    }
}

/// A frame as the engine reads it; the buffer goes back to the stream's pool once this and
/// the stream's analytics have let go of it. A frame in GPU memory has been copied down
/// before this is made (see [`EngineFrames::detect`]).
struct FramePixels(Arc<Frame>);

impl AsRef<[u8]> for FramePixels {
    fn as_ref(&self) -> &[u8] {
        // Already downloaded, or a host frame: no error left to meet here.
        self.0.pixels().unwrap_or(&[])
    }
}

impl FrameDetector for EngineFrames {
    fn detect(
        &self,
        frame: Arc<Frame>,
        deadline: Instant,
    ) -> BoxFuture<'static, Result<Vec<Detection>, DetectError>> {
        let engine = self.engine();
        Box::pin(async move { detect_on(engine?, frame, deadline).await })
    }

    fn class_names(&self) -> ClassNames {
        self.engine().map(|e| e.spec().names.clone()).unwrap_or_default()
    }
}

/// Detects in `frame` with `engine`: a frame left on the GPU goes as it is to an engine that
/// letterboxes frames on that GPU, and is copied down for any other; a host frame is
/// letterboxed on the preprocessing pool.
async fn detect_on(
    engine: Engine,
    frame: Arc<Frame>,
    deadline: Instant,
) -> Result<Vec<Detection>, DetectError> {
    let permit = engine.try_admit().map_err(|_| DetectError::Overloaded)?;
    let params = engine.config().defaults.clone();
    let on_gpu = frame.device_surface().map(|s| s.image());
    let outcome = match on_gpu {
        // The model's instances letterbox it where it is.
        Some(image) if engine.frames_device() == Some(image.device) => {
            let owner = FrameOwner(frame.clone());
            engine
                .detect_device_frame(&permit, image, owner, params, deadline)
                .await
        }
        _ => {
            if let Some(image) = on_gpu {
                warn_frames_copied_down(&engine, image.device);
                // A blocking CUDA copy, so off the runtime's workers.
                let f = frame.clone();
                tokio::task::spawn_blocking(move || f.pixels().map(|_| ()))
                    .await
                    .map_err(|e| DetectError::Failed(e.to_string()))?
                    .map_err(|e| DetectError::Failed(format!("copying the frame from the GPU: {e}")))?;
            }
            let (w, h, stride) = (frame.width() as usize, frame.height() as usize, frame.stride());
            engine
                .detect_frame(&permit, FramePixels(frame), w, h, stride, params, deadline)
                .await
        }
    };
    outcome.map(|r| r.detections).map_err(|e| match e {
        RequestError::DeadlineExceeded { .. } => DetectError::DeadlineExceeded,
        RequestError::Overloaded { .. }
        | RequestError::QueueFull { .. }
        | RequestError::Backlogged { .. } => DetectError::Overloaded,
        RequestError::NotReady { .. } | RequestError::ShuttingDown => DetectError::Unavailable(e.to_string()),
        other => DetectError::Failed(other.to_string()),
    })
}

#[cfg(test)]
#[path = "video_tests.rs"]
mod tests;
