//! Wall-clock capture times for RTP streams. A camera's RTCP sender reports pair an RTP
//! timestamp with its NTP wall clock; with that pair, every frame's RTP timestamp maps to
//! the time the camera captured it, so results from several cameras line up. Until the
//! first report (or for a camera that sends none) the local receive time stands in, and
//! each frame says which clock it got.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

use crate::frame::{CaptureTime, ClockSource};

/// Seconds from 1900 (NTP's epoch) to 1970 (Unix's).
const NTP_UNIX_OFFSET_SECS: u64 = 2_208_988_800;

/// An NTP timestamp (32.32 fixed point seconds since 1900) as a `SystemTime`; `None` for
/// times before 1970, which no working camera sends.
pub fn ntp_to_system_time(ntp: u64) -> Option<SystemTime> {
    let secs = (ntp >> 32).checked_sub(NTP_UNIX_OFFSET_SECS)?;
    let nanos = ((ntp & 0xFFFF_FFFF) * 1_000_000_000) >> 32;
    UNIX_EPOCH.checked_add(Duration::from_secs(secs) + Duration::from_nanos(nanos))
}

/// The latest sender report's mapping for one RTP stream.
#[derive(Debug, Clone, Default)]
pub struct RtcpCaptureClock {
    /// (extended RTP timestamp, wall clock) of the latest sender report.
    mapping: Option<(i64, SystemTime)>,
}

impl RtcpCaptureClock {
    /// Records a sender report; reports with an unusable NTP time are ignored.
    pub fn on_sender_report(&mut self, rtp_timestamp: i64, ntp: u64) {
        if let Some(wall) = ntp_to_system_time(ntp) {
            self.mapping = Some((rtp_timestamp, wall));
        }
    }

    /// The capture time of a frame with extended RTP timestamp `rtp_timestamp`, received
    /// at `received` (monotonic) and `received_wall`.
    pub fn capture_time(
        &self,
        rtp_timestamp: i64,
        clock_rate: u32,
        received: Instant,
        received_wall: SystemTime,
    ) -> CaptureTime {
        let local = CaptureTime {
            wall: received_wall,
            source: ClockSource::LocalReceive,
            received,
        };
        let Some((sr_rtp, sr_wall)) = self.mapping else {
            return local;
        };
        let rate = f64::from(clock_rate.max(1));
        let offset = (rtp_timestamp - sr_rtp) as f64 / rate;
        let Ok(delta) = Duration::try_from_secs_f64(offset.abs()) else {
            return local;
        };
        let wall = if offset >= 0.0 {
            sr_wall.checked_add(delta)
        } else {
            sr_wall.checked_sub(delta)
        };
        match wall {
            Some(wall) => CaptureTime {
                wall,
                source: ClockSource::RtcpSenderReport,
                received,
            },
            None => local,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ntp_converts_to_unix_time() {
        // 2024-01-01T00:00:00Z plus half a second.
        let unix = 1_704_067_200u64;
        let ntp = ((unix + NTP_UNIX_OFFSET_SECS) << 32) | 0x8000_0000;
        let t = ntp_to_system_time(ntp).unwrap();
        assert_eq!(
            t.duration_since(UNIX_EPOCH).unwrap(),
            Duration::from_millis(unix * 1000 + 500)
        );
        assert_eq!(ntp_to_system_time(5 << 32), None, "before 1970");
    }

    #[test]
    fn frames_map_through_the_latest_sender_report() {
        let mut clock = RtcpCaptureClock::default();
        let now = Instant::now();
        let local_wall = UNIX_EPOCH + Duration::from_secs(1_000_000_000);
        let before = clock.capture_time(90_000, 90_000, now, local_wall);
        assert_eq!(before.source, ClockSource::LocalReceive);
        assert_eq!(before.wall, local_wall);

        let sr_unix = 1_704_067_200u64;
        clock.on_sender_report(180_000, (sr_unix + NTP_UNIX_OFFSET_SECS) << 32);
        let sr_wall = UNIX_EPOCH + Duration::from_secs(sr_unix);
        let later = clock.capture_time(180_000 + 45_000, 90_000, now, local_wall);
        assert_eq!(later.source, ClockSource::RtcpSenderReport);
        assert_eq!(later.wall, sr_wall + Duration::from_millis(500));
        let earlier = clock.capture_time(180_000 - 9_000, 90_000, now, local_wall);
        assert_eq!(earlier.wall, sr_wall - Duration::from_millis(100));
    }
}
