use super::*;
use crate::digest::{self, ResponseInput};
use crate::fixtures::{self, DEVICE_ID, PASSWORD};
use crate::sip::SipMessage;

fn source() -> SocketAddr {
    "192.168.1.64:5060".parse().unwrap()
}

fn registrar() -> Registrar {
    Registrar::new(RegistrarConfig::new(fixtures::local(), PASSWORD))
}

fn request(text: &str) -> Request {
    match sip::parse(text.as_bytes()).unwrap() {
        SipMessage::Request(request) => request,
        SipMessage::Response(_) => panic!("not a request"),
    }
}

/// The fixture REGISTER answering `nonce` with `password`, asking for `expires` seconds.
fn authorized_register(nonce: &str, password: &str, expires: u32) -> Request {
    let uri = "sip:34020000002000000001@3402000000";
    let digest = digest::response(&ResponseInput {
        algorithm: Algorithm::Md5,
        username: DEVICE_ID,
        realm: "3402000000",
        password,
        method: "REGISTER",
        uri,
        nonce,
        qop_auth: Some(("00000001", "0a4f113b")),
    });
    let authorization = format!(
        "Authorization: Digest username=\"{DEVICE_ID}\", realm=\"3402000000\", nonce=\"{nonce}\", \
         uri=\"{uri}\", response=\"{digest}\", algorithm=MD5, qop=auth, nc=00000001, cnonce=\"0a4f113b\"\r\n"
    );
    let text = fixtures::REGISTER
        .replace("CSeq: 1 REGISTER", "CSeq: 2 REGISTER")
        .replace(
            "Expires: 3600\r\n",
            &format!("Expires: {expires}\r\n{authorization}"),
        );
    request(&text)
}

fn message(body: &[u8]) -> Request {
    let head = format!(
        "MESSAGE sip:34020000002000000001@3402000000 SIP/2.0\r\n\
         Via: SIP/2.0/UDP 192.168.1.64:5060;rport;branch=z9hG4bK39845\r\n\
         From: <sip:{DEVICE_ID}@3402000000>;tag=998\r\n\
         To: <sip:34020000002000000001@3402000000>\r\n\
         Call-ID: 8172@192.168.1.64\r\n\
         CSeq: 20 MESSAGE\r\n\
         Content-Type: Application/MANSCDP+xml\r\n\
         Max-Forwards: 70\r\n\
         Content-Length: {}\r\n\r\n",
        body.len()
    );
    let mut bytes = head.into_bytes();
    bytes.extend_from_slice(body);
    match sip::parse(&bytes).unwrap() {
        SipMessage::Request(request) => request,
        SipMessage::Response(_) => panic!("not a request"),
    }
}

fn keepalive() -> Request {
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"GB2312\"?>\r\n<Notify>\r\n<CmdType>Keepalive</CmdType>\r\n\
         <SN>5</SN>\r\n<DeviceID>{DEVICE_ID}</DeviceID>\r\n<Status>OK</Status>\r\n</Notify>\r\n"
    );
    message(body.as_bytes())
}

fn catalog_part(sn: u32, sum: usize, ids: &[&str]) -> Request {
    let items: String = ids
        .iter()
        .map(|id| format!("<Item><DeviceID>{id}</DeviceID><Name>ch {id}</Name><Status>ON</Status></Item>"))
        .collect();
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"GB2312\"?><Response><CmdType>Catalog</CmdType><SN>{sn}</SN>\
         <DeviceID>{DEVICE_ID}</DeviceID><SumNum>{sum}</SumNum><DeviceList Num=\"{}\">{items}</DeviceList></Response>",
        ids.len()
    );
    message(body.as_bytes())
}

fn status(handled: &Handled) -> u16 {
    handled.response.status_code.code()
}

/// Registers the fixture device at `now` through the whole challenge.
fn registered(registrar: &mut Registrar, now: Instant) {
    registrar.handle(&request(fixtures::REGISTER), source(), "n1", now);
    let handled = registrar.handle(&authorized_register("n1", PASSWORD, 3600), source(), "n2", now);
    assert_eq!(status(&handled), 200);
}

#[test]
fn register_is_challenged_then_accepted() {
    let mut registrar = registrar();
    let now = Instant::now();
    let first = registrar.handle(&request(fixtures::REGISTER), source(), "9bd055", now);
    assert_eq!(status(&first), 401);
    let text = first.response.to_string();
    assert!(
        text.contains("WWW-Authenticate: Digest realm=\"3402000000\",nonce=\"9bd055\",algorithm=MD5"),
        "{text}"
    );
    assert!(first.events.is_empty());
    assert!(registrar.device(DEVICE_ID).is_none());

    let second = registrar.handle(
        &authorized_register("9bd055", PASSWORD, 3600),
        source(),
        "unused",
        now,
    );
    assert_eq!(status(&second), 200);
    assert!(second.response.to_string().contains("Expires: 3600\r\n"));
    assert_eq!(
        second.events,
        vec![RegistrarEvent::DeviceOnline {
            device_id: DEVICE_ID.into()
        }]
    );
    let device = registrar.device(DEVICE_ID).unwrap();
    assert!(device.online);
    assert_eq!(
        device.contact.as_deref(),
        Some("sip:34020000001320000001@192.168.1.64:5060")
    );
    assert_eq!(device.user_agent.as_deref(), Some("IP Camera"));
    assert_eq!(device.expires_at, now + Duration::from_secs(3600));

    // A refresh with the same nonce is accepted and raises no second online event.
    let refresh = registrar.handle(&authorized_register("9bd055", PASSWORD, 3600), source(), "x", now);
    assert_eq!(status(&refresh), 200);
    assert!(refresh.events.is_empty());
}

#[test]
fn wrong_password_unknown_and_stale_nonces() {
    let mut registrar = registrar();
    let now = Instant::now();
    registrar.handle(&request(fixtures::REGISTER), source(), "n1", now);
    let wrong = registrar.handle(&authorized_register("n1", "guess", 3600), source(), "n2", now);
    assert_eq!(status(&wrong), 403);
    // A nonce we never issued is challenged again, marked stale.
    let forged = registrar.handle(
        &authorized_register("made-up", PASSWORD, 3600),
        source(),
        "n3",
        now,
    );
    assert_eq!(status(&forged), 401);
    assert!(forged.response.to_string().contains("stale=TRUE"));
    // n3 is now the device's nonce; once past its lifetime it is stale too.
    let late = now + Duration::from_secs(601);
    let stale = registrar.handle(&authorized_register("n3", PASSWORD, 3600), source(), "n4", late);
    assert_eq!(status(&stale), 401);
    let fresh = registrar.handle(&authorized_register("n4", PASSWORD, 3600), source(), "n5", late);
    assert_eq!(status(&fresh), 200);
}

#[test]
fn expires_zero_unregisters() {
    let mut registrar = registrar();
    let now = Instant::now();
    registered(&mut registrar, now);
    let handled = registrar.handle(&authorized_register("n1", PASSWORD, 0), source(), "n9", now);
    assert_eq!(status(&handled), 200);
    assert_eq!(
        handled.events,
        vec![RegistrarEvent::DeviceOffline {
            device_id: DEVICE_ID.into(),
            reason: OfflineReason::Unregistered
        }]
    );
    assert!(registrar.device(DEVICE_ID).is_none());
}

#[test]
fn keepalive_liveness_table() {
    // (seconds since the last keepalive at tick time, expected offline)
    let cases = [(0, false), (179, false), (180, true), (400, true)];
    for (after, offline) in cases {
        let mut registrar = registrar();
        let start = Instant::now();
        registered(&mut registrar, start);
        let events = registrar.tick(start + Duration::from_secs(after));
        assert_eq!(!events.is_empty(), offline, "after {after} s");
        assert_eq!(registrar.device(DEVICE_ID).unwrap().online, !offline);
    }
}

#[test]
fn keepalive_refreshes_and_revives() {
    let mut registrar = registrar();
    let start = Instant::now();
    registered(&mut registrar, start);
    assert_eq!(registrar.next_deadline(), Some(start + Duration::from_secs(180)));
    let at = |s| start + Duration::from_secs(s);
    assert_eq!(
        status(&registrar.handle(&keepalive(), source(), "-", at(120))),
        200
    );
    assert!(
        registrar.tick(at(250)).is_empty(),
        "the keepalive at 120 s moved the deadline to 300 s"
    );
    assert_eq!(
        registrar.tick(at(300)),
        vec![RegistrarEvent::DeviceOffline {
            device_id: DEVICE_ID.into(),
            reason: OfflineReason::KeepaliveLost
        }]
    );
    assert!(registrar.tick(at(310)).is_empty(), "offline is reported once");
    let back = registrar.handle(&keepalive(), source(), "-", at(320));
    assert_eq!(
        back.events,
        vec![RegistrarEvent::DeviceOnline {
            device_id: DEVICE_ID.into()
        }]
    );
}

#[test]
fn registration_expiry_removes_the_device() {
    let mut registrar = registrar();
    let start = Instant::now();
    registrar.handle(&request(fixtures::REGISTER), source(), "n1", start);
    registrar.handle(&authorized_register("n1", PASSWORD, 100), source(), "n2", start);
    assert_eq!(registrar.next_deadline(), Some(start + Duration::from_secs(100)));
    let events = registrar.tick(start + Duration::from_secs(100));
    assert_eq!(
        events,
        vec![RegistrarEvent::DeviceOffline {
            device_id: DEVICE_ID.into(),
            reason: OfflineReason::RegistrationExpired
        }]
    );
    assert!(registrar.device(DEVICE_ID).is_none());
    assert_eq!(status(&registrar.handle(&keepalive(), source(), "-", start)), 403);
}

#[test]
fn catalog_in_parts_becomes_the_channels() {
    let mut registrar = registrar();
    let now = Instant::now();
    registered(&mut registrar, now);
    let first = registrar.handle(
        &catalog_part(7, 3, &["34020000001310000001", "34020000001310000002"]),
        source(),
        "-",
        now,
    );
    assert_eq!(status(&first), 200);
    assert!(first.events.is_empty(), "two of three items");
    let last = registrar.handle(&catalog_part(7, 3, &["34020000001310000003"]), source(), "-", now);
    assert_eq!(
        last.events,
        vec![RegistrarEvent::CatalogUpdated {
            device_id: DEVICE_ID.into(),
            channels: 3
        }]
    );
    let channels = &registrar.device(DEVICE_ID).unwrap().channels;
    assert_eq!(channels[2].device_id, "34020000001310000003");
    assert!(channels.iter().all(|c| c.online));
    // A new SN starts over rather than mixing two catalogs.
    registrar.handle(&catalog_part(8, 2, &["a"]), source(), "-", now);
    let replaced = registrar.handle(&catalog_part(9, 1, &["b"]), source(), "-", now);
    assert_eq!(
        replaced.events,
        vec![RegistrarEvent::CatalogUpdated {
            device_id: DEVICE_ID.into(),
            channels: 1
        }]
    );
}

#[test]
fn catalog_query_goes_to_the_contact() {
    let mut registrar = registrar();
    let ids = DialogIds {
        call_id: "q1".into(),
        from_tag: "t".into(),
        branch: "b".into(),
    };
    assert!(registrar.catalog_query(DEVICE_ID, &ids).is_none());
    registered(&mut registrar, Instant::now());
    let query = registrar.catalog_query(DEVICE_ID, &ids).unwrap();
    assert_eq!(
        query.uri.to_string(),
        "sip:34020000001320000001@192.168.1.64:5060"
    );
    let text = query.to_string();
    assert!(text.contains("Content-Type: Application/MANSCDP+xml\r\n"));
    assert!(text.contains("<CmdType>Catalog</CmdType>"));
    assert!(text.contains(&format!("<DeviceID>{DEVICE_ID}</DeviceID>")));
}

#[test]
fn bad_requests() {
    let mut registrar = registrar();
    let now = Instant::now();
    registered(&mut registrar, now);
    assert_eq!(
        status(&registrar.handle(&message(b"not xml"), source(), "-", now)),
        400
    );
    let options = request(
        &fixtures::REGISTER
            .replace("REGISTER sip", "OPTIONS sip")
            .replace("1 REGISTER", "1 OPTIONS"),
    );
    let handled = registrar.handle(&options, source(), "-", now);
    assert_eq!(status(&handled), 405);
    assert!(handled
        .response
        .to_string()
        .contains("Allow: REGISTER, MESSAGE\r\n"));
}

#[test]
fn pending_nonces_are_bounded() {
    let mut config = RegistrarConfig::new(fixtures::local(), PASSWORD);
    config.max_pending_nonces = 2;
    let mut registrar = Registrar::new(config);
    let now = Instant::now();
    for (i, id) in [
        "34020000001320000101",
        "34020000001320000102",
        "34020000001320000103",
    ]
    .iter()
    .enumerate()
    {
        let text = fixtures::REGISTER.replace(
            &format!("<sip:{DEVICE_ID}@3402000000>;tag"),
            &format!("<sip:{id}@3402000000>;tag"),
        );
        registrar.handle(
            &request(&text),
            source(),
            "n",
            now + Duration::from_secs(i as u64),
        );
    }
    assert_eq!(registrar.nonces.len(), 2);
    assert!(
        !registrar.nonces.contains_key("34020000001320000101"),
        "the oldest went"
    );
    assert!(registrar.tick(now + Duration::from_secs(700)).is_empty());
    assert!(registrar.nonces.is_empty());
}

#[test]
fn catalog_is_capped() {
    let mut config = RegistrarConfig::new(fixtures::local(), PASSWORD);
    config.max_channels = 2;
    let mut registrar = Registrar::new(config);
    let now = Instant::now();
    registered(&mut registrar, now);
    // The device claims 1000 items; the second part already fills the cap.
    registrar.handle(&catalog_part(3, 1000, &["a"]), source(), "-", now);
    let full = registrar.handle(&catalog_part(3, 1000, &["b", "c"]), source(), "-", now);
    assert_eq!(
        full.events,
        vec![RegistrarEvent::CatalogUpdated {
            device_id: DEVICE_ID.into(),
            channels: 2
        }]
    );
    let ids: Vec<&str> = registrar
        .device(DEVICE_ID)
        .unwrap()
        .channels
        .iter()
        .map(|c| c.device_id.as_str())
        .collect();
    assert_eq!(ids, ["a", "b"]);
}
