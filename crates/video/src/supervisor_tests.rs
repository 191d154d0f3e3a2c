//! The supervisor against scripted sources (refusals, hangs, silent and brief streams),
//! in paused tokio time.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::SystemTime;

use futures_util::future::BoxFuture;
use peregrine_types::{ManualWallClock, SystemWallClock};
use tokio::sync::broadcast;

use super::*;
use crate::decode::DecodeWorkerConfig;
use crate::frame::FramePool;
use crate::latest::LatestSlot;
use crate::source::file::{FileOpener, Pacing};
use crate::source::{EncodedFrame, Source, StreamParameters};

/// What one connection attempt of the fake camera does.
#[derive(Debug, Clone, Copy)]
enum Attempt {
    Refuse,
    HangOnConnect,
    /// Delivers `frames` frames of a real clip `interval` apart, then does `then`.
    Stream {
        frames: usize,
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

/// The first access units of a real clip, so the decode thread makes real pictures
/// and the supervisor can tell a working connection from one that only accepted.
struct ClipStart {
    parameters: StreamParameters,
    frames: Vec<EncodedFrame>,
}

async fn clip_start(frames: usize) -> Arc<ClipStart> {
    let opener = FileOpener {
        path: crate::test_clips::clip("bikes.mp4"),
        looped: false,
        pacing: Pacing::AsFastAsPossible,
        decode_threads: 1,
        clock: Arc::new(SystemWallClock),
    };
    let mut source = opener.open().await.expect("open the clip");
    let parameters = source.parameters().expect("parameters").clone();
    let mut taken = Vec::new();
    while taken.len() < frames {
        taken.push(source.next_frame().await.unwrap().expect("clip long enough"));
    }
    Arc::new(ClipStart {
        parameters,
        frames: taken,
    })
}

/// Plays a script of attempts (the last one repeats) and records when each began.
struct ScriptedOpener {
    script: Vec<Attempt>,
    clip: Arc<ClipStart>,
    /// The decode worker's [`DecodeWorker::picture_epoch`].
    picture_epoch: Arc<AtomicU64>,
    attempts: Mutex<Vec<Instant>>,
    /// Connections opened so far: each opens the decoder once, so this is the epoch
    /// of the decoder that the latest connection's frames go to.
    connections: AtomicU64,
}

impl ScriptedOpener {
    fn attempt_times(&self) -> Vec<Instant> {
        self.attempts.lock().unwrap().clone()
    }
}

impl Opener for ScriptedOpener {
    fn open(&self) -> BoxFuture<'static, Result<Box<dyn Source>, SourceError>> {
        let mut attempts = self.attempts.lock().unwrap();
        attempts.push(Instant::now());
        let step = self.script[(attempts.len() - 1).min(self.script.len() - 1)];
        let clip = self.clip.clone();
        let picture_epoch = self.picture_epoch.clone();
        let epoch = match step {
            Attempt::Stream { .. } => self.connections.fetch_add(1, Ordering::Relaxed) + 1,
            _ => 0,
        };
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
                    picture_epoch,
                    epoch,
                    clip,
                    sent: 0,
                    frames,
                    interval,
                    then,
                }) as Box<dyn Source>),
            }
        })
    }

    fn describe(&self) -> String {
        "scripted camera".into()
    }
}

struct FakeSource {
    clip: Arc<ClipStart>,
    picture_epoch: Arc<AtomicU64>,
    /// The decoder epoch of this connection.
    epoch: u64,
    sent: usize,
    frames: usize,
    interval: Duration,
    then: Then,
}

impl FakeSource {
    /// Before a connection that delivered frames ends, lets the decode thread (a real
    /// thread, in real time) finish a picture from them, holding the paused clock: the
    /// test then decides, not the race between the two clocks, whether it worked.
    fn wait_for_a_picture(&self) {
        if self.sent == 0 {
            return;
        }
        let started = std::time::Instant::now();
        while self.picture_epoch.load(Ordering::Acquire) != self.epoch {
            assert!(
                started.elapsed() < std::time::Duration::from_secs(10),
                "the decoder made no picture from {} frames",
                self.sent
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
}

impl Source for FakeSource {
    fn parameters(&self) -> Option<&StreamParameters> {
        Some(&self.clip.parameters)
    }

    fn next_frame(&mut self) -> BoxFuture<'_, Result<Option<EncodedFrame>, SourceError>> {
        Box::pin(async move {
            if self.sent == self.frames {
                self.wait_for_a_picture();
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
            let frame = self.clip.frames[self.sent].clone();
            self.sent += 1;
            Ok(Some(frame))
        })
    }
}

struct Harness {
    opener: Arc<ScriptedOpener>,
    status: watch::Receiver<StreamStatus>,
    stop: watch::Sender<bool>,
    counters: Arc<StreamCounters>,
    task: tokio::task::JoinHandle<()>,
}

/// When the harness's wall clock (which stands still) shows.
fn wall_start() -> SystemTime {
    std::time::UNIX_EPOCH + Duration::from_secs(1_704_067_200)
}

fn policy() -> BackoffPolicy {
    BackoffPolicy {
        first_retry: Duration::from_millis(50),
        initial: Duration::from_millis(100),
        max: Duration::from_millis(800),
        multiplier: 2.0,
        jitter: 0.0,
        min_connection_interval: Duration::from_secs(1),
        first_connect_timeout: Duration::from_millis(500),
        first_frame_timeout: Duration::from_millis(400),
    }
}

/// The longest script step streams this many frames.
const CLIP_FRAMES: usize = 40;

async fn start(script: Vec<Attempt>) -> Harness {
    let stream: Arc<str> = "fake".into();
    let counters = StreamCounters::new(&stream);
    let worker = DecodeWorker::spawn(
        DecodeWorkerConfig {
            stream: stream.clone(),
            fps: None,
            // Room for a few steps' frames: the paused clock hands them over at once,
            // and a full queue would drop them or hold the decoder's open.
            queue: 4 * CLIP_FRAMES,
            pool: FramePool::new(2),
            clock: Arc::new(SystemWallClock),
            plan: crate::decode::DecodePlan::Cpu { reason: None },
            status: crate::decode::DecoderStatusCell::new(crate::decode::DecoderKind::Cpu, None),
            gpu_frames: false,
        },
        Arc::new(LatestSlot::default()),
        counters.clone(),
    )
    .unwrap();
    let opener = Arc::new(ScriptedOpener {
        script,
        clip: clip_start(CLIP_FRAMES).await,
        picture_epoch: worker.picture_epoch(),
        attempts: Mutex::new(Vec::new()),
        connections: AtomicU64::new(0),
    });
    let (status_tx, status) = watch::channel(StreamStatus::Connecting { attempt: 1 });
    let (stop, stop_rx) = watch::channel(false);
    let supervisor = Supervisor {
        config: SupervisorConfig {
            stream: stream.clone(),
            connect_timeout: Duration::from_secs(2),
            frame_timeout: Duration::from_secs(1),
            backoff: policy(),
            clock: Arc::new(ManualWallClock::new(wall_start())),
        },
        opener: opener.clone(),
        worker,
        counters: counters.clone(),
        status: StatusReporter {
            stream,
            watch: status_tx,
            fanout: Arc::new(EventFanout {
                all: broadcast::channel(4).0,
                objects: broadcast::channel(4).0,
                sinks: Vec::new(),
            }),
        },
        shutdown: stop_rx,
    };
    Harness {
        opener,
        status,
        stop,
        counters,
        task: tokio::spawn(supervisor.run()),
    }
}

impl Harness {
    /// Waits (simulated time) until `n` attempts have begun; their gaps in ms.
    async fn gaps_of_first(&self, n: usize) -> Vec<u128> {
        while self.opener.attempt_times().len() < n {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let times = self.opener.attempt_times();
        times[..n].windows(2).map(|w| (w[1] - w[0]).as_millis()).collect()
    }

    async fn stop(self) -> StreamStatus {
        self.stop.send(true).unwrap();
        self.task.await.unwrap();
        let status = self.status.borrow().clone();
        status
    }
}

fn stream(frames: usize, then: Then) -> Attempt {
    Attempt::Stream {
        frames,
        interval: Duration::from_millis(40),
        then,
    }
}

#[tokio::test(start_paused = true)]
async fn refused_connections_back_off_exponentially_up_to_the_cap() {
    let mut h = start(vec![Attempt::Refuse]).await;
    assert_eq!(h.gaps_of_first(6).await, [100, 200, 400, 800, 800]);
    let status = h.status.borrow_and_update().clone();
    let StreamStatus::BackingOff {
        last_error,
        attempt,
        next_attempt,
    } = status
    else {
        panic!("expected backing off, got {status:?}");
    };
    assert!(last_error.contains("refused"), "{last_error}");
    assert_eq!(attempt, 6);
    assert_eq!(
        next_attempt,
        wall_start() + Duration::from_millis(800),
        "now + delay"
    );
    assert_eq!(h.counters.snapshot().reconnects, 5);
    assert_eq!(
        h.stop().await,
        StreamStatus::Stopped {
            reason: "removed".into()
        }
    );
}

#[tokio::test(start_paused = true)]
async fn a_hanging_connect_and_a_silent_stream_both_time_out() {
    let h = start(vec![
        Attempt::HangOnConnect,
        stream(3, Then::Hang),
        Attempt::Refuse,
    ])
    .await;
    // The first attempt's limit (500 ms), then 100 ms; 3 frames (120 ms) and the frame
    // timeout (1 s), then the fast first retry (50 ms): those frames decoded, so the
    // connection worked.
    assert_eq!(h.gaps_of_first(3).await, [600, 1170]);
    assert_eq!(h.counters.snapshot().frames_received, 3);
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_working_connection_forgives_the_failures_before_it() {
    let refuse = Attempt::Refuse;
    // 40 frames (1.6 s), a failure, then refusals again.
    let h = start(vec![refuse, refuse, refuse, stream(40, Then::Fail), refuse]).await;
    let g = h.gaps_of_first(7).await;
    assert_eq!(
        g,
        [100, 200, 400, 1600 + 50, 100, 200],
        "the next outage starts with the fast retry and the schedule from the start"
    );
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_camera_that_streams_briefly_and_drops_reconnects_at_most_once_per_interval() {
    // 10 frames (400 ms) and a reset, every time: each connection works, so the
    // backoff never grows, but the rate cap spaces them 1 s apart.
    let h = start(vec![stream(10, Then::Fail)]).await;
    assert_eq!(h.gaps_of_first(5).await, [1000, 1000, 1000, 1000]);
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_camera_that_accepts_but_sends_nothing_is_tried_at_most_once_per_interval() {
    // Each attempt opens and fails at once: the camera answers, so refusals before it
    // are forgiven, but its own failures grow (100, 200, 400, 800 ms) under the rate
    // cap (1 s from each start).
    let refuse = Attempt::Refuse;
    let h = start(vec![refuse, refuse, refuse, refuse, stream(0, Then::Fail)]).await;
    assert_eq!(h.gaps_of_first(8).await, [100, 200, 400, 800, 1000, 1000, 1000]);
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_camera_back_from_an_outage_but_silent_at_first_is_retried_soon() {
    // Refused four times (the outage), then a connection that opens but stays silent
    // past its first-frame limit (400 ms; the camera is still starting its encoder),
    // then one that streams: the silent one proves the camera answers, so the next
    // attempt comes after `initial` (100 ms), held to the rate cap (1 s from its
    // start), not after the outage's grown delay (1600 ms, capped at 800) on top of
    // the whole frame timeout.
    let refuse = Attempt::Refuse;
    let h = start(vec![
        refuse,
        refuse,
        refuse,
        refuse,
        stream(0, Then::Hang),
        stream(5, Then::Hang),
    ])
    .await;
    assert_eq!(h.gaps_of_first(6).await, [100, 200, 400, 800, 1000]);
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_camera_slow_to_send_its_first_frame_gets_a_longer_limit_next_time() {
    // Frames 600 ms apart: past the first limit (400 ms), so the first attempt ends
    // silent and the next begins 1 s after it (the rate cap); its limit is doubled
    // (800 ms), the first frame arrives, and the stream stays up on that connection.
    let slow = Attempt::Stream {
        frames: 5,
        interval: Duration::from_millis(600),
        then: Then::Hang,
    };
    let h = start(vec![slow]).await;
    assert_eq!(h.gaps_of_first(2).await, [1000]);
    while h.counters.snapshot().frames_received < 5 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        h.opener.attempt_times().len(),
        2,
        "one silent attempt, then one that streamed"
    );
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn attempts_that_hang_get_a_longer_limit_each_time_up_to_the_connect_timeout() {
    // First limit 500 ms, doubled by each hang up to the connect timeout (2 s); the
    // delays after the hangs grow as failures do (100, 200, 400, 800 ms).
    let hang = Attempt::HangOnConnect;
    let h = start(vec![hang, hang, hang, hang, stream(5, Then::Hang)]).await;
    assert_eq!(
        h.gaps_of_first(5).await,
        [500 + 100, 1000 + 200, 2000 + 400, 2000 + 800]
    );
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn the_end_of_a_finite_source_stops_without_reconnecting() {
    let h = start(vec![stream(5, Then::End)]).await;
    let (opener, counters, status) = (h.opener.clone(), h.counters.clone(), h.status.clone());
    h.task.await.unwrap();
    assert_eq!(opener.attempt_times().len(), 1);
    assert_eq!(
        *status.borrow(),
        StreamStatus::Stopped {
            reason: "end of stream".into()
        }
    );
    assert_eq!(counters.snapshot().frames_received, 5);
}
