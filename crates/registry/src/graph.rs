//! Whether a model runs as exported or with `peregrine-onnx`'s graph rewrite (uint8 canvas
//! in, top-K candidate rows out), which moves normalisation and the best-class scan onto
//! the accelerator and cuts host-device traffic from 7.7 MB to 1.2 MB per 640x640 image.

use peregrine_engine::EngineError;
use peregrine_onnx::{rewrite, InputForm, OutputForm, RewriteOptions};
use peregrine_vision::DetectorSpec;

use crate::LoadError;

/// When to rewrite a model's graph at load time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GraphRewrite {
    /// On GPU providers, where it pays; a model it does not fit runs as exported (logged).
    /// On the CPU only the DFL fold (`peregrine_onnx::RewriteOptions::fold_dfl_softmax`).
    #[default]
    Auto,
    /// Always; a model it does not fit fails to load.
    On,
    /// Never.
    Off,
}

impl std::str::FromStr for GraphRewrite {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Self::Auto),
            "on" => Ok(Self::On),
            "off" => Ok(Self::Off),
            other => Err(format!("graph rewrite {other:?} is not one of auto, on, off")),
        }
    }
}

/// The weights to build sessions from: rewritten when `mode` asks for it (`on_gpu` decides
/// `Auto`), else `None` to use them as they are.
///
/// On the CPU provider (`Auto` or `On`) the head's DFL decoding is also refolded (see
/// `peregrine_onnx::RewriteOptions::fold_dfl_softmax`); in `Auto` that fold is all the CPU
/// gets, and a model without a DFL site to fold keeps its own bytes.
pub fn rewritten_weights(
    weights: &[u8],
    mode: GraphRewrite,
    top_k: usize,
    on_gpu: bool,
) -> Result<Option<Vec<u8>>, LoadError> {
    let full = match mode {
        GraphRewrite::Off => return Ok(None),
        GraphRewrite::On => true,
        GraphRewrite::Auto => on_gpu,
    };
    let options = RewriteOptions {
        uint8_nhwc_input: full,
        top_k: full.then_some(top_k),
        // CPU only: on an H100 the folded head ran 0-7% slower than the softmax, fp32 and
        // fp16 (docs/benchmarks.md, "The DFL fold on a GPU").
        fold_dfl_softmax: !on_gpu,
    };
    match rewrite(weights, &options) {
        Ok(r) if !full && r.dfl_folds == 0 => Ok(None),
        Ok(r) if !full => {
            tracing::info!(rewrite = %r.summary(), "the head's DFL softmax refolded for the CPU");
            Ok(Some(r.model))
        }
        Ok(r) => {
            let complete = r.input_form == InputForm::InterleavedU8
                && matches!(
                    r.output_form,
                    OutputForm::Candidates { .. } | OutputForm::EndToEnd
                );
            tracing::info!(rewrite = %r.summary(), complete, "model graph rewritten");
            Ok(Some(r.model))
        }
        Err(e) if !full => {
            // Only the CPU's fold was asked for: a model it cannot read is run as exported,
            // as it always was, and is no news.
            tracing::debug!(error = %e, "no DFL fold for this model; running it as exported");
            Ok(None)
        }
        Err(e) if mode == GraphRewrite::Auto => {
            tracing::warn!(error = %e, "the graph rewrite does not fit this model; running it as exported");
            Ok(None)
        }
        Err(e) => Err(LoadError::Rewrite(e)),
    }
}

/// `weights` with the image input fixed, once for each of `batches`, at that many images
/// of the size the detector will use (`imgsz`, else what the model declares, as
/// [`DetectorSpec`] decides it), for sessions that each run one shape: ONNX Runtime then
/// folds the model's run-time shape arithmetic into constants instead of computing it on
/// the CPU at every run.
pub fn fixed_shape_weights(
    weights: &[u8],
    batches: &[usize],
    imgsz: Option<(usize, usize)>,
) -> Result<Vec<Vec<u8>>, LoadError> {
    let spec =
        DetectorSpec::from_model(&peregrine_onnx::describe(weights)?, imgsz).map_err(EngineError::from)?;
    batches
        .iter()
        .map(|&n| {
            Ok(peregrine_onnx::fix_input_shape(
                weights,
                n,
                spec.input_height,
                spec.input_width,
            )?)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_decide_and_a_bad_model_fails_only_when_the_rewrite_is_required() {
        assert_eq!("auto".parse(), Ok(GraphRewrite::Auto));
        assert!("yes".parse::<GraphRewrite>().is_err());
        let junk = b"not an onnx model";
        assert!(rewritten_weights(junk, GraphRewrite::Off, 1024, true)
            .unwrap()
            .is_none());
        assert!(rewritten_weights(junk, GraphRewrite::Auto, 1024, false)
            .unwrap()
            .is_none());
        assert!(rewritten_weights(junk, GraphRewrite::Auto, 1024, true)
            .unwrap()
            .is_none());
        let err = rewritten_weights(junk, GraphRewrite::On, 1024, false).unwrap_err();
        assert!(err.to_string().contains("graph rewrite"), "{err}");
    }

    #[test]
    fn the_cpu_gets_the_dfl_fold_alone_and_keeps_the_models_inputs_and_outputs() {
        let shared = std::env::var_os("PEREGRINE_SHARED")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared"));
        let weights = std::fs::read(shared.join("models/yolo11n.onnx")).expect("the shared yolo11n");
        let folded = rewritten_weights(&weights, GraphRewrite::Auto, 1024, false)
            .unwrap()
            .expect("yolo11n has a DFL site to fold");
        let before = peregrine_onnx::describe(&weights).unwrap();
        let after = peregrine_onnx::describe(&folded).unwrap();
        assert_eq!(before.inputs, after.inputs);
        assert_eq!(before.outputs, after.outputs);
        assert!(rewritten_weights(&weights, GraphRewrite::Off, 1024, false)
            .unwrap()
            .is_none());
        // A model with no DFL (end-to-end head) keeps its own bytes on the CPU.
        let e2e = std::fs::read(shared.join("models/yolo26n-e2e.onnx")).expect("the shared yolo26n");
        assert!(rewritten_weights(&e2e, GraphRewrite::Auto, 1024, false)
            .unwrap()
            .is_none());
    }
}
