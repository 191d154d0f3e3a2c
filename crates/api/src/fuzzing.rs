//! What the fuzz targets in `fuzz/` call: the request parsers that read bytes straight from
//! the network, before any model is involved. Each takes arbitrary input and must return
//! (an error is fine) without panicking, hanging or allocating without bound. They return
//! the error message (rendered, since it quotes the input) or the inputs parsed.

use axum::http::{HeaderMap, HeaderValue};
use bytes::Bytes;
use prost::Message;

use crate::grpc::proto::ModelInferRequest;
use crate::kserve::infer::InferRequest;
use crate::kserve::tensor::{element_count, split_bytes_elements};

/// A KServe v2 REST inference body, with `header_length` as the
/// `Inference-Header-Content-Length` header when given.
pub fn kserve_rest_body(header_length: Option<&[u8]>, body: &[u8]) -> Result<usize, String> {
    let mut headers = HeaderMap::new();
    if let Some(value) = header_length.and_then(|v| HeaderValue::from_bytes(v).ok()) {
        headers.insert(crate::kserve::rest::HEADER_LENGTH, value);
    }
    let (request, _) =
        crate::kserve::rest::parse(&headers, Bytes::copy_from_slice(body)).map_err(|e| e.to_string())?;
    inspect(&request)
}

/// A gRPC `ModelInferRequest` message as it arrives on the wire.
pub fn grpc_infer_message(message: &[u8]) -> Result<usize, String> {
    let message = ModelInferRequest::decode(message).map_err(|e| e.to_string())?;
    let request = crate::grpc::convert::infer_request(message).map_err(|e| e.to_string())?;
    inspect(&request)
}

/// What inference does with every input before it reaches a model: the element count of
/// its shape, and a BYTES input cut into its elements.
fn inspect(request: &InferRequest) -> Result<usize, String> {
    for input in &request.inputs {
        element_count(&input.shape).map_err(|e| e.to_string())?;
        if input.datatype == "BYTES" {
            let elements = split_bytes_elements(&input.name, &input.raw).map_err(|e| e.to_string())?;
            let total: usize = elements.iter().map(|e| e.len() + 4).sum();
            assert_eq!(
                total,
                input.raw.len(),
                "elements and their prefixes tile the input"
            );
        }
    }
    Ok(request.inputs.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Real requests parse, and a bad one says what is wrong.
    #[test]
    fn entry_points_parse_real_requests_and_refuse_bad_ones() {
        let json = br#"{"inputs":[{"name":"IMAGE","datatype":"BYTES","shape":[1],"parameters":{"binary_data_size":7}}]}"#;
        let mut body = json.to_vec();
        body.extend_from_slice(&[3, 0, 0, 0, b'a', b'b', b'c']);
        assert_eq!(
            kserve_rest_body(Some(json.len().to_string().as_bytes()), &body),
            Ok(1)
        );
        let plain = br#"{"inputs":[{"name":"x","datatype":"FP32","shape":[2],"data":[1,2]}]}"#;
        assert_eq!(kserve_rest_body(None, plain), Ok(1));
        body.truncate(body.len() - 1);
        let err = kserve_rest_body(Some(json.len().to_string().as_bytes()), &body).unwrap_err();
        assert!(err.contains("declares 7 bytes"), "{err}");
        let grpc = ModelInferRequest {
            inputs: vec![crate::grpc::proto::model_infer_request::InferInputTensor {
                name: "IMAGE".into(),
                datatype: "BYTES".into(),
                shape: vec![1],
                ..Default::default()
            }],
            raw_input_contents: vec![vec![1, 0, 0, 0, 9]],
            ..Default::default()
        };
        assert_eq!(grpc_infer_message(&grpc.encode_to_vec()), Ok(1));
        assert!(grpc_infer_message(&[0xff]).is_err());
    }
}
