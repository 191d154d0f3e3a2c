//! Static shapes for sessions that only ever run one shape.
//!
//! A YOLO export with a dynamic batch (or size) computes its reshapes at run time:
//! `Shape`, `Gather`, `Concat` and friends on int64 tensors. ONNX Runtime places those on
//! the CPU, so on a GPU every run copies small tensors back and forth and waits for them
//! (the CUDA provider reports "27 Memcpy nodes" for yolo11n), and CUDA graphs cannot be
//! captured at all. With every input dimension fixed, its constant folding evaluates that
//! whole subgraph once at load time. The engine runs one session per padded batch size, so
//! each such session can be given the one shape it will see.

use peregrine_types::model::{Dim as ModelDim, ElementType as ModelElement, TensorDescription};
use peregrine_types::ModelDescription;
use prost::Message;

use crate::proto::type_proto;
use crate::tensor::{Dim, ElementType, TensorSpec};
use crate::{input, proto, RewriteError};

/// What the model file declares, in the form the engine's `DetectorSpec` reads, without
/// building a session: inputs (initializers left out), outputs and metadata.
pub fn describe(model: &[u8]) -> Result<ModelDescription, RewriteError> {
    let proto = proto::ModelProto::decode(model).map_err(|e| RewriteError::Decode(e.to_string()))?;
    let graph = proto.graph.as_ref().ok_or(RewriteError::NoGraph)?;
    let is_initializer = |name: &Option<String>| graph.initializer.iter().any(|t| &t.name == name);
    let describe = |v: &proto::ValueInfoProto| -> Result<TensorDescription, RewriteError> {
        let spec = TensorSpec::from_value_info(v)?;
        Ok(TensorDescription {
            name: spec.name,
            element: match spec.element {
                ElementType::F32 => ModelElement::F32,
                ElementType::F16 => ModelElement::F16,
                ElementType::U8 => ModelElement::U8,
                ElementType::Other(code) => ModelElement::Other(format!("onnx type {code}")),
            },
            dims: spec
                .dims
                .unwrap_or_default()
                .iter()
                .map(|d| {
                    d.fixed()
                        .map_or(ModelDim::Dynamic, |n| ModelDim::Fixed(n as usize))
                })
                .collect(),
        })
    };
    Ok(ModelDescription {
        inputs: graph
            .input
            .iter()
            .filter(|v| !is_initializer(&v.name))
            .map(describe)
            .collect::<Result<_, _>>()?,
        outputs: graph.output.iter().map(describe).collect::<Result<_, _>>()?,
        metadata: proto
            .metadata_props
            .iter()
            .filter_map(|p| Some((p.key.clone()?, p.value.clone()?)))
            .collect(),
    })
}

/// `model` with its image input fixed at `batch` images of `height` x `width`: `[batch, 3,
/// height, width]` for a float input, `[batch, height, width, 3]` for the rewritten uint8
/// one. Dimensions the model already fixes must agree. Nothing else changes.
pub fn fix_input_shape(
    model: &[u8],
    batch: usize,
    height: usize,
    width: usize,
) -> Result<Vec<u8>, RewriteError> {
    let mut proto = proto::ModelProto::decode(model).map_err(|e| RewriteError::Decode(e.to_string()))?;
    let graph = proto.graph.as_mut().ok_or(RewriteError::NoGraph)?;
    let (index, spec) = input::image_input(graph)?;
    let [b, h, w, c] = [batch, height, width, 3].map(|v| v as u64);
    let wanted = match spec.element {
        ElementType::U8 => [b, h, w, c],
        _ => [b, c, h, w],
    };
    let conflict = || RewriteError::FixedShape {
        name: spec.name.clone(),
        shape: spec.shape_string(),
        wanted: format!("{wanted:?}"),
    };
    let dims = spec.dims.as_deref().ok_or_else(conflict)?;
    if dims.len() != 4
        || dims
            .iter()
            .zip(wanted)
            .any(|(d, v)| d.fixed().is_some_and(|f| f != v))
    {
        return Err(conflict());
    }
    let fixed = TensorSpec {
        dims: Some(wanted.iter().map(|&v| Dim::Fixed(v)).collect()),
        ..spec.clone()
    };
    // Only the shape changes; the value info keeps its doc string and metadata.
    let value = &mut graph.input[index];
    if let (Some(type_proto::Value::TensorType(t)), Some(type_proto::Value::TensorType(new))) = (
        value.r#type.as_mut().and_then(|t| t.value.as_mut()),
        fixed.to_value_info().r#type.and_then(|t| t.value),
    ) {
        t.shape = new.shape;
    }
    Ok(proto.encode_to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::*;

    fn model(element: i32, dims: &[Option<i64>]) -> Vec<u8> {
        let dim = |d: &Option<i64>| tensor_shape_proto::Dimension {
            value: Some(match d {
                Some(v) => tensor_shape_proto::dimension::Value::DimValue(*v),
                None => tensor_shape_proto::dimension::Value::DimParam("dyn".into()),
            }),
            denotation: None,
        };
        let value = |name: &str, dims: Vec<tensor_shape_proto::Dimension>| ValueInfoProto {
            name: Some(name.into()),
            r#type: Some(TypeProto {
                value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                    elem_type: Some(element),
                    shape: Some(TensorShapeProto { dim: dims }),
                })),
                denotation: None,
            }),
            ..Default::default()
        };
        ModelProto {
            graph: Some(GraphProto {
                input: vec![value("images", dims.iter().map(dim).collect())],
                output: vec![value("out", vec![dim(&None), dim(&Some(84)), dim(&None)])],
                ..Default::default()
            }),
            metadata_props: vec![StringStringEntryProto {
                key: Some("imgsz".into()),
                value: Some("[640, 640]".into()),
            }],
            ..Default::default()
        }
        .encode_to_vec()
    }

    fn input_dims(bytes: &[u8]) -> Vec<ModelDim> {
        describe(bytes).unwrap().inputs[0].dims.clone()
    }

    #[test]
    fn float_and_uint8_inputs_get_their_own_layout() {
        let float = model(1, &[None, Some(3), None, None]);
        let fixed = fix_input_shape(&float, 16, 480, 640).unwrap();
        assert_eq!(input_dims(&fixed), [16, 3, 480, 640].map(ModelDim::Fixed));
        let uint8 = model(2, &[None, None, None, Some(3)]);
        let fixed = fix_input_shape(&uint8, 4, 320, 320).unwrap();
        assert_eq!(input_dims(&fixed), [4, 320, 320, 3].map(ModelDim::Fixed));
        let described = describe(&fixed).unwrap();
        assert_eq!(
            described.metadata["imgsz"], "[640, 640]",
            "metadata is carried through"
        );
        assert_eq!(described.outputs[0].dims[1], ModelDim::Fixed(84));
    }

    #[test]
    fn fixed_dimensions_must_agree() {
        let batch_one = model(1, &[Some(1), Some(3), Some(640), Some(640)]);
        assert!(fix_input_shape(&batch_one, 1, 640, 640).is_ok());
        let err = fix_input_shape(&batch_one, 8, 640, 640).unwrap_err().to_string();
        assert!(
            err.contains("[1, 3, 640, 640]") && err.contains("[8, 3, 640, 640]"),
            "{err}"
        );
        assert!(fix_input_shape(b"not a model", 1, 640, 640).is_err());
    }
}
