use std::net::SocketAddr;

use super::*;
use crate::simulated::{DeviceIdentity, MediaTarget, Reaction, SimulatedDevice};

const DEVICE: &str = "34020000001320000001";
const CHANNEL: &str = "34020000001310000001";

fn signalling() -> Signalling {
    Signalling::new(SignallingConfig {
        registrar: RegistrarConfig::new(crate::fixtures::local(), crate::fixtures::PASSWORD),
        media_ip: "192.168.1.10".into(),
        play: PlayTimeouts::default(),
    })
}

fn device(tcp: bool) -> SimulatedDevice {
    SimulatedDevice::new(DeviceIdentity {
        id: DEVICE.into(),
        channels: vec![CHANNEL.into()],
        domain: "3402000000".into(),
        server_id: "34020000002000000001".into(),
        password: crate::fixtures::PASSWORD.into(),
        address: "192.168.1.64:5060".into(),
        tcp,
        media_port: 15060,
    })
}

fn address() -> SocketAddr {
    "192.168.1.64:5060".parse().unwrap()
}

/// Delivers `texts` from the device, and everything the server answers back to the device,
/// until nothing more is said; returns the device's reactions.
fn converse(
    s: &mut Signalling,
    d: &mut SimulatedDevice,
    peer: Peer,
    texts: Vec<String>,
    now: Instant,
) -> Vec<Reaction> {
    let mut reactions = Vec::new();
    let mut to_server = texts;
    while !to_server.is_empty() {
        let mut to_device = Vec::new();
        for text in to_server.drain(..) {
            for out in s.on_message(text.as_bytes(), peer, now) {
                assert_eq!(out.to, peer, "answers go back the way the device came");
                to_device.push(out.bytes);
            }
        }
        for bytes in to_device {
            let reaction = d.on_message(&bytes);
            to_server.extend(reaction.send.iter().cloned());
            reactions.push(reaction);
        }
    }
    reactions
}

fn registered(peer: Peer, now: Instant) -> (Signalling, SimulatedDevice) {
    let mut s = signalling();
    let mut d = device(matches!(peer, Peer::Tcp(_)));
    let register = d.register(None, 3600);
    let reactions = converse(&mut s, &mut d, peer, vec![register], now);
    assert!(reactions.iter().any(|r| r.registered == Some(Ok(()))));
    let devices = s.devices(now);
    assert_eq!(devices.len(), 1);
    assert_eq!(
        devices[0].channels.len(),
        1,
        "the catalog was asked for and answered"
    );
    assert_eq!(devices[0].channels[0].device_id, CHANNEL);
    (s, d)
}

fn request(transport: MediaTransport) -> PlayRequest {
    PlayRequest {
        device_id: DEVICE.into(),
        channel_id: CHANNEL.into(),
        media_port: 30_000,
        transport,
    }
}

/// Invites the channel, lets the device answer, and returns the established play and the
/// device's view of it.
fn play(s: &mut Signalling, d: &mut SimulatedDevice, peer: Peer, now: Instant) -> (Play, MediaTarget) {
    let (reply, mut answer) = oneshot::channel();
    let invite = s.play(request(MediaTransport::Udp), reply, now);
    assert_eq!(invite.len(), 1);
    let reaction = d.on_message(&invite[0].bytes);
    let target = reaction.play.clone().expect("the device accepted");
    assert_eq!((target.ip.as_str(), target.port), ("192.168.1.10", 30_000));
    converse(s, d, peer, reaction.send, now);
    let play = answer.try_recv().expect("answered").expect("established");
    assert_eq!(play.ssrc, Some(target.ssrc));
    (play, target)
}

#[test]
fn register_catalog_play_and_hang_up_when_the_stream_lets_go() {
    let t0 = Instant::now();
    let peer = Peer::Udp(address());
    let (mut s, mut d) = registered(peer, t0);
    let (play, _) = play(&mut s, &mut d, peer, t0);
    assert_eq!(s.devices(t0)[0].playing, [CHANNEL]);
    assert!(
        s.tick(t0 + TICK_STEP).is_empty(),
        "nothing to say while the stream holds it"
    );
    drop(play);
    let out = s.tick(t0 + 2 * TICK_STEP);
    let bye = out.iter().find(|o| o.bytes.starts_with(b"BYE ")).expect("a BYE");
    assert_eq!(bye.to, peer);
    assert!(
        d.on_message(&bye.bytes).stop.is_some(),
        "the device stops pushing"
    );
    assert!(s.devices(t0)[0].playing.is_empty());
}

const TICK_STEP: Duration = Duration::from_millis(250);

#[test]
fn an_invite_over_udp_is_sent_again_until_answered_and_given_up_after_the_answer_timeout() {
    let t0 = Instant::now();
    let peer = Peer::Udp(address());
    let (mut s, _) = registered(peer, t0);
    let (reply, mut answer) = oneshot::channel();
    let first = s.play(request(MediaTransport::Udp), reply, t0);
    let mut resent = Vec::new();
    let mut now = t0;
    while now < t0 + Duration::from_secs(12) {
        now += TICK_STEP;
        resent.extend(
            s.tick(now)
                .into_iter()
                .filter(|o| o.bytes.starts_with(b"INVITE "))
                .map(|o| {
                    assert_eq!(o.bytes, first[0].bytes, "the same INVITE");
                    now.duration_since(t0)
                }),
        );
    }
    // 0.5 s, then 1, 2, 4 and 4 s apart, until the 10 s answer timeout.
    let at: Vec<u64> = resent.iter().map(|d| d.as_millis() as u64).collect();
    assert_eq!(at, [500, 1500, 3500, 7500]);
    assert_eq!(
        answer.try_recv().unwrap().unwrap_err(),
        PlayError::NoAnswer(Duration::from_secs(10))
    );
}

#[test]
fn over_tcp_nothing_is_resent_and_via_says_tcp() {
    let t0 = Instant::now();
    let peer = Peer::Tcp(address());
    let (mut s, _) = registered(peer, t0);
    let (reply, _answer) = oneshot::channel();
    let invite = s.play(request(MediaTransport::TcpPassive), reply, t0);
    assert_eq!(invite[0].to, peer);
    assert!(String::from_utf8_lossy(&invite[0].bytes).contains("Via: SIP/2.0/TCP "));
    assert!(String::from_utf8_lossy(&invite[0].bytes).contains("a=setup:passive"));
    let resends = s.tick(t0 + Duration::from_secs(1));
    assert!(!resends.iter().any(|o| o.bytes.starts_with(b"INVITE ")));
}

#[test]
fn the_devices_bye_ends_the_stream_with_its_reason() {
    let t0 = Instant::now();
    let peer = Peer::Udp(address());
    let (mut s, mut d) = registered(peer, t0);
    let (mut play, target) = play(&mut s, &mut d, peer, t0);
    let bye = d.bye(&target);
    let out = s.on_message(bye.as_bytes(), peer, t0);
    assert!(String::from_utf8_lossy(&out[0].bytes).starts_with("SIP/2.0 200 OK"));
    assert_eq!(
        play.ended.try_recv().unwrap(),
        "the device ended the stream (BYE)"
    );
    // A BYE for a dialog that is gone: 481.
    let out = s.on_message(bye.as_bytes(), peer, t0);
    assert!(String::from_utf8_lossy(&out[0].bytes).starts_with("SIP/2.0 481"));
}

#[test]
fn keepalive_loss_ends_plays_and_refuses_new_ones_until_the_device_is_back() {
    let t0 = Instant::now();
    let peer = Peer::Udp(address());
    let (mut s, mut d) = registered(peer, t0);
    let (mut play, _) = play(&mut s, &mut d, peer, t0);
    let keepalive = d.keepalive();
    converse(
        &mut s,
        &mut d,
        peer,
        vec![keepalive],
        t0 + Duration::from_secs(60),
    );
    assert!(
        s.tick(t0 + Duration::from_secs(200)).is_empty(),
        "alive: its keepalive came at 60 s"
    );
    let out = s.tick(t0 + Duration::from_secs(240));
    assert!(
        out.iter().any(|o| o.bytes.starts_with(b"BYE ")),
        "a BYE in case it still listens"
    );
    assert!(play
        .ended
        .try_recv()
        .unwrap()
        .contains("went offline (KeepaliveLost)"));
    let (reply, mut answer) = oneshot::channel();
    assert!(s.play(request(MediaTransport::Udp), reply, t0).is_empty());
    assert_eq!(
        answer.try_recv().unwrap().unwrap_err(),
        PlayError::Offline(DEVICE.into())
    );
    // The device comes back with its next keepalive; plays work again.
    let later = t0 + Duration::from_secs(300);
    let keepalive = d.keepalive();
    converse(&mut s, &mut d, peer, vec![keepalive], later);
    assert!(s.devices(later)[0].online);
    play_again(&mut s, &mut d, peer, later);
}

fn play_again(s: &mut Signalling, d: &mut SimulatedDevice, peer: Peer, now: Instant) {
    let (p, _) = play(s, d, peer, now);
    assert!(p.ssrc.is_some());
}

#[test]
fn refusals_name_the_problem() {
    let t0 = Instant::now();
    let peer = Peer::Udp(address());
    let mut s = signalling();
    let (reply, mut answer) = oneshot::channel();
    s.play(request(MediaTransport::Udp), reply, t0);
    assert_eq!(
        answer.try_recv().unwrap().unwrap_err(),
        PlayError::UnknownDevice(DEVICE.into())
    );
    let (mut s, mut d) = registered(peer, t0);
    let (reply, mut answer) = oneshot::channel();
    let mut other = request(MediaTransport::Udp);
    other.channel_id = "34020000001310000099".into();
    s.play(other, reply, t0);
    assert!(matches!(
        answer.try_recv().unwrap(),
        Err(PlayError::UnknownChannel { .. })
    ));
    // The device answers 486 Busy Here: the play fails with it, and the 486 is ACKed.
    let (reply, mut answer) = oneshot::channel();
    let invite = s.play(request(MediaTransport::Udp), reply, t0);
    let SipMessage::Request(invite) = sip::parse(&invite[0].bytes).unwrap() else {
        panic!()
    };
    let busy = sip::response(&invite, 486, Some("busy")).to_string();
    let out = s.on_message(busy.as_bytes(), peer, t0);
    assert!(out[0].bytes.starts_with(b"ACK "));
    assert_eq!(answer.try_recv().unwrap().unwrap_err(), PlayError::Refused(486));
    let _ = &mut d;
}

#[test]
fn a_wrong_password_is_refused() {
    let t0 = Instant::now();
    let peer = Peer::Udp(address());
    let mut s = signalling();
    let mut d = device(false);
    d.identity.password = "wrong".into();
    let register = d.register(None, 3600);
    let reactions = converse(&mut s, &mut d, peer, vec![register], t0);
    assert!(reactions.iter().any(|r| r.registered == Some(Err(403))));
    assert!(s.devices(t0).is_empty());
}

#[test]
fn a_stream_that_gave_up_waiting_gets_the_late_answer_hung_up() {
    let t0 = Instant::now();
    let peer = Peer::Udp(address());
    let (mut s, mut d) = registered(peer, t0);
    let (reply, answer) = oneshot::channel();
    let invite = s.play(request(MediaTransport::Udp), reply, t0);
    drop(answer);
    let reaction = d.on_message(&invite[0].bytes);
    let out = s.on_message(reaction.send[0].as_bytes(), peer, t0);
    assert!(out[0].bytes.starts_with(b"ACK "));
    assert!(out[1].bytes.starts_with(b"BYE "));
    assert!(s.devices(t0)[0].playing.is_empty());
}
