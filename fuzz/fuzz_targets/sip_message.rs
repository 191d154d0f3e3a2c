//! A GB28181 SIP message from the network: parsed by rsip, then fed to the registrar (digest
//! credentials, MANSCDP bodies) or to a play session (the SDP answer), and the body parsers
//! on their own, since the registrar reads bodies only from registered devices; the same
//! bytes as a TCP stream through the framer, and to the whole signalling state and the
//! simulated device (the test peer also reads what servers send).
#![no_main]

use std::time::Instant;

use libfuzzer_sys::fuzz_target;
use peregrine_gb28181::digest::Credentials;
use peregrine_gb28181::framing::{self, Frame};
use peregrine_gb28181::manscdp;
use peregrine_gb28181::play::{PlaySession, PlayTimeouts};
use peregrine_gb28181::registrar::{Registrar, RegistrarConfig};
use peregrine_gb28181::sdp::{self, MediaTransport, PlayOffer};
use peregrine_gb28181::signalling::{Peer, Signalling, SignallingConfig};
use peregrine_gb28181::simulated::{DeviceIdentity, SimulatedDevice};
use peregrine_gb28181::sip::{self, DialogIds, LocalEndpoint, SipMessage};

fn local() -> LocalEndpoint {
    LocalEndpoint {
        server_id: "34020000002000000001".into(),
        domain: "3402000000".into(),
        host: "192.168.1.10".into(),
        port: 5060,
        tcp: false,
    }
}

/// Frames `data` as a TCP connection would: every message found must lie inside it.
fn frame_all(mut data: &[u8]) {
    while let Ok(frame) = framing::next_frame(data) {
        match frame {
            Frame::Message { start, end } => {
                assert!(start <= end && end <= data.len());
                data = &data[end..];
            }
            Frame::Partial { .. } => return,
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let now = Instant::now();
    frame_all(data);
    let mut signalling = Signalling::new(SignallingConfig {
        registrar: RegistrarConfig::new(local(), "12345678"),
        media_ip: "192.168.1.10".into(),
        play: PlayTimeouts::default(),
    });
    let peer = Peer::Udp("192.168.1.64:5060".parse().unwrap());
    let _ = signalling.on_message(data, peer, now);
    let _ = signalling.tick(now);
    let mut device = SimulatedDevice::new(DeviceIdentity {
        id: "34020000001320000001".into(),
        channels: vec!["34020000001310000001".into()],
        domain: "3402000000".into(),
        server_id: "34020000002000000001".into(),
        password: "12345678".into(),
        address: "192.168.1.64:5060".into(),
        tcp: false,
        media_port: 15060,
    });
    let _ = device.on_message(data);
    let _ = manscdp::parse(data);
    let text = String::from_utf8_lossy(data);
    let _ = sdp::parse_answer(&text);
    let _ = Credentials::parse(&text).map(|c| c.verify("REGISTER", "12345678"));
    match sip::parse(data) {
        Ok(SipMessage::Request(request)) => {
            let mut registrar = Registrar::new(RegistrarConfig::new(local(), "12345678"));
            let source = "192.168.1.64:5060".parse().unwrap();
            let handled = registrar.handle(&request, source, "nonce", now);
            let _ = handled.response.to_string();
        }
        Ok(SipMessage::Response(response)) => {
            let offer = PlayOffer {
                channel_id: "34020000001310000001".into(),
                media_ip: "192.168.1.10".into(),
                media_port: 30000,
                ssrc: "0200000001".into(),
                transport: MediaTransport::Udp,
            };
            let ids = DialogIds {
                call_id: "c".into(),
                from_tag: "t".into(),
                branch: "b".into(),
            };
            let mut session = PlaySession::new(
                local(),
                "192.168.1.64:5060",
                offer,
                ids,
                PlayTimeouts::default(),
                now,
            );
            let _ = session.on_response(&response, now);
            let _ = session.bye();
        }
        Err(_) => {}
    }
});
