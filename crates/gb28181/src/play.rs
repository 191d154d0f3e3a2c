//! One live-play dialog with a device's channel as plain state: the INVITE with the
//! server's offer, the device's 200 OK and our ACK, BYE when the stream stops, and the
//! decision to start over (a fresh INVITE) when the answer or the media does not come.
//!
//! `Inviting` → `Playing` → `Closed`; a timeout in either of the first two also ends in
//! `Closed` with [`PlayDecision::Restart`], and the caller makes a new session.

use std::time::{Duration, Instant};

use rsip::headers::{self, UntypedHeader};
use rsip::prelude::HeadersExt;
use rsip::{Method, Request, Response};

use crate::sdp::{self, PlayOffer, SdpAnswer};
use crate::sip::{self, DialogIds, LocalEndpoint, OutgoingRequest, SipError};

/// How long to wait before giving up on a play attempt.
#[derive(Debug, Clone, Copy)]
pub struct PlayTimeouts {
    /// From the INVITE to the device's final answer.
    pub answer: Duration,
    /// Without media while playing (and from the answer to the first packet).
    pub media: Duration,
}

impl Default for PlayTimeouts {
    fn default() -> Self {
        PlayTimeouts {
            answer: Duration::from_secs(10),
            media: Duration::from_secs(10),
        }
    }
}

/// Where the dialog stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlayState {
    Inviting { since: Instant },
    Playing { since: Instant, answer: SdpAnswer },
    Closed,
}

/// What a response to our INVITE means.
#[derive(Debug, Clone, PartialEq)]
pub enum PlayUpdate {
    /// Not for this dialog, or a late duplicate with nothing to do.
    Ignored,
    /// 1xx: still ringing; the answer timeout keeps running.
    Provisional,
    /// 2xx: send `ack`; media comes as `answer` says.
    Established { ack: Request, answer: SdpAnswer },
    /// A retransmitted 2xx: our ACK was lost, send it again.
    AckAgain(Request),
    /// A 2xx whose SDP we could not read: send `ack`, then `bye`, and start over.
    BadAnswer {
        ack: Request,
        bye: Request,
        error: sdp::SdpError,
    },
    /// 3xx–6xx: send `ack` (RFC 3261 §17.1.1.3); the attempt failed with `status`.
    Failed { ack: Request, status: u16 },
}

/// What time says about the dialog.
#[derive(Debug, Clone, PartialEq)]
pub enum PlayDecision {
    Wait,
    /// Give this attempt up: send `bye` where there is one, then invite again (boxed:
    /// a request is large and `Wait` is the common answer).
    Restart {
        bye: Option<Box<Request>>,
    },
}

/// The dialog of one channel's live play.
#[derive(Debug, Clone)]
pub struct PlaySession {
    local: LocalEndpoint,
    ids: DialogIds,
    offer: PlayOffer,
    /// The INVITE's Request-URI: the channel at the device's address.
    target: String,
    cseq: u32,
    timeouts: PlayTimeouts,
    /// The To header of the 2xx, with the device's tag.
    remote_to: Option<String>,
    /// The device's Contact from the 2xx, where in-dialog requests go.
    remote_target: Option<String>,
    state: PlayState,
}

impl PlaySession {
    /// A session about to invite `offer.channel_id` at `device_address` (`host:port`, where
    /// the device registered from).
    pub fn new(
        local: LocalEndpoint,
        device_address: &str,
        offer: PlayOffer,
        ids: DialogIds,
        timeouts: PlayTimeouts,
        now: Instant,
    ) -> PlaySession {
        let target = format!("sip:{}@{device_address}", offer.channel_id);
        PlaySession {
            local,
            ids,
            offer,
            target,
            cseq: 1,
            timeouts,
            remote_to: None,
            remote_target: None,
            state: PlayState::Inviting { since: now },
        }
    }

    pub fn state(&self) -> &PlayState {
        &self.state
    }

    pub fn call_id(&self) -> &str {
        &self.ids.call_id
    }

    pub fn offer(&self) -> &PlayOffer {
        &self.offer
    }

    /// The INVITE; the same bytes each call, so the caller can retransmit it over UDP.
    pub fn invite(&self) -> Result<Request, SipError> {
        let to = format!("<sip:{}@{}>", self.offer.channel_id, self.local.domain);
        // GB28181 §9.2: "media sender id:SSRC,receiver id:0".
        let subject = format!(
            "{}:{},{}:0",
            self.offer.channel_id, self.offer.ssrc, self.local.server_id
        );
        let out = OutgoingRequest {
            method: Method::Invite,
            uri: &self.target,
            to: &to,
            cseq: self.cseq,
            branch: &self.ids.branch,
            body: Some(("APPLICATION/SDP", self.offer.sdp().into_bytes())),
            extra: vec![headers::Subject::new(subject).into()],
        };
        sip::request(&self.local, &self.ids, out)
    }

    /// Takes a response; anything not answering our INVITE is ignored.
    pub fn on_response(&mut self, response: &Response, now: Instant) -> Result<PlayUpdate, SipError> {
        let ours = sip::call_id(response)? == self.ids.call_id
            && sip::cseq(response)? == (self.cseq, Method::Invite);
        if !ours {
            return Ok(PlayUpdate::Ignored);
        }
        let status = response.status_code.code();
        let to = response
            .to_header()
            .map_err(|_| SipError::Missing("To"))?
            .value()
            .to_string();
        match (status, &self.state) {
            (100..=199, PlayState::Inviting { .. }) => Ok(PlayUpdate::Provisional),
            (200..=299, PlayState::Inviting { .. }) => {
                self.remote_to = Some(to);
                self.remote_target = sip::contact_uri(response);
                let ack = self.in_dialog(Method::Ack, self.cseq, "ack")?;
                let body = String::from_utf8_lossy(&response.body);
                match sdp::parse_answer(&body) {
                    Ok(answer) => {
                        self.state = PlayState::Playing {
                            since: now,
                            answer: answer.clone(),
                        };
                        Ok(PlayUpdate::Established { ack, answer })
                    }
                    Err(error) => {
                        let bye = self.in_dialog(Method::Bye, self.cseq + 1, "bye")?;
                        self.state = PlayState::Closed;
                        Ok(PlayUpdate::BadAnswer { ack, bye, error })
                    }
                }
            }
            (200..=299, PlayState::Playing { .. }) => Ok(PlayUpdate::AckAgain(self.in_dialog(
                Method::Ack,
                self.cseq,
                "ack",
            )?)),
            (300.., PlayState::Inviting { .. }) => {
                self.state = PlayState::Closed;
                Ok(PlayUpdate::Failed {
                    ack: self.failure_ack(&to)?,
                    status,
                })
            }
            _ => Ok(PlayUpdate::Ignored),
        }
    }

    /// The BYE that ends a playing dialog (the stream was removed); `None` when no dialog was
    /// established. A device still ringing gets nothing: its late 2xx is answered then.
    pub fn bye(&mut self) -> Result<Option<Request>, SipError> {
        if !matches!(self.state, PlayState::Playing { .. }) {
            return Ok(None);
        }
        let bye = self.in_dialog(Method::Bye, self.cseq + 1, "bye")?;
        self.state = PlayState::Closed;
        Ok(Some(bye))
    }

    /// The device hung up (its BYE carries our Call-ID): the 200 to send. The caller
    /// decides whether to invite again.
    pub fn on_bye(&mut self, request: &Request) -> Response {
        self.state = PlayState::Closed;
        sip::response(request, 200, None)
    }

    /// Decides on timeouts: no final answer within `answer`, or no media within `media`
    /// while playing (`last_media`: when the ingest last saw a packet for this SSRC).
    pub fn observe(&mut self, now: Instant, last_media: Option<Instant>) -> Result<PlayDecision, SipError> {
        match &self.state {
            PlayState::Inviting { since } if now.duration_since(*since) >= self.timeouts.answer => {
                self.state = PlayState::Closed;
                Ok(PlayDecision::Restart { bye: None })
            }
            PlayState::Playing { since, .. } => {
                let last = last_media.map_or(*since, |m| m.max(*since));
                if now.duration_since(last) < self.timeouts.media {
                    return Ok(PlayDecision::Wait);
                }
                let bye = self.in_dialog(Method::Bye, self.cseq + 1, "bye")?;
                self.state = PlayState::Closed;
                Ok(PlayDecision::Restart {
                    bye: Some(Box::new(bye)),
                })
            }
            _ => Ok(PlayDecision::Wait),
        }
    }

    /// ACK or BYE inside the dialog: to the device's Contact, with its tag, and a branch of
    /// its own (an ACK to a 2xx is a new transaction, RFC 3261 §13.2.2.4).
    fn in_dialog(&self, method: Method, cseq: u32, suffix: &str) -> Result<Request, SipError> {
        let to = self.remote_to.as_deref().ok_or(SipError::Missing("To"))?;
        let branch = format!("{}-{suffix}", self.ids.branch);
        let out = OutgoingRequest {
            method,
            uri: self.remote_target.as_deref().unwrap_or(&self.target),
            to,
            cseq,
            branch: &branch,
            body: None,
            extra: Vec::new(),
        };
        sip::request(&self.local, &self.ids, out)
    }

    /// The ACK of a non-2xx final answer: part of the INVITE's transaction, so the INVITE's
    /// Request-URI and branch, with the To of the response.
    fn failure_ack(&self, to: &str) -> Result<Request, SipError> {
        let out = OutgoingRequest {
            method: Method::Ack,
            uri: &self.target,
            to,
            cseq: self.cseq,
            branch: &self.ids.branch,
            body: None,
            extra: Vec::new(),
        };
        sip::request(&self.local, &self.ids, out)
    }
}

#[cfg(test)]
#[path = "play_tests.rs"]
mod tests;
