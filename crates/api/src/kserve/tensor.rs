//! Tensors as the Open Inference Protocol carries them, independent of HTTP or gRPC: raw
//! little-endian bytes, row-major, and the BYTES element encoding (a 4-byte little-endian
//! length before each element).

use bytes::Bytes;

use crate::ApiError;

/// The datatypes Peregrine's models take or give.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataType {
    Fp32,
    Int32,
    Uint8,
    Bytes,
}

impl DataType {
    /// The protocol's name (`FP32`), as in metadata and inference messages.
    pub fn protocol_name(self) -> &'static str {
        match self {
            Self::Fp32 => "FP32",
            Self::Int32 => "INT32",
            Self::Uint8 => "UINT8",
            Self::Bytes => "BYTES",
        }
    }

    /// The model configuration's name (`TYPE_FP32`).
    pub fn config_name(self) -> &'static str {
        match self {
            Self::Fp32 => "TYPE_FP32",
            Self::Int32 => "TYPE_INT32",
            Self::Uint8 => "TYPE_UINT8",
            Self::Bytes => "TYPE_STRING",
        }
    }

    /// `DataType` enum value of model_config.proto.
    pub fn proto_value(self) -> i32 {
        match self {
            Self::Fp32 => 11,
            Self::Int32 => 8,
            Self::Uint8 => 2,
            Self::Bytes => 13,
        }
    }
}

/// The element count a shape describes, refusing negative dimensions and overflow.
pub fn element_count(shape: &[i64]) -> Result<usize, ApiError> {
    shape.iter().try_fold(1usize, |n, &d| {
        let d = usize::try_from(d)
            .map_err(|_| ApiError::BadRequest(format!("shape {shape:?} has a negative dimension")))?;
        n.checked_mul(d)
            .ok_or_else(|| ApiError::BadRequest(format!("shape {shape:?} is too large")))
    })
}

/// Splits a BYTES tensor's raw contents into its elements (zero-copy).
pub fn split_bytes_elements(input: &str, raw: &Bytes) -> Result<Vec<Bytes>, ApiError> {
    let mut out = Vec::new();
    let mut at = 0usize;
    while at < raw.len() {
        let Some(len_bytes) = raw.get(at..at + 4) else {
            return Err(ApiError::BadRequest(format!(
                "input {input:?}: BYTES data ends inside an element's 4-byte length prefix"
            )));
        };
        let len = u32::from_le_bytes([len_bytes[0], len_bytes[1], len_bytes[2], len_bytes[3]]) as usize;
        let start = at + 4;
        let end = start
            .checked_add(len)
            .filter(|&e| e <= raw.len())
            .ok_or_else(|| {
                ApiError::BadRequest(format!(
                    "input {input:?}: a BYTES element claims {len} bytes but only {} remain",
                    raw.len() - start
                ))
            })?;
        out.push(raw.slice(start..end));
        at = end;
    }
    Ok(out)
}

/// Encodes BYTES elements: each as a 4-byte little-endian length, then its bytes.
pub fn join_bytes_elements<T: AsRef<[u8]>>(items: &[T]) -> Vec<u8> {
    let total: usize = items.iter().map(|i| 4 + i.as_ref().len()).sum();
    let mut out = Vec::with_capacity(total);
    for item in items {
        let bytes = item.as_ref();
        out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        out.extend_from_slice(bytes);
    }
    out
}

/// An output tensor's values.
#[derive(Debug, Clone, PartialEq)]
pub enum OutputData {
    Fp32(Vec<f32>),
    Int32(Vec<i32>),
    Bytes(Vec<Vec<u8>>),
}

impl OutputData {
    pub fn datatype(&self) -> DataType {
        match self {
            Self::Fp32(_) => DataType::Fp32,
            Self::Int32(_) => DataType::Int32,
            Self::Bytes(_) => DataType::Bytes,
        }
    }

    /// The raw little-endian form, as binary HTTP outputs and gRPC raw contents carry it.
    pub fn to_raw(&self) -> Vec<u8> {
        match self {
            Self::Fp32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Self::Int32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Self::Bytes(v) => join_bytes_elements(v),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_elements_round_trip_and_truncation_is_refused() {
        let raw = Bytes::from(join_bytes_elements(&[b"jpeg".as_slice(), b"", b"png!"]));
        assert_eq!(raw.len(), 3 * 4 + 8);
        let items = split_bytes_elements("IMAGE", &raw).unwrap();
        assert_eq!(items, [&b"jpeg"[..], b"", b"png!"]);
        let cut = raw.slice(..raw.len() - 1);
        let err = split_bytes_elements("IMAGE", &cut).unwrap_err().to_string();
        assert!(err.contains("claims 4 bytes but only 3 remain"), "{err}");
        let err = split_bytes_elements("IMAGE", &Bytes::from_static(&[1, 0])).unwrap_err();
        assert!(err.to_string().contains("length prefix"), "{err}");
    }

    #[test]
    fn element_counts_refuse_negative_and_huge_shapes() {
        assert_eq!(element_count(&[2, 3, 4]).unwrap(), 24);
        assert_eq!(element_count(&[]).unwrap(), 1);
        assert!(element_count(&[-1, 3]).is_err());
        assert!(element_count(&[i64::MAX, i64::MAX]).is_err());
    }

    #[test]
    fn raw_outputs_are_little_endian() {
        assert_eq!(
            OutputData::Int32(vec![1, -1]).to_raw(),
            [1, 0, 0, 0, 255, 255, 255, 255]
        );
        assert_eq!(OutputData::Fp32(vec![1.0]).to_raw(), 1.0f32.to_le_bytes());
    }
}
