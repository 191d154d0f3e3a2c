//! Starts the real `peregrine serve` on a free port and talks to it over HTTP.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

pub struct Server {
    pub child: Child,
    pub base: String,
    /// `host:port` of the gRPC service.
    pub grpc: String,
    /// Every line the server has written to stderr so far.
    pub logs: Arc<Mutex<Vec<String>>>,
}

impl Server {
    /// Starts the server with `extra` flags and waits until it listens (not until ready).
    pub fn start(extra: &[&str]) -> Server {
        Self::launch(&["--log-format", "text"], extra, &[], false)
    }

    /// [`Server::start`] with environment variables set for the server.
    pub fn start_with_env(extra: &[&str], env: &[(&str, &str)]) -> Server {
        Self::launch(&["--log-format", "text"], extra, env, false)
    }

    /// A server for all the tests of one binary to share, with the server's default log
    /// format (JSON lines). A static is never dropped, so the server is spawned from a
    /// thread that lives as long as the test binary, and the kernel kills it when that
    /// thread ends (`PR_SET_PDEATHSIG`): when the binary exits, however it exits.
    pub fn start_for_the_process(extra: &[&str]) -> Server {
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
            let _ = tx.send(Self::launch(&[], &extra, &[], true));
            loop {
                std::thread::park();
            }
        });
        rx.recv().expect("the server starts")
    }

    fn launch(
        log_format: &[&str],
        extra: &[&str],
        env: &[(&str, &str)],
        die_with_this_thread: bool,
    ) -> Server {
        let mut command = Command::new(env!("CARGO_BIN_EXE_peregrine"));
        if die_with_this_thread {
            use std::os::unix::process::CommandExt as _;
            // SAFETY: prctl is async-signal-safe and touches only the child's own state.
            unsafe {
                command.pre_exec(|| {
                    if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == 0 {
                        Ok(())
                    } else {
                        Err(std::io::Error::last_os_error())
                    }
                });
            }
        }
        let mut child = command
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
            ])
            .args(log_format)
            .args(extra)
            // No event database unless a test asks for one (`--events-db` beats this).
            .env("PEREGRINE_EVENTS_DB", "none")
            // Streams of the tests: RTSP servers on loopback, the shared clips and temporary
            // files (flags a test gives beat these).
            .env("PEREGRINE_STREAM_ALLOW_HOSTS", "127.0.0.1")
            .env("PEREGRINE_STREAM_FILE_ROOTS", test_file_roots())
            .envs(env.iter().copied())
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("peregrine serve starts");
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::channel();
        let logs = Arc::new(Mutex::new(Vec::new()));
        let kept = logs.clone();
        std::thread::spawn(move || {
            // Keep draining stderr so the server never blocks on a full pipe.
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                kept.lock().unwrap().push(line.clone());
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
        Server {
            child,
            base,
            grpc,
            logs,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// POSTs `body` as JSON to `path`.
    pub async fn post_json(&self, path: &str, body: &serde_json::Value) -> reqwest::Response {
        reqwest::Client::new()
            .post(self.url(path))
            .json(body)
            .send()
            .await
            .unwrap()
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
        sum_series(&self.metrics_text().await, name, label_filter)
    }

    pub async fn metrics_text(&self) -> String {
        reqwest::get(self.url("/metrics"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// Polls /metrics until `done` holds of the values of `series` (each a name and a label
    /// filter, as [`Server::metric`] takes them), for at most 60 s; returns the values.
    pub async fn wait_for_metrics(
        &self,
        what: &str,
        series: &[(&str, &str)],
        done: impl Fn(&[f64]) -> bool,
    ) -> Vec<f64> {
        let start = Instant::now();
        loop {
            let text = self.metrics_text().await;
            let values: Vec<f64> = series.iter().map(|(n, f)| sum_series(&text, n, f)).collect();
            if done(&values) {
                return values;
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "{what}: {series:?} still at {values:?} after 60 s"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Waits (30 s at most) for the server process to exit, and says how it did.
    pub async fn wait_exit(&mut self) -> std::process::ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(start.elapsed() < Duration::from_secs(30), "server did not exit");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
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

/// The sum of every series of `name` in a Prometheus text exposition whose labels contain
/// `label_filter`.
pub fn sum_series(text: &str, name: &str, label_filter: &str) -> f64 {
    text.lines()
        .filter(|l| {
            l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']) && l.contains(label_filter)
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
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

/// The shared clips and the temporary directory, as `--stream-file-roots` takes them.
fn test_file_roots() -> String {
    let shared = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/videos");
    format!("{},{}", shared.display(), std::env::temp_dir().display())
}
