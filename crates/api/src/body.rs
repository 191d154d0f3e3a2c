//! Reading request bodies under the server's limits, and each request's deadline; shared
//! by every HTTP route that takes a body.

use std::time::Duration;

use axum::body::Body;
use axum::http::{header, HeaderMap};
use bytes::Bytes;

use crate::error::ApiError;

/// The request's time budget: `x-request-timeout-ms` header, else the `timeout_ms` option,
/// else the server default; never more than the server maximum.
pub fn deadline_after(
    headers: &HeaderMap,
    option: Option<Duration>,
    config: &crate::ApiConfig,
) -> Result<Duration, ApiError> {
    let header_ms = match headers.get("x-request-timeout-ms") {
        None => None,
        Some(v) => Some(
            v.to_str()
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
                .ok_or_else(|| {
                    ApiError::BadRequest("x-request-timeout-ms must be a whole number of milliseconds".into())
                })?,
        ),
    };
    let asked = header_ms
        .map(Duration::from_millis)
        .or(option)
        .unwrap_or(config.default_timeout);
    if asked.is_zero() {
        return Err(ApiError::BadRequest(
            "the request timeout must be at least 1 ms".into(),
        ));
    }
    Ok(asked.min(config.max_timeout))
}

pub async fn read_body(
    body: Body,
    headers: &HeaderMap,
    config: &crate::ApiConfig,
) -> Result<Bytes, ApiError> {
    let limit = config.max_body_bytes;
    let declared = declared_length(headers);
    if declared.is_some_and(|n| n > limit) {
        discard_body(body, headers, config);
        return Err(ApiError::BodyTooLarge { limit });
    }
    match tokio::time::timeout(config.body_timeout, axum::body::to_bytes(body, limit)).await {
        Err(_) => Err(ApiError::BodyTimeout {
            seconds: config.body_timeout.as_secs(),
        }),
        Ok(Err(e)) if e.to_string().contains("length limit") => Err(ApiError::BodyTooLarge { limit }),
        Ok(Err(e)) => Err(ApiError::BadRequest(format!(
            "could not read the request body: {e}"
        ))),
        Ok(Ok(bytes)) => Ok(bytes),
    }
}

/// The body length the client declared, if it declared a readable one.
fn declared_length(headers: &HeaderMap) -> Option<usize> {
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok())
}

/// Reads and discards, in the background, the body of a request refused before its body
/// was needed (at most a few times the body limit, for at most two seconds), while the
/// refusal goes out at once. Closing a connection with unread data makes the kernel reset
/// it, and the client would see a broken connection instead of the refusal. Reading bytes
/// costs no decode and no compute.
pub fn discard_body(body: Body, headers: &HeaderMap, config: &crate::ApiConfig) {
    let declared = declared_length(headers);
    let cap = config.max_body_bytes.saturating_mul(4).max(64 << 20);
    if declared.is_some_and(|n| n > cap) {
        return;
    }
    let drain = async move {
        let mut stream = body.into_data_stream();
        let mut seen = 0usize;
        while let Some(Ok(chunk)) = futures_util::StreamExt::next(&mut stream).await {
            seen += chunk.len();
            if seen > cap {
                break;
            }
        }
    };
    tokio::spawn(async move {
        let _ = tokio::time::timeout(Duration::from_secs(2), drain).await;
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn config() -> crate::ApiConfig {
        crate::ApiConfig {
            max_body_bytes: 100,
            default_timeout: Duration::from_secs(10),
            max_timeout: Duration::from_secs(60),
            body_timeout: Duration::from_secs(5),
        }
    }

    #[test]
    fn deadline_comes_from_header_then_option_then_default_and_is_capped() {
        let mut h = HeaderMap::new();
        assert_eq!(
            deadline_after(&h, None, &config()).unwrap(),
            Duration::from_secs(10)
        );
        assert_eq!(
            deadline_after(&h, Some(Duration::from_millis(250)), &config()).unwrap(),
            Duration::from_millis(250)
        );
        h.insert("x-request-timeout-ms", HeaderValue::from_static("40"));
        assert_eq!(
            deadline_after(&h, Some(Duration::from_millis(250)), &config()).unwrap(),
            Duration::from_millis(40)
        );
        h.insert("x-request-timeout-ms", HeaderValue::from_static("999999999"));
        assert_eq!(
            deadline_after(&h, None, &config()).unwrap(),
            Duration::from_secs(60)
        );
        h.insert("x-request-timeout-ms", HeaderValue::from_static("soon"));
        assert!(deadline_after(&h, None, &config()).is_err());
        assert!(deadline_after(&HeaderMap::new(), Some(Duration::ZERO), &config()).is_err());
    }
}
