//! Each stream's analytics thread: it owns the stream's [`StreamAnalytics`] and its latest
//! frame, takes frames with their detections from the detection task and commands from
//! the API (zones, occupancy, the latest picture) on one bounded channel, and publishes
//! what comes out. Tracking and JPEG encoding never run on a tokio worker.

use std::sync::Arc;
use std::time::SystemTime;

use peregrine_types::{BBox, ClassNames};
use tokio::sync::{mpsc, oneshot};

use super::config::{AnalyticsConfig, LineConfig, ZoneConfig};
use super::report::{self, AnalyticsReport};
use super::snapshot::{self, Overlay};
use super::stream::{SnapshotSource, StreamAnalytics};
use crate::event::DetectionEvent;
use crate::fanout::StreamPublisher;
use crate::frame::Frame;

/// Messages queued for one stream's analytics thread. The detection task and API handlers
/// wait when it is full; the thread handles a frame in well under a millisecond unless it
/// encodes a snapshot, so the bound only holds back a detection task that outruns it.
pub(crate) const STAGE_QUEUE: usize = 8;

/// The newest picture of a stream, as a JPEG.
#[derive(Debug, Clone)]
pub struct LatestPicture {
    /// The frame's sequence number on its stream.
    pub seq: u64,
    pub capture: SystemTime,
    pub jpeg: Vec<u8>,
}

pub(crate) enum StageMessage {
    Frame {
        frame: Arc<Frame>,
        event: DetectionEvent,
    },
    /// Replaces the zones, the lines, or both (`None` keeps that set).
    SetPlaces {
        zones: Option<Vec<ZoneConfig>>,
        lines: Option<Vec<LineConfig>>,
        reply: oneshot::Sender<Result<(), String>>,
    },
    Report(oneshot::Sender<AnalyticsReport>),
    /// The latest frame, if it is newer than `after_seq`.
    Latest {
        annotate: bool,
        after_seq: Option<u64>,
        reply: oneshot::Sender<Option<LatestPicture>>,
    },
}

/// Starts a stream's analytics thread; it ends when every sender is dropped, after ending
/// the stream's live tracks.
pub(crate) fn spawn(
    stream: &str,
    config: AnalyticsConfig,
    names: ClassNames,
    publisher: StreamPublisher,
) -> Result<(mpsc::Sender<StageMessage>, std::thread::JoinHandle<()>), String> {
    let (tx, rx) = mpsc::channel(STAGE_QUEUE);
    let analytics = StreamAnalytics::new(config, names);
    let thread = std::thread::Builder::new()
        .name(format!("analytics-{stream}"))
        .spawn(move || run(rx, analytics, publisher))
        .map_err(|e| format!("cannot start its analytics thread: {e}"))?;
    Ok((tx, thread))
}

/// The latest frame with the detections published for it.
struct Latest {
    frame: Arc<Frame>,
    event: Arc<DetectionEvent>,
}

fn run(mut rx: mpsc::Receiver<StageMessage>, mut analytics: StreamAnalytics, publisher: StreamPublisher) {
    let mut latest: Option<Latest> = None;
    let mut gauges = report::ZoneGauges::default();
    while let Some(message) = rx.blocking_recv() {
        match message {
            StageMessage::Frame { frame, mut event } => {
                let mut source = FrameSnapshots {
                    frame: &frame,
                    full: None,
                };
                let objects = analytics.observe(&mut event, &mut source);
                let event = publisher.publish(event);
                publish_objects(&publisher, objects);
                if let Some(zones) = analytics.zones() {
                    gauges.update(&event.stream, zones, analytics.names());
                }
                // Replacing the previous frame gives its buffer back to the pool.
                latest = Some(Latest { frame, event });
            }
            StageMessage::SetPlaces { zones, lines, reply } => {
                let _ = reply.send(analytics.set_places(zones, lines));
            }
            StageMessage::Report(reply) => {
                let _ = reply.send(report::report(&analytics));
            }
            StageMessage::Latest {
                annotate,
                after_seq,
                reply,
            } => {
                let picture = latest
                    .as_ref()
                    .filter(|l| after_seq.is_none_or(|s| l.event.seq > s))
                    .and_then(|l| latest_picture(l, annotate, analytics.names()));
                let _ = reply.send(picture);
            }
        }
    }
    drop(latest);
    publish_objects(&publisher, analytics.finish());
}

/// Counts each object event and publishes it.
fn publish_objects(publisher: &StreamPublisher, objects: Vec<crate::event::ObjectEvent>) {
    for object in objects {
        report::object_event(&object);
        publisher.publish_object(object);
    }
}

fn latest_picture(latest: &Latest, annotate: bool, names: &ClassNames) -> Option<LatestPicture> {
    let overlay = Overlay {
        detections: &latest.event.detections,
        track_ids: &latest.event.track_ids,
        names,
    };
    let jpeg = snapshot::encode(&latest.frame, annotate.then_some(&overlay), None)?;
    Some(LatestPicture {
        seq: latest.event.seq,
        capture: latest.event.capture.wall,
        jpeg,
    })
}

/// Snapshots of the frame being analysed; the full frame is encoded at most once however
/// many events share it.
struct FrameSnapshots<'a> {
    frame: &'a Frame,
    full: Option<Option<Arc<Vec<u8>>>>,
}

impl SnapshotSource for FrameSnapshots<'_> {
    fn snapshot(&mut self, overlay: &Overlay<'_>, focus: Option<BBox>) -> Option<Arc<Vec<u8>>> {
        match focus {
            Some(b) => snapshot::encode(self.frame, Some(overlay), Some(b)).map(Arc::new),
            None => self
                .full
                .get_or_insert_with(|| snapshot::encode(self.frame, Some(overlay), None).map(Arc::new))
                .clone(),
        }
    }
}
