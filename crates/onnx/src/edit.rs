//! Appending nodes and constants to a decoded graph without disturbing what is there.
//!
//! New tensors and nodes get names under `peregrine/`, checked against every name already in
//! the graph, so the rewrite can never capture or shadow an existing value. Constants become
//! new initializers; existing initializers are never touched, so their bytes are re-encoded
//! exactly as they were read.

use std::collections::HashSet;

use crate::proto::attribute_proto::AttributeType;
use crate::proto::tensor_proto::DataType;
use crate::proto::{AttributeProto, GraphProto, NodeProto, TensorProto};

/// Names taken in the graph plus the nodes and initializers the rewrite adds.
#[derive(Debug)]
pub(crate) struct GraphEdit {
    taken: HashSet<String>,
    /// The default-domain opset, which decides the form of a few operators.
    pub opset: i64,
    /// Nodes to put before the graph's own (they read only the new input).
    pub front: Vec<NodeProto>,
    /// Nodes to put after the graph's own (they read only its outputs).
    pub back: Vec<NodeProto>,
    pub initializers: Vec<TensorProto>,
}

/// Where a new node goes in the topologically sorted node list.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Place {
    Front,
    Back,
}

impl GraphEdit {
    pub fn new(graph: &GraphProto, opset: i64) -> Self {
        let mut taken = HashSet::new();
        let values = graph.input.iter().chain(&graph.output).chain(&graph.value_info);
        taken.extend(values.filter_map(|v| v.name.clone()));
        taken.extend(graph.initializer.iter().filter_map(|t| t.name.clone()));
        let sparse = graph.sparse_initializer.iter().filter_map(|s| s.values.as_ref());
        taken.extend(sparse.filter_map(|v| v.name.clone()));
        for n in &graph.node {
            taken.extend(n.name.iter().chain(&n.input).chain(&n.output).cloned());
        }
        Self {
            taken,
            opset,
            front: Vec::new(),
            back: Vec::new(),
            initializers: Vec::new(),
        }
    }

    /// `want` if no value or node in the graph has that name yet, else `want_1`, `want_2`...
    pub fn unique(&mut self, want: &str) -> String {
        let mut name = want.to_string();
        let mut n = 0;
        while self.taken.contains(&name) {
            n += 1;
            name = format!("{want}_{n}");
        }
        self.taken.insert(name.clone());
        name
    }

    /// A fresh internal name under the `peregrine/` prefix.
    pub fn fresh(&mut self, base: &str) -> String {
        self.unique(&format!("peregrine/{base}"))
    }

    /// Adds a node with fresh output names (one per entry of `outputs`, used as bases) and
    /// returns them.
    pub fn node_n(
        &mut self,
        place: Place,
        op: &str,
        inputs: &[&str],
        outputs: &[&str],
        attribute: Vec<AttributeProto>,
    ) -> Vec<String> {
        let outputs: Vec<String> = outputs.iter().map(|o| self.fresh(o)).collect();
        self.push(place, op, inputs, outputs.clone(), attribute);
        outputs
    }

    /// Adds a single-output node whose output gets a fresh name built from `base`.
    pub fn node(
        &mut self,
        place: Place,
        op: &str,
        base: &str,
        inputs: &[&str],
        attribute: Vec<AttributeProto>,
    ) -> String {
        let out = self.fresh(base);
        self.push(place, op, inputs, vec![out.clone()], attribute);
        out
    }

    /// Adds a node writing to an output name the caller has already chosen (used to make a
    /// new node produce a value the original graph reads, under its original name).
    pub fn push(
        &mut self,
        place: Place,
        op: &str,
        inputs: &[&str],
        output: Vec<String>,
        attribute: Vec<AttributeProto>,
    ) {
        let node = self.detached(op, inputs, output, attribute);
        match place {
            Place::Front => self.front.push(node),
            Place::Back => self.back.push(node),
        }
    }

    /// A new node under a fresh name, for the caller to put into the graph itself (a rewrite
    /// that replaces nodes in the middle of the list rather than before or after it).
    pub fn detached(
        &mut self,
        op: &str,
        inputs: &[&str],
        output: Vec<String>,
        attribute: Vec<AttributeProto>,
    ) -> NodeProto {
        NodeProto {
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output,
            name: Some(self.fresh(op)),
            op_type: Some(op.to_string()),
            domain: None,
            overload: None,
            attribute,
            doc_string: None,
            metadata_props: Vec::new(),
        }
    }

    /// A new int64 initializer of shape `dims`, returning its name.
    pub fn const_i64(&mut self, base: &str, dims: &[i64], values: &[i64]) -> String {
        let raw = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.constant(base, DataType::Int64, dims, raw)
    }

    /// A new float32 scalar initializer, returning its name.
    pub fn const_f32(&mut self, base: &str, value: f32) -> String {
        self.constant(base, DataType::Float, &[], value.to_le_bytes().to_vec())
    }

    fn constant(&mut self, base: &str, ty: DataType, dims: &[i64], raw: Vec<u8>) -> String {
        let name = self.fresh(base);
        self.initializers.push(TensorProto {
            dims: dims.to_vec(),
            data_type: Some(ty as i32),
            name: Some(name.clone()),
            raw_data: Some(raw),
            ..Default::default()
        });
        name
    }

    /// Splices the new nodes and initializers into `graph`: front nodes first, the graph's
    /// own in their original order, back nodes last, which keeps the list topologically
    /// sorted as ONNX requires.
    pub fn apply(self, graph: &mut GraphProto) {
        graph.node.splice(0..0, self.front);
        graph.node.extend(self.back);
        graph.initializer.extend(self.initializers);
    }
}

pub(crate) fn attr_int(name: &str, value: i64) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::Int as i32),
        i: Some(value),
        ..Default::default()
    }
}

pub(crate) fn attr_ints(name: &str, values: &[i64]) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::Ints as i32),
        ints: values.to_vec(),
        ..Default::default()
    }
}

/// `Unsqueeze` at `axis`: an `axes` attribute before opset 13, an input from 13 on.
pub(crate) fn unsqueeze(edit: &mut GraphEdit, place: Place, base: &str, x: &str, axis: i64) -> String {
    if edit.opset >= 13 {
        let axes = edit.const_i64("axes", &[1], &[axis]);
        edit.node(place, "Unsqueeze", base, &[x, &axes], vec![])
    } else {
        edit.node(place, "Unsqueeze", base, &[x], vec![attr_ints("axes", &[axis])])
    }
}

/// `Slice` of `x` along one axis, `[start, end)`.
pub(crate) fn slice(edit: &mut GraphEdit, base: &str, x: &str, axis: i64, start: i64, end: i64) -> String {
    let starts = edit.const_i64("starts", &[1], &[start]);
    let ends = edit.const_i64("ends", &[1], &[end]);
    let axes = edit.const_i64("axes", &[1], &[axis]);
    edit.node(Place::Back, "Slice", base, &[x, &starts, &ends, &axes], vec![])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fresh_names_avoid_everything_in_the_graph() {
        let graph = GraphProto {
            node: vec![NodeProto {
                input: vec!["images".into()],
                output: vec!["peregrine/x".into()],
                name: Some("peregrine/Cast".into()),
                ..Default::default()
            }],
            ..Default::default()
        };
        let mut edit = GraphEdit::new(&graph, 17);
        assert_eq!(edit.fresh("x"), "peregrine/x_1");
        assert_eq!(edit.fresh("x"), "peregrine/x_2");
        assert_eq!(edit.unique("images"), "images_1");
        assert_eq!(edit.unique("images_u8"), "images_u8");
        let out = edit.node(Place::Back, "Cast", "y", &["images"], vec![attr_int("to", 1)]);
        assert_eq!(out, "peregrine/y");
        assert_eq!(edit.back[0].name.as_deref(), Some("peregrine/Cast_1"));
    }

    #[test]
    fn apply_keeps_the_original_nodes_between_the_new_ones() {
        let mut graph = GraphProto {
            node: vec![NodeProto {
                name: Some("original".into()),
                ..Default::default()
            }],
            ..Default::default()
        };
        let mut edit = GraphEdit::new(&graph, 17);
        edit.node(Place::Back, "Identity", "b", &["x"], vec![]);
        edit.node(Place::Front, "Identity", "a", &["y"], vec![]);
        edit.const_f32("c", 0.5);
        edit.apply(&mut graph);
        let names: Vec<_> = graph
            .node
            .iter()
            .map(|n| n.name.clone().unwrap_or_default())
            .collect();
        assert_eq!(names, ["peregrine/Identity_1", "original", "peregrine/Identity"]);
        assert_eq!(
            graph.initializer[0].raw_data.as_deref(),
            Some(&0.5f32.to_le_bytes()[..])
        );
    }
}
