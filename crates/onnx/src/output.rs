//! The output rewrite: a raw YOLOv8/11 head `[N, 4+C, A]` becomes `candidates`
//! `[N, K, 6]` float32, rows of x1, y1, x2, y2, score, class in model-input pixels, best
//! first, so the device sends K rows instead of A columns of 4+C values.
//!
//! Appended after the original nodes (`head` is the original output, e.g. `output0`):
//!
//! ```text
//! head ─(float16 heads: Cast float)─▶ h
//! h ─Slice[4:4+C] axis 1─▶ scores ─ReduceMax axis 1─▶ best [N,A]
//!                                 └ArgMax axis 1──▶ class [N,A] int64 (first max wins)
//! best ─TopK(k, axis 1, largest, sorted)─▶ top_score [N,k], top_index [N,k]
//!        k = min(K, A): a constant when A is fixed, Shape ▸ Gather ▸ Min when it is not
//! top_index ─Unsqueeze 1 ▸ Expand [1,4,1]─▶ GatherElements(h[0:4], axis 2) ─▶ cxcywh [N,4,k]
//! cxcywh[0:2] = (cx, cy), cxcywh[2:4] = (w, h); half = wh / 2
//! Concat(xy - half, xy + half, top_score, Cast(GatherElements(class, top_index))) axis 1
//!   ─Transpose(0,2,1)─▶ candidates [N,k,6]
//! ```
//!
//! Why this arithmetic: `BBox::from_cxcywh` computes `hw = w / 2.0`, then `cx - hw`,
//! `cx + hw`, each rounded once in f32; the graph does the same operations one node each, so
//! corners match the CPU path bit for bit. The head is widened to float32 first, as the CPU
//! path does before it postprocesses, so float16 models agree too. The score is a copy of
//! the best class score (ReduceMax is exact), and ArgMax without `select_last_index` keeps
//! the first of equal scores, as the CPU best-class scan (strict `>`) does. TopK orders
//! equal scores by lower anchor index, which is the order the CPU path's stable NMS sort
//! visits them in.
//!
//! On other execution providers the graph means the same, but two orders are the kernels'
//! choice: ONNX Runtime's CUDA TopK (a radix select for K = 1024 over 8400 anchors) does not
//! promise lower-index-first among equal scores, nor which of several equal scores at the
//! K-th place get in, and cuDNN's ArgMax does not promise the first of equal class scores.
//! Float32 scores rarely tie; a float16 head's do, so on a GPU two overlapping boxes of one
//! class with bit-equal scores may swap which one NMS keeps.

use crate::edit::{attr_int, attr_ints, slice, unsqueeze, GraphEdit, Place};
use crate::metadata::ModelMetadata;
use crate::proto::tensor_proto::DataType;
use crate::proto::GraphProto;
use crate::tensor::{Dim, ElementType, TensorSpec};
use crate::RewriteError;

/// The name of the graph output the rewrite produces (`candidates_1` and so on if the graph
/// already uses it; [`crate::Rewritten::output`] has the name given), and of its row
/// dimension when the anchor count is dynamic.
pub const CANDIDATES: &str = "candidates";

/// What kind of detection head the graph ends in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Head {
    /// `[N, 4 + C, A]`, needs the output rewrite.
    Raw {
        num_classes: usize,
        anchors: Option<u64>,
    },
    /// `[N, K, 6]`: already compact and ranked.
    EndToEnd,
}

/// The graph's one output and what head it is. Mirrors `peregrine_vision::OutputLayout::infer`
/// for the layouts it shares, so the rewrite and the plain path agree on what a model is.
pub(crate) fn classify(graph: &GraphProto, meta: &ModelMetadata) -> Result<(TensorSpec, Head), RewriteError> {
    if graph.output.len() != 1 {
        return Err(RewriteError::OutputCount(graph.output.len()));
    }
    if let Some(task) = meta.task.as_deref().filter(|t| *t != "detect") {
        return Err(RewriteError::Task(task.to_string()));
    }
    let spec = TensorSpec::from_value_info(&graph.output[0])?;
    if !matches!(spec.element, ElementType::F32 | ElementType::F16) {
        return Err(RewriteError::OutputType {
            name: spec.name.clone(),
            element: spec.element.to_string(),
        });
    }
    let bad_shape = || RewriteError::OutputShape {
        name: spec.name.clone(),
        shape: spec.shape_string(),
    };
    let Some([_, rows, cols]) = spec.dims.as_deref() else {
        return Err(bad_shape());
    };
    let (rows, cols) = (rows.fixed(), cols.fixed());
    if meta.end2end == Some(true) {
        return match cols {
            Some(6) | None => Ok((spec, Head::EndToEnd)),
            _ => Err(bad_shape()),
        };
    }
    let raw = |c: usize| Head::Raw {
        num_classes: c,
        anchors: cols,
    };
    let head = match (meta.num_names, rows) {
        (Some(n), Some(r)) if r == 4 + n as u64 => raw(n),
        (Some(_), _) if cols == Some(6) && meta.end2end.is_none() => Head::EndToEnd,
        (Some(names), _) => {
            return Err(RewriteError::ClassCount {
                name: spec.name.clone(),
                shape: spec.shape_string(),
                names,
            })
        }
        (None, Some(r)) if cols == Some(6) && r > 6 && meta.end2end.is_none() => Head::EndToEnd,
        // Without names, channels-first is recognised as layout.rs does: more anchors than rows.
        (None, Some(r)) if r > 4 && cols.is_none_or(|a| r < a) => raw((r - 4) as usize),
        _ => return Err(bad_shape()),
    };
    Ok((spec, head))
}

/// Appends the candidate extraction after `head` and makes `candidates` the graph's only
/// output. Returns the new output's description and the most rows it can hold.
pub(crate) fn rewrite_output(
    graph: &mut GraphProto,
    edit: &mut GraphEdit,
    head: &TensorSpec,
    num_classes: usize,
    anchors: Option<u64>,
    top_k: usize,
) -> (TensorSpec, usize) {
    // ONNX shapes are int64; no graph has more anchors than that anyway.
    let top_k = top_k.min(i64::MAX as usize);
    let best = best_class_per_anchor(edit, head, 4 + num_classes as i64);
    let (k_input, k_rows, k_dim) = candidate_count(edit, &best.score, anchors, top_k);
    let rows_first = top_candidates(edit, &best, &k_input);
    let b = Place::Back;
    let out_name = edit.unique(CANDIDATES);
    edit.push(
        b,
        "Transpose",
        &[&rows_first],
        vec![out_name.clone()],
        vec![attr_ints("perm", &[0, 2, 1])],
    );

    let batch = head
        .dims
        .as_ref()
        .and_then(|d| d.first().cloned())
        .unwrap_or(Dim::Unknown);
    let out = TensorSpec {
        name: out_name,
        element: ElementType::F32,
        dims: Some(vec![batch, k_dim, Dim::Fixed(6)]),
    };
    // The raw head becomes internal: keep its declaration, drop it from the outputs so the
    // runtime never copies it off the device.
    let old = std::mem::replace(&mut graph.output[0], out.to_value_info());
    if !graph.value_info.iter().any(|v| v.name == old.name) {
        graph.value_info.push(old);
    }
    (out, k_rows)
}

/// Per anchor of the head `[N, 4 + classes, A]`: its box rows, best score and best class.
struct BestPerAnchor {
    boxes: String,
    score: String,
    class: String,
}

fn best_class_per_anchor(edit: &mut GraphEdit, head: &TensorSpec, rows: i64) -> BestPerAnchor {
    let b = Place::Back;
    let h = match head.element {
        ElementType::F16 => edit.node(
            b,
            "Cast",
            "head_f32",
            &[&head.name],
            vec![attr_int("to", DataType::Float as i64)],
        ),
        _ => head.name.clone(),
    };
    let boxes = slice(edit, "cxcywh_all", &h, 1, 0, 4);
    let scores = slice(edit, "class_scores", &h, 1, 4, rows);
    let score = if edit.opset >= 18 {
        let axes = edit.const_i64("axes", &[1], &[1]);
        edit.node(
            b,
            "ReduceMax",
            "best_score",
            &[&scores, &axes],
            vec![attr_int("keepdims", 0)],
        )
    } else {
        let attrs = vec![attr_ints("axes", &[1]), attr_int("keepdims", 0)];
        edit.node(b, "ReduceMax", "best_score", &[&scores], attrs)
    };
    let class = edit.node(
        b,
        "ArgMax",
        "best_class",
        &[&scores],
        vec![
            attr_int("axis", 1),
            attr_int("keepdims", 0),
            attr_int("select_last_index", 0),
        ],
    );
    BestPerAnchor { boxes, score, class }
}

/// k = min(K, A), as the tensor TopK reads, the most rows it gives and its output dim.
/// TopK fails outright when asked for more elements than there are.
fn candidate_count(
    edit: &mut GraphEdit,
    best: &str,
    anchors: Option<u64>,
    top_k: usize,
) -> (String, usize, Dim) {
    let b = Place::Back;
    match anchors {
        Some(a) => {
            let k = (top_k as u64).min(a);
            let name = edit.const_i64("k", &[1], &[k as i64]);
            (name, k as usize, Dim::Fixed(k))
        }
        None => {
            let shape = edit.node(b, "Shape", "best_shape", &[best], vec![]);
            let one = edit.const_i64("index_1", &[1], &[1]);
            let a = edit.node(b, "Gather", "anchors", &[&shape, &one], vec![attr_int("axis", 0)]);
            let want = edit.const_i64("top_k", &[1], &[top_k as i64]);
            let k = edit.node(b, "Min", "k", &[&a, &want], vec![]);
            // A dim_param, not a tensor name: its own namespace.
            (k, top_k, Dim::Named(CANDIDATES.into()))
        }
    }
}

/// The k best anchors as `[N, 6, k]` rows of x1, y1, x2, y2, score, class.
fn top_candidates(edit: &mut GraphEdit, best: &BestPerAnchor, k_input: &str) -> String {
    let b = Place::Back;
    let top = edit.node_n(
        b,
        "TopK",
        &[&best.score, k_input],
        &["top_score", "top_index"],
        vec![attr_int("axis", 1), attr_int("largest", 1), attr_int("sorted", 1)],
    );
    let (top_score, top_index) = (&top[0], &top[1]);

    let index = unsqueeze(edit, b, "top_index_3d", top_index, 1);
    let four = edit.const_i64("expand_shape", &[3], &[1, 4, 1]);
    let index4 = edit.node(b, "Expand", "top_index_4", &[&index, &four], vec![]);
    let cxcywh = edit.node(
        b,
        "GatherElements",
        "cxcywh",
        &[&best.boxes, &index4],
        vec![attr_int("axis", 2)],
    );
    let top_class = edit.node(
        b,
        "GatherElements",
        "top_class",
        &[&best.class, top_index],
        vec![attr_int("axis", 1)],
    );

    let xy = slice(edit, "cxcy", &cxcywh, 1, 0, 2);
    let wh = slice(edit, "wh", &cxcywh, 1, 2, 4);
    let two = edit.const_f32("two", 2.0);
    let half = edit.node(b, "Div", "half_wh", &[&wh, &two], vec![]);
    let x1y1 = edit.node(b, "Sub", "x1y1", &[&xy, &half], vec![]);
    let x2y2 = edit.node(b, "Add", "x2y2", &[&xy, &half], vec![]);
    let score = unsqueeze(edit, b, "score_row", top_score, 1);
    let class_f = edit.node(
        b,
        "Cast",
        "top_class_f32",
        &[&top_class],
        vec![attr_int("to", DataType::Float as i64)],
    );
    let class_row = unsqueeze(edit, b, "class_row", &class_f, 1);
    edit.node(
        b,
        "Concat",
        "candidates_nck",
        &[&x1y1, &x2y2, &score, &class_row],
        vec![attr_int("axis", 1)],
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::ValueInfoProto;
    use Dim::{Fixed as F, Named as N};

    fn graph_with_output(element: ElementType, dims: Vec<Dim>) -> GraphProto {
        let out: ValueInfoProto = TensorSpec {
            name: "output0".into(),
            element,
            dims: Some(dims),
        }
        .to_value_info();
        GraphProto {
            output: vec![out],
            ..Default::default()
        }
    }

    fn meta(names: Option<usize>, end2end: Option<bool>) -> ModelMetadata {
        ModelMetadata {
            num_names: names,
            task: Some("detect".into()),
            end2end,
        }
    }

    #[test]
    fn recognises_raw_and_end_to_end_heads() {
        let g = graph_with_output(
            ElementType::F32,
            vec![N("batch".into()), F(84), N("anchors".into())],
        );
        let (_, head) = classify(&g, &meta(Some(80), Some(false))).unwrap();
        assert_eq!(
            head,
            Head::Raw {
                num_classes: 80,
                anchors: None
            }
        );
        let (_, head) = classify(&g, &meta(None, None)).unwrap();
        assert_eq!(
            head,
            Head::Raw {
                num_classes: 80,
                anchors: None
            }
        );
        let g = graph_with_output(ElementType::F32, vec![F(1), F(300), F(6)]);
        assert_eq!(
            classify(&g, &meta(Some(80), Some(true))).unwrap().1,
            Head::EndToEnd
        );
        assert_eq!(classify(&g, &meta(Some(80), None)).unwrap().1, Head::EndToEnd);
    }

    #[test]
    fn class_count_mismatch_names_both_sides() {
        let g = graph_with_output(ElementType::F32, vec![N("N".into()), F(85), F(8400)]);
        let err = classify(&g, &meta(Some(80), Some(false))).unwrap_err();
        assert_eq!(
            err.to_string(),
            "output0 has shape [N, 85, 8400] but metadata lists 80 names"
        );
    }

    #[test]
    fn other_heads_and_tasks_are_refused() {
        // YOLOv5's [N, A, 5 + C] is not a layout the rewrite handles.
        let g = graph_with_output(ElementType::F32, vec![F(1), F(25200), F(85)]);
        assert!(matches!(
            classify(&g, &meta(None, None)),
            Err(RewriteError::OutputShape { .. })
        ));
        let g = graph_with_output(ElementType::Other(7), vec![F(1), F(84), F(8400)]);
        let err = classify(&g, &meta(Some(80), None)).unwrap_err();
        assert!(err.to_string().contains("is int64"), "{err}");
        let g = graph_with_output(ElementType::F32, vec![F(1), F(116), F(8400)]);
        let seg = ModelMetadata {
            task: Some("segment".into()),
            ..meta(Some(80), None)
        };
        assert_eq!(
            classify(&g, &seg).unwrap_err(),
            RewriteError::Task("segment".into())
        );
    }
}
