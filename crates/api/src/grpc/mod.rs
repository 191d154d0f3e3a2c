//! The Open Inference Protocol over gRPC: Triton's `inference.GRPCInferenceService`
//! (compiled from `proto/`, same field numbers as the published definitions) and the
//! standard `grpc.health.v1.Health`, on a port of their own. Inference shares
//! `kserve::infer` with REST; errors map to gRPC codes in [`ApiError::grpc_code`].

pub(crate) mod convert;

pub mod proto {
    #![allow(clippy::all, clippy::pedantic, missing_docs)]
    tonic::include_proto!("inference");
}

use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::Stream;
use peregrine_engine::{telemetry, RequestError};
use proto::grpc_inference_service_server::{GrpcInferenceService, GrpcInferenceServiceServer};
use tokio::sync::{mpsc, Semaphore};
use tokio_stream::StreamExt as _;
use tonic::{Request, Response, Status, Streaming};

use crate::kserve::face::{self, FaceInfo};
use crate::kserve::{check_load_parameters, infer, parse_version, EXTENSIONS};
use crate::{ApiError, AppState};

impl From<ApiError> for Status {
    fn from(e: ApiError) -> Self {
        Status::new(e.grpc_code(), e.to_string())
    }
}

/// Requests of one `ModelStreamInfer` stream being worked on at once; the stream's
/// reader waits beyond that, so one client cannot queue unbounded work.
const STREAM_CONCURRENCY: usize = 64;

#[derive(Clone)]
pub struct InferenceService {
    state: AppState,
}

impl InferenceService {
    pub fn new(state: AppState) -> Self {
        Self { state }
    }

    /// The tonic service, with message limits as large as the REST body limit (tonic's
    /// default of 4 MiB is smaller than one 640x640 float image).
    pub fn into_server(self) -> GrpcInferenceServiceServer<Self> {
        let limit = self.state.config.max_body_bytes;
        GrpcInferenceServiceServer::new(self)
            .max_decoding_message_size(limit)
            .max_encoding_message_size(usize::MAX)
    }

    fn version(v: &str) -> Result<Option<u64>, ApiError> {
        if v.is_empty() {
            Ok(None)
        } else {
            parse_version(v).map(Some)
        }
    }

    fn describe<T>(&self, name: &str, version: &str, f: impl FnOnce(&FaceInfo) -> T) -> Result<T, Status> {
        let version = Self::version(version)?;
        let snapshot = self.state.registry.snapshot();
        let resolved = face::resolve(&snapshot, name)?;
        Ok(f(&FaceInfo::of(&resolved, version)?))
    }

    async fn infer_one(
        state: &AppState,
        request: proto::ModelInferRequest,
        timeout: Option<Duration>,
    ) -> Result<proto::ModelInferResponse, ApiError> {
        let started = Instant::now();
        let name = request.model_name.clone();
        let version = Self::version(&request.model_version)?;
        let snapshot = state.registry.snapshot();
        let outcome = async {
            // Counted like an HTTP request, so the drain waits for it; refused once draining.
            let Some(_in_flight) = state.drain.enter() else {
                return Err(RequestError::ShuttingDown.into());
            };
            let resolved = face::resolve(&snapshot, &name)?;
            // tonic has read the message by now; admission still comes before converting
            // its tensors, so a full server spends nothing more on a request it refuses.
            let admission = infer::admit(state, &resolved, version)?;
            let request = convert::infer_request(request)?;
            let asked = timeout
                .or(request.params.timeout)
                .unwrap_or(state.config.default_timeout);
            if asked.is_zero() {
                return Err(ApiError::BadRequest(
                    "the request timeout must be at least 1 ms".into(),
                ));
            }
            let deadline = started + asked.min(state.config.max_timeout);
            infer::infer(state, &resolved, version, admission, request, deadline).await
        }
        .await;
        let label = if snapshot
            .models
            .contains_key(name.trim_end_matches(face::TENSOR_SUFFIX))
        {
            name.as_str()
        } else {
            "unknown"
        };
        match outcome {
            Ok(r) => {
                telemetry::request_finished(label, "success", started.elapsed());
                Ok(convert::infer_response(r))
            }
            Err(e) => {
                telemetry::request_finished(label, e.outcome(), started.elapsed());
                tracing::info!(model = %name, code = ?e.grpc_code(), error = %e, "gRPC inference request failed");
                Err(e)
            }
        }
    }
}

/// The client's deadline from the `grpc-timeout` header ("100m", "5S", ...).
fn grpc_timeout<T>(r: &Request<T>) -> Option<Duration> {
    let v = r.metadata().get("grpc-timeout")?.to_str().ok()?;
    let (digits, unit) = v.split_at(v.len().checked_sub(1)?);
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.saturating_mul(3600)),
        "M" => Duration::from_secs(n.saturating_mul(60)),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

type ResponseStream = Pin<Box<dyn Stream<Item = Result<proto::ModelStreamInferResponse, Status>> + Send>>;

#[tonic::async_trait]
impl GrpcInferenceService for InferenceService {
    async fn server_live(
        &self,
        _: Request<proto::ServerLiveRequest>,
    ) -> Result<Response<proto::ServerLiveResponse>, Status> {
        Ok(Response::new(proto::ServerLiveResponse { live: true }))
    }

    async fn server_ready(
        &self,
        _: Request<proto::ServerReadyRequest>,
    ) -> Result<Response<proto::ServerReadyResponse>, Status> {
        let ready = self.state.is_ready();
        Ok(Response::new(proto::ServerReadyResponse { ready }))
    }

    /// As in Triton, an unknown or unready model answers `ready: false`, not an error.
    async fn model_ready(
        &self,
        request: Request<proto::ModelReadyRequest>,
    ) -> Result<Response<proto::ModelReadyResponse>, Status> {
        let r = request.into_inner();
        let version = Self::version(&r.version)?;
        let snapshot = self.state.registry.snapshot();
        let ready = face::resolve(&snapshot, &r.name).is_ok_and(|f| f.model.engine(version).is_ok());
        Ok(Response::new(proto::ModelReadyResponse { ready }))
    }

    async fn server_metadata(
        &self,
        _: Request<proto::ServerMetadataRequest>,
    ) -> Result<Response<proto::ServerMetadataResponse>, Status> {
        Ok(Response::new(proto::ServerMetadataResponse {
            name: "peregrine".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            extensions: EXTENSIONS.iter().map(|e| e.to_string()).collect(),
        }))
    }

    async fn model_metadata(
        &self,
        request: Request<proto::ModelMetadataRequest>,
    ) -> Result<Response<proto::ModelMetadataResponse>, Status> {
        let r = request.into_inner();
        self.describe(&r.name, &r.version, convert::metadata)
            .map(Response::new)
    }

    async fn model_infer(
        &self,
        request: Request<proto::ModelInferRequest>,
    ) -> Result<Response<proto::ModelInferResponse>, Status> {
        let timeout = grpc_timeout(&request);
        Self::infer_one(&self.state, request.into_inner(), timeout)
            .await
            .map(Response::new)
            .map_err(Status::from)
    }

    type ModelStreamInferStream = ResponseStream;

    /// Each request on the stream is answered on it, errors included (as
    /// `error_message`), in the order they finish; `id` tells them apart.
    async fn model_stream_infer(
        &self,
        request: Request<Streaming<proto::ModelInferRequest>>,
    ) -> Result<Response<Self::ModelStreamInferStream>, Status> {
        let timeout = grpc_timeout(&request);
        let mut incoming = request.into_inner();
        let (tx, rx) = mpsc::channel(STREAM_CONCURRENCY);
        let state = self.state.clone();
        let slots = Arc::new(Semaphore::new(STREAM_CONCURRENCY));
        tokio::spawn(async move {
            while let Ok(Some(req)) = incoming.message().await {
                let Ok(slot) = slots.clone().acquire_owned().await else {
                    break;
                };
                let (state, tx) = (state.clone(), tx.clone());
                tokio::spawn(async move {
                    let id = req.id.clone();
                    let answer = match Self::infer_one(&state, req, timeout).await {
                        Ok(r) => proto::ModelStreamInferResponse {
                            error_message: String::new(),
                            infer_response: Some(r),
                        },
                        Err(e) => proto::ModelStreamInferResponse {
                            error_message: e.to_string(),
                            infer_response: Some(proto::ModelInferResponse {
                                id,
                                ..Default::default()
                            }),
                        },
                    };
                    let _ = tx.send(Ok(answer)).await;
                    drop(slot);
                });
            }
        });
        let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
        Ok(Response::new(Box::pin(stream)))
    }

    async fn model_config(
        &self,
        request: Request<proto::ModelConfigRequest>,
    ) -> Result<Response<proto::ModelConfigResponse>, Status> {
        let r = request.into_inner();
        self.describe(&r.name, &r.version, |i| proto::ModelConfigResponse {
            config: Some(convert::config(i)),
        })
        .map(Response::new)
    }

    async fn model_statistics(
        &self,
        request: Request<proto::ModelStatisticsRequest>,
    ) -> Result<Response<proto::ModelStatisticsResponse>, Status> {
        let r = request.into_inner();
        let model_stats = if r.name.is_empty() {
            let snapshot = self.state.registry.snapshot();
            snapshot
                .models
                .values()
                .flat_map(|m| {
                    m.versions
                        .iter()
                        .filter_map(move |v| Some((m, v.engine.as_ref()?)))
                })
                .flat_map(|(m, e)| {
                    [
                        convert::stats(&m.name, e),
                        convert::stats(&format!("{}{}", m.name, face::TENSOR_SUFFIX), e),
                    ]
                })
                .collect()
        } else {
            self.describe(&r.name, &r.version, |i| {
                i.engines.iter().map(|e| convert::stats(&i.name, e)).collect()
            })?
        };
        Ok(Response::new(proto::ModelStatisticsResponse { model_stats }))
    }

    async fn repository_index(
        &self,
        request: Request<proto::RepositoryIndexRequest>,
    ) -> Result<Response<proto::RepositoryIndexResponse>, Status> {
        let r = request.into_inner();
        let entries = self.state.registry.index(r.ready).await.map_err(ApiError::from)?;
        Ok(Response::new(convert::index(&entries)))
    }

    async fn repository_model_load(
        &self,
        request: Request<proto::RepositoryModelLoadRequest>,
    ) -> Result<Response<proto::RepositoryModelLoadResponse>, Status> {
        let r = request.into_inner();
        check_load_parameters(r.parameters.keys().map(String::as_str))?;
        self.state
            .registry
            .load(&r.model_name)
            .await
            .map_err(ApiError::from)?;
        Ok(Response::new(proto::RepositoryModelLoadResponse {}))
    }

    async fn repository_model_unload(
        &self,
        request: Request<proto::RepositoryModelUnloadRequest>,
    ) -> Result<Response<proto::RepositoryModelUnloadResponse>, Status> {
        let r = request.into_inner();
        self.state
            .registry
            .unload(&r.model_name)
            .await
            .map_err(ApiError::from)?;
        Ok(Response::new(proto::RepositoryModelUnloadResponse {}))
    }
}

/// The connections `listener` accepts, each with TCP_NODELAY set. tonic's own
/// `tcp_nodelay` applies only to listeners it binds itself; with Nagle's algorithm on, a
/// response's later frames wait for the client's delayed ACK, which measured 40 ms per
/// metadata call (0.46 ms with it off, 2026-12-01).
fn incoming_without_nagle(
    listener: tokio::net::TcpListener,
) -> impl Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    tokio_stream::wrappers::TcpListenerStream::new(listener).map(|stream| {
        if let Ok(tcp) = &stream {
            if let Err(e) = tcp.set_nodelay(true) {
                tracing::debug!(error = %e, "could not set TCP_NODELAY on a gRPC connection");
            }
        }
        stream
    })
}

/// Sets both health entries (the server's and the inference service's).
async fn report_health(reporter: &tonic_health::server::HealthReporter, ready: bool) {
    let status = if ready {
        tonic_health::ServingStatus::Serving
    } else {
        tonic_health::ServingStatus::NotServing
    };
    for service in ["", "inference.GRPCInferenceService"] {
        reporter.set_service_status(service, status).await;
    }
}

/// Where the gRPC server's connections come from.
pub enum GrpcListener {
    Plain(tokio::net::TcpListener),
    Tls(crate::tls::TlsListener),
}

/// Serves the inference and health services on `listener` until `shutdown` resolves.
/// Health reports SERVING while the server is ready and not draining.
pub async fn serve(
    listener: GrpcListener,
    state: AppState,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), tonic::transport::Error> {
    let (reporter, health) = tonic_health::server::health_reporter();
    // tonic-health starts the server's own entry ("") as SERVING: the real state is set
    // before the first connection is accepted, then followed.
    let mut last = state.is_ready();
    report_health(&reporter, last).await;
    let watched = state.clone();
    let watcher = tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let ready = watched.is_ready();
            if last != ready {
                report_health(&reporter, ready).await;
                last = ready;
            }
        }
    });
    // HTTP/2's default 64 KiB flow-control window makes a 1.2 MB image tensor wait for a
    // dozen window updates; large windows let a request arrive in one round trip.
    let access = crate::access::GrpcAccessLayer(state.access.clone());
    let router = tonic::transport::Server::builder()
        .initial_stream_window_size(Some(8 << 20))
        .initial_connection_window_size(Some(32 << 20))
        .layer(crate::trace::TraceLayer(crate::trace::Protocol::Grpc))
        .layer(access)
        .add_service(health)
        .add_service(InferenceService::new(state).into_server());
    let outcome = match listener {
        GrpcListener::Plain(tcp) => {
            router
                .serve_with_incoming_shutdown(incoming_without_nagle(tcp), shutdown)
                .await
        }
        GrpcListener::Tls(tls) => {
            router
                .serve_with_incoming_shutdown(tls.into_grpc_incoming(), shutdown)
                .await
        }
    };
    watcher.abort();
    outcome
}

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn accepted_connections_have_nagle_off() {
        use tokio_stream::StreamExt as _;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut incoming = Box::pin(super::incoming_without_nagle(listener));
        let _client = tokio::net::TcpStream::connect(addr).await.unwrap();
        let accepted = incoming.next().await.unwrap().unwrap();
        assert!(accepted.nodelay().unwrap());
    }

    use super::*;

    #[test]
    fn grpc_timeouts_parse_every_unit() {
        let with = |v: &str| {
            let mut r = Request::new(());
            r.metadata_mut().insert("grpc-timeout", v.parse().unwrap());
            grpc_timeout(&r)
        };
        assert_eq!(with("100m"), Some(Duration::from_millis(100)));
        assert_eq!(with("2S"), Some(Duration::from_secs(2)));
        assert_eq!(with("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(with("5u"), Some(Duration::from_micros(5)));
        assert_eq!(with("x"), None);
        assert_eq!(grpc_timeout(&Request::new(())), None);
    }
}
