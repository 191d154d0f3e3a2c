//! One line's crossing state per track and its counts, following supervision's `LineZone`
//! rule by rule so that the two count the same crossings.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use crate::geometry::{cross, Xy};
use crate::spec::Line;
use crate::zone::Sighting;
use crate::{Direction, Hysteresis, ZoneEvent, ZoneEventKind};

/// The most observations a track's history holds (a `u64` of sides).
const MAX_HISTORY: u32 = 64;

/// A track's recent sides of one line. `true` is the left side of `start -> end` on screen
/// (negative cross product, supervision's "left trigger"), the `in` side.
#[derive(Debug, Clone)]
struct Crossing {
    /// Newest side in bit 0.
    history: u64,
    len: u32,
    /// The side the track was last confirmed on; seeded by its first observation.
    confirmed: bool,
    last_present: u64,
}

/// A line, the tracks it has seen on one side or the other, and its counts by class.
#[derive(Debug, Clone)]
pub(crate) struct LineState {
    pub(crate) line: Line,
    /// The two perpendiculars through the ends that bound the segment's extent, as
    /// `(start, end)` vectors built exactly as supervision builds them.
    limits: [(Xy, Xy); 2],
    tracks: HashMap<u64, Crossing>,
    pub(crate) in_by_class: BTreeMap<u32, u64>,
    pub(crate) out_by_class: BTreeMap<u32, u64>,
}

impl LineState {
    pub(crate) fn new(line: Line) -> Self {
        let (start, end) = (line.start, line.end);
        let (dx, dy) = (end.0 - start.0, end.1 - start.1);
        let magnitude = (dx * dx + dy * dy).sqrt();
        let (px, py) = (-(dy / magnitude), dx / magnitude);
        let limits = [
            (start, (start.0 + px, start.1 + py)),
            (end, (end.0 - px, end.1 - py)),
        ];
        Self {
            line,
            limits,
            tracks: HashMap::new(),
            in_by_class: BTreeMap::new(),
            out_by_class: BTreeMap::new(),
        }
    }

    pub(crate) fn watches(&self, class_id: u32) -> bool {
        self.line
            .classes
            .as_ref()
            .is_none_or(|classes| classes.contains(&class_id))
    }

    /// The anchor's side (`true` = left = `in`), or `None` when it does not count: beyond
    /// the segment's ends, within `margin` pixels of the line, or not finite.
    fn side(&self, anchor: Xy, margin: f64) -> Option<bool> {
        // A NaN would pass the limit test below (both comparisons false) and land on a side.
        if !(anchor.0.is_finite() && anchor.1.is_finite()) {
            return None;
        }
        let [(a0, b0), (a1, b1)] = self.limits;
        if (cross(a0, b0, anchor) > 0.0) != (cross(a1, b1, anchor) > 0.0) {
            return None;
        }
        let (start, end) = (self.line.start, self.line.end);
        let product = cross(start, end, anchor);
        if margin > 0.0 {
            let length = ((end.0 - start.0).powi(2) + (end.1 - start.1).powi(2)).sqrt();
            if product.abs() / length < margin {
                return None;
            }
        }
        Some(product < 0.0)
    }

    /// Length of the side history: one confirmed side plus `frames` on the new side.
    fn history_len(hysteresis: &Hysteresis) -> u32 {
        (hysteresis.frames.max(1) + 1).min(MAX_HISTORY)
    }

    /// One sighting of a track this line watches, in frame number `frame`.
    pub(crate) fn observe(
        &mut self,
        seen: &Sighting,
        hysteresis: &Hysteresis,
        (frame, at): (u64, Duration),
        events: &mut Vec<ZoneEvent>,
    ) {
        let history_len = Self::history_len(hysteresis);
        let side = self.side(seen.anchor, f64::from(hysteresis.margin_px));
        let Some(side) = side else {
            // Seen but on neither side: still present, so its history is kept.
            if let Some(crossing) = self.tracks.get_mut(&seen.track) {
                crossing.last_present = frame;
            }
            return;
        };
        let crossing = self.tracks.entry(seen.track).or_insert(Crossing {
            history: 0,
            len: 0,
            confirmed: side,
            last_present: frame,
        });
        crossing.last_present = frame;
        crossing.history = (crossing.history << 1) | u64::from(side);
        crossing.len = (crossing.len + 1).min(history_len);
        if crossing.len < history_len || side == crossing.confirmed {
            return;
        }
        // The newest `history_len - 1` sides must all be the new one.
        let run_mask = (1u64 << (history_len - 1)) - 1;
        let run = crossing.history & run_mask;
        if run != if side { run_mask } else { 0 } {
            return;
        }
        crossing.confirmed = side;
        let (direction, counts) = if side {
            (Direction::In, &mut self.in_by_class)
        } else {
            (Direction::Out, &mut self.out_by_class)
        };
        *counts.entry(seen.class_id).or_default() += 1;
        events.push(ZoneEvent {
            kind: ZoneEventKind::Cross(direction),
            name: self.line.name.clone(),
            track: seen.track,
            class_id: seen.class_id,
            bbox: seen.bbox,
            at,
        });
    }

    /// Called once per frame after its sightings: drops tracks that have been absent for
    /// `history_len` frames, as supervision does, so a track that vanishes and comes back
    /// starts afresh.
    pub(crate) fn evict_absent(&mut self, frame: u64, hysteresis: &Hysteresis) {
        let history_len = u64::from(Self::history_len(hysteresis));
        self.tracks
            .retain(|_, crossing| frame - crossing.last_present < history_len);
    }

    pub(crate) fn forget(&mut self, track: u64) {
        self.tracks.remove(&track);
    }
}
