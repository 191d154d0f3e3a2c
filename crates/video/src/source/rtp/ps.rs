//! An MPEG-2 Program Stream demuxer (ISO/IEC 13818-1 §2.5) for GB28181 cameras, which wrap
//! each frame in a pack: a pack header, at key frames a system header and a program
//! stream map (PSM), then PES packets of the video stream (ids 0xE0-0xEF). It is fed bytes
//! as RTP delivers them, in any split, and returns the video elementary stream (Annex B
//! H.264 or H.265) one access unit at a time with its PTS.
//!
//! Units are parsed only once complete, so a split anywhere is harmless; every length is
//! bounded by the 16-bit field it comes from. After a loss ([`PsDemuxer::lost`]) or bytes
//! that are not a unit, the access unit being gathered is dropped and the demuxer skips to
//! the next pack header. The PSM's stream type names the codec; a stream without one is
//! named by its parameter sets (`nal::sniff_codec`), or by the caller.
//! (The `mpeg-ps` crate parses whole buffers and needs a newer Rust than this workspace;
//! this is the streaming subset a camera needs.)

use bytes::{Bytes, BytesMut};

use super::nal;
use crate::decode::Codec;

const PACK_START: u8 = 0xBA;
const END_CODE: u8 = 0xB9;
const PSM: u8 = 0xBC;
/// PSM stream types (ISO/IEC 13818-1 Table 2-34).
const STREAM_TYPE_H264: u8 = 0x1B;
const STREAM_TYPE_H265: u8 = 0x24;
/// An access unit larger than this is dropped: no camera frame comes near it.
pub const MAX_ACCESS_UNIT_BYTES: usize = 16 << 20;

/// One video access unit out of the program stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PsAccessUnit {
    /// Annex B elementary stream.
    pub data: Bytes,
    /// 33-bit presentation time in 90 kHz ticks, when the PES carried one.
    pub pts_90k: Option<u64>,
    /// The codec, from the PSM or the stream's parameter sets, when known.
    pub codec: Option<Codec>,
}

/// Counts since the demuxer was made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PsStats {
    pub packs: u64,
    pub access_units: u64,
    /// Access units dropped: damaged by a loss, or too large.
    pub dropped: u64,
    /// Times the byte stream was not a unit where one should start.
    pub resyncs: u64,
}

#[derive(Debug, Default)]
pub struct PsDemuxer {
    /// Bytes received and not yet parsed.
    pending: BytesMut,
    /// Skipping to the next pack header (at the start, after a loss or a bad unit).
    syncing: bool,
    /// The video stream id followed (the first one seen).
    video_id: Option<u8>,
    codec: Option<Codec>,
    /// The access unit being gathered, its PTS, and whether part of it was lost.
    au: BytesMut,
    au_pts: Option<u64>,
    au_damaged: bool,
    stats: PsStats,
}

/// What the parser found at the head of the pending bytes.
enum Unit {
    /// More bytes are needed.
    Incomplete,
    /// Not a unit here: skip to the next pack header.
    Garbage,
    /// A unit of this many bytes.
    Whole { id: u8, len: usize },
}

impl PsDemuxer {
    pub fn new() -> Self {
        Self {
            syncing: true,
            ..Self::default()
        }
    }

    /// A demuxer told the codec in advance (the stream URL's `codec=`), which a PSM does
    /// not override.
    pub fn with_codec(codec: Option<Codec>) -> Self {
        Self { codec, ..Self::new() }
    }

    pub fn stats(&self) -> PsStats {
        self.stats
    }

    /// Bytes of the stream in order; complete access units are appended to `out`.
    pub fn push(&mut self, data: &[u8], out: &mut Vec<PsAccessUnit>) {
        self.pending.extend_from_slice(data);
        loop {
            if self.syncing && !self.skip_to_pack() {
                return;
            }
            match self.head() {
                Unit::Incomplete => return,
                Unit::Garbage => self.resync(),
                Unit::Whole { id, len } => {
                    let unit = self.pending.split_to(len).freeze();
                    self.on_unit(id, &unit, out);
                }
            }
        }
    }

    /// Bytes were lost before the next ones pushed: what was gathered is dropped and the
    /// demuxer waits for the next pack header.
    pub fn lost(&mut self) {
        // Whatever was gathered or half-received belongs to a unit that is now incomplete.
        self.au_damaged |= !self.au.is_empty() || self.au_pts.is_some() || !self.pending.is_empty();
        self.pending.clear();
        self.drop_access_unit();
        self.syncing = true;
    }

    /// The sender marked the end of a frame (the RTP marker bit): the access unit gathered
    /// so far is complete.
    pub fn end_of_frame(&mut self, out: &mut Vec<PsAccessUnit>) {
        self.finish_access_unit(out);
    }

    fn resync(&mut self) {
        self.stats.resyncs += 1;
        // Drop the first byte so the search moves past the unit that failed.
        let _ = self.pending.split_to(1.min(self.pending.len()));
        self.au_damaged |= !self.au.is_empty();
        self.drop_access_unit();
        self.syncing = true;
    }

    /// Drops bytes up to the next pack start code; false if none is here yet (the last
    /// three bytes are kept, they may begin one).
    fn skip_to_pack(&mut self) -> bool {
        let found = self.pending.windows(4).position(|w| w == [0, 0, 1, PACK_START]);
        match found {
            Some(at) => {
                let _ = self.pending.split_to(at);
                self.syncing = false;
                true
            }
            None => {
                let keep = self.pending.len().min(3);
                let _ = self.pending.split_to(self.pending.len() - keep);
                false
            }
        }
    }

    fn head(&self) -> Unit {
        let p = &self.pending[..];
        if p.len() < 4 {
            return Unit::Incomplete;
        }
        if p[..3] != [0, 0, 1] {
            return Unit::Garbage;
        }
        let id = p[3];
        let len = match id {
            PACK_START => {
                let Some(&kind) = p.get(4) else {
                    return Unit::Incomplete;
                };
                if kind >> 6 == 0b01 {
                    // MPEG-2: 14 bytes and up to 7 of stuffing.
                    let Some(&stuffing) = p.get(13) else {
                        return Unit::Incomplete;
                    };
                    14 + usize::from(stuffing & 0x07)
                } else if kind >> 4 == 0b0010 {
                    12 // MPEG-1
                } else {
                    return Unit::Garbage;
                }
            }
            END_CODE => 4,
            // Every other unit here is a PES-shaped packet with a 16-bit length.
            0xBB..=0xFF => {
                let (Some(&hi), Some(&lo)) = (p.get(4), p.get(5)) else {
                    return Unit::Incomplete;
                };
                6 + usize::from(u16::from_be_bytes([hi, lo]))
            }
            _ => return Unit::Garbage,
        };
        if p.len() < len {
            return Unit::Incomplete;
        }
        Unit::Whole { id, len }
    }

    fn on_unit(&mut self, id: u8, unit: &[u8], out: &mut Vec<PsAccessUnit>) {
        match id {
            PACK_START => self.stats.packs += 1,
            PSM => self.read_psm(unit),
            // The first video stream seen is the one followed.
            0xE0..=0xEF if self.video_id.is_none_or(|v| v == id) => {
                self.video_id = Some(id);
                self.read_video_pes(unit, out);
            }
            // The end code, system header, audio, private and padding streams: nothing for us.
            _ => {}
        }
    }

    /// The PSM's elementary stream map: the stream type of each stream id.
    fn read_psm(&mut self, unit: &[u8]) {
        let Some(info_len) = be16(unit, 8) else { return };
        let map_at = 10 + usize::from(info_len);
        let Some(map_len) = be16(unit, map_at) else { return };
        let Some(map) = unit.get(map_at + 2..map_at + 2 + usize::from(map_len)) else {
            return;
        };
        let mut rest = map;
        while let [stream_type, es_id, hi, lo, tail @ ..] = rest {
            let skip = usize::from(u16::from_be_bytes([*hi, *lo]));
            let codec = match *stream_type {
                STREAM_TYPE_H264 => Some(Codec::H264),
                STREAM_TYPE_H265 => Some(Codec::H265),
                _ => None,
            };
            if (0xE0..=0xEF).contains(es_id) && self.video_id.is_none_or(|v| v == *es_id) {
                if let Some(codec) = codec {
                    self.codec.get_or_insert(codec);
                }
            }
            rest = tail.get(skip..).unwrap_or(&[]);
        }
    }

    fn read_video_pes(&mut self, unit: &[u8], out: &mut Vec<PsAccessUnit>) {
        // MPEG-2 PES header: '10' marker bits, flags, header length, optional fields.
        let (Some(&first), Some(&flags), Some(&header_len)) = (unit.get(6), unit.get(7), unit.get(8)) else {
            return self.resync_unit();
        };
        if first >> 6 != 0b10 {
            return self.resync_unit();
        }
        let Some(payload) = unit.get(9 + usize::from(header_len)..) else {
            return self.resync_unit();
        };
        let pts = match flags >> 6 {
            0b10 | 0b11 => match unit.get(9..14).and_then(read_timestamp) {
                Some(pts) => Some(pts),
                None => return self.resync_unit(),
            },
            _ => None,
        };
        // A PTS starts a new access unit, unless it repeats the current one's (a frame
        // split over several PES packets, each stamped).
        if pts.is_some() && pts != self.au_pts {
            self.finish_access_unit(out);
            self.au_pts = pts;
        }
        if self.au.len() + payload.len() > MAX_ACCESS_UNIT_BYTES {
            self.au_damaged = true;
            return;
        }
        self.au.extend_from_slice(payload);
    }

    /// A video PES that cannot be read: its access unit is damaged.
    fn resync_unit(&mut self) {
        self.au_damaged = true;
    }

    fn finish_access_unit(&mut self, out: &mut Vec<PsAccessUnit>) {
        if self.au.is_empty() || self.au_damaged {
            self.drop_access_unit();
            return;
        }
        if self.codec.is_none() {
            self.codec = nal::sniff_codec(&self.au);
        }
        self.stats.access_units += 1;
        out.push(PsAccessUnit {
            data: self.au.split().freeze(),
            pts_90k: self.au_pts.take(),
            codec: self.codec,
        });
    }

    fn drop_access_unit(&mut self) {
        if self.au_damaged {
            self.stats.dropped += 1;
        }
        self.au.clear();
        self.au_pts = None;
        self.au_damaged = false;
    }
}

fn be16(data: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*data.get(at)?, *data.get(at + 1)?]))
}

/// A 33-bit PES timestamp from its five bytes (marker bits not insisted on: cameras get
/// them wrong and the value is still right).
fn read_timestamp(b: &[u8]) -> Option<u64> {
    let [b0, b1, b2, b3, b4] = <[u8; 5]>::try_from(b).ok()?;
    Some(
        (u64::from(b0 >> 1) & 0x07) << 30
            | u64::from(b1) << 22
            | u64::from(b2 >> 1) << 15
            | u64::from(b3) << 7
            | u64::from(b4 >> 1),
    )
}

#[cfg(test)]
#[path = "ps_tests.rs"]
mod tests;
