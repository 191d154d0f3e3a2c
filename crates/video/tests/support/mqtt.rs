//! An MQTT subscriber for the sink tests, and what they check of what it receives.

use std::time::Duration;

use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};
use serde_json::Value;

/// What a subscriber receives: (topic, payload, retained).
pub type Received = tokio::sync::mpsc::Receiver<(String, Vec<u8>, bool)>;

/// An MQTT subscriber: every publish it receives as (topic, payload, retained).
pub async fn subscriber(port: u16, id: &str, filter: &str) -> Received {
    let mut options = MqttOptions::new(id, "127.0.0.1", port);
    options.set_keep_alive(Duration::from_secs(10));
    // Retained snapshots are far over rumqttc's default 10 KiB.
    options.set_max_packet_size(16 << 20, 10 * 1024);
    let (client, mut event_loop) = AsyncClient::new(options, 16);
    client.subscribe(filter, QoS::AtLeastOnce).await.unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(4096);
    let (subscribed_tx, subscribed) = tokio::sync::oneshot::channel();
    let mut subscribed_tx = Some(subscribed_tx);
    tokio::spawn(async move {
        let _client = client;
        while let Ok(event) = event_loop.poll().await {
            match event {
                Event::Incoming(Packet::SubAck(_)) => {
                    if let Some(s) = subscribed_tx.take() {
                        let _ = s.send(());
                    }
                }
                Event::Incoming(Packet::Publish(p)) => {
                    let message = (p.topic.clone(), p.payload.to_vec(), p.retain);
                    if tx.send(message).await.is_err() {
                        return;
                    }
                }
                _ => {}
            }
        }
    });
    tokio::time::timeout(Duration::from_secs(10), subscribed)
        .await
        .expect("SUBACK in time")
        .unwrap();
    rx
}

pub async fn mqtt_wait_for(rx: &mut Received, topic: &str, check: impl Fn(&[u8]) -> bool) {
    tokio::time::timeout(Duration::from_secs(15), async {
        loop {
            let (t, p, _) = rx.recv().await.expect("subscriber alive");
            if t == topic && check(&p) {
                return;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no matching message on {topic}"));
}

/// Reads on after cam1 was removed until its `stopped` status and its object's
/// `object.end` have both arrived (in either order), keeping cam1's object events.
pub async fn collect_until_removed(rx: &mut Received, objects: &mut Vec<Value>) {
    let mut stopped = false;
    tokio::time::timeout(Duration::from_secs(15), async {
        while !(stopped && objects.iter().any(|v| v["type"] == "object.end")) {
            let (topic, payload, _) = rx.recv().await.expect("subscriber alive");
            if topic == "pv-test/cam1/status" {
                let v: Value = serde_json::from_slice(&payload).expect("status JSON");
                stopped |= v["status"] == "stopped" && v["reason"] == "removed";
            } else if topic == "pv-test/events" {
                let v: Value = serde_json::from_slice(&payload).expect("object event JSON");
                if v["stream"] == "cam1" {
                    objects.push(v);
                }
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no stopped status and object.end for cam1: {objects:?}"));
}

/// cam1's one object as Frigate's `events` topic tells it: `object.start`, then
/// `object.update`s, then `object.end`, in that order, each `before` the previous `after`;
/// the updates tell the zone it entered and that it stopped.
pub fn check_one_object_lifecycle(objects: &[Value]) {
    let track = &objects
        .iter()
        .find(|v| v["type"] == "object.start")
        .expect("an object.start")["track_id"];
    let told: Vec<&Value> = objects
        .iter()
        .filter(|v| &v["track_id"] == track && v["type"].as_str().is_some_and(|t| t.starts_with("object.")))
        .collect();
    let types: Vec<&str> = told.iter().map(|v| v["type"].as_str().unwrap()).collect();
    assert!(types.len() >= 3, "{types:?}");
    assert_eq!(types[0], "object.start", "{types:?}");
    assert_eq!(types[types.len() - 1], "object.end", "{types:?}");
    assert!(
        types[1..types.len() - 1].iter().all(|t| *t == "object.update"),
        "{types:?}"
    );
    assert_eq!(
        told[0]["before"], told[0]["after"],
        "a start's before is its after"
    );
    for pair in told.windows(2) {
        assert_eq!(
            pair[1]["before"], pair[0]["after"],
            "{} after {}",
            pair[1], pair[0]
        );
        let (at, earlier) = (pair[1]["pts_seconds"].as_f64(), pair[0]["pts_seconds"].as_f64());
        assert!(at >= earlier, "in order: {} after {}", pair[1], pair[0]);
    }
    // Updates at most once a second of stream time (update_interval_s), each with news.
    for pair in told[..told.len() - 1].windows(2) {
        let gap = pair[1]["pts_seconds"].as_f64().unwrap() - pair[0]["pts_seconds"].as_f64().unwrap();
        assert!(gap >= 0.999, "updates {gap} s apart");
        assert_ne!(pair[1]["before"], pair[1]["after"]);
    }
    let last = &told[told.len() - 1]["before"];
    assert_eq!(last["entered_zones"], serde_json::json!(["all"]), "{last}");
    assert_eq!(last["current_zones"], serde_json::json!(["all"]), "{last}");
    assert_eq!(last["stationary"], true, "{last}");
    assert_eq!(last["label"], "frame");
    let end = told[told.len() - 1];
    assert_eq!(
        end["after"]["current_zones"],
        serde_json::json!([]),
        "left with the track: {end}"
    );
    assert!(objects
        .iter()
        .any(|v| v["type"] == "zone.enter" && v["zone"] == "all"));
}
