//! Presentation and capture times of a pushed RTP stream, as plain state. A pushing camera
//! sends no RTCP sender reports to map its clock, so the first access unit's arrival
//! anchors it: later units are stamped with the anchor plus their 90 kHz timestamp's
//! distance from the first. Timestamps are unwrapped past their 32-bit (RTP) or 33-bit
//! (PES) range; a unit whose time strays more than `REANCHOR_AFTER` from its arrival (a
//! camera that restarted its clock, or drifted) re-anchors.

use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use crate::frame::{CaptureTime, ClockSource};

/// Distance between a unit's stamped time and its arrival that re-anchors the timeline.
pub const REANCHOR_AFTER: Duration = Duration::from_secs(5);

#[derive(Debug, Clone)]
pub struct RtpTimeline {
    /// Width of the incoming timestamps in bits (32 for RTP, 33 for PES).
    bits: u32,
    /// The last unwrapped timestamp, to unwrap the next against.
    last: Option<i64>,
    /// (unwrapped timestamp, arrival) of the anchor.
    anchor: Option<(i64, SystemTime)>,
    /// The anchor's presentation time: 0 at first; after a re-anchor, the old timeline's
    /// time of the new anchor's arrival, so presentation time follows the wall clock
    /// across it and never jumps back.
    pts_base: i64,
}

impl RtpTimeline {
    pub fn new(bits: u32) -> Self {
        Self {
            bits: bits.clamp(1, 62),
            last: None,
            anchor: None,
            pts_base: 0,
        }
    }

    fn unwrap(&mut self, timestamp: u64) -> i64 {
        let modulus = 1i64 << self.bits;
        let value = (timestamp as i64) & (modulus - 1);
        let unwrapped = match self.last {
            None => value,
            Some(last) => {
                let mut delta = (value - last).rem_euclid(modulus);
                if delta >= modulus / 2 {
                    delta -= modulus;
                }
                last + delta
            }
        };
        self.last = Some(unwrapped);
        unwrapped
    }

    /// The presentation time (90 kHz ticks from the stream's start) and capture time of a
    /// unit with this timestamp, completed at `received` (`received_wall` on the wall
    /// clock).
    pub fn stamp(
        &mut self,
        timestamp: u64,
        received: Instant,
        received_wall: SystemTime,
    ) -> (i64, CaptureTime) {
        let t = self.unwrap(timestamp);
        let (anchor_t, anchor_wall) = *self.anchor.get_or_insert((t, received_wall));
        let offset = t - anchor_t;
        let wall = shift(anchor_wall, offset);
        let strays = match wall.duration_since(received_wall) {
            Ok(ahead) => ahead > REANCHOR_AFTER,
            Err(behind) => behind.duration() > REANCHOR_AFTER,
        };
        let (pts, wall) = if strays {
            self.pts_base += ticks_between(anchor_wall, received_wall);
            self.anchor = Some((t, received_wall));
            (self.pts_base, received_wall)
        } else {
            (self.pts_base + offset, wall)
        };
        let capture = CaptureTime {
            wall,
            source: ClockSource::RtpArrival,
            received,
        };
        (pts, capture)
    }
}

/// 90 kHz ticks from `from` to `to` (negative if `to` is earlier).
fn ticks_between(from: SystemTime, to: SystemTime) -> i64 {
    let ticks = |d: Duration| i64::try_from(d.as_nanos() * 9 / 100_000).unwrap_or(i64::MAX);
    match to.duration_since(from) {
        Ok(d) => ticks(d),
        Err(e) => -ticks(e.duration()),
    }
}

/// `wall` moved by `ticks` of the 90 kHz clock (either way).
pub(crate) fn shift(wall: SystemTime, ticks: i64) -> SystemTime {
    let nanos = u128::from(ticks.unsigned_abs()) * 100_000 / 9;
    let d = Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX));
    let moved = if ticks >= 0 {
        wall.checked_add(d)
    } else {
        wall.checked_sub(d)
    };
    moved.unwrap_or(wall)
}

#[cfg(test)]
mod tests {
    use std::time::UNIX_EPOCH;

    use super::*;

    fn at(ms: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_700_000_000) + Duration::from_millis(ms)
    }

    #[test]
    fn units_are_stamped_from_the_first_arrival() {
        let now = Instant::now();
        let mut t = RtpTimeline::new(32);
        let (pts, c) = t.stamp(1_000, now, at(0));
        assert_eq!((pts, c.wall, c.source), (0, at(0), ClockSource::RtpArrival));
        // Arrival jitter does not move the stamps: the timestamps decide.
        let (pts, c) = t.stamp(1_000 + 9_000, now, at(180));
        assert_eq!((pts, c.wall), (9_000, at(100)));
        // A B-frame shown before the last one.
        let (pts, c) = t.stamp(1_000 + 4_500, now, at(190));
        assert_eq!((pts, c.wall), (4_500, at(50)));
    }

    #[test]
    fn timestamps_unwrap_past_32_and_33_bits() {
        let now = Instant::now();
        let mut t = RtpTimeline::new(32);
        t.stamp(u64::from(u32::MAX) - 899, now, at(0));
        let (pts, c) = t.stamp(8_100, now, at(100));
        assert_eq!((pts, c.wall), (9_000, at(100)));
        let mut t = RtpTimeline::new(33);
        t.stamp((1 << 33) - 900, now, at(0));
        assert_eq!(t.stamp(900, now, at(20)).0, 1_800);
    }

    #[test]
    fn a_clock_that_strays_reanchors_without_going_back() {
        let now = Instant::now();
        let mut t = RtpTimeline::new(32);
        t.stamp(0, now, at(0));
        t.stamp(90_000, now, at(1_000));
        // The camera restarted its clock: the unit is stamped on arrival, and presentation
        // time goes on from the arrival's place on the old timeline.
        let (pts, c) = t.stamp(5, now, at(7_000));
        assert_eq!((pts, c.wall), (630_000, at(7_000)));
        let (pts, c) = t.stamp(5 + 9_000, now, at(7_150));
        assert_eq!((pts, c.wall), (639_000, at(7_100)));
    }
}
