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
pub fn rewritten_weights(
    weights: &[u8],
    mode: GraphRewrite,
    top_k: usize,
    on_gpu: bool,
) -> Result<Option<Vec<u8>>, LoadError> {
    let wanted = match mode {
        GraphRewrite::Off => false,
        GraphRewrite::On => true,
        GraphRewrite::Auto => on_gpu,
    };
    if !wanted {
        return Ok(None);
    }
    let options = RewriteOptions {
        uint8_nhwc_input: true,
        top_k: Some(top_k),
    };
    match rewrite(weights, &options) {
        Ok(r) => {
            let complete = r.input_form == InputForm::InterleavedU8
                && matches!(
                    r.output_form,
                    OutputForm::Candidates { .. } | OutputForm::EndToEnd
                );
            tracing::info!(rewrite = %r.summary(), complete, "model graph rewritten");
            Ok(Some(r.model))
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
}
