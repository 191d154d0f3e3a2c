//! W3C trace context on HTTP and gRPC: one layer for both servers that opens each
//! request's server span (a child of the caller's `traceparent` when it sent a valid
//! one, else the root of a new trace), runs the request inside it, records the outcome,
//! and echoes the trace context in the response's `traceparent` (and `tracestate`).
//!
//! The span is `tracing`'s, under [`TARGET`] at TRACE level, like the engine's stages
//! below it; the binary exports them through OpenTelemetry when OTLP is configured. With
//! tracing off no span is made, and a caller's `traceparent` is echoed unchanged, as an
//! intermediary that does not take part in the trace forwards it. A malformed
//! `traceparent` is ignored (the request starts a new trace), as the W3C specification
//! asks, rather than refused.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::extract::MatchedPath;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Request, Response};
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::TraceContextExt;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use peregrine_engine::spans::TARGET;
use tracing::field::Empty;
use tracing::{Instrument, Level, Span};
use tracing_opentelemetry::OpenTelemetrySpanExt;

const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
const TRACESTATE: HeaderName = HeaderName::from_static("tracestate");

/// Which server the layer wraps: it decides the span's name and attributes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Http,
    Grpc,
}

/// The tower layer, for axum's router (as a route layer, so the route's template names
/// the span) and for tonic's server.
#[derive(Debug, Clone, Copy)]
pub struct TraceLayer(pub Protocol);

impl<S> tower::Layer<S> for TraceLayer {
    type Service = Traced<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Traced {
            inner,
            protocol: self.0,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Traced<S> {
    inner: S,
    protocol: Protocol,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B, R> tower::Service<Request<B>> for Traced<S>
where
    S: tower::Service<Request<B>, Response = Response<R>>,
    S::Future: Send + 'static,
    R: 'static,
{
    type Response = Response<R>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Response<R>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let span = request_span(&request, self.protocol);
        // Only needed when this server takes no part in the trace.
        let incoming = span.is_disabled().then(|| Incoming::of(request.headers()));
        let response = span.in_scope(|| self.inner.call(request));
        let protocol = self.protocol;
        Box::pin(async move {
            let mut response = response.instrument(span.clone()).await?;
            match incoming {
                Some(incoming) => incoming.echo(response.headers_mut()),
                None => finish(&span, protocol, &mut response),
            }
            Ok(response)
        })
    }
}

/// The request's server span, or none while nobody traces.
fn request_span<B>(request: &Request<B>, protocol: Protocol) -> Span {
    if !tracing::level_enabled!(Level::TRACE) {
        return Span::none();
    }
    let path = request.uri().path();
    let span = match protocol {
        Protocol::Http => {
            let route = request
                .extensions()
                .get::<MatchedPath>()
                .map_or(path, MatchedPath::as_str);
            let method = request.method().as_str();
            tracing::span!(
                target: TARGET,
                parent: None,
                Level::TRACE,
                "request",
                otel.name = format!("{method} {route}"),
                otel.kind = "server",
                otel.status_code = Empty,
                http.request.method = method,
                http.route = route,
                url.path = path,
                http.response.status_code = Empty,
            )
        }
        Protocol::Grpc => {
            let rpc = path.trim_start_matches('/');
            let (service, method) = rpc.split_once('/').unwrap_or((rpc, ""));
            tracing::span!(
                target: TARGET,
                parent: None,
                Level::TRACE,
                "request",
                otel.name = rpc,
                otel.kind = "server",
                otel.status_code = Empty,
                rpc.system = "grpc",
                rpc.service = service,
                rpc.method = method,
                rpc.grpc.status_code = Empty,
            )
        }
    };
    if !span.is_disabled() {
        let parent = TraceContextPropagator::new().extract(&Headers(request.headers()));
        if parent.span().span_context().is_valid() {
            // Only fails for a span no OpenTelemetry layer sees, which then has no trace.
            let _ = span.set_parent(parent);
        }
    }
    span
}

/// Records the outcome on the request's span and echoes its trace context.
fn finish<R>(span: &Span, protocol: Protocol, response: &mut Response<R>) {
    let failed = match protocol {
        Protocol::Http => {
            let status = response.status();
            span.record("http.response.status_code", i64::from(status.as_u16()));
            status.is_server_error()
        }
        Protocol::Grpc => {
            // An error comes in the headers (a trailers-only response); an answer's
            // status comes in the trailers, after this layer has let go: OK.
            let code = response
                .headers()
                .get("grpc-status")
                .and_then(|v| v.to_str().ok()?.parse::<i32>().ok())
                .unwrap_or(0);
            span.record("rpc.grpc.status_code", code);
            // The server's own faults, as OpenTelemetry's conventions for gRPC servers
            // count them: UNKNOWN, DEADLINE_EXCEEDED, UNIMPLEMENTED, INTERNAL,
            // UNAVAILABLE, DATA_LOSS.
            matches!(code, 2 | 4 | 12 | 13 | 14 | 15)
        }
    };
    if failed {
        span.record("otel.status_code", "error");
    }
    TraceContextPropagator::new().inject_context(&span.context(), &mut HeadersMut(response.headers_mut()));
}

/// The caller's trace context, to hand back unchanged when this server does not trace.
struct Incoming {
    traceparent: Option<HeaderValue>,
    tracestate: Option<HeaderValue>,
}

impl Incoming {
    fn of(headers: &HeaderMap) -> Self {
        Self {
            traceparent: headers.get(TRACEPARENT).cloned(),
            tracestate: headers.get(TRACESTATE).cloned(),
        }
    }

    fn echo(self, headers: &mut HeaderMap) {
        if let Some(traceparent) = self.traceparent {
            headers.insert(TRACEPARENT, traceparent);
            if let Some(tracestate) = self.tracestate {
                headers.insert(TRACESTATE, tracestate);
            }
        }
    }
}

struct Headers<'a>(&'a HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key)?.to_str().ok()
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(HeaderName::as_str).collect()
    }
}

struct HeadersMut<'a>(&'a mut HeaderMap);

impl Injector for HeadersMut<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(name), Ok(value)) = (HeaderName::try_from(key), HeaderValue::try_from(value)) {
            self.0.insert(name, value);
        }
    }
}

#[cfg(test)]
#[path = "trace_tests.rs"]
mod tests;
