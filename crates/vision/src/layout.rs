//! Telling the YOLO output layouts apart from the output's shape and the model's metadata.

use peregrine_types::Dim;

/// How one image's rows sit in the model's detection output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputLayout {
    /// YOLOv8/YOLO11 raw head: `[N, 4 + C, A]`, box as cx, cy, w, h then C class scores,
    /// one column per anchor. Needs NMS.
    ChannelsFirst { num_classes: usize },
    /// YOLOv5 head: `[N, A, 5 + C]`, box as cx, cy, w, h, then objectness, then C class
    /// scores, one row per anchor. Needs NMS.
    AnchorsFirstWithObjectness { num_classes: usize },
    /// End-to-end head (YOLOv10, YOLO26): `[N, K, 6]` rows of x1, y1, x2, y2, score, class,
    /// already free of duplicates.
    EndToEnd,
    /// A raw head reduced inside the graph to its best anchors (`peregrine-onnx`'s output
    /// rewrite): `[N, K, 6]` rows laid out like [`OutputLayout::EndToEnd`]'s, best first,
    /// but still in need of NMS.
    Candidates,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    #[error("detection output must have 3 dimensions [batch, rows, columns], got {0}")]
    Rank(usize),
    #[error(
        "cannot tell the output layout from shape {shape}: expected [N, 4+C, anchors] \
         (YOLOv8/11), [N, anchors, 5+C] (YOLOv5) or [N, K, 6] (end-to-end){names_hint}"
    )]
    Unrecognised { shape: String, names_hint: String },
    #[error("output shape {got:?} does not fit the {layout} layout chosen at load time")]
    ShapeChanged { got: Vec<usize>, layout: &'static str },
}

fn show(dims: &[Dim]) -> String {
    let parts: Vec<String> = dims
        .iter()
        .map(|d| d.fixed().map_or("?".into(), |n| n.to_string()))
        .collect();
    format!("[{}]", parts.join(", "))
}

impl OutputLayout {
    /// Chooses the layout for an output declared as `dims`.
    ///
    /// `num_names` is the number of class names in the metadata, when present; `end2end`
    /// is the metadata's `end2end` flag, when present. Both settle cases the shape alone
    /// cannot, such as a one-class YOLOv5 model (`[N, A, 6]`) against an end-to-end head.
    pub fn infer(dims: &[Dim], num_names: Option<usize>, end2end: Option<bool>) -> Result<Self, LayoutError> {
        if dims.len() != 3 {
            return Err(LayoutError::Rank(dims.len()));
        }
        let (rows, cols) = (dims[1].fixed(), dims[2].fixed());
        let unrecognised = || LayoutError::Unrecognised {
            shape: show(dims),
            names_hint: num_names
                .map(|n| format!(" with {n} class names in the metadata"))
                .unwrap_or_default(),
        };
        if end2end == Some(true) {
            return match cols {
                Some(6) | None => Ok(Self::EndToEnd),
                _ => Err(unrecognised()),
            };
        }
        if let Some(c) = num_names {
            if rows == Some(4 + c) {
                return Ok(Self::ChannelsFirst { num_classes: c });
            }
            if cols == Some(5 + c) {
                return Ok(Self::AnchorsFirstWithObjectness { num_classes: c });
            }
            if cols == Some(6) && end2end.is_none() {
                // Not YOLOv5 (the class count does not fit), so the six columns are boxes.
                return Ok(Self::EndToEnd);
            }
            return Err(unrecognised());
        }
        match (rows, cols) {
            (Some(r), Some(6)) if r > 6 && end2end.is_none() => Ok(Self::EndToEnd),
            (Some(r), None) if r > 4 => Ok(Self::ChannelsFirst { num_classes: r - 4 }),
            (Some(r), Some(c)) if r > 4 && r < c => Ok(Self::ChannelsFirst { num_classes: r - 4 }),
            (_, Some(c)) if c > 5 => Ok(Self::AnchorsFirstWithObjectness { num_classes: c - 5 }),
            _ => Err(unrecognised()),
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Self::ChannelsFirst { .. } => "yolov8",
            Self::AnchorsFirstWithObjectness { .. } => "yolov5",
            Self::EndToEnd => "end2end",
            Self::Candidates => "candidates",
        }
    }

    /// Checks a concrete per-batch output shape `[N, rows, cols]` against this layout and
    /// returns the number of candidate rows (anchors or K) per image.
    pub fn candidates_per_image(&self, shape: &[usize]) -> Result<usize, LayoutError> {
        let bad = || LayoutError::ShapeChanged {
            got: shape.to_vec(),
            layout: self.name(),
        };
        if shape.len() != 3 {
            return Err(bad());
        }
        match *self {
            Self::ChannelsFirst { num_classes } if shape[1] == 4 + num_classes => Ok(shape[2]),
            Self::AnchorsFirstWithObjectness { num_classes } if shape[2] == 5 + num_classes => Ok(shape[1]),
            Self::EndToEnd | Self::Candidates if shape[2] == 6 => Ok(shape[1]),
            _ => Err(bad()),
        }
    }

    /// Whether the rows still need non-maximum suppression.
    pub fn needs_nms(&self) -> bool {
        !matches!(self, Self::EndToEnd)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Dim::{Dynamic as D, Fixed as F};

    #[test]
    fn yolo11_dynamic_anchors() {
        assert_eq!(
            OutputLayout::infer(&[D, F(84), D], Some(80), None).unwrap(),
            OutputLayout::ChannelsFirst { num_classes: 80 }
        );
        assert_eq!(
            OutputLayout::infer(&[D, F(84), F(8400)], None, None).unwrap(),
            OutputLayout::ChannelsFirst { num_classes: 80 }
        );
        assert_eq!(
            OutputLayout::infer(&[D, F(84), D], None, None).unwrap(),
            OutputLayout::ChannelsFirst { num_classes: 80 }
        );
    }

    #[test]
    fn yolov5_layout() {
        assert_eq!(
            OutputLayout::infer(&[F(1), F(25200), F(85)], Some(80), None).unwrap(),
            OutputLayout::AnchorsFirstWithObjectness { num_classes: 80 }
        );
        assert_eq!(
            OutputLayout::infer(&[F(1), F(25200), F(85)], None, None).unwrap(),
            OutputLayout::AnchorsFirstWithObjectness { num_classes: 80 }
        );
        // One class: [N, A, 6] is YOLOv5 when the names say one class.
        assert_eq!(
            OutputLayout::infer(&[F(1), F(25200), F(6)], Some(1), None).unwrap(),
            OutputLayout::AnchorsFirstWithObjectness { num_classes: 1 }
        );
    }

    #[test]
    fn end_to_end_layout() {
        assert_eq!(
            OutputLayout::infer(&[F(1), F(300), F(6)], Some(80), Some(true)).unwrap(),
            OutputLayout::EndToEnd
        );
        assert_eq!(
            OutputLayout::infer(&[F(1), F(300), F(6)], Some(80), None).unwrap(),
            OutputLayout::EndToEnd
        );
        assert_eq!(
            OutputLayout::infer(&[F(1), F(300), F(6)], None, None).unwrap(),
            OutputLayout::EndToEnd
        );
    }

    #[test]
    fn nonsense_shapes_are_refused_with_the_shape_in_the_message() {
        let err = OutputLayout::infer(&[F(1), F(10)], None, None).unwrap_err();
        assert_eq!(err, LayoutError::Rank(2));
        let err = OutputLayout::infer(&[F(1), F(84), F(8400)], Some(3), None).unwrap_err();
        assert!(err.to_string().contains("[1, 84, 8400]"), "{err}");
        assert!(err.to_string().contains("3 class names"), "{err}");
    }

    #[test]
    fn concrete_shapes_are_checked() {
        let l = OutputLayout::ChannelsFirst { num_classes: 80 };
        assert_eq!(l.candidates_per_image(&[2, 84, 8400]).unwrap(), 8400);
        assert!(l.candidates_per_image(&[2, 85, 8400]).is_err());
        assert_eq!(
            OutputLayout::EndToEnd.candidates_per_image(&[1, 300, 6]).unwrap(),
            300
        );
    }
}
