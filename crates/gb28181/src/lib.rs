//! GB28181 signalling: plain state (no sockets, no clocks) and the SIP server around it.
//! [`service`]'s task owns a [`signalling::Signalling`] (the [`registrar::Registrar`] and
//! the [`play::PlaySession`]s), feeds it what arrives and the current time, and sends
//! whatever it returns; everything else in this crate is pure.
//!
//! - [`digest`]: digest authentication (RFC 2617 MD5, RFC 7616 SHA-256) for REGISTER.
//! - [`manscdp`]: the XML bodies of GB28181's MESSAGEs (Keepalive, Catalog), including the
//!   GB2312/GBK bodies many devices send.
//! - [`sip`]: small helpers over `rsip` for responses and the headers GB28181 needs.
//! - [`registrar`]: the device registry: registration with digest, expiry, keepalive
//!   liveness, catalog results as channels.
//! - [`sdp`] and [`play`]: live play: the INVITE's SDP offer and SSRC, the device's answer,
//!   and the dialog (ACK, BYE, when to re-INVITE).
//! - [`signalling`]: all of the above as one state that takes bytes and returns bytes.
//! - [`framing`]: where one SIP message ends on a TCP connection.
//! - [`service`]: the UDP and TCP SIP server and the [`service::Gb28181`] handle that
//!   streams and the API use.
//! - [`simulated`]: a device as plain state, the peer of tests and load scripts.

pub mod digest;
pub mod framing;
pub mod manscdp;
pub mod play;
pub mod registrar;
pub mod sdp;
pub mod service;
pub mod signalling;
pub mod simulated;
pub mod sip;

#[cfg(test)]
mod fixtures;
