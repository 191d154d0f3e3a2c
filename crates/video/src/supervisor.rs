//! One supervisor task per stream, in the style of moonfire-nvr's streamers: `run_once`
//! (open, read, hand access units to the decode thread) inside a retry loop with bounded,
//! jittered exponential backoff that is forgiven after a healthy spell. Opening and every
//! frame have their own timeouts, so a camera that hangs is treated like one that fails.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::watch;
use tokio::time::Instant;

use crate::backoff::{Backoff, BackoffPolicy};
use crate::decode::DecodeWorker;
use crate::event::{EventFanout, StatusChange};
use crate::source::{Opener, SourceError};
use crate::telemetry::StreamCounters;

/// Where a stream is in its life.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamStatus {
    /// Opening the source (`attempt` counts from 1 since the last healthy connection).
    Connecting { attempt: u32 },
    /// Frames are arriving.
    Streaming { since: SystemTime },
    /// The last attempt failed; the next starts at `next_attempt`.
    BackingOff {
        last_error: String,
        attempt: u32,
        next_attempt: SystemTime,
    },
    /// No more attempts: removed, shut down, or a file that does not loop has ended.
    Stopped { reason: String },
}

impl StreamStatus {
    pub fn name(&self) -> &'static str {
        match self {
            Self::Connecting { .. } => "connecting",
            Self::Streaming { .. } => "streaming",
            Self::BackingOff { .. } => "backing_off",
            Self::Stopped { .. } => "stopped",
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct SupervisorConfig {
    pub stream: Arc<str>,
    pub connect_timeout: Duration,
    pub frame_timeout: Duration,
    pub backoff: BackoffPolicy,
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
        /// How long it streamed before failing (zero if it never delivered a frame).
        healthy_for: Duration,
    },
}

impl Supervisor {
    pub async fn run(mut self) {
        let mut backoff = Backoff::new(self.config.backoff.clone());
        let mut shutdown = self.shutdown.clone();
        let reason = loop {
            self.status.set(StreamStatus::Connecting {
                attempt: backoff.failures() + 1,
            });
            let ended = tokio::select! {
                biased;
                _ = stop_requested(&mut shutdown) => break "removed".to_string(),
                ended = self.run_once() => ended,
            };
            let (error, healthy_for) = match ended {
                Ended::EndOfStream => break "end of stream".to_string(),
                Ended::Failed { error, healthy_for } => (error, healthy_for),
            };
            if matches!(error, SourceError::DecoderGone) {
                break error.to_string();
            }
            let delay = backoff.next_delay(healthy_for, rand::random::<f64>());
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
                next_attempt: SystemTime::now() + delay,
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

    async fn run_once(&mut self) -> Ended {
        let mut streaming_since = None;
        match self.stream(&mut streaming_since).await {
            Ok(()) => Ended::EndOfStream,
            Err(error) => Ended::Failed {
                error,
                healthy_for: streaming_since.map(|t: Instant| t.elapsed()).unwrap_or_default(),
            },
        }
    }

    async fn stream(&mut self, streaming_since: &mut Option<Instant>) -> Result<(), SourceError> {
        let timeout_ms = |d: Duration| d.as_millis() as u64;
        let connect = self.config.connect_timeout;
        let mut source = tokio::time::timeout(connect, self.opener.open())
            .await
            .map_err(|_| SourceError::Timeout {
                what: "connecting",
                after_ms: timeout_ms(connect),
            })??;
        if let Some(p) = source.parameters() {
            self.worker.open(p.decoder.clone()).await?;
        }
        let frame_timeout = self.config.frame_timeout;
        let live = source.is_live();
        loop {
            let next = tokio::time::timeout(frame_timeout, source.next_frame())
                .await
                .map_err(|_| SourceError::Timeout {
                    what: "waiting for a frame",
                    after_ms: timeout_ms(frame_timeout),
                })??;
            let Some(frame) = next else { return Ok(()) };
            if streaming_since.is_none() {
                *streaming_since = Some(Instant::now());
                self.status.set(StreamStatus::Streaming {
                    since: SystemTime::now(),
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

/// Resolves when the stop flag turns true or its sender is dropped.
async fn stop_requested(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stop| *stop).await;
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use bytes::Bytes;
    use futures_util::future::BoxFuture;
    use tokio::sync::broadcast;

    use super::*;
    use crate::decode::DecodeWorkerConfig;
    use crate::frame::{CaptureTime, ClockSource, FramePool};
    use crate::latest::LatestSlot;
    use crate::source::{EncodedFrame, Source, StreamParameters};

    /// What one connection attempt of the fake camera does.
    #[derive(Debug, Clone, Copy)]
    enum Attempt {
        Refuse,
        HangOnConnect,
        /// Delivers `frames` frames `interval` apart, then does `then`.
        Stream {
            frames: u32,
            interval: Duration,
            then: Then,
        },
    }

    #[derive(Debug, Clone, Copy)]
    enum Then {
        Hang,
        Fail,
        End,
    }

    /// Plays a script of attempts (the last one repeats) and records when each began.
    struct ScriptedOpener {
        script: Vec<Attempt>,
        attempts: Mutex<Vec<Instant>>,
    }

    impl ScriptedOpener {
        fn new(script: Vec<Attempt>) -> Arc<Self> {
            Arc::new(Self {
                script,
                attempts: Mutex::new(Vec::new()),
            })
        }

        fn attempt_times(&self) -> Vec<Instant> {
            self.attempts.lock().unwrap().clone()
        }
    }

    impl Opener for ScriptedOpener {
        fn open(&self) -> BoxFuture<'static, Result<Box<dyn Source>, SourceError>> {
            let mut attempts = self.attempts.lock().unwrap();
            attempts.push(Instant::now());
            let step = self.script[(attempts.len() - 1).min(self.script.len() - 1)];
            Box::pin(async move {
                match step {
                    Attempt::Refuse => Err(SourceError::Connect {
                        url: "fake".into(),
                        reason: "refused".into(),
                    }),
                    Attempt::HangOnConnect => std::future::pending().await,
                    Attempt::Stream {
                        frames,
                        interval,
                        then,
                    } => Ok(Box::new(FakeSource {
                        left: frames,
                        interval,
                        then,
                        pts: 0,
                    }) as Box<dyn Source>),
                }
            })
        }

        fn describe(&self) -> String {
            "scripted camera".into()
        }
    }

    struct FakeSource {
        left: u32,
        interval: Duration,
        then: Then,
        pts: i64,
    }

    impl Source for FakeSource {
        fn parameters(&self) -> Option<&StreamParameters> {
            None
        }

        fn next_frame(&mut self) -> BoxFuture<'_, Result<Option<EncodedFrame>, SourceError>> {
            Box::pin(async move {
                if self.left == 0 {
                    return match self.then {
                        Then::Hang => std::future::pending().await,
                        Then::Fail => Err(SourceError::Stream {
                            url: "fake".into(),
                            reason: "reset".into(),
                        }),
                        Then::End => Ok(None),
                    };
                }
                tokio::time::sleep(self.interval).await;
                self.left -= 1;
                self.pts += 3600;
                Ok(Some(EncodedFrame {
                    data: Bytes::from_static(b"\x00\x00\x00\x01\x09"),
                    pts_90k: self.pts,
                    capture: CaptureTime {
                        wall: SystemTime::now(),
                        source: ClockSource::LocalReceive,
                        received: Instant::now(),
                    },
                    is_key: true,
                    new_parameters: None,
                }))
            })
        }
    }

    struct Harness {
        status: watch::Receiver<StreamStatus>,
        stop: watch::Sender<bool>,
        counters: Arc<StreamCounters>,
        task: tokio::task::JoinHandle<()>,
    }

    fn policy() -> BackoffPolicy {
        BackoffPolicy {
            initial: Duration::from_millis(100),
            max: Duration::from_millis(800),
            multiplier: 2.0,
            jitter: 0.0,
            reset_after: Duration::from_secs(5),
        }
    }

    fn start(opener: Arc<ScriptedOpener>) -> Harness {
        let stream: Arc<str> = "fake".into();
        let counters = StreamCounters::new(&stream);
        let worker = DecodeWorker::spawn(
            DecodeWorkerConfig {
                stream: stream.clone(),
                fps: None,
                queue: 8,
                pool: FramePool::new(2),
            },
            Arc::new(LatestSlot::default()),
            counters.clone(),
        )
        .unwrap();
        let (status_tx, status) = watch::channel(StreamStatus::Connecting { attempt: 1 });
        let (stop, stop_rx) = watch::channel(false);
        let supervisor = Supervisor {
            config: SupervisorConfig {
                stream: stream.clone(),
                connect_timeout: Duration::from_secs(2),
                frame_timeout: Duration::from_secs(1),
                backoff: policy(),
            },
            opener,
            worker,
            counters: counters.clone(),
            status: StatusReporter {
                stream,
                watch: status_tx,
                fanout: Arc::new(EventFanout {
                    all: broadcast::channel(4).0,
                    sinks: Vec::new(),
                }),
            },
            shutdown: stop_rx,
        };
        Harness {
            status,
            stop,
            counters,
            task: tokio::spawn(supervisor.run()),
        }
    }

    fn gaps(times: &[Instant]) -> Vec<u128> {
        times.windows(2).map(|w| (w[1] - w[0]).as_millis()).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn refused_connections_back_off_exponentially_up_to_the_cap() {
        let opener = ScriptedOpener::new(vec![Attempt::Refuse]);
        let mut h = start(opener.clone());
        tokio::time::sleep(Duration::from_millis(100 + 200 + 400 + 800 + 800 + 50)).await;
        assert_eq!(gaps(&opener.attempt_times()), [100, 200, 400, 800, 800]);
        let status = h.status.borrow_and_update().clone();
        let StreamStatus::BackingOff {
            last_error, attempt, ..
        } = status
        else {
            panic!("expected backing off, got {status:?}");
        };
        assert!(last_error.contains("refused"), "{last_error}");
        assert_eq!(attempt, 6);
        assert_eq!(h.counters.snapshot().reconnects, 5);
        h.stop.send(true).unwrap();
        h.task.await.unwrap();
        assert_eq!(
            *h.status.borrow(),
            StreamStatus::Stopped {
                reason: "removed".into()
            }
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_hanging_connect_and_a_silent_stream_both_time_out() {
        let opener = ScriptedOpener::new(vec![
            Attempt::HangOnConnect,
            Attempt::Stream {
                frames: 3,
                interval: Duration::from_millis(40),
                then: Then::Hang,
            },
            Attempt::Refuse,
        ]);
        let h = start(opener.clone());
        // connect timeout 2 s, backoff 100 ms, 3 frames (120 ms) + frame timeout 1 s, 200 ms.
        tokio::time::sleep(Duration::from_millis(2000 + 100 + 120 + 1000 + 200 + 50)).await;
        let t = opener.attempt_times();
        assert_eq!(gaps(&t[..3]), [2100, 1320]);
        assert_eq!(h.counters.snapshot().frames_received, 3);
        h.stop.send(true).unwrap();
        h.task.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_healthy_spell_resets_the_backoff() {
        let opener = ScriptedOpener::new(vec![
            Attempt::Refuse,
            Attempt::Refuse,
            Attempt::Refuse,
            // 6 s of frames: longer than reset_after (5 s).
            Attempt::Stream {
                frames: 150,
                interval: Duration::from_millis(40),
                then: Then::Fail,
            },
            Attempt::Refuse,
        ]);
        let h = start(opener.clone());
        tokio::time::sleep(Duration::from_millis(100 + 200 + 400 + 6000 + 100 + 50)).await;
        let g = gaps(&opener.attempt_times());
        assert_eq!(g[..3], [100, 200, 400]);
        // 6 s streaming, then the initial 100 ms again instead of the next step (800 ms).
        assert_eq!(
            g[3],
            6000 + 100,
            "schedule restarted after a healthy spell: {g:?}"
        );
        assert!(h.status.borrow().name() == "backing_off" || h.status.borrow().name() == "connecting");
        h.stop.send(true).unwrap();
        h.task.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn the_end_of_a_finite_source_stops_without_reconnecting() {
        let opener = ScriptedOpener::new(vec![Attempt::Stream {
            frames: 5,
            interval: Duration::from_millis(40),
            then: Then::End,
        }]);
        let h = start(opener.clone());
        h.task.await.unwrap();
        assert_eq!(opener.attempt_times().len(), 1);
        assert_eq!(
            *h.status.borrow(),
            StreamStatus::Stopped {
                reason: "end of stream".into()
            }
        );
        assert_eq!(h.counters.snapshot().frames_received, 5);
    }
}
