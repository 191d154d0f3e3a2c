//! `[gb28181]` of the serve settings: the GB28181 SIP server that devices register with,
//! and the bridge that lets `gb28181://DEVICE/CHANNEL` streams INVITE their channel.

use std::net::{IpAddr, SocketAddr};
use std::ops::RangeInclusive;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use clap::Args;
use futures_util::future::BoxFuture;
use peregrine_gb28181::play::PlayTimeouts;
use peregrine_gb28181::registrar::RegistrarConfig;
use peregrine_gb28181::sdp::MediaTransport;
use peregrine_gb28181::service::{Gb28181, ServiceConfig};
use peregrine_gb28181::signalling::{PlayRequest, SignallingConfig};
use peregrine_gb28181::sip::LocalEndpoint;
use peregrine_video::{LivePlay, LivePlayGrant, LivePlayRequest, LiveTransport};
use serde::Deserialize;

/// The GB28181 SIP server, as `[gb28181]` spells it. Off unless `listen` is set.
///
/// ```toml
/// [gb28181]
/// listen = "0.0.0.0:5060"
/// advertise = "192.168.1.10"
/// server_id = "34020000002000000001"
/// domain = "3402000000"
/// password = "12345678"
/// media_ports = "30000-30999"
/// ```
#[derive(Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Gb28181Settings {
    /// Where SIP is received (UDP and TCP on the same port); unset: GB28181 is off.
    pub listen: Option<SocketAddr>,
    /// The address devices reach this server at, written into SIP headers and into the
    /// SDP as where media goes [default: the listen address, unless it is 0.0.0.0].
    pub advertise: Option<IpAddr>,
    /// The server's 20-digit GB28181 id (the platform's SIP id configured on devices).
    pub server_id: String,
    /// The SIP domain (the first 10 digits of the ids, by convention), also the digest realm.
    pub domain: String,
    /// The password every device authenticates its REGISTER with.
    pub password: Option<String>,
    /// UDP/TCP ports media is received on, `FIRST-LAST`; one per playing channel.
    pub media_ports: String,
    /// A device's keepalive period; `keepalive_misses` periods without one take it offline.
    pub keepalive_interval_s: u64,
    pub keepalive_misses: u32,
    /// How long a device has to answer an INVITE.
    pub invite_timeout_ms: u64,
}

impl Default for Gb28181Settings {
    fn default() -> Self {
        Self {
            listen: None,
            advertise: None,
            server_id: "34020000002000000001".into(),
            domain: "3402000000".into(),
            password: None,
            media_ports: "30000-30999".into(),
            keepalive_interval_s: 60,
            keepalive_misses: 3,
            invite_timeout_ms: 10_000,
        }
    }
}

impl std::fmt::Debug for Gb28181Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // By hand: the password never reaches a log line.
        f.debug_struct("Gb28181Settings")
            .field("listen", &self.listen)
            .field("advertise", &self.advertise)
            .field("server_id", &self.server_id)
            .field("domain", &self.domain)
            .field("password", &self.password.as_ref().map(|_| "REDACTED"))
            .field("media_ports", &self.media_ports)
            .field("keepalive_interval_s", &self.keepalive_interval_s)
            .field("keepalive_misses", &self.keepalive_misses)
            .field("invite_timeout_ms", &self.invite_timeout_ms)
            .finish()
    }
}

/// Flags for [`Gb28181Settings`]; each overrides the config file.
#[derive(Debug, Args, Default)]
pub struct Gb28181Args {
    /// Turns the GB28181 SIP server on at this address, UDP and TCP (e.g. 0.0.0.0:5060).
    #[arg(long = "gb28181-listen", env = "PEREGRINE_GB28181_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// The address devices reach this server at (SIP headers, media in the SDP)
    /// [default: the listen address unless 0.0.0.0].
    #[arg(long = "gb28181-advertise", env = "PEREGRINE_GB28181_ADVERTISE")]
    pub advertise: Option<IpAddr>,
    /// The server's 20-digit GB28181 id [default: 34020000002000000001].
    #[arg(long = "gb28181-server-id", env = "PEREGRINE_GB28181_SERVER_ID")]
    pub server_id: Option<String>,
    /// The SIP domain and digest realm [default: 3402000000].
    #[arg(long = "gb28181-domain", env = "PEREGRINE_GB28181_DOMAIN")]
    pub domain: Option<String>,
    /// The devices' REGISTER password (prefer the environment variable: flags show in `ps`).
    #[arg(
        long = "gb28181-password",
        env = "PEREGRINE_GB28181_PASSWORD",
        hide_env_values = true
    )]
    pub password: Option<String>,
    /// Media ports, FIRST-LAST [default: 30000-30999].
    #[arg(long = "gb28181-media-ports", env = "PEREGRINE_GB28181_MEDIA_PORTS")]
    pub media_ports: Option<String>,
}

impl Gb28181Args {
    pub fn apply(self, s: &mut Gb28181Settings) {
        if self.listen.is_some() {
            s.listen = self.listen;
        }
        if self.advertise.is_some() {
            s.advertise = self.advertise;
        }
        if let Some(v) = self.server_id {
            s.server_id = v;
        }
        if let Some(v) = self.domain {
            s.domain = v;
        }
        if self.password.is_some() {
            s.password = self.password;
        }
        if let Some(v) = self.media_ports {
            s.media_ports = v;
        }
    }
}

impl Gb28181Settings {
    /// Refuses settings the SIP server could not run with, naming the setting.
    pub fn validate(&self) -> Result<()> {
        if self.listen.is_none() {
            return Ok(());
        }
        self.advertised()?;
        self.media_port_range()?;
        let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
        ensure!(
            self.server_id.len() == 20 && digits(&self.server_id),
            "gb28181.server_id {:?} is not 20 digits",
            self.server_id
        );
        ensure!(
            self.domain.len() >= 8 && digits(&self.domain),
            "gb28181.domain {:?} is not at least 8 digits (GB28181 SSRCs take its 4th to 8th digits)",
            self.domain
        );
        match &self.password {
            Some(p) if !p.is_empty() => {}
            _ => bail!("gb28181.password is required with gb28181.listen (or PEREGRINE_GB28181_PASSWORD): devices must authenticate"),
        }
        ensure!(
            self.keepalive_interval_s > 0 && self.keepalive_misses > 0 && self.invite_timeout_ms > 0,
            "gb28181.keepalive_interval_s, keepalive_misses and invite_timeout_ms must be above 0"
        );
        Ok(())
    }

    fn advertised(&self) -> Result<IpAddr> {
        let listen = self.listen.context("gb28181.listen is not set")?;
        match self.advertise {
            Some(ip) if ip.is_unspecified() => bail!("gb28181.advertise {ip} is not an address devices can reach"),
            Some(IpAddr::V6(ip)) => bail!("gb28181.advertise {ip}: GB28181 SDP is IPv4; give an IPv4 address"),
            Some(ip) => Ok(ip),
            None if listen.ip().is_unspecified() => bail!(
                "gb28181.listen {listen} is every address: set gb28181.advertise (--gb28181-advertise) to the one devices reach"
            ),
            None => Ok(listen.ip()),
        }
    }

    fn media_port_range(&self) -> Result<RangeInclusive<u16>> {
        let bad = || {
            anyhow::anyhow!(
                "gb28181.media_ports {:?} is not FIRST-LAST with 1 <= FIRST <= LAST <= 65535",
                self.media_ports
            )
        };
        let (first, last) = self.media_ports.split_once('-').ok_or_else(bad)?;
        let first: u16 = first.trim().parse().map_err(|_| bad())?;
        let last: u16 = last.trim().parse().map_err(|_| bad())?;
        ensure!(first >= 1 && first <= last, bad());
        Ok(first..=last)
    }

    /// Starts the SIP server when `listen` is set.
    pub async fn start(&self) -> Result<Option<Gb28181Running>> {
        let Some(listen) = self.listen else {
            return Ok(None);
        };
        let advertise = self.advertised()?;
        let local = LocalEndpoint {
            server_id: self.server_id.clone(),
            domain: self.domain.clone(),
            host: advertise.to_string(),
            // Port 0 (any) is filled in by the service once bound.
            port: listen.port(),
            tcp: false,
        };
        let mut registrar = RegistrarConfig::new(local, self.password.as_deref().unwrap_or_default());
        registrar.keepalive_interval = Duration::from_secs(self.keepalive_interval_s);
        registrar.keepalive_misses = self.keepalive_misses;
        let config = ServiceConfig {
            listen,
            signalling: SignallingConfig {
                registrar,
                media_ip: advertise.to_string(),
                play: PlayTimeouts {
                    answer: Duration::from_millis(self.invite_timeout_ms),
                    ..PlayTimeouts::default()
                },
            },
        };
        let service = Gb28181::start(config)
            .await
            .with_context(|| format!("starting the GB28181 SIP server on {listen}"))?;
        // Tests and scripts read this line to learn the port when started with port 0.
        eprintln!("peregrine: GB28181 SIP listening on {}", service.sip_address());
        let bridge = SipBridge {
            service: service.clone(),
            media_ports: self.media_port_range()?,
        };
        Ok(Some(Gb28181Running {
            live_play: std::sync::Arc::new(bridge),
            service,
        }))
    }
}

/// The running SIP server: the handle the API lists devices with, and the bridge streams
/// play channels through.
pub struct Gb28181Running {
    pub service: Gb28181,
    pub live_play: std::sync::Arc<dyn LivePlay>,
}

/// Streams' live plays through the SIP server.
struct SipBridge {
    service: Gb28181,
    media_ports: RangeInclusive<u16>,
}

impl LivePlay for SipBridge {
    fn media_ports(&self) -> RangeInclusive<u16> {
        self.media_ports.clone()
    }

    fn play(&self, request: LivePlayRequest) -> BoxFuture<'static, Result<LivePlayGrant, String>> {
        let service = self.service.clone();
        Box::pin(async move {
            let request = PlayRequest {
                device_id: request.device_id,
                channel_id: request.channel_id,
                media_port: request.media_port,
                transport: match request.transport {
                    LiveTransport::Udp => MediaTransport::Udp,
                    LiveTransport::TcpPassive => MediaTransport::TcpPassive,
                    LiveTransport::TcpActive => MediaTransport::TcpActive,
                },
            };
            let play = service.play(request).await.map_err(|e| e.to_string())?;
            let device_media = play
                .answer
                .address
                .parse()
                .ok()
                .map(|ip| std::net::SocketAddr::new(ip, play.answer.port));
            let ended = play.ended;
            Ok(LivePlayGrant {
                device_media,
                ended: Box::pin(async move {
                    ended
                        .await
                        .unwrap_or_else(|_| "the GB28181 SIP server stopped".into())
                }),
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn on() -> Gb28181Settings {
        Gb28181Settings {
            listen: Some("127.0.0.1:5060".parse().unwrap()),
            password: Some("12345678".into()),
            ..Default::default()
        }
    }

    type Change = fn(&mut Gb28181Settings);

    #[test]
    fn off_by_default_and_checked_when_on() {
        Gb28181Settings::default().validate().unwrap();
        on().validate().unwrap();
        let cases: [(Change, &str); 6] = [
            (|s| s.password = None, "gb28181.password is required"),
            (
                |s| s.server_id = "123".into(),
                "server_id \"123\" is not 20 digits",
            ),
            (|s| s.domain = "34a".into(), "domain \"34a\""),
            (|s| s.media_ports = "3000".into(), "media_ports \"3000\""),
            (|s| s.media_ports = "40000-30000".into(), "media_ports"),
            (
                |s| s.listen = Some("0.0.0.0:5060".parse().unwrap()),
                "set gb28181.advertise",
            ),
        ];
        for (change, says) in cases {
            let mut s = on();
            change(&mut s);
            let error = s.validate().unwrap_err().to_string();
            assert!(error.contains(says), "{error}");
        }
    }

    #[test]
    fn the_password_stays_out_of_debug_output() {
        let text = format!("{:?}", on());
        assert!(!text.contains("12345678") && text.contains("REDACTED"), "{text}");
    }
}
