//! Starts the real `peregrine serve` on a free port and talks to it over HTTP.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub struct Server {
    pub child: Child,
    pub base: String,
    /// `host:port` of the gRPC service.
    pub grpc: String,
}

impl Server {
    /// Starts the server with `extra` flags and waits until it listens (not until ready).
    pub fn start(extra: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_peregrine"))
            .args([
                "serve",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--grpc-port",
                "0",
                "--threads",
                "1",
                "--log-format",
                "text",
            ])
            .args(extra)
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("peregrine serve starts");
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            // Keep draining stderr so the server never blocks on a full pipe.
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(url) = line.strip_prefix("peregrine: listening on ") {
                    let _ = tx.send(url.trim().to_string());
                }
                if let Some(addr) = line.strip_prefix("peregrine: gRPC listening on ") {
                    let _ = tx.send(addr.trim().to_string());
                }
            }
        });
        let base = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("the server reports its address");
        let grpc = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("the server reports its gRPC address");
        Server { child, base, grpc }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub async fn wait_ready(&self) {
        let client = reqwest::Client::new();
        let start = Instant::now();
        loop {
            if let Ok(r) = client.get(self.url("/health/ready")).send().await {
                if r.status() == 200 {
                    return;
                }
            }
            assert!(
                start.elapsed() < Duration::from_secs(120),
                "server not ready after 120 s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Reads a counter or gauge from /metrics, summing every series whose labels contain
    /// `label_filter`.
    pub async fn metric(&self, name: &str, label_filter: &str) -> f64 {
        let text = reqwest::get(self.url("/metrics"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        text.lines()
            .filter(|l| {
                l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']) && l.contains(label_filter)
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    pub fn terminate(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub async fn post_image(
    client: &reqwest::Client,
    url: &str,
    bytes: Vec<u8>,
    headers: &[(&str, &str)],
) -> reqwest::Response {
    let mut req = client.post(url).header("content-type", "image/jpeg").body(bytes);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.send().await.expect("the request is answered")
}
