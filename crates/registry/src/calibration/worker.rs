//! One online calibration: a thread at the lowest scheduling priority that takes the
//! engine's sampled canvases, runs each through the calibration graph, and publishes the
//! quantized model as the model's next version.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use peregrine_backend::activations::ActivationSession;
use peregrine_engine::sample::{canvas_sample, CanvasReceiver};
use peregrine_engine::Engine;
use peregrine_onnx::quantize::{
    calibration_graph, quantize_qdq, QdqOptions, TensorHistogram, METADATA_PREFIX,
};

use super::OnlineCalibration;
use crate::store::Weights;

/// Everything one calibration needs besides the engine's canvases.
#[derive(Debug, Clone)]
pub(crate) struct Job {
    pub name: String,
    pub version: u64,
    /// SHA-256 of the float weights, hex: recorded in the quantized model, and how a later
    /// job finds that this version was already calibrated.
    pub source_sha256: String,
    pub weights: Weights,
    /// File name of the weights inside a version directory.
    pub model_file: String,
    pub calibration: OnlineCalibration,
    /// The ONNX Runtime library, as the model's sessions find it.
    pub runtime_path: Option<PathBuf>,
}

/// How a calibration ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The quantized model is the model's version `.0`.
    Published(u64),
    /// Version `.0` was already calibrated from these weights.
    AlreadyCalibrated(u64),
    /// The version is itself a quantized model.
    AlreadyQuantized,
    /// The engine stopped (retired or unloaded) before the sample was complete.
    EngineStopped {
        seen: usize,
    },
    Failed(String),
}

/// Attaches a sampler of `job.calibration.samples` canvases to `engine` and starts the
/// thread; `done` is called on it with the outcome. The thread holds no engine: when the
/// engine stops, its sampler goes and the sample ends.
pub(crate) fn start(
    job: Job,
    engine: &Engine,
    done: impl FnOnce(&Job, Outcome) + Send + 'static,
) -> std::io::Result<()> {
    let (sampler, canvases) = canvas_sample(job.calibration.samples, job.calibration.every);
    if engine.sample_canvases(sampler).is_err() {
        // One sampler per engine: a second start for the same engine has nothing to do.
        return Ok(());
    }
    let (width, height) = (engine.spec().input_width, engine.spec().input_height);
    std::thread::Builder::new()
        .name(format!("calibrate-{}", job.version))
        .spawn(move || {
            lower_priority();
            let outcome = run(&job, canvases, (width, height));
            done(&job, outcome);
        })?;
    Ok(())
}

fn run(job: &Job, canvases: CanvasReceiver, (width, height): (usize, usize)) -> Outcome {
    let bytes = match job.weights.read() {
        Ok(b) => b,
        Err(e) => return Outcome::Failed(e),
    };
    match calibrated_before(job, &bytes) {
        Ok(Some(outcome)) => return outcome,
        Ok(None) => {}
        Err(e) => return Outcome::Failed(e),
    }
    let c = &job.calibration;
    let (plan, graph) = match calibration_graph(&bytes, &c.selection) {
        Ok(p) => p,
        Err(e) => return Outcome::Failed(format!("the model cannot be quantized: {e}")),
    };
    let mut session = match ActivationSession::from_bytes(&graph, c.threads, job.runtime_path.as_deref()) {
        Ok(s) => s,
        Err(e) => return Outcome::Failed(format!("building the calibration session: {e}")),
    };
    drop(graph);
    tracing::info!(model = %job.name, version = job.version, samples = c.samples, method = %c.method.name(), "online calibration started: sampling the version's canvases");
    let mut histograms: HashMap<String, TensorHistogram> = plan
        .tensors
        .iter()
        .map(|t| (t.clone(), TensorHistogram::for_method(c.method)))
        .collect();
    let mut input = vec![0f32; 3 * width * height];
    let mut seen = 0;
    while seen < c.samples {
        let Some(canvas) = canvases.recv() else {
            return Outcome::EngineStopped { seen };
        };
        peregrine_vision::normalize::rgb8_to_planar_f32(&canvas, &mut input);
        let ran = session.run(&input, [1, 3, height, width], |name, values| {
            if let Some(h) = histograms.get_mut(name) {
                h.add(values);
            }
        });
        if let Err(e) = ran {
            return Outcome::Failed(format!("running the calibration graph: {e}"));
        }
        seen += 1;
        if seen.is_multiple_of((c.samples / 10).max(1)) && seen < c.samples {
            tracing::info!(model = %job.name, version = job.version, seen, of = c.samples, "online calibration sampling");
        }
    }
    drop((session, canvases));
    let ranges: HashMap<String, (f32, f32)> = histograms
        .iter()
        .map(|(name, h)| (name.clone(), h.range(c.method)))
        .collect();
    let options = QdqOptions {
        selection: c.selection.clone(),
        activations: c.activations,
        metadata: vec![
            ("method".into(), c.method.name()),
            ("samples".into(), seen.to_string()),
            ("date".into(), jiff::Timestamp::now().to_string()),
            ("source_sha256".into(), job.source_sha256.clone()),
            ("source_version".into(), job.version.to_string()),
            ("calibration".into(), "online".into()),
        ],
    };
    let quantized = match quantize_qdq(&bytes, &ranges, &options) {
        Ok(q) => q,
        Err(e) => return Outcome::Failed(format!("writing the QDQ model: {e}")),
    };
    match publish(&c.model_dir, &job.model_file, job.version, &quantized.model) {
        Ok(v) => Outcome::Published(v),
        Err(e) => Outcome::Failed(format!("publishing into {}: {e}", c.model_dir.display())),
    }
}

/// Whether there is nothing to do: the weights are a quantized model themselves, or a
/// version of the model records them as its source.
fn calibrated_before(job: &Job, bytes: &[u8]) -> Result<Option<Outcome>, String> {
    let metadata = |bytes: &[u8]| peregrine_onnx::describe(bytes).map(|d| d.metadata);
    let own = metadata(bytes).map_err(|e| format!("reading the model's metadata: {e}"))?;
    if is_quantized(&own) {
        return Ok(Some(Outcome::AlreadyQuantized));
    }
    let source_key = format!("{METADATA_PREFIX}source_sha256");
    for (version, dir) in versions(&job.calibration.model_dir)? {
        if version == job.version {
            continue;
        }
        // A version that cannot be read is not the one looked for.
        let Ok(other) = std::fs::read(dir.join(&job.model_file)) else {
            continue;
        };
        if metadata(&other).is_ok_and(|m| m.get(&source_key) == Some(&job.source_sha256)) {
            return Ok(Some(Outcome::AlreadyCalibrated(version)));
        }
    }
    Ok(None)
}

/// Whether a model's metadata marks it as written by `peregrine quantize` or an online
/// calibration.
pub(crate) fn is_quantized(metadata: &BTreeMap<String, String>) -> bool {
    metadata.keys().any(|k| k.starts_with(METADATA_PREFIX))
}

/// The numbered version directories of a model directory.
fn versions(model_dir: &Path) -> Result<Vec<(u64, PathBuf)>, String> {
    let entries =
        std::fs::read_dir(model_dir).map_err(|e| format!("cannot read {}: {e}", model_dir.display()))?;
    Ok(entries
        .filter_map(Result::ok)
        .filter_map(|e| Some((e.file_name().to_str()?.parse::<u64>().ok()?, e.path())))
        .collect())
}

/// Writes `model` as the next version of the model at `model_dir`: the file goes into a
/// hidden staging directory first (which the repository scan skips), which is renamed to
/// the next number only once complete, so a poll never sees half a file.
fn publish(model_dir: &Path, model_file: &str, source: u64, model: &[u8]) -> std::io::Result<u64> {
    use std::io::Write;
    let staging = model_dir.join(format!(".calibrating-{source}-{}", std::process::id()));
    std::fs::create_dir_all(&staging)?;
    let written = (|| {
        let mut file = std::fs::File::create(staging.join(model_file))?;
        file.write_all(model)?;
        file.sync_all()
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_dir_all(&staging);
        return Err(e);
    }
    // Another writer may take a number between the listing and the rename: try the next.
    for _ in 0..16 {
        let next = versions(model_dir)
            .map_err(std::io::Error::other)?
            .iter()
            .map(|(v, _)| *v)
            .max()
            .unwrap_or(0)
            + 1;
        let target = model_dir.join(next.to_string());
        if target.exists() {
            continue;
        }
        match std::fs::rename(&staging, &target) {
            Ok(()) => return Ok(next),
            Err(e) if target.exists() => {
                tracing::debug!(error = %e, next, "version number taken; trying the next")
            }
            Err(e) => {
                let _ = std::fs::remove_dir_all(&staging);
                return Err(e);
            }
        }
    }
    let _ = std::fs::remove_dir_all(&staging);
    Err(std::io::Error::other("no free version number after 16 tries"))
}

/// Puts this thread (and the ONNX Runtime threads it starts, which inherit it) at the
/// lowest priority Linux has: `SCHED_IDLE` runs only on cores nothing else wants, so the
/// serving threads never wait for calibration. Where that is refused, nice 19.
fn lower_priority() {
    #[cfg(target_os = "linux")]
    {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: both calls only change this thread's scheduling (pid 0 is the calling
        // thread on Linux) and read the parameter we pass; no memory is shared.
        let idle = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) } == 0;
        if !idle {
            // SAFETY: as above.
            unsafe {
                libc::setpriority(libc::PRIO_PROCESS, 0, 19);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("peregrine-calib-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn publishing_takes_the_next_number_and_leaves_no_staging() {
        let dir = temp_dir("publish");
        std::fs::create_dir_all(dir.join("1")).unwrap();
        std::fs::create_dir_all(dir.join("3")).unwrap();
        std::fs::create_dir_all(dir.join("notes")).unwrap();
        assert_eq!(publish(&dir, "model.onnx", 1, b"int8").unwrap(), 4);
        assert_eq!(std::fs::read(dir.join("4/model.onnx")).unwrap(), b"int8");
        assert_eq!(publish(&dir, "model.onnx", 1, b"again").unwrap(), 5);
        let hidden: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().starts_with('.'))
            .collect();
        assert!(hidden.is_empty(), "{hidden:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn publishing_where_no_directory_can_be_made_fails() {
        let file = temp_dir("file-parent").join("plain");
        std::fs::write(&file, b"").unwrap();
        let err = publish(&file, "model.onnx", 1, b"x").unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::NotADirectory, "{err}");
    }
}
