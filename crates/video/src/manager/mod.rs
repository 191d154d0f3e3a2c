//! The set of running streams, owned by one task. Everyone else holds a cloneable
//! [`StreamManagerHandle`] and sends it commands that carry their own reply channel; streams
//! are added and removed while the others keep running.
//!
//! A stream is four pieces: its supervisor task (source, reconnects), its decode thread,
//! its detection task and its analytics thread. Removing it sets its stop flag; the
//! supervisor then closes the decode thread's input, the thread ends and closes the frame
//! slot, the detection task ends after the frame it is on, and the analytics thread ends
//! the stream's live tracks once the last sender to it is gone. `remove` answers once all
//! four have finished.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use peregrine_types::{SystemWallClock, WallClock};
use tokio::sync::{broadcast, mpsc, oneshot, watch};
use tokio::task::JoinHandle;

use crate::analytics::config::{LineConfig, ZoneConfig};
use crate::analytics::report::AnalyticsReport;
use crate::analytics::worker::{self as analytics, LatestPicture, StageMessage};
use crate::config::{redact_url, ConfigError, StreamConfig};
use crate::decode::{
    DecodePlan, DecodeWorker, DecodeWorkerConfig, DecoderDefaults, DecoderStatus, DecoderStatusCell,
};
use crate::detect::{DetectionTask, FrameDetector, FrameOutput};
use crate::event::{DetectionEvent, StreamStatus};
use crate::fanout::{EventFanout, EventSubscription, ObjectSubscription, SinkQueue, StreamPublisher};
use crate::frame::FramePool;
use crate::latest::LatestSlot;
use crate::policy::{HostResolver, StreamPolicy, SystemResolver, UrlPolicy, UrlRefusal};
use crate::shard::{ShardAssignment, ShardPlacement};
use crate::source::gb28181::LivePlay;
use crate::source::Opener;
use crate::supervisor::{StatusReporter, Supervisor, SupervisorConfig};
use crate::telemetry::{CounterSnapshot, StreamCounters};

mod handle;
mod trim;

pub use handle::StreamManagerHandle;

/// Commands waiting for the owner task. Senders wait when it is full; commands are small
/// and handled at once, so the bound only caps memory if the task were stuck.
const COMMAND_QUEUE: usize = 64;
/// Longest wait for a removed stream's tasks before they are aborted.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// Failures of stream management requests.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum ManagerError {
    #[error("a stream named {0:?} already exists")]
    Duplicate(String),
    #[error("no stream named {0:?}")]
    NotFound(String),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("cannot start stream {name:?}: {reason}")]
    Start { name: String, reason: String },
    /// A zone or line definition (or its classes) is wrong; the message says what.
    #[error("stream {name:?}: {problem}")]
    Places { name: String, problem: String },
    /// Another shard runs this stream (rendezvous hashing of its name decides).
    #[error("stream {name:?} belongs to shard {owner} of {count}, and this server is shard {index}: send it to shard {owner}")]
    Misdirected {
        name: String,
        owner: u32,
        index: u32,
        count: u32,
    },
    /// The stream URL policy refuses the stream's URL; nothing of it was opened.
    #[error("stream url refused: {refusal}")]
    Refused { name: String, refusal: UrlRefusal },
    /// The policy settings themselves are unusable (at start-up only).
    #[error("stream_policy: {0}")]
    Policy(String),
    #[error("the stream manager has shut down")]
    ShutDown,
}

impl ManagerError {
    /// A refusal, logged here so that every one is (with the URL's password redacted).
    fn refused(config: &StreamConfig, refusal: UrlRefusal) -> Self {
        let (stream, url) = (&config.name, redact_url(&config.url));
        tracing::warn!(%stream, %url, reason = %refusal, "stream url refused by the stream policy");
        let name = config.name.clone();
        Self::Refused { name, refusal }
    }
}

/// What the manager is built with, besides the streams.
#[derive(Clone)]
pub struct ManagerOptions {
    pub detector: Arc<dyn FrameDetector>,
    /// Every sink's queue; each gets every event and status change.
    pub sinks: Vec<SinkQueue>,
    /// Events buffered per stream for a subscriber that falls behind (it then loses the
    /// oldest).
    pub stream_events: usize,
    /// The same for the all-streams feed.
    pub all_events: usize,
    /// Wall-clock readings (capture times of files, publish times, "next attempt at");
    /// the system's clock unless a test sets its own.
    pub clock: Arc<dyn WallClock>,
    /// Which of the configured streams this server runs, and which ones added at run time
    /// it accepts: those its shard owns (one shard, the default, owns all).
    pub shard: ShardAssignment,
    /// Which stream URLs may be opened; refused ones are answered with
    /// [`ManagerError::Refused`].
    pub stream_policy: StreamPolicy,
    /// Resolves camera host names for the policy (the system's unless a test answers).
    pub resolver: Arc<dyn HostResolver>,
    /// The decoder of streams that name none, and the GPUs `auto` decodes on.
    pub decoder: DecoderDefaults,
    /// The server's GB28181 signalling, for `gb28181://` streams (`None`: GB28181 is off
    /// and such streams are refused).
    pub live_play: Option<Arc<dyn LivePlay>>,
}

impl ManagerOptions {
    pub fn new(detector: Arc<dyn FrameDetector>) -> Self {
        Self {
            detector,
            sinks: Vec::new(),
            stream_events: 64,
            all_events: 256,
            clock: Arc::new(SystemWallClock),
            shard: ShardAssignment::default(),
            stream_policy: StreamPolicy::default(),
            resolver: Arc::new(SystemResolver),
            decoder: DecoderDefaults::default(),
            live_play: None,
        }
    }
}

/// One stream as `list` reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamSummary {
    pub name: String,
    /// Where it connects (credentials removed).
    pub source: String,
    pub status: StreamStatus,
}

/// One stream in detail.
#[derive(Debug, Clone)]
pub struct StreamReport {
    pub name: String,
    pub source: String,
    pub status: StreamStatus,
    pub counters: CounterSnapshot,
    /// The stream's definition, with any password in its URL redacted.
    pub config: StreamConfig,
    /// Frame buffers in use (of `config.frame_pool`).
    pub frames_in_use: usize,
    /// Of those, pictures left in GPU memory (`--gpu-frames`).
    pub frames_on_gpu: usize,
    /// What decodes the stream (CPU or NVDEC) and why.
    pub decoder: DecoderStatus,
}

enum Command {
    Add {
        // Boxed: a definition is large beside the other commands.
        config: Box<StreamConfig>,
        opener: Option<Arc<dyn Opener>>,
        reply: oneshot::Sender<Result<(), ManagerError>>,
    },
    Remove {
        name: String,
        reply: oneshot::Sender<Result<(), ManagerError>>,
    },
    List(oneshot::Sender<Vec<StreamSummary>>),
    Status {
        name: String,
        reply: oneshot::Sender<Result<StreamReport, ManagerError>>,
    },
    Subscribe {
        name: Option<String>,
        reply: oneshot::Sender<Result<EventSubscription, ManagerError>>,
    },
    SubscribeObjects(oneshot::Sender<ObjectSubscription>),
    /// A sender to the stream's analytics thread (for one request: holding it keeps the
    /// thread alive).
    Analytics {
        name: String,
        reply: oneshot::Sender<Result<mpsc::Sender<StageMessage>, ManagerError>>,
    },
    /// The analytics thread took new zones or lines: record them in the stream's config.
    Placed {
        name: String,
        zones: Option<Vec<ZoneConfig>>,
        lines: Option<Vec<LineConfig>>,
    },
    Shutdown(oneshot::Sender<()>),
}

/// Starts the owner task. Call inside a tokio runtime.
pub struct StreamManager;

impl StreamManager {
    /// Starts with those of `streams` its shard owns (all validated and judged by the
    /// policy first: one bad or refused definition fails the start, on every shard alike).
    pub async fn start(
        options: ManagerOptions,
        streams: Vec<StreamConfig>,
    ) -> Result<StreamManagerHandle, ManagerError> {
        let policy =
            UrlPolicy::new(&options.stream_policy, options.resolver.clone()).map_err(ManagerError::Policy)?;
        let policy = Arc::new(policy);
        for s in &streams {
            admit(&policy, s).await?;
        }
        let shard = options.shard;
        let (streams, skipped) = shard.split(streams);
        let (tx, rx) = mpsc::channel(COMMAND_QUEUE);
        let (all, _) = broadcast::channel(options.all_events.max(1));
        let (objects, _) = broadcast::channel(options.all_events.max(1));
        let owner = Owner {
            fanout: Arc::new(EventFanout {
                all,
                objects,
                sinks: options.sinks.clone(),
            }),
            options,
            trimmer: trim::Trimmer::start(trim::release_free_memory),
            policy: policy.clone(),
            streams: BTreeMap::new(),
        };
        tokio::spawn(owner.run(rx));
        let handle = StreamManagerHandle {
            commands: tx,
            placement: Arc::new(ShardPlacement { shard, skipped }),
            policy,
        };
        // Every one was admitted above.
        for s in streams {
            handle.add_admitted(s).await?;
        }
        Ok(handle)
    }
}

/// Checks a definition and judges its URL by the policy (resolving an RTSP host: done by
/// the caller, so a slow DNS answer never holds up the owner task).
async fn admit(policy: &UrlPolicy, config: &StreamConfig) -> Result<(), ManagerError> {
    config.validate()?;
    let source = config.source_url()?;
    policy
        .admit(&source)
        .await
        .map_err(|refusal| ManagerError::refused(config, refusal))
}

struct RunningStream {
    config: StreamConfig,
    source: String,
    status: watch::Receiver<StreamStatus>,
    counters: Arc<StreamCounters>,
    events: broadcast::Sender<Arc<DetectionEvent>>,
    pool: FramePool,
    decoder: DecoderStatusCell,
    stop: watch::Sender<bool>,
    supervisor: JoinHandle<()>,
    detection: JoinHandle<()>,
    analytics: mpsc::Sender<StageMessage>,
    analytics_thread: std::thread::JoinHandle<()>,
}

impl RunningStream {
    /// Signals the stop and waits for both tasks (and so the decode thread), then for the
    /// analytics thread, which ends once the detection task and this are gone.
    async fn stop(mut self) {
        let _ = self.stop.send(true);
        for task in [&mut self.supervisor, &mut self.detection] {
            if tokio::time::timeout(STOP_TIMEOUT, &mut *task).await.is_err() {
                tracing::error!(stream = %self.config.name, "stream task did not stop in time; aborting it");
                task.abort();
            }
        }
        drop(self.analytics);
        let thread = self.analytics_thread;
        let joined = tokio::task::spawn_blocking(move || thread.join());
        if tokio::time::timeout(STOP_TIMEOUT, joined).await.is_err() {
            tracing::error!(stream = %self.config.name, "analytics thread did not stop in time");
        }
    }
}

struct Owner {
    options: ManagerOptions,
    trimmer: trim::Trimmer,
    policy: Arc<UrlPolicy>,
    fanout: Arc<EventFanout>,
    streams: BTreeMap<String, RunningStream>,
}

impl Owner {
    async fn run(mut self, mut rx: mpsc::Receiver<Command>) {
        while let Some(command) = rx.recv().await {
            match command {
                Command::Add {
                    config,
                    opener,
                    reply,
                } => {
                    let _ = reply.send(self.add(*config, opener));
                }
                Command::Remove { name, reply } => match self.streams.remove(&name) {
                    // Stopping takes a moment; the owner keeps serving meanwhile.
                    Some(stream) => {
                        let trimmer = self.trimmer.clone();
                        tokio::spawn(async move {
                            stream.stop().await;
                            trimmer.stream_stopped();
                            let _ = reply.send(Ok(()));
                        });
                    }
                    None => {
                        let _ = reply.send(Err(self.missing(name)));
                    }
                },
                Command::List(reply) => {
                    let list = self
                        .streams
                        .values()
                        .map(|s| StreamSummary {
                            name: s.config.name.clone(),
                            source: s.source.clone(),
                            status: s.status.borrow().clone(),
                        })
                        .collect();
                    let _ = reply.send(list);
                }
                Command::Status { name, reply } => {
                    let report = self
                        .streams
                        .get(&name)
                        .map(|s| StreamReport {
                            name: s.config.name.clone(),
                            source: s.source.clone(),
                            status: s.status.borrow().clone(),
                            counters: s.counters.snapshot(),
                            config: s.config.redacted(),
                            frames_in_use: s.pool.outstanding(),
                            frames_on_gpu: s.pool.on_device(),
                            decoder: s.decoder.get(),
                        })
                        .ok_or_else(|| self.missing(name));
                    let _ = reply.send(report);
                }
                Command::Subscribe { name, reply } => {
                    let sub = match name {
                        None => Ok(EventSubscription::new(self.fanout.all.subscribe(), "*".into())),
                        Some(name) => match self.streams.get(&name) {
                            Some(s) => Ok(EventSubscription::new(s.events.subscribe(), name.into())),
                            None => Err(self.missing(name)),
                        },
                    };
                    let _ = reply.send(sub);
                }
                Command::SubscribeObjects(reply) => {
                    let _ = reply.send(ObjectSubscription::new(
                        self.fanout.objects.subscribe(),
                        "*objects".into(),
                    ));
                }
                Command::Analytics { name, reply } => {
                    let stage = match self.streams.get(&name) {
                        Some(s) => Ok(s.analytics.clone()),
                        None => Err(self.missing(name)),
                    };
                    let _ = reply.send(stage);
                }
                Command::Placed { name, zones, lines } => {
                    if let Some(s) = self.streams.get_mut(&name) {
                        if let Some(z) = zones {
                            s.config.analytics.zones = z;
                        }
                        if let Some(l) = lines {
                            s.config.analytics.lines = l;
                        }
                    }
                }
                Command::Shutdown(reply) => {
                    let stopping: Vec<_> = std::mem::take(&mut self.streams)
                        .into_values()
                        .map(|s| tokio::spawn(s.stop()))
                        .collect();
                    for s in stopping {
                        let _ = s.await;
                    }
                    let _ = reply.send(());
                    return;
                }
            }
        }
        // Every handle is gone: stop the streams, as nobody can reach them any more.
        for (_, s) in std::mem::take(&mut self.streams) {
            s.stop().await;
        }
    }

    /// How many running streams each GPU's NVDEC was given.
    fn nvdec_streams(&self) -> BTreeMap<i32, usize> {
        let mut load = BTreeMap::new();
        for gpu in self.streams.values().filter_map(|s| s.decoder.get().gpu) {
            *load.entry(gpu).or_default() += 1;
        }
        load
    }

    /// The error for a stream this server does not run: another shard's, or none at all.
    fn missing(&self, name: String) -> ManagerError {
        let shard = self.options.shard;
        match shard.claim(&name) {
            Ok(()) => ManagerError::NotFound(name),
            Err(owner) => ManagerError::Misdirected {
                name,
                owner,
                index: shard.index(),
                count: shard.count(),
            },
        }
    }

    fn add(&mut self, config: StreamConfig, opener: Option<Arc<dyn Opener>>) -> Result<(), ManagerError> {
        config.validate()?;
        if !self.options.shard.owns(&config.name) {
            let refused = self.missing(config.name);
            tracing::info!(error = %refused, "stream refused");
            return Err(refused);
        }
        if self.streams.contains_key(&config.name) {
            return Err(ManagerError::Duplicate(config.name));
        }
        // Judged again: the file opened is the canonical path judged now.
        let opener = match opener {
            Some(o) => o,
            None => config
                .opener(
                    config.source_url()?,
                    &self.options.clock,
                    &self.policy,
                    self.options.live_play.as_ref(),
                )
                .map_err(|refusal| ManagerError::refused(&config, refusal))?,
        };
        // Class names are the model's: checked before anything of the stream starts, when
        // a model is ready to name them (else at the stream's first frame).
        let names = self.options.detector.class_names();
        if !names.is_empty() {
            config.analytics.resolve(&names).map_err(|problem| {
                ManagerError::Config(ConfigError {
                    name: config.name.clone(),
                    problem,
                })
            })?;
        }
        let name: Arc<str> = config.name.as_str().into();
        let counters = StreamCounters::new(&name);
        let pool = FramePool::new(config.frame_pool);
        let slot = Arc::new(LatestSlot::default());
        let plan = self
            .options
            .decoder
            .plan(config.decoder, config.gpu, &self.nvdec_streams());
        let planned_gpu = match &plan {
            DecodePlan::Nvdec { device, .. } => Some(*device),
            DecodePlan::Cpu { .. } => None,
        };
        let decoder =
            DecoderStatusCell::new(config.decoder.unwrap_or(self.options.decoder.kind), planned_gpu);
        let worker = DecodeWorker::spawn(
            DecodeWorkerConfig {
                stream: name.clone(),
                fps: config.fps,
                queue: config.decode_queue,
                pool: pool.clone(),
                clock: self.options.clock.clone(),
                gpu_frames: self.options.decoder.keeps_frames_on_gpu(&plan),
                plan,
                status: decoder.clone(),
            },
            slot.clone(),
            counters.clone(),
        )
        .map_err(|e| ManagerError::Start {
            name: config.name.clone(),
            reason: format!("cannot start its decode thread: {e}"),
        })?;
        let source = opener.describe();
        let (status_tx, status_rx) = watch::channel(StreamStatus::Connecting { attempt: 1 });
        let (stop_tx, stop_rx) = watch::channel(false);
        let (events, _) = broadcast::channel(self.options.stream_events.max(1));
        let supervisor = Supervisor {
            config: SupervisorConfig {
                stream: name.clone(),
                connect_timeout: Duration::from_millis(config.connect_timeout_ms),
                frame_timeout: Duration::from_millis(config.frame_timeout_ms),
                backoff: (&config.backoff).into(),
                clock: self.options.clock.clone(),
            },
            opener,
            worker,
            counters: counters.clone(),
            status: StatusReporter {
                stream: name.clone(),
                watch: status_tx,
                fanout: self.fanout.clone(),
            },
            shutdown: stop_rx,
        };
        let publisher = StreamPublisher {
            stream: events.clone(),
            fanout: self.fanout.clone(),
        };
        let (stage, analytics_thread) = analytics::spawn(&name, config.analytics.clone(), names, publisher)
            .map_err(|reason| ManagerError::Start {
            name: config.name.clone(),
            reason,
        })?;
        let detection = DetectionTask {
            slot,
            detector: self.options.detector.clone(),
            staleness: config.staleness(),
            counters: counters.clone(),
            clock: self.options.clock.clone(),
            output: FrameOutput::Analytics(stage.clone()),
            in_flight: config.detect_in_flight,
        };
        tracing::info!(stream = %name, source = %source, "stream added");
        let running = RunningStream {
            source,
            status: status_rx,
            counters,
            events,
            pool,
            decoder,
            stop: stop_tx,
            supervisor: tokio::spawn(supervisor.run()),
            detection: tokio::spawn(detection.run()),
            analytics: stage,
            analytics_thread,
            config,
        };
        self.streams.insert(running.config.name.clone(), running);
        Ok(())
    }
}
