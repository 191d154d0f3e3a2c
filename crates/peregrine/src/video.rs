//! Video streams run on the same engines as the image API: [`EngineFrames`] is the video
//! pipeline's detector, submitting each stream's frames to the serving engine of a model,
//! where they are batched with every other request (and with other streams' frames).

use std::sync::Arc;
use std::time::Instant;

use futures_util::future::BoxFuture;
use peregrine_engine::{Engine, RequestError};
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

/// A frame as the engine reads it; the buffer goes back to the stream's pool once this and
/// the stream's analytics have let go of it.
struct FramePixels(Arc<Frame>);

impl AsRef<[u8]> for FramePixels {
    fn as_ref(&self) -> &[u8] {
        self.0.data()
    }
}

impl FrameDetector for EngineFrames {
    fn detect(
        &self,
        frame: Arc<Frame>,
        deadline: Instant,
    ) -> BoxFuture<'static, Result<Vec<Detection>, DetectError>> {
        let engine = self.engine();
        Box::pin(async move {
            let engine = engine?;
            let permit = engine.try_admit().map_err(|_| DetectError::Overloaded)?;
            let (w, h, stride) = (frame.width() as usize, frame.height() as usize, frame.stride());
            let params = engine.config().defaults.clone();
            engine
                .detect_frame(&permit, FramePixels(frame), w, h, stride, params, deadline)
                .await
                .map(|r| r.detections)
                .map_err(|e| match e {
                    RequestError::DeadlineExceeded { .. } => DetectError::DeadlineExceeded,
                    RequestError::Overloaded { .. }
                    | RequestError::QueueFull { .. }
                    | RequestError::Backlogged { .. } => DetectError::Overloaded,
                    RequestError::NotReady { .. } | RequestError::ShuttingDown => {
                        DetectError::Unavailable(e.to_string())
                    }
                    other => DetectError::Failed(other.to_string()),
                })
        })
    }

    fn class_names(&self) -> ClassNames {
        self.engine().map(|e| e.spec().names.clone()).unwrap_or_default()
    }
}
