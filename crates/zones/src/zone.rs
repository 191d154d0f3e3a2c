//! One zone's membership state per track: enter/exit with hysteresis, and loiter.

use std::collections::HashMap;
use std::time::Duration;

use peregrine_types::BBox;

use crate::geometry::Xy;
use crate::spec::Zone;
use crate::{Hysteresis, ZoneEvent, ZoneEventKind};

/// Where one track stands with one zone.
#[derive(Debug, Clone)]
struct Membership {
    inside: bool,
    /// Consecutive observations on the other side of `inside`.
    run: u32,
    class_id: u32,
    bbox: BBox,
    entered_at: Duration,
    loitered: bool,
}

impl Membership {
    fn outside(class_id: u32, bbox: BBox) -> Self {
        Self {
            inside: false,
            run: 0,
            class_id,
            bbox,
            entered_at: Duration::ZERO,
            loitered: false,
        }
    }
}

/// A zone and the tracks it knows about. Tracks that are outside with no pending change are
/// not kept, so memory follows what is inside (or about to be).
#[derive(Debug, Clone)]
pub(crate) struct ZoneState {
    pub(crate) zone: Zone,
    tracks: HashMap<u64, Membership>,
}

/// One object as a zone or line sees it this frame.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sighting {
    pub(crate) track: u64,
    pub(crate) class_id: u32,
    pub(crate) bbox: BBox,
    pub(crate) anchor: Xy,
}

impl ZoneState {
    pub(crate) fn new(zone: Zone) -> Self {
        Self {
            zone,
            tracks: HashMap::new(),
        }
    }

    pub(crate) fn watches(&self, class_id: u32) -> bool {
        self.zone
            .classes
            .as_ref()
            .is_none_or(|classes| classes.contains(&class_id))
    }

    /// Whether the anchor is inside, on the pixel grid: it is rounded to the nearest pixel
    /// (ties to even, NumPy's `rint`) and looked up in the zone's pixels (see
    /// [`crate::raster`]), as supervision's mask lookup does. `margin` is the dead band around the boundary in which the current
    /// side is kept.
    fn side(zone: &Zone, anchor: Xy, current: bool, margin: f64) -> bool {
        let pixel = (anchor.0.round_ties_even(), anchor.1.round_ties_even());
        // Far outside the frame (or not finite): outside, without overflowing the cast.
        let on_grid = pixel.0.abs() < 1e9 && pixel.1.abs() < 1e9;
        let inside = on_grid && zone.polygon.contains_pixel(pixel.0 as i64, pixel.1 as i64);
        if inside != current && margin > 0.0 && zone.polygon.boundary_distance(pixel) < margin {
            return current;
        }
        inside
    }

    /// One sighting of a track this zone watches; pushes its events.
    pub(crate) fn observe(
        &mut self,
        seen: &Sighting,
        hysteresis: &Hysteresis,
        at: Duration,
        events: &mut Vec<ZoneEvent>,
    ) {
        let membership = self
            .tracks
            .entry(seen.track)
            .or_insert_with(|| Membership::outside(seen.class_id, seen.bbox));
        let margin = f64::from(hysteresis.margin_px);
        let side = Self::side(&self.zone, seen.anchor, membership.inside, margin);
        membership.class_id = seen.class_id;
        membership.bbox = seen.bbox;
        let event = |kind| ZoneEvent {
            kind,
            name: self.zone.name.clone(),
            track: seen.track,
            class_id: seen.class_id,
            bbox: seen.bbox,
            at,
        };
        if side == membership.inside {
            membership.run = 0;
        } else {
            membership.run += 1;
            if membership.run >= hysteresis.frames.max(1) {
                membership.inside = side;
                membership.run = 0;
                if side {
                    membership.entered_at = at;
                    membership.loitered = false;
                    events.push(event(ZoneEventKind::Enter));
                } else {
                    events.push(event(ZoneEventKind::Exit));
                }
            }
        }
        if membership.inside && !membership.loitered {
            let inside_for = at.saturating_sub(membership.entered_at);
            if self.zone.loiter.is_some_and(|loiter| inside_for >= loiter) {
                membership.loitered = true;
                events.push(event(ZoneEventKind::Loiter { inside_for }));
            }
        }
        if !membership.inside && membership.run == 0 {
            self.tracks.remove(&seen.track);
        }
    }

    /// Drops a track; an exit if it was inside.
    pub(crate) fn forget(&mut self, track: u64, at: Duration) -> Option<ZoneEvent> {
        let membership = self.tracks.remove(&track)?;
        membership.inside.then(|| ZoneEvent {
            kind: ZoneEventKind::Exit,
            name: self.zone.name.clone(),
            track,
            class_id: membership.class_id,
            bbox: membership.bbox,
            at,
        })
    }

    /// `(track, class_id)` of every track inside, by track id.
    pub(crate) fn inside(&self) -> Vec<(u64, u32)> {
        let mut inside: Vec<_> = self
            .tracks
            .iter()
            .filter(|(_, m)| m.inside)
            .map(|(track, m)| (*track, m.class_id))
            .collect();
        inside.sort_unstable();
        inside
    }
}
