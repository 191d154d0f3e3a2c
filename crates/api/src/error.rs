//! One taxonomy of API failures, and the one place they become HTTP status codes.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use peregrine_engine::RequestError;
use peregrine_types::ParamsError;
use peregrine_vision::DecodeError;

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
    #[error("unknown model {name:?}; this server has: {}", .known.join(", "))]
    UnknownModel { name: String, known: Vec<String> },
    #[error("no such route; see /openapi.json")]
    NotFound,
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
            RequestError::BadImage(_) => StatusCode::BAD_REQUEST,
            RequestError::NotReady { .. } | RequestError::ShuttingDown => StatusCode::SERVICE_UNAVAILABLE,
            RequestError::Inference(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            Self::Request(e) | Self::Image { source: e, .. } => Self::request_status(e),
            Self::Params(_) | Self::BadRequest(_) => StatusCode::BAD_REQUEST,
            Self::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::BodyTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            Self::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::UnknownModel { .. } | Self::NotFound => StatusCode::NOT_FOUND,
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
                RequestError::NotReady { .. } => "not_ready",
                RequestError::ShuttingDown => "shutting_down",
                RequestError::Inference(_) => "inference_failed",
            },
            Self::Params(_) | Self::BadRequest(_) => "bad_request",
            Self::BodyTooLarge { .. } => "body_too_large",
            Self::BodyTimeout { .. } => "body_timeout",
            Self::UnsupportedMediaType(_) => "unsupported_media_type",
            Self::UnknownModel { .. } => "unknown_model",
            Self::NotFound => "not_found",
        }
    }

    /// The outcome label of `peregrine_requests_total`.
    pub fn outcome(&self) -> &'static str {
        match self {
            Self::Request(e) | Self::Image { source: e, .. } => e.outcome(),
            _ => "bad_input",
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let body = ErrorBody {
            error: ErrorDetail {
                code: self.code(),
                message: self.to_string(),
            },
        };
        let mut response = (status, axum::Json(body)).into_response();
        if status == StatusCode::TOO_MANY_REQUESTS || status == StatusCode::SERVICE_UNAVAILABLE {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
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
            (ApiError::BodyTooLarge { limit: 1 }, 413),
            (ApiError::UnsupportedMediaType("text/plain".into()), 415),
            (
                ApiError::UnknownModel {
                    name: "x".into(),
                    known: vec!["y".into()],
                },
                404,
            ),
        ];
        for (e, status) in cases {
            assert_eq!(e.status().as_u16(), status, "{e}");
        }
    }

    #[test]
    fn overload_says_when_to_retry() {
        let r = ApiError::from(RequestError::Overloaded { limit: 4 }).into_response();
        assert_eq!(r.headers()[header::RETRY_AFTER], "1");
    }
}
