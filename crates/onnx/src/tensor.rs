//! Plain descriptions of graph inputs and outputs, read off (and written back to) the
//! protobuf `ValueInfoProto`, so callers never handle protobuf types.

use std::fmt;

use crate::proto::tensor_proto::DataType;
use crate::proto::tensor_shape_proto::{dimension, Dimension};
use crate::proto::type_proto::{self, Tensor};
use crate::proto::{TensorShapeProto, TypeProto, ValueInfoProto};
use crate::RewriteError;

/// Element types the rewrite produces or accepts; anything else is carried by its ONNX code
/// so error messages can still name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ElementType {
    F32,
    F16,
    U8,
    /// Another `TensorProto.DataType` code.
    Other(i32),
}

impl ElementType {
    pub(crate) fn from_code(code: i32) -> Self {
        match DataType::try_from(code) {
            Ok(DataType::Float) => Self::F32,
            Ok(DataType::Float16) => Self::F16,
            Ok(DataType::Uint8) => Self::U8,
            _ => Self::Other(code),
        }
    }

    pub(crate) fn code(self) -> i32 {
        match self {
            Self::F32 => DataType::Float as i32,
            Self::F16 => DataType::Float16 as i32,
            Self::U8 => DataType::Uint8 as i32,
            Self::Other(code) => code,
        }
    }
}

impl fmt::Display for ElementType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::F32 => f.write_str("float32"),
            Self::F16 => f.write_str("float16"),
            Self::U8 => f.write_str("uint8"),
            Self::Other(code) => match DataType::try_from(*code) {
                Ok(t) => f.write_str(&t.as_str_name().to_lowercase()),
                Err(_) => write!(f, "element type {code}"),
            },
        }
    }
}

/// One dimension as the graph declares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dim {
    Fixed(u64),
    /// A named symbolic dimension (`batch`, `height`, ...), chosen at run time.
    Named(String),
    /// Neither a value nor a name: chosen at run time.
    Unknown,
}

impl Dim {
    pub fn fixed(&self) -> Option<u64> {
        match self {
            Self::Fixed(n) => Some(*n),
            _ => None,
        }
    }

    fn from_proto(d: &Dimension) -> Self {
        match &d.value {
            Some(dimension::Value::DimValue(v)) if *v >= 0 => Self::Fixed(*v as u64),
            Some(dimension::Value::DimParam(p)) if !p.is_empty() => Self::Named(p.clone()),
            _ => Self::Unknown,
        }
    }

    fn to_proto(&self) -> Dimension {
        let value = match self {
            Self::Fixed(n) => Some(dimension::Value::DimValue(*n as i64)),
            Self::Named(p) => Some(dimension::Value::DimParam(p.clone())),
            Self::Unknown => None,
        };
        Dimension {
            value,
            denotation: None,
        }
    }
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Fixed(n) => write!(f, "{n}"),
            Self::Named(p) => f.write_str(p),
            Self::Unknown => f.write_str("?"),
        }
    }
}

/// Formats dims as `[batch, 84, 8400]` for messages.
pub(crate) fn show(dims: &[Dim]) -> String {
    let parts: Vec<String> = dims.iter().map(ToString::to_string).collect();
    format!("[{}]", parts.join(", "))
}

/// A graph input or output: name, element type and declared shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpec {
    pub name: String,
    pub element: ElementType,
    /// `None` when the graph declares no shape at all (rank unknown).
    pub dims: Option<Vec<Dim>>,
}

impl TensorSpec {
    /// Reads a tensor-typed value info; sequences, maps and untyped values are refused.
    pub(crate) fn from_value_info(v: &ValueInfoProto) -> Result<Self, RewriteError> {
        let name = v.name.clone().unwrap_or_default();
        let tensor = match v.r#type.as_ref().and_then(|t| t.value.as_ref()) {
            Some(type_proto::Value::TensorType(t)) => t,
            _ => return Err(RewriteError::Untyped(name)),
        };
        let element = ElementType::from_code(tensor.elem_type.unwrap_or(0));
        let dims = tensor
            .shape
            .as_ref()
            .map(|s| s.dim.iter().map(Dim::from_proto).collect());
        Ok(Self { name, element, dims })
    }

    pub(crate) fn to_value_info(&self) -> ValueInfoProto {
        let shape = self.dims.as_ref().map(|dims| TensorShapeProto {
            dim: dims.iter().map(Dim::to_proto).collect(),
        });
        ValueInfoProto {
            name: Some(self.name.clone()),
            r#type: Some(TypeProto {
                value: Some(type_proto::Value::TensorType(Tensor {
                    elem_type: Some(self.element.code()),
                    shape,
                })),
                denotation: None,
            }),
            doc_string: None,
            metadata_props: Vec::new(),
        }
    }

    /// The shape for messages: `[batch, 3, 640, 640]`, or `unknown` without one.
    pub fn shape_string(&self) -> String {
        self.dims.as_deref().map_or_else(|| "unknown".into(), show)
    }
}

impl fmt::Display for TensorSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} {}", self.name, self.element, self.shape_string())
    }
}
