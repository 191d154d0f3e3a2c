//! Sinks against real peers: a mosquitto broker with an MQTT subscriber, and an HTTP
//! endpoint for webhooks that fails, hangs and recovers.

mod support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use peregrine_video::ConfiguredSinks;
use peregrine_video::{MqttConfig, MqttSink};
use peregrine_video::{StreamConfig, StreamManager, VideoConfig};
use peregrine_video::{WebhookConfig, WebhookSink};
use serde_json::Value;
use support::mqtt::{check_one_object_lifecycle, collect_until_removed, mqtt_wait_for, subscriber};
use support::tls::TestCa;
use support::{eventually, h265_clip, instant_detector, local_options, shared_clip, Mosquitto, RtspServer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detections_and_status_reach_an_mqtt_subscriber_through_mosquitto() {
    let broker = Mosquitto::start();
    let server = RtspServer::start(&[("bikes", shared_clip("bikes.mp4")), ("bikes265", h265_clip())]);
    let mut live = subscriber(broker.port, "live", "pv-test/#").await;
    // Everything defined up front, as the server's configuration file would.
    let text = format!(
        r#"
        [[streams]]
        name = "cam1"
        url = "{}"
        fps = 5

        # The instant detector's one box covers the frame and never moves: one object,
        # inside the zone and soon stationary, so updates follow its start quickly.
        [streams.analytics]
        anchor = "center"
        update_interval_s = 1.0
        stationary_s = 1.0

        [[streams.analytics.zones]]
        name = "all"
        units = "normalized"
        points = [[0.0, 0.0], [1.0, 0.0], [1.0, 1.0], [0.0, 1.0]]

        [[streams]]
        name = "cam2"
        url = "{}"
        transport = "udp"
        fps = 5

        [mqtt]
        host = "127.0.0.1"
        port = {}
        topic_prefix = "pv-test"
        "#,
        server.url("bikes"),
        server.url("bikes265"),
        broker.port
    );
    let config: VideoConfig = toml::from_str(&text).expect("config parses");
    let sinks = ConfiguredSinks::start(&config, true).unwrap();
    let mut options = local_options(instant_detector());
    options.sinks = sinks.queues();
    let manager = StreamManager::start(options, config.streams.clone())
        .await
        .unwrap();

    let mut detections: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    let mut statuses: BTreeMap<String, Vec<String>> = BTreeMap::new();
    // cam1's object events, in the order received.
    let mut objects: Vec<Value> = Vec::new();
    let mut online = false;
    tokio::time::timeout(Duration::from_secs(60), async {
        while !(online
            && ["cam1", "cam2"]
                .iter()
                .all(|s| detections.get(*s).is_some_and(|v| v.len() >= 5))
            && objects.iter().any(|v| v["type"] == "object.update"))
        {
            let (topic, payload, _) = live.recv().await.expect("subscriber alive");
            let parts: Vec<&str> = topic.split('/').collect();
            match parts.as_slice() {
                ["pv-test", "available"] => online |= payload == b"online",
                ["pv-test", stream, "detections"] => {
                    let v: Value = serde_json::from_slice(&payload).expect("detection JSON");
                    detections.entry(stream.to_string()).or_default().push(v);
                }
                ["pv-test", stream, "status"] => {
                    let v: Value = serde_json::from_slice(&payload).expect("status JSON");
                    statuses
                        .entry(stream.to_string())
                        .or_default()
                        .push(v["status"].as_str().unwrap_or("").to_string());
                }
                // Tracked objects' events and their snapshots.
                ["pv-test", "events"] => {
                    let v: Value = serde_json::from_slice(&payload).expect("object event JSON");
                    assert!(v["type"].as_str().is_some_and(|t| t.contains('.')), "{v}");
                    if v["stream"] == "cam1" {
                        objects.push(v);
                    }
                }
                ["pv-test", _, _, "snapshot"] => assert!(payload.starts_with(&[0xFF, 0xD8]), "a JPEG"),
                other => panic!("unexpected topic {other:?}"),
            }
        }
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "MQTT traffic incomplete: {:?} {:?} {} cam1 object events",
            detections.keys(),
            statuses,
            objects.len()
        )
    });

    for (stream, events) in &detections {
        let e = &events[0];
        assert_eq!(e["schema_version"], 3);
        assert_eq!(e["stream"], stream.as_str());
        assert_eq!(
            (e["width"].as_u64(), e["height"].as_u64()),
            (Some(640), Some(272))
        );
        assert!(e["capture_time"].as_str().unwrap().ends_with('Z'));
        assert!(e["capture_unix_ms"].as_i64().unwrap() > 1_600_000_000_000);
        assert!(["rtcp", "local"].contains(&e["clock_source"].as_str().unwrap()));
        assert!(e["latency_ms"].as_f64().unwrap() >= 0.0);
        assert_eq!(e["detections"][0]["class_name"], "frame");
        assert_eq!(e["detections"][0]["box"].as_array().unwrap().len(), 4);
        assert!(
            statuses[stream].contains(&"streaming".to_string()),
            "{stream}: {statuses:?}"
        );
        let seqs: Vec<u64> = events.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
        assert!(seqs.windows(2).all(|w| w[1] > w[0]), "{stream}: {seqs:?}");
    }

    // A subscriber arriving now gets the retained availability and statuses.
    let mut late = subscriber(broker.port, "late", "pv-test/+/status").await;
    let mut retained = BTreeMap::new();
    while retained.len() < 2 {
        let (topic, payload, retain) = tokio::time::timeout(Duration::from_secs(10), late.recv())
            .await
            .expect("retained status in time")
            .unwrap();
        assert!(retain, "{topic} should be retained");
        let v: Value = serde_json::from_slice(&payload).unwrap();
        retained.insert(topic, v["status"].as_str().unwrap().to_string());
    }
    assert_eq!(retained["pv-test/cam1/status"], "streaming");

    manager.remove("cam1").await.unwrap();
    collect_until_removed(&mut live, &mut objects).await;
    check_one_object_lifecycle(&objects);
    manager.shutdown().await.unwrap();
    sinks.shut_down().await;
    mqtt_wait_for(&mut live, "pv-test/available", |p| p == b"offline").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mqtt_sink_reconnects_after_the_broker_restarts_and_republishes_status() {
    let mut broker = Mosquitto::start();
    let mut before = subscriber(broker.port, "before", "pv-restart/#").await;
    let mut config = MqttConfig::new("127.0.0.1", broker.port);
    config.topic_prefix = "pv-restart".into();
    config.client_id = "peregrine-restart".into();
    let sink = MqttSink::start(&config, true).unwrap();
    let mut options = local_options(instant_detector());
    options.sinks.push(sink.queue());
    let manager = StreamManager::start(options, vec![file_stream("file1")])
        .await
        .unwrap();
    let is_detection = |p: &[u8]| serde_json::from_slice::<Value>(p).is_ok_and(|v| v["stream"] == "file1");
    mqtt_wait_for(&mut before, "pv-restart/file1/detections", is_detection).await;

    // The broker dies with everything it retained and comes back empty.
    broker.restart();
    let mut after = subscriber(broker.port, "after", "pv-restart/#").await;
    let mut seen = BTreeMap::new();
    tokio::time::timeout(Duration::from_secs(30), async {
        while seen.len() < 3 {
            let (topic, payload, retain) = after.recv().await.expect("subscriber alive");
            let v: Value = serde_json::from_slice(&payload).unwrap_or(Value::Null);
            let wanted = match topic.as_str() {
                "pv-restart/available" => payload == b"online",
                "pv-restart/file1/status" => v["status"] == "streaming",
                "pv-restart/file1/detections" => v["stream"] == "file1",
                _ => false,
            };
            if wanted {
                seen.entry(topic).or_insert(retain);
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("after the restart only {seen:?}"));
    // The stream kept streaming, so no status change happened: what the new broker has is
    // the sink's republished status.
    assert_eq!(manager.status("file1").await.unwrap().status.name(), "streaming");
    assert!(
        sink.stats().connections.load(Ordering::Relaxed) >= 2,
        "{:?}",
        sink.stats()
    );
    assert!(sink.stats().connection_errors.load(Ordering::Relaxed) >= 1);
    manager.shutdown().await.unwrap();
    sink.shut_down().await;
}

/// What the fake webhook endpoint does with each request.
#[derive(Clone, Copy)]
enum Behaviour {
    /// Answers 500 to the first `n` requests, then 200.
    FailFirst(usize),
    /// Reads the request and never answers.
    Hang,
}

/// A minimal HTTP/1.1 endpoint; returns its port and the bodies it accepted (200).
async fn endpoint(behaviour: Behaviour) -> (u16, Arc<std::sync::Mutex<Vec<Value>>>, Arc<AtomicUsize>) {
    endpoint_on(behaviour, None).await
}

/// The same, over TLS when `tls` is given (connections failing the handshake are counted
/// as nothing).
async fn endpoint_on(
    behaviour: Behaviour,
    tls: Option<tokio_rustls::TlsAcceptor>,
) -> (u16, Arc<std::sync::Mutex<Vec<Value>>>, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepted = Arc::new(std::sync::Mutex::new(Vec::new()));
    let requests = Arc::new(AtomicUsize::new(0));
    let (acc, reqs) = (accepted.clone(), requests.clone());
    tokio::spawn(async move {
        loop {
            let Ok((sock, _)) = listener.accept().await else {
                return;
            };
            let (acc, reqs, tls) = (acc.clone(), reqs.clone(), tls.clone());
            tokio::spawn(async move {
                match tls {
                    None => serve_requests(sock, behaviour, acc, reqs).await,
                    Some(tls) => {
                        if let Ok(sock) = tls.accept(sock).await {
                            serve_requests(sock, behaviour, acc, reqs).await
                        }
                    }
                }
            });
        }
    });
    (port, accepted, requests)
}

async fn serve_requests<S: AsyncRead + AsyncWrite + Unpin>(
    mut sock: S,
    behaviour: Behaviour,
    acc: Arc<std::sync::Mutex<Vec<Value>>>,
    reqs: Arc<AtomicUsize>,
) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        // One request per read cycle: headers, then content-length bytes.
        let (head_end, length) = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buf[..i]).to_lowercase();
                let length = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse::<usize>().ok())
                    .unwrap_or(0);
                break (i + 4, length);
            }
            match sock.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        while buf.len() < head_end + length {
            match sock.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        let body: Vec<u8> = buf[head_end..head_end + length].to_vec();
        buf.drain(..head_end + length);
        let n = reqs.fetch_add(1, Ordering::SeqCst);
        let status = match behaviour {
            Behaviour::Hang => {
                std::future::pending::<()>().await;
                unreachable!()
            }
            Behaviour::FailFirst(k) if n < k => "500 Internal Server Error",
            Behaviour::FailFirst(_) => {
                acc.lock()
                    .unwrap()
                    .push(serde_json::from_slice(&body).unwrap_or(Value::Null));
                "200 OK"
            }
        };
        let reply = format!("HTTP/1.1 {status}\r\ncontent-length: 0\r\n\r\n");
        if sock.write_all(reply.as_bytes()).await.is_err() {
            return;
        }
    }
}

fn file_stream(name: &str) -> StreamConfig {
    let mut c = StreamConfig::new(name, shared_clip("bikes.mp4").display().to_string());
    c.looped = true;
    c.fps = Some(5.0);
    c.decode_threads = 1;
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhooks_retry_failures_and_deliver_json() {
    let (port, accepted, requests) = endpoint(Behaviour::FailFirst(3)).await;
    let mut config = WebhookConfig::new(format!("http://127.0.0.1:{port}/hook"));
    config.retry_initial_ms = 20;
    config.max_attempts = 5;
    let hook = WebhookSink::start(&config, true).unwrap();
    let mut options = local_options(instant_detector());
    options.sinks.push(hook.queue());
    let manager = StreamManager::start(options, vec![file_stream("file1")])
        .await
        .unwrap();
    eventually(Duration::from_secs(30), "five deliveries", || {
        accepted.lock().unwrap().len() >= 5
    })
    .await;
    let first = accepted.lock().unwrap()[0].clone();
    assert_eq!(first["stream"], "file1");
    assert_eq!(first["clock_source"], "local");
    assert!(hook.stats().retried.load(Ordering::Relaxed) >= 3);
    assert_eq!(hook.stats().gave_up.load(Ordering::Relaxed), 0);
    assert!(requests.load(Ordering::SeqCst) >= 8);
    manager.shutdown().await.unwrap();
    hook.shut_down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_webhook_drops_its_oldest_events_and_never_slows_detection() {
    let (port, _, _) = endpoint(Behaviour::Hang).await;
    let mut config = WebhookConfig::new(format!("http://127.0.0.1:{port}/hook"));
    config.timeout_ms = 60_000;
    config.queue = 4;
    let hook = WebhookSink::start(&config, true).unwrap();
    let queue = hook.queue();
    let mut options = local_options(instant_detector());
    options.sinks.push(queue.clone());
    let mut stream = file_stream("fast");
    stream.realtime = false;
    stream.fps = None;
    let manager = StreamManager::start(options, vec![stream]).await.unwrap();
    let mut events = manager.subscribe("fast").await.unwrap();
    // Detection keeps going at full speed while the sink is stuck on its first request.
    for _ in 0..100 {
        tokio::time::timeout(Duration::from_secs(20), events.recv())
            .await
            .expect("detection is not stalled")
            .expect("event");
    }
    assert!(queue.len() <= 4);
    assert!(queue.dropped() > 50, "dropped {}", queue.dropped());
    let report = manager.status("fast").await.unwrap();
    assert!(report.counters.frames_detected >= 100);
    manager.shutdown().await.unwrap();
    hook.shut_down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqtt_over_tls_reaches_a_broker_the_configured_ca_vouches_for_and_no_other() {
    let ca = TestCa::new();
    let broker = Mosquitto::start_tls(&ca);
    let tls_port = broker.tls_port.unwrap();
    let mut trusted_rx = subscriber(broker.port, "trusted", "pv-tls/#").await;
    let mut untrusted_rx = subscriber(broker.port, "untrusted", "pv-untrusted/#").await;
    let mut trusted = MqttConfig::new("127.0.0.1", tls_port);
    trusted.tls = true;
    trusted.ca_file = Some(ca.ca_file());
    trusted.topic_prefix = "pv-tls".into();
    trusted.client_id = "peregrine-trusted".into();
    // The same broker without its CA: the public roots do not vouch for it.
    let mut untrusted = trusted.clone();
    untrusted.ca_file = None;
    untrusted.topic_prefix = "pv-untrusted".into();
    untrusted.client_id = "peregrine-untrusted".into();
    let sinks = [
        MqttSink::start(&trusted, true).unwrap(),
        MqttSink::start(&untrusted, true).unwrap(),
    ];
    let mut options = local_options(instant_detector());
    options.sinks = sinks.iter().map(MqttSink::queue).collect();
    let manager = StreamManager::start(options, vec![file_stream("tls1")])
        .await
        .unwrap();
    mqtt_wait_for(&mut trusted_rx, "pv-tls/tls1/detections", |p| {
        serde_json::from_slice::<Value>(p).is_ok_and(|v| v["stream"] == "tls1")
    })
    .await;
    // Positive evidence that the untrusted sink tried and was refused for the certificate,
    // twice (so it also retried while detections were flowing).
    let refused = &sinks[1].stats();
    eventually(
        Duration::from_secs(15),
        "the untrusted sink's TLS refusals",
        || refused.connection_errors.load(Ordering::Relaxed) >= 2,
    )
    .await;
    let error = refused.last_error().unwrap_or_default();
    assert!(error.to_lowercase().contains("certificate"), "{error}");
    assert_eq!(refused.connections.load(Ordering::Relaxed), 0);
    assert!(sinks[0].stats().connections.load(Ordering::Relaxed) >= 1);
    assert!(
        untrusted_rx.try_recv().is_err(),
        "a sink published through a broker it could not verify"
    );
    manager.shutdown().await.unwrap();
    for sink in sinks {
        sink.shut_down().await;
    }
}

#[test]
fn tls_settings_are_checked_when_a_sink_starts() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _guard = rt.enter();
    let mut mqtt = MqttConfig::new("127.0.0.1", 8883);
    mqtt.ca_file = Some("/nonexistent/ca.pem".into());
    let err = MqttSink::start(&mqtt, true).unwrap_err().to_string();
    assert!(err.contains("need tls = true"), "{err}");
    mqtt.tls = true;
    let err = MqttSink::start(&mqtt, true).unwrap_err().to_string();
    assert!(err.contains("ca_file /nonexistent/ca.pem"), "{err}");
    let mut hook = WebhookConfig::new("http://127.0.0.1:1/hook");
    hook.ca_file = Some("/nonexistent/ca.pem".into());
    let err = WebhookSink::start(&hook, true).unwrap_err().to_string();
    assert!(err.contains("need an https:// url"), "{err}");
    let err = WebhookSink::start(&WebhookConfig::new("ftp://127.0.0.1/x"), true)
        .unwrap_err()
        .to_string();
    assert!(err.contains("http:// or https://, not ftp://"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_webhooks_deliver_to_an_endpoint_the_configured_ca_vouches_for_and_no_other() {
    let ca = TestCa::new();
    let (port, accepted, _) = endpoint_on(Behaviour::FailFirst(0), Some(ca.acceptor())).await;
    let mut trusted = WebhookConfig::new(format!("https://127.0.0.1:{port}/hook"));
    trusted.ca_file = Some(ca.ca_file());
    let (other_port, other_accepted, _) = endpoint_on(Behaviour::FailFirst(0), Some(ca.acceptor())).await;
    let mut untrusted = WebhookConfig::new(format!("https://127.0.0.1:{other_port}/hook"));
    untrusted.max_attempts = 2;
    untrusted.retry_initial_ms = 20;
    let hooks = [
        WebhookSink::start(&trusted, true).unwrap(),
        WebhookSink::start(&untrusted, true).unwrap(),
    ];
    let mut options = local_options(instant_detector());
    options.sinks = hooks.iter().map(WebhookSink::queue).collect();
    let manager = StreamManager::start(options, vec![file_stream("https1")])
        .await
        .unwrap();
    eventually(Duration::from_secs(30), "deliveries over https", || {
        accepted.lock().unwrap().len() >= 3
    })
    .await;
    assert_eq!(accepted.lock().unwrap()[0]["stream"], "https1");
    eventually(
        Duration::from_secs(30),
        "the untrusted endpoint given up on",
        || hooks[1].stats().gave_up.load(Ordering::Relaxed) >= 1,
    )
    .await;
    assert!(other_accepted.lock().unwrap().is_empty());
    assert_eq!(hooks[1].stats().delivered.load(Ordering::Relaxed), 0);
    manager.shutdown().await.unwrap();
    for hook in hooks {
        hook.shut_down().await;
    }
}
