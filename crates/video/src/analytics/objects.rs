//! What a stream knows about each live object besides the tracker's state: its best
//! snapshot, its [`ObjectState`] kept current frame by frame and zone event by zone event,
//! and what consumers were last told of it ([`Told`]). Plain state, like its owner
//! [`super::stream::StreamAnalytics`].

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use peregrine_types::{ClassNames, Detection};
use peregrine_zones::ZoneEventKind;

use super::updates::{Stillness, Told};
use crate::event::{ObjectChange, ObjectState};

pub(crate) struct ObjectNotes {
    pub best_snapshot: Option<(f32, Arc<Vec<u8>>)>,
    pub last_snapshot_at: Duration,
    /// The object now.
    pub state: ObjectState,
    stillness: Stillness,
    told: Told,
}

impl ObjectNotes {
    /// A confirmed object, as its `object.start` tells it at stream time `at`.
    pub fn new(state: ObjectState, snapshot: Option<Arc<Vec<u8>>>, at: Duration) -> Self {
        let mut state = state;
        state.snapshot_score = snapshot.as_ref().map(|_| state.score);
        Self {
            best_snapshot: snapshot.map(|s| (state.score, s)),
            last_snapshot_at: at,
            stillness: Stillness::new(state.bbox, at),
            told: Told::new(state.clone(), at),
            state,
        }
    }

    /// The `object.start`'s change: before and after are the same.
    pub fn start_change(&self) -> ObjectChange {
        ObjectChange {
            before: self.state.clone(),
            after: self.state.clone(),
        }
    }

    /// Its detection in a frame captured at `wall`, stream time `at`.
    pub fn seen(
        &mut self,
        detection: &Detection,
        names: &ClassNames,
        (wall, at): (SystemTime, Duration),
        stationary_after: Duration,
    ) {
        let s = &mut self.state;
        s.score = detection.score;
        s.bbox = detection.bbox;
        s.last_seen = wall;
        // As the tracker does: the object's class is its best detection's.
        if detection.score > s.top_score {
            s.top_score = detection.score;
            if detection.class_id != s.class_id {
                s.class_id = detection.class_id;
                s.label = names.name(detection.class_id).into_owned();
            }
        }
        s.stationary = self.stillness.observe(detection.bbox, at, stationary_after);
    }

    /// A better snapshot, taken at stream time `at`.
    pub fn better_snapshot(&mut self, score: f32, snapshot: Arc<Vec<u8>>, at: Duration) {
        self.best_snapshot = Some((score, snapshot));
        self.last_snapshot_at = at;
        self.state.snapshot_score = Some(score);
    }

    /// A zone event about the object (crossings change nothing here).
    pub fn zone_event(&mut self, kind: &ZoneEventKind, zone: &str) {
        let s = &mut self.state;
        match kind {
            ZoneEventKind::Enter => {
                if !s.current_zones.iter().any(|z| z == zone) {
                    s.current_zones.push(zone.to_string());
                }
                if !s.entered_zones.iter().any(|z| z == zone) {
                    s.entered_zones.push(zone.to_string());
                }
            }
            ZoneEventKind::Exit => {
                s.current_zones.retain(|z| z != zone);
                s.loitering_zones.retain(|z| z != zone);
            }
            ZoneEventKind::Loiter { .. } => {
                if !s.loitering_zones.iter().any(|z| z == zone) {
                    s.loitering_zones.push(zone.to_string());
                }
            }
            ZoneEventKind::Cross(_) => {}
        }
    }

    /// The zones were replaced: the object is in none of them (nothing announces it).
    pub fn zones_replaced(&mut self) {
        self.state.current_zones.clear();
        self.state.loitering_zones.clear();
    }

    /// An `object.update`'s change when one is due at `at` (see [`Told::observe`]).
    pub fn update(&mut self, at: Duration, interval: Duration) -> Option<ObjectChange> {
        let before = self.told.observe(&self.state, at, interval)?;
        Some(ObjectChange {
            before,
            after: self.state.clone(),
        })
    }

    /// The `object.end`'s change: from what was told last to the object's final state.
    pub fn end_change(&self) -> ObjectChange {
        ObjectChange {
            before: self.told.state().clone(),
            after: self.state.clone(),
        }
    }
}
