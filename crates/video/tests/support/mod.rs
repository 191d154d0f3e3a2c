//! Real peers for the integration tests (GStreamer's RTSP server, mosquitto) and fake
//! detectors. Every peer listens on a port found free by binding port 0, is started by the
//! test and killed when its guard drops.

#![allow(dead_code)]

pub mod engine_detector;
pub mod mqtt;
pub mod rtp_pusher;
pub mod tls;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use peregrine_types::{BBox, ClassNames, Detection};
use peregrine_video::RtspTransport;
use peregrine_video::{DetectError, Frame, FrameDetector, ManagerOptions, StreamConfig, StreamPolicy};

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub fn shared_clip(name: &str) -> PathBuf {
    repo_root().join("../shared/videos").join(name)
}

pub fn h265_clip() -> PathBuf {
    let p = repo_root().join(".cache/videos/bikes-h265.mp4");
    assert!(
        p.exists(),
        "{} missing: run make setup and scripts/setup-test.sh",
        p.display()
    );
    p
}

/// Manager options whose stream policy allows what these tests open: the shared and
/// transcoded clips, temporary files, and RTSP servers on loopback.
pub fn local_options(detector: Arc<dyn FrameDetector>) -> ManagerOptions {
    let mut options = ManagerOptions::new(detector);
    options.stream_policy = StreamPolicy {
        file_roots: [
            repo_root().join("../shared/videos"),
            repo_root().join(".cache/videos"),
            std::env::temp_dir(),
        ]
        .into_iter()
        .filter(|root| root.is_dir())
        .collect(),
        allow_hosts: vec!["127.0.0.1".into(), "::1".into()],
        ..StreamPolicy::default()
    };
    options
}

/// A camera stream on `transport`, sampled at `fps` (every frame when `None`), decoded on
/// one thread so that several fit on the test machine's two cores.
pub fn camera(name: &str, url: String, transport: RtspTransport, fps: Option<f64>) -> StreamConfig {
    let mut c = StreamConfig::new(name, url);
    c.transport = transport;
    c.fps = fps;
    c.decode_threads = 1;
    c
}

/// A port nothing listens on right now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// Waits (polling, bounded) until `check` holds; panics with `what` on timeout.
pub async fn eventually<F: FnMut() -> bool>(timeout: Duration, what: &str, mut check: F) {
    let started = std::time::Instant::now();
    while !check() {
        assert!(
            started.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// GStreamer's RTSP server (scripts/rtsp-test-server.py) serving clips in a loop.
pub struct RtspServer {
    child: Option<Child>,
    pub port: u16,
    mounts: Vec<String>,
}

impl RtspServer {
    /// `mounts`: `("name", path)`; served at `rtsp://127.0.0.1:<port>/name`.
    pub fn start(mounts: &[(&str, PathBuf)]) -> Self {
        Self::start_on(
            0,
            mounts
                .iter()
                .map(|(m, p)| format!("{m}={}", p.display()))
                .collect(),
        )
    }

    fn start_on(port: u16, mounts: Vec<String>) -> Self {
        let script = repo_root().join("scripts/rtsp-test-server.py");
        // The system Python has the GObject bindings (not a pyenv one on PATH).
        let mut child = Command::new("/usr/bin/python3")
            .arg(&script)
            .arg("--port")
            .arg(port.to_string())
            .args(&mounts)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the RTSP test server (run make setup and scripts/setup-test.sh)");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            if let Some(Ok(line)) = lines.next() {
                let _ = tx.send(line);
            }
            // Keep draining so the server never blocks on a full pipe.
            for _ in lines {}
        });
        let line = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("RTSP test server did not report READY within 60 s");
        let port = line
            .strip_prefix("READY ")
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or_else(|| panic!("unexpected line from the RTSP server: {line}"));
        Self {
            child: Some(child),
            port,
            mounts,
        }
    }

    pub fn url(&self, mount: &str) -> String {
        format!("rtsp://127.0.0.1:{}/{mount}", self.port)
    }

    /// Kills the server (abruptly, like a camera losing power).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port with the same mounts.
    pub fn restart(&mut self) {
        self.stop();
        let mut fresh = Self::start_on(self.port, self.mounts.clone());
        self.child = fresh.child.take();
    }
}

impl Drop for RtspServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A mosquitto broker on a free port, anonymous, loopback only; with [`Mosquitto::start_tls`]
/// also a TLS listener whose certificate the test CA signed.
pub struct Mosquitto {
    child: Child,
    pub port: u16,
    pub tls_port: Option<u16>,
    conf: PathBuf,
    _dir: TempDir,
}

impl Mosquitto {
    pub fn start() -> Self {
        Self::start_with(None)
    }

    pub fn start_tls(ca: &tls::TestCa) -> Self {
        Self::start_with(Some(ca))
    }

    fn start_with(ca: Option<&tls::TestCa>) -> Self {
        let dir = TempDir::new("mosquitto");
        let port = free_port();
        let conf = dir.0.join("mosquitto.conf");
        let mut text = format!("allow_anonymous true\npersistence false\nlistener {port} 127.0.0.1\n");
        let tls_port = ca.map(|ca| {
            let tls_port = free_port();
            text.push_str(&format!(
                "listener {tls_port} 127.0.0.1\ncafile {}\ncertfile {}\nkeyfile {}\n",
                ca.ca_file().display(),
                ca.server_cert_file().display(),
                ca.server_key_file().display()
            ));
            tls_port
        });
        std::fs::write(&conf, text).expect("write mosquitto.conf");
        let child = Self::spawn(&conf, std::iter::once(port).chain(tls_port));
        Self {
            child,
            port,
            tls_port,
            conf,
            _dir: dir,
        }
    }

    /// Starts mosquitto with `conf` and waits (polling, bounded) until it listens on `ports`.
    fn spawn(conf: &std::path::Path, ports: impl Iterator<Item = u16>) -> Child {
        let child = Command::new(mosquitto_binary())
            .arg("-c")
            .arg(conf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start mosquitto (run make setup and scripts/setup-test.sh)");
        let started = std::time::Instant::now();
        for p in ports {
            while std::net::TcpStream::connect(("127.0.0.1", p)).is_err() {
                assert!(
                    started.elapsed() < Duration::from_secs(20),
                    "mosquitto did not listen"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        child
    }

    /// Kills the broker (abruptly: no retained message survives, as persistence is off)
    /// and starts a fresh one on the same ports.
    pub fn restart(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.child = Self::spawn(&self.conf, std::iter::once(self.port).chain(self.tls_port));
    }
}

fn mosquitto_binary() -> &'static str {
    if std::path::Path::new("/usr/sbin/mosquitto").exists() {
        "/usr/sbin/mosquitto"
    } else {
        "mosquitto"
    }
}

impl Drop for Mosquitto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let p = std::env::temp_dir().join(format!(
            "pv-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&p).expect("temp dir");
        Self(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A detector that answers at once with one box covering the frame, after checking the
/// pixels are there; counts its calls.
#[derive(Default)]
pub struct InstantDetector {
    pub calls: AtomicUsize,
}

impl FrameDetector for InstantDetector {
    fn detect(
        &self,
        frame: std::sync::Arc<Frame>,
        _deadline: std::time::Instant,
    ) -> BoxFuture<'static, Result<Vec<Detection>, DetectError>> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let ok = frame
            .pixels()
            .is_ok_and(|p| p.len() >= frame.stride() * frame.height() as usize);
        let (w, h) = (frame.width() as f32, frame.height() as f32);
        drop(frame);
        Box::pin(async move {
            if !ok {
                return Err(DetectError::Failed("short frame".into()));
            }
            Ok(vec![Detection {
                class_id: 0,
                score: 0.9,
                bbox: BBox::new(0.0, 0.0, w, h),
            }])
        })
    }

    fn class_names(&self) -> ClassNames {
        ClassNames::new(vec!["frame".into()])
    }
}

pub fn instant_detector() -> Arc<InstantDetector> {
    Arc::new(InstantDetector::default())
}

/// Resident memory of this process, in kB.
pub fn rss_kb() -> u64 {
    proc_status("VmRSS:")
}

/// OS threads of this process.
pub fn os_threads() -> u64 {
    proc_status("Threads:")
}

/// A number from /proc/self/status; panics if it cannot be read, so that a check built on
/// it can never pass by reading zero.
fn proc_status(key: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status")
        .unwrap_or_else(|e| panic!("cannot read /proc/self/status for {key}: {e}"));
    let line = status
        .lines()
        .find(|l| l.starts_with(key))
        .unwrap_or_else(|| panic!("/proc/self/status has no {key} line"));
    line.split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("unreadable {key} line in /proc/self/status: {line:?}"))
}
