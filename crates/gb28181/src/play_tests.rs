use super::*;
use crate::fixtures;
use crate::sdp::MediaTransport;
use crate::sip::SipMessage;

const CHANNEL: &str = "34020000001310000001";

fn session(now: Instant) -> PlaySession {
    let offer = PlayOffer {
        channel_id: CHANNEL.into(),
        media_ip: "192.168.1.10".into(),
        media_port: 30000,
        ssrc: "0200000001".into(),
        transport: MediaTransport::Udp,
    };
    let ids = DialogIds {
        call_id: "call-1".into(),
        from_tag: "t1".into(),
        branch: "inv1".into(),
    };
    PlaySession::new(
        fixtures::local(),
        "192.168.1.64:5060",
        offer,
        ids,
        PlayTimeouts::default(),
        now,
    )
}

const ANSWER_SDP: &str = "v=0\r\no=34020000001310000001 0 0 IN IP4 192.168.1.64\r\ns=Play\r\n\
    c=IN IP4 192.168.1.64\r\nt=0 0\r\nm=video 15060 RTP/AVP 96\r\na=sendonly\r\n\
    a=rtpmap:96 PS/90000\r\ny=0200000001\r\n";

/// The device's answer to the session's INVITE: `status`, with `body`.
fn device_response(status: &str, call_id: &str, body: &str) -> Response {
    let text = format!(
        "SIP/2.0 {status}\r\n\
         Via: SIP/2.0/UDP 192.168.1.10:5060;rport=5060;branch=z9hG4bKinv1\r\n\
         From: <sip:34020000002000000001@3402000000>;tag=t1\r\n\
         To: <sip:{CHANNEL}@3402000000>;tag=dev77\r\n\
         Call-ID: {call_id}\r\n\
         CSeq: 1 INVITE\r\n\
         Contact: <sip:{CHANNEL}@192.168.1.64:5061>\r\n\
         Content-Type: application/sdp\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    match sip::parse(text.as_bytes()).unwrap() {
        SipMessage::Response(response) => response,
        SipMessage::Request(_) => panic!("not a response"),
    }
}

#[test]
fn invite_carries_the_offer() {
    let text = session(Instant::now()).invite().unwrap().to_string();
    assert!(
        text.starts_with(&format!("INVITE sip:{CHANNEL}@192.168.1.64:5060 SIP/2.0\r\n")),
        "{text}"
    );
    assert!(text.contains(&format!("To: <sip:{CHANNEL}@3402000000>\r\n")));
    assert!(text.contains("From: <sip:34020000002000000001@3402000000>;tag=t1\r\n"));
    assert!(text.contains("CSeq: 1 INVITE\r\n"));
    assert!(text.contains(&format!(
        "Subject: {CHANNEL}:0200000001,34020000002000000001:0\r\n"
    )));
    assert!(text.contains("Content-Type: APPLICATION/SDP\r\n"));
    assert!(text.contains("m=video 30000 RTP/AVP 96\r\n"));
    assert!(text.contains("y=0200000001\r\n"));
}

#[test]
fn answer_establishes_then_bye_closes() {
    let now = Instant::now();
    let mut session = session(now);
    let trying = device_response("100 Trying", "call-1", "");
    assert_eq!(
        session.on_response(&trying, now).unwrap(),
        PlayUpdate::Provisional
    );
    let ok = device_response("200 OK", "call-1", ANSWER_SDP);
    let PlayUpdate::Established { ack, answer } = session.on_response(&ok, now).unwrap() else {
        panic!("not established");
    };
    assert_eq!((answer.address.as_str(), answer.port), ("192.168.1.64", 15060));
    assert_eq!(answer.ssrc.as_deref(), Some("0200000001"));
    let ack = ack.to_string();
    assert!(
        ack.starts_with(&format!("ACK sip:{CHANNEL}@192.168.1.64:5061 SIP/2.0\r\n")),
        "{ack}"
    );
    assert!(ack.contains(&format!("To: <sip:{CHANNEL}@3402000000>;tag=dev77\r\n")));
    assert!(ack.contains("CSeq: 1 ACK\r\n"));
    assert!(ack.contains("branch=z9hG4bKinv1-ack"));
    assert!(matches!(session.state(), PlayState::Playing { .. }));

    // The device did not hear our ACK and sends its 200 again.
    assert!(matches!(
        session.on_response(&ok, now).unwrap(),
        PlayUpdate::AckAgain(_)
    ));

    let bye = session.bye().unwrap().unwrap().to_string();
    assert!(bye.starts_with(&format!("BYE sip:{CHANNEL}@192.168.1.64:5061 SIP/2.0\r\n")));
    assert!(bye.contains("CSeq: 2 BYE\r\n"));
    assert!(bye.contains("Call-ID: call-1\r\n"));
    assert!(bye.contains(";tag=dev77\r\n"));
    assert_eq!(session.state(), &PlayState::Closed);
    assert_eq!(session.bye().unwrap(), None, "one BYE only");
}

#[test]
fn refusals_and_strangers() {
    let now = Instant::now();
    let mut session = session(now);
    let other = device_response("200 OK", "another-call", ANSWER_SDP);
    assert_eq!(session.on_response(&other, now).unwrap(), PlayUpdate::Ignored);
    let busy = device_response("486 Busy Here", "call-1", "");
    let PlayUpdate::Failed { ack, status } = session.on_response(&busy, now).unwrap() else {
        panic!("not failed");
    };
    assert_eq!(status, 486);
    let ack = ack.to_string();
    assert!(ack.starts_with(&format!("ACK sip:{CHANNEL}@192.168.1.64:5060 SIP/2.0\r\n")));
    assert!(
        ack.contains("branch=z9hG4bKinv1\r\n"),
        "same transaction as the INVITE: {ack}"
    );
    assert_eq!(session.state(), &PlayState::Closed);
}

#[test]
fn unreadable_answer_is_acked_and_hung_up() {
    let now = Instant::now();
    let mut session = session(now);
    let ok = device_response("200 OK", "call-1", "v=0\r\n");
    assert!(matches!(
        session.on_response(&ok, now).unwrap(),
        PlayUpdate::BadAnswer { .. }
    ));
    assert_eq!(session.state(), &PlayState::Closed);
}

#[test]
fn timeouts_table() {
    let secs = Duration::from_secs;
    // (answered, seconds after start, seconds of last media after start, expect restart)
    let cases = [
        (false, 9, None, false),
        (false, 10, None, true),
        (true, 9, None, false),
        (true, 10, None, true),
        (true, 30, Some(25), false),
        (true, 30, Some(20), true),
    ];
    for (answered, at, media, restart) in cases {
        let start = Instant::now();
        let mut session = session(start);
        if answered {
            session
                .on_response(&device_response("200 OK", "call-1", ANSWER_SDP), start)
                .unwrap();
        }
        let decision = session
            .observe(start + secs(at), media.map(|m| start + secs(m)))
            .unwrap();
        match decision {
            PlayDecision::Wait => assert!(!restart, "{answered} {at} {media:?}"),
            PlayDecision::Restart { bye } => {
                assert!(restart, "{answered} {at} {media:?}");
                assert_eq!(bye.is_some(), answered, "only an established dialog is hung up");
                assert_eq!(session.state(), &PlayState::Closed);
            }
        }
    }
}

#[test]
fn device_hangs_up() {
    let now = Instant::now();
    let mut session = session(now);
    session
        .on_response(&device_response("200 OK", "call-1", ANSWER_SDP), now)
        .unwrap();
    let bye = format!(
        "BYE sip:34020000002000000001@192.168.1.10:5060 SIP/2.0\r\n\
         Via: SIP/2.0/UDP 192.168.1.64:5061;branch=z9hG4bKdevbye\r\n\
         From: <sip:{CHANNEL}@3402000000>;tag=dev77\r\n\
         To: <sip:34020000002000000001@3402000000>;tag=t1\r\n\
         Call-ID: call-1\r\nCSeq: 3 BYE\r\nContent-Length: 0\r\n\r\n"
    );
    let SipMessage::Request(bye) = sip::parse(bye.as_bytes()).unwrap() else {
        panic!()
    };
    assert_eq!(session.on_bye(&bye).status_code.code(), 200);
    assert_eq!(session.state(), &PlayState::Closed);
    assert_eq!(
        session.observe(now + Duration::from_secs(60), None).unwrap(),
        PlayDecision::Wait
    );
}
