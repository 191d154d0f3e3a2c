//! What a stream does with its detections besides publishing them (`[streams.analytics]`
//! in the configuration file, `"analytics"` in `POST /v1/streams`), and how those settings
//! become the tracker's and the zones' own types once the model's class names are known.

use std::time::Duration;

use peregrine_track::TrackerConfig;
use peregrine_types::ClassNames;
use peregrine_zones::{Anchor, Hysteresis, LineSpec, Point, Units, ZoneSpec};
use serde::Deserialize;

use super::updates::UpdatePolicy;

/// The longest interval a setting in seconds may have (a day): longer is surely a typo.
const MAX_SECONDS: f64 = 86_400.0;

/// Tracking, zones and lines of one stream.
///
/// ```toml
/// [streams.analytics]
/// classes = ["person", "car"]
///
/// [[streams.analytics.zones]]
/// name = "loading"
/// units = "normalized"
/// points = [[0.1, 0.5], [0.6, 0.5], [0.6, 1.0], [0.1, 1.0]]
/// classes = ["person"]
/// loiter_s = 40
///
/// [[streams.analytics.lines]]
/// name = "gate"
/// start = [0, 400]
/// end = [1280, 400]
/// ```
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AnalyticsConfig {
    /// Follow objects from frame to frame: `track_id`s on detections and `object.start` /
    /// `object.end` events. Zones and lines need it.
    pub tracking: bool,
    /// Classes to track (names or ids); empty: every class the model detects.
    pub classes: Vec<ClassSelector>,
    pub tracker: TrackerSettings,
    /// Which point of a box decides whether it is in a zone or across a line:
    /// `bottom_center` (the default, as Frigate and supervision), `center`, `top_center`,
    /// `bottom_left`, `bottom_right`, `top_left`, `top_right`, `center_left`, `center_right`.
    pub anchor: String,
    /// Consecutive frames an object must be seen on the new side of a zone's border or a
    /// line before it counts as having moved, so a box jittering on a border does not
    /// flap (1: every frame decides, as supervision does).
    pub hysteresis_frames: u32,
    /// A dead band around borders and lines, in pixels: an anchor nearer than this keeps
    /// its side (0: none, as supervision).
    pub hysteresis_px: f32,
    pub zones: Vec<ZoneConfig>,
    pub lines: Vec<LineConfig>,
    /// Give object events a picture of their frame (boxed and labelled JPEG).
    pub snapshots: bool,
    /// Crop snapshots to the object's box (with a margin) instead of the whole frame.
    pub snapshot_crop: bool,
    /// Send `object.update` events between an object's start and end when something a
    /// consumer acts on changes (a better score or snapshot, its zones, loitering,
    /// stationary, its label).
    pub updates: bool,
    /// At most one `object.update` per object this often, in seconds of stream time;
    /// changes in between go out together with the next one.
    pub update_interval_s: f64,
    /// Seconds an object's box must stay where it stopped before it counts as stationary.
    pub stationary_s: f64,
}

/// The defaults of the `object.update` settings, in one place.
pub(crate) const DEFAULT_UPDATE_INTERVAL_S: f64 = 5.0;
/// Frigate's default too: 50 frames at its 5 fps.
pub(crate) const DEFAULT_STATIONARY_S: f64 = 10.0;

impl Default for AnalyticsConfig {
    fn default() -> Self {
        Self {
            tracking: true,
            classes: Vec::new(),
            tracker: TrackerSettings::default(),
            anchor: Anchor::default().name().to_string(),
            hysteresis_frames: Hysteresis::default().frames,
            hysteresis_px: Hysteresis::default().margin_px,
            zones: Vec::new(),
            lines: Vec::new(),
            snapshots: true,
            snapshot_crop: false,
            updates: true,
            update_interval_s: DEFAULT_UPDATE_INTERVAL_S,
            stationary_s: DEFAULT_STATIONARY_S,
        }
    }
}

/// A class by its model name or its id.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum ClassSelector {
    Id(u32),
    Name(String),
}

/// The tracker's thresholds (see `peregrine_track::TrackerConfig`, whose defaults these are).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TrackerSettings {
    /// Detections scoring above this are matched first.
    pub high_score: f32,
    /// Detections scoring below this are ignored by the tracker.
    pub low_score: f32,
    /// An unmatched detection scoring above this starts a new track.
    pub new_track_score: f32,
    /// Least IoU for a detection to continue a track.
    pub match_iou: f32,
    /// Consecutive frames before a new track is confirmed (and gets an id).
    pub min_hits: u32,
    /// A track unseen this long (in the stream's own time) ends.
    pub lost_after_ms: u64,
    /// A track only continues with detections of its own class.
    pub class_aware: bool,
}

impl Default for TrackerSettings {
    fn default() -> Self {
        let c = TrackerConfig::default();
        Self {
            high_score: c.high_score,
            low_score: c.low_score,
            new_track_score: c.new_track_score,
            match_iou: c.match_iou,
            min_hits: c.min_hits,
            lost_after_ms: c.lost_after.as_millis() as u64,
            class_aware: c.class_aware,
        }
    }
}

impl From<&TrackerSettings> for TrackerConfig {
    fn from(s: &TrackerSettings) -> Self {
        Self {
            high_score: s.high_score,
            low_score: s.low_score,
            new_track_score: s.new_track_score,
            match_iou: s.match_iou,
            min_hits: s.min_hits,
            lost_after: Duration::from_millis(s.lost_after_ms),
            class_aware: s.class_aware,
        }
    }
}

/// Whether coordinates are pixels of the frame or fractions of its width and height.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum UnitsConfig {
    #[default]
    Pixels,
    Normalized,
}

impl From<UnitsConfig> for Units {
    fn from(u: UnitsConfig) -> Self {
        match u {
            UnitsConfig::Pixels => Units::Pixels,
            UnitsConfig::Normalized => Units::Normalized,
        }
    }
}

/// A named polygon.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ZoneConfig {
    pub name: String,
    /// At least three `[x, y]` corners, in order, not crossing.
    pub points: Vec<[f32; 2]>,
    #[serde(default)]
    pub units: UnitsConfig,
    /// Classes that count in this zone; empty: every tracked class.
    #[serde(default)]
    pub classes: Vec<ClassSelector>,
    /// Seconds inside after which a `zone.loiter` event fires (once per stay).
    #[serde(default)]
    pub loiter_s: Option<f64>,
}

/// A named line segment. Walking from `start` to `end`, crossing from right to left is
/// `in` and from left to right `out` (as supervision's `LineZone` counts).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LineConfig {
    pub name: String,
    pub start: [f32; 2],
    pub end: [f32; 2],
    #[serde(default)]
    pub units: UnitsConfig,
    #[serde(default)]
    pub classes: Vec<ClassSelector>,
}

/// The settings with class names resolved to the model's ids.
#[derive(Debug, Clone)]
pub(crate) struct ResolvedAnalytics {
    /// Class ids to track; `None`: all.
    pub classes: Option<Vec<u32>>,
    pub zones: Vec<ZoneSpec>,
    pub lines: Vec<LineSpec>,
    pub anchor: Anchor,
    pub hysteresis: Hysteresis,
}

impl AnalyticsConfig {
    /// Checks what can be checked without the model or a frame; the message says what to
    /// change.
    pub fn validate(&self) -> Result<(), String> {
        TrackerConfig::from(&self.tracker)
            .validate()
            .map_err(|e| format!("analytics.tracker: {e}"))?;
        let has_places = !(self.zones.is_empty() && self.lines.is_empty());
        if has_places && !self.tracking {
            return Err("analytics: zones and lines need tracking = true".into());
        }
        self.anchor()?;
        if self.hysteresis_frames == 0 {
            return Err("analytics.hysteresis_frames must be at least 1".into());
        }
        if !(self.hysteresis_px.is_finite() && self.hysteresis_px >= 0.0) {
            return Err("analytics.hysteresis_px must be a number of pixels, 0 or more".into());
        }
        let seconds = |name: &str, v: f64| {
            if v.is_finite() && v > 0.0 && v <= MAX_SECONDS {
                Ok(())
            } else {
                Err(format!(
                    "analytics.{name} must be a positive number of seconds, at most {MAX_SECONDS} (it is {v})"
                ))
            }
        };
        seconds("update_interval_s", self.update_interval_s)?;
        seconds("stationary_s", self.stationary_s)?;
        for z in &self.zones {
            if let Some(s) = z.loiter_s {
                if !(s.is_finite() && s > 0.0) {
                    return Err(format!(
                        "zone {:?}: loiter_s must be a positive number of seconds",
                        z.name
                    ));
                }
            }
        }
        Ok(())
    }

    /// When `object.update`s go out (valid settings: see `validate`).
    pub(crate) fn update_policy(&self) -> UpdatePolicy {
        let seconds = |s: f64| Duration::try_from_secs_f64(s).unwrap_or(Duration::MAX);
        UpdatePolicy {
            interval: self.updates.then(|| seconds(self.update_interval_s)),
            stationary_after: seconds(self.stationary_s),
        }
    }

    fn anchor(&self) -> Result<Anchor, String> {
        self.anchor.parse().map_err(|e| format!("analytics.anchor: {e}"))
    }

    /// Resolves class names against the model's, and checks the zones and lines as far as
    /// they can be checked before the frame size is known.
    pub(crate) fn resolve(&self, names: &ClassNames) -> Result<ResolvedAnalytics, String> {
        self.validate()?;
        let zones = resolve_zones(&self.zones, names)?;
        let lines = resolve_lines(&self.lines, names)?;
        let classes = resolve_classes(&self.classes, names).map_err(|e| format!("analytics.classes: {e}"))?;
        let resolved = ResolvedAnalytics {
            classes,
            zones,
            lines,
            anchor: self.anchor()?,
            hysteresis: Hysteresis {
                frames: self.hysteresis_frames,
                margin_px: self.hysteresis_px,
            },
        };
        resolved.build_zones(None)?;
        Ok(resolved)
    }
}

fn resolve_zones(zones: &[ZoneConfig], names: &ClassNames) -> Result<Vec<ZoneSpec>, String> {
    zones
        .iter()
        .map(|z| {
            Ok(ZoneSpec {
                name: z.name.clone(),
                points: z.points.iter().map(|&[x, y]| Point { x, y }).collect(),
                units: z.units.into(),
                classes: resolve_classes(&z.classes, names).map_err(|e| format!("zone {:?}: {e}", z.name))?,
                loiter: z.loiter_s.map(Duration::from_secs_f64),
            })
        })
        .collect()
}

fn resolve_lines(lines: &[LineConfig], names: &ClassNames) -> Result<Vec<LineSpec>, String> {
    lines
        .iter()
        .map(|l| {
            Ok(LineSpec {
                name: l.name.clone(),
                start: Point {
                    x: l.start[0],
                    y: l.start[1],
                },
                end: Point {
                    x: l.end[0],
                    y: l.end[1],
                },
                units: l.units.into(),
                classes: resolve_classes(&l.classes, names).map_err(|e| format!("line {:?}: {e}", l.name))?,
            })
        })
        .collect()
}

/// A frame size for checks made before the stream's is known: pixel coordinates are only
/// checked to be non-negative then.
const UNKNOWN_FRAME: (u32, u32) = (peregrine_zones::MAX_FRAME_SIDE, peregrine_zones::MAX_FRAME_SIDE);

impl ResolvedAnalytics {
    /// The zones and lines against `frame` (or any frame, when not known yet).
    pub fn build_zones(&self, frame: Option<(u32, u32)>) -> Result<peregrine_zones::Analytics, String> {
        let config = peregrine_zones::AnalyticsConfig {
            anchor: self.anchor,
            zone_hysteresis: self.hysteresis,
            line_hysteresis: self.hysteresis,
        };
        peregrine_zones::Analytics::new(
            self.zones.clone(),
            self.lines.clone(),
            config,
            frame.unwrap_or(UNKNOWN_FRAME),
        )
        .map_err(|e| e.to_string())
    }

    pub fn tracks_class(&self, class_id: u32) -> bool {
        self.classes.as_ref().is_none_or(|c| c.contains(&class_id))
    }

    pub fn has_places(&self) -> bool {
        !(self.zones.is_empty() && self.lines.is_empty())
    }
}

/// Class selectors to ids; empty means every class (`None`).
fn resolve_classes(selectors: &[ClassSelector], names: &ClassNames) -> Result<Option<Vec<u32>>, String> {
    if selectors.is_empty() {
        return Ok(None);
    }
    let ids = selectors
        .iter()
        .map(|s| match s {
            ClassSelector::Id(id) if names.is_empty() || (*id as usize) < names.len() => Ok(*id),
            ClassSelector::Id(id) => Err(format!(
                "unknown class id {id} (the model has {} classes)",
                names.len()
            )),
            ClassSelector::Name(n) => names
                .id_of(n)
                .ok_or_else(|| format!("unknown class {n:?} (the model's classes: {})", class_list(names))),
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Some(ids))
}

fn class_list(names: &ClassNames) -> String {
    let mut list: Vec<&str> = names.iter().take(12).collect();
    if names.len() > 12 {
        list.push("...");
    }
    list.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn update_settings_are_checked_and_name_the_setting() {
        for (interval, stationary, wrong) in [
            (0.0, 10.0, "update_interval_s"),
            (-1.0, 10.0, "update_interval_s"),
            (f64::NAN, 10.0, "update_interval_s"),
            (5.0, 0.0, "stationary_s"),
            (5.0, 1e9, "stationary_s"),
        ] {
            let config = AnalyticsConfig {
                update_interval_s: interval,
                stationary_s: stationary,
                ..AnalyticsConfig::default()
            };
            let err = config.validate().unwrap_err();
            assert!(
                err.contains(wrong) && err.contains("positive number of seconds"),
                "{err}"
            );
        }
        let policy = AnalyticsConfig::default().update_policy();
        assert_eq!(policy.interval, Some(Duration::from_secs(5)));
        assert_eq!(policy.stationary_after, Duration::from_secs(10));
        let off = AnalyticsConfig {
            updates: false,
            ..AnalyticsConfig::default()
        };
        assert_eq!(off.update_policy().interval, None);
    }
}
