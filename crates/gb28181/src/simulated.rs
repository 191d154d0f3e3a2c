//! A GB28181 device as plain state, for tests and load scripts: it registers with digest
//! credentials, sends keepalives, answers the Catalog query with its channels, accepts an
//! INVITE (saying where to push media) and hangs up. Messages are text in and text out; the
//! caller owns the socket and pushes the media.

use rsip::headers::{ToTypedHeader, UntypedHeader};
use rsip::prelude::HeadersExt;
use rsip::{Method, Request, Response};

use crate::digest::{self, Algorithm, ResponseInput};
use crate::sdp::MediaTransport;
use crate::sip::{self, SipMessage};

/// Who the device is and where it believes it is.
#[derive(Debug, Clone)]
pub struct DeviceIdentity {
    pub id: String,
    /// Channel ids its catalog lists.
    pub channels: Vec<String>,
    pub domain: String,
    pub server_id: String,
    pub password: String,
    /// Its own address, for Via and Contact (`ip:port`).
    pub address: String,
    pub tcp: bool,
    /// The media port its answers name: where it sends from, or where it listens when the
    /// server connects (TCP active).
    pub media_port: u16,
}

/// Where the server asked a channel's media to go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MediaTarget {
    pub call_id: String,
    /// The server's From tag: the dialog's remote tag, for the device's own BYE.
    pub server_tag: String,
    pub channel_id: String,
    pub ip: String,
    pub port: u16,
    pub ssrc: u32,
    pub transport: MediaTransport,
}

/// What the device does about a message from the server.
#[derive(Debug, Default)]
pub struct Reaction {
    /// Messages to send back, in order.
    pub send: Vec<String>,
    /// An INVITE it accepted: start pushing there.
    pub play: Option<MediaTarget>,
    /// A BYE for this Call-ID: stop pushing.
    pub stop: Option<String>,
    /// The REGISTER was accepted (200), or refused with this status.
    pub registered: Option<Result<(), u16>>,
}

/// A simulated device.
#[derive(Debug)]
pub struct SimulatedDevice {
    pub identity: DeviceIdentity,
    cseq: u32,
    sn: u32,
    register_call_id: String,
}

impl SimulatedDevice {
    pub fn new(identity: DeviceIdentity) -> SimulatedDevice {
        SimulatedDevice {
            register_call_id: format!("reg-{}", identity.id),
            identity,
            cseq: 0,
            sn: 0,
        }
    }

    fn via(&mut self) -> String {
        self.cseq += 1;
        let transport = if self.identity.tcp { "TCP" } else { "UDP" };
        format!(
            "Via: SIP/2.0/{transport} {};rport;branch=z9hG4bKsim{}{}\r\n",
            self.identity.address, self.identity.id, self.cseq
        )
    }

    /// A REGISTER for `expires` seconds, with credentials when `challenge` (the 401's
    /// `WWW-Authenticate` value) is given.
    pub fn register(&mut self, challenge: Option<&str>, expires: u32) -> String {
        let DeviceIdentity {
            id,
            domain,
            server_id,
            ..
        } = self.identity.clone();
        let uri = format!("sip:{server_id}@{domain}");
        let authorization = challenge.map_or(String::new(), |c| {
            let nonce = param(c, "nonce").unwrap_or_default();
            let realm = param(c, "realm").unwrap_or_else(|| domain.clone());
            let (nc, cnonce) = ("00000001", "0a4f113b");
            let response = digest::response(&ResponseInput {
                algorithm: Algorithm::Md5,
                username: &id,
                realm: &realm,
                password: &self.identity.password,
                method: "REGISTER",
                uri: &uri,
                nonce: &nonce,
                qop_auth: Some((nc, cnonce)),
            });
            format!(
                "Authorization: Digest username=\"{id}\",realm=\"{realm}\",nonce=\"{nonce}\",uri=\"{uri}\",\
                 response=\"{response}\",algorithm=MD5,qop=auth,nc={nc},cnonce=\"{cnonce}\"\r\n"
            )
        });
        let via = self.via();
        format!(
            "REGISTER {uri} SIP/2.0\r\n{via}From: <sip:{id}@{domain}>;tag=r{id}\r\nTo: <sip:{id}@{domain}>\r\n\
             Call-ID: {}\r\nCSeq: {} REGISTER\r\nContact: <sip:{id}@{}>\r\nMax-Forwards: 70\r\n\
             User-Agent: Peregrine simulated device\r\n{authorization}Expires: {expires}\r\nContent-Length: 0\r\n\r\n",
            self.register_call_id, self.cseq, self.identity.address
        )
    }

    /// A Keepalive MESSAGE.
    pub fn keepalive(&mut self) -> String {
        self.sn += 1;
        let body = format!(
            "<?xml version=\"1.0\" encoding=\"GB2312\"?>\r\n<Notify>\r\n<CmdType>Keepalive</CmdType>\r\n\
             <SN>{}</SN>\r\n<DeviceID>{}</DeviceID>\r\n<Status>OK</Status>\r\n</Notify>\r\n",
            self.sn, self.identity.id
        );
        self.message(&body)
    }

    fn message(&mut self, body: &str) -> String {
        let DeviceIdentity {
            id,
            domain,
            server_id,
            ..
        } = self.identity.clone();
        let via = self.via();
        format!(
            "MESSAGE sip:{server_id}@{domain} SIP/2.0\r\n{via}From: <sip:{id}@{domain}>;tag=m{id}\r\n\
             To: <sip:{server_id}@{domain}>\r\nCall-ID: msg-{id}-{}\r\nCSeq: {} MESSAGE\r\n\
             Content-Type: Application/MANSCDP+xml\r\nMax-Forwards: 70\r\nContent-Length: {}\r\n\r\n{body}",
            self.cseq,
            self.cseq,
            body.len()
        )
    }

    fn catalog(&mut self, sn: &str) -> String {
        let items: String = self
            .identity
            .channels
            .iter()
            .enumerate()
            .map(|(i, c)| {
                format!(
                    "<Item><DeviceID>{c}</DeviceID><Name>Camera {}</Name><Manufacturer>Peregrine</Manufacturer>\
                     <Model>Simulated</Model><ParentID>{}</ParentID><Status>ON</Status></Item>",
                    i + 1,
                    self.identity.id
                )
            })
            .collect();
        let body = format!(
            "<?xml version=\"1.0\" encoding=\"GB2312\"?>\r\n<Response><CmdType>Catalog</CmdType><SN>{sn}</SN>\
             <DeviceID>{}</DeviceID><SumNum>{n}</SumNum><DeviceList Num=\"{n}\">{items}</DeviceList></Response>\r\n",
            self.identity.id,
            n = self.identity.channels.len()
        );
        self.message(&body)
    }

    /// Reacts to one message from the server.
    pub fn on_message(&mut self, bytes: &[u8]) -> Reaction {
        match sip::parse(bytes) {
            Ok(SipMessage::Response(response)) => self.on_response(&response),
            Ok(SipMessage::Request(request)) => self.on_request(&request),
            Err(_) => Reaction::default(),
        }
    }

    fn on_response(&mut self, response: &Response) -> Reaction {
        let mut reaction = Reaction::default();
        let is_register = sip::cseq(response).is_ok_and(|(_, m)| m == Method::Register);
        if !is_register {
            return reaction;
        }
        match response.status_code.code() {
            401 => {
                let challenge = response.www_authenticate_header().map(|h| h.value().to_string());
                reaction.send.push(self.register(challenge.as_deref(), 3600));
            }
            200 => reaction.registered = Some(Ok(())),
            other => reaction.registered = Some(Err(other)),
        }
        reaction
    }

    fn on_request(&mut self, request: &Request) -> Reaction {
        let mut reaction = Reaction::default();
        match request.method {
            Method::Message => {
                reaction.send.push(sip::response(request, 200, None).to_string());
                let body = String::from_utf8_lossy(&request.body);
                if body.contains("<CmdType>Catalog</CmdType>") {
                    let sn = between(&body, "<SN>", "</SN>").unwrap_or("1").to_string();
                    reaction.send.push(self.catalog(&sn));
                }
            }
            Method::Invite => self.on_invite(request, &mut reaction),
            Method::Bye => {
                reaction.send.push(sip::response(request, 200, None).to_string());
                reaction.stop = sip::call_id(request).ok();
            }
            _ => {}
        }
        reaction
    }

    fn on_invite(&mut self, request: &Request, reaction: &mut Reaction) {
        let body = String::from_utf8_lossy(&request.body).to_string();
        let line = |prefix: &str| {
            body.lines()
                .find_map(|l| l.trim().strip_prefix(prefix).map(str::to_string))
        };
        let ip = line("c=IN IP4 ").unwrap_or_default();
        let media = line("m=video ").unwrap_or_default();
        let port = media.split(' ').next().and_then(|p| p.parse().ok()).unwrap_or(0);
        let transport = match (media.contains("TCP"), body.contains("a=setup:active")) {
            (false, _) => MediaTransport::Udp,
            (true, false) => MediaTransport::TcpPassive,
            (true, true) => MediaTransport::TcpActive,
        };
        let ssrc = line("y=").unwrap_or_default();
        let channel_id = request.uri.user().unwrap_or_default().to_string();
        let call_id = sip::call_id(request).unwrap_or_default();
        let server_tag = request
            .from_header()
            .ok()
            .and_then(|f| f.typed().ok())
            .and_then(|f| f.tag().map(|t| t.value().to_string()))
            .unwrap_or_default();
        let (proto, setup) = match transport {
            MediaTransport::Udp => ("RTP/AVP", ""),
            // We connect to the server's port (it listens: passive).
            MediaTransport::TcpPassive => ("TCP/RTP/AVP", "a=setup:active\r\na=connection:new\r\n"),
            MediaTransport::TcpActive => ("TCP/RTP/AVP", "a=setup:passive\r\na=connection:new\r\n"),
        };
        let host = self
            .identity
            .address
            .split(':')
            .next()
            .unwrap_or_default()
            .to_string();
        let media_port = self.identity.media_port;
        let answer = format!(
            "v=0\r\no={channel_id} 0 0 IN IP4 {host}\r\ns=Play\r\nc=IN IP4 {host}\r\nt=0 0\r\n\
             m=video {media_port} {proto} 96\r\na=sendonly\r\na=rtpmap:96 PS/90000\r\n{setup}y={ssrc}\r\nf=\r\n"
        );
        let mut ok = sip::response(request, 200, Some(&format!("d{channel_id}")));
        let contact = format!("<sip:{channel_id}@{}>", self.identity.address);
        sip::add_header(&mut ok, rsip::headers::Contact::new(contact).into());
        sip::add_header(&mut ok, rsip::headers::ContentType::new("APPLICATION/SDP").into());
        let mut text = ok.to_string();
        // The built response says Content-Length 0; the answer goes in with its own.
        text = text.replace(
            "Content-Length: 0\r\n",
            &format!("Content-Length: {}\r\n", answer.len()),
        );
        text.push_str(&answer);
        reaction.send.push(text);
        reaction.play = Some(MediaTarget {
            call_id,
            server_tag,
            channel_id,
            ip,
            port,
            ssrc: ssrc.parse().unwrap_or(0),
            transport,
        });
    }

    /// The device hangs up a play itself (say, the channel went dark).
    pub fn bye(&mut self, target: &MediaTarget) -> String {
        let DeviceIdentity {
            domain, server_id, ..
        } = self.identity.clone();
        let via = self.via();
        let channel = &target.channel_id;
        format!(
            "BYE sip:{server_id}@{domain} SIP/2.0\r\n{via}From: <sip:{channel}@{domain}>;tag=d{channel}\r\n\
             To: <sip:{server_id}@{domain}>;tag={}\r\nCall-ID: {}\r\nCSeq: {} BYE\r\n\
             Max-Forwards: 70\r\nContent-Length: 0\r\n\r\n",
            target.server_tag, target.call_id, self.cseq
        )
    }
}

/// A `name="value"` or `name=value` parameter of a header value.
fn param(header: &str, name: &str) -> Option<String> {
    header
        .trim_start_matches("Digest")
        .split(',')
        .find_map(|p| p.trim().strip_prefix(name)?.trim_start().strip_prefix('='))
        .map(|v| v.trim().trim_matches('"').to_string())
}

fn between<'a>(text: &'a str, open: &str, close: &str) -> Option<&'a str> {
    let start = text.find(open)? + open.len();
    let end = text[start..].find(close)? + start;
    Some(&text[start..end])
}
