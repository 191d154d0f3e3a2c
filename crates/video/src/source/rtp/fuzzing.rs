//! The fuzz targets' bodies (fuzz/fuzz_targets/rtp_*.rs, ps_demux.rs), here so that unit
//! tests run them too. Each splits the input into packets the way RFC 4571 frames them
//! (a 16-bit length, then the bytes) and checks what must hold whatever the bytes are.

use std::time::{Duration, Instant};

use bytes::Bytes;

use super::depacketize::NalDepacketizer;
use super::jitter::{JitterBuffer, JitterConfig};
use super::packet::RtpPacket;
use super::ps::{PsDemuxer, MAX_ACCESS_UNIT_BYTES};
use crate::decode::Codec;

/// RFC 4571 frames of `data` (a short last frame is cut to what is there).
fn frames(data: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut rest = data;
    std::iter::from_fn(move || {
        let [hi, lo, tail @ ..] = rest else { return None };
        let len = usize::from(u16::from_be_bytes([*hi, *lo])).min(tail.len());
        let (frame, after) = tail.split_at(len);
        rest = after;
        Some(frame)
    })
}

/// RTP packets through the jitter buffer: whatever arrives, packets leave in increasing
/// order, at most once, and the buffer never holds more than its depth plus one.
pub fn rtp_packets(data: &[u8]) {
    let start = Instant::now();
    let config = JitterConfig {
        depth: 16,
        max_delay: Duration::from_millis(50),
    };
    let mut jb = JitterBuffer::new(config);
    let mut released = 0u64;
    for (i, frame) in frames(data).enumerate() {
        let now = start + Duration::from_millis(i as u64 * 3);
        if super::rtcp::is_rtcp(frame) {
            // A sender report is read whole or not at all; what it says is any value.
            let _ = super::rtcp::sender_report(frame);
            continue;
        }
        let Ok(packet) = RtpPacket::parse(Bytes::copy_from_slice(frame)) else {
            continue;
        };
        assert!(packet.payload.len() <= frame.len());
        jb.push(packet, now);
        while jb.pop_ready(now).is_some() {
            released += 1;
        }
        assert!(jb.len() <= config.depth + 1, "held {}", jb.len());
    }
    let end = start + Duration::from_secs(3600);
    while jb.pop_ready(end).is_some() {
        released += 1;
    }
    assert!(jb.is_empty(), "everything leaves once its wait is over");
    let s = jb.stats();
    assert!(released <= s.received - s.late - s.duplicates);
}

/// RTP payloads through both depacketizers, each packet's first byte choosing the loss
/// reported before it and its marker bit.
pub fn rtp_depacketize(data: &[u8]) {
    for codec in [Codec::H264, Codec::H265] {
        let mut d = NalDepacketizer::new(codec);
        let mut out = Vec::new();
        for (i, frame) in frames(data).enumerate() {
            let Some((&control, payload)) = frame.split_first() else {
                continue;
            };
            let packet = RtpPacket {
                marker: control & 1 != 0,
                payload_type: 96,
                sequence: i as u16,
                timestamp: u32::from(control >> 4),
                ssrc: 1,
                csrc_count: 0,
                extension_profile: None,
                payload: Bytes::copy_from_slice(payload),
            };
            d.push(&packet, u64::from((control >> 1) & 1), &mut out);
        }
        for au in &out {
            assert!(!au.data.is_empty() && au.data.len() <= data.len() * 4 + 16);
        }
    }
}

/// A program stream fed in RTP-sized pieces, a piece's first byte saying whether a loss
/// came before it or a frame ends after it.
pub fn ps_demux(data: &[u8]) {
    let mut d = PsDemuxer::new();
    let mut out = Vec::new();
    for frame in frames(data) {
        let Some((&control, bytes)) = frame.split_first() else {
            continue;
        };
        if control & 1 != 0 {
            d.lost();
        }
        d.push(bytes, &mut out);
        if control & 2 != 0 {
            d.end_of_frame(&mut out);
        }
    }
    d.end_of_frame(&mut out);
    for au in &out {
        assert!(!au.data.is_empty() && au.data.len() <= MAX_ACCESS_UNIT_BYTES);
        assert!(au.pts_90k.is_none_or(|t| t < 1 << 33));
    }
    // Every unit handed out is counted.
    let s = d.stats();
    assert!(s.access_units == out.len() as u64);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cheap stand-in for the fuzzer between its runs: random and mutated inputs through
    /// every target (xorshift, fixed seed, so failures reproduce).
    #[test]
    fn the_fuzz_targets_hold_on_random_and_mutated_input() {
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let seeds = seeds();
        for round in 0..3_000 {
            let mut input = if round % 3 == 0 {
                (0..next() % 600).map(|_| next() as u8).collect::<Vec<u8>>()
            } else {
                seeds[round % seeds.len()].clone()
            };
            for _ in 0..next() % 8 {
                if input.is_empty() {
                    break;
                }
                let at = (next() as usize) % input.len();
                input[at] = next() as u8;
            }
            rtp_packets(&input);
            rtp_depacketize(&input);
            ps_demux(&input);
        }
    }

    fn framed(parts: &[Vec<u8>]) -> Vec<u8> {
        parts
            .iter()
            .flat_map(|p| [(p.len() as u16).to_be_bytes().to_vec(), p.clone()].concat())
            .collect()
    }

    /// The checked-in seeds of fuzz/seeds, made the same way.
    pub(crate) fn seeds() -> Vec<Vec<u8>> {
        let mut rtp = Vec::new();
        for seq in [1u16, 3, 2, 2, 9, 4] {
            let mut p = Vec::new();
            super::super::packet::write_packet(
                &mut p,
                seq == 4,
                96,
                seq,
                3600 * u32::from(seq),
                7,
                &[0x41, 1, 2],
            );
            rtp.push(p);
        }
        let stap = vec![0, 24, 0, 2, 0x67, 1, 0, 2, 0x68, 2];
        let fu_start = vec![0, 0x7C, 0x85, 1, 2];
        let fu_end = vec![1, 0x7C, 0x45, 3];
        let h265_ap = vec![0, 96, 1, 0, 3, 0x40, 1, 9];
        let h265_fu = vec![1, 98, 1, 0x93, 5];
        let ps: Vec<u8> = [
            &[0, 0, 0, 1, 0xBA, 0x44, 0, 4, 0, 4, 1, 1, 0x89, 0xC3, 0xF8][..],
            &[
                0, 0, 1, 0xBC, 0, 12, 0xE0, 0xFF, 0, 0, 0, 4, 0x1B, 0xE0, 0, 0, 0, 0,
            ],
            &[
                0, 0, 1, 0xE0, 0, 15, 0x80, 0x80, 5, 0x21, 0, 1, 0, 1, 0, 0, 0, 1, 0x65, 0x88,
            ],
        ]
        .concat();
        let mut ps_pieces: Vec<Vec<u8>> = ps.chunks(7).map(|c| [&[0u8][..], c].concat()).collect();
        if let Some(last) = ps_pieces.last_mut() {
            last[0] = 2;
        }
        vec![
            framed(&rtp),
            framed(&[stap, fu_start, fu_end]),
            framed(&[h265_ap, h265_fu]),
            framed(&ps_pieces),
        ]
    }
}
