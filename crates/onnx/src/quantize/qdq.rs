//! Writing the quantized model in ONNX's QDQ form: the float graph stays as it is, and
//! `QuantizeLinear -> DequantizeLinear` pairs mark where values are 8-bit. A runtime that
//! knows the pattern (ONNX Runtime, TensorRT) fuses `DequantizeLinear -> op ->
//! QuantizeLinear` into integer kernels; any other runs it in float with the rounding
//! included, so the file is an ordinary model either way.
//!
//! Activations: one pair per calibrated tensor (per-tensor scale, uint8 asymmetric or
//! int8 symmetric), every reader of the tensor rewired to the dequantized value (so the
//! producing operator's only reader is its `QuantizeLinear`, as fusion requires).
//! Weights: int8 per output channel (axis 0), symmetric, stored as int8 initializers
//! behind a `DequantizeLinear`; biases int32 with scale `input scale x weight scale`.

use std::collections::{HashMap, HashSet};

use prost::Message;

use crate::proto::tensor_proto::DataType;
use crate::proto::{GraphProto, ModelProto, NodeProto, StringStringEntryProto, TensorProto};

use super::select::{self, NodeRole, Selection};
use super::QuantizeError;

/// The prefix of the metadata keys a quantized model carries.
pub const METADATA_PREFIX: &str = "peregrine.quantization.";

/// How activations are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActivationType {
    /// Asymmetric uint8 with a zero point: the whole range is used for SiLU's skewed
    /// outputs (ONNX Runtime's CPU kernels are fastest with uint8 activations).
    Uint8,
    /// Symmetric int8, zero point 0 (what TensorRT expects).
    Int8,
}

impl ActivationType {
    pub fn name(self) -> &'static str {
        match self {
            Self::Uint8 => "uint8",
            Self::Int8 => "int8",
        }
    }
}

/// Everything [`quantize_qdq`] needs besides the model and the ranges.
#[derive(Debug, Clone, PartialEq)]
pub struct QdqOptions {
    pub selection: Selection,
    pub activations: ActivationType,
    /// Written into the metadata: `(key without prefix, value)`, e.g. method, samples,
    /// date, source model's SHA-256.
    pub metadata: Vec<(String, String)>,
}

/// One tensor's quantization: `real = (q - zero_point) * scale`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QuantParams {
    pub scale: f32,
    pub zero_point: i32,
}

impl QuantParams {
    /// The parameters covering `(low, high)` (which contains 0) in `ty`.
    pub fn of_range(low: f32, high: f32, ty: ActivationType) -> Self {
        let (low, high) = (low.min(0.0), high.max(0.0));
        match ty {
            ActivationType::Uint8 => {
                let scale = (high - low) / 255.0;
                if scale <= f32::MIN_POSITIVE || !scale.is_finite() {
                    return Self {
                        scale: 1.0,
                        zero_point: 0,
                    };
                }
                let zero_point = (-low / scale).round().clamp(0.0, 255.0) as i32;
                Self { scale, zero_point }
            }
            ActivationType::Int8 => {
                let scale = low.abs().max(high) / 127.0;
                if scale <= f32::MIN_POSITIVE || !scale.is_finite() {
                    return Self {
                        scale: 1.0,
                        zero_point: 0,
                    };
                }
                Self { scale, zero_point: 0 }
            }
        }
    }
}

/// What was quantized, for the summary.
#[derive(Debug, Clone, PartialEq)]
pub struct Quantized {
    pub model: Vec<u8>,
    /// Names of the quantized nodes.
    pub nodes: Vec<String>,
    /// Each quantized activation's parameters.
    pub activations: Vec<(String, QuantParams)>,
}

/// Quantizes `model` (ONNX bytes) with `ranges` (each calibrated tensor's float range, as
/// `TensorHistogram::range` gives it) into a QDQ model.
pub fn quantize_qdq(
    model: &[u8],
    ranges: &HashMap<String, (f32, f32)>,
    options: &QdqOptions,
) -> Result<Quantized, QuantizeError> {
    let mut proto = ModelProto::decode(model).map_err(|e| QuantizeError::Decode(e.to_string()))?;
    select::check_model(&proto)?;
    let graph = proto.graph.as_mut().ok_or(QuantizeError::NoGraph)?;
    let plan = select::plan(graph, &options.selection);
    if plan.nodes.is_empty() {
        return Err(QuantizeError::NothingToQuantize);
    }
    let params = activation_params(graph, &plan, ranges, options.activations)?;
    let nodes = plan.node_names(graph).into_iter().map(str::to_string).collect();

    let mut added: Vec<TensorProto> = Vec::new();
    let mut names = Names::new(graph);
    // Weights and biases first: they need the input's scale, and nodes are found by index
    // (so the constants' dequantization nodes are put in front only afterwards).
    let mut front = Vec::new();
    for &(i, role) in &plan.nodes {
        if role == NodeRole::Conv {
            let input_scale = params[&graph.node[i].input[0]].scale;
            front.extend(quantize_conv_constants(
                graph,
                i,
                input_scale,
                &mut names,
                &mut added,
            )?);
        }
    }
    graph.node.splice(0..0, front);
    insert_activation_pairs(
        graph,
        &plan.tensors,
        &params,
        options.activations,
        &mut names,
        &mut added,
    );
    graph.initializer.extend(added);
    drop_unused_initializers(graph);

    let mut activations: Vec<(String, QuantParams)> =
        plan.tensors.iter().map(|t| (t.clone(), params[t])).collect();
    activations.sort_by(|a, b| a.0.cmp(&b.0));
    write_metadata(&mut proto, options, plan.nodes.len());
    Ok(Quantized {
        model: proto.encode_to_vec(),
        nodes,
        activations,
    })
}

/// Each calibrated tensor's parameters; a pass-through operator's outputs take its
/// input's, in graph order, so chains (`MaxPool -> MaxPool`) share one range.
fn activation_params(
    graph: &GraphProto,
    plan: &select::Plan,
    ranges: &HashMap<String, (f32, f32)>,
    ty: ActivationType,
) -> Result<HashMap<String, QuantParams>, QuantizeError> {
    let mut params = HashMap::new();
    for t in &plan.tensors {
        let &(low, high) = ranges
            .get(t)
            .ok_or_else(|| QuantizeError::MissingRange(t.clone()))?;
        params.insert(t.clone(), QuantParams::of_range(low, high, ty));
    }
    for &(i, role) in &plan.nodes {
        if role == NodeRole::PassThrough {
            let node = &graph.node[i];
            let p = params[&node.input[0]];
            for o in &node.output {
                params.insert(o.clone(), p);
            }
        }
    }
    Ok(params)
}

/// Fresh names, checked against everything in the graph.
struct Names(HashSet<String>);

impl Names {
    fn new(graph: &GraphProto) -> Self {
        let mut taken: HashSet<String> = graph.initializer.iter().filter_map(|t| t.name.clone()).collect();
        for v in graph.input.iter().chain(&graph.output).chain(&graph.value_info) {
            taken.extend(v.name.clone());
        }
        for n in &graph.node {
            taken.extend(n.name.iter().chain(&n.input).chain(&n.output).cloned());
        }
        Self(taken)
    }

    fn fresh(&mut self, want: String) -> String {
        let mut name = want.clone();
        let mut n = 0;
        while self.0.contains(&name) {
            n += 1;
            name = format!("{want}_{n}");
        }
        self.0.insert(name.clone());
        name
    }
}

fn tensor(name: String, ty: DataType, dims: Vec<i64>, raw: Vec<u8>) -> TensorProto {
    TensorProto {
        dims,
        data_type: Some(ty as i32),
        name: Some(name),
        raw_data: Some(raw),
        ..Default::default()
    }
}

fn node(name: String, op: &str, inputs: Vec<String>, output: String, axis: Option<i64>) -> NodeProto {
    NodeProto {
        input: inputs,
        output: vec![output],
        name: Some(name),
        op_type: Some(op.to_string()),
        attribute: axis
            .map(|a| crate::edit::attr_int("axis", a))
            .into_iter()
            .collect(),
        ..Default::default()
    }
}

/// The float values of an initializer (raw little-endian or `float_data`).
fn floats_of(t: &TensorProto) -> Vec<f32> {
    match &t.raw_data {
        Some(raw) if !raw.is_empty() => raw
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        _ => t.float_data.clone(),
    }
}

/// Replaces conv `i`'s weight (and bias) inputs with dequantized int8 (int32) constants;
/// returns the `DequantizeLinear` nodes to put in front of the graph (they read only
/// initializers).
fn quantize_conv_constants(
    graph: &mut GraphProto,
    i: usize,
    input_scale: f32,
    names: &mut Names,
    added: &mut Vec<TensorProto>,
) -> Result<Vec<NodeProto>, QuantizeError> {
    let weight_name = graph.node[i].input[1].clone();
    let w = graph
        .initializer
        .iter()
        .find(|t| t.name.as_deref() == Some(weight_name.as_str()))
        .ok_or_else(|| QuantizeError::MissingRange(weight_name.clone()))?;
    let dims = w.dims.clone();
    let values = floats_of(w);
    let channels = dims[0].max(1) as usize;
    let per = values.len() / channels;
    let scales: Vec<f32> = values
        .chunks(per.max(1))
        .map(|c| {
            let m = c.iter().fold(0f32, |a, v| a.max(v.abs()));
            if m > 0.0 {
                m / 127.0
            } else {
                1.0
            }
        })
        .collect();
    let q: Vec<u8> = values
        .iter()
        .enumerate()
        .map(|(k, v)| (v / scales[k / per]).round().clamp(-127.0, 127.0) as i8 as u8)
        .collect();
    let base = weight_name.clone();
    let wq = names.fresh(format!("{base}_quantized"));
    let ws = names.fresh(format!("{base}_scale"));
    let wz = names.fresh(format!("{base}_zero_point"));
    let wd = names.fresh(format!("{base}_dequantized"));
    let c = channels as i64;
    added.push(tensor(wq.clone(), DataType::Int8, dims, q));
    added.push(tensor(ws.clone(), DataType::Float, vec![c], le_f32(&scales)));
    added.push(tensor(wz.clone(), DataType::Int8, vec![c], vec![0; channels]));
    let dq_name = names.fresh(format!("{base}_DequantizeLinear"));
    let mut new_nodes = vec![node(
        dq_name,
        "DequantizeLinear",
        vec![wq, ws, wz],
        wd.clone(),
        Some(0),
    )];
    graph.node[i].input[1] = wd;

    if let Some(bias_name) = graph.node[i].input.get(2).filter(|b| !b.is_empty()).cloned() {
        let b = graph
            .initializer
            .iter()
            .find(|t| t.name.as_deref() == Some(bias_name.as_str()))
            .ok_or_else(|| QuantizeError::MissingRange(bias_name.clone()))?;
        let bias = floats_of(b);
        let bias_scales: Vec<f32> = scales.iter().map(|s| s * input_scale).collect();
        let bq: Vec<u8> = bias
            .iter()
            .zip(&bias_scales)
            .flat_map(|(v, s)| {
                ((*v as f64 / *s as f64)
                    .round()
                    .clamp(i32::MIN as f64, i32::MAX as f64) as i32)
                    .to_le_bytes()
            })
            .collect();
        let bqn = names.fresh(format!("{bias_name}_quantized"));
        let bsn = names.fresh(format!("{bias_name}_scale"));
        let bzn = names.fresh(format!("{bias_name}_zero_point"));
        let bdn = names.fresh(format!("{bias_name}_dequantized"));
        added.push(tensor(bqn.clone(), DataType::Int32, vec![c], bq));
        added.push(tensor(
            bsn.clone(),
            DataType::Float,
            vec![c],
            le_f32(&bias_scales),
        ));
        added.push(tensor(
            bzn.clone(),
            DataType::Int32,
            vec![c],
            vec![0; 4 * channels],
        ));
        let dq_name = names.fresh(format!("{bias_name}_DequantizeLinear"));
        new_nodes.push(node(
            dq_name,
            "DequantizeLinear",
            vec![bqn, bsn, bzn],
            bdn.clone(),
            Some(0),
        ));
        graph.node[i].input[2] = bdn;
    }
    Ok(new_nodes)
}

fn le_f32(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// A `QuantizeLinear -> DequantizeLinear` pair after each tensor in `tensors`, every
/// reader rewired to the dequantized value. Graph outputs keep their float value.
fn insert_activation_pairs(
    graph: &mut GraphProto,
    tensors: &[String],
    params: &HashMap<String, QuantParams>,
    ty: ActivationType,
    names: &mut Names,
    added: &mut Vec<TensorProto>,
) {
    let mut dequantized: HashMap<String, String> = HashMap::new();
    let mut pairs: HashMap<String, [NodeProto; 2]> = HashMap::new();
    for t in tensors {
        let p = params[t];
        let s = names.fresh(format!("{t}_scale"));
        let z = names.fresh(format!("{t}_zero_point"));
        let q = names.fresh(format!("{t}_quantized"));
        let d = names.fresh(format!("{t}_dequantized"));
        added.push(tensor(
            s.clone(),
            DataType::Float,
            vec![],
            p.scale.to_le_bytes().to_vec(),
        ));
        added.push(match ty {
            ActivationType::Uint8 => tensor(z.clone(), DataType::Uint8, vec![], vec![p.zero_point as u8]),
            ActivationType::Int8 => tensor(z.clone(), DataType::Int8, vec![], vec![p.zero_point as i8 as u8]),
        });
        let qn = names.fresh(format!("{t}_QuantizeLinear"));
        let dn = names.fresh(format!("{t}_DequantizeLinear"));
        pairs.insert(
            t.clone(),
            [
                node(
                    qn,
                    "QuantizeLinear",
                    vec![t.clone(), s.clone(), z.clone()],
                    q.clone(),
                    None,
                ),
                node(dn, "DequantizeLinear", vec![q, s, z], d.clone(), None),
            ],
        );
        dequantized.insert(t.clone(), d);
    }
    let old = std::mem::take(&mut graph.node);
    let mut nodes = Vec::with_capacity(old.len() + 2 * pairs.len());
    let graph_inputs: Vec<String> = graph.input.iter().filter_map(|v| v.name.clone()).collect();
    for input in &graph_inputs {
        if let Some(pair) = pairs.remove(input) {
            nodes.extend(pair);
        }
    }
    for mut n in old {
        for input in n.input.iter_mut() {
            if let Some(d) = dequantized.get(input.as_str()) {
                *input = d.clone();
            }
        }
        let outputs = n.output.clone();
        nodes.push(n);
        for o in &outputs {
            if let Some(pair) = pairs.remove(o) {
                nodes.extend(pair);
            }
        }
    }
    graph.node = nodes;
}

/// Removes the float weights and biases the int8 ones replaced (nothing reads them now).
fn drop_unused_initializers(graph: &mut GraphProto) {
    let mut used: HashSet<&str> = graph
        .node
        .iter()
        .flat_map(|n| n.input.iter().map(String::as_str))
        .collect();
    used.extend(graph.output.iter().filter_map(|o| o.name.as_deref()));
    let keep: Vec<bool> = graph
        .initializer
        .iter()
        .map(|t| t.name.as_deref().is_some_and(|n| used.contains(n)))
        .collect();
    let mut keep = keep.into_iter();
    graph.initializer.retain(|_| keep.next().unwrap_or(true));
}

fn write_metadata(model: &mut ModelProto, options: &QdqOptions, node_count: usize) {
    let mut entries: Vec<(String, String)> = options.metadata.clone();
    entries.push(("activations".into(), options.activations.name().into()));
    entries.push(("weights".into(), "int8 per-channel symmetric".into()));
    entries.push(("nodes".into(), node_count.to_string()));
    for (key, value) in entries {
        let key = format!("{METADATA_PREFIX}{key}");
        model
            .metadata_props
            .retain(|p| p.key.as_deref() != Some(key.as_str()));
        model.metadata_props.push(StringStringEntryProto {
            key: Some(key),
            value: Some(value),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uint8_params_cover_the_range_with_an_exact_zero() {
        let p = QuantParams::of_range(-0.28, 10.0, ActivationType::Uint8);
        assert!((p.scale - 10.28 / 255.0).abs() < 1e-6);
        assert_eq!(p.zero_point, 7);
        let p = QuantParams::of_range(-2.0, 1.0, ActivationType::Int8);
        assert_eq!(p.zero_point, 0);
        assert!((p.scale - 2.0 / 127.0).abs() < 1e-7);
        assert_eq!(QuantParams::of_range(0.0, 0.0, ActivationType::Uint8).scale, 1.0);
    }
}
