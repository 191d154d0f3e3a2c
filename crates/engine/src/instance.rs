//! One model instance's OS thread: warm up, then run whatever batch the queue task hands
//! over, until the queue task ends.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use peregrine_backend::BackendError;
use peregrine_types::DetectParams;
use peregrine_vision::{DetectorSpec, Letterbox};
use tokio::sync::{mpsc, oneshot};

use crate::detector::Detector;
use crate::queue_task::{Batch, Command, Entry, ItemTimings, Reply};
use crate::request::RequestError;
use crate::shared::Shared;
use crate::slot::{Slot, SlotOutput};
use crate::stats::BatchRun;
use crate::{spans, telemetry, EngineError};

/// Model instance threads alive in this process, sessions included.
static LIVE: AtomicUsize = AtomicUsize::new(0);

/// Model instance threads still running (each holds a session until it ends). A process
/// should let this reach zero before it exits: a GPU session freed after the CUDA driver
/// has begun shutting down at exit aborts the process.
pub fn live_instances() -> usize {
    LIVE.load(Ordering::Acquire)
}

/// Counts an instance thread from its start to the moment its session is gone.
struct Alive;

impl Alive {
    fn new() -> Self {
        LIVE.fetch_add(1, Ordering::AcqRel);
        Self
    }
}

impl Drop for Alive {
    fn drop(&mut self) {
        LIVE.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The instance holds only a weak sender, so that it never keeps the queue task alive: once
/// every `Engine` handle is gone the queue task ends and this thread follows.
pub(crate) fn run_instance(
    index: usize,
    mut detector: Detector,
    commands: mpsc::WeakSender<Command>,
    shared: Arc<Shared>,
) {
    // Declared first, so dropped last: after the detector and its session.
    let _alive = Alive::new();
    let sizes = detector.run_sizes(shared.config.policy.max_batch);
    let model = shared.config.name.clone();
    let version = shared.config.version.clone();
    let costs = match warm_up(&mut detector, &shared.spec, &sizes) {
        Ok(costs) => costs,
        Err(e) => {
            tracing::error!(model = %model, version = %version, error = %e, "warm-up failed; the model will not become ready");
            shared.instance_failed(format!("warm-up failed: {e}"));
            return;
        }
    };
    note_single_run(&shared, &costs);
    // The wait estimator starts from the warm-up's batch times rather than from nothing.
    if let Some(sender) = commands.upgrade() {
        let _ = sender.blocking_send(Command::WarmedUp(costs));
    }
    let _ = shared.output_shape.set(detector.output_item_shape().to_vec());
    shared.instance_ready();
    tracing::info!(model = %model, version = %version, batch_sizes = ?sizes, "model instance warmed up");
    loop {
        let (tx, rx) = oneshot::channel();
        let Some(sender) = commands.upgrade() else { break };
        let sent = sender.blocking_send(Command::Idle {
            instance: index,
            reply: tx,
        });
        drop(sender);
        if sent.is_err() {
            break;
        }
        // No batch: the queue task ended, or took this instance out of rotation.
        let Ok(batch) = rx.blocking_recv() else { break };
        if let Some(lost) = run_one(&mut detector, batch, &shared) {
            // The device is unusable: hand the batch back to be run elsewhere and stop.
            if let Some(sender) = commands.upgrade() {
                let _ = sender.blocking_send(Command::DeviceLost {
                    instance: index,
                    reason: lost.reason,
                    batch: lost.batch,
                });
            }
            break;
        }
    }
    // The session goes before this thread's claim on the engine, so that once the engine
    // reads as stopped its model memory has been given back.
    drop(detector);
    drop(shared);
}

/// Keeps the first instance's time for one run at its smallest batch, and warns when that
/// alone is past the objective: every request would miss it, so a model with a fallback
/// sends all it may there.
fn note_single_run(shared: &Shared, costs: &[(usize, std::time::Duration)]) {
    let Some(&(size, took)) = costs.iter().min_by_key(|(size, _)| *size) else {
        return;
    };
    if shared.single_run.set(took).is_err() {
        return;
    }
    if let Some((run, p99)) = shared.run_past_objective() {
        let what = if shared.config.has_fallback {
            "every request that allows it will go to the fallback"
        } else {
            "it will miss its objective"
        };
        tracing::warn!(
            model = %shared.config.name, version = %shared.config.version, batch_size = size,
            run_ms = run.as_secs_f64() * 1e3, objective_p99_ms = p99.as_secs_f64() * 1e3,
            "one run of the model at warm-up took longer than its objective's P99: {what}"
        );
    }
}

/// Runs each batch size on gray images until it is warm (twice, or through a CUDA graph's
/// capture) so the first real request pays no warm-up. Returns what each size's last run took.
fn warm_up(
    detector: &mut Detector,
    spec: &DetectorSpec,
    sizes: &[usize],
) -> Result<Vec<(usize, std::time::Duration)>, EngineError> {
    let canvas = vec![Letterbox::PAD_VALUE; spec.image_len()];
    let letterbox = Letterbox::new(
        spec.input_width,
        spec.input_height,
        spec.input_width,
        spec.input_height,
    );
    let params = DetectParams::default();
    let canvas_slot = Slot::Canvas {
        canvas,
        letterbox,
        params: params.clone(),
    };
    let mut costs = Vec::with_capacity(sizes.len());
    let runs = detector.warm_up_runs();
    for &n in sizes {
        let batch = vec![canvas_slot.clone(); n];
        // The first runs of a size can pay a one-time setup (a session of its own per size
        // on GPUs: seconds; a CUDA graph's capture); the last is what the size costs, and
        // seeds the estimator.
        for _ in 1..runs {
            detector.run_prepared(&batch)?;
        }
        let (_, t) = detector.run_prepared(&batch)?;
        costs.push((n, t.total()));
    }
    if detector.decodes_jpeg() {
        // The device decoder prepares itself per batch size too.
        let jpeg = peregrine_vision::gray_jpeg(spec.input_width as u32, spec.input_height as u32);
        let jpeg_slot = Slot::Jpeg {
            data: jpeg.into(),
            width: spec.input_width,
            height: spec.input_height,
            letterbox,
            params,
        };
        for &n in sizes {
            let (outputs, _) = detector.run_batch(&vec![jpeg_slot.clone(); n])?;
            if let Some(SlotOutput::Rejected(e)) = outputs.first() {
                return Err(EngineError::WarmUp(format!(
                    "the GPU JPEG decoder refused a test image: {e}"
                )));
            }
        }
    }
    Ok(costs)
}

/// A slot's caller, while its slot is in the model.
struct Waiting {
    reply: Reply,
    /// Its time in the queue.
    waited: std::time::Duration,
    decode: std::time::Duration,
    deadline: std::time::Instant,
    /// The request's span, should the slot have to be queued again.
    request: tracing::Span,
    /// Its `infer` span, linked to the batch's, ended once it is answered.
    span: tracing::Span,
}

/// A batch whose device failed under it, unanswered, and why.
pub(crate) struct Lost {
    pub reason: String,
    pub batch: Vec<Entry>,
}

/// Runs one batch and answers each of its slots, unless the device was lost: then nobody
/// is answered and the batch comes back, to run on another device.
fn run_one(detector: &mut Detector, batch: Batch, shared: &Shared) -> Option<Lost> {
    let (model, version, size) = (&shared.config.name, &shared.config.version, batch.len());
    let batch_span = spans::batch(batch.iter().map(|(e, _)| &e.request), model, version, size);
    let (slots, waiting): (Vec<Slot>, Vec<Waiting>) = batch
        .into_iter()
        .map(|(entry, waited)| {
            drop(entry.queued);
            let waiting = Waiting {
                reply: entry.reply,
                waited,
                decode: entry.decode,
                deadline: entry.deadline,
                span: spans::infer(&entry.request, &batch_span, model, version, size),
                request: entry.request,
            };
            (entry.slot, waiting)
        })
        .unzip();
    shared.running.fetch_add(1, Ordering::Relaxed);
    let outcome = batch_span.in_scope(|| detector.run_batch(&slots));
    shared.running.fetch_sub(1, Ordering::Relaxed);
    if let Err(EngineError::Backend(e @ BackendError::DeviceLost { .. })) = &outcome {
        tracing::error!(parent: &batch_span, model = %model, version = %version, error = %e, batch = size, "the GPU failed; this batch goes back to the queue");
        let batch = slots
            .into_iter()
            .zip(waiting)
            .map(|(slot, w)| Entry {
                slot,
                deadline: w.deadline,
                decode: w.decode,
                reply: w.reply,
                request: w.request,
                queued: tracing::Span::none(),
            })
            .collect();
        return Some(Lost {
            reason: e.to_string(),
            batch,
        });
    }
    // The canvases go back to the pool before anyone is answered.
    for canvas in slots.into_iter().filter_map(Slot::into_canvas) {
        shared.recycle(canvas);
    }
    match outcome {
        Ok((outputs, t)) => {
            let device = crate::rotation::device_label(detector.device());
            telemetry::batch_ran(model, &device, size, t.preprocess, t.inference, t.postprocess);
            let decode_total = waiting.iter().map(|w| w.decode).sum();
            shared.stats.batch(
                &BatchRun {
                    size,
                    input: t.preprocess,
                    infer: t.inference,
                    output: t.postprocess,
                },
                decode_total,
            );
            for (w, output) in waiting.into_iter().zip(outputs) {
                let timings = ItemTimings {
                    queue: w.waited,
                    batch: t.total(),
                    batch_size: size,
                };
                let _ = w.reply.send(Ok((output, timings)));
                // The request's part in the batch ends once it has its answer.
                drop(w.span);
            }
        }
        Err(e) => {
            tracing::error!(parent: &batch_span, model = %model, version = %version, error = %e, batch = size, "inference failed");
            for w in waiting {
                // Marks the request's span as failed in its trace (not a second log line).
                tracing::error!(target: spans::TARGET, parent: &w.span, error = %e, "inference failed");
                let _ = w.reply.send(Err(RequestError::Inference(e.to_string())));
            }
        }
    }
    None
}
