//! What the caller asks for (zones and lines in pixels or fractions of the frame) and its
//! validation into pixel geometry. Every error names the zone or line and says what is wrong.

use std::collections::HashSet;
use std::time::Duration;

use crate::geometry::{cross, doubled_area, first_self_intersection, Point, Polygon, Xy};
use crate::AnalyticsConfig;

/// How a spec's coordinates are measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Units {
    /// Pixels of the frame: `x` in `[0, width]`, `y` in `[0, height]`.
    #[default]
    Pixels,
    /// Fractions of the frame's width and height, each in `[0, 1]`.
    Normalized,
}

impl Units {
    fn name(self) -> &'static str {
        match self {
            Units::Pixels => "pixels",
            Units::Normalized => "normalized",
        }
    }
}

/// A named polygon. `classes: None` watches every class; `loiter` fires `zone.loiter` once per
/// stay when an object has been inside that long.
#[derive(Debug, Clone, PartialEq)]
pub struct ZoneSpec {
    pub name: String,
    pub points: Vec<Point>,
    pub units: Units,
    pub classes: Option<Vec<u32>>,
    pub loiter: Option<Duration>,
}

/// A named line segment from `start` to `end`. Crossing it from the right of `start -> end`
/// (as seen on screen) to its left is `in`, the other way `out`; see [`crate::Direction`].
#[derive(Debug, Clone, PartialEq)]
pub struct LineSpec {
    pub name: String,
    pub start: Point,
    pub end: Point,
    pub units: Units,
    pub classes: Option<Vec<u32>>,
}

/// The largest frame side accepted: keeps the raster's fixed-point arithmetic in `i64`.
pub const MAX_FRAME_SIDE: u32 = 1 << 16;

/// A zone or line definition that cannot be used, or a frame size that makes no sense.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ZoneError {
    #[error("frame size {width}x{height} is not usable: each side must be 1 to {MAX_FRAME_SIDE} pixels (zones need the stream's frame size)")]
    FrameSize { width: u32, height: u32 },
    #[error("a zone or line has an empty name: give every zone and line a name")]
    EmptyName,
    #[error("name `{name}` is used twice: zone and line names must be unique per stream")]
    DuplicateName { name: String },
    #[error("zone `{zone}` has {points} points: a polygon needs at least 3")]
    TooFewPoints { zone: String, points: usize },
    #[error("zone `{zone}` repeats point {index} as point {next}: remove the duplicate")]
    RepeatedPoint { zone: String, index: usize, next: usize },
    #[error("zone `{zone}` has zero area: its points are collinear or repeated")]
    ZeroArea { zone: String },
    #[error("zone `{zone}` intersects itself: edge {first} (from point {first}) meets edge {second} (from point {second}); list the points in order around the outline")]
    SelfIntersecting {
        zone: String,
        first: usize,
        second: usize,
    },
    #[error("{what} `{name}` point {index} is ({x}, {y}), outside the {width}x{height} frame ({units} coordinates must lie in {range})")]
    OutsideFrame {
        what: &'static str,
        name: String,
        index: usize,
        x: f32,
        y: f32,
        width: u32,
        height: u32,
        units: &'static str,
        range: &'static str,
    },
    #[error("line `{line}` starts and ends at the same point: a line needs two distinct ends")]
    DegenerateLine { line: String },
    #[error("{what} hysteresis margin {margin_px} px is not a finite number >= 0")]
    InvalidMargin { what: &'static str, margin_px: f32 },
    #[error("{what} `{name}` has an empty class list: leave it out to watch every class")]
    EmptyClassFilter { what: &'static str, name: String },
}

/// A validated zone, in pixels.
#[derive(Debug, Clone)]
pub(crate) struct Zone {
    pub(crate) name: String,
    pub(crate) polygon: Polygon,
    pub(crate) classes: Option<HashSet<u32>>,
    pub(crate) loiter: Option<Duration>,
}

/// A validated line, in pixels.
#[derive(Debug, Clone)]
pub(crate) struct Line {
    pub(crate) name: String,
    pub(crate) start: Xy,
    pub(crate) end: Xy,
    pub(crate) classes: Option<HashSet<u32>>,
}

/// Checks every name for emptiness and uniqueness across zones and lines together.
pub(crate) fn check_names<'a>(names: impl Iterator<Item = &'a str>) -> Result<(), ZoneError> {
    let mut seen = HashSet::new();
    for name in names {
        if name.trim().is_empty() {
            return Err(ZoneError::EmptyName);
        }
        if !seen.insert(name) {
            return Err(ZoneError::DuplicateName {
                name: name.to_owned(),
            });
        }
    }
    Ok(())
}

fn class_filter(
    what: &'static str,
    name: &str,
    classes: &Option<Vec<u32>>,
) -> Result<Option<HashSet<u32>>, ZoneError> {
    match classes {
        None => Ok(None),
        Some(list) if list.is_empty() => Err(ZoneError::EmptyClassFilter {
            what,
            name: name.to_owned(),
        }),
        Some(list) => Ok(Some(list.iter().copied().collect())),
    }
}

/// Converts one point to pixels, refusing anything outside the frame (or not finite).
fn to_pixels(
    what: &'static str,
    name: &str,
    index: usize,
    point: Point,
    units: Units,
    frame: (u32, u32),
) -> Result<Xy, ZoneError> {
    let (width, height) = (f64::from(frame.0), f64::from(frame.1));
    let (x, y) = (f64::from(point.x), f64::from(point.y));
    let (limit_x, limit_y, range) = match units {
        Units::Pixels => (width, height, "[0, width] x [0, height]"),
        Units::Normalized => (1.0, 1.0, "[0, 1] x [0, 1]"),
    };
    let inside = (0.0..=limit_x).contains(&x) && (0.0..=limit_y).contains(&y);
    if !inside {
        return Err(ZoneError::OutsideFrame {
            what,
            name: name.to_owned(),
            index,
            x: point.x,
            y: point.y,
            width: frame.0,
            height: frame.1,
            units: units.name(),
            range,
        });
    }
    Ok(match units {
        Units::Pixels => (x, y),
        Units::Normalized => (snap(x * width), snap(y * height)),
    })
}

/// Rounds to 1/256 px: an `f32` cannot hold most fractions exactly (0.55 is 0.550000012),
/// and 0.55 of 1280 px should be the pixel edge 704, not 704.000015, or an anchor on pixel
/// 704 would be outside.
fn snap(pixels: f64) -> f64 {
    (pixels * 256.0).round() / 256.0
}

pub(crate) fn check_frame(frame: (u32, u32)) -> Result<(), ZoneError> {
    let usable = |side: u32| (1..=MAX_FRAME_SIDE).contains(&side);
    if !(usable(frame.0) && usable(frame.1)) {
        return Err(ZoneError::FrameSize {
            width: frame.0,
            height: frame.1,
        });
    }
    Ok(())
}

pub(crate) fn check_hysteresis(config: &AnalyticsConfig) -> Result<(), ZoneError> {
    for (what, hysteresis) in [("zone", config.zone_hysteresis), ("line", config.line_hysteresis)] {
        let margin_px = hysteresis.margin_px;
        if !(margin_px.is_finite() && margin_px >= 0.0) {
            return Err(ZoneError::InvalidMargin { what, margin_px });
        }
    }
    Ok(())
}

impl ZoneSpec {
    pub(crate) fn validate(&self, frame: (u32, u32)) -> Result<Zone, ZoneError> {
        let zone = || self.name.clone();
        if self.points.len() < 3 {
            return Err(ZoneError::TooFewPoints {
                zone: zone(),
                points: self.points.len(),
            });
        }
        let points = self
            .points
            .iter()
            .enumerate()
            .map(|(i, p)| to_pixels("zone", &self.name, i, *p, self.units, frame))
            .collect::<Result<Vec<_>, _>>()?;
        let n = points.len();
        if let Some(index) = (0..n).find(|&i| points[i] == points[(i + 1) % n]) {
            return Err(ZoneError::RepeatedPoint {
                zone: zone(),
                index,
                next: (index + 1) % n,
            });
        }
        // All on one line first: such a "polygon" also folds back over itself, and zero area
        // is the clearer message.
        let collinear = points.iter().all(|p| cross(points[0], points[1], *p) == 0.0);
        if collinear {
            return Err(ZoneError::ZeroArea { zone: zone() });
        }
        if let Some((first, second)) = first_self_intersection(&points) {
            return Err(ZoneError::SelfIntersecting {
                zone: zone(),
                first,
                second,
            });
        }
        if doubled_area(&points) == 0.0 {
            return Err(ZoneError::ZeroArea { zone: zone() });
        }
        Ok(Zone {
            name: self.name.clone(),
            polygon: Polygon::new(points),
            classes: class_filter("zone", &self.name, &self.classes)?,
            loiter: self.loiter,
        })
    }
}

impl LineSpec {
    pub(crate) fn validate(&self, frame: (u32, u32)) -> Result<Line, ZoneError> {
        let start = to_pixels("line", &self.name, 0, self.start, self.units, frame)?;
        let end = to_pixels("line", &self.name, 1, self.end, self.units, frame)?;
        if start == end {
            return Err(ZoneError::DegenerateLine {
                line: self.name.clone(),
            });
        }
        Ok(Line {
            name: self.name.clone(),
            start,
            end,
            classes: class_filter("line", &self.name, &self.classes)?,
        })
    }
}
