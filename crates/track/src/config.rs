//! The tracker's settings and their checks.

use std::time::Duration;

/// How a [`crate::Tracker`] associates, confirms and drops tracks. The defaults are those of
/// `trackers.ByteTrackTracker` 2.6.1 (Roboflow's ByteTrack, formerly supervision's).
#[derive(Debug, Clone, PartialEq)]
pub struct TrackerConfig {
    /// Detections scoring at least this take part in the first association stage and may
    /// start tracks; the rest go to the second stage (`high_conf_det_threshold`, 0.6).
    pub high_score: f32,
    /// Detections scoring below this are ignored. `trackers` has no such floor (every
    /// detection under `high_score` enters the second stage), so the default is 0.0: the
    /// detector's own confidence threshold is the floor.
    pub low_score: f32,
    /// An unmatched first-stage detection starts a tentative track only when it scores at
    /// least this (`track_activation_threshold`, 0.7).
    pub new_track_score: f32,
    /// A track and a detection match only when the IoU of the track's predicted box and the
    /// detection's box is at least this (`minimum_iou_threshold`, 0.1).
    pub match_iou: f32,
    /// A tentative track is confirmed (gets an id) once matched in this many consecutive
    /// frames, its first detection included (`minimum_consecutive_frames`, 2). A track is never
    /// confirmed on its first frame: even 1 confirms at the second, as in `trackers`.
    pub min_hits: u32,
    /// A confirmed track that has gone this much media time without a detection ends
    /// (`lost_track_buffer` 30 frames at `frame_rate` 30: 1 s). It can still be matched on the
    /// first frame past the budget, as `trackers` allows one last re-association.
    pub lost_after: Duration,
    /// A track only matches detections of its own class (`trackers` ignores classes: set
    /// false to match it).
    pub class_aware: bool,
}

impl Default for TrackerConfig {
    fn default() -> Self {
        Self {
            high_score: 0.6,
            low_score: 0.0,
            new_track_score: 0.7,
            match_iou: 0.1,
            min_hits: 2,
            lost_after: Duration::from_secs(1),
            class_aware: true,
        }
    }
}

/// A setting out of its range.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TrackConfigError {
    #[error("track.{name} {value} is outside [0, 1]")]
    OutOfUnitRange { name: &'static str, value: f32 },
    #[error("track.low_score {low} is above track.high_score {high}: the low stage takes scores from low_score up to high_score")]
    LowAboveHigh { low: f32, high: f32 },
    #[error("track.min_hits is 0: a track needs at least one detection (1 or more)")]
    NoHits,
}

impl TrackerConfig {
    pub fn validate(&self) -> Result<(), TrackConfigError> {
        for (name, value) in [
            ("high_score", self.high_score),
            ("low_score", self.low_score),
            ("new_track_score", self.new_track_score),
            ("match_iou", self.match_iou),
        ] {
            if !(0.0..=1.0).contains(&value) {
                return Err(TrackConfigError::OutOfUnitRange { name, value });
            }
        }
        if self.low_score > self.high_score {
            return Err(TrackConfigError::LowAboveHigh {
                low: self.low_score,
                high: self.high_score,
            });
        }
        if self.min_hits == 0 {
            return Err(TrackConfigError::NoHits);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        assert_eq!(TrackerConfig::default().validate(), Ok(()));
    }

    #[test]
    fn messages_name_the_setting_and_the_value() {
        let cases: [(TrackerConfig, &str); 6] = [
            (
                TrackerConfig {
                    low_score: 1.5,
                    ..Default::default()
                },
                "track.low_score 1.5 is outside [0, 1]",
            ),
            (
                TrackerConfig {
                    high_score: -0.1,
                    ..Default::default()
                },
                "track.high_score -0.1 is outside [0, 1]",
            ),
            (
                TrackerConfig {
                    new_track_score: f32::NAN,
                    ..Default::default()
                },
                "track.new_track_score NaN is outside [0, 1]",
            ),
            (
                TrackerConfig {
                    match_iou: 2.0,
                    ..Default::default()
                },
                "track.match_iou 2 is outside [0, 1]",
            ),
            (
                TrackerConfig {
                    low_score: 0.7,
                    high_score: 0.5,
                    ..Default::default()
                },
                "track.low_score 0.7 is above track.high_score 0.5: the low stage takes scores from low_score up to high_score",
            ),
            (
                TrackerConfig {
                    min_hits: 0,
                    ..Default::default()
                },
                "track.min_hits is 0: a track needs at least one detection (1 or more)",
            ),
        ];
        for (config, message) in cases {
            assert_eq!(config.validate().unwrap_err().to_string(), message);
        }
    }
}
