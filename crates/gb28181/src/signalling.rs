//! The GB28181 server's signalling as one plain state over the registrar and the play
//! sessions: bytes from a device in, bytes to send out. It decides where each message
//! goes (a BYE to its play, REGISTER and MESSAGE to the registrar, responses to the play
//! whose Call-ID they carry), asks a device that comes online for its catalog, resends an
//! INVITE over UDP until the device answers, and hangs up a play whose stream let go of it.
//! The service ([`crate::service`]) owns one and only moves bytes and commands to it.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use rsip::{Method, Request, Response};
use tokio::sync::oneshot;

use crate::manscdp::CatalogItem;
use crate::play::{PlayDecision, PlaySession, PlayState, PlayTimeouts, PlayUpdate};
use crate::registrar::{Registrar, RegistrarConfig, RegistrarEvent};
use crate::sdp::{self, MediaTransport, PlayOffer, SdpAnswer, SdpError};
use crate::sip::{self, DialogIds, LocalEndpoint, SipMessage};

/// RFC 3261's T1 and T2: an INVITE over UDP is sent again after 0.5 s, 1 s, 2 s, 4 s, 4 s...
/// until the device answers at all.
const RESEND_FIRST: Duration = Duration::from_millis(500);
const RESEND_MOST: Duration = Duration::from_secs(4);

/// How a message reaches a device (and how its message reached us).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Peer {
    Udp(SocketAddr),
    /// The TCP connection from this address.
    Tcp(SocketAddr),
}

impl Peer {
    pub fn address(&self) -> SocketAddr {
        match self {
            Peer::Udp(a) | Peer::Tcp(a) => *a,
        }
    }
}

/// Bytes to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    pub to: Peer,
    pub bytes: Vec<u8>,
}

/// What the signalling is built with.
#[derive(Debug, Clone)]
pub struct SignallingConfig {
    /// The registrar's settings; its local endpoint (id, domain, advertised address and
    /// port) goes into every request.
    pub registrar: RegistrarConfig,
    /// The address offered to devices for media (an address of this machine they reach).
    pub media_ip: String,
    pub play: PlayTimeouts,
}

/// A stream asking a channel to push its live video.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlayRequest {
    pub device_id: String,
    pub channel_id: String,
    /// Where the stream listens for the media (on `media_ip`).
    pub media_port: u16,
    /// UDP, or TCP with the device connecting to us (passive).
    pub transport: MediaTransport,
}

/// Why a play could not start.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum PlayError {
    #[error("GB28181 device {0} is not registered")]
    UnknownDevice(String),
    #[error("GB28181 device {0} is offline (its keepalives stopped)")]
    Offline(String),
    #[error("GB28181 device {device} lists no channel {channel} in its catalog")]
    UnknownChannel { device: String, channel: String },
    #[error("the device answered the INVITE with {0}")]
    Refused(u16),
    #[error("the device did not answer the INVITE within {0:?}")]
    NoAnswer(Duration),
    #[error("the device's SDP answer is unusable: {0}")]
    BadAnswer(SdpError),
    #[error("the device went offline before answering")]
    WentOffline,
    #[error("cannot build the INVITE: {0}")]
    Invite(String),
    #[error("the GB28181 service has stopped")]
    Stopped,
}

/// A play the device accepted. Dropping `ended` (or the whole value) hangs up: the
/// signalling sends the BYE at its next tick.
#[derive(Debug)]
pub struct Play {
    pub call_id: String,
    /// The SSRC the media will carry: the device's answer's, else the one offered.
    pub ssrc: Option<u32>,
    pub answer: SdpAnswer,
    /// Resolves with the reason when the play ends from the device's side (its BYE, or
    /// the device going offline).
    pub ended: oneshot::Receiver<String>,
}

/// A device as the API lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceSummary {
    pub id: String,
    pub online: bool,
    /// Where its REGISTER came from.
    pub address: SocketAddr,
    pub tcp: bool,
    pub user_agent: Option<String>,
    /// Until its registration runs out.
    pub expires_in: Duration,
    pub last_seen_ago: Duration,
    pub channels: Vec<CatalogItem>,
    /// Channels with a play established or being invited.
    pub playing: Vec<String>,
}

struct PlayEntry {
    session: PlaySession,
    device_id: String,
    peer: Peer,
    /// The stream waiting for the answer (taken when it is answered).
    waiter: Option<oneshot::Sender<Result<Play, PlayError>>>,
    /// Told when the device ends the play; closed by the stream when it lets go.
    ended: Option<oneshot::Sender<String>>,
    /// UDP only: when to send the INVITE again, and the interval after that.
    resend: Option<(Instant, Duration)>,
}

/// The signalling of one GB28181 domain.
pub struct Signalling {
    config: SignallingConfig,
    registrar: Registrar,
    /// How each registered device is reached: the transport and address of its REGISTER.
    peers: HashMap<String, Peer>,
    plays: HashMap<String, PlayEntry>,
    next_ssrc: u16,
}

impl Signalling {
    pub fn new(config: SignallingConfig) -> Signalling {
        Signalling {
            registrar: Registrar::new(config.registrar.clone()),
            config,
            peers: HashMap::new(),
            plays: HashMap::new(),
            next_ssrc: 1,
        }
    }

    /// One message from `from`.
    pub fn on_message(&mut self, bytes: &[u8], from: Peer, now: Instant) -> Vec<Outgoing> {
        match sip::parse(bytes) {
            Ok(SipMessage::Request(request)) => self.on_request(&request, from, now),
            Ok(SipMessage::Response(response)) => self.on_response(&response, now),
            Err(e) => {
                // Nothing to answer: without a parsed Via there is no one to answer to.
                tracing::debug!(peer = %from.address(), error = %e, "unreadable SIP message ignored");
                Vec::new()
            }
        }
    }

    fn on_request(&mut self, request: &Request, from: Peer, now: Instant) -> Vec<Outgoing> {
        match request.method {
            Method::Ack => Vec::new(),
            Method::Bye => {
                let entry = sip::call_id(request).ok().and_then(|id| self.plays.remove(&id));
                let response = match entry {
                    Some(mut entry) => {
                        let response = entry.session.on_bye(request);
                        tracing::info!(device = %entry.device_id, call_id = %entry.session.call_id(), "device ended the play (BYE)");
                        end(&mut entry, "the device ended the stream (BYE)");
                        response
                    }
                    // RFC 3261 §15.1.2: no such dialog.
                    None => sip::response(request, 481, None),
                };
                vec![send(from, response.to_string())]
            }
            _ => {
                let nonce = random_token();
                let handled = self.registrar.handle(request, from.address(), &nonce, now);
                if request.method == Method::Register && handled.response.status_code.code() == 200 {
                    if let Ok(device) = sip::from_user(request) {
                        self.peers.insert(device, from);
                    }
                }
                let mut out = vec![send(from, handled.response.to_string())];
                out.extend(self.on_events(handled.events));
                out
            }
        }
    }

    fn on_events(&mut self, events: Vec<RegistrarEvent>) -> Vec<Outgoing> {
        let mut out = Vec::new();
        for event in events {
            match event {
                RegistrarEvent::DeviceOnline { device_id } => {
                    tracing::info!(device = %device_id, "GB28181 device online; asking for its catalog");
                    let ids = fresh_ids();
                    let query = self.registrar.catalog_query(&device_id, &ids);
                    if let (Some(query), Some(peer)) = (query, self.peer(&device_id)) {
                        out.push(send(peer, query.to_string()));
                    }
                }
                RegistrarEvent::DeviceOffline { device_id, reason } => {
                    tracing::warn!(device = %device_id, ?reason, "GB28181 device offline");
                    out.extend(self.end_device_plays(
                        &device_id,
                        &format!("device {device_id} went offline ({reason:?})"),
                    ));
                    if self.registrar.device(&device_id).is_none() {
                        self.peers.remove(&device_id);
                    }
                }
                RegistrarEvent::CatalogUpdated { device_id, channels } => {
                    tracing::info!(device = %device_id, channels, "GB28181 catalog updated");
                }
            }
        }
        out
    }

    /// Ends every play of a device that went offline: a BYE where one was established (in
    /// case it still listens), and the streams told why.
    fn end_device_plays(&mut self, device_id: &str, reason: &str) -> Vec<Outgoing> {
        let ids: Vec<String> = self
            .plays
            .iter()
            .filter(|(_, e)| e.device_id == device_id)
            .map(|(id, _)| id.clone())
            .collect();
        let mut out = Vec::new();
        for id in ids {
            let Some(mut entry) = self.plays.remove(&id) else {
                continue;
            };
            if let Ok(Some(bye)) = entry.session.bye() {
                out.push(send(entry.peer, bye.to_string()));
            }
            if let Some(waiter) = entry.waiter.take() {
                let _ = waiter.send(Err(PlayError::WentOffline));
            }
            end(&mut entry, reason);
        }
        out
    }

    fn on_response(&mut self, response: &Response, now: Instant) -> Vec<Outgoing> {
        // Responses to our MESSAGEs and BYEs carry no play's Call-ID in an inviting state,
        // or none at all: nothing to do for them.
        let Some(call_id) = sip::call_id(response).ok() else {
            return Vec::new();
        };
        let Some(entry) = self.plays.get_mut(&call_id) else {
            return Vec::new();
        };
        let update = match entry.session.on_response(response, now) {
            Ok(update) => update,
            Err(e) => {
                tracing::debug!(%call_id, error = %e, "unusable response to an INVITE ignored");
                return Vec::new();
            }
        };
        let peer = entry.peer;
        let mut out = Vec::new();
        match update {
            PlayUpdate::Ignored => {}
            PlayUpdate::Provisional => entry.resend = None,
            PlayUpdate::AckAgain(ack) => out.push(send(peer, ack.to_string())),
            PlayUpdate::Established { ack, answer } => {
                entry.resend = None;
                out.push(send(peer, ack.to_string()));
                if !hand_over(entry, answer) {
                    // The stream gave up waiting: hang up at once.
                    if let Ok(Some(bye)) = entry.session.bye() {
                        out.push(send(peer, bye.to_string()));
                    }
                    self.plays.remove(&call_id);
                }
            }
            PlayUpdate::BadAnswer { ack, bye, error } => {
                out.push(send(peer, ack.to_string()));
                out.push(send(peer, bye.to_string()));
                self.fail(&call_id, PlayError::BadAnswer(error));
            }
            PlayUpdate::Failed { ack, status } => {
                out.push(send(peer, ack.to_string()));
                self.fail(&call_id, PlayError::Refused(status));
            }
        }
        out
    }

    fn fail(&mut self, call_id: &str, error: PlayError) {
        if let Some(mut entry) = self.plays.remove(call_id) {
            tracing::warn!(device = %entry.device_id, channel = %entry.session.offer().channel_id, %error, "GB28181 play failed");
            if let Some(waiter) = entry.waiter.take() {
                let _ = waiter.send(Err(error));
            }
        }
    }

    /// Starts a play: the INVITE goes out, and `reply` gets the outcome.
    pub fn play(
        &mut self,
        request: PlayRequest,
        reply: oneshot::Sender<Result<Play, PlayError>>,
        now: Instant,
    ) -> Vec<Outgoing> {
        match self.invite(request, now) {
            Ok((entry, invite)) => {
                let to = entry.peer;
                let entry = PlayEntry {
                    waiter: Some(reply),
                    ..entry
                };
                self.plays.insert(entry.session.call_id().to_string(), entry);
                vec![send(to, invite)]
            }
            Err(error) => {
                let _ = reply.send(Err(error));
                Vec::new()
            }
        }
    }

    fn invite(&mut self, request: PlayRequest, now: Instant) -> Result<(PlayEntry, String), PlayError> {
        let device = match self.registrar.device(&request.device_id) {
            None => return Err(PlayError::UnknownDevice(request.device_id)),
            Some(d) if !d.online => return Err(PlayError::Offline(request.device_id)),
            Some(d) => d,
        };
        // A camera is often its own only channel; an NVR's channels come from its catalog
        // (not known yet right after it registers: then the device decides).
        let listed = device.channels.is_empty()
            || request.channel_id == device.id
            || device.channels.iter().any(|c| c.device_id == request.channel_id);
        if !listed {
            return Err(PlayError::UnknownChannel {
                device: request.device_id,
                channel: request.channel_id,
            });
        }
        let peer = self
            .peers
            .get(&device.id)
            .copied()
            .unwrap_or(Peer::Udp(device.source));
        let local = self.local(peer);
        let ssrc =
            sdp::ssrc(&local.domain, self.next_ssrc, false).map_err(|e| PlayError::Invite(e.to_string()))?;
        self.next_ssrc = self.next_ssrc % 9_999 + 1;
        let offer = PlayOffer {
            channel_id: request.channel_id,
            media_ip: self.config.media_ip.clone(),
            media_port: request.media_port,
            ssrc,
            transport: request.transport,
        };
        let address = device.source.to_string();
        let session = PlaySession::new(local, &address, offer, fresh_ids(), self.config.play, now);
        let invite = session.invite().map_err(|e| PlayError::Invite(e.to_string()))?;
        tracing::info!(device = %request.device_id, channel = %session.offer().channel_id, call_id = %session.call_id(), ssrc = %session.offer().ssrc, "GB28181 INVITE");
        let resend = matches!(peer, Peer::Udp(_)).then_some((now + RESEND_FIRST, RESEND_FIRST));
        let entry = PlayEntry {
            session,
            device_id: request.device_id,
            peer,
            waiter: None,
            ended: None,
            resend,
        };
        Ok((entry, invite.to_string()))
    }

    /// The passage of time: devices whose keepalives stopped, INVITEs to send again or to
    /// give up on, plays their streams let go of (BYE).
    pub fn tick(&mut self, now: Instant) -> Vec<Outgoing> {
        let events = self.registrar.tick(now);
        let mut out = self.on_events(events);
        let mut finished = Vec::new();
        for (call_id, entry) in &mut self.plays {
            match entry.session.state() {
                PlayState::Inviting { .. } => {
                    if let Ok(PlayDecision::Restart { .. }) = entry.session.observe(now, None) {
                        if let Some(waiter) = entry.waiter.take() {
                            let _ = waiter.send(Err(PlayError::NoAnswer(self.config.play.answer)));
                        }
                        finished.push(call_id.clone());
                        continue;
                    }
                    if let Some((_, interval)) = entry.resend.filter(|&(at, _)| now >= at) {
                        if let Ok(invite) = entry.session.invite() {
                            out.push(send(entry.peer, invite.to_string()));
                        }
                        let next = (interval * 2).min(RESEND_MOST);
                        entry.resend = Some((now + next, next));
                    }
                }
                PlayState::Playing { .. } => {
                    if entry.ended.as_ref().is_none_or(oneshot::Sender::is_closed) {
                        if let Ok(Some(bye)) = entry.session.bye() {
                            out.push(send(entry.peer, bye.to_string()));
                        }
                        tracing::info!(device = %entry.device_id, call_id = %call_id, "stream let go of its GB28181 play; BYE sent");
                        finished.push(call_id.clone());
                    }
                }
                PlayState::Closed => finished.push(call_id.clone()),
            }
        }
        for call_id in finished {
            self.plays.remove(&call_id);
        }
        out
    }

    /// Every registered device, by id.
    pub fn devices(&self, now: Instant) -> Vec<DeviceSummary> {
        let mut devices: Vec<DeviceSummary> = self
            .registrar
            .devices()
            .map(|d| {
                let mut playing: Vec<String> = self
                    .plays
                    .values()
                    .filter(|p| p.device_id == d.id)
                    .map(|p| p.session.offer().channel_id.clone())
                    .collect();
                playing.sort();
                DeviceSummary {
                    id: d.id.clone(),
                    online: d.online,
                    address: d.source,
                    tcp: matches!(self.peers.get(&d.id), Some(Peer::Tcp(_))),
                    user_agent: d.user_agent.clone(),
                    expires_in: d.expires_at.saturating_duration_since(now),
                    last_seen_ago: now.saturating_duration_since(d.last_seen),
                    channels: d.channels.clone(),
                    playing,
                }
            })
            .collect();
        devices.sort_by(|a, b| a.id.cmp(&b.id));
        devices
    }

    fn peer(&self, device_id: &str) -> Option<Peer> {
        self.peers
            .get(device_id)
            .copied()
            .or_else(|| self.registrar.device(device_id).map(|d| Peer::Udp(d.source)))
    }

    /// The local endpoint as a device on `peer` sees it (Via says TCP on its connection).
    fn local(&self, peer: Peer) -> LocalEndpoint {
        let mut local = self.config.registrar.local.clone();
        local.tcp = matches!(peer, Peer::Tcp(_));
        local
    }
}

/// Gives the established play to the stream waiting for it; false when it gave up.
fn hand_over(entry: &mut PlayEntry, answer: SdpAnswer) -> bool {
    let Some(waiter) = entry.waiter.take() else {
        return false;
    };
    let offered = sdp::ssrc_value(&entry.session.offer().ssrc);
    let ssrc = answer.ssrc.as_deref().and_then(sdp::ssrc_value).or(offered);
    let (tx, rx) = oneshot::channel();
    let play = Play {
        call_id: entry.session.call_id().to_string(),
        ssrc,
        answer,
        ended: rx,
    };
    match waiter.send(Ok(play)) {
        Ok(()) => {
            entry.ended = Some(tx);
            true
        }
        Err(_) => false,
    }
}

fn end(entry: &mut PlayEntry, reason: &str) {
    if let Some(ended) = entry.ended.take() {
        let _ = ended.send(reason.to_string());
    }
}

fn send(to: Peer, text: String) -> Outgoing {
    Outgoing {
        to,
        bytes: text.into_bytes(),
    }
}

/// A random token for nonces, tags, branches and Call-IDs.
fn random_token() -> String {
    format!("{:016x}", rand::random::<u64>())
}

fn fresh_ids() -> DialogIds {
    DialogIds {
        call_id: random_token(),
        from_tag: random_token(),
        branch: random_token(),
    }
}

#[cfg(test)]
#[path = "signalling_tests.rs"]
mod tests;
