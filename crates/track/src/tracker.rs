//! The tracker: per frame, predict every track, associate in two stages, confirm, start and
//! end tracks. The order of every step follows `trackers.ByteTrackTracker.update` so that, fed
//! the same detections frame by frame, the two make the same choices.

use std::time::Duration;

use peregrine_types::{BBox, Detection};

use crate::assignment::{maximum_weight_assignment, WeightMatrix};
use crate::config::TrackerConfig;
use crate::kalman::{corners, BoxFilter, Corners};

/// A confirmed track's id: per tracker, from 1, never reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TrackId(pub u64);

/// What a confirmed track has seen so far (or, once ended, in all).
#[derive(Debug, Clone, PartialEq)]
pub struct TrackSummary {
    pub id: TrackId,
    /// The class of its best-scoring detection (with `class_aware`, the class of all of them).
    pub class_id: u32,
    /// Media time of its first detection (while still tentative).
    pub first_seen: Duration,
    /// Media time of its latest detection.
    pub last_seen: Duration,
    pub best_score: f32,
    /// The box of its best-scoring detection, as detected (not filtered).
    pub best_box: BBox,
    /// The box of its latest detection, as detected.
    pub last_box: BBox,
    /// Detections matched to it, the tentative ones included.
    pub hits: u32,
}

/// A track that has ended (`object.end`): its whole history.
pub type EndedTrack = TrackSummary;

/// What one frame changed.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TrackUpdate {
    /// One per input detection, same order: the confirmed track it belongs to (None: not
    /// tracked: below thresholds, not finite, or a tentative track).
    pub assignments: Vec<Option<TrackId>>,
    /// Tracks confirmed in this frame (`object.start`), with the index of their detection.
    pub started: Vec<(TrackId, usize)>,
    /// Tracks that died in this frame (`object.end`), lost for longer than `lost_after`.
    pub ended: Vec<EndedTrack>,
}

#[derive(Debug, Clone)]
struct Track {
    filter: BoxFilter,
    /// None while tentative.
    id: Option<TrackId>,
    /// The class it matches when class-aware: its first detection's.
    match_class: u32,
    /// `number_of_successful_consecutive_updates` in `trackers`: the first detection counts,
    /// a missed frame resets it at the next predict.
    consecutive_hits: u32,
    /// Predicts since the last match (`time_since_update`).
    frames_since_match: u32,
    best_class: u32,
    first_seen: Duration,
    last_seen: Duration,
    best_score: f32,
    best_box: BBox,
    last_box: BBox,
    hits: u32,
}

impl Track {
    fn new(detection: &Detection, at: Duration) -> Self {
        Self {
            filter: BoxFilter::new(corners(&detection.bbox)),
            id: None,
            match_class: detection.class_id,
            consecutive_hits: 1,
            frames_since_match: 0,
            best_class: detection.class_id,
            first_seen: at,
            last_seen: at,
            best_score: detection.score,
            best_box: detection.bbox,
            last_box: detection.bbox,
            hits: 1,
        }
    }

    fn predict(&mut self) {
        self.filter.predict();
        if self.frames_since_match > 0 {
            self.consecutive_hits = 0;
        }
        self.frames_since_match += 1;
    }

    fn record_match(&mut self, detection: &Detection, at: Duration) {
        self.filter.update(corners(&detection.bbox));
        self.frames_since_match = 0;
        self.consecutive_hits += 1;
        self.hits += 1;
        self.last_seen = at;
        self.last_box = detection.bbox;
        if detection.score > self.best_score {
            self.best_score = detection.score;
            self.best_box = detection.bbox;
            self.best_class = detection.class_id;
        }
    }

    fn summary(&self) -> Option<TrackSummary> {
        Some(TrackSummary {
            id: self.id?,
            class_id: self.best_class,
            first_seen: self.first_seen,
            last_seen: self.last_seen,
            best_score: self.best_score,
            best_box: self.best_box,
            last_box: self.last_box,
            hits: self.hits,
        })
    }
}

/// One stream's multi-object tracker. Plain state: feed it each frame's detections with the
/// frame's media time; it never looks at a clock.
#[derive(Debug, Clone)]
pub struct Tracker {
    config: TrackerConfig,
    tracks: Vec<Track>,
    last_id: u64,
}

/// One association stage's outcome, as indices into the stage's inputs.
struct StageMatches {
    pairs: Vec<(usize, usize)>,
    unmatched_tracks: Vec<usize>,
    unmatched_detections: Vec<usize>,
}

impl Tracker {
    /// A tracker with `config`, which the caller has validated ([`TrackerConfig::validate`]).
    pub fn new(config: TrackerConfig) -> Self {
        Self {
            config,
            tracks: Vec::new(),
            last_id: 0,
        }
    }

    pub fn config(&self) -> &TrackerConfig {
        &self.config
    }

    /// One frame's detections at media time `at`. Call once per observed frame, in order,
    /// frames without detections included: the motion model advances one frame per call.
    pub fn observe(&mut self, detections: &[Detection], at: Duration) -> TrackUpdate {
        let mut update = TrackUpdate {
            assignments: vec![None; detections.len()],
            ..TrackUpdate::default()
        };
        for track in &mut self.tracks {
            track.predict();
        }
        let predicted: Vec<Corners> = self.tracks.iter().map(|t| t.filter.position()).collect();
        let mut unmatched_high = Vec::new();
        for class in self.match_groups(detections) {
            let in_group = |c: u32| class.is_none_or(|class| class == c);
            let tracks: Vec<usize> = (0..self.tracks.len())
                .filter(|&t| in_group(self.tracks[t].match_class))
                .collect();
            let (high, low) = self.split_by_score(detections, in_group);
            let first = self.associate(&tracks, &high, &predicted, detections);
            for &(t, d) in &first.pairs {
                self.record_match(tracks[t], high[d], detections, at, &mut update);
            }
            let remaining: Vec<usize> = first.unmatched_tracks.iter().map(|&t| tracks[t]).collect();
            let second = self.associate(&remaining, &low, &predicted, detections);
            for &(t, d) in &second.pairs {
                self.record_match(remaining[t], low[d], detections, at, &mut update);
            }
            unmatched_high.extend(first.unmatched_detections.iter().map(|&d| high[d]));
        }
        unmatched_high.sort_unstable();
        for d in unmatched_high {
            if detections[d].score >= self.config.new_track_score {
                self.tracks.push(Track::new(&detections[d], at));
            }
        }
        update.ended = self.prune(at);
        update
    }

    /// End of stream, or the stream removed: every live track ends.
    pub fn finish(&mut self) -> Vec<EndedTrack> {
        self.tracks.drain(..).filter_map(|t| t.summary()).collect()
    }

    /// Confirmed tracks alive now (matched lately, or lost for less than `lost_after`).
    pub fn live_tracks(&self) -> usize {
        self.tracks.iter().filter(|t| t.id.is_some()).count()
    }

    /// A live confirmed track's history so far (for snapshots: its best score and box).
    pub fn track(&self, id: TrackId) -> Option<TrackSummary> {
        self.tracks
            .iter()
            .find(|t| t.id == Some(id))
            .and_then(Track::summary)
    }

    /// The classes associated separately: each class present when class-aware, else one group
    /// of everything (`None`).
    fn match_groups(&self, detections: &[Detection]) -> Vec<Option<u32>> {
        if !self.config.class_aware {
            return vec![None];
        }
        let mut classes: Vec<u32> = self.tracks.iter().map(|t| t.match_class).collect();
        classes.extend(detections.iter().map(|d| d.class_id));
        classes.sort_unstable();
        classes.dedup();
        classes.into_iter().map(Some).collect()
    }

    /// The group's usable detections (finite, at least `low_score`), split at `high_score`.
    fn split_by_score(
        &self,
        detections: &[Detection],
        in_group: impl Fn(u32) -> bool,
    ) -> (Vec<usize>, Vec<usize>) {
        let usable = detections.iter().enumerate().filter(|(_, d)| {
            let b = &d.bbox;
            in_group(d.class_id)
                && d.score >= self.config.low_score
                && [d.score, b.x1, b.y1, b.x2, b.y2].iter().all(|v| v.is_finite())
        });
        usable.map(|(i, d)| (i, d.score >= self.config.high_score)).fold(
            (Vec::new(), Vec::new()),
            |(mut high, mut low), (i, is_high)| {
                if is_high {
                    high.push(i);
                } else {
                    low.push(i);
                }
                (high, low)
            },
        )
    }

    /// Optimal IoU assignment of `tracks` (predicted boxes) to `candidates`; pairs under
    /// `match_iou` are dropped after solving, as `trackers` does.
    fn associate(
        &self,
        tracks: &[usize],
        candidates: &[usize],
        predicted: &[Corners],
        detections: &[Detection],
    ) -> StageMatches {
        let boxes: Vec<Corners> = candidates.iter().map(|&d| corners(&detections[d].bbox)).collect();
        let iou = WeightMatrix::from_fn(tracks.len(), candidates.len(), |t, d| {
            box_iou(&predicted[tracks[t]], &boxes[d])
        });
        let mut track_free = vec![true; tracks.len()];
        let mut candidate_free = vec![true; candidates.len()];
        let threshold = f64::from(self.config.match_iou);
        let pairs: Vec<(usize, usize)> = maximum_weight_assignment(&iou)
            .into_iter()
            .filter(|&(t, d)| iou.get(t, d) >= threshold)
            .inspect(|&(t, d)| {
                track_free[t] = false;
                candidate_free[d] = false;
            })
            .collect();
        let free = |flags: Vec<bool>| {
            flags
                .into_iter()
                .enumerate()
                .filter(|f| f.1)
                .map(|f| f.0)
                .collect()
        };
        StageMatches {
            pairs,
            unmatched_tracks: free(track_free),
            unmatched_detections: free(candidate_free),
        }
    }

    fn record_match(
        &mut self,
        track_index: usize,
        detection_index: usize,
        detections: &[Detection],
        at: Duration,
        update: &mut TrackUpdate,
    ) {
        let min_hits = self.config.min_hits;
        let track = &mut self.tracks[track_index];
        track.record_match(&detections[detection_index], at);
        if track.id.is_none() && track.consecutive_hits >= min_hits {
            self.last_id += 1;
            let id = TrackId(self.last_id);
            track.id = Some(id);
            update.started.push((id, detection_index));
        }
        update.assignments[detection_index] = track.id;
    }

    /// Drops tracks lost past `lost_after`, and tentative tracks that missed this frame before
    /// reaching `min_hits`; returns the confirmed ones dropped.
    fn prune(&mut self, at: Duration) -> Vec<EndedTrack> {
        let (lost_after, min_hits) = (self.config.lost_after, self.config.min_hits);
        let mut ended = Vec::new();
        self.tracks.retain(|t| {
            let within_budget = at.saturating_sub(t.last_seen) <= lost_after;
            let mature = t.id.is_some() || t.consecutive_hits >= min_hits;
            let keep = within_budget && (mature || t.frames_since_match == 0);
            if !keep {
                ended.extend(t.summary());
            }
            keep
        });
        ended
    }
}

/// IoU as `supervision.box_iou_batch` computes it: in `f64`, returned as `f32`.
fn box_iou(a: &Corners, b: &Corners) -> f64 {
    let inter_w = (a[2].min(b[2]) - a[0].max(b[0])).max(0.0);
    let inter_h = (a[3].min(b[3]) - a[1].max(b[1])).max(0.0);
    let inter = inter_w * inter_h;
    let union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter;
    if union > 0.0 {
        f64::from((inter / union) as f32)
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests;
