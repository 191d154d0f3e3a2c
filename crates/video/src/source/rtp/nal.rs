//! Annex B byte streams: finding NAL units between start codes, and telling which access
//! units a decoder can start from.

use crate::decode::Codec;

/// The 4-byte start code written before every NAL unit the depacketizers emit.
pub const START_CODE: [u8; 4] = [0, 0, 0, 1];

/// The NAL units of an Annex B stream, without their start codes (leading zero bytes of a
/// 4-byte start code and trailing zeros are not part of a unit).
pub fn annex_b_units(data: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut rest = data;
    std::iter::from_fn(move || loop {
        let start = find_start_code(rest)?;
        let body = &rest[start + 3..];
        let end = find_start_code(body).unwrap_or(body.len());
        rest = &body[end..];
        let mut unit = &body[..end];
        while let [head @ .., 0] = unit {
            unit = head;
        }
        if !unit.is_empty() {
            return Some(unit);
        }
    })
}

fn find_start_code(data: &[u8]) -> Option<usize> {
    data.windows(3).position(|w| w == [0, 0, 1])
}

/// The NAL unit type of a unit's header.
pub fn nal_type(codec: Codec, unit: &[u8]) -> Option<u8> {
    let first = *unit.first()?;
    Some(match codec {
        Codec::H264 => first & 0x1F,
        Codec::H265 => (first >> 1) & 0x3F,
    })
}

/// Whether decoding can start at a NAL unit of this type: an IDR picture (H.264) or an
/// IRAP picture (H.265: BLA, IDR, CRA).
pub fn is_random_access(codec: Codec, nal_type: u8) -> bool {
    match codec {
        Codec::H264 => nal_type == 5,
        Codec::H265 => (16..=21).contains(&nal_type),
    }
}

/// Whether an Annex B access unit holds a random access picture.
pub fn access_unit_is_key(codec: Codec, data: &[u8]) -> bool {
    annex_b_units(data).any(|u| nal_type(codec, u).is_some_and(|t| is_random_access(codec, t)))
}

/// Which codec an Annex B stream is, from its parameter sets: an H.265 VPS, SPS or PPS
/// (types 32-34 with a zero layer id) or an H.264 SPS or PPS (types 7, 8). `None` until
/// one of them is seen.
pub fn sniff_codec(data: &[u8]) -> Option<Codec> {
    annex_b_units(data).find_map(|u| {
        let h265 = u.len() >= 2 && u[0] & 0x81 == 0 && (32..=34).contains(&((u[0] >> 1) & 0x3F)) && u[1] == 1;
        let h264 = u[0] & 0x80 == 0 && matches!(u[0] & 0x1F, 7 | 8) && u[0] & 0x60 != 0;
        match (h265, h264) {
            (true, _) => Some(Codec::H265),
            (false, true) => Some(Codec::H264),
            _ => None,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_units_on_three_and_four_byte_start_codes() {
        let data = [0, 0, 0, 1, 0x67, 1, 2, 0, 0, 1, 0x68, 3, 0, 0, 0, 1, 0x65, 4, 0];
        let units: Vec<&[u8]> = annex_b_units(&data).collect();
        assert_eq!(units, vec![&[0x67, 1, 2][..], &[0x68, 3][..], &[0x65, 4][..]]);
        assert_eq!(annex_b_units(&[1, 2, 3]).count(), 0);
        assert_eq!(annex_b_units(&[0, 0, 1]).count(), 0);
    }

    #[test]
    fn finds_key_frames_and_codecs() {
        let h264_idr = [0, 0, 0, 1, 0x67, 0x42, 0, 0, 1, 0x65, 0x88];
        let h264_p = [0, 0, 0, 1, 0x41, 0x9a];
        assert!(access_unit_is_key(Codec::H264, &h264_idr));
        assert!(!access_unit_is_key(Codec::H264, &h264_p));
        assert_eq!(sniff_codec(&h264_idr), Some(Codec::H264));
        assert_eq!(sniff_codec(&h264_p), None);
        let h265_idr = [0, 0, 0, 1, 0x40, 0x01, 0x0c, 0, 0, 1, 0x26, 0x01, 0xaf];
        assert!(access_unit_is_key(Codec::H265, &h265_idr));
        assert_eq!(sniff_codec(&h265_idr), Some(Codec::H265));
        assert!(!access_unit_is_key(Codec::H265, &[0, 0, 1, 0x02, 0x01, 0xd0]));
    }
}
