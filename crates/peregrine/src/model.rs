//! Loading the detection model: a file given by the user, or the one built into the binary.

use anyhow::{Context, Result};
use peregrine_engine::Detector;
use peregrine_registry::{build_detector, ModelSettings};
use peregrine_types::{ClassNames, ClassRef, DetectParams, ParamsError, ParamsRequest};

use crate::cli::{ModelArgs, ThresholdArgs};

/// YOLO11n (COCO, 80 classes), so `peregrine detect photo.jpg` works with no model at hand.
/// Ultralytics' weights, AGPL-3.0: see models/NOTICE.
pub static EMBEDDED_MODEL: &[u8] =
    include_bytes!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/yolo11n.onnx"));

/// Loads the model the arguments name into a ready detector, by the registry's recipe
/// (the server's). With `fixed_batch`, the graph's input shape is fixed at that many
/// images (see `peregrine_registry::graph::fixed_shape_weights`), and the detector runs
/// only that size.
pub fn load_detector(args: &ModelArgs, max_batch: usize, fixed_batch: Option<usize>) -> Result<Detector> {
    anyhow::ensure!(
        !args.provider.gpu_jpeg_decode,
        "--gpu-jpeg-decode applies to `peregrine serve`; this command decodes its images on the CPU"
    );
    let (bytes, what): (std::borrow::Cow<'_, [u8]>, String) = match &args.model {
        Some(path) => (
            std::fs::read(path)
                .with_context(|| format!("cannot read {}", path.display()))?
                .into(),
            format!("model {}", path.display()),
        ),
        None => (EMBEDDED_MODEL.into(), "the embedded model".into()),
    };
    build_detector(&bytes, &model_settings(args, max_batch, fixed_batch))
        .with_context(|| format!("loading {what}"))
}

/// The settings the flags call for: one detector of at most `max_batch` images per run,
/// with no engine around it.
fn model_settings(args: &ModelArgs, max_batch: usize, fixed_batch: Option<usize>) -> ModelSettings {
    let mut settings = ModelSettings::default();
    args.provider.apply_to(&mut settings);
    settings.session.intra_threads = args.threads;
    settings.session.runtime_path = args.ort_lib.clone();
    settings.session.profile = args.ort_profile.clone();
    settings.engine.policy.max_batch = max_batch;
    settings.detector.imgsz = args.imgsz;
    settings.fixed_batch = fixed_batch;
    settings
}

/// Builds validated detection parameters, resolving class names against the model's.
pub fn detect_params(args: &ThresholdArgs, names: &ClassNames) -> Result<DetectParams, ParamsError> {
    ParamsRequest {
        conf: Some(args.conf),
        iou: Some(args.iou),
        max_det: Some(args.max_det),
        classes: (!args.classes.is_empty()).then(|| {
            args.classes
                .iter()
                .map(String::as_str)
                .map(ClassRef::parse)
                .collect()
        }),
    }
    .resolve(&DetectParams::default(), names)
}
