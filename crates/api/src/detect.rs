//! `POST /v1/detect`: images in, detections out.
//!
//! Order of work, cheapest refusal first: options and model are checked, then a capacity
//! permit is taken (429 at once if none, before the body is read), then the body is read
//! under a size limit and a time limit, then images are decoded and detected.

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine as _;
use bytes::Bytes;
use peregrine_engine::{telemetry, AdmissionPermit, Engine, ImageResult};
use peregrine_types::{ClassRef, DetectParams, ParamsError, ParamsRequest};
use tracing::Instrument;

use crate::body::{deadline_after, discard_body, read_body};
use crate::error::ApiError;
use crate::fallback;
use crate::wire::{BatchResponse, DetectJson, DetectQuery, ImageJson, SingleResponse};
use crate::AppState;

/// An image from the request, with its multipart file name when it had one.
type NamedImage = (Option<String>, Bytes);

/// Most images in one request.
const MAX_IMAGES_PER_REQUEST: usize = 64;

/// Options gathered from the query string and, for JSON bodies, the body.
#[derive(Debug, Default)]
struct Options {
    params: ParamsRequest,
    model: Option<String>,
    version: Option<u64>,
    timeout_ms: Option<u64>,
    fallback: Option<bool>,
}

impl Options {
    fn from_query(q: DetectQuery) -> Self {
        Self {
            params: ParamsRequest {
                conf: q.conf,
                iou: q.iou,
                max_det: q.max_det,
                classes: q.classes.as_deref().map(ClassRef::parse_list),
            },
            model: q.model,
            version: q.version,
            timeout_ms: q.timeout_ms,
            fallback: q.fallback,
        }
    }

    /// The model's fallback may serve this request (`fallback::allowed`).
    fn fallback_allowed(&self) -> bool {
        fallback::allowed(self.version, self.fallback)
    }

    fn params(&self, engine: &Engine) -> Result<DetectParams, ParamsError> {
        self.params
            .resolve(&engine.config().defaults, &engine.spec().names)
    }
}

struct Answer {
    engine: Engine,
    results: Vec<(Option<String>, ImageResult)>,
}

pub async fn detect(
    State(state): State<AppState>,
    query: Result<Query<DetectQuery>, QueryRejection>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let started = Instant::now();
    let request_id = headers
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 128)
        .map_or_else(|| uuid::Uuid::new_v4().to_string(), str::to_string);
    let span = tracing::info_span!("detect", request_id = %request_id, model = tracing::field::Empty, version = tracing::field::Empty);
    let outcome = handle(&state, query, &headers, body, started)
        .instrument(span.clone())
        .await;
    let total = started.elapsed();
    let mut response = match outcome {
        Ok(answer) => {
            let model = answer.engine.name().to_string();
            span.record("model", model.as_str());
            span.record("version", answer.engine.version());
            telemetry::request_finished(&model, "success", total);
            let _guard = span.enter();
            tracing::info!(
                status = 200u16,
                images = answer.results.len(),
                total_ms = total.as_secs_f64() * 1e3,
                "detected"
            );
            let sha256 = state
                .registry
                .snapshot()
                .fingerprint(answer.engine.name(), answer.engine.version())
                .map(|fp| fp.hex());
            respond(answer, sha256, total)
        }
        Err(e) => {
            telemetry::request_finished(&state.default_label(), e.outcome(), total);
            let _guard = span.enter();
            tracing::info!(status = e.status().as_u16(), error = %e, "request failed");
            e.into_response()
        }
    };
    if let Ok(v) = HeaderValue::from_str(&request_id) {
        response.headers_mut().insert("x-request-id", v);
    }
    response
}

/// `sha256`: the answering version's weights' digest, from the registry's snapshot.
fn respond(answer: Answer, sha256: Option<String>, total: Duration) -> Response {
    let names = &answer.engine.spec().names;
    let slowest =
        |f: fn(&ImageResult) -> Duration| answer.results.iter().map(|(_, r)| f(r)).max().unwrap_or_default();
    let decode = slowest(|r| r.timings.decode);
    let queue = slowest(|r| r.timings.queue);
    let inference = slowest(|r| r.timings.inference);
    let (model, version) = (
        answer.engine.name().to_string(),
        answer.engine.version().to_string(),
    );
    let mut images: Vec<ImageJson> = answer
        .results
        .iter()
        .map(|(name, r)| ImageJson::new(name.clone(), r, names, total))
        .collect();
    let mut response = if images.len() == 1 {
        let result = images.remove(0);
        Json(SingleResponse {
            model,
            version,
            sha256,
            result,
        })
        .into_response()
    } else {
        Json(BatchResponse {
            model,
            version,
            sha256,
            results: images,
        })
        .into_response()
    };
    let ms = |d: Duration| format!("{:.3}", d.as_secs_f64() * 1e3);
    let stages = [
        ("decode", decode),
        ("queue", queue),
        ("inference", inference),
        ("total", total),
    ];
    let h = response.headers_mut();
    for (stage, value) in stages {
        if let Ok(v) = HeaderValue::from_str(&ms(value)) {
            h.insert(
                format!("x-{stage}-time-ms")
                    .parse::<header::HeaderName>()
                    .expect("valid name"),
                v,
            );
        }
    }
    let timing: Vec<String> = stages
        .iter()
        .map(|(stage, d)| format!("{stage};dur={}", ms(*d)))
        .collect();
    if let Ok(v) = HeaderValue::from_str(&timing.join(", ")) {
        h.insert("server-timing", v);
    }
    response
}

async fn handle(
    state: &AppState,
    query: Result<Query<DetectQuery>, QueryRejection>,
    headers: &HeaderMap,
    body: Body,
    started: Instant,
) -> Result<Answer, ApiError> {
    let admitted = query
        .map_err(|e| ApiError::BadRequest(format!("bad query string: {}", e.body_text())))
        .and_then(|Query(query)| {
            let options = Options::from_query(query);
            let engine = state.engine(options.model.as_deref(), options.version)?;
            let (engine, permit) = state.admit(engine, options.fallback_allowed())?;
            Ok((options, engine, permit))
        });
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_ascii_lowercase();
    // A JSON body may name another model or its own timeout; any other body's deadline and
    // engine are known now, so a request that cannot be answered in time is refused before
    // its body is read.
    let admitted = match admitted {
        Ok(a) if !content_type.starts_with("application/json") => refuse_early(state, a, headers, started),
        other => other,
    };
    let (mut options, mut engine, mut permit) = match admitted {
        Ok(a) => a,
        Err(e) => {
            discard_body(body, headers, &state.config);
            return Err(e);
        }
    };

    let bytes = read_body(body, headers, &state.config).await?;
    let images = if content_type.starts_with("multipart/form-data") {
        multipart_images(&content_type, bytes).await?
    } else if content_type.starts_with("application/json") {
        let (json_options, images) = json_images(&bytes)?;
        let moved = (json_options.model.is_some() && json_options.model != options.model)
            || (json_options.version.is_some() && json_options.version != options.version);
        if moved {
            // The body names another model or version: admission is that engine's to grant.
            let model = json_options.model.as_deref().or(options.model.as_deref());
            engine = state.engine(model, json_options.version.or(options.version))?;
            permit = engine.try_admit()?;
        }
        options = merge(options, json_options);
        images
    } else if content_type.starts_with("image/")
        || content_type.starts_with("application/octet-stream")
        || content_type.is_empty()
    {
        vec![(None, bytes)]
    } else {
        return Err(ApiError::UnsupportedMediaType(content_type));
    };
    if images.is_empty() {
        return Err(ApiError::BadRequest("the request holds no image".into()));
    }
    if images.len() > MAX_IMAGES_PER_REQUEST {
        return Err(ApiError::BadRequest(format!(
            "{} images in one request; at most {MAX_IMAGES_PER_REQUEST}",
            images.len()
        )));
    }
    let params = options.params(&engine)?;
    let deadline = started
        + deadline_after(
            headers,
            options.timeout_ms.map(Duration::from_millis),
            &state.config,
        )?;
    // A single image refused before any work was spent on it may go to the fallback.
    let retry = (options.fallback_allowed() && images.len() == 1).then(|| images.clone());
    match run_all(&engine, &permit, images, params, deadline).await {
        Ok(results) => Ok(Answer { engine, results }),
        Err(e) => {
            let moved =
                retry.and_then(|images| Some((images, state.after_refusal(&engine, &e, true, |_| true)?)));
            let Some((images, (fallback, permit))) = moved else {
                return Err(e);
            };
            let params = options.params(&fallback)?;
            let results = run_all(&fallback, &permit, images, params, deadline).await?;
            Ok(Answer {
                engine: fallback,
                results,
            })
        }
    }
}

/// Checks an admitted request's engine against its deadline before the body is read
/// (`Engine::check_admission`); one it would answer late goes to the fallback where
/// allowed, or is refused.
fn refuse_early(
    state: &AppState,
    (options, engine, permit): (Options, Engine, AdmissionPermit),
    headers: &HeaderMap,
    started: Instant,
) -> Result<(Options, Engine, AdmissionPermit), ApiError> {
    let timeout = deadline_after(
        headers,
        options.timeout_ms.map(Duration::from_millis),
        &state.config,
    )?;
    match engine.check_admission(&permit, started + timeout) {
        Ok(()) => Ok((options, engine, permit)),
        Err(refusal) => {
            // Nothing of the request has been read, let alone run, so it may move whole.
            let refusal = ApiError::from(refusal);
            match state.after_refusal(&engine, &refusal, options.fallback_allowed(), |_| true) {
                Some((fallback, permit)) => Ok((options, fallback, permit)),
                None => Err(refusal),
            }
        }
    }
}

async fn run_all(
    engine: &Engine,
    permit: &AdmissionPermit,
    images: Vec<NamedImage>,
    params: DetectParams,
    deadline: Instant,
) -> Result<Vec<(Option<String>, ImageResult)>, ApiError> {
    let single = images.len() == 1;
    let names: Vec<Option<String>> = images.iter().map(|(n, _)| n.clone()).collect();
    let futures = images
        .into_iter()
        .map(|(_, bytes)| engine.detect(permit, bytes, params.clone(), deadline));
    let outcomes = futures_util::future::join_all(futures).await;
    let mut results = Vec::with_capacity(outcomes.len());
    for (i, (name, outcome)) in names.into_iter().zip(outcomes).enumerate() {
        match outcome {
            Ok(r) => results.push((name, r)),
            Err(e) if single => return Err(e.into()),
            Err(e) => {
                let which = name.map_or_else(
                    || format!("image {}", i + 1),
                    |n| format!("image {} ({n})", i + 1),
                );
                return Err(ApiError::Image {
                    context: which,
                    source: e,
                });
            }
        }
    }
    Ok(results)
}

/// Every file part of a multipart body, with its file name.
async fn multipart_images(content_type: &str, body: Bytes) -> Result<Vec<NamedImage>, ApiError> {
    let boundary = multer::parse_boundary(content_type)
        .map_err(|e| ApiError::BadRequest(format!("bad multipart content type: {e}")))?;
    let stream = futures_util::stream::once(async move { Ok::<Bytes, std::io::Error>(body) });
    let mut multipart = multer::Multipart::new(stream, boundary);
    let mut images = Vec::new();
    while let Some(field) = multipart
        .next_field()
        .await
        .map_err(|e| ApiError::BadRequest(format!("malformed multipart body: {e}")))?
    {
        let is_file = field.file_name().is_some()
            || field
                .content_type()
                .is_some_and(|m| m.type_() == "image" || m.essence_str() == "application/octet-stream");
        if !is_file {
            continue;
        }
        let name = field.file_name().map(str::to_string);
        let data = field
            .bytes()
            .await
            .map_err(|e| ApiError::BadRequest(format!("malformed multipart body: {e}")))?;
        images.push((name, data));
    }
    Ok(images)
}

fn json_images(body: &[u8]) -> Result<(Options, Vec<NamedImage>), ApiError> {
    let req: DetectJson =
        serde_json::from_slice(body).map_err(|e| ApiError::BadRequest(format!("bad JSON body: {e}")))?;
    let mut encoded = Vec::new();
    encoded.extend(req.image);
    encoded.extend(req.images.unwrap_or_default());
    let engine = base64::engine::general_purpose::STANDARD;
    let images = encoded
        .iter()
        .enumerate()
        .map(|(i, b64)| {
            // Accept data URLs as browsers produce them.
            let data = b64.split_once(";base64,").map_or(b64.as_str(), |(_, d)| d);
            engine
                .decode(data.trim())
                .map(|bytes| (None, Bytes::from(bytes)))
                .map_err(|e| ApiError::BadRequest(format!("image {} is not valid base64: {e}", i + 1)))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let options = Options {
        params: ParamsRequest {
            conf: req.conf,
            iou: req.iou,
            max_det: req.max_det,
            classes: req
                .classes
                .map(|list| list.into_iter().map(ClassRef::from).collect()),
        },
        model: req.model,
        version: req.version,
        timeout_ms: req.timeout_ms,
        fallback: req.fallback,
    };
    Ok((options, images))
}

/// Body options win over query options.
fn merge(query: Options, body: Options) -> Options {
    let (q, b) = (query.params, body.params);
    Options {
        params: ParamsRequest {
            conf: b.conf.or(q.conf),
            iou: b.iou.or(q.iou),
            max_det: b.max_det.or(q.max_det),
            classes: b.classes.or(q.classes),
        },
        model: body.model.or(query.model),
        version: body.version.or(query.version),
        timeout_ms: body.timeout_ms.or(query.timeout_ms),
        fallback: body.fallback.or(query.fallback),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_classes_accept_ids_and_names() {
        let o = Options::from_query(DetectQuery {
            classes: Some("0, car,,2".into()),
            ..Default::default()
        });
        assert_eq!(
            o.params.classes.unwrap(),
            [ClassRef::Id(0), ClassRef::Name("car".into()), ClassRef::Id(2)]
        );
    }

    #[test]
    fn json_bodies_decode_base64_and_data_urls() {
        let (o, images) = json_images(
            br#"{"image": "aGVsbG8=", "images": ["data:image/png;base64,d29ybGQ="], "conf": 0.5}"#,
        )
        .unwrap();
        assert_eq!(o.params.conf, Some(0.5));
        assert_eq!(images[0].1.as_ref(), b"hello");
        assert_eq!(images[1].1.as_ref(), b"world");
        let err = json_images(br#"{"image": "!!!"}"#).unwrap_err();
        assert!(err.to_string().contains("image 1 is not valid base64"), "{err}");
        let err = json_images(br#"{"imagez": "x"}"#).unwrap_err();
        assert!(err.to_string().contains("unknown field"), "{err}");
    }
}
