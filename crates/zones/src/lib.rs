//! Zones and lines for one video stream: which tracked objects are inside which named
//! polygons, how long they stay, and which cross which named lines in which direction.
//!
//! - [`geometry`]: points, the [`Anchor`] of a box that decides where an object is,
//!   distances and segment tests (for validation and the hysteresis margin).
//! - [`raster`]: which whole pixels a zone covers (its filled interior and drawn outline).
//! - [`spec`]: what the caller defines ([`ZoneSpec`], [`LineSpec`], in pixels or fractions
//!   of the frame) and its validation against the frame size ([`ZoneError`]).
//! - `zone` and `line`: per-track state of one zone (enter/exit with hysteresis, loiter) and
//!   one line (crossings and counts, following supervision's `LineZone` rules).
//! - [`Analytics`] (here): one stream's zones and lines together; `observe` takes one frame's
//!   tracked boxes at its media time and returns the events in a fixed order.
//!
//! Plain state: no I/O, no threads, no clock. Time is whatever `at` the caller passes.
//!
//! With [`Hysteresis::OFF`] the results equal supervision's: per-frame zone membership as
//! `PolygonZone` (anchor rounded to the pixel grid, looked up in the zone's pixels) and line crossings as
//! `LineZone` with `minimum_crossing_threshold = 1`. The defaults ([`Hysteresis::default`])
//! add a consecutive-frames rule and a pixel dead band so a box jittering on a border does
//! not flap.

pub mod geometry;
mod line;
pub mod raster;
pub mod spec;
mod zone;

use std::collections::BTreeMap;
use std::time::Duration;

use peregrine_types::BBox;

pub use geometry::{Anchor, Point, UnknownAnchor};
pub use spec::{LineSpec, Units, ZoneError, ZoneSpec, MAX_FRAME_SIDE};

use line::LineState;
use zone::{Sighting, ZoneState};

/// How much evidence a change of side needs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Hysteresis {
    /// Consecutive observations on the new side before a zone is entered or left, or a line
    /// counts a crossing (supervision's `minimum_crossing_threshold`). 0 acts as 1; lines
    /// cap it at 63. Frames in which the object is absent neither extend nor reset the run.
    pub frames: u32,
    /// Dead band around a zone's border or a line, in pixels: an anchor nearer than this
    /// keeps the side it had (zones) or is not counted on either side (lines).
    pub margin_px: f32,
}

impl Hysteresis {
    /// Every frame decides on its own: supervision's behaviour.
    pub const OFF: Self = Self {
        frames: 1,
        margin_px: 0.0,
    };
}

impl Default for Hysteresis {
    /// Three frames and a 2-pixel band: a box alternating sides frame by frame, or wobbling
    /// a pixel or two around a border, never changes side; a real crossing is reported three
    /// frames late (0.1 s at 30 fps). Zones narrower than twice the band cannot be entered.
    fn default() -> Self {
        Self {
            frames: 3,
            margin_px: 2.0,
        }
    }
}

/// Settings shared by every zone and line of a stream.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct AnalyticsConfig {
    pub anchor: Anchor,
    pub zone_hysteresis: Hysteresis,
    pub line_hysteresis: Hysteresis,
}

/// One tracked object in one frame.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TrackedBox {
    pub track: u64,
    pub class_id: u32,
    pub bbox: BBox,
}

/// Which way a line was crossed. `In` is from the right of `start -> end` to its left, as
/// seen on screen (image `y` down): for a line drawn left to right, moving upwards is `In`.
/// This is supervision's `LineZone` convention, so counts compare directly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    In,
    Out,
}

impl Direction {
    pub fn name(self) -> &'static str {
        match self {
            Direction::In => "in",
            Direction::Out => "out",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ZoneEventKind {
    Enter,
    Exit,
    /// Once per stay, on the first frame the object has been inside for the zone's `loiter`.
    Loiter {
        inside_for: Duration,
    },
    Cross(Direction),
}

/// Something that happened to a track in a zone (`Enter`, `Exit`, `Loiter`) or on a line
/// (`Cross`); `name` is the zone's or the line's.
#[derive(Debug, Clone, PartialEq)]
pub struct ZoneEvent {
    pub kind: ZoneEventKind,
    pub name: String,
    pub track: u64,
    pub class_id: u32,
    pub bbox: BBox,
    pub at: Duration,
}

/// Who is inside one zone now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZoneOccupancy {
    pub name: String,
    /// Objects inside by class id (classes with none are left out).
    pub by_class: BTreeMap<u32, usize>,
    /// Tracks inside, ascending.
    pub tracks: Vec<u64>,
}

/// One line's crossings so far, by class id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineCounts {
    pub name: String,
    pub in_by_class: BTreeMap<u32, u64>,
    pub out_by_class: BTreeMap<u32, u64>,
}

/// One stream's zones and lines and the state of every track in them.
#[derive(Debug, Clone)]
pub struct Analytics {
    config: AnalyticsConfig,
    zones: Vec<ZoneState>,
    lines: Vec<LineState>,
    /// Number of `observe` calls so far: lines forget tracks absent for some frames.
    frame: u64,
}

impl Analytics {
    /// Validates every spec against the frame size (`(width, height)` in pixels); errors
    /// name the zone or line and say what is wrong.
    pub fn new(
        zones: Vec<ZoneSpec>,
        lines: Vec<LineSpec>,
        config: AnalyticsConfig,
        frame: (u32, u32),
    ) -> Result<Self, ZoneError> {
        spec::check_frame(frame)?;
        spec::check_hysteresis(&config)?;
        spec::check_names(
            zones
                .iter()
                .map(|z| z.name.as_str())
                .chain(lines.iter().map(|l| l.name.as_str())),
        )?;
        let zones = zones
            .iter()
            .map(|z| z.validate(frame).map(ZoneState::new))
            .collect::<Result<_, _>>()?;
        let lines = lines
            .iter()
            .map(|l| l.validate(frame).map(LineState::new))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            config,
            zones,
            lines,
            frame: 0,
        })
    }

    /// One frame's tracked objects at media time `at`. Call it for every frame, including
    /// frames with no objects (lines count absent frames). Events come zones first, then
    /// lines, each in definition order, and within one zone or line by track id. A track
    /// listed twice in one frame is taken once (its first box).
    pub fn observe(&mut self, objects: &[TrackedBox], at: Duration) -> Vec<ZoneEvent> {
        self.frame += 1;
        let anchor = self.config.anchor;
        let mut sightings: Vec<Sighting> = objects
            .iter()
            .map(|o| Sighting {
                track: o.track,
                class_id: o.class_id,
                bbox: o.bbox,
                anchor: anchor.of(&o.bbox),
            })
            .collect();
        sightings.sort_by_key(|s| s.track);
        sightings.dedup_by_key(|s| s.track);
        let mut events = Vec::new();
        for zone in &mut self.zones {
            for seen in &sightings {
                if zone.watches(seen.class_id) {
                    zone.observe(seen, &self.config.zone_hysteresis, at, &mut events);
                }
            }
        }
        let hysteresis = &self.config.line_hysteresis;
        for line in &mut self.lines {
            for seen in &sightings {
                if line.watches(seen.class_id) {
                    line.observe(seen, hysteresis, (self.frame, at), &mut events);
                }
            }
            line.evict_absent(self.frame, hysteresis);
        }
        events
    }

    /// A track ended: an exit from every zone it was in (in definition order); everything
    /// known about it is dropped.
    pub fn forget(&mut self, track: u64, at: Duration) -> Vec<ZoneEvent> {
        for line in &mut self.lines {
            line.forget(track);
        }
        self.zones
            .iter_mut()
            .filter_map(|zone| zone.forget(track, at))
            .collect()
    }

    /// Per zone, in definition order: who is inside now.
    pub fn occupancy(&self) -> Vec<ZoneOccupancy> {
        self.zones
            .iter()
            .map(|zone| {
                let inside = zone.inside();
                let mut by_class = BTreeMap::new();
                for (_, class_id) in &inside {
                    *by_class.entry(*class_id).or_default() += 1;
                }
                ZoneOccupancy {
                    name: zone.zone.name.clone(),
                    by_class,
                    tracks: inside.into_iter().map(|(track, _)| track).collect(),
                }
            })
            .collect()
    }

    /// Per line, in definition order: crossings so far.
    pub fn line_counts(&self) -> Vec<LineCounts> {
        self.lines
            .iter()
            .map(|line| LineCounts {
                name: line.line.name.clone(),
                in_by_class: line.in_by_class.clone(),
                out_by_class: line.out_by_class.clone(),
            })
            .collect()
    }

    pub fn zone_names(&self) -> Vec<&str> {
        self.zones.iter().map(|z| z.zone.name.as_str()).collect()
    }

    pub fn line_names(&self) -> Vec<&str> {
        self.lines.iter().map(|l| l.line.name.as_str()).collect()
    }

    pub fn config(&self) -> &AnalyticsConfig {
        &self.config
    }
}

#[cfg(test)]
mod tests;
