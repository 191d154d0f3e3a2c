//! Inference over KServe v2 REST, with Triton's binary tensor data extension: the body is
//! a JSON header (`Inference-Header-Content-Length` bytes of it, or all of it without the
//! header) followed by the binary inputs in input order. Outputs come back as JSON `data`
//! or, when asked for, as binary after the JSON header.

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use bytes::{BufMut, Bytes, BytesMut};
use peregrine_engine::telemetry;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::face;
use super::infer::{admit, infer, InferInput, InferOutput, InferParams, InferRequest, InferResponse};
use super::tensor::{element_count, join_bytes_elements, OutputData};
use super::{parse_version, KserveError};
use crate::body::{deadline_after, discard_body, read_body};
use crate::{ApiError, AppState};

pub const HEADER_LENGTH: &str = "inference-header-content-length";

#[derive(Debug, Deserialize)]
struct RequestJson {
    id: Option<String>,
    #[serde(default)]
    parameters: Map<String, Value>,
    inputs: Vec<InputJson>,
    outputs: Option<Vec<OutputJson>>,
}

#[derive(Debug, Deserialize)]
struct InputJson {
    name: String,
    datatype: String,
    shape: Vec<i64>,
    #[serde(default)]
    parameters: Map<String, Value>,
    data: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct OutputJson {
    name: String,
    #[serde(default)]
    parameters: Map<String, Value>,
}

/// `POST /v2/models/{m}/infer`.
pub async fn infer_latest(
    State(state): State<AppState>,
    Path(model): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    handle(state, model, None, headers, body).await
}

/// `POST /v2/models/{m}/versions/{v}/infer`.
pub async fn infer_version(
    State(state): State<AppState>,
    Path((model, version)): Path<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    match parse_version(&version) {
        Ok(v) => handle(state, model, Some(v), headers, body).await,
        Err(e) => KserveError(e).into_response(),
    }
}

async fn handle(
    state: AppState,
    model: String,
    version: Option<u64>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let started = Instant::now();
    let outcome = run(&state, &model, version, &headers, body, started).await;
    let known = state
        .registry
        .snapshot()
        .models
        .contains_key(model.trim_end_matches(face::TENSOR_SUFFIX));
    // Unknown names stay out of the metrics' labels, so clients cannot grow them.
    let label = if known { model.clone() } else { "unknown".into() };
    match outcome {
        Ok(response) => {
            telemetry::request_finished(&label, "success", started.elapsed());
            response
        }
        Err(e) => {
            telemetry::request_finished(&label, e.outcome(), started.elapsed());
            tracing::info!(model = %model, status = e.status().as_u16(), error = %e, "inference request failed");
            KserveError(e).into_response()
        }
    }
}

async fn run(
    state: &AppState,
    model: &str,
    version: Option<u64>,
    headers: &HeaderMap,
    body: Body,
    started: Instant,
) -> Result<Response, ApiError> {
    let snapshot = state.registry.snapshot();
    let admitted = face::resolve(&snapshot, model)
        .and_then(|resolved| Ok((admit(state, &resolved, version)?, resolved)));
    // A request held for the model's fallback is read before it is settled: only its
    // body says whether it refuses the fallback and whether the fallback takes its input.
    let (admission, resolved) = match admitted {
        Ok(a) => a,
        Err(e) => {
            discard_body(body, headers, &state.config);
            return Err(e);
        }
    };
    let bytes = read_body(body, headers, &state.config).await?;
    let (request, binary_outputs) = parse(headers, bytes)?;
    let deadline = started + deadline_after(headers, request.params.timeout, &state.config)?;
    let response = infer(state, &resolved, version, admission, request, deadline).await?;
    Ok(render(response, &binary_outputs))
}

/// Which outputs go back as binary: the per-output `binary_data` parameter, else the
/// request's `binary_data_output`.
#[derive(Debug, Default)]
pub(crate) struct BinaryOutputs {
    default: bool,
    by_name: Vec<(String, bool)>,
}

impl BinaryOutputs {
    fn wants(&self, name: &str) -> bool {
        self.by_name
            .iter()
            .find(|(n, _)| n == name)
            .map_or(self.default, |(_, b)| *b)
    }
}

pub(crate) fn parse(headers: &HeaderMap, body: Bytes) -> Result<(InferRequest, BinaryOutputs), ApiError> {
    let header_len = match headers.get(HEADER_LENGTH) {
        None => body.len(),
        Some(v) => v
            .to_str()
            .ok()
            .and_then(|s| s.trim().parse::<usize>().ok())
            .ok_or_else(|| {
                ApiError::BadRequest(format!("{HEADER_LENGTH} must be a whole number of bytes"))
            })?,
    };
    if header_len == 0 {
        return Err(ApiError::BadRequest(
            "a raw binary request (Inference-Header-Content-Length: 0) is not supported; send a JSON header"
                .into(),
        ));
    }
    if header_len > body.len() {
        return Err(ApiError::BadRequest(format!(
            "{HEADER_LENGTH} is {header_len} but the body has only {} bytes",
            body.len()
        )));
    }
    let json: RequestJson = serde_json::from_slice(&body[..header_len])
        .map_err(|e| ApiError::BadRequest(format!("bad inference request JSON: {e}")))?;
    let mut binary = body.slice(header_len..);
    let mut inputs = Vec::with_capacity(json.inputs.len());
    for input in json.inputs {
        let size = input.parameters.get("binary_data_size");
        let raw = match (size, &input.data) {
            (Some(size), None) => {
                let n = size.as_u64().ok_or_else(|| {
                    ApiError::BadRequest(format!(
                        "input {:?}: binary_data_size must be a whole number",
                        input.name
                    ))
                })? as usize;
                if n > binary.len() {
                    return Err(ApiError::BadRequest(format!(
                        "input {:?} declares {n} bytes of binary data but only {} remain in the body",
                        input.name,
                        binary.len()
                    )));
                }
                binary.split_to(n)
            }
            (None, Some(data)) => json_data(&input.name, &input.datatype, &input.shape, data)?,
            _ => {
                return Err(ApiError::BadRequest(format!(
                    "input {:?} must set exactly one of 'data' and 'binary_data_size' in 'parameters'",
                    input.name
                )))
            }
        };
        inputs.push(InferInput {
            name: input.name,
            datatype: input.datatype,
            shape: input.shape,
            raw,
        });
    }
    if !binary.is_empty() {
        return Err(ApiError::BadRequest(format!(
            "{} bytes of binary data follow the inputs that no input declared",
            binary.len()
        )));
    }
    let mut outputs = BinaryOutputs {
        default: flag(&json.parameters, "binary_data_output")?.unwrap_or(false),
        by_name: Vec::new(),
    };
    let wanted = match json.outputs {
        None => None,
        Some(list) => {
            let mut names = Vec::with_capacity(list.len());
            for o in list {
                if let Some(b) = flag(&o.parameters, "binary_data")? {
                    outputs.by_name.push((o.name.clone(), b));
                }
                if o.parameters.contains_key("classification") {
                    return Err(ApiError::BadRequest(
                        "the classification extension is not supported; ask for the outputs themselves"
                            .into(),
                    ));
                }
                names.push(o.name);
            }
            Some(names)
        }
    };
    let request = InferRequest {
        id: json.id,
        inputs,
        outputs: wanted,
        params: params(&json.parameters)?,
    };
    Ok((request, outputs))
}

fn flag(params: &Map<String, Value>, key: &str) -> Result<Option<bool>, ApiError> {
    params
        .get(key)
        .map(|v| {
            v.as_bool()
                .ok_or_else(|| ApiError::BadRequest(format!("parameter {key:?} must be true or false")))
        })
        .transpose()
}

/// A number given as a JSON number or a numeric string.
fn number(params: &Map<String, Value>, key: &str) -> Result<Option<f64>, ApiError> {
    params
        .get(key)
        .map(|v| {
            v.as_f64()
                .or_else(|| v.as_str().and_then(|s| s.trim().parse().ok()))
                .ok_or_else(|| ApiError::BadRequest(format!("parameter {key:?} must be a number")))
        })
        .transpose()
}

fn params(p: &Map<String, Value>) -> Result<InferParams, ApiError> {
    let whole = |key: &str| -> Result<Option<u64>, ApiError> {
        number(p, key)?
            .map(|v| {
                (v >= 0.0 && v.fract() == 0.0)
                    .then_some(v as u64)
                    .ok_or_else(|| ApiError::BadRequest(format!("parameter {key:?} must be a whole number")))
            })
            .transpose()
    };
    let classes = match p.get("classes") {
        None => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Array(items)) => Some(
            items
                .iter()
                .map(|i| match i {
                    Value::String(s) => Ok(s.clone()),
                    Value::Number(n) => Ok(n.to_string()),
                    _ => Err(ApiError::BadRequest(
                        "parameter \"classes\" lists ids or names".into(),
                    )),
                })
                .collect::<Result<Vec<_>, _>>()?
                .join(","),
        ),
        Some(_) => {
            return Err(ApiError::BadRequest(
                "parameter \"classes\" must be ids or names, comma separated".into(),
            ))
        }
    };
    Ok(InferParams {
        conf: number(p, "conf")?.map(|v| v as f32),
        iou: number(p, "iou")?.map(|v| v as f32),
        max_det: whole("max_det")?.map(|v| v as usize),
        classes,
        timeout: whole("timeout")?.map(Duration::from_micros),
        fallback: flag(p, "fallback")?,
    })
}

/// JSON `data` (flat or nested, row-major) as the raw bytes binary data would carry.
/// BYTES elements are base64 strings (JSON cannot carry raw image bytes).
fn json_data(name: &str, datatype: &str, shape: &[i64], data: &Value) -> Result<Bytes, ApiError> {
    let mut flat = Vec::new();
    flatten(data, &mut flat);
    let want = element_count(shape)?;
    if flat.len() != want {
        return Err(ApiError::BadRequest(format!(
            "input {name:?}: shape {shape:?} has {want} elements but 'data' holds {}",
            flat.len()
        )));
    }
    let bad =
        |what: &str| ApiError::BadRequest(format!("input {name:?}: every {datatype} element must be {what}"));
    match datatype {
        "FP32" => {
            let mut out = BytesMut::with_capacity(want * 4);
            for v in flat {
                out.put_f32_le(v.as_f64().ok_or_else(|| bad("a number"))? as f32);
            }
            Ok(out.freeze())
        }
        "UINT8" => flat
            .iter()
            .map(|v| {
                v.as_u64()
                    .and_then(|n| u8::try_from(n).ok())
                    .ok_or_else(|| bad("a whole number from 0 to 255"))
            })
            .collect::<Result<Vec<u8>, _>>()
            .map(Bytes::from),
        "BYTES" => {
            let engine = base64::engine::general_purpose::STANDARD;
            let items = flat
                .iter()
                .map(|v| {
                    let s = v.as_str().ok_or_else(|| bad("a base64 string"))?;
                    let b64 = s.split_once(";base64,").map_or(s, |(_, d)| d);
                    engine.decode(b64.trim()).map_err(|e| {
                        ApiError::BadRequest(format!("input {name:?}: an element is not valid base64: {e}"))
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Bytes::from(join_bytes_elements(&items)))
        }
        other => Err(ApiError::BadRequest(format!(
            "input {name:?}: {other} data is not accepted as JSON here; send FP32, UINT8 or BYTES"
        ))),
    }
}

fn flatten<'a>(v: &'a Value, out: &mut Vec<&'a Value>) {
    match v {
        Value::Array(items) => items.iter().for_each(|i| flatten(i, out)),
        other => out.push(other),
    }
}

fn json_values(data: &OutputData) -> Value {
    match data {
        OutputData::Fp32(v) => json!(v),
        OutputData::Int32(v) => json!(v),
        OutputData::Bytes(v) => Value::Array(
            v.iter()
                .map(|b| Value::String(String::from_utf8_lossy(b).into_owned()))
                .collect(),
        ),
    }
}

fn render(response: InferResponse, binary: &BinaryOutputs) -> Response {
    let mut tail: Vec<u8> = Vec::new();
    let outputs: Vec<Value> = response
        .outputs
        .iter()
        .map(|InferOutput { name, shape, data }| {
            let mut o = json!({
                "name": name,
                "datatype": data.datatype().protocol_name(),
                "shape": shape,
            });
            if binary.wants(name) {
                let raw = data.to_raw();
                o["parameters"] = json!({ "binary_data_size": raw.len() });
                tail.extend_from_slice(&raw);
            } else {
                o["data"] = json_values(data);
            }
            o
        })
        .collect();
    let mut head = json!({
        "model_name": response.model_name,
        "model_version": response.model_version,
        "outputs": outputs,
    });
    if let Some(id) = response.id {
        head["id"] = Value::String(id);
    }
    let head = serde_json::to_vec(&head).expect("JSON values serialise");
    let has_binary = binary_present(&response.outputs, binary);
    if !has_binary {
        return ([(header::CONTENT_TYPE, "application/json")], head).into_response();
    }
    let head_len = head.len();
    let mut body = head;
    body.extend_from_slice(&tail);
    let mut r = ([(header::CONTENT_TYPE, "application/octet-stream")], body).into_response();
    r.headers_mut().insert(HEADER_LENGTH, HeaderValue::from(head_len));
    r
}

fn binary_present(outputs: &[InferOutput], binary: &BinaryOutputs) -> bool {
    outputs.iter().any(|o| binary.wants(&o.name))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(json: &str, tail: &[u8]) -> Result<(InferRequest, BinaryOutputs), ApiError> {
        let mut body = json.as_bytes().to_vec();
        body.extend_from_slice(tail);
        let mut headers = HeaderMap::new();
        if !tail.is_empty() {
            headers.insert(HEADER_LENGTH, HeaderValue::from(json.len()));
        }
        parse(&headers, Bytes::from(body))
    }

    #[test]
    fn binary_inputs_are_cut_in_order_and_their_sizes_checked() {
        let json = r#"{"inputs":[{"name":"IMAGE","datatype":"BYTES","shape":[1,1],"parameters":{"binary_data_size":7}}],
            "parameters":{"binary_data_output":true,"conf":0.4,"timeout":2000000}}"#;
        let tail = join_bytes_elements(&[b"abc"]);
        let (r, out) = request(json, &tail).unwrap();
        assert_eq!(r.inputs[0].raw.as_ref(), tail.as_slice());
        assert!(out.wants("BOXES"));
        assert_eq!(r.params.conf, Some(0.4));
        assert_eq!(r.params.timeout, Some(Duration::from_secs(2)));
        let err = request(json, &tail[..5]).unwrap_err().to_string();
        assert!(
            err.contains("declares 7 bytes of binary data but only 5 remain"),
            "{err}"
        );
        let mut long = tail.clone();
        long.push(0);
        let err = request(json, &long).unwrap_err().to_string();
        assert!(err.contains("1 bytes of binary data follow the inputs"), "{err}");
    }

    #[test]
    fn json_data_may_be_nested_and_must_match_the_shape() {
        let json = r#"{"inputs":[{"name":"x","datatype":"FP32","shape":[2,2],"data":[[1,2],[3,4.5]]}],
            "outputs":[{"name":"y","parameters":{"binary_data":true}},{"name":"z"}]}"#;
        let (r, out) = request(json, b"").unwrap();
        let values: Vec<f32> = r.inputs[0]
            .raw
            .chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(values, [1.0, 2.0, 3.0, 4.5]);
        assert_eq!(
            r.outputs.as_deref(),
            Some(&["y".to_string(), "z".to_string()][..])
        );
        assert!(out.wants("y") && !out.wants("z"));
        let bad = r#"{"inputs":[{"name":"x","datatype":"FP32","shape":[3],"data":[1,2]}]}"#;
        let err = request(bad, b"").unwrap_err().to_string();
        assert!(
            err.contains("shape [3] has 3 elements but 'data' holds 2"),
            "{err}"
        );
        let both = r#"{"inputs":[{"name":"x","datatype":"FP32","shape":[1],"data":[1],"parameters":{"binary_data_size":4}}]}"#;
        assert!(request(both, b"")
            .unwrap_err()
            .to_string()
            .contains("exactly one of"));
        let words = r#"{"inputs":[{"name":"x","datatype":"FP32","shape":[1],"data":["a"]}]}"#;
        assert!(request(words, b"")
            .unwrap_err()
            .to_string()
            .contains("must be a number"));
    }

    #[test]
    fn json_images_are_base64_and_parameters_are_typed() {
        let json = r#"{"inputs":[{"name":"IMAGE","datatype":"BYTES","shape":[1],"data":["aGk="]}],
            "parameters":{"classes":["person", 2],"max_det":"5","fallback":false}}"#;
        let (r, _) = request(json, b"").unwrap();
        assert_eq!(r.inputs[0].raw.as_ref(), join_bytes_elements(&[b"hi"]).as_slice());
        assert_eq!(r.params.classes.as_deref(), Some("person,2"));
        assert_eq!(r.params.max_det, Some(5));
        assert_eq!(r.params.fallback, Some(false));
        let bad = r#"{"inputs":[],"parameters":{"fallback":"no"}}"#;
        assert_eq!(
            request(bad, b"").unwrap_err().to_string(),
            "parameter \"fallback\" must be true or false"
        );
        let bad = r#"{"inputs":[],"parameters":{"max_det":2.5}}"#;
        assert!(request(bad, b"")
            .unwrap_err()
            .to_string()
            .contains("whole number"));
        let bad = r#"{"inputs":[],"parameters":{"binary_data_output":"yes"}}"#;
        assert!(request(bad, b"")
            .unwrap_err()
            .to_string()
            .contains("true or false"));
    }

    #[tokio::test]
    async fn binary_outputs_follow_the_json_header() {
        let response = InferResponse {
            model_name: "m".into(),
            model_version: "2".into(),
            id: Some("r1".into()),
            outputs: vec![
                InferOutput {
                    name: "A".into(),
                    shape: vec![1, 2],
                    data: OutputData::Fp32(vec![1.0, 2.0]),
                },
                InferOutput {
                    name: "B".into(),
                    shape: vec![1],
                    data: OutputData::Int32(vec![7]),
                },
            ],
        };
        let binary = BinaryOutputs {
            default: false,
            by_name: vec![("A".into(), true)],
        };
        let r = render(response, &binary);
        let len: usize = r.headers()[HEADER_LENGTH].to_str().unwrap().parse().unwrap();
        assert_eq!(r.headers()[header::CONTENT_TYPE], "application/octet-stream");
        let body = axum::body::to_bytes(r.into_body(), 1 << 20).await.unwrap();
        let head: Value = serde_json::from_slice(&body[..len]).unwrap();
        assert_eq!(head["model_version"], "2");
        assert_eq!(head["id"], "r1");
        assert_eq!(head["outputs"][0]["parameters"]["binary_data_size"], 8);
        assert_eq!(head["outputs"][1]["data"], json!([7]));
        assert!(
            head["outputs"][1].get("parameters").is_none(),
            "no parameters without binary_data_size"
        );
        assert_eq!(
            &body[len..],
            [1.0f32.to_le_bytes(), 2.0f32.to_le_bytes()].concat().as_slice()
        );
    }
}
