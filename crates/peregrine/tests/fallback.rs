//! A model's fallback under overload against the real server.

mod common;

use common::image_bytes;
use common::repo::Repo;
use common::server::{post_image, Server};
use serde_json::Value;

fn bus() -> Vec<u8> {
    image_bytes("bus.jpg")
}

/// Sends `n` requests for `det` at once (`query` added) with a 2 s deadline; returns each
/// one's status and the model that answered it.
async fn burst(client: &reqwest::Client, server: &Server, n: usize, query: &str) -> Vec<(u16, String)> {
    let url = server.url(&format!("/v1/detect?model=det{query}"));
    let sends = (0..n).map(|_| {
        let (client, url) = (client.clone(), url.clone());
        async move {
            let r = post_image(&client, &url, bus(), &[("x-request-timeout-ms", "2000")]).await;
            let status = r.status().as_u16();
            let body: Value = r.json().await.unwrap_or(Value::Null);
            (status, body["model"].as_str().unwrap_or_default().to_string())
        }
    });
    futures_util::future::join_all(sends).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overloaded_model_hands_requests_to_its_fallback_unless_they_refuse_it() {
    let repo = Repo::new("fallback");
    // A slow model (1280x1280, one instance, one image a run) with a 1.5 s objective (one run fits, four do not) and
    // a fast fallback (320x320) beside it.
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
    let client = reqwest::Client::new();

    // Twelve slow runs cannot all finish within 2 s: the ones the model cannot serve in
    // time go to the fallback instead of being refused. (One the model admitted may still
    // miss its deadline on a machine slower than its warm-up measured: a 504, not a 429.)
    let answers = burst(&client, &server, 12, "").await;
    assert!(answers.iter().all(|(s, _)| *s == 200 || *s == 504), "{answers:?}");
    // (How many `det` answers itself depends on the machine: where one 1280 run takes
    // longer than the objective, every request goes to the fallback.)
    let by_small = answers.iter().filter(|(_, m)| m == "small").count();
    assert!(by_small >= 1, "{answers:?}");
    let counted = server
        .metric("peregrine_fallbacks_total", "model=\"det\",fallback=\"small\"")
        .await;
    assert!(
        counted >= by_small as f64,
        "{counted} counted, {by_small} answered by the fallback"
    );

    // Refusing the fallback: the model answers what it can in time and refuses the rest.
    let refused = burst(&client, &server, 12, "&fallback=false").await;
    assert!(refused.iter().all(|(_, m)| m != "small"), "{refused:?}");
    assert!(refused.iter().any(|(s, _)| *s != 200), "{refused:?}");
    assert!(
        refused.iter().all(|(s, _)| [200, 429, 504].contains(s)),
        "{refused:?}"
    );
    // A request that names a version is never moved either.
    let named = burst(&client, &server, 12, "&version=1").await;
    assert!(named.iter().all(|(_, m)| m != "small"), "{named:?}");
}
