//! The hand-off to detection. [`FrameDetector`] is what the server implements on top of
//! its batching engine (many streams call it at once; it batches across them with a
//! latency cap). Each stream's detection task takes the newest frame from its slot, drops
//! it unrun if its staleness budget is already spent, and publishes what comes back.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::stream::{FuturesOrdered, StreamExt};
use peregrine_types::{ClassNames, Detection, WallClock};
use tokio::time::Instant;

use tokio::sync::mpsc;

use crate::analytics::worker::StageMessage;
use crate::event::DetectionEvent;
use crate::fanout::StreamPublisher;
use crate::frame::Frame;
use crate::latest::LatestSlot;
use crate::telemetry::{DropReason, StreamCounters};

/// Why a detector returned no detections for a frame.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum DetectError {
    /// The deadline passed before the frame could be computed; it was not computed.
    #[error("the frame's deadline passed before it could be computed")]
    DeadlineExceeded,
    /// The detector's queue is full; the frame was not computed.
    #[error("the detector is at capacity")]
    Overloaded,
    #[error("the detector is not available: {0}")]
    Unavailable(String),
    #[error("detection failed: {0}")]
    Failed(String),
}

/// Runs a model on frames. Called concurrently from every stream's detection task.
pub trait FrameDetector: Send + Sync + 'static {
    /// Detects objects in `frame` (it is shared with the stream's analytics, which keep the
    /// latest for snapshots; the buffer goes back to the pool when both let go). A frame
    /// that cannot start before `deadline` should fail with
    /// [`DetectError::DeadlineExceeded`] without being computed.
    fn detect(
        &self,
        frame: Arc<Frame>,
        deadline: std::time::Instant,
    ) -> BoxFuture<'static, Result<Vec<Detection>, DetectError>>;

    /// Names for the class ids this detector returns.
    fn class_names(&self) -> ClassNames {
        ClassNames::default()
    }
}

/// How long past its deadline a detector may take before the stream gives up on the frame,
/// so a detector that never answers cannot wedge a stream (or its removal).
const DETECT_GRACE: Duration = Duration::from_secs(2);

/// Where a detected frame goes.
pub(crate) enum FrameOutput {
    /// Straight out, without track ids (tests of this task alone).
    #[cfg_attr(not(test), allow(dead_code))]
    Publish(StreamPublisher),
    /// To the stream's analytics thread, which publishes. Waits when its queue is full.
    Analytics(mpsc::Sender<StageMessage>),
}

pub(crate) struct DetectionTask {
    pub slot: Arc<LatestSlot<Frame>>,
    pub detector: Arc<dyn FrameDetector>,
    pub staleness: Duration,
    pub counters: Arc<StreamCounters>,
    pub clock: Arc<dyn WallClock>,
    pub output: FrameOutput,
    /// Frames in detection at once, answered in the order they were taken (at least 1).
    pub in_flight: usize,
}

/// A frame whose detection came back (or failed), on its way out.
struct Detected {
    frame: Arc<Frame>,
    outcome: Result<Vec<Detection>, DetectError>,
}

impl DetectionTask {
    /// Runs until the slot closes (the decode thread ended). With `in_flight` over 1 the
    /// next frame is taken while earlier ones are still in detection, so a camera whose
    /// frames come faster than one detection's round trip can keep several model instances
    /// busy; answers are published in the order the frames were taken.
    pub async fn run(self) {
        let in_flight = self.in_flight.max(1);
        let mut running = FuturesOrdered::new();
        loop {
            tokio::select! {
                // Answers first: they free a place and keep the tracker's input in order.
                biased;
                Some(done) = running.next(), if !running.is_empty() => self.publish(done).await,
                frame = self.slot.take(), if running.len() < in_flight => match frame {
                    Some(frame) => running.extend(self.start(frame)),
                    None => break,
                },
            }
            // With frames always waiting and a detector that answers at once, nothing here
            // would yield: give the scheduler its turn.
            tokio::task::consume_budget().await;
        }
        while let Some(done) = running.next().await {
            self.publish(done).await;
        }
    }

    /// The frame's detection, or nothing when its staleness budget is already spent.
    fn start(&self, frame: Frame) -> Option<impl std::future::Future<Output = Detected>> {
        let deadline = frame.meta.capture.received + self.staleness;
        if Instant::now() >= deadline {
            self.counters.dropped(DropReason::Stale);
            return None;
        }
        let frame = Arc::new(frame);
        let call = self.detector.detect(frame.clone(), deadline.into_std());
        Some(async move {
            let outcome = match tokio::time::timeout_at(deadline + DETECT_GRACE, call).await {
                Ok(outcome) => outcome,
                Err(_) => Err(DetectError::DeadlineExceeded),
            };
            Detected { frame, outcome }
        })
    }

    async fn publish(&self, Detected { frame, outcome }: Detected) {
        let meta = &frame.meta;
        match outcome {
            Ok(detections) => {
                let published = self.clock.now();
                let latency = published.duration_since(meta.capture.wall).unwrap_or_default();
                self.counters.detected(latency);
                let event = DetectionEvent {
                    stream: meta.stream.clone(),
                    seq: meta.seq,
                    pts: meta.pts,
                    capture: meta.capture,
                    width: frame.width(),
                    height: frame.height(),
                    track_ids: Vec::new(),
                    detections,
                    class_names: self.detector.class_names(),
                    published,
                    latency,
                };
                match &self.output {
                    FrameOutput::Publish(p) => {
                        p.publish(event);
                    }
                    FrameOutput::Analytics(stage) => {
                        // Only fails when the analytics thread has gone, i.e. the stream
                        // is being removed.
                        let _ = stage.send(StageMessage::Frame { frame, event }).await;
                    }
                }
            }
            Err(DetectError::DeadlineExceeded) => self.counters.dropped(DropReason::Stale),
            Err(DetectError::Overloaded) => self.counters.dropped(DropReason::DetectorBusy),
            Err(e) => {
                self.counters.dropped(DropReason::DetectError);
                tracing::debug!(stream = %meta.stream, error = %e, "detection failed");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;

    use tokio::sync::broadcast;

    use super::*;
    use crate::fanout::{EventFanout, EventSubscription};
    use crate::frame::{test_meta, FramePool};

    /// Takes `work` per frame (simulated time), or answers `error` at once.
    struct SlowDetector {
        work: Duration,
        error: Option<DetectError>,
        calls: AtomicUsize,
        seen: Mutex<Vec<u64>>,
    }

    impl SlowDetector {
        fn new(work: Duration, error: Option<DetectError>) -> Arc<Self> {
            Arc::new(Self {
                work,
                error,
                calls: AtomicUsize::new(0),
                seen: Mutex::new(Vec::new()),
            })
        }
    }

    impl FrameDetector for SlowDetector {
        fn detect(
            &self,
            frame: Arc<Frame>,
            _deadline: std::time::Instant,
        ) -> BoxFuture<'static, Result<Vec<Detection>, DetectError>> {
            self.calls.fetch_add(1, Ordering::Relaxed);
            self.seen.lock().unwrap().push(frame.meta.seq);
            let (work, error) = (self.work, self.error.clone());
            Box::pin(async move {
                tokio::time::sleep(work).await;
                drop(frame);
                match error {
                    Some(e) => Err(e),
                    None => Ok(Vec::new()),
                }
            })
        }
    }

    struct Harness {
        slot: Arc<LatestSlot<Frame>>,
        counters: Arc<StreamCounters>,
        events: EventSubscription,
        task: tokio::task::JoinHandle<()>,
    }

    fn start(detector: Arc<dyn FrameDetector>, staleness: Duration) -> Harness {
        start_with(detector, staleness, Arc::new(peregrine_types::SystemWallClock), 1)
    }

    fn start_with_clock(
        detector: Arc<dyn FrameDetector>,
        staleness: Duration,
        clock: Arc<dyn WallClock>,
    ) -> Harness {
        start_with(detector, staleness, clock, 1)
    }

    fn start_with(
        detector: Arc<dyn FrameDetector>,
        staleness: Duration,
        clock: Arc<dyn WallClock>,
        in_flight: usize,
    ) -> Harness {
        let slot = Arc::new(LatestSlot::default());
        let counters = StreamCounters::new("test");
        let (stream_tx, stream_rx) = broadcast::channel(256);
        let task = tokio::spawn(
            DetectionTask {
                slot: slot.clone(),
                detector,
                staleness,
                counters: counters.clone(),
                clock,
                output: FrameOutput::Publish(StreamPublisher {
                    stream: stream_tx,
                    fanout: Arc::new(EventFanout {
                        all: broadcast::channel(4).0,
                        objects: broadcast::channel(4).0,
                        sinks: Vec::new(),
                    }),
                }),
                in_flight,
            }
            .run(),
        );
        Harness {
            slot,
            counters,
            events: EventSubscription::new(stream_rx, "test".into()),
            task,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_detector_gets_the_newest_frame_and_older_ones_are_dropped() {
        let detector = SlowDetector::new(Duration::from_millis(200), None);
        let mut h = start(detector.clone(), Duration::from_secs(1));
        let pool = FramePool::new(3);
        // 2 s of a 25 fps camera.
        for seq in 0..50 {
            let frame = pool.take(8, 8, test_meta(seq)).expect("pool never runs dry");
            if h.slot.put(frame).is_some() {
                h.counters.dropped(DropReason::Superseded);
            }
            tokio::time::sleep(Duration::from_millis(40)).await;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
        h.slot.close();
        h.task.await.unwrap();
        let s = h.counters.snapshot();
        let calls = detector.calls.load(Ordering::Relaxed) as u64;
        assert!(
            (10..=12).contains(&calls),
            "one frame per 200 ms of detection: {calls}"
        );
        assert_eq!(s.frames_detected, calls);
        assert_eq!(
            s.dropped(DropReason::Superseded) + calls,
            50,
            "every frame accounted for"
        );
        assert_eq!(s.dropped(DropReason::Stale), 0);
        // Each time the detector came back it got the frame that had just arrived.
        let seen = detector.seen.lock().unwrap().clone();
        for pair in seen.windows(2) {
            assert!(
                (4..=6).contains(&(pair[1] - pair[0])),
                "skipped to the newest: {seen:?}"
            );
        }
        let mut published = 0;
        while let Ok(Some(_)) = tokio::time::timeout(Duration::ZERO, h.events.recv()).await {
            published += 1;
        }
        assert_eq!(published, calls);
        assert_eq!(pool.outstanding(), 0, "every buffer went back to the pool");
    }

    #[tokio::test(start_paused = true)]
    async fn a_frame_past_its_staleness_budget_is_dropped_unrun() {
        let detector = SlowDetector::new(Duration::ZERO, None);
        let h = start(detector.clone(), Duration::from_millis(500));
        let pool = FramePool::new(2);
        let frame = pool.take(8, 8, test_meta(0)).unwrap();
        // The frame arrived, then the detection task was held up for 600 ms.
        tokio::time::sleep(Duration::from_millis(600)).await;
        h.slot.put(frame);
        tokio::time::sleep(Duration::from_millis(10)).await;
        h.slot.close();
        h.task.await.unwrap();
        assert_eq!(detector.calls.load(Ordering::Relaxed), 0, "never computed");
        assert_eq!(h.counters.snapshot().dropped(DropReason::Stale), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn detector_refusals_and_hangs_are_counted_by_reason() {
        for (error, work, reason) in [
            (
                Some(DetectError::DeadlineExceeded),
                Duration::ZERO,
                DropReason::Stale,
            ),
            (
                Some(DetectError::Overloaded),
                Duration::ZERO,
                DropReason::DetectorBusy,
            ),
            (
                Some(DetectError::Failed("x".into())),
                Duration::ZERO,
                DropReason::DetectError,
            ),
            // Never answers in time: given up after the deadline plus the grace.
            (None, Duration::from_secs(3600), DropReason::Stale),
        ] {
            let detector = SlowDetector::new(work, error);
            let h = start(detector, Duration::from_millis(100));
            let pool = FramePool::new(2);
            h.slot.put(pool.take(8, 8, test_meta(0)).unwrap());
            tokio::time::sleep(DETECT_GRACE + Duration::from_millis(200)).await;
            h.slot.close();
            h.task.await.unwrap();
            assert_eq!(h.counters.snapshot().dropped(reason), 1, "{reason:?}");
            assert_eq!(h.counters.snapshot().frames_detected, 0);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn latency_is_the_publish_time_minus_the_capture_time_on_the_injected_clock() {
        let captured = std::time::UNIX_EPOCH + Duration::from_secs(1_704_067_200);
        let clock = Arc::new(peregrine_types::ManualWallClock::new(captured));
        clock.advance(Duration::from_millis(300));
        let mut h = start_with_clock(
            SlowDetector::new(Duration::ZERO, None),
            Duration::from_secs(1),
            clock.clone(),
        );
        let pool = FramePool::new(2);
        for (seq, capture_offset) in [(0, Duration::ZERO), (1, Duration::from_secs(2))] {
            let mut meta = test_meta(seq);
            // The second frame's camera clock runs ahead of ours.
            meta.capture.wall = captured + capture_offset;
            h.slot.put(pool.take(8, 8, meta).unwrap());
            let event = h.events.recv().await.unwrap();
            assert_eq!(event.published, captured + Duration::from_millis(300));
            let expected = if seq == 0 {
                Duration::from_millis(300)
            } else {
                Duration::ZERO
            };
            assert_eq!(event.latency, expected, "frame {seq}");
        }
        h.slot.close();
        h.task.await.unwrap();
    }

    /// `frames` frames of a 25 fps camera, put into the harness's slot as they arrive.
    async fn camera(h: &Harness, pool: &FramePool, frames: u64) {
        for seq in 0..frames {
            let frame = pool.take(8, 8, test_meta(seq)).expect("pool never runs dry");
            if h.slot.put(frame).is_some() {
                h.counters.dropped(DropReason::Superseded);
            }
            tokio::time::sleep(Duration::from_millis(40)).await;
        }
    }

    async fn published_seqs(events: &mut EventSubscription) -> Vec<u64> {
        let mut seqs = Vec::new();
        while let Ok(Some(event)) = tokio::time::timeout(Duration::ZERO, events.recv()).await {
            seqs.push(event.seq);
        }
        seqs
    }

    #[tokio::test(start_paused = true)]
    async fn two_in_flight_keep_up_with_a_camera_faster_than_one_round_trip() {
        // 60 ms per detection against a frame every 40 ms: one at a time loses a third of
        // the frames; two at a time none.
        for (in_flight, expect_all) in [(1, false), (2, true)] {
            let detector = SlowDetector::new(Duration::from_millis(60), None);
            let clock = Arc::new(peregrine_types::SystemWallClock);
            let mut h = start_with(detector.clone(), Duration::from_secs(1), clock, in_flight);
            let pool = FramePool::new(in_flight + 3);
            camera(&h, &pool, 50).await;
            tokio::time::sleep(Duration::from_millis(200)).await;
            h.slot.close();
            h.task.await.unwrap();
            let s = h.counters.snapshot();
            assert_eq!(s.frames_detected + s.dropped(DropReason::Superseded), 50);
            if expect_all {
                assert_eq!(s.frames_detected, 50, "in flight {in_flight}");
            } else {
                assert!(
                    s.frames_detected <= 35,
                    "in flight {in_flight}: {}",
                    s.frames_detected
                );
            }
            let seqs = published_seqs(&mut h.events).await;
            assert_eq!(seqs.len() as u64, s.frames_detected);
            assert!(seqs.windows(2).all(|p| p[0] < p[1]), "in order: {seqs:?}");
            assert_eq!(pool.outstanding(), 0, "every buffer went back to the pool");
        }
    }

    /// Slow on even frames, fast on odd ones: later frames come back first.
    struct UnevenDetector;

    impl FrameDetector for UnevenDetector {
        fn detect(
            &self,
            frame: Arc<Frame>,
            _deadline: std::time::Instant,
        ) -> BoxFuture<'static, Result<Vec<Detection>, DetectError>> {
            let work = Duration::from_millis(if frame.meta.seq.is_multiple_of(2) { 70 } else { 5 });
            Box::pin(async move {
                tokio::time::sleep(work).await;
                Ok(Vec::new())
            })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn answers_that_come_back_out_of_order_are_published_in_order() {
        let clock = Arc::new(peregrine_types::SystemWallClock);
        let mut h = start_with(Arc::new(UnevenDetector), Duration::from_secs(1), clock, 3);
        let pool = FramePool::new(6);
        camera(&h, &pool, 30).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        h.slot.close();
        h.task.await.unwrap();
        let seqs = published_seqs(&mut h.events).await;
        assert_eq!(seqs, (0..30).collect::<Vec<_>>());
    }
}
