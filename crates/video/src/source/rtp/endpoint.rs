//! Stream URLs of pushed RTP (GB28181 media), checked into an [`RtpEndpoint`]:
//!
//! - `rtp://0.0.0.0:5004?format=ps`: we listen for UDP datagrams on this address;
//! - `rtp+tcp://0.0.0.0:5004?format=ps`: we listen for one TCP connection carrying RFC 4571
//!   frames (GB28181's "TCP passive");
//! - `rtp+tcp://camera.example:5004?format=ps&mode=active`: we connect to the camera
//!   ("TCP active"), judged by the stream policy like an RTSP host.
//!
//! `format` is `ps` (MPEG-PS in RTP, GB28181's default), `h264` or `h265` (RFC 6184 /
//! RFC 7798 without PS); a PS stream's codec comes from its PSM or its parameter sets,
//! or from `codec=h264|h265` when given.

use std::net::{IpAddr, SocketAddr};

use url::Url;

use crate::decode::Codec;

/// How RTP packets reach us.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RtpTransport {
    /// Datagrams to a port we bind.
    Udp,
    /// One TCP connection to a port we listen on.
    TcpPassive,
    /// A TCP connection we open to the sender.
    TcpActive,
}

/// What the RTP payload is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RtpFormat {
    /// MPEG-2 Program Stream (payload type 96, `PS/90000`); the codec when the URL names it.
    Ps(Option<Codec>),
    /// Elementary H.264 or H.265 NAL units.
    Nal(Codec),
}

/// A checked RTP stream URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RtpEndpoint {
    pub url: Url,
    pub transport: RtpTransport,
    pub format: RtpFormat,
}

impl RtpEndpoint {
    /// The address to bind (UDP, passive TCP).
    pub fn bind_address(&self) -> Option<SocketAddr> {
        let ip = literal_ip(&self.url)?;
        Some(SocketAddr::new(ip, self.url.port()?))
    }

    /// Whether we connect out (and so the policy judges the host like a camera's).
    pub fn connects_out(&self) -> bool {
        self.transport == RtpTransport::TcpActive
    }

    /// Checks an `rtp://` or `rtp+tcp://` URL; the error says what to write instead.
    pub fn parse(url: &Url) -> Result<Self, String> {
        let transport_tcp = match url.scheme() {
            "rtp" => false,
            "rtp+tcp" => true,
            other => return Err(format!("{other}:// is not an RTP url (rtp:// or rtp+tcp://)")),
        };
        if !url.username().is_empty() || url.password().is_some() {
            return Err("an RTP url has no user or password".into());
        }
        if !matches!(url.path(), "" | "/") || url.fragment().is_some() {
            return Err("an RTP url is host:port and options only, without a path".into());
        }
        if url.host_str().is_none_or(str::is_empty) {
            return Err("an RTP url needs a host: the address to listen on (0.0.0.0 for all) or, with mode=active, the sender".into());
        }
        match url.port() {
            None | Some(0) => return Err("an RTP url needs a port (1-65535), e.g. rtp://0.0.0.0:5004".into()),
            Some(_) => {}
        }
        let (mut format, mut codec, mut mode) = (None, None, None);
        for (key, value) in url.query_pairs() {
            let slot = match key.as_ref() {
                "format" => &mut format,
                "codec" => &mut codec,
                "mode" => &mut mode,
                other => {
                    return Err(format!(
                        "unknown RTP url option {other:?} (known: format, codec, mode)"
                    ))
                }
            };
            if slot.replace(value.to_ascii_lowercase()).is_some() {
                return Err(format!("RTP url option {key:?} is given twice"));
            }
        }
        let codec = match codec.as_deref() {
            None => None,
            Some("h264") => Some(Codec::H264),
            Some("h265") => Some(Codec::H265),
            Some(other) => return Err(format!("codec={other} is not h264 or h265")),
        };
        let format = match format.as_deref() {
            None | Some("ps") => RtpFormat::Ps(codec),
            Some(f @ ("h264" | "h265")) => {
                if codec.is_some() {
                    return Err(format!(
                        "codec= is for format=ps; format={f} names the codec already"
                    ));
                }
                RtpFormat::Nal(if f == "h264" { Codec::H264 } else { Codec::H265 })
            }
            Some(other) => return Err(format!("format={other} is not ps, h264 or h265")),
        };
        let transport = match (transport_tcp, mode.as_deref()) {
            (false, None) => RtpTransport::Udp,
            (false, Some(_)) => return Err("mode= is for rtp+tcp:// (UDP always listens)".into()),
            (true, None | Some("passive")) => RtpTransport::TcpPassive,
            (true, Some("active")) => RtpTransport::TcpActive,
            (true, Some(other)) => return Err(format!("mode={other} is not passive or active")),
        };
        let endpoint = Self {
            url: url.clone(),
            transport,
            format,
        };
        if !endpoint.connects_out() && endpoint.bind_address().is_none() {
            return Err(format!(
                "{} is not an address of this machine to listen on; write an IP address (0.0.0.0 for all)",
                url.host_str().unwrap_or_default()
            ));
        }
        Ok(endpoint)
    }
}

/// The URL's host as an IP address, if it is one.
fn literal_ip(url: &Url) -> Option<IpAddr> {
    url.host_str()?.trim_matches(['[', ']']).parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<RtpEndpoint, String> {
        RtpEndpoint::parse(&Url::parse(s).unwrap())
    }

    #[test]
    fn reads_the_documented_forms() {
        let udp = parse("rtp://0.0.0.0:5004?format=ps").unwrap();
        assert_eq!(
            (udp.transport, udp.format),
            (RtpTransport::Udp, RtpFormat::Ps(None))
        );
        assert_eq!(udp.bind_address(), Some("0.0.0.0:5004".parse().unwrap()));
        let tcp = parse("rtp+tcp://[::]:6000").unwrap();
        assert_eq!(
            (tcp.transport, tcp.format),
            (RtpTransport::TcpPassive, RtpFormat::Ps(None))
        );
        assert_eq!(tcp.bind_address(), Some("[::]:6000".parse().unwrap()));
        let active = parse("rtp+tcp://camera.example:6000?mode=active&format=ps&codec=h265").unwrap();
        assert_eq!(active.transport, RtpTransport::TcpActive);
        assert_eq!(active.format, RtpFormat::Ps(Some(Codec::H265)));
        assert!(active.connects_out());
        let nal = parse("rtp://127.0.0.1:5004?format=h264").unwrap();
        assert_eq!(nal.format, RtpFormat::Nal(Codec::H264));
    }

    #[test]
    fn refuses_bad_urls_with_a_reason() {
        for (url, says) in [
            ("rtp://0.0.0.0?format=ps", "needs a port"),
            ("rtp://0.0.0.0:0", "needs a port"),
            ("rtp://0.0.0.0:5004/live", "without a path"),
            ("rtp://0.0.0.0:5004?format=mp4", "format=mp4"),
            ("rtp://0.0.0.0:5004?codec=vp8", "codec=vp8"),
            ("rtp://0.0.0.0:5004?format=h264&codec=h265", "names the codec"),
            ("rtp://0.0.0.0:5004?mode=active", "mode= is for rtp+tcp"),
            ("rtp+tcp://0.0.0.0:5004?mode=push", "mode=push"),
            ("rtp://0.0.0.0:5004?ssrc=1", "unknown RTP url option"),
            ("rtp://0.0.0.0:5004?format=ps&format=ps", "twice"),
            ("rtp://camera.example:5004", "not an address of this machine"),
            ("rtp://user:pw@0.0.0.0:5004", "no user"),
        ] {
            let err = parse(url).unwrap_err();
            assert!(err.contains(says), "{url}: {err}");
        }
    }
}
