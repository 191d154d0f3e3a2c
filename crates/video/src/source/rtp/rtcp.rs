//! RTCP sender reports (RFC 3550 §6.4.1) from a pushing camera: the one packet that maps its
//! RTP clock to wall-clock time. A report arrives alone or first in a compound packet, on
//! the RTP port (multiplexed, RFC 5761: packet types 200-204 cannot be RTP payload types of
//! a camera), on the next port up, or framed in the same TCP connection.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// NTP's era starts 70 years before Unix time.
const NTP_TO_UNIX_SECONDS: u64 = 2_208_988_800;

/// What a sender report says: at `wall` on the sender's clock, its RTP clock read
/// `rtp_timestamp`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SenderReport {
    pub ssrc: u32,
    pub wall: SystemTime,
    pub rtp_timestamp: u32,
}

/// Whether the bytes are RTCP rather than RTP: version 2 and a packet type of 200-204
/// (RTP with the marker bit would read as payload types 72-76, never a camera's).
pub fn is_rtcp(data: &[u8]) -> bool {
    data.len() >= 8 && data[0] >> 6 == 2 && (200..=204).contains(&data[1])
}

/// The sender report at the start of an RTCP (compound) packet, if it is one and whole.
pub fn sender_report(data: &[u8]) -> Option<SenderReport> {
    if !is_rtcp(data) || data[1] != 200 {
        return None;
    }
    // Length in 32-bit words minus one; a sender report's sender info needs 28 bytes.
    let words = usize::from(u16::from_be_bytes([data[2], data[3]])) + 1;
    if words * 4 < 28 || data.len() < words * 4 {
        return None;
    }
    let word = |at: usize| u32::from_be_bytes([data[at], data[at + 1], data[at + 2], data[at + 3]]);
    let seconds = u64::from(word(8));
    let fraction = u64::from(word(12));
    // A clock before 1970 (NTP era 0 that far back, or a camera without a set clock
    // reporting small values) maps to no wall time at all.
    let unix = seconds.checked_sub(NTP_TO_UNIX_SECONDS)?;
    let nanos = (fraction * 1_000_000_000) >> 32;
    Some(SenderReport {
        ssrc: word(4),
        wall: UNIX_EPOCH + Duration::from_secs(unix) + Duration::from_nanos(nanos),
        rtp_timestamp: word(16),
    })
}

/// A sender report's bytes, as a camera sends it (no report blocks): for tests and the
/// simulated devices.
pub fn encode_sender_report(report: &SenderReport, packets: u32, octets: u32) -> Vec<u8> {
    let since = report.wall.duration_since(UNIX_EPOCH).unwrap_or_default();
    let seconds = (since.as_secs() + NTP_TO_UNIX_SECONDS) as u32;
    let fraction = ((u64::from(since.subsec_nanos()) << 32) / 1_000_000_000) as u32;
    let mut out = vec![0x80, 200, 0, 6];
    for word in [
        report.ssrc,
        seconds,
        fraction,
        report.rtp_timestamp,
        packets,
        octets,
    ] {
        out.extend_from_slice(&word.to_be_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_round_trips_to_the_microsecond() {
        let report = SenderReport {
            ssrc: 0x0BEB_C201,
            wall: UNIX_EPOCH + Duration::from_micros(1_796_522_000_123_456),
            rtp_timestamp: 0xFFFF_0123,
        };
        let bytes = encode_sender_report(&report, 10, 14_000);
        assert!(is_rtcp(&bytes));
        let back = sender_report(&bytes).unwrap();
        assert_eq!(
            (back.ssrc, back.rtp_timestamp),
            (report.ssrc, report.rtp_timestamp)
        );
        let error = back
            .wall
            .duration_since(report.wall)
            .unwrap_or_else(|e| e.duration());
        assert!(error < Duration::from_micros(1), "{error:?}");
        // First in a compound packet (an SDES after it) it is still read.
        let mut compound = bytes.clone();
        compound.extend_from_slice(&[0x81, 202, 0, 1, 0, 0, 0, 1]);
        assert_eq!(sender_report(&compound), Some(back));
    }

    #[test]
    fn other_packets_are_not_reports() {
        let report = SenderReport {
            ssrc: 1,
            wall: UNIX_EPOCH + Duration::from_secs(1_796_522_000),
            rtp_timestamp: 0,
        };
        let bytes = encode_sender_report(&report, 0, 0);
        // RTP (payload type 96), a receiver report, a truncated report, a wrong version.
        assert!(!is_rtcp(&[0x80, 96, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1]));
        let mut receiver = bytes.clone();
        receiver[1] = 201;
        assert!(is_rtcp(&receiver) && sender_report(&receiver).is_none());
        assert!(sender_report(&bytes[..20]).is_none());
        let mut v1 = bytes.clone();
        v1[0] = 0x40;
        assert!(sender_report(&v1).is_none());
        // A clock that was never set (NTP seconds near 0).
        let unset = [
            0x80, 200, 0, 6, 0, 0, 0, 1, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        ];
        assert!(sender_report(&unset).is_none());
    }
}
