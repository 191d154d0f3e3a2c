//! The owner's side of online calibration (`crate::calibration`): a worker for each float
//! version it loads of a model that asks for one, and a sync of the model once a worker
//! has published its quantized version, so it loads (as a canary under a `[rollout]`)
//! without waiting for a repository poll.

use tokio::sync::mpsc;

use super::{Owner, Trigger};
use crate::calibration::worker::{self, Job, Outcome};
use crate::store::{ModelListing, ModelSource};

/// How one calibration ended, as its worker reports it.
pub(super) struct Finished {
    name: String,
    version: u64,
    outcome: Outcome,
}

/// The channel the workers report on. Each worker sends once; a full channel makes the
/// worker's thread wait, which costs nothing the server needs.
pub(super) struct Calibrations {
    sender: mpsc::Sender<Finished>,
    receiver: Option<mpsc::Receiver<Finished>>,
}

impl Calibrations {
    pub fn new() -> Self {
        let (sender, receiver) = mpsc::channel(16);
        Self {
            sender,
            receiver: Some(receiver),
        }
    }

    /// The receiving side, for the owner's loop (once).
    pub fn take_receiver(&mut self) -> mpsc::Receiver<Finished> {
        self.receiver
            .take()
            .expect("the owner's loop takes the receiver once")
    }
}

impl Owner {
    /// Starts a calibration for each of `loaded` (versions of `listing`'s model that just
    /// loaded) when the model's settings ask for one. Workers check the repository
    /// themselves for an earlier calibration of the same weights.
    pub(super) fn start_calibrations(&self, listing: &ModelListing, loaded: &[u64]) {
        let Some(calibration) = &listing.settings.calibration else {
            return;
        };
        if !matches!(self.config.source, ModelSource::Directory(_)) {
            tracing::warn!(model = %listing.name, "online calibration publishes into a model repository: serve with --model-repository; not calibrating");
            return;
        }
        let Some(state) = self.models.get(&listing.name) else {
            return;
        };
        for &version in loaded {
            let (Some(loaded), Some(listed)) = (
                state.loaded.get(&version),
                listing.versions.iter().find(|l| l.version == version),
            ) else {
                continue;
            };
            if worker::is_quantized(&loaded.engine.description().metadata) {
                continue;
            }
            let job = Job {
                name: listing.name.clone(),
                version,
                source_sha256: listed.fingerprint.hex(),
                weights: listed.weights.clone(),
                model_file: listing.settings.model_file.clone(),
                calibration: calibration.clone(),
                runtime_path: listing.settings.session.runtime_path.clone(),
            };
            let reports = self.calibrations.sender.clone();
            let started = worker::start(job, &loaded.engine, move |job, outcome| {
                let _ = reports.blocking_send(Finished {
                    name: job.name.clone(),
                    version: job.version,
                    outcome,
                });
            });
            if let Err(e) = started {
                tracing::error!(model = %listing.name, version, error = %e, "online calibration could not start its thread");
            }
        }
    }

    /// Logs how a calibration ended; a published version is loaded at once.
    pub(super) async fn calibration_finished(&mut self, f: Finished) {
        let (model, version) = (f.name.as_str(), f.version);
        metrics::counter!("peregrine_calibrations_total", "model" => model.to_string(), "outcome" => f.outcome.label())
            .increment(1);
        match f.outcome {
            Outcome::Published(new) => {
                tracing::info!(
                    model,
                    version,
                    published = new,
                    "online calibration done: the INT8 model is version {new}; loading it"
                );
                if let Err(e) = self.sync(model, Trigger::Poll).await {
                    tracing::warn!(model, version = new, error = %e, "the calibrated version did not load");
                }
            }
            Outcome::AlreadyCalibrated(by) => {
                tracing::info!(
                    model,
                    version,
                    calibrated = by,
                    "online calibration skipped: version {by} was calibrated from these weights"
                )
            }
            Outcome::AlreadyQuantized => {
                tracing::debug!(
                    model,
                    version,
                    "online calibration skipped: the version is quantized"
                )
            }
            Outcome::Disagreed(parity) => {
                tracing::warn!(model, version, "online calibration not published: below min_agreement, {parity}; the float version keeps serving (a restart calibrates again)")
            }
            Outcome::EngineStopped { seen } => {
                tracing::info!(model, version, seen, "online calibration abandoned: the version stopped serving before the sample was complete")
            }
            Outcome::Failed(reason) => {
                tracing::error!(model, version, error = %reason, "online calibration failed; the version keeps serving")
            }
        }
    }
}
