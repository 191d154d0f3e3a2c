//! Request and response bodies of the HTTP API.

use peregrine_engine::{ImageResult, RequestTimings};
use peregrine_types::{ClassNames, Detection};
use serde::{Deserialize, Serialize};

/// Options given in the query string of `POST /v1/detect`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DetectQuery {
    pub conf: Option<f32>,
    pub iou: Option<f32>,
    pub max_det: Option<usize>,
    /// Comma-separated class ids or names.
    pub classes: Option<String>,
    pub model: Option<String>,
    /// A version of the model [default: the highest ready one].
    pub version: Option<u64>,
    pub timeout_ms: Option<u64>,
    /// `false`: never serve this request with the model's fallback.
    pub fallback: Option<bool>,
}

/// A class given by id or by name.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum ClassRef {
    Id(u32),
    Name(String),
}

impl From<ClassRef> for peregrine_types::ClassRef {
    fn from(c: ClassRef) -> Self {
        match c {
            ClassRef::Id(id) => Self::Id(id),
            ClassRef::Name(name) => Self::Name(name),
        }
    }
}

/// `POST /v1/detect` with `Content-Type: application/json`. Fields override the query.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DetectJson {
    /// One base64-encoded image.
    pub image: Option<String>,
    /// Several base64-encoded images.
    pub images: Option<Vec<String>>,
    pub conf: Option<f32>,
    pub iou: Option<f32>,
    pub max_det: Option<usize>,
    pub classes: Option<Vec<ClassRef>>,
    pub model: Option<String>,
    pub version: Option<u64>,
    pub timeout_ms: Option<u64>,
    /// `false`: never serve this request with the model's fallback.
    pub fallback: Option<bool>,
}

#[derive(Debug, Serialize)]
pub struct DetectionJson {
    pub class_id: u32,
    pub class_name: String,
    pub score: f64,
    #[serde(rename = "box")]
    pub bbox: [f64; 4],
}

/// Scores keep 5 decimals and coordinates 2, as the CLI prints them.
fn round(v: f32, decimals: i32) -> f64 {
    let k = 10f64.powi(decimals);
    (f64::from(v) * k).round() / k
}

impl DetectionJson {
    pub fn new(d: &Detection, names: &ClassNames) -> Self {
        Self {
            class_id: d.class_id,
            class_name: names.name(d.class_id).into_owned(),
            score: round(d.score, 5),
            bbox: [d.bbox.x1, d.bbox.y1, d.bbox.x2, d.bbox.y2].map(|v| round(v, 2)),
        }
    }
}

#[derive(Debug, Serialize)]
pub struct TimingsJson {
    pub decode_ms: f64,
    pub queue_ms: f64,
    pub inference_ms: f64,
    pub total_ms: f64,
    pub batch_size: usize,
}

fn ms(d: std::time::Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

impl TimingsJson {
    pub fn new(t: &RequestTimings, total: std::time::Duration) -> Self {
        Self {
            decode_ms: ms(t.decode),
            queue_ms: ms(t.queue),
            inference_ms: ms(t.inference),
            total_ms: ms(total),
            batch_size: t.batch_size,
        }
    }
}

/// One image's answer.
#[derive(Debug, Serialize)]
pub struct ImageJson {
    /// The multipart file name, when the image came with one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    pub width: u32,
    pub height: u32,
    pub detections: Vec<DetectionJson>,
    pub timings: TimingsJson,
}

impl ImageJson {
    pub fn new(
        name: Option<String>,
        r: &ImageResult,
        names: &ClassNames,
        total: std::time::Duration,
    ) -> Self {
        Self {
            image: name,
            width: r.width,
            height: r.height,
            detections: r
                .detections
                .iter()
                .map(|d| DetectionJson::new(d, names))
                .collect(),
            timings: TimingsJson::new(&r.timings, total),
        }
    }
}

/// The response to a request with one image: the image's fields at the top level.
#[derive(Debug, Serialize)]
pub struct SingleResponse {
    pub model: String,
    pub version: String,
    /// The SHA-256 (hex) of the weights the version was loaded from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    #[serde(flatten)]
    pub result: ImageJson,
}

/// The response to a request with several images, in request order.
#[derive(Debug, Serialize)]
pub struct BatchResponse {
    pub model: String,
    pub version: String,
    /// The SHA-256 (hex) of the weights the version was loaded from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    pub results: Vec<ImageJson>,
}

#[derive(Debug, Serialize)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Serialize)]
pub struct ErrorDetail {
    pub code: &'static str,
    pub message: String,
}

#[derive(Debug, Serialize)]
pub struct ReadyBody {
    pub ready: bool,
    pub draining: bool,
    pub models: Vec<ModelReady>,
}

#[derive(Debug, Serialize)]
pub struct ModelReady {
    pub name: String,
    /// The highest ready version, if any.
    pub version: Option<String>,
    pub ready: bool,
    /// Why the model is not ready.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The serving version's instances: where each runs and whether it takes work.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub instances: Vec<InstanceJson>,
}

/// One model instance in `/health/ready`.
#[derive(Debug, Serialize)]
pub struct InstanceJson {
    /// `cpu`, `gpu0`, `gpu1`, ...
    pub device: String,
    /// `serving`, or `retired` once its device failed.
    pub state: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl InstanceJson {
    pub fn list(placement: &[peregrine_engine::InstancePlacement]) -> Vec<Self> {
        placement
            .iter()
            .map(|p| Self {
                device: peregrine_engine::device_label(p.device),
                state: p.state(),
                reason: p.retired.clone(),
            })
            .collect()
    }
}
