//! Load-time rewrites of YOLO ONNX graphs, so that an accelerator does the cheap per-pixel
//! and per-anchor work and only small tensors cross between host and device.
//!
//! [`rewrite`] takes the model's bytes and returns new bytes plus a description of what
//! changed ([`Rewritten`]), from which the caller picks its pre- and postprocessing:
//!
//! - the input rewrite ([`input`]) makes the graph take the letterboxed canvas as it is,
//!   `uint8 [N, H, W, 3]` interleaved RGB, and normalise it inside, bit-for-bit as the CPU
//!   path's normaliser does;
//! - the output rewrite ([`output`]) reduces a raw YOLOv8/11 head `[N, 4+C, A]` to the K best
//!   anchors as `candidates` `[N, K, 6]` rows (x1, y1, x2, y2, score, class), computed with
//!   the CPU postprocessor's float arithmetic. Class-aware NMS stays on the host: it is cheap
//!   on K rows and keeps the thresholds per request.
//!
//! A model the rewrite does not fit is refused with a [`RewriteError`] saying why; the caller
//! then keeps the plain path. The model is decoded with prost into the generated [`proto`]
//! types, edited, and encoded again: weights, metadata and opset imports are carried through
//! untouched (an unedited model re-encodes to the same bytes).
//!
//! Modules: [`proto`] (generated ONNX types), `tensor` (plain tensor descriptions), `edit`
//! (adding nodes and constants under fresh names), `metadata` (Ultralytics metadata),
//! [`input`] and [`output`] (the two rewrites), `shape` ([`fix_input_shape`] for sessions
//! that run one shape, and [`describe`]), [`quantize`] (post-training INT8 quantization into
//! a QDQ model, and TensorRT's calibration cache).

pub mod proto;

mod dfl;
mod edit;
mod error;
pub mod input;
mod metadata;
pub mod output;
pub mod quantize;
mod shape;
mod tensor;

use peregrine_types::model::{CANDIDATES_FORM, OUTPUT_FORM_KEY};
use prost::Message;

pub use error::RewriteError;
pub use output::CANDIDATES;
pub use shape::{describe, fix_input_shape};
pub use tensor::{Dim, ElementType, TensorSpec};

use edit::GraphEdit;
use metadata::ModelMetadata;
use output::Head;

/// Rows per image kept by the output rewrite unless asked otherwise. Far more than the
/// boxes above any useful threshold in a COCO image, and 1/8 of the anchors at 640x640.
pub const DEFAULT_TOP_K: usize = 1024;

/// Which rewrites to apply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RewriteOptions {
    /// Replace the float NCHW input with `uint8 [N, H, W, 3]`, normalised inside the graph.
    pub uint8_nhwc_input: bool,
    /// Reduce a raw head to this many best candidates per image (fewer when the model has
    /// fewer anchors); `None` leaves the output as it is. End-to-end heads are always left
    /// as they are: they are already compact.
    pub top_k: Option<usize>,
    /// Refold the head's DFL decoding (`Softmax` over axis 1, then a 1x1 `Conv`) as
    /// exponentials, sums and a division: 5 ms less per YOLO11n image on the CPU provider.
    /// No faster on an H100 (fp32 and fp16, docs/benchmarks.md), so not part of the GPU
    /// default.
    pub fold_dfl_softmax: bool,
}

impl Default for RewriteOptions {
    fn default() -> Self {
        Self {
            uint8_nhwc_input: true,
            top_k: Some(DEFAULT_TOP_K),
            fold_dfl_softmax: false,
        }
    }
}

/// What the caller must feed the rewritten graph.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputForm {
    /// The original planar float input, `[N, 3, H, W]` in `[0, 1]`: normalise on the host.
    PlanarFloat,
    /// `uint8 [N, H, W, 3]`: the letterboxed canvas bytes exactly as `LetterboxCanvas` makes
    /// them, images back to back.
    InterleavedU8,
}

/// What the rewritten graph's output holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputForm {
    /// The model's own output, untouched (no `top_k` asked for).
    Unchanged,
    /// An end-to-end head `[N, K, 6]` (x1, y1, x2, y2, score, class), untouched.
    EndToEnd,
    /// [`CANDIDATES`] `[N, k, 6]` float32: x1, y1, x2, y2 in model-input (letterboxed)
    /// pixels, score, class id; best score first, equal scores in anchor order; `k =
    /// min(max_rows, anchors)`. Apply the score threshold and NMS on the host. When the last
    /// row still scores above the threshold, more candidates may have passed it than fit.
    Candidates { max_rows: usize, num_classes: usize },
}

/// A rewritten model and what changed in it.
#[derive(Clone, PartialEq)]
pub struct Rewritten {
    /// The new model, ready for `SessionBuilder::commit_from_memory`.
    pub model: Vec<u8>,
    pub input: TensorSpec,
    pub input_form: InputForm,
    pub output: TensorSpec,
    pub output_form: OutputForm,
    pub original_input: TensorSpec,
    pub original_output: TensorSpec,
    /// Softmax-then-convolution sites the DFL fold changed (0 unless asked for, and for heads
    /// without DFL, such as end-to-end ones, or whose DFL computes in float16).
    pub dfl_folds: usize,
}

impl Rewritten {
    /// One line for logs: what each edge of the graph was and is now.
    pub fn summary(&self) -> String {
        let edge = |what: &str, old: &TensorSpec, new: &TensorSpec| {
            if old == new {
                format!("{what} {old} (unchanged)")
            } else {
                format!("{what} {old} -> {new}")
            }
        };
        let folds = match self.dfl_folds {
            0 => String::new(),
            n => format!("; DFL softmax folded at {n} site(s)"),
        };
        format!(
            "{}; {}{folds}",
            edge("input", &self.original_input, &self.input),
            edge("output", &self.original_output, &self.output)
        )
    }
}

impl std::fmt::Debug for Rewritten {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Not the model bytes: megabytes of weights help nobody in a log line.
        f.debug_struct("Rewritten")
            .field("model_bytes", &self.model.len())
            .field("input", &self.input)
            .field("input_form", &self.input_form)
            .field("output", &self.output)
            .field("output_form", &self.output_form)
            .field("original_input", &self.original_input)
            .field("original_output", &self.original_output)
            .field("dfl_folds", &self.dfl_folds)
            .finish()
    }
}

/// Whether `domain` (of an opset import or a node) names ONNX's default operator set.
pub(crate) fn is_default_domain(domain: Option<&str>) -> bool {
    matches!(domain, None | Some("") | Some("ai.onnx"))
}

/// The model's opset for the default (`ai.onnx`) domain, 0 when it names none.
pub(crate) fn default_opset(model: &proto::ModelProto) -> i64 {
    model
        .opset_import
        .iter()
        .filter(|o| is_default_domain(o.domain.as_deref()))
        .filter_map(|o| o.version)
        .max()
        .unwrap_or(0)
}

/// The lowest default-domain opset the added operators are written for (`Min` on int64,
/// `ArgMax` with `select_last_index`).
const MIN_OPSET: i64 = 12;

/// Rewrites `model` (ONNX protobuf bytes) as `options` ask. Nothing is applied unless
/// everything asked for fits: on error the caller keeps the original model.
pub fn rewrite(model: &[u8], options: &RewriteOptions) -> Result<Rewritten, RewriteError> {
    if options.top_k == Some(0) {
        return Err(RewriteError::ZeroTopK);
    }
    let mut proto = proto::ModelProto::decode(model).map_err(|e| RewriteError::Decode(e.to_string()))?;
    let opset = default_opset(&proto);
    if opset < MIN_OPSET {
        return Err(RewriteError::Opset(opset));
    }
    let meta = ModelMetadata::read(&proto.metadata_props);
    let graph = proto.graph.as_mut().ok_or(RewriteError::NoGraph)?;
    let mut edit = GraphEdit::new(graph, opset);

    let (_, original_input) = input::image_input(graph)?;
    let (input, input_form) = if options.uint8_nhwc_input {
        (input::rewrite_input(graph, &mut edit)?, InputForm::InterleavedU8)
    } else {
        (original_input.clone(), InputForm::PlanarFloat)
    };

    let (original_output, output, output_form) = match options.top_k {
        None => {
            let first = graph.output.first().ok_or(RewriteError::OutputCount(0))?;
            let spec = TensorSpec::from_value_info(first)?;
            (spec.clone(), spec, OutputForm::Unchanged)
        }
        Some(top_k) => match output::classify(graph, &meta)? {
            (spec, Head::EndToEnd) => (spec.clone(), spec, OutputForm::EndToEnd),
            (spec, Head::Raw { num_classes, anchors }) => {
                let (out, max_rows) =
                    output::rewrite_output(graph, &mut edit, &spec, num_classes, anchors, top_k);
                (
                    spec,
                    out,
                    OutputForm::Candidates {
                        max_rows,
                        num_classes,
                    },
                )
            }
        },
    };

    let dfl_folds = if options.fold_dfl_softmax {
        dfl::fold_softmax_conv(graph, &mut edit)
    } else {
        0
    };
    edit.apply(graph);
    if matches!(output_form, OutputForm::Candidates { .. }) {
        // Self-describing: whoever loads the rewritten model (the engine, or anyone given
        // the file) learns the rows still need NMS.
        proto
            .metadata_props
            .retain(|p| p.key.as_deref() != Some(OUTPUT_FORM_KEY));
        proto.metadata_props.push(proto::StringStringEntryProto {
            key: Some(OUTPUT_FORM_KEY.to_string()),
            value: Some(CANDIDATES_FORM.to_string()),
        });
    }
    Ok(Rewritten {
        model: proto.encode_to_vec(),
        input,
        input_form,
        output,
        output_form,
        original_input,
        original_output,
        dfl_folds,
    })
}
