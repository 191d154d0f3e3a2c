//! RTP packets (RFC 3550 §5.1) as a camera pushes them: the fixed header, CSRCs, a header
//! extension and padding are checked against the datagram's length and stripped; what is
//! left is the payload. Nothing here trusts a length field it has not bounded.

use bytes::Bytes;

/// The fixed header's 12 bytes.
const FIXED_HEADER: usize = 12;

/// One RTP packet, its payload sharing the datagram's buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RtpPacket {
    pub marker: bool,
    pub payload_type: u8,
    pub sequence: u16,
    pub timestamp: u32,
    pub ssrc: u32,
    /// Contributing sources (a mixer's); cameras send none.
    pub csrc_count: u8,
    /// The header extension's profile word (RFC 3550 §5.3.1), when there is one.
    pub extension_profile: Option<u16>,
    pub payload: Bytes,
}

/// Why bytes are not an RTP packet.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum RtpError {
    #[error("{0} bytes is shorter than an RTP header")]
    TooShort(usize),
    #[error("RTP version {0}, not 2")]
    Version(u8),
    #[error("the header (CSRCs and extension) runs past the packet's {0} bytes")]
    HeaderOverrun(usize),
    #[error("padding of {padding} bytes is more than the {available} bytes after the header")]
    BadPadding { padding: usize, available: usize },
}

impl RtpPacket {
    /// Parses one packet; `data` is a whole datagram (or one RFC 4571 frame).
    pub fn parse(data: Bytes) -> Result<Self, RtpError> {
        let len = data.len();
        if len < FIXED_HEADER {
            return Err(RtpError::TooShort(len));
        }
        let version = data[0] >> 6;
        if version != 2 {
            return Err(RtpError::Version(version));
        }
        let has_padding = data[0] & 0x20 != 0;
        let has_extension = data[0] & 0x10 != 0;
        let csrc_count = data[0] & 0x0F;
        let marker = data[1] & 0x80 != 0;
        let payload_type = data[1] & 0x7F;
        let sequence = u16::from_be_bytes([data[2], data[3]]);
        let timestamp = u32::from_be_bytes([data[4], data[5], data[6], data[7]]);
        let ssrc = u32::from_be_bytes([data[8], data[9], data[10], data[11]]);
        let mut start = FIXED_HEADER + 4 * usize::from(csrc_count);
        let mut extension_profile = None;
        if has_extension {
            let word = data.get(start..start + 4).ok_or(RtpError::HeaderOverrun(len))?;
            extension_profile = Some(u16::from_be_bytes([word[0], word[1]]));
            let words = usize::from(u16::from_be_bytes([word[2], word[3]]));
            start += 4 + 4 * words;
        }
        if start > len {
            return Err(RtpError::HeaderOverrun(len));
        }
        let mut end = len;
        if has_padding {
            let padding = usize::from(data[len - 1]);
            let available = len - start;
            if padding == 0 || padding > available {
                return Err(RtpError::BadPadding { padding, available });
            }
            end -= padding;
        }
        Ok(Self {
            marker,
            payload_type,
            sequence,
            timestamp,
            ssrc,
            csrc_count,
            extension_profile,
            payload: data.slice(start..end),
        })
    }
}

/// Writes a plain RTP header (no CSRCs, extension or padding) followed by `payload`: what
/// a camera sends, for tests and the simulated pusher.
pub fn write_packet(
    out: &mut Vec<u8>,
    marker: bool,
    payload_type: u8,
    sequence: u16,
    timestamp: u32,
    ssrc: u32,
    payload: &[u8],
) {
    out.push(0x80);
    out.push((u8::from(marker) << 7) | (payload_type & 0x7F));
    out.extend_from_slice(&sequence.to_be_bytes());
    out.extend_from_slice(&timestamp.to_be_bytes());
    out.extend_from_slice(&ssrc.to_be_bytes());
    out.extend_from_slice(payload);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn packet(bytes: &[u8]) -> Result<RtpPacket, RtpError> {
        RtpPacket::parse(Bytes::copy_from_slice(bytes))
    }

    #[test]
    fn reads_the_fixed_header() {
        let mut b = Vec::new();
        write_packet(&mut b, true, 96, 0xBEEF, 0x0102_0304, 0xCAFE_F00D, b"ps");
        let p = packet(&b).unwrap();
        assert!(p.marker);
        assert_eq!(
            (p.payload_type, p.sequence, p.timestamp, p.ssrc),
            (96, 0xBEEF, 0x0102_0304, 0xCAFE_F00D)
        );
        assert_eq!((p.csrc_count, p.extension_profile), (0, None));
        assert_eq!(&p.payload[..], b"ps");
    }

    #[test]
    fn strips_csrcs_extension_and_padding() {
        let mut b = vec![0x80 | 0x20 | 0x10 | 2, 96];
        b.extend_from_slice(&[0, 1, 0, 0, 0, 9, 0, 0, 0, 7]);
        b.extend_from_slice(&[1, 1, 1, 1, 2, 2, 2, 2]); // two CSRCs
        b.extend_from_slice(&[0xAB, 0xCD, 0, 1, 9, 9, 9, 9]); // extension, one word
        b.extend_from_slice(b"data");
        b.extend_from_slice(&[0, 0, 3]); // three bytes of padding
        let p = packet(&b).unwrap();
        assert_eq!(p.csrc_count, 2);
        assert_eq!(p.extension_profile, Some(0xABCD));
        assert_eq!(&p.payload[..], b"data");
    }

    #[test]
    fn refuses_what_is_not_rtp() {
        assert_eq!(packet(&[0x80; 11]), Err(RtpError::TooShort(11)));
        let mut b = vec![0u8; 12];
        b[0] = 0x40;
        assert_eq!(packet(&b), Err(RtpError::Version(1)));
        b[0] = 0x80 | 15; // fifteen CSRCs in a 12-byte packet
        assert_eq!(packet(&b), Err(RtpError::HeaderOverrun(12)));
        b[0] = 0x90; // an extension header that is not there
        assert_eq!(packet(&b), Err(RtpError::HeaderOverrun(12)));
        let mut b = vec![0xA0, 96, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 9];
        assert!(matches!(packet(&b), Err(RtpError::BadPadding { padding: 9, .. })));
        b[14] = 0;
        assert!(matches!(packet(&b), Err(RtpError::BadPadding { padding: 0, .. })));
        b[14] = 3; // padding exactly the rest: an empty payload
        assert!(packet(&b).unwrap().payload.is_empty());
    }
}
