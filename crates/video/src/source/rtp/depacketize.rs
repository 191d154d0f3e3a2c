//! Plain RTP video without a program stream: H.264 (RFC 6184: single NAL unit packets,
//! STAP-A aggregates, FU-A fragments) and H.265 (RFC 7798: single NAL unit packets,
//! aggregation packets, fragmentation units; no DONL, as `sprop-max-don-diff` 0 has it).
//! Packets come in order (from the jitter buffer) with the count lost before each; an
//! access unit ends at the marker bit or when the timestamp changes, and one that lost a
//! packet is dropped whole. Output is Annex B with 4-byte start codes.

use bytes::{Bytes, BytesMut};

use super::nal::{access_unit_is_key, START_CODE};
use super::packet::RtpPacket;
use crate::decode::Codec;

/// An access unit larger than this is dropped.
pub const MAX_ACCESS_UNIT_BYTES: usize = 16 << 20;

/// One access unit, reassembled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RtpAccessUnit {
    pub data: Bytes,
    pub timestamp: u32,
    pub is_key: bool,
}

/// Counts since the depacketizer was made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DepacketizeStats {
    pub access_units: u64,
    /// Access units dropped: a packet of theirs lost, malformed or too large.
    pub dropped: u64,
    /// Packets of kinds not supported (STAP-B, MTAP, FU-B, PACI) or malformed.
    pub bad_packets: u64,
}

#[derive(Debug)]
pub struct NalDepacketizer {
    codec: Codec,
    au: BytesMut,
    timestamp: Option<u32>,
    damaged: bool,
    /// A fragmented NAL unit is open (its start was seen).
    in_fragment: bool,
    stats: DepacketizeStats,
}

impl NalDepacketizer {
    pub fn new(codec: Codec) -> Self {
        Self {
            codec,
            au: BytesMut::new(),
            timestamp: None,
            damaged: false,
            in_fragment: false,
            stats: DepacketizeStats::default(),
        }
    }

    pub fn stats(&self) -> DepacketizeStats {
        self.stats
    }

    /// The next packet in sequence order, `lost_before` packets after the previous one.
    pub fn push(&mut self, packet: &RtpPacket, lost_before: u64, out: &mut Vec<RtpAccessUnit>) {
        if self.timestamp.is_some_and(|t| t != packet.timestamp) {
            self.finish(out);
        }
        if lost_before > 0 {
            // The lost packets may have belonged to this access unit or ended the last one.
            self.damaged |= self.timestamp.is_some() || self.in_fragment;
            self.in_fragment = false;
        }
        self.timestamp = Some(packet.timestamp);
        let ok = match self.codec {
            Codec::H264 => self.push_h264(&packet.payload),
            Codec::H265 => self.push_h265(&packet.payload),
        };
        if !ok {
            self.stats.bad_packets += 1;
            self.damaged = true;
        }
        if self.au.len() > MAX_ACCESS_UNIT_BYTES {
            self.damaged = true;
            self.au.clear();
        }
        if packet.marker {
            self.finish(out);
        }
    }

    fn push_h264(&mut self, p: &[u8]) -> bool {
        let Some(&header) = p.first() else { return false };
        match header & 0x1F {
            1..=23 => self.append_unit(&[], p),
            24 => self.append_aggregate(&p[1..]),
            28 => {
                let Some(&fu) = p.get(1) else { return false };
                let reconstructed = [(header & 0xE0) | (fu & 0x1F)];
                self.append_fragment(fu & 0x80 != 0, fu & 0x40 != 0, &reconstructed, &p[2..])
            }
            _ => false,
        }
    }

    fn push_h265(&mut self, p: &[u8]) -> bool {
        let (Some(&h0), Some(&h1)) = (p.first(), p.get(1)) else {
            return false;
        };
        match (h0 >> 1) & 0x3F {
            0..=47 => self.append_unit(&[], p),
            48 => self.append_aggregate(&p[2..]),
            49 => {
                let Some(&fu) = p.get(2) else { return false };
                let reconstructed = [(h0 & 0x81) | ((fu & 0x3F) << 1), h1];
                self.append_fragment(fu & 0x80 != 0, fu & 0x40 != 0, &reconstructed, &p[3..])
            }
            _ => false,
        }
    }

    fn append_unit(&mut self, header: &[u8], body: &[u8]) -> bool {
        if self.in_fragment {
            // A fragment's end went missing without a reported loss: the sender's fault.
            self.in_fragment = false;
            self.damaged = true;
        }
        self.au.extend_from_slice(&START_CODE);
        self.au.extend_from_slice(header);
        self.au.extend_from_slice(body);
        true
    }

    /// STAP-A / AP: 16-bit sizes, each followed by a NAL unit.
    fn append_aggregate(&mut self, mut rest: &[u8]) -> bool {
        if rest.is_empty() {
            return false;
        }
        while !rest.is_empty() {
            let [hi, lo, tail @ ..] = rest else { return false };
            let len = usize::from(u16::from_be_bytes([*hi, *lo]));
            let Some(unit) = tail.get(..len).filter(|u| !u.is_empty()) else {
                return false;
            };
            self.append_unit(&[], unit);
            rest = &tail[len..];
        }
        true
    }

    fn append_fragment(&mut self, start: bool, end: bool, header: &[u8], body: &[u8]) -> bool {
        if start {
            if !self.append_unit(header, body) {
                return false;
            }
            self.in_fragment = !end;
            return true;
        }
        if !self.in_fragment {
            // The start went missing: nothing to continue.
            return false;
        }
        self.au.extend_from_slice(body);
        if end {
            self.in_fragment = false;
        }
        true
    }

    fn finish(&mut self, out: &mut Vec<RtpAccessUnit>) {
        let Some(timestamp) = self.timestamp.take() else {
            return;
        };
        let damaged = self.damaged || self.in_fragment;
        self.damaged = false;
        self.in_fragment = false;
        if damaged {
            self.stats.dropped += 1;
            self.au.clear();
            return;
        }
        if self.au.is_empty() {
            return;
        }
        let data = self.au.split().freeze();
        self.stats.access_units += 1;
        out.push(RtpAccessUnit {
            is_key: access_unit_is_key(self.codec, &data),
            data,
            timestamp,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pkt(seq: u16, ts: u32, marker: bool, payload: &[u8]) -> RtpPacket {
        RtpPacket {
            marker,
            payload_type: 96,
            sequence: seq,
            timestamp: ts,
            ssrc: 1,
            csrc_count: 0,
            extension_profile: None,
            payload: Bytes::copy_from_slice(payload),
        }
    }

    fn run(codec: Codec, packets: &[(RtpPacket, u64)]) -> (Vec<RtpAccessUnit>, DepacketizeStats) {
        let mut d = NalDepacketizer::new(codec);
        let mut out = Vec::new();
        for (p, lost) in packets {
            d.push(p, *lost, &mut out);
        }
        (out, d.stats())
    }

    #[test]
    fn h264_single_stap_a_and_fu_a() {
        let sps = [0x67, 0x42, 0x00];
        let pps = [0x68, 0xCE];
        let mut stap = vec![24u8];
        for u in [&sps[..], &pps[..]] {
            stap.extend_from_slice(&(u.len() as u16).to_be_bytes());
            stap.extend_from_slice(u);
        }
        // An IDR slice (nri 3, type 5) in three fragments.
        let fu = |bits: u8, body: &[u8]| [&[0x7C, bits | 5][..], body].concat();
        let packets = [
            (pkt(1, 100, false, &stap), 0),
            (pkt(2, 100, false, &fu(0x80, &[1, 2])), 0),
            (pkt(3, 100, false, &fu(0x00, &[3])), 0),
            (pkt(4, 100, true, &fu(0x40, &[4])), 0),
            (pkt(5, 200, true, &[0x41, 9, 9]), 0),
        ];
        let (aus, stats) = run(Codec::H264, &packets);
        let want_idr = [
            &START_CODE[..],
            &sps,
            &START_CODE,
            &pps,
            &START_CODE,
            &[0x65, 1, 2, 3, 4],
        ]
        .concat();
        assert_eq!(aus.len(), 2, "{stats:?}");
        assert_eq!(
            (&aus[0].data[..], aus[0].timestamp, aus[0].is_key),
            (&want_idr[..], 100, true)
        );
        assert_eq!(
            (&aus[1].data[..], aus[1].is_key),
            (&[0, 0, 0, 1, 0x41, 9, 9][..], false)
        );
    }

    #[test]
    fn a_timestamp_change_ends_an_access_unit_without_a_marker() {
        let packets = [
            (pkt(1, 100, false, &[0x41, 1]), 0),
            (pkt(2, 200, false, &[0x41, 2]), 0),
        ];
        let mut d = NalDepacketizer::new(Codec::H264);
        let mut out = Vec::new();
        for (p, lost) in &packets {
            d.push(p, *lost, &mut out);
        }
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].timestamp, 100);
    }

    #[test]
    fn a_loss_drops_the_access_unit_it_hit() {
        let fu = |bits: u8, body: &[u8]| [&[0x7C, bits | 1][..], body].concat();
        let packets = [
            (pkt(1, 100, false, &fu(0x80, &[1])), 0),
            (pkt(3, 100, true, &fu(0x40, &[3])), 1),
            (pkt(4, 200, true, &[0x41, 9]), 0),
            // The start of a fragmented unit lost with the previous access unit's end.
            (pkt(6, 300, true, &fu(0x40, &[5])), 1),
            (pkt(7, 400, true, &[0x41, 7]), 0),
        ];
        let (aus, stats) = run(Codec::H264, &packets);
        assert_eq!(
            aus.iter().map(|a| a.timestamp).collect::<Vec<_>>(),
            vec![200, 400]
        );
        assert_eq!(stats.dropped, 2);
    }

    #[test]
    fn h265_single_ap_and_fu() {
        let vps = [0x40, 0x01, 0x0C];
        let sps = [0x42, 0x01, 0x01];
        let mut ap = vec![48 << 1, 1];
        for u in [&vps[..], &sps[..]] {
            ap.extend_from_slice(&(u.len() as u16).to_be_bytes());
            ap.extend_from_slice(u);
        }
        // An IDR_W_RADL slice (type 19) in two fragments.
        let fu = |bits: u8, body: &[u8]| [&[49 << 1, 1, bits | 19][..], body].concat();
        let packets = [
            (pkt(1, 9, false, &ap), 0),
            (pkt(2, 9, false, &fu(0x80, &[0xAF, 1])), 0),
            (pkt(3, 9, true, &fu(0x40, &[2])), 0),
            (pkt(4, 10, true, &[0x02, 0x01, 0xD0]), 0),
        ];
        let (aus, _) = run(Codec::H265, &packets);
        let want = [
            &START_CODE[..],
            &vps,
            &START_CODE,
            &sps,
            &START_CODE,
            &[19 << 1, 1, 0xAF, 1, 2],
        ]
        .concat();
        assert_eq!((&aus[0].data[..], aus[0].is_key), (&want[..], true));
        assert!(!aus[1].is_key);
    }

    #[test]
    fn malformed_packets_damage_their_access_unit_only() {
        let packets = [
            (pkt(1, 1, true, &[24, 0, 9, 0x41]), 0), // STAP-A claiming more than it has
            (pkt(2, 2, true, &[]), 0),
            (pkt(3, 3, true, &[26, 0]), 0), // MTAP: not supported
            (pkt(4, 4, true, &[28]), 0),    // FU-A without its header
            (pkt(5, 5, true, &[0x41, 5]), 0),
        ];
        let (aus, stats) = run(Codec::H264, &packets);
        assert_eq!(aus.iter().map(|a| a.timestamp).collect::<Vec<_>>(), vec![5]);
        assert_eq!((stats.bad_packets, stats.dropped), (4, 4));
    }
}
