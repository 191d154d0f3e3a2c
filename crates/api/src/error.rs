//! One taxonomy of API failures, and the one place they become HTTP status codes.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use peregrine_auth::Denial;
use peregrine_engine::RequestError;
use peregrine_registry::{LookupError, RegistryError, StoreError};
use peregrine_types::ParamsError;
use peregrine_video::ManagerError;
use peregrine_vision::DecodeError;

use crate::profiling::ProfileError;
use crate::wire::{ErrorBody, ErrorDetail};

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error(transparent)]
    Request(#[from] RequestError),
    #[error("{context}: {source}")]
    Image {
        context: String,
        #[source]
        source: RequestError,
    },
    #[error(transparent)]
    Params(#[from] ParamsError),
    #[error("{0}")]
    BadRequest(String),
    #[error("the request body is over the {limit}-byte limit (max-body-bytes)")]
    BodyTooLarge { limit: usize },
    #[error("the client took longer than {seconds} s to send the request body")]
    BodyTimeout { seconds: u64 },
    #[error("unsupported content type {0:?}: send an image (image/jpeg, image/png, image/webp, image/bmp), multipart/form-data or application/json")]
    UnsupportedMediaType(String),
    #[error(transparent)]
    Lookup(#[from] LookupError),
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error(transparent)]
    Stream(#[from] ManagerError),
    #[error("no such route; see /openapi.json")]
    NotFound,
    /// A thing the request names does not exist (an event, a snapshot).
    #[error("{0}")]
    Missing(String),
    #[error("event storage is off (--events-db none): no events are kept")]
    EventsOff,
    #[error(transparent)]
    Events(#[from] peregrine_eventstore::StoreError),
    #[error("internal error: {0}")]
    Internal(String),
    #[error("not ready: {0}")]
    NotReady(String),
    /// Access control refused the request (no key, unknown key, scope, limits).
    #[error(transparent)]
    Denied(#[from] Denial),
    #[error(transparent)]
    Profile(#[from] crate::profiling::ProfileError),
}

impl ApiError {
    fn request_status(e: &RequestError) -> StatusCode {
        match e {
            RequestError::Overloaded { .. }
            | RequestError::QueueFull { .. }
            | RequestError::Backlogged { .. } => StatusCode::TOO_MANY_REQUESTS,
            RequestError::DeadlineExceeded { .. } => StatusCode::GATEWAY_TIMEOUT,
            RequestError::BadImage(DecodeError::TooLarge { .. }) => StatusCode::UNPROCESSABLE_ENTITY,
            RequestError::BadImage(DecodeError::UnsupportedFormat(_)) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            RequestError::BadImage(_) | RequestError::BadTensor(_) => StatusCode::BAD_REQUEST,
            RequestError::NotReady { .. } | RequestError::ShuttingDown | RequestError::NoInstances { .. } => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            // Only the video pipeline sends frames in GPU memory: a server fault.
            RequestError::Inference(_) | RequestError::FrameNotTaken(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn registry_status(e: &RegistryError) -> StatusCode {
        match e {
            RegistryError::Store(StoreError::InvalidName(_)) => StatusCode::BAD_REQUEST,
            RegistryError::Store(StoreError::NotFound { .. }) | RegistryError::NotLoaded { .. } => {
                StatusCode::NOT_FOUND
            }
            // The repository's content cannot be served: a broken file or configuration.
            RegistryError::Store(StoreError::Settings { .. })
            | RegistryError::NoVersions { .. }
            | RegistryError::LoadFailed { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            RegistryError::Store(StoreError::Io(_)) => StatusCode::INTERNAL_SERVER_ERROR,
            RegistryError::RolloutRefused { .. } => StatusCode::CONFLICT,
            RegistryError::Stopped => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    fn profile_status(e: &ProfileError) -> StatusCode {
        match e {
            ProfileError::Disabled => StatusCode::NOT_FOUND,
            ProfileError::BadSeconds(_) | ProfileError::BadFormat(_) => StatusCode::BAD_REQUEST,
            ProfileError::Busy => StatusCode::CONFLICT,
            ProfileError::Failed(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            Self::Profile(e) => Self::profile_status(e),
            Self::Request(e) | Self::Image { source: e, .. } => Self::request_status(e),
            Self::Params(_) | Self::BadRequest(_) => StatusCode::BAD_REQUEST,
            Self::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::BodyTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            Self::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::Lookup(LookupError::NotReady { .. }) | Self::NotReady(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::Lookup(_) | Self::NotFound | Self::Missing(_) | Self::EventsOff => StatusCode::NOT_FOUND,
            Self::Events(e) if e.is_bad_request() => StatusCode::BAD_REQUEST,
            Self::Events(_) | Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            Self::Registry(e) => Self::registry_status(e),
            Self::Denied(Denial::MissingKey | Denial::UnknownKey) => StatusCode::UNAUTHORIZED,
            Self::Denied(Denial::MissingScope { .. }) => StatusCode::FORBIDDEN,
            Self::Denied(Denial::RateLimited { .. } | Denial::ConcurrencyLimited { .. }) => {
                StatusCode::TOO_MANY_REQUESTS
            }
            Self::Stream(e) => match e {
                ManagerError::Duplicate(_) => StatusCode::CONFLICT,
                ManagerError::NotFound(_) => StatusCode::NOT_FOUND,
                ManagerError::Config(_) | ManagerError::Places { .. } | ManagerError::Refused { .. } => {
                    StatusCode::BAD_REQUEST
                }
                ManagerError::Start { .. } => StatusCode::UNPROCESSABLE_ENTITY,
                // The request is fine, this server is the wrong one: the message names the
                // right shard.
                ManagerError::Misdirected { .. } => StatusCode::MISDIRECTED_REQUEST,
                ManagerError::ShutDown => StatusCode::SERVICE_UNAVAILABLE,
                ManagerError::Policy(_) => StatusCode::INTERNAL_SERVER_ERROR,
            },
        }
    }

    /// The gRPC status code: the one place API errors meet gRPC.
    pub fn grpc_code(&self) -> tonic::Code {
        use tonic::Code;
        match self {
            Self::Request(e) | Self::Image { source: e, .. } => match e {
                RequestError::Overloaded { .. }
                | RequestError::QueueFull { .. }
                | RequestError::Backlogged { .. } => Code::ResourceExhausted,
                RequestError::DeadlineExceeded { .. } => Code::DeadlineExceeded,
                RequestError::BadImage(_) | RequestError::BadTensor(_) => Code::InvalidArgument,
                RequestError::NotReady { .. }
                | RequestError::ShuttingDown
                | RequestError::NoInstances { .. } => Code::Unavailable,
                RequestError::Inference(_) | RequestError::FrameNotTaken(_) => Code::Internal,
            },
            Self::Params(_) | Self::BadRequest(_) | Self::UnsupportedMediaType(_) => Code::InvalidArgument,
            Self::BodyTooLarge { .. } => Code::ResourceExhausted,
            Self::BodyTimeout { .. } => Code::DeadlineExceeded,
            Self::Lookup(LookupError::NotReady { .. }) | Self::NotReady(_) => Code::Unavailable,
            Self::Lookup(_) | Self::NotFound | Self::Missing(_) | Self::EventsOff => Code::NotFound,
            Self::Events(e) if e.is_bad_request() => Code::InvalidArgument,
            Self::Events(_) | Self::Internal(_) => Code::Internal,
            Self::Profile(e) => match e {
                ProfileError::Disabled => Code::NotFound,
                ProfileError::BadSeconds(_) | ProfileError::BadFormat(_) => Code::InvalidArgument,
                ProfileError::Busy => Code::Aborted,
                ProfileError::Failed(_) => Code::Internal,
            },
            Self::Registry(e) => match e {
                RegistryError::Store(StoreError::InvalidName(_)) => Code::InvalidArgument,
                RegistryError::Store(StoreError::NotFound { .. }) | RegistryError::NotLoaded { .. } => {
                    Code::NotFound
                }
                RegistryError::Store(StoreError::Settings { .. })
                | RegistryError::NoVersions { .. }
                | RegistryError::LoadFailed { .. }
                | RegistryError::RolloutRefused { .. } => Code::FailedPrecondition,
                RegistryError::Store(StoreError::Io(_)) => Code::Internal,
                RegistryError::Stopped => Code::Unavailable,
            },
            Self::Denied(Denial::MissingKey | Denial::UnknownKey) => Code::Unauthenticated,
            Self::Denied(Denial::MissingScope { .. }) => Code::PermissionDenied,
            Self::Denied(Denial::RateLimited { .. } | Denial::ConcurrencyLimited { .. }) => {
                Code::ResourceExhausted
            }
            Self::Stream(e) => match e {
                ManagerError::Duplicate(_) => Code::AlreadyExists,
                ManagerError::NotFound(_) => Code::NotFound,
                ManagerError::Config(_) | ManagerError::Places { .. } | ManagerError::Refused { .. } => {
                    Code::InvalidArgument
                }
                ManagerError::Start { .. } | ManagerError::Misdirected { .. } => Code::FailedPrecondition,
                ManagerError::ShutDown => Code::Unavailable,
                ManagerError::Policy(_) => Code::Internal,
            },
        }
    }

    /// A stable machine-readable kind, also the metrics outcome for request failures.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Request(e) | Self::Image { source: e, .. } => match e {
                RequestError::Overloaded { .. } => "overloaded",
                RequestError::QueueFull { .. } => "queue_full",
                RequestError::Backlogged { .. } => "backlogged",
                RequestError::DeadlineExceeded { .. } => "deadline_exceeded",
                RequestError::BadImage(DecodeError::TooLarge { .. }) => "image_too_large",
                RequestError::BadImage(_) => "bad_image",
                RequestError::BadTensor(_) => "bad_tensor",
                RequestError::NotReady { .. } => "not_ready",
                RequestError::ShuttingDown => "shutting_down",
                RequestError::NoInstances { .. } => "no_instances",
                RequestError::Inference(_) => "inference_failed",
                RequestError::FrameNotTaken(_) => "frame_not_taken",
            },
            Self::Params(_) | Self::BadRequest(_) => "bad_request",
            Self::BodyTooLarge { .. } => "body_too_large",
            Self::BodyTimeout { .. } => "body_timeout",
            Self::UnsupportedMediaType(_) => "unsupported_media_type",
            Self::Lookup(LookupError::NotReady { .. }) => "not_ready",
            Self::Lookup(_) => "unknown_model",
            Self::Registry(RegistryError::LoadFailed { .. }) => "load_failed",
            Self::Registry(RegistryError::RolloutRefused { .. }) => "rollout_refused",
            Self::Registry(_) => "repository_error",
            Self::Stream(ManagerError::Duplicate(_)) => "stream_exists",
            Self::Stream(ManagerError::NotFound(_)) => "unknown_stream",
            Self::Stream(ManagerError::Places { .. }) => "bad_zones",
            Self::Stream(ManagerError::Misdirected { .. }) => "other_shard",
            Self::Stream(ManagerError::Refused { .. }) => "stream_url_refused",
            Self::Stream(_) => "stream_error",
            Self::NotFound | Self::Missing(_) => "not_found",
            Self::EventsOff => "events_off",
            Self::Events(e) if e.is_bad_request() => "bad_request",
            Self::Events(_) => "event_store_error",
            Self::Internal(_) => "internal",
            Self::NotReady(_) => "not_ready",
            Self::Denied(d) => d.outcome(),
            Self::Profile(ProfileError::Disabled) => "profiling_off",
            Self::Profile(ProfileError::BadSeconds(_) | ProfileError::BadFormat(_)) => "bad_request",
            Self::Profile(ProfileError::Busy) => "profile_running",
            Self::Profile(ProfileError::Failed(_)) => "profile_failed",
        }
    }

    /// The outcome label of `peregrine_requests_total`.
    pub fn outcome(&self) -> &'static str {
        match self {
            Self::Request(e) | Self::Image { source: e, .. } => e.outcome(),
            Self::Denied(_) => "denied",
            _ => "bad_input",
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        // Refusals of a client's way of sending (the slow and the oversized) are how attacks
        // look, so they reach the default (warn) log; auth and the stream policy log their
        // own refusals where they decide them.
        match &self {
            Self::BodyTooLarge { .. } | Self::BodyTimeout { .. } => {
                tracing::warn!(status = status.as_u16(), code = self.code(), "refused: {self}");
            }
            _ if status.is_server_error() => {
                tracing::warn!(status = status.as_u16(), code = self.code(), "{self}");
            }
            _ => tracing::debug!(status = status.as_u16(), code = self.code(), "{self}"),
        }
        let body = ErrorBody {
            error: ErrorDetail {
                code: self.code(),
                message: self.to_string(),
            },
        };
        let mut response = (status, axum::Json(body)).into_response();
        if status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if status == StatusCode::TOO_MANY_REQUESTS || status == StatusCode::SERVICE_UNAVAILABLE {
            // A backlog says how long it needs to drain; everything else, a second.
            let secs = match &self {
                Self::Request(e) | Self::Image { source: e, .. } => e.retry_after().map(|d| d.as_secs()),
                Self::Denied(d) => d.retry_after_secs(),
                _ => None,
            }
            .map_or(1, |s| s.max(1));
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_are_mapped_once_and_sensibly() {
        let cases: Vec<(ApiError, u16)> = vec![
            (RequestError::Overloaded { limit: 4 }.into(), 429),
            (
                RequestError::QueueFull {
                    model: "m".into(),
                    capacity: 1,
                }
                .into(),
                429,
            ),
            (RequestError::DeadlineExceeded { stage: "queued" }.into(), 504),
            (RequestError::BadImage(DecodeError::Empty).into(), 400),
            (
                RequestError::BadImage(DecodeError::TooLarge {
                    width: 1,
                    height: 1,
                    max_pixels: 0,
                })
                .into(),
                422,
            ),
            (RequestError::ShuttingDown.into(), 503),
            (
                RequestError::NoInstances {
                    model: "m".into(),
                    reason: "GPU 1 failed".into(),
                }
                .into(),
                503,
            ),
            (ApiError::BodyTooLarge { limit: 1 }, 413),
            (ApiError::UnsupportedMediaType("text/plain".into()), 415),
            (
                LookupError::UnknownModel {
                    name: "x".into(),
                    known: vec!["y".into()],
                }
                .into(),
                404,
            ),
            (
                LookupError::NotReady {
                    name: "x".into(),
                    version: None,
                    reason: "unloaded".into(),
                }
                .into(),
                503,
            ),
            (
                RegistryError::LoadFailed {
                    name: "x".into(),
                    failed: vec![(2, "bad".into())],
                    serving: vec![1],
                }
                .into(),
                422,
            ),
            (RequestError::BadTensor("short".into()).into(), 400),
            (
                ManagerError::Misdirected {
                    name: "cam".into(),
                    owner: 2,
                    index: 0,
                    count: 3,
                }
                .into(),
                421,
            ),
        ];
        for (e, status) in cases {
            assert_eq!(e.status().as_u16(), status, "{e}");
        }
    }

    #[test]
    fn grpc_codes_follow_the_same_classification() {
        use tonic::Code;
        let cases: Vec<(ApiError, Code)> = vec![
            (
                RequestError::Overloaded { limit: 1 }.into(),
                Code::ResourceExhausted,
            ),
            (
                RequestError::DeadlineExceeded { stage: "queued" }.into(),
                Code::DeadlineExceeded,
            ),
            (
                RequestError::BadImage(DecodeError::Empty).into(),
                Code::InvalidArgument,
            ),
            (
                LookupError::UnknownModel {
                    name: "x".into(),
                    known: vec![],
                }
                .into(),
                Code::NotFound,
            ),
            (ApiError::NotReady("loading".into()), Code::Unavailable),
            (
                RegistryError::NoVersions {
                    name: "m".into(),
                    file: "model.onnx".into(),
                }
                .into(),
                Code::FailedPrecondition,
            ),
        ];
        for (e, code) in cases {
            assert_eq!(e.grpc_code(), code, "{e}");
        }
    }

    #[test]
    fn denials_are_401_403_or_429_and_say_how_to_authenticate_or_when_to_retry() {
        let unauthorized = ApiError::from(Denial::UnknownKey).into_response();
        assert_eq!(unauthorized.status(), 401);
        assert_eq!(unauthorized.headers()[header::WWW_AUTHENTICATE], "Bearer");
        let forbidden = ApiError::from(Denial::MissingScope {
            key_id: "ci".into(),
            scope: peregrine_auth::Scope::Admin,
        });
        assert_eq!(
            (forbidden.status().as_u16(), forbidden.grpc_code()),
            (403, tonic::Code::PermissionDenied)
        );
        let limited = ApiError::from(Denial::RateLimited {
            key_id: "ci".into(),
            retry_after: std::time::Duration::from_millis(2100),
        });
        assert_eq!(limited.grpc_code(), tonic::Code::ResourceExhausted);
        let r = limited.into_response();
        assert_eq!(r.status(), 429);
        assert_eq!(r.headers()[header::RETRY_AFTER], "3");
        assert_eq!(
            ApiError::from(Denial::MissingKey).grpc_code(),
            tonic::Code::Unauthenticated
        );
    }

    #[test]
    fn overload_says_when_to_retry() {
        let r = ApiError::from(RequestError::Overloaded { limit: 4 }).into_response();
        assert_eq!(r.headers()[header::RETRY_AFTER], "1");
        let backlog = RequestError::Backlogged {
            expected_ms: 4500,
            budget_ms: 2000,
        };
        let r = ApiError::from(backlog).into_response();
        assert_eq!(r.headers()[header::RETRY_AFTER], "3", "2.5 s over the deadline");
    }
}
