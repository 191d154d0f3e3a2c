//! The distribution-focal-loss (DFL) decoding of YOLOv8/11 heads, refolded so ONNX Runtime's
//! CPU provider computes it with vectorised element-wise operators instead of a slow softmax.
//!
//! The head turns each box side's 16 logits into an expected distance: `Softmax(axis=1)` over
//! `[N, 16, 4, A]`, then a 1x1 `Conv` with weights 0..15. A softmax over a non-last axis costs
//! ONNX Runtime two transposes and 33,600 rows of 16 at 640x640: 5.2 ms of a 68 ms float
//! YOLO11n run on the 2-vCPU development VM, and 13% of the INT8 model's time, where it stays
//! float (docs/benchmarks.md, "The head's box decoding without its softmax"). A bias-free 1x1
//! convolution is linear in its input, so
//!
//! ```text
//! Conv(softmax(x)) = Conv(e) / sum(e),   e = exp(x - max(x)),  max and sum over axis 1
//! ```
//!
//! which is `ReduceMax`, `Sub`, `Exp`, `ReduceSum` over the contiguous anchor axis and one
//! `Div` of the (16 times smaller) convolution output. Same arithmetic up to float rounding:
//! boxes move by under 0.001 px (tested in `tests/parity.rs`).
//!
//! Only float32 sites are refolded (the weights must be a float32 initializer). Ultralytics'
//! fp16 export computes its DFL in float32 between casts, so it is refolded too; a DFL
//! computed in float16 is left alone (not tested on the CPU provider).

use crate::edit::{attr_int, attr_ints, GraphEdit};
use crate::is_default_domain;
use crate::proto::tensor_proto::DataType;
use crate::proto::{AttributeProto, GraphProto};

/// Refolds every softmax-then-convolution site in `graph` as the module describes and returns
/// how many it changed. New constants go to `edit` (spliced in by `GraphEdit::apply`); the
/// new nodes are placed where the softmax was and right after the convolution, which keeps
/// the node list topologically sorted.
pub(crate) fn fold_softmax_conv(graph: &mut GraphProto, edit: &mut GraphEdit) -> usize {
    // Softmax's `axis` meant "flatten from here" before opset 13: a different function.
    if edit.opset < 13 {
        return 0;
    }
    let sites: Vec<(usize, usize)> = (0..graph.node.len())
        .filter_map(|s| Some((s, folded_conv(graph, s)?)))
        .collect();
    // From the back, so that indices of sites not yet handled stay valid.
    for &(softmax, conv) in sites.iter().rev() {
        fold_one(graph, edit, softmax, conv);
    }
    sites.len()
}

/// The index of the convolution that node `s` feeds, when `s` is a softmax over axis 1 whose
/// only reader is a bias-free float32 1x1 convolution with default strides, pads, dilations
/// and one group, and its output is not one of the graph's.
fn folded_conv(graph: &GraphProto, s: usize) -> Option<usize> {
    let softmax = &graph.node[s];
    if softmax.op_type.as_deref() != Some("Softmax") || !is_default_domain(softmax.domain.as_deref()) {
        return None;
    }
    if int_attr(&softmax.attribute, "axis") != Some(1) || softmax.output.len() != 1 {
        return None;
    }
    let probs = &softmax.output[0];
    if graph.output.iter().any(|o| o.name.as_ref() == Some(probs)) {
        return None;
    }
    let readers: Vec<usize> = (0..graph.node.len())
        .filter(|&i| graph.node[i].input.iter().any(|x| x == probs))
        .collect();
    let [c] = readers[..] else { return None };
    let conv = &graph.node[c];
    let plain = conv.op_type.as_deref() == Some("Conv")
        && is_default_domain(conv.domain.as_deref())
        && c > s
        && conv.input.len() == 2
        && conv.input[0] == *probs
        && conv.output.len() == 1
        && conv.attribute.iter().all(is_default_conv_attribute);
    (plain && is_f32_pointwise_weight(graph, &conv.input[1])).then_some(c)
}

fn fold_one(graph: &mut GraphProto, edit: &mut GraphEdit, softmax: usize, conv: usize) {
    let logits = graph.node[softmax].input[0].clone();
    let max = edit.fresh("dfl/max");
    let shifted = edit.fresh("dfl/shifted");
    let exp = edit.fresh("dfl/exp");
    let sum = edit.fresh("dfl/sum");
    let numerator = edit.fresh("dfl/numerator");
    // ReduceSum takes its axes as an input from opset 13 (which `fold_softmax_conv`
    // requires), ReduceMax only from 18.
    let axes = edit.const_i64("dfl/axes", &[1], &[1]);
    let keepdims = || attr_int("keepdims", 1);
    let reduce_max = if edit.opset >= 18 {
        edit.detached(
            "ReduceMax",
            &[&logits, &axes],
            vec![max.clone()],
            vec![keepdims()],
        )
    } else {
        let attrs = vec![attr_ints("axes", &[1]), keepdims()];
        edit.detached("ReduceMax", &[&logits], vec![max.clone()], attrs)
    };
    let head = [
        reduce_max,
        edit.detached("Sub", &[&logits, &max], vec![shifted.clone()], vec![]),
        edit.detached("Exp", &[&shifted], vec![exp.clone()], vec![]),
        edit.detached("ReduceSum", &[&exp, &axes], vec![sum.clone()], vec![keepdims()]),
    ];
    let out = std::mem::replace(&mut graph.node[conv].output[0], numerator.clone());
    graph.node[conv].input[0] = exp;
    let divide = edit.detached("Div", &[&numerator, &sum], vec![out], vec![]);
    // The Div first (it is later in the list), then the softmax's place.
    graph.node.insert(conv + 1, divide);
    graph.node.splice(softmax..=softmax, head);
}

fn int_attr(attrs: &[AttributeProto], name: &str) -> Option<i64> {
    attrs
        .iter()
        .find(|a| a.name.as_deref() == Some(name))
        .and_then(|a| a.i)
}

/// A convolution attribute with the value that makes it a plain per-pixel product.
fn is_default_conv_attribute(a: &AttributeProto) -> bool {
    match a.name.as_deref() {
        Some("group") => a.i == Some(1),
        Some("strides") | Some("dilations") => a.ints.iter().all(|&v| v == 1),
        Some("pads") => a.ints.iter().all(|&v| v == 0),
        Some("kernel_shape") => a.ints.iter().all(|&v| v == 1),
        Some("auto_pad") => matches!(a.s.as_deref(), None | Some(b"NOTSET") | Some(b"VALID")),
        _ => false,
    }
}

/// Whether `name` is a float32 initializer shaped `[M, C, 1, 1]`.
fn is_f32_pointwise_weight(graph: &GraphProto, name: &str) -> bool {
    graph.initializer.iter().any(|t| {
        t.name.as_deref() == Some(name)
            && t.data_type == Some(DataType::Float as i32)
            && t.dims.len() == 4
            && t.dims[2] == 1
            && t.dims[3] == 1
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{NodeProto, TensorProto};

    fn n(op: &str, inputs: &[&str], output: &str, attribute: Vec<AttributeProto>) -> NodeProto {
        NodeProto {
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: vec![output.into()],
            name: Some(format!("{op}_{output}")),
            op_type: Some(op.into()),
            attribute,
            ..Default::default()
        }
    }

    fn weight(name: &str, ty: DataType, dims: &[i64]) -> TensorProto {
        TensorProto {
            name: Some(name.into()),
            data_type: Some(ty as i32),
            dims: dims.to_vec(),
            ..Default::default()
        }
    }

    /// x -> Reshape -> Softmax(axis) -> Conv(w) -> Reshape -> y, as Ultralytics exports it.
    fn head(axis: i64, conv_attrs: Vec<AttributeProto>, w: TensorProto) -> GraphProto {
        GraphProto {
            node: vec![
                n("Reshape", &["x", "shape"], "logits", vec![]),
                n("Softmax", &["logits"], "probs", vec![attr_int("axis", axis)]),
                n("Conv", &["probs", "w"], "dist", conv_attrs),
                n("Reshape", &["dist", "shape2"], "y", vec![]),
            ],
            initializer: vec![w],
            ..Default::default()
        }
    }

    fn ops(graph: &GraphProto) -> Vec<&str> {
        graph.node.iter().map(|n| n.op_type.as_deref().unwrap()).collect()
    }

    #[test]
    fn the_softmax_becomes_exp_and_the_convolution_is_divided_by_its_sum() {
        let w = weight("w", DataType::Float, &[1, 16, 1, 1]);
        let mut graph = head(
            1,
            vec![attr_ints("kernel_shape", &[1, 1]), attr_int("group", 1)],
            w,
        );
        let mut edit = GraphEdit::new(&graph, 17);
        assert_eq!(fold_softmax_conv(&mut graph, &mut edit), 1);
        edit.apply(&mut graph);
        let got = ops(&graph);
        let want = [
            "Reshape",
            "ReduceMax",
            "Sub",
            "Exp",
            "ReduceSum",
            "Conv",
            "Div",
            "Reshape",
        ];
        assert_eq!(got, want);
        let by_op = |op: &str| {
            graph
                .node
                .iter()
                .find(|n| n.op_type.as_deref() == Some(op))
                .unwrap()
        };
        // The convolution reads the exponentials; the division writes the name the rest of
        // the graph reads, so nothing downstream changes.
        assert_eq!(by_op("Conv").input[0], by_op("Exp").output[0]);
        assert_eq!(
            by_op("Div").input,
            [
                by_op("Conv").output[0].clone(),
                by_op("ReduceSum").output[0].clone()
            ]
        );
        assert_eq!(by_op("Div").output, ["dist"]);
        assert_eq!(
            by_op("Sub").input,
            ["logits".to_string(), by_op("ReduceMax").output[0].clone()]
        );
        // Opset 17: ReduceMax's axes are an attribute, ReduceSum's an input.
        assert_eq!(by_op("ReduceMax").input.len(), 1);
        assert_eq!(by_op("ReduceSum").input.len(), 2);
        assert_eq!(graph.initializer.len(), 2);
    }

    #[test]
    fn opset_18_gives_reduce_max_its_axes_as_an_input() {
        let mut graph = head(1, vec![], weight("w", DataType::Float, &[1, 16, 1, 1]));
        let mut edit = GraphEdit::new(&graph, 18);
        assert_eq!(fold_softmax_conv(&mut graph, &mut edit), 1);
        let max = graph
            .node
            .iter()
            .find(|n| n.op_type.as_deref() == Some("ReduceMax"))
            .unwrap();
        assert_eq!(max.input.len(), 2);
        assert!(max.attribute.iter().all(|a| a.name.as_deref() != Some("axes")));
    }

    #[test]
    fn sites_that_are_not_the_linear_pattern_are_left_alone() {
        let f32_w = || weight("w", DataType::Float, &[1, 16, 1, 1]);
        let cases = [
            ("another axis", head(-1, vec![], f32_w())),
            (
                "float16 weights",
                head(1, vec![], weight("w", DataType::Float16, &[1, 16, 1, 1])),
            ),
            (
                "a 3x3 kernel",
                head(1, vec![], weight("w", DataType::Float, &[1, 16, 3, 3])),
            ),
            ("strided", head(1, vec![attr_ints("strides", &[2, 2])], f32_w())),
            ("grouped", head(1, vec![attr_int("group", 2)], f32_w())),
            ("padded", head(1, vec![attr_ints("pads", &[0, 1, 0, 1])], f32_w())),
        ];
        for (what, mut graph) in cases {
            let before = graph.clone();
            let mut edit = GraphEdit::new(&graph, 17);
            assert_eq!(fold_softmax_conv(&mut graph, &mut edit), 0, "{what}");
            assert_eq!(graph, before, "{what}");
        }
        // A bias adds after the division; the softmax read twice; the probabilities an output.
        let mut biased = head(1, vec![], f32_w());
        biased.node[2].input.push("b".into());
        let mut twice = head(1, vec![], f32_w());
        twice.node.push(n("Identity", &["probs"], "p2", vec![]));
        let mut output = head(1, vec![], f32_w());
        output.output.push(crate::proto::ValueInfoProto {
            name: Some("probs".into()),
            ..Default::default()
        });
        for (what, mut graph) in [("biased", biased), ("read twice", twice), ("an output", output)] {
            let mut edit = GraphEdit::new(&graph, 17);
            assert_eq!(fold_softmax_conv(&mut graph, &mut edit), 0, "{what}");
        }
        // Before opset 13 Softmax's axis meant something else.
        let mut old = head(1, vec![], f32_w());
        let mut edit = GraphEdit::new(&old, 12);
        assert_eq!(fold_softmax_conv(&mut old, &mut edit), 0);
    }
}
