use std::convert::Infallible;

use axum::body::Body;
use opentelemetry::trace::{SpanKind, TracerProvider as _};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
use tower::{Layer as _, Service as _};
use tracing_subscriber::layer::SubscriberExt as _;

use super::*;

const CALLER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// Calls a traced service that answers `status` for a request with `headers`, and returns
/// the answer's headers.
fn call(protocol: Protocol, status: u16, headers: &[(&str, &str)]) -> HeaderMap {
    let inner = tower::service_fn(move |_: Request<Body>| async move {
        Ok::<_, Infallible>(Response::builder().status(status).body(Body::empty()).unwrap())
    });
    let mut service = TraceLayer(protocol).layer(inner);
    let mut request = Request::builder().uri("/inference.GRPCInferenceService/ModelInfer");
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let response = runtime
        .block_on(service.call(request.body(Body::empty()).unwrap()))
        .unwrap();
    response.headers().clone()
}

/// Runs `f` with an OpenTelemetry layer that sees the trace spans, and returns what it
/// exported.
fn traced<T>(f: impl FnOnce() -> T) -> (T, Vec<opentelemetry_sdk::trace::SpanData>) {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("test"));
    let subscriber = tracing_subscriber::registry().with(layer);
    let out = tracing::subscriber::with_default(subscriber, f);
    provider.force_flush().unwrap();
    (out, exporter.get_finished_spans().unwrap())
}

fn ids(traceparent: &HeaderValue) -> (String, String) {
    let parts: Vec<String> = traceparent
        .to_str()
        .unwrap()
        .split('-')
        .map(str::to_string)
        .collect();
    assert_eq!(parts.len(), 4, "{traceparent:?}");
    (parts[1].clone(), parts[2].clone())
}

#[test]
fn without_traces_the_callers_context_comes_back_unchanged() {
    // A subscriber that takes no spans, set here explicitly: the other tests' subscribers
    // (thread-local, unlike the server's one global subscriber) would otherwise make the
    // span callsites look enabled on this thread too.
    let untraced = || tracing::subscriber::NoSubscriber::default();
    let headers = tracing::subscriber::with_default(untraced(), || {
        call(
            Protocol::Http,
            200,
            &[("traceparent", CALLER), ("tracestate", "a=1")],
        )
    });
    assert_eq!(headers["traceparent"], CALLER);
    assert_eq!(headers["tracestate"], "a=1");
    let headers = tracing::subscriber::with_default(untraced(), || call(Protocol::Http, 200, &[]));
    assert!(headers.get("traceparent").is_none(), "nothing to echo");
}

#[test]
fn a_traced_request_is_a_server_span_in_the_callers_trace() {
    let (headers, spans) = traced(|| call(Protocol::Grpc, 200, &[("traceparent", CALLER)]));
    let (trace, span) = ids(&headers["traceparent"]);
    assert_eq!(trace, CALLER_TRACE);
    assert_eq!(spans.len(), 1, "{spans:?}");
    let server = &spans[0];
    assert_eq!(server.name, "inference.GRPCInferenceService/ModelInfer");
    assert_eq!(server.span_kind, SpanKind::Server);
    assert_eq!(
        server.span_context.span_id().to_string(),
        span,
        "the echo names this span"
    );
    assert_eq!(server.parent_span_id.to_string(), "00f067aa0ba902b7");
    let attribute = |key: &str| {
        server
            .attributes
            .iter()
            .find(|kv| kv.key.as_str() == key)
            .map(|kv| kv.value.to_string())
    };
    assert_eq!(
        attribute("rpc.service").as_deref(),
        Some("inference.GRPCInferenceService")
    );
    assert_eq!(attribute("rpc.method").as_deref(), Some("ModelInfer"));
    assert_eq!(attribute("rpc.grpc.status_code").as_deref(), Some("0"));
}

#[test]
fn a_malformed_traceparent_starts_a_new_trace_and_a_server_error_marks_the_span() {
    let (headers, spans) = traced(|| call(Protocol::Http, 503, &[("traceparent", "00-not-a-trace-01")]));
    let (trace, _) = ids(&headers["traceparent"]);
    assert_ne!(trace, CALLER_TRACE);
    assert_eq!(trace.len(), 32);
    let server = &spans[0];
    assert_eq!(
        server.parent_span_id,
        opentelemetry::trace::SpanId::INVALID,
        "a root"
    );
    assert!(
        matches!(server.status, opentelemetry::trace::Status::Error { .. }),
        "{:?}",
        server.status
    );
}
