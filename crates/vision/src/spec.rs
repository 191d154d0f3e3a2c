//! What the detection pipeline needs to know about a model, read off its description.

use peregrine_types::model::{ElementType, CANDIDATES_FORM, OUTPUT_FORM_KEY};
use peregrine_types::{ClassNames, Dim, ModelDescription};

use crate::layout::{LayoutError, OutputLayout};

/// How the model takes its images.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputForm {
    /// `float32 [N, 3, H, W]`, RGB in `[0, 1]`: the host normalises each canvas.
    PlanarF32,
    /// `uint8 [N, H, W, 3]`: the letterboxed canvases as they are, normalised inside the
    /// graph (`peregrine-onnx`'s input rewrite).
    InterleavedU8,
}

impl InputForm {
    /// Bytes of one input element.
    pub fn element_size(self) -> usize {
        match self {
            Self::PlanarF32 => 4,
            Self::InterleavedU8 => 1,
        }
    }
}

/// Everything the pre- and postprocessing need: input size, batch limits, class names and
/// the output layout.
#[derive(Debug, Clone, PartialEq)]
pub struct DetectorSpec {
    pub input_name: String,
    pub input_form: InputForm,
    pub output_name: String,
    pub input_width: usize,
    pub input_height: usize,
    pub stride: usize,
    /// `Some(n)` when the model's batch dimension is fixed at `n`.
    pub fixed_batch: Option<usize>,
    pub names: ClassNames,
    pub layout: OutputLayout,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error("the model has {0} inputs; a detector takes exactly one image input")]
    InputCount(usize),
    #[error("the model has no outputs")]
    NoOutputs,
    #[error(
        "input {name:?} has shape {shape}; a detector takes float32 [batch, 3, height, width] \
         or uint8 [batch, height, width, 3]"
    )]
    InputShape { name: String, shape: String },
    #[error("input {name:?} is {element}; only float32 and uint8 image inputs are supported")]
    InputType { name: String, element: String },
    #[error(
        "the model's input is fixed at {fixed_h}x{fixed_w}; it cannot run at the requested \
         {want_h}x{want_w}"
    )]
    SizeConflict {
        fixed_h: usize,
        fixed_w: usize,
        want_h: usize,
        want_w: usize,
    },
    #[error("input size {0}x{1} is not a positive multiple of the model stride {2}")]
    BadSize(usize, usize, usize),
    #[error("output {name:?}: {source}")]
    Layout {
        name: String,
        #[source]
        source: LayoutError,
    },
}

const DEFAULT_IMGSZ: usize = 640;
const DEFAULT_STRIDE: usize = 32;

impl DetectorSpec {
    /// Reads the spec off `model`. `imgsz` (height, width) picks the input size of a model
    /// with dynamic height and width; otherwise the metadata's `imgsz`, then 640, is used.
    pub fn from_model(model: &ModelDescription, imgsz: Option<(usize, usize)>) -> Result<Self, SpecError> {
        let [input] = model.inputs.as_slice() else {
            return Err(SpecError::InputCount(model.inputs.len()));
        };
        let output = model.outputs.first().ok_or(SpecError::NoOutputs)?;
        let input_form = match input.element {
            ElementType::F32 => InputForm::PlanarF32,
            ElementType::U8 => InputForm::InterleavedU8,
            _ => {
                return Err(SpecError::InputType {
                    name: input.name.clone(),
                    element: format!("{:?}", input.element).to_lowercase(),
                })
            }
        };
        // (height, width) dimension indices of the two layouts.
        let (channels, hw) = match input_form {
            InputForm::PlanarF32 => (1, (2, 3)),
            InputForm::InterleavedU8 => (3, (1, 2)),
        };
        // A uint8 input exists only as the rewrite makes it, with its channels fixed at 3.
        let shape_ok = input.dims.len() == 4
            && match input_form {
                InputForm::PlanarF32 => matches!(input.dims[channels], Dim::Fixed(3) | Dim::Dynamic),
                InputForm::InterleavedU8 => input.dims[channels] == Dim::Fixed(3),
            };
        if !shape_ok {
            return Err(SpecError::InputShape {
                name: input.name.clone(),
                shape: format!("{:?}", input.dims),
            });
        }
        let meta = |k: &str| model.metadata.get(k).map(String::as_str);
        let stride = meta("stride")
            .and_then(|s| s.trim().parse().ok())
            .filter(|&s: &usize| s > 0)
            .unwrap_or(DEFAULT_STRIDE);
        let (height, width) = match (input.dims[hw.0].fixed(), input.dims[hw.1].fixed()) {
            (Some(h), Some(w)) => {
                if let Some((want_h, want_w)) = imgsz.filter(|&s| s != (h, w)) {
                    return Err(SpecError::SizeConflict {
                        fixed_h: h,
                        fixed_w: w,
                        want_h,
                        want_w,
                    });
                }
                (h, w)
            }
            _ => {
                let (h, w) = imgsz
                    .or_else(|| meta("imgsz").and_then(parse_imgsz))
                    .unwrap_or((DEFAULT_IMGSZ, DEFAULT_IMGSZ));
                if h == 0 || w == 0 || h % stride != 0 || w % stride != 0 {
                    return Err(SpecError::BadSize(h, w, stride));
                }
                (h, w)
            }
        };
        let names = meta("names")
            .and_then(ClassNames::from_ultralytics)
            .unwrap_or_default();
        let end2end = meta("end2end").map(|v| v.trim().eq_ignore_ascii_case("true"));
        let num_names = (!names.is_empty()).then_some(names.len());
        let layout_err = |source| SpecError::Layout {
            name: output.name.clone(),
            source,
        };
        let layout = if meta(OUTPUT_FORM_KEY) == Some(CANDIDATES_FORM) {
            let rows_of_six =
                output.dims.len() == 3 && matches!(output.dims[2], Dim::Fixed(6) | Dim::Dynamic);
            if !rows_of_six {
                return Err(layout_err(LayoutError::ShapeChanged {
                    got: output.dims.iter().map(|d| d.fixed().unwrap_or(0)).collect(),
                    layout: "candidates",
                }));
            }
            OutputLayout::Candidates
        } else {
            OutputLayout::infer(&output.dims, num_names, end2end).map_err(layout_err)?
        };
        Ok(Self {
            input_name: input.name.clone(),
            input_form,
            output_name: output.name.clone(),
            input_width: width,
            input_height: height,
            stride,
            fixed_batch: input.dims[0].fixed(),
            names,
            layout,
        })
    }

    /// Elements in one image's slot of the input batch (floats or bytes, as
    /// [`DetectorSpec::input_form`] says).
    pub fn image_len(&self) -> usize {
        3 * self.input_width * self.input_height
    }
}

/// `imgsz` as Ultralytics writes it: `[640, 640]` (height, width) or a single `640`.
fn parse_imgsz(s: &str) -> Option<(usize, usize)> {
    let nums: Vec<usize> = s
        .trim_matches(|c| c == '[' || c == ']' || c == '(' || c == ')')
        .split(',')
        .map(|p| p.trim().parse().ok())
        .collect::<Option<_>>()?;
    match nums.as_slice() {
        [n] => Some((*n, *n)),
        [h, w] => Some((*h, *w)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use peregrine_types::TensorDescription;
    use std::collections::BTreeMap;

    fn model(input: Vec<Dim>, output: Vec<Dim>, meta: &[(&str, &str)]) -> ModelDescription {
        ModelDescription {
            inputs: vec![TensorDescription {
                name: "images".into(),
                element: ElementType::F32,
                dims: input,
            }],
            outputs: vec![TensorDescription {
                name: "output0".into(),
                element: ElementType::F32,
                dims: output,
            }],
            metadata: meta
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>(),
        }
    }

    use Dim::{Dynamic as D, Fixed as F};

    #[test]
    fn parses_imgsz() {
        assert_eq!(parse_imgsz("[640, 480]"), Some((640, 480)));
        assert_eq!(parse_imgsz("320"), Some((320, 320)));
        assert_eq!(parse_imgsz("[a]"), None);
    }

    #[test]
    fn dynamic_model_uses_metadata_then_override() {
        let m = model(
            vec![D, F(3), D, D],
            vec![D, F(6), D],
            &[
                ("names", "{0: 'a', 1: 'b'}"),
                ("imgsz", "[320, 320]"),
                ("stride", "32"),
            ],
        );
        let s = DetectorSpec::from_model(&m, None).unwrap();
        assert_eq!((s.input_height, s.input_width, s.fixed_batch), (320, 320, None));
        assert_eq!(s.layout, OutputLayout::ChannelsFirst { num_classes: 2 });
        let s = DetectorSpec::from_model(&m, Some((480, 640))).unwrap();
        assert_eq!((s.input_height, s.input_width), (480, 640));
        assert!(matches!(
            DetectorSpec::from_model(&m, Some((500, 640))),
            Err(SpecError::BadSize(500, 640, 32))
        ));
    }

    #[test]
    fn fixed_model_refuses_other_sizes() {
        let m = model(
            vec![F(1), F(3), F(640), F(640)],
            vec![F(1), F(300), F(6)],
            &[("end2end", "True")],
        );
        let s = DetectorSpec::from_model(&m, None).unwrap();
        assert_eq!((s.fixed_batch, s.layout), (Some(1), OutputLayout::EndToEnd));
        assert!(matches!(
            DetectorSpec::from_model(&m, Some((320, 320))),
            Err(SpecError::SizeConflict { .. })
        ));
    }

    #[test]
    fn non_image_models_are_refused_clearly() {
        let m = model(vec![D, F(10)], vec![D, F(84), D], &[]);
        let err = DetectorSpec::from_model(&m, None).unwrap_err();
        assert!(err.to_string().contains("[batch, 3, height, width]"), "{err}");
        let mut m = model(vec![D, F(3), D, D], vec![D, F(84), D], &[]);
        m.inputs[0].element = ElementType::Other("int64".into());
        assert!(matches!(
            DetectorSpec::from_model(&m, None),
            Err(SpecError::InputType { .. })
        ));
        // uint8 comes only as [N, H, W, 3].
        m.inputs[0].element = ElementType::U8;
        assert!(matches!(
            DetectorSpec::from_model(&m, None),
            Err(SpecError::InputShape { .. })
        ));
    }

    #[test]
    fn rewritten_graphs_take_uint8_canvases_and_give_candidates() {
        let mut m = model(
            vec![D, D, D, F(3)],
            vec![D, D, F(6)],
            &[
                ("names", "{0: 'a', 1: 'b'}"),
                ("imgsz", "[320, 480]"),
                (OUTPUT_FORM_KEY, CANDIDATES_FORM),
            ],
        );
        m.inputs[0].element = ElementType::U8;
        let s = DetectorSpec::from_model(&m, None).unwrap();
        assert_eq!(s.input_form, InputForm::InterleavedU8);
        assert_eq!((s.input_height, s.input_width), (320, 480));
        assert_eq!(s.layout, OutputLayout::Candidates);
        assert!(s.layout.needs_nms());
        assert_eq!(s.image_len() * s.input_form.element_size(), 320 * 480 * 3);
    }
}
