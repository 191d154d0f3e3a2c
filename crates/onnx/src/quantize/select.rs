//! Which nodes of a graph are quantized, which tensors calibration must see, and the
//! calibration graph (the model with those tensors as extra outputs).
//!
//! The rule: every `Conv` with constant weights is quantized, except those named in
//! [`Selection::exclude`] and, by default, the output convolutions (those from which no
//! other convolution is reachable: the last layer of each head branch, whose outputs are
//! decoded into boxes and scores, and the DFL projection; "reachable" through the
//! operators quantized here, so a `Reshape` ends the path). With
//! [`Selection::quantize_activation_ops`], the element-wise and data-movement operators
//! between quantized convolutions (SiLU's `Sigmoid` and `Mul`, residual `Add`, `Concat`,
//! `Split`, `MaxPool`, `Resize`) are quantized too, so data stays 8-bit from one
//! convolution to the next and ONNX Runtime can fuse each `DequantizeLinear -> op ->
//! QuantizeLinear` group into one integer kernel. Operators after the last quantized
//! convolution (the box decoding) stay float.

use std::collections::{HashMap, HashSet};

use crate::proto::tensor_proto::DataType;
use crate::proto::type_proto;
use crate::proto::{GraphProto, ModelProto, NodeProto, TensorProto};

use super::QuantizeError;

/// Which nodes to quantize.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selection {
    /// Nodes kept float: a node whose name equals an entry or starts with it (so
    /// `/model.23/` keeps the whole head float).
    pub exclude: Vec<String>,
    /// Keep the output convolutions float (see the module's description).
    pub keep_output_convs_float: bool,
    /// Quantize the operators between convolutions too (see the module's description).
    pub quantize_activation_ops: bool,
}

impl Default for Selection {
    fn default() -> Self {
        Self {
            exclude: Vec::new(),
            keep_output_convs_float: true,
            quantize_activation_ops: true,
        }
    }
}

/// How a quantized node is treated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeRole {
    /// A convolution: 8-bit input, per-channel int8 weights, int32 bias.
    Conv,
    /// An operator with 8-bit inputs and outputs, each with its own range.
    Activation,
    /// An operator that only moves values (`MaxPool`, `Split`, `Resize`): its outputs
    /// take its input's range, so ONNX Runtime can run it on the 8-bit values directly.
    PassThrough,
}

/// The outcome of selection: quantized nodes (by index into the graph's node list) and
/// the activation tensors whose ranges calibration must measure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub nodes: Vec<(usize, NodeRole)>,
    /// Float activations read or written by quantized nodes, in graph order.
    pub tensors: Vec<String>,
}

impl Plan {
    /// The names of the quantized nodes.
    pub fn node_names<'a>(&self, graph: &'a GraphProto) -> Vec<&'a str> {
        self.nodes
            .iter()
            .map(|(i, _)| graph.node[*i].name.as_deref().unwrap_or(""))
            .collect()
    }
}

fn role_of(op: &str) -> Option<NodeRole> {
    match op {
        "Conv" => Some(NodeRole::Conv),
        "Sigmoid" | "Mul" | "Add" | "Concat" => Some(NodeRole::Activation),
        "MaxPool" | "Split" | "Resize" => Some(NodeRole::PassThrough),
        _ => None,
    }
}

/// The inputs of `node` that carry activations to quantize (not weights, biases, shapes
/// or split sizes).
pub(crate) fn activation_inputs(node: &NodeProto) -> &[String] {
    match node.op_type.as_deref() {
        Some("Conv" | "Resize" | "Split" | "MaxPool") => &node.input[..node.input.len().min(1)],
        _ => &node.input,
    }
}

/// Refuses models this quantizer cannot read: float16 inside, weights stored outside the
/// file, opset older than 13 (per-channel `DequantizeLinear`).
pub fn check_model(model: &ModelProto) -> Result<(), QuantizeError> {
    let opset = crate::default_opset(model);
    if opset < 13 {
        return Err(QuantizeError::Opset(opset));
    }
    let graph = model.graph.as_ref().ok_or(QuantizeError::NoGraph)?;
    let f16 = DataType::Float16 as i32;
    let casts_to_f16 = graph.node.iter().any(|n| {
        n.op_type.as_deref() == Some("Cast")
            && n.attribute
                .iter()
                .any(|a| a.name.as_deref() == Some("to") && a.i == Some(f16 as i64))
    });
    if casts_to_f16 || graph.initializer.iter().any(|t| t.data_type == Some(f16)) {
        return Err(QuantizeError::Float16);
    }
    if let Some(t) = graph.initializer.iter().find(|t| !t.external_data.is_empty()) {
        return Err(QuantizeError::ExternalData(t.name.clone().unwrap_or_default()));
    }
    Ok(())
}

/// The float32 tensors of the graph: float graph inputs and initializers, and outputs of
/// nodes whose first input is float (except operators that make other types: `Shape`,
/// `Cast`, index outputs).
pub(crate) fn float_tensors(graph: &GraphProto) -> HashSet<String> {
    let float = DataType::Float as i32;
    let mut out: HashSet<String> = graph
        .input
        .iter()
        .filter(|v| {
            matches!(
                v.r#type.as_ref().and_then(|t| t.value.as_ref()),
                Some(type_proto::Value::TensorType(t)) if t.elem_type == Some(float)
            )
        })
        .filter_map(|v| v.name.clone())
        .collect();
    out.extend(
        graph
            .initializer
            .iter()
            .filter(|t| t.data_type == Some(float))
            .filter_map(|t| t.name.clone()),
    );
    for node in &graph.node {
        let first_float = node.input.first().is_some_and(|i| out.contains(i));
        let produces_float = match node.op_type.as_deref() {
            Some("Shape" | "Size" | "NonZero" | "ArgMax" | "ArgMin") => false,
            Some("Cast") => node
                .attribute
                .iter()
                .any(|a| a.name.as_deref() == Some("to") && a.i == Some(float as i64)),
            Some("Constant" | "ConstantOfShape") => false,
            _ => first_float,
        };
        if produces_float {
            // TopK and MaxPool's second outputs are indices.
            out.extend(
                node.output
                    .iter()
                    .take(match node.op_type.as_deref() {
                        Some("TopK" | "MaxPool") => 1,
                        _ => node.output.len(),
                    })
                    .cloned(),
            );
        }
    }
    out
}

/// Chooses the nodes to quantize and the tensors to calibrate.
pub fn plan(graph: &GraphProto, selection: &Selection) -> Plan {
    let initializers: HashMap<&str, &TensorProto> = graph
        .initializer
        .iter()
        .filter_map(|t| Some((t.name.as_deref()?, t)))
        .collect();
    let floats = float_tensors(graph);
    let excluded = |n: &NodeProto| {
        let name = n.name.as_deref().unwrap_or("");
        selection
            .exclude
            .iter()
            .any(|e| !e.is_empty() && name.starts_with(e.as_str()))
    };
    let is_activation = |t: &String| floats.contains(t) && !initializers.contains_key(t.as_str());
    let consumers = consumers(graph);
    let reaches_conv = reaches_conv(graph, &consumers);

    let mut chosen: Vec<(usize, NodeRole)> = Vec::new();
    for (i, node) in graph.node.iter().enumerate() {
        let Some(role) = node.op_type.as_deref().and_then(role_of) else {
            continue;
        };
        if excluded(node) || !node.domain.as_deref().unwrap_or("").is_empty() {
            continue;
        }
        let ok = match role {
            NodeRole::Conv => {
                let weight = node.input.get(1).and_then(|w| initializers.get(w.as_str()));
                weight.is_some_and(|w| w.dims.len() == 4 && w.data_type == Some(DataType::Float as i32))
                    && node
                        .input
                        .get(2)
                        .is_none_or(|b| b.is_empty() || initializers.contains_key(b.as_str()))
                    && node.input.first().is_some_and(is_activation)
                    && (!selection.keep_output_convs_float || reaches_conv[i])
            }
            _ => {
                selection.quantize_activation_ops
                    && reaches_conv[i]
                    && activation_inputs(node).iter().all(is_activation)
                    && node.output.iter().take(1).all(is_activation)
                    && !(node.op_type.as_deref() == Some("MaxPool") && node.output.len() > 1)
            }
        };
        if ok {
            chosen.push((i, role));
        }
    }
    // An operator only pays off next to quantized convolutions: with the output convs
    // float, `reaches_conv` above already keeps the decoding tail float.
    let mut tensors = Vec::new();
    let mut seen = HashSet::new();
    for &(i, _) in &chosen {
        let node = &graph.node[i];
        let outputs = node.output.iter().filter(|o| floats.contains(*o));
        for t in activation_inputs(node).iter().chain(outputs) {
            if !t.is_empty() && seen.insert(t.clone()) {
                tensors.push(t.clone());
            }
        }
    }
    Plan {
        nodes: chosen,
        tensors,
    }
}

/// For each tensor, the indices of the nodes reading it.
pub(crate) fn consumers(graph: &GraphProto) -> HashMap<&str, Vec<usize>> {
    let mut map: HashMap<&str, Vec<usize>> = HashMap::new();
    for (i, n) in graph.node.iter().enumerate() {
        for input in &n.input {
            map.entry(input.as_str()).or_default().push(i);
        }
    }
    map
}

/// For each node, whether a `Conv` (other than itself) lies downstream of it through
/// quantizable operators only. Reshapes and the like end the search: the head's output
/// convolutions feed the DFL projection (a `Conv`) through `Reshape` and `Softmax`, and
/// are output convolutions all the same.
fn reaches_conv(graph: &GraphProto, consumers: &HashMap<&str, Vec<usize>>) -> Vec<bool> {
    let mut reaches = vec![false; graph.node.len()];
    let feature_op = |n: &NodeProto| n.op_type.as_deref().and_then(role_of).is_some();
    // Nodes are topologically sorted: walk backwards so every consumer is decided first.
    for i in (0..graph.node.len()).rev() {
        reaches[i] = graph.node[i].output.iter().any(|o| {
            consumers.get(o.as_str()).is_some_and(|cs| {
                cs.iter().any(|&c| {
                    let n = &graph.node[c];
                    feature_op(n) && (reaches[c] || n.op_type.as_deref() == Some("Conv"))
                })
            })
        });
    }
    reaches
}

/// `model` with `tensors` added as float32 graph outputs (after its own), so that a
/// session returns them: the calibration graph.
pub fn with_extra_outputs(model: &ModelProto, tensors: &[String]) -> ModelProto {
    let mut model = model.clone();
    if let Some(graph) = model.graph.as_mut() {
        let existing: HashSet<String> = graph.output.iter().filter_map(|o| o.name.clone()).collect();
        for t in tensors.iter().filter(|t| !existing.contains(*t)) {
            graph.output.push(crate::proto::ValueInfoProto {
                name: Some(t.clone()),
                r#type: Some(crate::proto::TypeProto {
                    value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                        elem_type: Some(DataType::Float as i32),
                        shape: None,
                    })),
                    denotation: None,
                }),
                ..Default::default()
            });
        }
    }
    model
}
