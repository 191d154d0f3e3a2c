//! GB28181 channels as streams: `gb28181://<device id>/<channel id>`. Opening one binds a
//! media port (UDP, or TCP for the device to connect to), asks the server's GB28181
//! signalling to INVITE the channel to push there, and reads the pushed RTP/PS like any
//! `rtp://` stream (over UDP, the RTCP port next to it is read too, for the device's
//! sender reports). Dropping the source hangs up (BYE); the device's own BYE or its going
//! offline ends the source, and the supervisor reconnects with a fresh INVITE after its
//! backoff. The signalling sits behind [`LivePlay`], so this crate knows no SIP.

use std::net::{Ipv4Addr, SocketAddr};
use std::ops::RangeInclusive;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use futures_util::future::BoxFuture;
use peregrine_types::WallClock;
use tokio::net::{TcpListener, TcpStream};
use url::Url;

use super::rtp::endpoint::RtpFormat;
use super::rtp::jitter::JitterConfig;
use super::rtp::{bind_udp, Input, RtpSource};
use super::{Opener, Source, SourceError};
use crate::policy::UrlPolicy;

/// A channel's live play as the signalling grants it.
pub struct LivePlayGrant {
    /// Resolves with the reason when the device ends the play; dropping it hangs up.
    pub ended: BoxFuture<'static, String>,
    /// Where the device said it sends from or, with TCP active, listens (its SDP answer).
    pub device_media: Option<SocketAddr>,
}

/// How a channel's media reaches the server (GB28181's three ways).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LiveTransport {
    Udp,
    /// TCP, the device connecting to the server's media port.
    TcpPassive,
    /// TCP, the server connecting to the port the device answers with.
    TcpActive,
}

/// What a stream asks the signalling for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LivePlayRequest {
    pub device_id: String,
    pub channel_id: String,
    /// Where the stream listens (with TCP active: the port offered, not listened on).
    pub media_port: u16,
    pub transport: LiveTransport,
}

/// The server's GB28181 signalling, as streams need it.
pub trait LivePlay: Send + Sync + 'static {
    /// Ports media may be received on.
    fn media_ports(&self) -> RangeInclusive<u16>;
    /// Invites the channel; resolves once the device accepted (or with why not).
    fn play(&self, request: LivePlayRequest) -> BoxFuture<'static, Result<LivePlayGrant, String>>;
}

/// A checked `gb28181://DEVICE/CHANNEL[?transport=udp|tcp|tcp-active]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gb28181Channel {
    pub url: Url,
    pub device_id: String,
    pub channel_id: String,
    pub transport: LiveTransport,
}

impl Gb28181Channel {
    /// Checks the URL; the error says what to write instead.
    pub fn parse(url: &Url) -> Result<Self, String> {
        let form = "gb28181://DEVICE_ID/CHANNEL_ID (20-digit GB28181 ids)";
        if url.scheme() != "gb28181" {
            return Err(format!("{}:// is not a GB28181 url ({form})", url.scheme()));
        }
        if !url.username().is_empty() || url.password().is_some() || url.port().is_some() {
            return Err(format!("a GB28181 url has no user, password or port: {form}"));
        }
        let device_id = url.host_str().unwrap_or_default().to_string();
        let channel_id = url.path().trim_start_matches('/').to_string();
        for (what, id) in [("device", &device_id), ("channel", &channel_id)] {
            if id.len() != 20 || !id.bytes().all(|b| b.is_ascii_digit()) {
                return Err(format!("{what} id {id:?} is not 20 digits: {form}"));
            }
        }
        let mut transport = None;
        for (key, value) in url.query_pairs() {
            let chosen = match (key.as_ref(), value.as_ref()) {
                ("transport", "udp") => LiveTransport::Udp,
                ("transport", "tcp" | "tcp-passive") => LiveTransport::TcpPassive,
                ("transport", "tcp-active") => LiveTransport::TcpActive,
                ("transport", other) => {
                    return Err(format!("transport={other} is not udp, tcp (the device connects) or tcp-active (the server connects)"))
                }
                (other, _) => return Err(format!("unknown GB28181 url option {other:?} (known: transport)")),
            };
            if transport.replace(chosen).is_some() {
                return Err("GB28181 url option \"transport\" is given twice".into());
            }
        }
        Ok(Self {
            url: url.clone(),
            device_id,
            channel_id,
            transport: transport.unwrap_or(LiveTransport::Udp),
        })
    }
}

/// Opens a GB28181 channel: a media port, then the INVITE.
#[derive(Clone)]
pub struct Gb28181Opener {
    channel: Gb28181Channel,
    live: Arc<dyn LivePlay>,
    decode_threads: usize,
    clock: Arc<dyn WallClock>,
    /// Where the next search for a free media port starts, so that ports a device may
    /// still be sending to are not reused at once.
    next_port: Arc<AtomicUsize>,
    /// Judges the address a device's answer makes the server connect to (TCP active).
    policy: Option<Arc<UrlPolicy>>,
}

impl Gb28181Opener {
    pub fn new(
        channel: Gb28181Channel,
        live: Arc<dyn LivePlay>,
        decode_threads: usize,
        clock: Arc<dyn WallClock>,
    ) -> Self {
        let start = rand::random::<u16>() as usize;
        Self {
            channel,
            live,
            decode_threads,
            clock,
            next_port: Arc::new(AtomicUsize::new(start)),
            policy: None,
        }
    }

    pub fn guarded_by(mut self, policy: Arc<UrlPolicy>) -> Self {
        self.policy = Some(policy);
        self
    }

    fn connect_error(&self, reason: impl ToString) -> SourceError {
        SourceError::Connect {
            url: self.channel.url.to_string(),
            reason: reason.to_string(),
        }
    }

    /// A media input on a free port of the range, and the port; with TCP active, no input
    /// yet (the server connects once the device answers) and the range's first port.
    async fn bind(&self) -> Result<(Option<Input>, u16), SourceError> {
        let ports = self.live.media_ports();
        let (first, count) = (*ports.start(), ports.len());
        if count == 0 {
            return Err(self.connect_error("the GB28181 media port range is empty"));
        }
        let udp = match self.channel.transport {
            LiveTransport::TcpActive => return Ok((None, first)),
            LiveTransport::TcpPassive => false,
            LiveTransport::Udp => true,
        };
        let offset = self.next_port.fetch_add(1, Ordering::Relaxed);
        for i in 0..count {
            let port = first + ((offset + i) % count) as u16;
            let address = SocketAddr::from((Ipv4Addr::UNSPECIFIED, port));
            let bound = match udp {
                false => TcpListener::bind(address).await.map(Input::Listening),
                // RTP on an even port, RTCP (sender reports) on the next one up, where
                // RFC 3550 has the device send it; both must be free.
                true if port % 2 == 1 || port == u16::MAX => continue,
                true => bind_udp(address).and_then(|rtp| {
                    let rtcp = bind_udp(SocketAddr::from((Ipv4Addr::UNSPECIFIED, port + 1)))?;
                    Ok(Input::udp_with_rtcp(rtp, rtcp))
                }),
            };
            if let Ok(input) = bound {
                return Ok((Some(input), port));
            }
        }
        Err(self.connect_error(format!("no free media port in {}-{}", ports.start(), ports.end())))
    }

    /// TCP active: connects to the port the device answered with. The device chose the
    /// address, so it is judged by the policy's address rules like a camera's host.
    async fn connect_to_device(&self, device: Option<SocketAddr>) -> Result<Input, SourceError> {
        let address = device
            .filter(|a| a.port() != 0 && !a.ip().is_unspecified())
            .ok_or_else(|| {
                self.connect_error("the device's answer names no address and port to connect to")
            })?;
        if let Some(policy) = &self.policy {
            policy
                .peer_address(address.ip())
                .map_err(|r| self.connect_error(format!("the device's media address refused: {r}")))?;
        }
        let stream = TcpStream::connect(address).await.map_err(|e| {
            self.connect_error(format!(
                "cannot connect to the device's media port {address}: {e}"
            ))
        })?;
        Ok(Input::tcp(stream))
    }
}

impl Opener for Gb28181Opener {
    fn open(&self) -> BoxFuture<'static, Result<Box<dyn Source>, SourceError>> {
        let this = self.clone();
        Box::pin(async move {
            let (input, media_port) = this.bind().await?;
            let request = LivePlayRequest {
                device_id: this.channel.device_id.clone(),
                channel_id: this.channel.channel_id.clone(),
                media_port,
                transport: this.channel.transport,
            };
            let grant = this.live.play(request).await.map_err(|e| this.connect_error(e))?;
            let input = match input {
                Some(input) => input,
                None => this.connect_to_device(grant.device_media).await?,
            };
            let source = RtpSource::new(
                this.channel.url.to_string(),
                input,
                RtpFormat::Ps(None),
                this.decode_threads,
                JitterConfig::default(),
                this.clock.clone(),
            )
            .with_session(grant.ended);
            Ok(Box::new(source) as Box<dyn Source>)
        })
    }

    fn describe(&self) -> String {
        let how = match self.channel.transport {
            LiveTransport::Udp => "udp",
            LiveTransport::TcpPassive => "tcp, the device connecting",
            LiveTransport::TcpActive => "tcp, connecting to the device",
        };
        format!("{} (gb28181 live play, mpeg-ps over {how})", self.channel.url)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(url: &str) -> Result<Gb28181Channel, String> {
        Gb28181Channel::parse(&Url::parse(url).unwrap())
    }

    #[test]
    fn urls_name_a_device_and_channel() {
        let c = parse("gb28181://34020000001320000001/34020000001310000001").unwrap();
        assert_eq!(
            (c.device_id.as_str(), c.channel_id.as_str(), c.transport),
            ("34020000001320000001", "34020000001310000001", LiveTransport::Udp)
        );
        let with = |t: &str| {
            parse(&format!(
                "gb28181://34020000001320000001/34020000001310000001?transport={t}"
            ))
        };
        assert_eq!(with("tcp").unwrap().transport, LiveTransport::TcpPassive);
        assert_eq!(with("tcp-active").unwrap().transport, LiveTransport::TcpActive);
        assert!(with("udp&transport=tcp").unwrap_err().contains("given twice"));
        for (bad, says) in [
            (
                "gb28181://3402/34020000001310000001",
                "device id \"3402\" is not 20 digits",
            ),
            (
                "gb28181://34020000001320000001/",
                "channel id \"\" is not 20 digits",
            ),
            (
                "gb28181://34020000001320000001/34020000001310000001?transport=sctp",
                "transport=sctp",
            ),
            (
                "gb28181://34020000001320000001/34020000001310000001?fps=5",
                "unknown GB28181 url option",
            ),
            (
                "gb28181://u:p@34020000001320000001/34020000001310000001",
                "no user, password or port",
            ),
        ] {
            let error = parse(bad).unwrap_err();
            assert!(error.contains(says), "{bad}: {error}");
        }
    }
}
