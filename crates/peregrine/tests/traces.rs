//! Traces, received as a collector receives them: the real server exports OTLP over gRPC
//! to a receiver in this test (OpenTelemetry's own protobuf types over tonic), and the
//! spans must form the tree the README describes, inside the callers' traces.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::image_bytes;
use common::server::{post_image, Server};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::Span;
use peregrine_api::grpc::proto;

/// Every span exported to it, in arrival order.
#[derive(Clone, Default)]
struct Receiver(Arc<Mutex<Vec<Span>>>);

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let spans = request
            .into_inner()
            .resource_spans
            .into_iter()
            .flat_map(|r| r.scope_spans)
            .flat_map(|s| s.spans);
        self.0.lock().unwrap().extend(spans);
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

async fn start_receiver() -> (Receiver, String) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let receiver = Receiver::default();
    let service = TraceServiceServer::new(receiver.clone());
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    (receiver, endpoint)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn attribute(span: &Span, key: &str) -> Option<AnyValue> {
    span.attributes
        .iter()
        .find(|a| a.key == key)
        .and_then(|a| a.value.clone()?.value)
}

fn string_attribute(span: &Span, key: &str) -> Option<String> {
    match attribute(span, key)? {
        AnyValue::StringValue(s) => Some(s),
        _ => None,
    }
}

/// The spans received so far, by span id.
struct Received(HashMap<String, Span>);

impl Received {
    fn in_trace<'a>(&'a self, trace: &'a str) -> impl Iterator<Item = &'a Span> + 'a {
        self.0.values().filter(move |s| hex(&s.trace_id) == trace)
    }

    fn children<'a>(&'a self, parent: &Span) -> impl Iterator<Item = &'a Span> + 'a {
        let id = parent.span_id.clone();
        self.0.values().filter(move |s| s.parent_span_id == id)
    }

    fn child(&self, parent: &Span, name: &str) -> Option<&Span> {
        self.children(parent).find(|s| s.name == name)
    }

    /// Every span under `root`, at any depth.
    fn descendants<'a>(&'a self, root: &'a Span) -> Vec<&'a Span> {
        let mut found: Vec<&Span> = self.children(root).collect();
        let mut at = 0;
        while at < found.len() {
            found.extend(self.children(found[at]));
            at += 1;
        }
        found
    }
}

/// Waits (30 s at most) until `done` holds of the received spans.
async fn wait_for_spans(receiver: &Receiver, what: &str, done: impl Fn(&Received) -> bool) -> Received {
    let start = Instant::now();
    loop {
        let spans = receiver.0.lock().unwrap().clone();
        let received = Received(spans.into_iter().map(|s| (hex(&s.span_id), s)).collect());
        if done(&received) {
            return received;
        }
        let names: Vec<&str> = received.0.values().map(|s| s.name.as_str()).collect();
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{what}: not received after 30 s; spans so far: {names:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The server span of the request whose caller's span was `caller` (hex), and that
/// request's `infer` span, once both have arrived.
fn request_of<'a>(received: &'a Received, trace: &'a str, caller: &str) -> Option<(&'a Span, &'a Span)> {
    let server = received
        .in_trace(trace)
        .find(|s| hex(&s.parent_span_id) == caller && s.kind == SpanKind::Server as i32)?;
    let infer = received
        .descendants(server)
        .into_iter()
        .find(|s| s.name == "infer")?;
    Some((server, infer))
}

/// The batch span that `infer` links to.
fn batch_of<'a>(received: &'a Received, infer: &Span) -> Option<&'a Span> {
    infer
        .links
        .iter()
        .find_map(|l| received.0.get(&hex(&l.span_id)).filter(|s| s.name == "batch"))
}

fn traceparent(trace: &str, span: &str) -> String {
    format!("00-{trace}-{span}-01")
}

/// The trace and span ids of an echoed `traceparent`.
fn echoed(value: &str) -> (String, String) {
    let parts: Vec<&str> = value.split('-').collect();
    assert_eq!(parts.len(), 4, "a traceparent: {value}");
    assert_eq!(
        (parts[0], parts[3]),
        ("00", "01"),
        "version and sampled flag: {value}"
    );
    (parts[1].to_string(), parts[2].to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_over_http_and_grpc_are_traced_into_the_callers_traces() {
    let (receiver, endpoint) = start_receiver().await;
    // Batches of two, which wait for their second image: the two HTTP requests share one.
    let server = Server::start_with_env(
        &["--max-batch", "2", "--max-queue-delay-us", "3000000"],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_BSP_SCHEDULE_DELAY", "50"),
        ],
    );
    server.wait_ready().await;
    let client = reqwest::Client::new();
    let url = server.url("/v1/detect");
    let callers = [
        ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"),
        ("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"),
    ];
    let posts = callers.map(|(trace, span)| {
        let (client, url, header) = (client.clone(), url.clone(), traceparent(trace, span));
        tokio::spawn(async move {
            let r = post_image(&client, &url, image_bytes("bus.jpg"), &[("traceparent", &header)]).await;
            assert_eq!(r.status(), 200);
            r.headers()["traceparent"].to_str().unwrap().to_string()
        })
    });
    for ((trace, span), post) in callers.iter().zip(posts) {
        let (echoed_trace, echoed_span) = echoed(&post.await.unwrap());
        assert_eq!(&echoed_trace, trace, "the answer stays in the caller's trace");
        assert_ne!(&echoed_span, span, "and names the server's own span");
    }
    let received = wait_for_spans(&receiver, "both HTTP requests and their batch", |r| {
        callers.iter().all(|(trace, span)| {
            request_of(r, trace, span).is_some_and(|(_, infer)| {
                batch_of(r, infer).is_some_and(|b| {
                    ["preprocess", "inference", "postprocess"]
                        .iter()
                        .all(|n| r.child(b, n).is_some())
                })
            })
        })
    })
    .await;
    let mut batches = Vec::new();
    for (trace, span) in callers {
        let (request, infer) = request_of(&received, trace, span).unwrap();
        assert_eq!(request.name, "POST /v1/detect");
        assert_eq!(
            string_attribute(request, "http.route").as_deref(),
            Some("/v1/detect")
        );
        assert_eq!(
            attribute(request, "http.response.status_code"),
            Some(AnyValue::IntValue(200))
        );
        let stages: Vec<&str> = received
            .descendants(request)
            .iter()
            .map(|s| s.name.as_str())
            .collect();
        for stage in ["admission", "decode", "queue", "infer"] {
            assert!(stages.contains(&stage), "{stage} under the request: {stages:?}");
        }
        let decode = received
            .descendants(request)
            .into_iter()
            .find(|s| s.name == "decode")
            .unwrap();
        assert_eq!(string_attribute(decode, "model").as_deref(), Some("yolo11n"));
        assert!(string_attribute(decode, "version").is_some());
        assert_eq!(attribute(infer, "batch_size"), Some(AnyValue::IntValue(2)));
        let batch = batch_of(&received, infer).unwrap();
        assert_ne!(
            hex(&batch.trace_id),
            trace,
            "a batch is a trace of its own, linked"
        );
        batches.push(hex(&batch.span_id));
    }
    assert_eq!(batches[0], batches[1], "both requests ran in one batch");
    let batch = &received.0[&batches[0]];
    assert_eq!(attribute(batch, "batch_size"), Some(AnyValue::IntValue(2)));
    assert_eq!(string_attribute(batch, "model").as_deref(), Some("yolo11n"));
    let linked: Vec<String> = batch.links.iter().map(|l| hex(&l.trace_id)).collect();
    for (trace, _) in callers {
        assert!(
            linked.contains(&trace.to_string()),
            "the batch links to {trace}: {linked:?}"
        );
    }

    // gRPC: Triton's ModelInfer with the caller's traceparent in its metadata.
    let (trace, span) = ("7c1f30d1d4a04e3c9f3e6b2d8a5c4b1e", "1a2b3c4d5e6f7a8b");
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", server.grpc))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let mut request = tonic::Request::new(proto::ModelInferRequest {
        model_name: "yolo11n".into(),
        inputs: vec![proto::model_infer_request::InferInputTensor {
            name: "IMAGE".into(),
            datatype: "BYTES".into(),
            shape: vec![1, 1],
            contents: Some(proto::InferTensorContents {
                bytes_contents: vec![image_bytes("zidane.jpg")],
                ..Default::default()
            }),
            ..Default::default()
        }],
        ..Default::default()
    });
    request
        .metadata_mut()
        .insert("traceparent", traceparent(trace, span).parse().unwrap());
    let path =
        tonic::codegen::http::uri::PathAndQuery::from_static("/inference.GRPCInferenceService/ModelInfer");
    let codec = tonic_prost::ProstCodec::<proto::ModelInferRequest, proto::ModelInferResponse>::default();
    let response = grpc
        .unary(request, path, codec)
        .await
        .expect("ModelInfer answers");
    let header = response
        .metadata()
        .get("traceparent")
        .expect("traceparent echoed");
    assert_eq!(echoed(header.to_str().unwrap()).0, trace);
    let received = wait_for_spans(&receiver, "the gRPC request", |r| {
        request_of(r, trace, span).is_some_and(|(_, infer)| batch_of(r, infer).is_some())
    })
    .await;
    let (request, _) = request_of(&received, trace, span).unwrap();
    assert_eq!(request.name, "inference.GRPCInferenceService/ModelInfer");
    assert_eq!(string_attribute(request, "rpc.system").as_deref(), Some("grpc"));
    assert_eq!(
        attribute(request, "rpc.grpc.status_code"),
        Some(AnyValue::IntValue(0))
    );

    // A malformed traceparent is ignored: the request starts a trace of its own.
    let r = post_image(
        &client,
        &url,
        image_bytes("bus.jpg"),
        &[("traceparent", "00-zz-bad-01")],
    )
    .await;
    let (trace, _) = echoed(r.headers()["traceparent"].to_str().unwrap());
    assert_eq!(trace.len(), 32);
    assert!(!callers.iter().any(|(t, _)| *t == trace));
}
