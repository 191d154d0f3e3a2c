use super::*;

fn pack_header(scr_90k: u64) -> Vec<u8> {
    let s = scr_90k;
    vec![
        0,
        0,
        1,
        0xBA,
        0x44 | ((s >> 27) & 0x38) as u8 | ((s >> 28) & 0x03) as u8,
        (s >> 20) as u8,
        (((s >> 12) & 0xF8) | 0x04 | ((s >> 13) & 0x03)) as u8,
        (s >> 5) as u8,
        (((s << 3) & 0xF8) | 0x04) as u8,
        0x01,
        0x01,
        0x89,
        0xC3,
        0xF8 | 2, // two stuffing bytes follow
        0xFF,
        0xFF,
    ]
}

fn psm(entries: &[(u8, u8)]) -> Vec<u8> {
    let mut map = Vec::new();
    for &(stream_type, id) in entries {
        map.extend_from_slice(&[stream_type, id, 0, 2, 0xAA, 0xBB]);
    }
    let mut body = vec![0xE0, 0xFF, 0, 0];
    body.extend_from_slice(&(map.len() as u16).to_be_bytes());
    body.extend_from_slice(&map);
    body.extend_from_slice(&[0, 0, 0, 0]); // CRC, not checked
    let mut unit = vec![0, 0, 1, 0xBC];
    unit.extend_from_slice(&(body.len() as u16).to_be_bytes());
    unit.extend_from_slice(&body);
    unit
}

fn pes(id: u8, pts: Option<u64>, payload: &[u8]) -> Vec<u8> {
    let mut header = vec![0x80, 0, 0];
    if let Some(t) = pts {
        header[1] = 0x80;
        header[2] = 5;
        header.extend_from_slice(&[
            0x21 | ((t >> 29) & 0x0E) as u8,
            (t >> 22) as u8,
            0x01 | ((t >> 14) & 0xFE) as u8,
            (t >> 7) as u8,
            0x01 | ((t << 1) & 0xFE) as u8,
        ]);
    }
    let mut unit = vec![0, 0, 1, id];
    unit.extend_from_slice(&((header.len() + payload.len()) as u16).to_be_bytes());
    unit.extend_from_slice(&header);
    unit.extend_from_slice(payload);
    unit
}

const IDR: &[u8] = &[0, 0, 0, 1, 0x67, 0x42, 0, 0, 0, 1, 0x65, 0x88, 0x84];
const P: &[u8] = &[0, 0, 0, 1, 0x41, 0x9a, 0x02];

/// A GB28181-style stream: a key frame with system header and PSM, then a P frame whose
/// elementary stream is split over two PES packets (only the first stamped), then audio.
fn stream() -> Vec<u8> {
    let mut s = pack_header(0);
    s.extend_from_slice(&[0, 0, 1, 0xBB, 0, 3, 1, 2, 3]);
    s.extend(psm(&[(0x0F, 0xC0), (0x1B, 0xE0)]));
    s.extend(pes(0xE0, Some(3600), IDR));
    s.extend(pack_header(3600));
    s.extend(pes(0xE0, Some(7200), &P[..4]));
    s.extend(pes(0xE0, None, &P[4..]));
    s.extend(pes(0xC0, Some(7200), b"audio"));
    s.extend(pack_header(7200));
    s.extend(pes(0xE0, Some(10_800), P));
    s
}

fn demux(chunks: &[&[u8]]) -> (Vec<PsAccessUnit>, PsStats) {
    let mut d = PsDemuxer::new();
    let mut out = Vec::new();
    for c in chunks {
        d.push(c, &mut out);
    }
    d.end_of_frame(&mut out);
    (out, d.stats())
}

#[test]
fn demuxes_access_units_with_their_pts_and_codec() {
    let s = stream();
    let (aus, stats) = demux(&[&s]);
    let got: Vec<_> = aus.iter().map(|a| (a.pts_90k, &a.data[..], a.codec)).collect();
    assert_eq!(
        got,
        vec![
            (Some(3600), IDR, Some(Codec::H264)),
            (Some(7200), P, Some(Codec::H264)),
            (Some(10_800), P, Some(Codec::H264)),
        ]
    );
    assert_eq!(
        (stats.packs, stats.access_units, stats.dropped, stats.resyncs),
        (3, 3, 0, 0)
    );
}

#[test]
fn any_split_of_the_bytes_gives_the_same_units() {
    let s = stream();
    let (whole, _) = demux(&[&s]);
    for size in [1, 2, 3, 5, 7, 13, 100] {
        let chunks: Vec<&[u8]> = s.chunks(size).collect();
        assert_eq!(demux(&chunks).0, whole, "chunks of {size}");
    }
}

#[test]
fn the_psm_names_h265_and_its_absence_is_sniffed() {
    let mut s = pack_header(0);
    s.extend(psm(&[(0x24, 0xE0)]));
    s.extend(pes(0xE0, Some(0), P)); // not an H.265 parameter set, but the PSM says so
    assert_eq!(demux(&[&s]).0[0].codec, Some(Codec::H265));
    let mut s = pack_header(0);
    s.extend(pes(0xE0, Some(0), &[0, 0, 1, 0x40, 0x01, 0x0c]));
    assert_eq!(demux(&[&s]).0[0].codec, Some(Codec::H265));
    let mut d = PsDemuxer::with_codec(Some(Codec::H264));
    let mut out = Vec::new();
    let mut s = pack_header(0);
    s.extend(psm(&[(0x24, 0xE0)]));
    s.extend(pes(0xE0, Some(0), P));
    d.push(&s, &mut out);
    d.end_of_frame(&mut out);
    assert_eq!(out[0].codec, Some(Codec::H264), "the caller's codec wins");
}

#[test]
fn a_loss_drops_the_damaged_unit_and_resyncs_at_the_next_pack() {
    let s = stream();
    let packs: Vec<usize> = (0..s.len() - 3)
        .filter(|&i| s[i..i + 4] == [0, 0, 1, 0xBA])
        .collect();
    let mut d = PsDemuxer::new();
    let mut out = Vec::new();
    d.push(&s[..packs[1]], &mut out);
    d.end_of_frame(&mut out); // the RTP marker
    d.push(&s[packs[1]..packs[1] + 20], &mut out); // into the P frame's first PES
    d.lost();
    d.push(&s[packs[1] + 30..], &mut out);
    d.end_of_frame(&mut out);
    let pts: Vec<_> = out.iter().map(|a| a.pts_90k).collect();
    assert_eq!(pts, vec![Some(3600), Some(10_800)]);
    assert_eq!(d.stats().dropped, 1);
}

#[test]
fn garbage_before_and_between_units_is_skipped() {
    let mut s = b"\x00\x00\x01\xE0junk before any pack".to_vec();
    s.extend(stream());
    let (aus, _) = demux(&[&s]);
    assert_eq!(aus.len(), 3);
    // Bytes that are no unit in the middle: the frame around them is lost, not the rest.
    let mut s = stream();
    let at = s.windows(4).rposition(|w| w == [0, 0, 1, 0xBA]).unwrap();
    s.splice(at..at, *b"\x12\x34\x56");
    let (aus, stats) = demux(&[&s]);
    assert_eq!(
        aus.iter().map(|a| a.pts_90k).collect::<Vec<_>>(),
        vec![Some(3600), Some(10_800)]
    );
    assert_eq!(stats.resyncs, 1);
}

#[test]
fn a_second_video_stream_is_ignored() {
    let mut s = pack_header(0);
    s.extend(pes(0xE0, Some(0), IDR));
    s.extend(pes(0xE1, Some(0), P));
    s.extend(pes(0xE0, Some(3600), P));
    let (aus, _) = demux(&[&s]);
    assert_eq!(aus.iter().map(|a| &a.data[..]).collect::<Vec<_>>(), vec![IDR, P]);
}

#[test]
fn timestamps_use_all_33_bits() {
    let big = (1u64 << 33) - 1;
    let mut s = pack_header(0);
    s.extend(pes(0xE0, Some(big), P));
    assert_eq!(demux(&[&s]).0[0].pts_90k, Some(big));
}
