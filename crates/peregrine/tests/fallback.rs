//! A model's fallback under overload against the real server, by every protocol that
//! infers: `/v1/detect`, KServe REST and gRPC's `ModelInfer`.

mod common;

use std::time::Duration;

use base64::Engine as _;
use common::image_bytes;
use common::repo::Repo;
use common::server::{post_image, Server};
use peregrine_api::grpc::proto;
use proto::infer_parameter::ParameterChoice;
use serde_json::{json, Value};
use tonic::transport::Channel;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Protocol {
    Detect,
    Rest,
    Grpc,
}

/// What one request got: its status (a gRPC code as its HTTP equivalent) and the model
/// that answered it, or the error's message.
#[derive(Debug, Clone)]
struct Outcome {
    protocol: Protocol,
    status: u16,
    model: String,
}

struct Clients {
    http: reqwest::Client,
    grpc: tonic::client::Grpc<Channel>,
}

impl Clients {
    async fn new(server: &Server) -> Self {
        let channel = Channel::from_shared(format!("http://{}", server.grpc))
            .unwrap()
            .connect()
            .await
            .unwrap();
        Self {
            http: reqwest::Client::new(),
            grpc: tonic::client::Grpc::new(channel),
        }
    }
}

const DEADLINE_MS: u64 = 2000;

/// One request for `det` with a 2 s deadline; `fallback` is its `fallback` parameter
/// (query, KServe parameter or gRPC parameter) when given.
async fn send(clients: &Clients, server: &Server, protocol: Protocol, fallback: Option<Value>) -> Outcome {
    let (status, model) = match protocol {
        Protocol::Detect => {
            let query = fallback.map(|f| format!("&fallback={f}")).unwrap_or_default();
            let url = server.url(&format!("/v1/detect?model=det{query}"));
            let timeout = DEADLINE_MS.to_string();
            let r = post_image(
                &clients.http,
                &url,
                image_bytes("bus.jpg"),
                &[("x-request-timeout-ms", &timeout)],
            )
            .await;
            let status = r.status().as_u16();
            let body: Value = r.json().await.unwrap_or(Value::Null);
            (status, text(&body["model"]).or_else(|| text(&body["error"])))
        }
        Protocol::Rest => {
            let (status, body) = rest(clients, server, fallback).await;
            (status, text(&body["model_name"]).or_else(|| text(&body["error"])))
        }
        Protocol::Grpc => {
            let parameter = fallback.map(|f| match f {
                Value::Bool(b) => ParameterChoice::BoolParam(b),
                other => ParameterChoice::StringParam(other.to_string()),
            });
            match grpc(clients, parameter).await {
                Ok(r) => (200, Some(r.model_name)),
                Err(s) => (http_status(s.code()), Some(s.message().to_string())),
            }
        }
    };
    Outcome {
        protocol,
        status,
        model: model.unwrap_or_default(),
    }
}

fn text(v: &Value) -> Option<String> {
    v.as_str().map(str::to_string)
}

async fn rest(clients: &Clients, server: &Server, fallback: Option<Value>) -> (u16, Value) {
    let image = base64::engine::general_purpose::STANDARD.encode(image_bytes("bus.jpg"));
    let mut body =
        json!({"inputs": [{"name": "IMAGE", "datatype": "BYTES", "shape": [1, 1], "data": [image]}]});
    if let Some(f) = fallback {
        body["parameters"] = json!({ "fallback": f });
    }
    let r = clients
        .http
        .post(server.url("/v2/models/det/infer"))
        .header("x-request-timeout-ms", DEADLINE_MS.to_string())
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

async fn grpc(
    clients: &Clients,
    fallback: Option<ParameterChoice>,
) -> Result<proto::ModelInferResponse, tonic::Status> {
    let mut request = tonic::Request::new(proto::ModelInferRequest {
        model_name: "det".into(),
        inputs: vec![proto::model_infer_request::InferInputTensor {
            name: "IMAGE".into(),
            datatype: "BYTES".into(),
            shape: vec![1, 1],
            contents: Some(proto::InferTensorContents {
                bytes_contents: vec![image_bytes("bus.jpg")],
                ..Default::default()
            }),
            ..Default::default()
        }],
        parameters: fallback
            .map(|p| {
                let p = proto::InferParameter {
                    parameter_choice: Some(p),
                };
                [("fallback".to_string(), p)].into()
            })
            .unwrap_or_default(),
        ..Default::default()
    });
    request.set_timeout(Duration::from_millis(DEADLINE_MS));
    let mut grpc = clients.grpc.clone();
    grpc.ready().await.unwrap();
    let path =
        tonic::codegen::http::uri::PathAndQuery::from_static("/inference.GRPCInferenceService/ModelInfer");
    let codec = tonic_prost::ProstCodec::<proto::ModelInferRequest, proto::ModelInferResponse>::default();
    grpc.unary(request, path, codec)
        .await
        .map(tonic::Response::into_inner)
}

fn http_status(code: tonic::Code) -> u16 {
    match code {
        tonic::Code::Ok => 200,
        tonic::Code::InvalidArgument => 400,
        tonic::Code::ResourceExhausted => 429,
        tonic::Code::DeadlineExceeded | tonic::Code::Cancelled => 504,
        other => 500 + other as u16,
    }
}

/// `n` requests by each of `protocols` at once, interleaved.
async fn burst(
    clients: &Clients,
    server: &Server,
    protocols: &[Protocol],
    n: usize,
    fallback: Option<Value>,
) -> Vec<Outcome> {
    let sends = (0..n).flat_map(|_| {
        protocols
            .iter()
            .map(|&p| send(clients, server, p, fallback.clone()))
    });
    futures_util::future::join_all(sends).await
}

fn by(outcomes: &[Outcome], protocol: Protocol) -> impl Iterator<Item = &Outcome> {
    outcomes.iter().filter(move |o| o.protocol == protocol)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overloaded_model_hands_requests_to_its_fallback_unless_they_refuse_it() {
    let repo = Repo::new("fallback");
    // A slow model (1280x1280, one instance, one image a run) with a 1.5 s objective (one
    // run fits, four do not) and a fast fallback (320x320) beside it.
    std::fs::write(
        repo.0.join("det/config.toml"),
        "imgsz = [1280, 1280]\nmax_batch = 1\ninstances = 1\nthreads = 1\nfallback = \"small\"\n\
         [slo]\np99_ms = 1500\nadaptive_batching = false\n",
    )
    .unwrap();
    repo.add_version(1);
    let small = repo.0.join("small/1");
    std::fs::create_dir_all(&small).unwrap();
    std::fs::hard_link(Repo::model(), small.join("model.onnx")).unwrap();
    std::fs::write(
        repo.0.join("small/config.toml"),
        "imgsz = [320, 320]\nmax_batch = 4\nthreads = 1\n",
    )
    .unwrap();
    let server = Server::start(&["--model-repository", &repo.arg(), "--max-in-flight", "64"]);
    server.wait_ready().await;
    let clients = Clients::new(&server).await;

    // Twelve slow runs cannot all finish within 2 s: the ones the model cannot serve in
    // time go to the fallback instead of being refused. KServe and gRPC requests arrive
    // while it is so loaded (once one request has moved). (One the model admitted may
    // still miss its deadline on a machine slower than its warm-up measured: a 504. On a
    // busy machine the fallback, too, may refuse some of the twenty for its backlog: a
    // 429, as when both are saturated.)
    let detects = burst(&clients, &server, &[Protocol::Detect], 12, None);
    let others = async {
        let moved = [("peregrine_fallbacks_total", "model=\"det\"")];
        server
            .wait_for_metrics("a request moved", &moved, |v| v[0] >= 1.0)
            .await;
        burst(&clients, &server, &[Protocol::Rest, Protocol::Grpc], 4, None).await
    };
    let (mut answers, others) = tokio::join!(detects, others);
    answers.extend(others);
    assert!(
        answers.iter().all(|o| [200, 429, 504].contains(&o.status)),
        "{answers:?}"
    );
    // (How many `det` answers itself depends on the machine: where one 1280 run takes
    // longer than the objective, every request goes to the fallback.)
    for protocol in [Protocol::Detect, Protocol::Rest, Protocol::Grpc] {
        assert!(
            by(&answers, protocol).any(|o| o.model == "small"),
            "{protocol:?}: {answers:?}"
        );
    }
    let by_small = answers.iter().filter(|o| o.model == "small").count();
    let counted = server
        .metric("peregrine_fallbacks_total", "model=\"det\",fallback=\"small\"")
        .await;
    assert!(
        counted >= by_small as f64,
        "{counted} counted, {by_small} answered by the fallback"
    );

    // Refusing the fallback: the model answers what it can in time and refuses the rest.
    let refused = burst(
        &clients,
        &server,
        &[Protocol::Detect, Protocol::Rest, Protocol::Grpc],
        8,
        Some(json!(false)),
    )
    .await;
    assert!(refused.iter().all(|o| o.model != "small"), "{refused:?}");
    assert!(
        refused.iter().all(|o| [200, 429, 504].contains(&o.status)),
        "{refused:?}"
    );
    for protocol in [Protocol::Detect, Protocol::Rest, Protocol::Grpc] {
        assert!(
            by(&refused, protocol).any(|o| o.status != 200),
            "{protocol:?}: {refused:?}"
        );
    }
    // A request that names a version is never moved either.
    let url = server.url("/v1/detect?model=det&version=1");
    let named = (0..12).map(|_| {
        post_image(
            &clients.http,
            &url,
            image_bytes("bus.jpg"),
            &[("x-request-timeout-ms", "2000")],
        )
    });
    for r in futures_util::future::join_all(named).await {
        let body: Value = r.json().await.unwrap_or(Value::Null);
        assert_ne!(body["model"], "small", "{body}");
    }

    // A `fallback` parameter that is not a bool is the client's error, by either protocol.
    let (status, body) = rest(&clients, &server, Some(json!("no"))).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"], "parameter \"fallback\" must be true or false");
    let bad = send(&clients, &server, Protocol::Grpc, Some(json!("false"))).await;
    assert_eq!(bad.status, 400, "{bad:?}");
    assert!(bad.model.contains("\"fallback\" must be a bool_param"), "{bad:?}");
}
