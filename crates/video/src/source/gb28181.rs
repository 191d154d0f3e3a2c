//! GB28181 channels as streams: `gb28181://<device id>/<channel id>`. Opening one binds a
//! media port (UDP, or TCP for the device to connect to), asks the server's GB28181
//! signalling to INVITE the channel to push there, and reads the pushed RTP/PS like any
//! `rtp://` stream. Dropping the source hangs up (BYE); the device's own BYE or its going
//! offline ends the source, and the supervisor reconnects with a fresh INVITE after its
//! backoff. The signalling sits behind [`LivePlay`], so this crate knows no SIP.

use std::net::{Ipv4Addr, SocketAddr};
use std::ops::RangeInclusive;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use futures_util::future::BoxFuture;
use peregrine_types::WallClock;
use tokio::net::TcpListener;
use url::Url;

use super::rtp::endpoint::RtpFormat;
use super::rtp::jitter::JitterConfig;
use super::rtp::{bind_udp, Input, RtpSource};
use super::{Opener, Source, SourceError};

/// A channel's live play as the signalling grants it.
pub struct LivePlayGrant {
    /// Resolves with the reason when the device ends the play; dropping it hangs up.
    pub ended: BoxFuture<'static, String>,
}

/// What a stream asks the signalling for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LivePlayRequest {
    pub device_id: String,
    pub channel_id: String,
    /// Where the stream listens.
    pub media_port: u16,
    /// TCP with the device connecting to us, else UDP.
    pub tcp: bool,
}

/// The server's GB28181 signalling, as streams need it.
pub trait LivePlay: Send + Sync + 'static {
    /// Ports media may be received on.
    fn media_ports(&self) -> RangeInclusive<u16>;
    /// Invites the channel; resolves once the device accepted (or with why not).
    fn play(&self, request: LivePlayRequest) -> BoxFuture<'static, Result<LivePlayGrant, String>>;
}

/// A checked `gb28181://DEVICE/CHANNEL[?transport=udp|tcp]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gb28181Channel {
    pub url: Url,
    pub device_id: String,
    pub channel_id: String,
    pub tcp: bool,
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
        let mut tcp = None;
        for (key, value) in url.query_pairs() {
            match (key.as_ref(), value.as_ref()) {
                ("transport", "udp") if tcp.is_none() => tcp = Some(false),
                ("transport", "tcp") if tcp.is_none() => tcp = Some(true),
                ("transport", other) => {
                    return Err(format!("transport={other} is not udp or tcp (given once)"))
                }
                (other, _) => return Err(format!("unknown GB28181 url option {other:?} (known: transport)")),
            }
        }
        Ok(Self {
            url: url.clone(),
            device_id,
            channel_id,
            tcp: tcp.unwrap_or(false),
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
        }
    }

    fn connect_error(&self, reason: impl ToString) -> SourceError {
        SourceError::Connect {
            url: self.channel.url.to_string(),
            reason: reason.to_string(),
        }
    }

    /// A media input on a free port of the range, and the port.
    async fn bind(&self) -> Result<(Input, u16), SourceError> {
        let ports = self.live.media_ports();
        let (first, count) = (*ports.start(), ports.len());
        if count == 0 {
            return Err(self.connect_error("the GB28181 media port range is empty"));
        }
        let offset = self.next_port.fetch_add(1, Ordering::Relaxed);
        for i in 0..count {
            let port = first + ((offset + i) % count) as u16;
            let address = SocketAddr::from((Ipv4Addr::UNSPECIFIED, port));
            let bound = match self.channel.tcp {
                true => TcpListener::bind(address).await.map(Input::Listening),
                false => bind_udp(address).map(Input::udp),
            };
            if let Ok(input) = bound {
                return Ok((input, port));
            }
        }
        Err(self.connect_error(format!("no free media port in {}-{}", ports.start(), ports.end())))
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
                tcp: this.channel.tcp,
            };
            let grant = this.live.play(request).await.map_err(|e| this.connect_error(e))?;
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
        let how = if self.channel.tcp { "tcp" } else { "udp" };
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
            (c.device_id.as_str(), c.channel_id.as_str(), c.tcp),
            ("34020000001320000001", "34020000001310000001", false)
        );
        assert!(
            parse("gb28181://34020000001320000001/34020000001310000001?transport=tcp")
                .unwrap()
                .tcp
        );
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
