//! Between the protocol-neutral types of `kserve` and the gRPC messages.

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use peregrine_engine::stats::StageTotal;
use peregrine_engine::Engine;
use peregrine_registry::{IndexEntry, VersionPolicy};

use super::proto;
use crate::kserve::describe::{batched_shape, parameters};
use crate::kserve::face::{FaceInfo, TensorSpec};
use crate::kserve::infer::{InferInput, InferParams, InferRequest, InferResponse};
use crate::kserve::state_name;
use crate::kserve::tensor::join_bytes_elements;
use crate::ApiError;
use proto::infer_parameter::ParameterChoice;

pub fn metadata(info: &FaceInfo) -> proto::ModelMetadataResponse {
    let tensors = |specs: &[TensorSpec]| {
        specs
            .iter()
            .map(|t| proto::model_metadata_response::TensorMetadata {
                name: t.name.clone(),
                datatype: t.datatype.protocol_name().into(),
                shape: batched_shape(info, &t.dims),
            })
            .collect()
    };
    proto::ModelMetadataResponse {
        name: info.name.clone(),
        versions: info.versions.iter().map(u64::to_string).collect(),
        platform: info.platform().into(),
        inputs: tensors(&info.inputs),
        outputs: tensors(&info.outputs),
    }
}

pub fn config(info: &FaceInfo) -> proto::ModelConfig {
    use proto::model_version_policy::{All, Latest, PolicyChoice, Specific};
    let policy = match info.version_policy() {
        VersionPolicy::Latest(n) => PolicyChoice::Latest(Latest {
            num_versions: *n as u32,
        }),
        VersionPolicy::All => PolicyChoice::All(All {}),
        VersionPolicy::Specific(v) => PolicyChoice::Specific(Specific {
            versions: v.iter().map(|&v| v as i64).collect(),
        }),
    };
    let (_, kind, gpus) = info.instance_kind();
    let batching = &info.settings.engine.policy;
    proto::ModelConfig {
        name: info.name.clone(),
        platform: info.platform().into(),
        backend: info.backend().into(),
        runtime: String::new(),
        version_policy: Some(proto::ModelVersionPolicy {
            policy_choice: Some(policy),
        }),
        max_batch_size: info.max_batch_size as i32,
        input: info
            .inputs
            .iter()
            .map(|t| proto::ModelInput {
                name: t.name.clone(),
                data_type: t.datatype.proto_value(),
                dims: t.dims.clone(),
                ..Default::default()
            })
            .collect(),
        output: info
            .outputs
            .iter()
            .map(|t| proto::ModelOutput {
                name: t.name.clone(),
                data_type: t.datatype.proto_value(),
                dims: t.dims.clone(),
                ..Default::default()
            })
            .collect(),
        optimization: Some(proto::ModelOptimizationPolicy {
            input_pinned_memory: Some(proto::model_optimization_policy::PinnedMemoryBuffer { enable: true }),
            output_pinned_memory: Some(proto::model_optimization_policy::PinnedMemoryBuffer { enable: true }),
            ..Default::default()
        }),
        scheduling_choice: Some(proto::model_config::SchedulingChoice::DynamicBatching(
            proto::ModelDynamicBatching {
                preferred_batch_size: batching.preferred.iter().map(|&p| p as i32).collect(),
                max_queue_delay_microseconds: batching.max_delay.as_micros() as u64,
                ..Default::default()
            },
        )),
        instance_group: vec![proto::ModelInstanceGroup {
            name: info.name.clone(),
            kind,
            count: info.settings.engine.instances as i32,
            gpus,
            ..Default::default()
        }],
        default_model_filename: info.settings.model_file.clone(),
        parameters: parameters(info)
            .into_iter()
            .map(|(k, v)| (k, proto::ModelParameter { string_value: v }))
            .collect(),
        model_transaction_policy: Some(proto::ModelTransactionPolicy { decoupled: false }),
    }
}

fn duration(t: StageTotal) -> Option<proto::StatisticDuration> {
    Some(proto::StatisticDuration {
        count: t.count,
        ns: t.ns,
    })
}

pub fn stats(name: &str, engine: &Engine) -> proto::ModelStatistics {
    let s = engine.stats();
    proto::ModelStatistics {
        name: name.to_string(),
        version: engine.version().to_string(),
        last_inference: s.last_inference_ms,
        inference_count: s.inference_count,
        execution_count: s.execution_count,
        inference_stats: Some(proto::InferStatistics {
            success: duration(s.success),
            fail: duration(s.fail),
            queue: duration(s.queue),
            compute_input: duration(s.compute_input),
            compute_infer: duration(s.compute_infer),
            compute_output: duration(s.compute_output),
            cache_hit: duration(StageTotal::default()),
            cache_miss: duration(StageTotal::default()),
        }),
        batch_stats: s
            .batches
            .iter()
            .map(|b| proto::InferBatchStatistics {
                batch_size: b.batch_size as u64,
                compute_input: duration(b.compute_input),
                compute_infer: duration(b.compute_infer),
                compute_output: duration(b.compute_output),
            })
            .collect(),
        memory_usage: Vec::new(),
        response_stats: HashMap::new(),
    }
}

pub fn index(entries: &[IndexEntry]) -> proto::RepositoryIndexResponse {
    proto::RepositoryIndexResponse {
        models: entries
            .iter()
            .map(|e| proto::repository_index_response::ModelIndex {
                name: e.name.clone(),
                version: e.version.map(|v| v.to_string()).unwrap_or_default(),
                state: e.state.map(state_name).unwrap_or_default().into(),
                reason: e.reason.clone().unwrap_or_default(),
            })
            .collect(),
    }
}

fn number(p: &proto::InferParameter) -> Option<f64> {
    match p.parameter_choice.as_ref()? {
        ParameterChoice::DoubleParam(v) => Some(*v),
        ParameterChoice::Int64Param(v) => Some(*v as f64),
        ParameterChoice::Uint64Param(v) => Some(*v as f64),
        ParameterChoice::StringParam(s) => s.trim().parse().ok(),
        ParameterChoice::BoolParam(_) => None,
    }
}

fn params(map: &HashMap<String, proto::InferParameter>) -> Result<InferParams, ApiError> {
    let num = |key: &str| -> Result<Option<f64>, ApiError> {
        map.get(key)
            .map(|p| {
                number(p).ok_or_else(|| ApiError::BadRequest(format!("parameter {key:?} must be a number")))
            })
            .transpose()
    };
    let whole = |key: &str| -> Result<Option<u64>, ApiError> {
        num(key)?
            .map(|v| {
                (v >= 0.0 && v.fract() == 0.0)
                    .then_some(v as u64)
                    .ok_or_else(|| ApiError::BadRequest(format!("parameter {key:?} must be a whole number")))
            })
            .transpose()
    };
    let classes = match map.get("classes").and_then(|p| p.parameter_choice.as_ref()) {
        None => None,
        Some(ParameterChoice::StringParam(s)) => Some(s.clone()),
        Some(ParameterChoice::Int64Param(v)) => Some(v.to_string()),
        Some(ParameterChoice::Uint64Param(v)) => Some(v.to_string()),
        Some(_) => {
            return Err(ApiError::BadRequest(
                "parameter \"classes\" must be ids or names, comma separated".into(),
            ))
        }
    };
    let fallback = match map.get("fallback").and_then(|p| p.parameter_choice.as_ref()) {
        None => None,
        Some(ParameterChoice::BoolParam(b)) => Some(*b),
        Some(_) => {
            return Err(ApiError::BadRequest(
                "parameter \"fallback\" must be a bool_param (true or false)".into(),
            ))
        }
    };
    Ok(InferParams {
        conf: num("conf")?.map(|v| v as f32),
        iou: num("iou")?.map(|v| v as f32),
        max_det: whole("max_det")?.map(|v| v as usize),
        classes,
        timeout: whole("timeout")?.map(Duration::from_micros),
        fallback,
    })
}

/// A gRPC inference request in the protocol-neutral form. Inputs come from
/// `raw_input_contents` (one entry per input, as Triton's clients send them) or else from
/// the typed `contents`.
pub fn infer_request(r: proto::ModelInferRequest) -> Result<InferRequest, ApiError> {
    if !r.raw_input_contents.is_empty() && r.raw_input_contents.len() != r.inputs.len() {
        return Err(ApiError::BadRequest(format!(
            "the request has {} inputs but {} raw_input_contents",
            r.inputs.len(),
            r.raw_input_contents.len()
        )));
    }
    let mut raw = r.raw_input_contents.into_iter();
    let inputs = r
        .inputs
        .into_iter()
        .map(|i| {
            let data = match raw.next() {
                Some(bytes) => Bytes::from(bytes),
                None => typed_contents(&i)?,
            };
            Ok(InferInput {
                name: i.name,
                datatype: i.datatype,
                shape: i.shape,
                raw: data,
            })
        })
        .collect::<Result<Vec<_>, ApiError>>()?;
    Ok(InferRequest {
        id: (!r.id.is_empty()).then_some(r.id),
        inputs,
        outputs: (!r.outputs.is_empty()).then(|| r.outputs.into_iter().map(|o| o.name).collect()),
        params: params(&r.parameters)?,
    })
}

fn typed_contents(i: &proto::model_infer_request::InferInputTensor) -> Result<Bytes, ApiError> {
    let c = i.contents.as_ref().ok_or_else(|| {
        ApiError::BadRequest(format!(
            "input {:?} has no data: set raw_input_contents or contents",
            i.name
        ))
    })?;
    match i.datatype.as_str() {
        "FP32" => Ok(Bytes::from(
            c.fp32_contents
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect::<Vec<u8>>(),
        )),
        "BYTES" => Ok(Bytes::from(join_bytes_elements(&c.bytes_contents))),
        "UINT8" => c
            .uint_contents
            .iter()
            .map(|&v| u8::try_from(v))
            .collect::<Result<Vec<u8>, _>>()
            .map(Bytes::from)
            .map_err(|_| ApiError::BadRequest(format!("input {:?}: UINT8 values must be 0 to 255", i.name))),
        other => Err(ApiError::BadRequest(format!(
            "input {:?}: {other} is not accepted; send FP32, UINT8 or BYTES",
            i.name
        ))),
    }
}

/// Every output as raw contents, in output order: Triton's clients read only these.
pub fn infer_response(r: InferResponse) -> proto::ModelInferResponse {
    let mut raw = Vec::with_capacity(r.outputs.len());
    let outputs = r
        .outputs
        .into_iter()
        .map(|o| {
            raw.push(o.data.to_raw());
            proto::model_infer_response::InferOutputTensor {
                name: o.name,
                datatype: o.data.datatype().protocol_name().into(),
                shape: o.shape.iter().map(|&d| d as i64).collect(),
                parameters: HashMap::new(),
                contents: None,
            }
        })
        .collect();
    proto::ModelInferResponse {
        model_name: r.model_name,
        model_version: r.model_version,
        id: r.id.unwrap_or_default(),
        parameters: HashMap::new(),
        outputs,
        raw_output_contents: raw,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kserve::tensor::DataType;

    fn param(c: ParameterChoice) -> proto::InferParameter {
        proto::InferParameter {
            parameter_choice: Some(c),
        }
    }

    #[test]
    fn parameters_accept_the_types_triton_clients_send() {
        let map = HashMap::from([
            ("conf".to_string(), param(ParameterChoice::DoubleParam(0.5))),
            ("max_det".to_string(), param(ParameterChoice::Int64Param(10))),
            (
                "timeout".to_string(),
                param(ParameterChoice::Uint64Param(250_000)),
            ),
            (
                "classes".to_string(),
                param(ParameterChoice::StringParam("person".into())),
            ),
            ("priority".to_string(), param(ParameterChoice::Uint64Param(3))),
        ]);
        let p = params(&map).unwrap();
        assert_eq!(p.conf, Some(0.5));
        assert_eq!(p.max_det, Some(10));
        assert_eq!(p.timeout, Some(Duration::from_millis(250)));
        assert_eq!(p.classes.as_deref(), Some("person"));
        let bad = HashMap::from([("iou".to_string(), param(ParameterChoice::BoolParam(true)))]);
        assert!(params(&bad)
            .unwrap_err()
            .to_string()
            .contains("\"iou\" must be a number"));
        let off = HashMap::from([("fallback".to_string(), param(ParameterChoice::BoolParam(false)))]);
        assert_eq!(params(&off).unwrap().fallback, Some(false));
        assert_eq!(p.fallback, None);
        let bad = HashMap::from([(
            "fallback".to_string(),
            param(ParameterChoice::StringParam("false".into())),
        )]);
        let err = params(&bad).unwrap_err();
        assert_eq!(err.grpc_code(), tonic::Code::InvalidArgument);
        assert!(
            err.to_string().contains("\"fallback\" must be a bool_param"),
            "{err}"
        );
    }

    #[test]
    fn inputs_come_from_raw_or_typed_contents() {
        let tensor = |name: &str, datatype: &str, contents| proto::model_infer_request::InferInputTensor {
            name: name.into(),
            datatype: datatype.into(),
            shape: vec![1],
            parameters: HashMap::new(),
            contents,
        };
        let typed = proto::ModelInferRequest {
            inputs: vec![tensor(
                "x",
                "FP32",
                Some(proto::InferTensorContents {
                    fp32_contents: vec![1.5],
                    ..Default::default()
                }),
            )],
            ..Default::default()
        };
        let r = infer_request(typed).unwrap();
        assert_eq!(r.inputs[0].raw.as_ref(), 1.5f32.to_le_bytes());
        let mismatched = proto::ModelInferRequest {
            inputs: vec![tensor("x", "FP32", None), tensor("y", "FP32", None)],
            raw_input_contents: vec![vec![0; 4]],
            ..Default::default()
        };
        assert!(infer_request(mismatched)
            .unwrap_err()
            .to_string()
            .contains("2 inputs but 1 raw_input_contents"));
        let empty = proto::ModelInferRequest {
            inputs: vec![tensor("x", "FP32", None)],
            ..Default::default()
        };
        assert!(infer_request(empty)
            .unwrap_err()
            .to_string()
            .contains("has no data"));
    }

    #[test]
    fn config_enums_match_model_config_proto() {
        assert_eq!(DataType::Fp32.proto_value(), proto::DataType::TypeFp32 as i32);
        assert_eq!(DataType::Int32.proto_value(), proto::DataType::TypeInt32 as i32);
        assert_eq!(DataType::Bytes.proto_value(), proto::DataType::TypeString as i32);
        assert_eq!(2, proto::model_instance_group::Kind::Cpu as i32);
        assert_eq!(1, proto::model_instance_group::Kind::Gpu as i32);
    }
}
