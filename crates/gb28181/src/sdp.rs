//! The SDP of GB28181 live play: the server's offer (where the device pushes RTP/PS, under
//! which SSRC) and the device's answer.

/// How media travels, from the server's side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MediaTransport {
    Udp,
    /// The server listens and the device connects (`a=setup:passive` in the offer).
    TcpPassive,
    /// The server connects to the device (`a=setup:active` in the offer).
    TcpActive,
}

/// Why an SSRC could not be made or an answer read.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum SdpError {
    #[error("SIP domain {0:?} is not at least 8 digits; GB28181 takes the SSRC's domain part from its 4th to 8th digits")]
    BadDomain(String),
    #[error("SDP answer has no {0}")]
    Missing(&'static str),
    #[error("SDP answer's line {0:?} is malformed")]
    Malformed(String),
}

/// The SSRC the server assigns a stream, as GB28181 Annex D spells it: ten decimal digits,
/// `0` for live (`1` for playback), the 4th to 8th digits of the SIP domain, then a 4-digit
/// sequence the caller keeps unique per domain.
pub fn ssrc(domain: &str, sequence: u16, playback: bool) -> Result<String, SdpError> {
    let part = domain
        .get(3..8)
        .filter(|p| p.bytes().all(|b| b.is_ascii_digit()))
        .ok_or_else(|| SdpError::BadDomain(domain.to_string()))?;
    let kind = if playback { '1' } else { '0' };
    Ok(format!("{kind}{part}{:04}", sequence % 10_000))
}

/// The SSRC as RTP carries it (the decimal string read as a number).
pub fn ssrc_value(ssrc: &str) -> Option<u32> {
    ssrc.parse().ok()
}

/// What the server offers for one channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlayOffer {
    pub channel_id: String,
    /// The IPv4 address the device sends media to (or, for TCP active, connects from).
    pub media_ip: String,
    pub media_port: u16,
    pub ssrc: String,
    pub transport: MediaTransport,
}

impl PlayOffer {
    /// The offer's SDP. Only PS (payload 96) is offered: it is what every GB28181 device
    /// sends and what the media ingest demuxes.
    pub fn sdp(&self) -> String {
        let (proto, tcp_lines) = match self.transport {
            MediaTransport::Udp => ("RTP/AVP", ""),
            MediaTransport::TcpPassive => ("TCP/RTP/AVP", "a=setup:passive\r\na=connection:new\r\n"),
            MediaTransport::TcpActive => ("TCP/RTP/AVP", "a=setup:active\r\na=connection:new\r\n"),
        };
        format!(
            "v=0\r\no={id} 0 0 IN IP4 {ip}\r\ns=Play\r\nc=IN IP4 {ip}\r\nt=0 0\r\n\
             m=video {port} {proto} 96\r\na=recvonly\r\na=rtpmap:96 PS/90000\r\n{tcp_lines}y={ssrc}\r\n",
            id = self.channel_id,
            ip = self.media_ip,
            port = self.media_port,
            ssrc = self.ssrc,
        )
    }
}

/// The device's answer in its 200 OK.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SdpAnswer {
    /// Where the device sends from (UDP) or listens (TCP, server active).
    pub address: String,
    pub port: u16,
    pub transport: MediaTransport,
    /// The `y=` SSRC, when the device states one; devices may pick their own, and the
    /// media ingest should follow the answer's.
    pub ssrc: Option<String>,
    /// `(payload type, encoding/clock)` from the `a=rtpmap` lines.
    pub rtpmap: Vec<(u8, String)>,
}

/// Reads the device's answer: the `c=` address (the video media's own, else the session's),
/// its `m=video` port and protocol, `a=setup`, `a=rtpmap` and `y=`.
pub fn parse_answer(text: &str) -> Result<SdpAnswer, SdpError> {
    let mut session_address = None;
    let mut media_address = None;
    let mut video: Option<(u16, bool)> = None;
    let mut in_video = false;
    let mut in_media = false;
    let mut setup = None;
    let mut ssrc = None;
    let mut rtpmap = Vec::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let malformed = || SdpError::Malformed(line.chars().take(60).collect());
        let (kind, value) = line.split_once('=').ok_or_else(malformed)?;
        match kind {
            "c" => {
                let address = value.split_whitespace().nth(2).ok_or_else(malformed)?;
                // A multicast TTL suffix (`/127`) is not part of the address.
                let address = address.split('/').next().unwrap_or(address).to_string();
                // Another medium's address (audio) says nothing about the video's.
                match (in_media, in_video) {
                    (false, _) => session_address = Some(address),
                    (true, true) => media_address = Some(address),
                    (true, false) => {}
                }
            }
            "m" => {
                let mut fields = value.split_whitespace();
                in_media = true;
                // Only the first video medium counts; a second one's lines are ignored.
                in_video = fields.next() == Some("video") && video.is_none();
                if in_video {
                    let port = fields.next().and_then(|p| p.parse().ok()).ok_or_else(malformed)?;
                    let tcp = fields
                        .next()
                        .ok_or_else(malformed)?
                        .to_ascii_uppercase()
                        .starts_with("TCP");
                    video = Some((port, tcp));
                }
            }
            "a" if in_video => parse_attribute(value, &mut setup, &mut rtpmap),
            "y" => ssrc = Some(value.trim().to_string()),
            _ => {}
        }
    }
    let (port, tcp) = video.ok_or(SdpError::Missing("m=video line"))?;
    let address = media_address
        .or(session_address)
        .ok_or(SdpError::Missing("c= address"))?;
    let transport = match (tcp, setup.as_deref()) {
        (false, _) => MediaTransport::Udp,
        // The device listening means the server connects.
        (true, Some("passive")) => MediaTransport::TcpActive,
        (true, _) => MediaTransport::TcpPassive,
    };
    Ok(SdpAnswer {
        address,
        port,
        transport,
        ssrc,
        rtpmap,
    })
}

fn parse_attribute(value: &str, setup: &mut Option<String>, rtpmap: &mut Vec<(u8, String)>) {
    if let Some(role) = value.strip_prefix("setup:") {
        *setup = Some(role.trim().to_ascii_lowercase());
    } else if let Some(map) = value.strip_prefix("rtpmap:") {
        if let Some((pt, encoding)) = map.split_once(' ') {
            if let Ok(pt) = pt.parse() {
                rtpmap.push((pt, encoding.trim().to_string()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ssrc_takes_the_domain_digits() {
        assert_eq!(ssrc("3402000000", 1, false).unwrap(), "0200000001");
        assert_eq!(ssrc("3402000000", 12345, true).unwrap(), "1200002345");
        assert_eq!(
            ssrc("3402000000", 1, false).map(|s| ssrc_value(&s)),
            Ok(Some(200_000_001))
        );
        assert!(matches!(ssrc("3402", 1, false), Err(SdpError::BadDomain(_))));
        assert!(matches!(
            ssrc("340abc0000", 1, false),
            Err(SdpError::BadDomain(_))
        ));
    }

    #[test]
    fn udp_offer() {
        let offer = PlayOffer {
            channel_id: "34020000001310000001".into(),
            media_ip: "192.168.1.10".into(),
            media_port: 30000,
            ssrc: "0200000001".into(),
            transport: MediaTransport::Udp,
        };
        assert_eq!(
            offer.sdp(),
            "v=0\r\no=34020000001310000001 0 0 IN IP4 192.168.1.10\r\ns=Play\r\nc=IN IP4 192.168.1.10\r\n\
             t=0 0\r\nm=video 30000 RTP/AVP 96\r\na=recvonly\r\na=rtpmap:96 PS/90000\r\ny=0200000001\r\n"
        );
    }

    #[test]
    fn tcp_offers() {
        let mut offer = PlayOffer {
            channel_id: "c".into(),
            media_ip: "10.0.0.1".into(),
            media_port: 30002,
            ssrc: "0200000002".into(),
            transport: MediaTransport::TcpPassive,
        };
        let sdp = offer.sdp();
        assert!(sdp.contains("m=video 30002 TCP/RTP/AVP 96\r\n"));
        assert!(sdp.contains("a=setup:passive\r\na=connection:new\r\n"));
        offer.transport = MediaTransport::TcpActive;
        assert!(offer.sdp().contains("a=setup:active\r\n"));
    }

    #[test]
    fn answers() {
        let udp = "v=0\r\no=34020000001310000001 0 0 IN IP4 192.168.1.64\r\ns=Play\r\n\
                   c=IN IP4 192.168.1.64\r\nt=0 0\r\nm=video 15060 RTP/AVP 96\r\na=sendonly\r\n\
                   a=rtpmap:96 PS/90000\r\ny=0200000001\r\nf=\r\n";
        let answer = parse_answer(udp).unwrap();
        assert_eq!(answer.address, "192.168.1.64");
        assert_eq!(answer.port, 15060);
        assert_eq!(answer.transport, MediaTransport::Udp);
        assert_eq!(answer.ssrc.as_deref(), Some("0200000001"));
        assert_eq!(answer.rtpmap, vec![(96, "PS/90000".to_string())]);

        let tcp = "v=0\no=x 0 0 IN IP4 1.1.1.1\ns=Play\nc=IN IP4 1.1.1.1\nt=0 0\n\
                   m=audio 9 RTP/AVP 8\nc=IN IP4 9.9.9.9\nm=video 6000 TCP/RTP/AVP 96\nc=IN IP4 10.0.0.9\n\
                   a=setup:passive\na=connection:new\n";
        let answer = parse_answer(tcp).unwrap();
        assert_eq!((answer.address.as_str(), answer.port), ("10.0.0.9", 6000));
        assert_eq!(answer.transport, MediaTransport::TcpActive);
        assert_eq!(answer.ssrc, None);
    }

    #[test]
    fn bad_answers() {
        assert_eq!(
            parse_answer("v=0\r\nc=IN IP4 1.2.3.4\r\n"),
            Err(SdpError::Missing("m=video line"))
        );
        assert_eq!(
            parse_answer("v=0\r\nm=video 5 RTP/AVP 96\r\n"),
            Err(SdpError::Missing("c= address"))
        );
        assert!(matches!(
            parse_answer("v=0\r\nm=video x RTP/AVP 96\r\n"),
            Err(SdpError::Malformed(_))
        ));
        assert!(matches!(parse_answer("garbage"), Err(SdpError::Malformed(_))));
    }
}
