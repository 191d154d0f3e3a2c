//! A [`FrameDetector`] over `peregrine_engine::Detector` (the synchronous CPU pipeline),
//! for tests and the capacity example only: the server's real implementation submits into
//! its batching engine instead. One OS thread owns the detector; streams hand it jobs
//! through a bounded channel and it runs whatever has gathered as one batch.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use peregrine_backend::{OrtBackend, SessionConfig};
use peregrine_engine::{Detector, DetectorConfig};
use peregrine_types::{ClassNames, DetectParams, Detection};
use peregrine_video::{DetectError, Frame, FrameDetector};
use peregrine_vision::ImageView;
use tokio::sync::oneshot;

struct Job {
    frame: std::sync::Arc<Frame>,
    deadline: Instant,
    reply: oneshot::Sender<Result<Vec<Detection>, DetectError>>,
}

pub struct EngineDetector {
    /// Jobs waiting for the model thread: full means the model is behind, and the frame is
    /// refused as `Overloaded` (the stream counts it) rather than queued.
    jobs: SyncSender<Job>,
    names: ClassNames,
}

impl EngineDetector {
    /// Loads `model` with ONNX Runtime's CPU provider (`threads` intra-op threads, 0 for
    /// one per core; the library at `runtime`, else where the backend looks) and starts
    /// the model thread.
    pub fn start(
        model: &Path,
        runtime: Option<&Path>,
        threads: usize,
        max_batch: usize,
    ) -> Result<Arc<Self>, String> {
        let backend = OrtBackend::from_file(
            model,
            &SessionConfig {
                intra_threads: threads,
                // Decoding shares the cores: idle model threads must sleep, not spin.
                intra_op_spinning: Some(false),
                runtime_path: runtime.map(Path::to_path_buf),
                ..SessionConfig::default()
            },
        )
        .map_err(|e| e.to_string())?;
        let detector = Detector::new(
            Box::new(backend),
            &DetectorConfig {
                max_batch,
                ..DetectorConfig::default()
            },
        )
        .map_err(|e| e.to_string())?;
        let names = detector.spec().names.clone();
        let batch = detector.batch_size();
        let (jobs, rx) = mpsc::sync_channel(batch * 2);
        std::thread::Builder::new()
            .name("engine-detector".into())
            .spawn(move || run_model(detector, rx, batch))
            .map_err(|e| e.to_string())?;
        Ok(Arc::new(Self { jobs, names }))
    }
}

impl FrameDetector for EngineDetector {
    fn detect(
        &self,
        frame: std::sync::Arc<Frame>,
        deadline: std::time::Instant,
    ) -> BoxFuture<'static, Result<Vec<Detection>, DetectError>> {
        let (reply, rx) = oneshot::channel();
        let sent = self.jobs.try_send(Job {
            frame,
            deadline,
            reply,
        });
        Box::pin(async move {
            match sent {
                Ok(()) => rx
                    .await
                    .unwrap_or_else(|_| Err(DetectError::Unavailable("model thread ended".into()))),
                Err(TrySendError::Full(_)) => Err(DetectError::Overloaded),
                Err(TrySendError::Disconnected(_)) => {
                    Err(DetectError::Unavailable("model thread ended".into()))
                }
            }
        })
    }

    fn class_names(&self) -> ClassNames {
        self.names.clone()
    }
}

fn run_model(mut detector: Detector, rx: Receiver<Job>, batch: usize) {
    let params = DetectParams::default();
    let mut jobs: Vec<Job> = Vec::with_capacity(batch);
    loop {
        match rx.recv_timeout(Duration::from_secs(3600)) {
            Ok(job) => jobs.push(job),
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => return,
        }
        while jobs.len() < batch {
            match rx.try_recv() {
                Ok(job) => jobs.push(job),
                Err(_) => break,
            }
        }
        // Expired frames are answered without being computed.
        let now = Instant::now();
        let (live, expired): (Vec<Job>, Vec<Job>) = jobs.drain(..).partition(|j| j.deadline > now);
        for job in expired {
            let _ = job.reply.send(Err(DetectError::DeadlineExceeded));
        }
        if live.is_empty() {
            continue;
        }
        let views: Vec<ImageView<'_>> = live
            .iter()
            .map(|j| ImageView {
                data: j.frame.pixels().expect("host frames"),
                width: j.frame.width() as usize,
                height: j.frame.height() as usize,
                stride: j.frame.stride(),
            })
            .collect();
        let outcome = detector.detect(&views, &params);
        drop(views);
        match outcome {
            Ok((results, _)) => {
                for (job, dets) in live.into_iter().zip(results) {
                    let _ = job.reply.send(Ok(dets));
                }
            }
            Err(e) => {
                for job in live {
                    let _ = job.reply.send(Err(DetectError::Failed(e.to_string())));
                }
            }
        }
    }
}

/// The repository's model and the ONNX Runtime library `scripts/setup.sh` fetched (or
/// `ORT_DYLIB_PATH`). Both are part of the checkout's setup, so a missing one is an error,
/// never a silent skip.
pub fn repo_model() -> Result<(PathBuf, PathBuf), String> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let model = root.join("models/yolo11n.onnx");
    if !model.exists() {
        return Err(format!("{} is missing", model.display()));
    }
    let runtime = match std::env::var_os("ORT_DYLIB_PATH") {
        Some(p) => PathBuf::from(p),
        None => root.join(".cache/onnxruntime/1.31.1/libonnxruntime.so.1.31.1"),
    };
    if !runtime.exists() {
        return Err(format!(
            "no ONNX Runtime at {} (run scripts/setup.sh or set ORT_DYLIB_PATH)",
            runtime.display()
        ));
    }
    Ok((model, runtime))
}
