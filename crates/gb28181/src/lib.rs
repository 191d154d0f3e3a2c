//! GB28181 signalling as plain state: no sockets, no clocks, no tokio. The server's SIP task
//! (a later step) owns a [`registrar::Registrar`] and the
//! [`play::PlaySession`]s, feeds them parsed messages and
//! the current time, and sends whatever they return.
//!
//! - [`digest`]: digest authentication (RFC 2617 MD5, RFC 7616 SHA-256) for REGISTER.
//! - [`manscdp`]: the XML bodies of GB28181's MESSAGEs (Keepalive, Catalog), including the
//!   GB2312/GBK bodies many devices send.
//! - [`sip`]: small helpers over `rsip` for responses and the headers GB28181 needs.
//! - [`registrar`]: the device registry: registration with digest, expiry, keepalive
//!   liveness, catalog results as channels.
//! - [`sdp`] and [`play`]: live play: the INVITE's SDP offer and SSRC, the device's answer,
//!   and the dialog (ACK, BYE, when to re-INVITE).

pub mod digest;
pub mod manscdp;
pub mod play;
pub mod registrar;
pub mod sdp;
pub mod sip;

#[cfg(test)]
mod fixtures;
