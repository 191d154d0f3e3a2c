//! One stream's analytics as plain state: each frame's detections go in, track ids and
//! object events come out. The worker thread around it only moves messages; nothing here
//! waits, reads a clock (times are the stream's PTS and the frame's capture time) or
//! touches a channel, so the tests drive it frame by frame.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use peregrine_track::{EndedTrack, TrackId, Tracker};
use peregrine_types::{BBox, ClassNames, Detection};
use peregrine_zones::{Analytics, TrackedBox, ZoneEvent, ZoneEventKind};

use super::config::{AnalyticsConfig, LineConfig, ResolvedAnalytics, ZoneConfig};
use super::objects::ObjectNotes;
use super::snapshot::Overlay;
use super::updates::UpdatePolicy;
use crate::event::{CrossDirection, DetectionEvent, ObjectChange, ObjectEvent, ObjectEventKind, ObjectState};
use crate::frame::Pts;

/// A track's best snapshot is replaced when a frame scores this much higher...
const BETTER_SNAPSHOT_SCORE: f32 = 0.05;
/// ...and at most this often (stream time), so a long track costs a few encodes.
const SNAPSHOT_REFRESH: Duration = Duration::from_secs(2);

/// An `object.update` to send: the track, its change, a new best snapshot if it has one.
struct DueUpdate {
    id: u64,
    change: ObjectChange,
    snapshot: Option<Arc<Vec<u8>>>,
}

/// Makes a snapshot of the current frame with `overlay` drawn: the full frame (`None`) or
/// around a box.
pub(crate) trait SnapshotSource {
    fn snapshot(&mut self, overlay: &Overlay<'_>, focus: Option<BBox>) -> Option<Arc<Vec<u8>>>;
}

pub(crate) struct StreamAnalytics {
    /// The settings as given, kept so that they can be resolved again when the model (and
    /// so its class names) changes.
    config: AnalyticsConfig,
    /// `config` resolved against `names`; `None` until a model has named its classes, or
    /// while `config` does not fit the model (see `error`).
    settings: Option<ResolvedAnalytics>,
    names: ClassNames,
    /// Why the settings do not apply (unknown class, zones outside the frame).
    error: Option<String>,
    tracker: Tracker,
    /// Built at the first frame, when the frame's size is known (pixel zones need it), and
    /// again if the size changes.
    zones: Option<Analytics>,
    /// The size of the stream's frames, once one has been seen.
    frame_size: Option<(u32, u32)>,
    /// Every live confirmed track, by id (so updates go out in a fixed order).
    notes: BTreeMap<u64, ObjectNotes>,
    /// When `object.update`s go out.
    updates: UpdatePolicy,
    /// PTS of the last frame: a stream whose clock jumps back (a reconnect) starts over.
    last_at: Option<Duration>,
    /// The last frame's times, to stamp events of tracks that end with the stream.
    last_frame: Option<FrameTimes>,
}

#[derive(Clone)]
struct FrameTimes {
    stream: Arc<str>,
    pts: Pts,
    capture: crate::frame::CaptureTime,
    width: u32,
    height: u32,
}

/// PTS as a non-negative duration from the stream's start.
fn stream_time(pts: Pts) -> Duration {
    Duration::from_secs_f64(pts.seconds.max(0.0))
}

impl StreamAnalytics {
    /// With the model's class names when known (empty: resolved at the first frame).
    pub fn new(config: AnalyticsConfig, names: ClassNames) -> Self {
        let mut s = Self {
            tracker: Tracker::new((&config.tracker).into()),
            updates: config.update_policy(),
            config,
            settings: None,
            names: ClassNames::default(),
            error: None,
            zones: None,
            frame_size: None,
            notes: BTreeMap::new(),
            last_at: None,
            last_frame: None,
        };
        if !names.is_empty() {
            s.settle(&names);
        }
        s
    }

    pub fn tracking(&self) -> bool {
        self.config.tracking
    }

    pub fn zones(&self) -> Option<&Analytics> {
        self.zones.as_ref()
    }

    pub fn error(&self) -> Option<&str> {
        self.error.as_deref()
    }

    pub fn live_tracks(&self) -> usize {
        self.tracker.live_tracks()
    }

    pub fn names(&self) -> &ClassNames {
        &self.names
    }

    /// Resolves the settings against `names` when they are new (the first frame, or a new
    /// model); a config that does not fit them turns analytics off, with the reason kept.
    fn settle(&mut self, names: &ClassNames) {
        if *names == self.names && (self.settings.is_some() || self.error.is_some()) {
            return;
        }
        self.names = names.clone();
        match self.config.resolve(names) {
            Ok(settings) => {
                self.settings = Some(settings);
                self.error = None;
                if let Some(size) = self.frame_size {
                    self.rebuild_zones(size);
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "the stream's analytics do not fit the model; they are off");
                self.settings = None;
                self.replace_zones(None);
                self.error = Some(e);
            }
        }
    }

    /// Replaces the zones, the lines or both (checked against the model's classes and the
    /// frame size, when known). Objects inside a replaced zone leave it without an event;
    /// counts start again.
    pub fn set_places(
        &mut self,
        zones: Option<Vec<ZoneConfig>>,
        lines: Option<Vec<LineConfig>>,
    ) -> Result<(), String> {
        if !self.config.tracking {
            return Err("zones and lines need tracking: this stream has analytics.tracking = false".into());
        }
        let mut config = self.config.clone();
        if let Some(z) = zones {
            config.zones = z;
        }
        if let Some(l) = lines {
            config.lines = l;
        }
        let settings = config.resolve(&self.names)?;
        // Built once here, against the frame size when one is known (`resolve` checked
        // what it could without one).
        let zones = match self.frame_size {
            Some(size) if settings.has_places() => Some(settings.build_zones(Some(size))?),
            _ => None,
        };
        self.config = config;
        self.settings = Some(settings);
        self.error = None;
        self.replace_zones(zones);
        Ok(())
    }

    fn rebuild_zones(&mut self, size: (u32, u32)) {
        self.replace_zones(None);
        let Some(settings) = &self.settings else { return };
        if !settings.has_places() {
            return;
        }
        match settings.build_zones(Some(size)) {
            Ok(a) => self.zones = Some(a),
            Err(e) => {
                tracing::warn!(error = %e, "zones do not fit the stream's frames; zone events are off");
                self.error = Some(e);
            }
        }
    }

    /// New zones start empty: every object is in none of them.
    fn replace_zones(&mut self, zones: Option<Analytics>) {
        self.zones = zones;
        for n in self.notes.values_mut() {
            n.zones_replaced();
        }
    }

    /// One frame: sets `event.track_ids` and returns the frame's object events, oldest
    /// cause first (tracks that ended, tracks that started, zones and lines, then the
    /// updates due).
    pub fn observe(
        &mut self,
        event: &mut DetectionEvent,
        snapshots: &mut dyn SnapshotSource,
    ) -> Vec<ObjectEvent> {
        event.track_ids = vec![None; event.detections.len()];
        if !self.config.tracking {
            return Vec::new();
        }
        self.settle(&event.class_names);
        let at = stream_time(event.pts);
        let mut out = Vec::new();
        if self.last_at.is_some_and(|last| at < last) {
            // The stream's clock went back (a reconnect restarts it): old tracks cannot
            // continue into the new timeline.
            out.extend(self.finish());
        }
        self.last_at = Some(at);
        self.last_frame = Some(FrameTimes {
            stream: event.stream.clone(),
            pts: event.pts,
            capture: event.capture,
            width: event.width,
            height: event.height,
        });
        if self.frame_size != Some((event.width, event.height)) {
            self.frame_size = Some((event.width, event.height));
            self.rebuild_zones((event.width, event.height));
        }
        let Some(settings) = &self.settings else {
            return out;
        };
        // Only the tracked classes reach the tracker; `index` maps back to the event.
        let index: Vec<usize> = (0..event.detections.len())
            .filter(|&i| settings.tracks_class(event.detections[i].class_id))
            .collect();
        let input: Vec<_> = index.iter().map(|&i| event.detections[i]).collect();
        let update = self.tracker.observe(&input, at);
        for (k, id) in update.assignments.iter().enumerate() {
            event.track_ids[index[k]] = id.map(|t| t.0);
        }
        for ended in &update.ended {
            out.extend(self.ended(ended));
        }
        for &(id, k) in &update.started {
            out.push(self.started(id, &input[k], event, at, snapshots));
        }
        self.note_sightings(event, at);
        self.refresh_best_snapshots(event, at, snapshots);
        out.extend(self.zone_events(event, at, snapshots));
        out.extend(self.object_updates(at));
        out
    }

    /// A track was confirmed: its notes, its first snapshot, its `object.start`.
    fn started(
        &mut self,
        id: TrackId,
        det: &Detection,
        event: &DetectionEvent,
        at: Duration,
        snapshots: &mut dyn SnapshotSource,
    ) -> ObjectEvent {
        let snapshot = self.take_snapshot(snapshots, event, det.bbox);
        // First seen while still tentative, a few frames back.
        let first_seen = self.tracker.track(id).map_or(at, |t| t.first_seen);
        let state = ObjectState {
            class_id: det.class_id,
            label: self.names.name(det.class_id).into_owned(),
            score: det.score,
            bbox: det.bbox,
            top_score: det.score,
            current_zones: Vec::new(),
            entered_zones: Vec::new(),
            loitering_zones: Vec::new(),
            stationary: false,
            snapshot_score: None,
            first_seen: (event.capture.wall)
                .checked_sub(at.saturating_sub(first_seen))
                .unwrap_or(event.capture.wall),
            last_seen: event.capture.wall,
        };
        let notes = ObjectNotes::new(state, snapshot.clone(), at);
        let change = notes.start_change();
        self.notes.insert(id.0, notes);
        let times = self.last_frame.clone().expect("observe sets it first");
        let mut start = self.object_event(
            &times,
            ObjectEventKind::Start,
            id.0,
            det.class_id,
            det.score,
            det.bbox,
            snapshot,
        );
        start.change = Some(Box::new(change));
        start
    }

    /// Each tracked detection of the frame into its object's state.
    fn note_sightings(&mut self, event: &DetectionEvent, at: Duration) {
        let stationary_after = self.updates.stationary_after;
        for (d, id) in event.detections.iter().zip(&event.track_ids) {
            if let Some(n) = id.and_then(|id| self.notes.get_mut(&id)) {
                n.seen(d, &self.names, (event.capture.wall, at), stationary_after);
            }
        }
    }

    /// The `object.update`s due at `at`, by track id.
    fn object_updates(&mut self, at: Duration) -> Vec<ObjectEvent> {
        let Some(interval) = self.updates.interval else {
            return Vec::new();
        };
        let Some(times) = self.last_frame.clone() else {
            return Vec::new();
        };
        let due: Vec<DueUpdate> = self
            .notes
            .iter_mut()
            .filter_map(|(&id, n)| {
                let change = n.update(at, interval)?;
                // A new best snapshot goes with the update that first tells of it.
                let snapshot = (change.before.snapshot_score != change.after.snapshot_score)
                    .then(|| n.best_snapshot.as_ref().map(|(_, s)| s.clone()))
                    .flatten();
                Some(DueUpdate { id, change, snapshot })
            })
            .collect();
        due.into_iter()
            .map(|DueUpdate { id, change, snapshot }| {
                let now = &change.after;
                let mut update = self.object_event(
                    &times,
                    ObjectEventKind::Update,
                    id,
                    now.class_id,
                    now.score,
                    now.bbox,
                    snapshot,
                );
                update.change = Some(Box::new(change));
                update
            })
            .collect()
    }

    /// The frame's tracked boxes through the zones and lines.
    fn zone_events(
        &mut self,
        event: &DetectionEvent,
        at: Duration,
        snapshots: &mut dyn SnapshotSource,
    ) -> Vec<ObjectEvent> {
        let Some(zones) = &mut self.zones else {
            return Vec::new();
        };
        let tracked = || {
            event
                .detections
                .iter()
                .zip(&event.track_ids)
                .filter_map(|(d, id)| id.map(|track| (track, d)))
        };
        let boxes: Vec<TrackedBox> = tracked()
            .map(|(track, d)| TrackedBox {
                track,
                class_id: d.class_id,
                bbox: d.bbox,
            })
            .collect();
        let happened = zones.observe(&boxes, at);
        for z in &happened {
            if let Some(n) = self.notes.get_mut(&z.track) {
                n.zone_event(&z.kind, &z.name);
            }
        }
        let times = self.last_frame.clone().expect("observe sets it first");
        happened
            .into_iter()
            .map(|z| {
                let score = tracked()
                    .find(|(t, _)| *t == z.track)
                    .map_or(0.0, |(_, d)| d.score);
                let snapshot = self.take_snapshot(snapshots, event, z.bbox);
                self.zone_event(&times, z, score, snapshot)
            })
            .collect()
    }

    /// The stream ended: every live track ends (and leaves its zones).
    pub fn finish(&mut self) -> Vec<ObjectEvent> {
        let ended = self.tracker.finish();
        // The tracker keeps counting ids, so ids are never reused on the stream.
        let out = ended.iter().flat_map(|e| self.ended(e)).collect();
        self.last_at = None;
        out
    }

    fn ended(&mut self, track: &EndedTrack) -> Vec<ObjectEvent> {
        let Some(times) = self.last_frame.clone() else {
            return Vec::new();
        };
        let mut notes = self.notes.remove(&track.id.0);
        let exits = match &mut self.zones {
            Some(zones) => zones.forget(track.id.0, track.last_seen),
            None => Vec::new(),
        };
        if let Some(n) = &mut notes {
            for z in &exits {
                n.zone_event(&z.kind, &z.name);
            }
        }
        let mut out: Vec<ObjectEvent> = exits
            .into_iter()
            .map(|z| self.zone_event(&times, z, track.best_score, None))
            .collect();
        // Wall-clock times of the track's first and last frames, from their PTS distance
        // to the current frame.
        let now = stream_time(times.pts);
        let wall = |pts: Duration| times.capture.wall - now.saturating_sub(pts);
        let kind = ObjectEventKind::End {
            first_seen: wall(track.first_seen),
            last_seen: wall(track.last_seen),
            best_score: track.best_score,
        };
        let change = notes.as_ref().map(|n| Box::new(n.end_change()));
        let snapshot = notes.and_then(|n| n.best_snapshot).map(|(_, s)| s);
        let mut end = self.object_event(
            &times,
            kind,
            track.id.0,
            track.class_id,
            track.best_score,
            track.best_box,
            snapshot,
        );
        end.change = change;
        out.push(end);
        out
    }

    fn take_snapshot(
        &self,
        snapshots: &mut dyn SnapshotSource,
        event: &DetectionEvent,
        focus: BBox,
    ) -> Option<Arc<Vec<u8>>> {
        if !self.config.snapshots {
            return None;
        }
        let overlay = Overlay {
            detections: &event.detections,
            track_ids: &event.track_ids,
            names: &self.names,
        };
        snapshots.snapshot(&overlay, self.config.snapshot_crop.then_some(focus))
    }

    /// Gives a track a better snapshot when it now scores clearly higher than in its
    /// current one (rate-limited per track).
    fn refresh_best_snapshots(
        &mut self,
        event: &DetectionEvent,
        at: Duration,
        snapshots: &mut dyn SnapshotSource,
    ) {
        if !self.config.snapshots {
            return;
        }
        for (d, id) in event.detections.iter().zip(&event.track_ids) {
            let Some(id) = id else { continue };
            let Some(n) = self.notes.get(id) else { continue };
            let best = n.best_snapshot.as_ref().map_or(0.0, |(s, _)| *s);
            if d.score < best + BETTER_SNAPSHOT_SCORE || at < n.last_snapshot_at + SNAPSHOT_REFRESH {
                continue;
            }
            let snapshot = self.take_snapshot(snapshots, event, d.bbox);
            if let (Some(s), Some(n)) = (snapshot, self.notes.get_mut(id)) {
                n.better_snapshot(d.score, s, at);
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn object_event(
        &self,
        times: &FrameTimes,
        kind: ObjectEventKind,
        track_id: u64,
        class_id: u32,
        score: f32,
        bbox: BBox,
        snapshot: Option<Arc<Vec<u8>>>,
    ) -> ObjectEvent {
        ObjectEvent {
            id: uuid::Uuid::now_v7().to_string().into(),
            stream: times.stream.clone(),
            kind,
            track_id,
            class_id,
            label: self.names.name(class_id).into_owned(),
            score,
            bbox,
            pts: times.pts,
            capture: times.capture,
            width: times.width,
            height: times.height,
            snapshot,
            change: None,
        }
    }

    fn zone_event(
        &self,
        times: &FrameTimes,
        z: ZoneEvent,
        score: f32,
        snapshot: Option<Arc<Vec<u8>>>,
    ) -> ObjectEvent {
        let kind = match z.kind {
            ZoneEventKind::Enter => ObjectEventKind::ZoneEnter { zone: z.name },
            ZoneEventKind::Exit => ObjectEventKind::ZoneExit { zone: z.name },
            ZoneEventKind::Loiter { inside_for } => ObjectEventKind::ZoneLoiter {
                zone: z.name,
                inside_for,
            },
            ZoneEventKind::Cross(d) => ObjectEventKind::LineCross {
                line: z.name,
                direction: match d {
                    peregrine_zones::Direction::In => CrossDirection::In,
                    peregrine_zones::Direction::Out => CrossDirection::Out,
                },
            },
        };
        self.object_event(times, kind, z.track, z.class_id, score, z.bbox, snapshot)
    }
}
