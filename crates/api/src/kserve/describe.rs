//! Model metadata, configuration and statistics as KServe v2 REST serialises them (the
//! JSON Triton's clients and perf_analyzer parse). The gRPC service builds the same
//! content as protobuf from the same [`FaceInfo`].

use peregrine_engine::{Engine, StatsSnapshot};
use peregrine_registry::VersionPolicy;
use serde_json::{json, Value};

use super::face::{Face, FaceInfo, TensorSpec};

/// `GET /v2/models/{m}`: the leading -1 batch dimension appears when the model batches.
pub fn metadata(info: &FaceInfo) -> Value {
    let tensors = |specs: &[TensorSpec]| -> Vec<Value> {
        specs
            .iter()
            .map(|t| {
                json!({
                    "name": t.name,
                    "datatype": t.datatype.protocol_name(),
                    "shape": batched_shape(info, &t.dims),
                })
            })
            .collect()
    };
    json!({
        "name": info.name,
        "versions": info.versions.iter().map(u64::to_string).collect::<Vec<_>>(),
        "platform": info.platform(),
        "inputs": tensors(&info.inputs),
        "outputs": tensors(&info.outputs),
        "sha256": info.sha256.iter().map(|(v, h)| (v.to_string(), json!(h))).collect::<serde_json::Map<_, _>>(),
    })
}

/// The full shape a client sends: `[-1, dims...]` for a batching model.
pub fn batched_shape(info: &FaceInfo, dims: &[i64]) -> Vec<i64> {
    let mut shape = Vec::with_capacity(dims.len() + 1);
    if info.max_batch_size >= 1 {
        shape.push(-1);
    }
    shape.extend_from_slice(dims);
    shape
}

/// Detection thresholds and class names, in the configuration's `parameters`.
pub fn parameters(info: &FaceInfo) -> Vec<(String, String)> {
    if info.face == Face::Tensor {
        return Vec::new();
    }
    let d = &info.settings.engine.defaults;
    vec![
        ("conf".into(), d.conf.to_string()),
        ("iou".into(), d.iou.to_string()),
        ("max_det".into(), d.max_det.to_string()),
        (
            "class_names".into(),
            serde_json::to_string(&info.class_names()).expect("strings serialise"),
        ),
    ]
}

/// `GET /v2/models/{m}/config`: Triton's JSON of `ModelConfig`, with its defaults
/// printed, as perf_analyzer reads it.
pub fn config(info: &FaceInfo) -> Value {
    let policy = match info.version_policy() {
        VersionPolicy::Latest(n) => json!({ "latest": { "num_versions": n } }),
        VersionPolicy::All => json!({ "all": {} }),
        VersionPolicy::Specific(v) => json!({ "specific": { "versions": v } }),
    };
    let inputs: Vec<Value> = info
        .inputs
        .iter()
        .map(|t| {
            json!({
                "name": t.name, "data_type": t.datatype.config_name(), "format": "FORMAT_NONE",
                "dims": t.dims, "is_shape_tensor": false, "allow_ragged_batch": false,
                "optional": false, "is_non_linear_format_io": false,
            })
        })
        .collect();
    let outputs: Vec<Value> = info
        .outputs
        .iter()
        .map(|t| {
            json!({
                "name": t.name, "data_type": t.datatype.config_name(), "dims": t.dims,
                "label_filename": "", "is_shape_tensor": false, "is_non_linear_format_io": false,
            })
        })
        .collect();
    let batching = &info.settings.engine.policy;
    let (kind, _, gpus) = info.instance_kind();
    let params: serde_json::Map<String, Value> = parameters(info)
        .into_iter()
        .map(|(k, v)| (k, json!({ "string_value": v })))
        .collect();
    json!({
        "name": info.name,
        "platform": info.platform(),
        "backend": info.backend(),
        "runtime": "",
        "version_policy": policy,
        "max_batch_size": info.max_batch_size,
        "input": inputs,
        "output": outputs,
        "batch_input": [],
        "batch_output": [],
        "optimization": {
            "priority": "PRIORITY_DEFAULT",
            "input_pinned_memory": { "enable": true },
            "output_pinned_memory": { "enable": true },
            "gather_kernel_buffer_threshold": 0,
            "eager_batching": false,
        },
        "dynamic_batching": {
            "preferred_batch_size": batching.preferred,
            "max_queue_delay_microseconds": batching.max_delay.as_micros() as u64,
            "preserve_ordering": false,
            "priority_levels": 0,
            "default_priority_level": 0,
            "priority_queue_policy": {},
        },
        "instance_group": [{
            "name": info.name, "kind": kind, "count": info.settings.engine.instances, "gpus": gpus,
            "secondary_devices": [], "profile": [], "passive": false, "host_policy": "",
        }],
        "default_model_filename": info.settings.model_file,
        "cc_model_filenames": {},
        "metric_tags": {},
        "parameters": params,
        "model_warmup": [],
    })
}

fn duration(count: u64, ns: u64) -> Value {
    json!({ "count": count, "ns": ns })
}

/// One version's statistics, in the statistics extension's shape.
pub fn version_stats(name: &str, engine: &Engine) -> Value {
    let s: StatsSnapshot = engine.stats();
    let d = |t: peregrine_engine::stats::StageTotal| duration(t.count, t.ns);
    json!({
        "name": name,
        "version": engine.version(),
        "last_inference": s.last_inference_ms,
        "inference_count": s.inference_count,
        "execution_count": s.execution_count,
        "inference_stats": {
            "success": d(s.success), "fail": d(s.fail), "queue": d(s.queue),
            "compute_input": d(s.compute_input), "compute_infer": d(s.compute_infer),
            "compute_output": d(s.compute_output),
            "cache_hit": duration(0, 0), "cache_miss": duration(0, 0),
        },
        "response_stats": {},
        "batch_stats": s.batches.iter().map(|b| json!({
            "batch_size": b.batch_size,
            "compute_input": d(b.compute_input),
            "compute_infer": d(b.compute_infer),
            "compute_output": d(b.compute_output),
        })).collect::<Vec<_>>(),
        "memory_usage": [],
    })
}
