//! One online calibration: a thread at the lowest scheduling priority that takes the
//! engine's sampled canvases, runs each through the calibration graph, and publishes the
//! quantized model as the model's next version.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use peregrine_engine::sample::{canvas_sample, CanvasReceiver};
use peregrine_engine::Engine;
use peregrine_onnx::quantize::{calibration_graph, quantize_qdq, QdqOptions, METADATA_PREFIX};

use peregrine_types::parity::Parity;

use super::{Calibrator, OnlineCalibration, Ranges};
use crate::settings::ModelSettings;
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
    /// The INT8 model agreed with the float one on the held-out canvases less than
    /// `min_agreement` asks; nothing was published.
    Disagreed(Parity),
    /// The engine stopped (retired or unloaded) before the sample was complete.
    EngineStopped {
        seen: usize,
    },
    Failed(String),
}

impl Outcome {
    /// The outcome as `peregrine_calibrations_total` labels it.
    pub(crate) fn label(&self) -> &'static str {
        match self {
            Self::Published(_) => "published",
            Self::AlreadyCalibrated(_) => "already_calibrated",
            Self::AlreadyQuantized => "already_quantized",
            Self::Disagreed(_) => "disagreed",
            Self::EngineStopped { .. } => "engine_stopped",
            Self::Failed(_) => "failed",
        }
    }
}

/// Attaches a sampler of `job.calibration.samples` canvases to `engine` and starts the
/// thread; `done` is called on it with the outcome. The thread holds no engine: when the
/// engine stops, its sampler goes and the sample ends.
pub(crate) fn start(
    job: Job,
    engine: &Engine,
    done: impl FnOnce(&Job, Outcome) + Send + 'static,
) -> std::io::Result<()> {
    let wanted = job.calibration.samples + job.calibration.held_out;
    let (sampler, canvases) = canvas_sample(wanted, job.calibration.every);
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

fn run(job: &Job, canvases: CanvasReceiver, dims: (usize, usize)) -> Outcome {
    match calibrate_and_publish(job, canvases, dims) {
        Ok(version) => Outcome::Published(version),
        Err(outcome) => outcome,
    }
}

/// The whole calibration; every way it can end short of publishing is the `Err`.
fn calibrate_and_publish(job: &Job, canvases: CanvasReceiver, dims: (usize, usize)) -> Result<u64, Outcome> {
    let bytes = job.weights.read().map_err(Outcome::Failed)?;
    if let Some(outcome) = calibrated_before(job, &bytes).map_err(Outcome::Failed)? {
        return Err(outcome);
    }
    let c = &job.calibration;
    let (ranges, seen) = sample_ranges(job, &bytes, &canvases, dims)?;
    let mut held = Vec::with_capacity(c.held_out);
    while held.len() < c.held_out {
        let canvas = canvases.recv().ok_or(Outcome::EngineStopped {
            seen: seen + held.len(),
        })?;
        held.push(canvas);
    }
    drop(canvases);
    let mut metadata = vec![
        ("method".into(), c.method.name()),
        ("samples".into(), seen.to_string()),
        ("date".into(), jiff::Timestamp::now().to_string()),
        ("source_sha256".into(), job.source_sha256.clone()),
        ("source_version".into(), job.version.to_string()),
        ("calibration".into(), "online".into()),
    ];
    let quantize = |metadata: &[(String, String)]| {
        let options = QdqOptions {
            selection: c.selection.clone(),
            activations: c.activations,
            metadata: metadata.to_vec(),
        };
        quantize_qdq(&bytes, &ranges, &options)
            .map(|q| q.model)
            .map_err(|e| Outcome::Failed(format!("writing the QDQ model: {e}")))
    };
    let mut quantized = quantize(&metadata)?;
    if !held.is_empty() {
        let parity = agreement(job, &bytes, &quantized, &held, dims)
            .map_err(|e| Outcome::Failed(format!("comparing with the float model: {e}")))?;
        tracing::info!(model = %job.name, version = job.version, "online calibration: {parity}");
        if !agrees_enough(&parity, c.min_agreement) {
            return Err(Outcome::Disagreed(parity));
        }
        metadata.extend([
            ("held_out".into(), parity.images.to_string()),
            ("agreement_recall".into(), format!("{:.4}", parity.recall())),
            ("agreement_precision".into(), format!("{:.4}", parity.precision())),
        ]);
        // The same model again, with the figures in its metadata.
        quantized = quantize(&metadata)?;
    }
    publish(&c.model_dir, &job.model_file, job.version, &quantized)
        .map_err(|e| Outcome::Failed(format!("publishing into {}: {e}", c.model_dir.display())))
}

/// Runs the first `samples` canvases through the calibration graph; each activation's
/// range by the method, and how many canvases were run.
fn sample_ranges(
    job: &Job,
    bytes: &[u8],
    canvases: &CanvasReceiver,
    dims: (usize, usize),
) -> Result<(Ranges, usize), Outcome> {
    let c = &job.calibration;
    let (plan, graph) = calibration_graph(bytes, &c.selection)
        .map_err(|e| Outcome::Failed(format!("the model cannot be quantized: {e}")))?;
    let mut calibrator = Calibrator::new(
        &graph,
        &plan.tensors,
        c.method,
        c.threads,
        job.runtime_path.as_deref(),
        dims,
    )
    .map_err(|e| Outcome::Failed(format!("building the calibration session: {e}")))?;
    drop(graph);
    tracing::info!(model = %job.name, version = job.version, samples = c.samples, method = %c.method.name(), "online calibration started: sampling the version's canvases");
    let mut seen = 0;
    while seen < c.samples {
        let canvas = canvases.recv().ok_or(Outcome::EngineStopped { seen })?;
        calibrator
            .add(&canvas)
            .map_err(|e| Outcome::Failed(format!("running the calibration graph: {e}")))?;
        seen += 1;
        metrics::gauge!("peregrine_calibration_samples", "model" => job.name.clone(), "version" => job.version.to_string())
            .set(seen as f64);
        if seen.is_multiple_of((c.samples / 10).max(1)) && seen < c.samples {
            tracing::info!(model = %job.name, version = job.version, seen, of = c.samples, "online calibration sampling");
        }
    }
    Ok((calibrator.ranges(), seen))
}

/// Whether `parity` passes `min_agreement`: recall and precision both reach it.
fn agrees_enough(parity: &Parity, min_agreement: Option<f64>) -> bool {
    min_agreement.is_none_or(|min| parity.recall().min(parity.precision()) >= min)
}

/// The detections of the float and the quantized model on the held-out canvases, compared
/// (on the CPU, with the calibration's threads, at this thread's priority).
fn agreement(
    job: &Job,
    float: &[u8],
    quantized: &[u8],
    held: &[Vec<u8>],
    (width, height): (usize, usize),
) -> Result<Parity, String> {
    let mut settings = ModelSettings::default();
    settings.session.intra_threads = job.calibration.threads;
    settings.session.runtime_path = job.runtime_path.clone();
    settings.engine.policy.max_batch = 1;
    settings.detector.imgsz = Some((height, width));
    let build = |weights: &[u8]| crate::build::build_detector(weights, &settings).map_err(|e| e.to_string());
    let (mut float, mut int8) = (build(float)?, build(quantized)?);
    let params = peregrine_types::DetectParams::default();
    let mut parity = Parity::default();
    for canvas in held {
        // A canvas is already the model's input size: its letterbox changes nothing, and
        // both models' boxes are in canvas pixels.
        let view =
            [peregrine_vision::ImageView::packed(canvas, width, height)
                .ok_or("a sampled canvas is short")?];
        let (f, _) = float.detect(&view, &params).map_err(|e| e.to_string())?;
        let (q, _) = int8.detect(&view, &params).map_err(|e| e.to_string())?;
        parity.add(&f[0], &q[0]);
    }
    Ok(parity)
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
    remove_abandoned_staging(model_dir);
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

/// Removes the staging directories of servers that died while writing (their process is
/// gone), so that a crash mid-write leaves nothing behind for long.
fn remove_abandoned_staging(model_dir: &Path) {
    let Ok(entries) = std::fs::read_dir(model_dir) else {
        return;
    };
    for entry in entries.filter_map(Result::ok) {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(".calibrating-"))
            .and_then(|rest| rest.rsplit_once('-'))
            .and_then(|(_, pid)| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new("/proc").join(pid.to_string()).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
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
        // A staging directory of a process that is gone, and one of a live process (this
        // one, as if another calibration were writing).
        std::fs::create_dir_all(dir.join(".calibrating-1-4000000000")).unwrap();
        let live = dir.join(format!(".calibrating-2-{}", std::process::id()));
        std::fs::create_dir_all(&live).unwrap();
        assert_eq!(publish(&dir, "model.onnx", 1, b"int8").unwrap(), 4);
        assert_eq!(std::fs::read(dir.join("4/model.onnx")).unwrap(), b"int8");
        assert_eq!(publish(&dir, "model.onnx", 1, b"again").unwrap(), 5);
        let hidden: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with('.'))
            .collect();
        assert_eq!(hidden, [live], "only the live process's staging is left");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn both_recall_and_precision_must_reach_the_minimum() {
        let parity = Parity {
            images: 2,
            reference: 10,
            candidate: 8,
            matched: 8,
        };
        // Recall 0.8, precision 1.0.
        assert!(agrees_enough(&parity, None));
        assert!(agrees_enough(&parity, Some(0.8)));
        assert!(!agrees_enough(&parity, Some(0.81)));
        let none_found = Parity {
            candidate: 0,
            matched: 0,
            ..parity
        };
        assert!(!agrees_enough(&none_found, Some(0.1)));
    }

    #[test]
    fn publishing_where_no_directory_can_be_made_fails() {
        let file = temp_dir("file-parent").join("plain");
        std::fs::write(&file, b"").unwrap();
        let err = publish(&file, "model.onnx", 1, b"x").unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::NotADirectory, "{err}");
    }
}
