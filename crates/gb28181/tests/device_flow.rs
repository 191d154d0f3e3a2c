//! One camera's whole signalling life through the public API, every message going through
//! text as it would on the wire: register (401, then 200), keepalive, catalog query and
//! answer, live play (INVITE, 200, ACK), BYE, keepalive loss.

use std::time::{Duration, Instant};

use peregrine_gb28181::digest::{self, Algorithm, ResponseInput};
use peregrine_gb28181::play::{PlaySession, PlayState, PlayTimeouts, PlayUpdate};
use peregrine_gb28181::registrar::{OfflineReason, Registrar, RegistrarConfig, RegistrarEvent};
use peregrine_gb28181::sdp::{self, MediaTransport, PlayOffer};
use peregrine_gb28181::sip::{self, DialogIds, LocalEndpoint, SipMessage};

const DEVICE: &str = "34020000001320000001";
const CHANNEL: &str = "34020000001310000001";

fn wire_request(text: &str) -> sip::Request {
    match sip::parse(text.as_bytes()).unwrap() {
        SipMessage::Request(request) => request,
        SipMessage::Response(_) => panic!("not a request"),
    }
}

fn wire_response(text: &str) -> sip::Response {
    match sip::parse(text.as_bytes()).unwrap() {
        SipMessage::Response(response) => response,
        SipMessage::Request(_) => panic!("not a response"),
    }
}

/// The device's REGISTER, with credentials for `nonce` when given.
fn register(cseq: u32, nonce: Option<&str>) -> String {
    let uri = "sip:34020000002000000001@3402000000";
    let authorization = nonce.map_or(String::new(), |nonce| {
        let response = digest::response(&ResponseInput {
            algorithm: Algorithm::Md5,
            username: DEVICE,
            realm: "3402000000",
            password: "12345678",
            method: "REGISTER",
            uri,
            nonce,
            qop_auth: None,
        });
        format!(
            "Authorization: Digest username=\"{DEVICE}\",realm=\"3402000000\",nonce=\"{nonce}\",\
             uri=\"{uri}\",response=\"{response}\",algorithm=MD5\r\n"
        )
    });
    format!(
        "REGISTER {uri} SIP/2.0\r\nVia: SIP/2.0/UDP 192.168.1.64:5060;rport;branch=z9hG4bK{cseq}\r\n\
         From: <sip:{DEVICE}@3402000000>;tag=11\r\nTo: <sip:{DEVICE}@3402000000>\r\nCall-ID: reg-1\r\n\
         CSeq: {cseq} REGISTER\r\nContact: <sip:{DEVICE}@192.168.1.64:5060>\r\nMax-Forwards: 70\r\n\
         {authorization}Expires: 3600\r\nContent-Length: 0\r\n\r\n"
    )
}

fn device_message(body: &str) -> String {
    format!(
        "MESSAGE sip:34020000002000000001@3402000000 SIP/2.0\r\n\
         Via: SIP/2.0/UDP 192.168.1.64:5060;rport;branch=z9hG4bKm{}\r\n\
         From: <sip:{DEVICE}@3402000000>;tag=12\r\nTo: <sip:34020000002000000001@3402000000>\r\n\
         Call-ID: msg-{}\r\nCSeq: 1 MESSAGE\r\nContent-Type: Application/MANSCDP+xml\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len(),
        body.len(),
        body.len()
    )
}

#[test]
fn a_camera_registers_is_catalogued_plays_and_goes_silent() {
    let local = LocalEndpoint {
        server_id: "34020000002000000001".into(),
        domain: "3402000000".into(),
        host: "192.168.1.10".into(),
        port: 5060,
        tcp: false,
    };
    let mut registrar = Registrar::new(RegistrarConfig::new(local.clone(), "12345678"));
    let source = "192.168.1.64:5060".parse().unwrap();
    let t0 = Instant::now();

    let challenge = registrar.handle(&wire_request(&register(1, None)), source, "4e6f6e6365", t0);
    let challenge = wire_response(&challenge.response.to_string());
    assert_eq!(challenge.status_code.code(), 401);
    let accepted = registrar.handle(&wire_request(&register(2, Some("4e6f6e6365"))), source, "x", t0);
    assert_eq!(accepted.response.status_code.code(), 200);
    assert_eq!(
        accepted.events,
        [RegistrarEvent::DeviceOnline {
            device_id: DEVICE.into()
        }]
    );

    let ids = DialogIds {
        call_id: "cat-1".into(),
        from_tag: "s1".into(),
        branch: "c1".into(),
    };
    let query = registrar.catalog_query(DEVICE, &ids).unwrap().to_string();
    assert!(wire_request(&query).body.starts_with(b"<?xml"));
    let catalog = format!(
        "<?xml version=\"1.0\"?><Response><CmdType>Catalog</CmdType><SN>1</SN><DeviceID>{DEVICE}</DeviceID>\
         <SumNum>1</SumNum><DeviceList Num=\"1\"><Item><DeviceID>{CHANNEL}</DeviceID><Name>Gate</Name>\
         <Status>ON</Status></Item></DeviceList></Response>"
    );
    let answered = registrar.handle(&wire_request(&device_message(&catalog)), source, "x", t0);
    assert_eq!(
        answered.events,
        [RegistrarEvent::CatalogUpdated {
            device_id: DEVICE.into(),
            channels: 1
        }]
    );

    // Live play of the catalogued channel.
    let device = registrar.device(DEVICE).unwrap();
    let offer = PlayOffer {
        channel_id: device.channels[0].device_id.clone(),
        media_ip: "192.168.1.10".into(),
        media_port: 30000,
        ssrc: sdp::ssrc(&local.domain, 1, false).unwrap(),
        transport: MediaTransport::TcpPassive,
    };
    let ids = DialogIds {
        call_id: "play-1".into(),
        from_tag: "s2".into(),
        branch: "p1".into(),
    };
    let mut play = PlaySession::new(
        local,
        &source.to_string(),
        offer,
        ids,
        PlayTimeouts::default(),
        t0,
    );
    let invite = wire_request(&play.invite().unwrap().to_string());
    assert!(String::from_utf8_lossy(&invite.body).contains("a=setup:passive"));
    let answer = "v=0\r\no=x 0 0 IN IP4 192.168.1.64\r\ns=Play\r\nc=IN IP4 192.168.1.64\r\nt=0 0\r\n\
                  m=video 9 TCP/RTP/AVP 96\r\na=setup:active\r\na=sendonly\r\ny=0200000001\r\n";
    let ok = format!(
        "SIP/2.0 200 OK\r\nVia: SIP/2.0/UDP 192.168.1.10:5060;rport;branch=z9hG4bKp1\r\n\
         From: <sip:34020000002000000001@3402000000>;tag=s2\r\nTo: <sip:{CHANNEL}@3402000000>;tag=d9\r\n\
         Call-ID: play-1\r\nCSeq: 1 INVITE\r\nContent-Type: application/sdp\r\nContent-Length: {}\r\n\r\n{answer}",
        answer.len()
    );
    let PlayUpdate::Established { ack, answer } = play.on_response(&wire_response(&ok), t0).unwrap() else {
        panic!("not established");
    };
    assert_eq!(
        answer.transport,
        MediaTransport::TcpPassive,
        "the device connects to us"
    );
    assert_eq!(
        sdp::ssrc_value(answer.ssrc.as_deref().unwrap()),
        Some(200_000_001)
    );
    assert!(wire_request(&ack.to_string()).uri.to_string().contains(CHANNEL));
    let bye = play.bye().unwrap().unwrap();
    assert_eq!(wire_request(&bye.to_string()).method, sip::Method::Bye);
    assert_eq!(play.state(), &PlayState::Closed);

    // Then the camera goes quiet: three keepalive periods later it is offline.
    let events = registrar.tick(t0 + Duration::from_secs(180));
    assert_eq!(
        events,
        [RegistrarEvent::DeviceOffline {
            device_id: DEVICE.into(),
            reason: OfflineReason::KeepaliveLost
        }]
    );
}
