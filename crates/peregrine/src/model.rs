//! Loading the detection model: a file given by the user, or the one built into the binary.

use anyhow::{Context, Result};
use peregrine_backend::{BackendError, ExecutionProvider, OrtBackend, SessionConfig};
use peregrine_engine::graph::{fixed_shape_weights, rewritten_weights};
use peregrine_engine::{Detector, DetectorConfig};
use peregrine_types::{ClassNames, DetectParams, ParamsError};

use crate::cli::{ModelArgs, ThresholdArgs};

/// YOLO11n (COCO, 80 classes), so `peregrine detect photo.jpg` works with no model at hand.
/// Ultralytics' weights, AGPL-3.0: see models/NOTICE.
pub static EMBEDDED_MODEL: &[u8] =
    include_bytes!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/yolo11n.onnx"));

/// Builds a session from `model` with the configured provider, falling back to the CPU
/// only when `fallback` says so (and saying so in the log).
pub fn load_backend(
    model: &[u8],
    session: &SessionConfig,
    fallback: bool,
) -> Result<OrtBackend, BackendError> {
    OrtBackend::from_bytes_or_cpu(model, session, fallback)
}

/// Loads the model the arguments name into a ready detector. With `fixed_batch`, the
/// graph's input shape is fixed at that many images (see
/// `peregrine_engine::graph::fixed_shape_weights`), and the detector runs only that size.
pub fn load_detector(args: &ModelArgs, max_batch: usize, fixed_batch: Option<usize>) -> Result<Detector> {
    anyhow::ensure!(
        !args.provider.gpu_jpeg_decode,
        "--gpu-jpeg-decode applies to `peregrine serve`; this command decodes its images on the CPU"
    );
    let provider = args.provider.provider();
    let on_gpu = provider != ExecutionProvider::Cpu;
    let session = SessionConfig {
        intra_threads: args.threads,
        runtime_path: args.ort_lib.clone(),
        provider,
        pinned_input: args.provider.pinned_input,
        device_io: args.provider.device_io,
        gpu_jpeg_decode: args.provider.gpu_jpeg_decode,
        profile: args.ort_profile.clone(),
        ..Default::default()
    };
    let fallback = args.provider.provider_fallback;
    let (bytes, what): (std::borrow::Cow<'_, [u8]>, String) = match &args.model {
        Some(path) => (
            std::fs::read(path)
                .with_context(|| format!("cannot read {}", path.display()))?
                .into(),
            format!("model {}", path.display()),
        ),
        None => (EMBEDDED_MODEL.into(), "the embedded model".into()),
    };
    let rewritten = rewritten_weights(&bytes, args.provider.graph_rewrite, args.provider.top_k, on_gpu)
        .with_context(|| format!("loading {what}"))?;
    let weights = rewritten.as_deref().unwrap_or(&bytes);
    let fixed = fixed_batch
        .map(|n| fixed_shape_weights(weights, &[n], args.imgsz))
        .transpose()
        .with_context(|| format!("fixing the input shape of {what}"))?
        .and_then(|mut one| one.pop());
    let backend = load_backend(fixed.as_deref().unwrap_or(weights), &session, fallback)
        .with_context(|| format!("loading {what}"))?;
    let config = DetectorConfig {
        imgsz: args.imgsz,
        max_batch,
        run_sizes: vec![],
    };
    Ok(Detector::new(Box::new(backend), &config)?)
}

/// Builds validated detection parameters, resolving class names against the model's.
pub fn detect_params(args: &ThresholdArgs, names: &ClassNames) -> Result<DetectParams, ParamsError> {
    let classes = if args.classes.is_empty() {
        None
    } else {
        let ids = args
            .classes
            .iter()
            .map(|c| {
                let c = c.trim();
                c.parse::<u32>()
                    .ok()
                    .or_else(|| names.id_of(c))
                    .ok_or_else(|| ParamsError::UnknownClass(c.to_string()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Some(ids)
    };
    let params = DetectParams {
        conf: args.conf,
        iou: args.iou,
        max_det: args.max_det,
        classes,
    };
    params.validate()?;
    Ok(params)
}
