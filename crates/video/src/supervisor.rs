//! One supervisor task per stream, in the style of moonfire-nvr's streamers: `run_once`
//! (open, read, hand access units to the decode thread) inside a retry loop with bounded,
//! jittered exponential backoff, forgiven as soon as a connection decodes a picture (see
//! [`crate::backoff`]). Opening and every frame have their own timeouts, so a camera that
//! hangs is treated like one that fails.

use std::sync::Arc;
use std::time::Duration;

use peregrine_types::WallClock;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::backoff::{Backoff, BackoffPolicy};
use crate::decode::DecodeWorker;
use crate::event::{StatusChange, StreamStatus};
use crate::fanout::EventFanout;
use crate::source::{Opener, SourceError};
use crate::telemetry::StreamCounters;

#[derive(Debug, Clone)]
pub(crate) struct SupervisorConfig {
    pub stream: Arc<str>,
    pub connect_timeout: Duration,
    pub frame_timeout: Duration,
    pub backoff: BackoffPolicy,
    pub clock: Arc<dyn WallClock>,
}

/// Publishes status changes to the status watch and to the sinks.
pub(crate) struct StatusReporter {
    pub stream: Arc<str>,
    pub watch: watch::Sender<StreamStatus>,
    pub fanout: Arc<EventFanout>,
}

impl StatusReporter {
    fn set(&self, status: StreamStatus) {
        self.watch.send_replace(status.clone());
        self.fanout.status(StatusChange {
            stream: self.stream.clone(),
            status,
        });
    }
}

pub(crate) struct Supervisor {
    pub config: SupervisorConfig,
    pub opener: Arc<dyn Opener>,
    pub worker: DecodeWorker,
    pub counters: Arc<StreamCounters>,
    pub status: StatusReporter,
    /// Turns true (or is dropped) when the stream must stop.
    pub shutdown: watch::Receiver<bool>,
}

/// How one connection ended.
enum Ended {
    /// A finite source finished: stop, do not reconnect.
    EndOfStream,
    Failed {
        error: SourceError,
        /// When the attempt began.
        started: Instant,
        /// How far it got.
        reached: Reached,
    },
}

/// How long one attempt may wait to open, and then for its first frame.
#[derive(Debug, Clone, Copy)]
struct AttemptLimits {
    connect: Duration,
    first_frame: Duration,
}

/// How far a failed attempt got, which decides the delay before the next one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reached {
    /// No answer: refused, unreachable, or an error before the stream opened.
    Nothing,
    /// Opening hung until its limit.
    Hung,
    /// The stream opened, but no picture was decoded from it.
    Answered,
    /// The decoder produced a picture from this connection.
    Worked,
}

impl Supervisor {
    pub async fn run(mut self) {
        let mut backoff = Backoff::new(self.config.backoff.clone());
        let mut shutdown = self.shutdown.clone();
        let reason = loop {
            self.status.set(StreamStatus::Connecting {
                attempt: backoff.failures() + 1,
            });
            let limits = AttemptLimits {
                connect: backoff.connect_timeout(self.config.connect_timeout),
                first_frame: backoff.first_frame_timeout(self.config.frame_timeout),
            };
            let ended = tokio::select! {
                biased;
                _ = stop_requested(&mut shutdown) => break "removed".to_string(),
                ended = self.run_once(limits) => ended,
            };
            let (error, started, reached) = match ended {
                Ended::EndOfStream => break "end of stream".to_string(),
                Ended::Failed {
                    error,
                    started,
                    reached,
                } => (error, started, reached),
            };
            if matches!(error, SourceError::DecoderGone) {
                break error.to_string();
            }
            let (now, random) = (Instant::now(), rand::random::<f64>());
            let delay = match reached {
                Reached::Worked => backoff.after_working(started, now, random),
                Reached::Answered => backoff.after_answered(started, now, random),
                Reached::Hung => backoff.after_hang(random),
                Reached::Nothing => backoff.after_failure(random),
            };
            tracing::warn!(
                stream = %self.config.stream,
                source = %self.opener.describe(),
                error = %error,
                retry_in_ms = delay.as_millis() as u64,
                "stream failed; reconnecting after a backoff"
            );
            self.status.set(StreamStatus::BackingOff {
                last_error: error.to_string(),
                attempt: backoff.failures(),
                next_attempt: self.config.clock.now() + delay,
            });
            tokio::select! {
                biased;
                _ = stop_requested(&mut shutdown) => break "removed".to_string(),
                _ = tokio::time::sleep(delay) => {}
            }
            self.counters.reconnected();
        };
        self.status.set(StreamStatus::Stopped { reason });
        // Closing the decode thread's input ends it, which closes the frame slot and so
        // ends the detection task: one signal stops the whole stream.
        self.worker.shut_down().await;
    }

    async fn run_once(&mut self, limits: AttemptLimits) -> Ended {
        let started = Instant::now();
        let epoch_before = self.worker.epoch();
        let mut opened = false;
        match self.stream(limits, &mut opened).await {
            Ok(()) => Ended::EndOfStream,
            Err(error) => {
                // Only a picture from a decoder this connection opened shows it worked.
                let worked = self.worker.epoch() > epoch_before && self.worker.decoded_since_open();
                let reached = if worked {
                    Reached::Worked
                } else if opened {
                    Reached::Answered
                } else if matches!(error, SourceError::Timeout { what: CONNECTING, .. }) {
                    Reached::Hung
                } else {
                    Reached::Nothing
                };
                Ended::Failed {
                    error,
                    started,
                    reached,
                }
            }
        }
    }

    /// Opens the source within its limit (setting `opened` once it has) and hands its frames
    /// to the decoder until it fails or ends.
    async fn stream(&mut self, limits: AttemptLimits, opened: &mut bool) -> Result<(), SourceError> {
        let timeout_ms = |d: Duration| d.as_millis() as u64;
        let mut source = tokio::time::timeout(limits.connect, self.opener.open())
            .await
            .map_err(|_| SourceError::Timeout {
                what: CONNECTING,
                after_ms: timeout_ms(limits.connect),
            })??;
        *opened = true;
        if let Some(p) = source.parameters() {
            self.worker.open(p.decoder.clone()).await?;
        }
        let live = source.is_live();
        let mut streaming = false;
        loop {
            let frame_timeout = if streaming {
                self.config.frame_timeout
            } else {
                limits.first_frame
            };
            let next = tokio::time::timeout(frame_timeout, source.next_frame())
                .await
                .map_err(|_| SourceError::Timeout {
                    what: "waiting for a frame",
                    after_ms: timeout_ms(frame_timeout),
                })??;
            let Some(frame) = next else { return Ok(()) };
            if !streaming {
                streaming = true;
                self.status.set(StreamStatus::Streaming {
                    since: self.config.clock.now(),
                });
            }
            self.counters.received();
            if let Some(p) = &frame.new_parameters {
                self.worker.open(p.decoder.clone()).await?;
            }
            if live {
                self.worker.push(frame)?;
                // A source whose frames are always ready must still let the stop signal
                // and other tasks in.
                tokio::task::consume_budget().await;
            } else {
                self.worker.push_waiting(frame).await?;
            }
        }
    }
}

/// What an attempt that hung while opening reports (`SourceError::Timeout::what`).
const CONNECTING: &str = "connecting";

/// Resolves when the stop flag turns true or its sender is dropped.
async fn stop_requested(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stop| *stop).await;
}

#[cfg(test)]
#[path = "supervisor_tests.rs"]
mod tests;
