//! Stream sharding across real servers: three `peregrine serve` over one list of 30 file
//! streams, each with its own `--shard-index`. Every stream runs on exactly one of them, a
//! restarted server takes its own share back, a stream sent to the wrong shard is refused
//! with 421 naming the right one, and going to four shards moves only about a quarter of
//! the streams, all to the new one.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use common::server::Server;
use common::{shared_dir, TempDir};
use serde_json::Value;

const STREAMS: usize = 30;
/// Long enough for a loaded 2-core machine to open 30 files.
const POLL_LIMIT: Duration = Duration::from_secs(90);

fn stream_names() -> BTreeSet<String> {
    (0..STREAMS).map(|i| format!("cam-{i:02}")).collect()
}

/// One stream list for every server. The streams are as cheap as streams get: the small
/// bikes clip (640x272), one decode thread, looped so that it keeps streaming, and one
/// frame a second handed to a 320x320 model.
fn stream_list(shard_section: &str) -> String {
    let clip = shared_dir().join("videos/bikes.mp4");
    let mut toml = format!("imgsz = [320, 320]\n{shard_section}\n");
    for name in stream_names() {
        toml += &format!(
            "[[streams]]\nname = \"{name}\"\nurl = \"{}\"\nfps = 1\nloop = true\ndecode_threads = 1\n\n",
            clip.display()
        );
    }
    toml
}

/// The one place a shard's command line is built (more flags, such as the stream URL
/// policy's file roots, go here).
fn shard_args(config: &Path, index: Option<u32>, count: Option<u32>) -> Vec<String> {
    let mut args = vec!["--config".to_string(), config.display().to_string()];
    if let Some(i) = index {
        args.extend(["--shard-index".into(), i.to_string()]);
    }
    if let Some(c) = count {
        args.extend(["--shard-count".into(), c.to_string()]);
    }
    args
}

fn start(args: &[String]) -> Server {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Server::start(&args)
}

/// What one server says it runs and skips.
#[derive(Debug)]
struct Placement {
    index: u64,
    count: u64,
    /// Running here, with their state.
    running: BTreeMap<String, String>,
    /// Left to other shards, with the owner's index.
    skipped: BTreeMap<String, u64>,
}

impl Placement {
    /// Stream name to owner index, as this server sees the whole list.
    fn owners(&self) -> BTreeMap<String, u64> {
        let mine = self.running.keys().map(|n| (n.clone(), self.index));
        mine.chain(self.skipped.clone()).collect()
    }
}

async fn placement(server: &Server) -> Placement {
    let body: Value = reqwest::get(server.url("/v1/streams"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let text = |v: &Value| v.as_str().unwrap().to_string();
    Placement {
        index: body["shard"]["index"].as_u64().unwrap(),
        count: body["shard"]["count"].as_u64().unwrap(),
        running: body["streams"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| (text(&s["name"]), text(&s["status"]["state"])))
            .collect(),
        skipped: body["skipped"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| (text(&s["name"]), s["owner"].as_u64().unwrap()))
            .collect(),
    }
}

/// Polls until every stream the server runs is streaming; returns what it runs.
async fn wait_streaming(server: &Server) -> Placement {
    let start = Instant::now();
    loop {
        let p = placement(server).await;
        if !p.running.is_empty() && p.running.values().all(|state| state == "streaming") {
            return p;
        }
        assert!(
            start.elapsed() < POLL_LIMIT,
            "shard {}: not every stream streaming after {POLL_LIMIT:?}: {:?}",
            p.index,
            p.running
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Polls the server's log (read by another thread, so it may lag the response) for a
/// line containing `text`.
async fn wait_for_log(server: &Server, text: &str) {
    let start = Instant::now();
    while !server.logs.lock().unwrap().iter().any(|l| l.contains(text)) {
        assert!(start.elapsed() < POLL_LIMIT, "no log line with {text:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Three servers start at once; the test waits for all of them together.
fn start_shards(args: &[Vec<String>]) -> Vec<Server> {
    std::thread::scope(|scope| {
        let starting: Vec<_> = args.iter().map(|a| scope.spawn(|| start(a))).collect();
        starting.into_iter().map(|s| s.join().unwrap()).collect()
    })
}

fn assert_partition(placements: &[&Placement]) -> BTreeMap<String, u64> {
    let all = stream_names();
    let mut runs_on: BTreeMap<String, u64> = BTreeMap::new();
    for p in placements {
        let mine: BTreeSet<String> = p.running.keys().cloned().collect();
        let skipped: BTreeSet<String> = p.skipped.keys().cloned().collect();
        assert!(
            mine.is_disjoint(&skipped),
            "shard {}: {mine:?} / {skipped:?}",
            p.index
        );
        assert_eq!(
            &(&mine | &skipped),
            &all,
            "shard {} accounts for every stream",
            p.index
        );
        for name in mine {
            let before = runs_on.insert(name.clone(), p.index);
            assert_eq!(before, None, "{name} runs on shards {before:?} and {}", p.index);
        }
    }
    assert_eq!(
        runs_on.keys().cloned().collect::<BTreeSet<_>>(),
        all,
        "every stream runs somewhere"
    );
    for p in placements {
        assert_eq!(
            p.owners(),
            runs_on,
            "shard {} names the owners that run them",
            p.index
        );
    }
    runs_on
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_shards_run_every_stream_once_and_a_fourth_takes_only_its_share() {
    let dir = TempDir::new("sharding");
    let shared = dir.path().join("streams.toml");
    std::fs::write(&shared, stream_list("")).unwrap();
    let args: Vec<Vec<String>> = (0..3).map(|i| shard_args(&shared, Some(i), Some(3))).collect();
    let mut servers = start_shards(&args);

    let mut placements = Vec::new();
    for s in &servers {
        placements.push(wait_streaming(s).await);
    }
    assert!(placements
        .iter()
        .enumerate()
        .all(|(i, p)| p.index == i as u64 && p.count == 3));
    let owners = assert_partition(&placements.iter().collect::<Vec<_>>());
    for p in &placements {
        // 10 expected of 30 each; rendezvous hashing of these names gives 8 to 12.
        assert!(
            (5..=15).contains(&p.running.len()),
            "shard {}: {:?}",
            p.index,
            p.running
        );
    }

    // Added at run time to the wrong shard: refused, naming the owner.
    let (name, owner) = placements[0].skipped.iter().next().unwrap();
    let refused = reqwest::Client::new()
        .post(servers[0].url("/v1/streams"))
        .json(&serde_json::json!({ "name": name, "url": "rtsp://127.0.0.1:9/x" }))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 421);
    let body: Value = refused.json().await.unwrap();
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains(&format!("shard {owner} of 3")), "{message}");
    wait_for_log(&servers[0], "stream refused").await;

    // A restarted server takes its own share back, and only that.
    drop(servers.remove(1));
    let restarted = start(&args[1]);
    let again = wait_streaming(&restarted).await;
    assert_eq!(
        again.running.keys().collect::<Vec<_>>(),
        placements[1].running.keys().collect::<Vec<_>>()
    );
    for (s, before) in [(&servers[0], &placements[0]), (&servers[1], &placements[2])] {
        let now = placement(s).await;
        assert_eq!(
            now.running.keys().collect::<Vec<_>>(),
            before.running.keys().collect::<Vec<_>>()
        );
    }
    drop((servers, restarted));

    // Four shards (the count from the file, the index from the flag): the new shard 3
    // takes about a quarter, from every old shard, and nothing else moves. Modulo hashing
    // would move about three quarters.
    let four = dir.path().join("four.toml");
    std::fs::write(&four, stream_list("[shard]\ncount = 4\n")).unwrap();
    let fourth = start(&shard_args(&four, Some(3), None));
    let new = wait_streaming(&fourth).await;
    assert_eq!((new.index, new.count), (3, 4));
    let moved: Vec<&String> = owners.keys().filter(|n| new.owners()[*n] != owners[*n]).collect();
    assert!(
        moved.iter().all(|n| new.running.contains_key(*n)),
        "moved only to the new shard: {moved:?}"
    );
    let shares: Vec<usize> = placements.iter().map(|p| p.running.len()).collect();
    eprintln!(
        "three shards ran {shares:?}; shard 3 of 4 took {} of {STREAMS}: {moved:?}",
        moved.len()
    );
    let fraction = moved.len() as f64 / STREAMS as f64;
    assert!(
        (0.1..=0.4).contains(&fraction),
        "{} of {STREAMS} moved: {moved:?}",
        moved.len()
    );
}

#[test]
fn impossible_shard_settings_stop_the_start_with_what_is_wrong() {
    let cases: [(&[&str], &str); 3] = [
        (
            &["--shard-index", "3", "--shard-count", "3"],
            "indexes are 0 to 2",
        ),
        (&["--shard-count", "0"], "at least 1"),
        (
            &["--shard-index", "1", "--shard-index-from-hostname", "true"],
            "cannot be used with",
        ),
    ];
    for (flags, expected) in cases {
        let mut args = vec!["serve".to_string()];
        args.extend(flags.iter().map(|f| f.to_string()));
        let out = common::peregrine(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flags:?} started");
        assert!(stderr.contains(expected), "{flags:?}: {stderr}");
    }
}
