//! Why a model could not be rewritten. Every variant means "keep the plain path for this
//! model"; the message says what in the model did not fit.

/// A model the rewrite does not fit, or bytes that are not a model.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RewriteError {
    #[error("the bytes are not an ONNX model: {0}")]
    Decode(String),
    #[error("the model has no graph")]
    NoGraph,
    #[error(
        "the model imports ONNX opset {0}; the rewrite needs opset 12 or newer (re-export with \
         a newer opset)"
    )]
    Opset(i64),
    #[error("the graph has {0} inputs; the rewrite needs exactly one image input")]
    InputCount(usize),
    #[error("input {name:?} is {element}, not a float image tensor")]
    InputType { name: String, element: String },
    #[error("input {name:?} has shape {shape}; the input rewrite needs [N, 3, H, W]")]
    InputShape { name: String, shape: String },
    #[error(
        "the graph has {0} outputs; the output rewrite handles a single detection output \
         (segmentation and pose models are not supported)"
    )]
    OutputCount(usize),
    #[error("the model's metadata says task {0:?}; only detection heads can be rewritten")]
    Task(String),
    #[error("output {name:?} is {element}; the output rewrite handles float32 and float16 heads")]
    OutputType { name: String, element: String },
    #[error("{name} has shape {shape} but metadata lists {names} names")]
    ClassCount {
        name: String,
        shape: String,
        names: usize,
    },
    #[error(
        "{name} has shape {shape}; the output rewrite needs a raw YOLOv8/11 head [N, 4+C, anchors] \
         with a fixed 4+C"
    )]
    OutputShape { name: String, shape: String },
    #[error("top_k is 0; ask for at least one candidate per image, or None to keep the raw head")]
    ZeroTopK,
    #[error("input {name:?} has shape {shape}, which cannot be fixed at {wanted}")]
    FixedShape {
        name: String,
        shape: String,
        wanted: String,
    },
    #[error("tensor {0:?} has no type in the graph; the rewrite needs typed inputs and outputs")]
    Untyped(String),
}
