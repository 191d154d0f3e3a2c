//! The little SIP this crate needs over `rsip`: answering a request (the headers a response
//! copies), building the server's own requests, and reading the header fields GB28181 uses.

use rsip::headers::{self, ToTypedHeader, UntypedHeader};
use rsip::prelude::HeadersExt;
use rsip::Header;

// The message types callers handle, so they need no rsip dependency of their own.
pub use rsip::{Method, Request, Response, SipMessage};

/// Why a message lacked something this crate needs.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SipError {
    #[error("SIP message is malformed: {0}")]
    Parse(String),
    #[error("SIP message lacks a usable {0} header")]
    Missing(&'static str),
}

impl From<rsip::Error> for SipError {
    fn from(error: rsip::Error) -> Self {
        SipError::Parse(error.to_string())
    }
}

/// Parses one SIP message from the wire.
pub fn parse(bytes: &[u8]) -> Result<SipMessage, SipError> {
    let mut message = SipMessage::try_from(bytes)?;
    let headers = match &mut message {
        SipMessage::Request(request) => &mut request.headers,
        SipMessage::Response(response) => &mut response.headers,
    };
    *headers = headers
        .clone()
        .into_iter()
        .map(expand_compact)
        .collect::<Vec<_>>()
        .into();
    Ok(message)
}

/// RFC 3261 §7.3.3's one-letter header names, which rsip leaves as unknown headers: a
/// device sending `i:` for Call-ID must still be understood.
fn expand_compact(header: Header) -> Header {
    let Header::Other(name, value) = &header else {
        return header;
    };
    match name.to_ascii_lowercase().as_str() {
        "i" => headers::CallId::new(value.clone()).into(),
        "f" => headers::From::new(value.clone()).into(),
        "t" => headers::To::new(value.clone()).into(),
        "v" => headers::Via::new(value.clone()).into(),
        "m" => headers::Contact::new(value.clone()).into(),
        "l" => headers::ContentLength::new(value.clone()).into(),
        "c" => headers::ContentType::new(value.clone()).into(),
        "s" => headers::Subject::new(value.clone()).into(),
        _ => header,
    }
}

/// Where the server itself is reached: goes into Via, From and Contact of its requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalEndpoint {
    /// The server's 20-digit GB28181 id, e.g. `34020000002000000001`.
    pub server_id: String,
    /// The SIP domain, e.g. `3402000000` (also the digest realm).
    pub domain: String,
    pub host: String,
    pub port: u16,
    pub tcp: bool,
}

impl LocalEndpoint {
    fn via(&self, branch: &str) -> String {
        let transport = if self.tcp { "TCP" } else { "UDP" };
        format!(
            "SIP/2.0/{transport} {}:{};rport;branch={}",
            self.host,
            self.port,
            branch_param(branch)
        )
    }

    fn contact(&self) -> String {
        format!("<sip:{}@{}:{}>", self.server_id, self.host, self.port)
    }

    fn from(&self, tag: &str) -> String {
        format!("<sip:{}@{}>;tag={tag}", self.server_id, self.domain)
    }
}

/// Random parts of a new transaction or dialog. The caller draws them, so this crate stays
/// deterministic under test.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DialogIds {
    pub call_id: String,
    pub from_tag: String,
    /// Via branch; `z9hG4bK` is prefixed when missing (RFC 3261 §8.1.1.7).
    pub branch: String,
}

fn branch_param(branch: &str) -> String {
    if branch.starts_with("z9hG4bK") {
        branch.to_string()
    } else {
        format!("z9hG4bK{branch}")
    }
}

/// What goes into one of the server's requests besides the local endpoint.
#[derive(Debug, Clone)]
pub struct OutgoingRequest<'a> {
    pub method: Method,
    pub uri: &'a str,
    /// The To header's value, with the remote tag when inside a dialog.
    pub to: &'a str,
    pub cseq: u32,
    pub branch: &'a str,
    /// `(content type, body)`.
    pub body: Option<(&'a str, Vec<u8>)>,
    pub extra: Vec<Header>,
}

/// Builds one of the server's requests.
pub fn request(
    local: &LocalEndpoint,
    ids: &DialogIds,
    out: OutgoingRequest<'_>,
) -> Result<Request, SipError> {
    let uri = rsip::Uri::try_from(out.uri)?;
    let mut headers: rsip::Headers = vec![
        headers::Via::new(local.via(out.branch)).into(),
        headers::From::new(local.from(&ids.from_tag)).into(),
        headers::To::new(out.to).into(),
        headers::CallId::new(ids.call_id.clone()).into(),
        headers::CSeq::new(format!("{} {}", out.cseq, out.method)).into(),
        headers::Contact::new(local.contact()).into(),
        headers::MaxForwards::new("70").into(),
        headers::UserAgent::new("Peregrine").into(),
    ]
    .into();
    headers.extend(out.extra);
    let body = match out.body {
        Some((content_type, body)) => {
            headers.push(headers::ContentType::new(content_type).into());
            body
        }
        None => Vec::new(),
    };
    headers.push(headers::ContentLength::new(body.len().to_string()).into());
    Ok(Request {
        method: out.method,
        uri,
        version: rsip::Version::V2,
        headers,
        body,
    })
}

/// A response to `request` with `status`: Via, From, To, Call-ID and CSeq copied (RFC 3261
/// §8.2.6.2), and `to_tag` added to To when the request had none.
pub fn response(request: &Request, status: u16, to_tag: Option<&str>) -> Response {
    let mut headers = rsip::Headers::default();
    for header in request.headers.iter() {
        match header {
            Header::Via(_) | Header::From(_) | Header::CallId(_) | Header::CSeq(_) => {
                headers.push(header.clone())
            }
            Header::To(to) => {
                let has_tag = to.typed().ok().and_then(|t| t.tag().cloned()).is_some();
                match to_tag {
                    Some(tag) if !has_tag => {
                        headers.push(headers::To::new(format!("{};tag={tag}", to.value())).into())
                    }
                    _ => headers.push(header.clone()),
                }
            }
            _ => {}
        }
    }
    headers.push(headers::UserAgent::new("Peregrine").into());
    headers.push(headers::ContentLength::new("0").into());
    Response {
        status_code: status.into(),
        version: rsip::Version::V2,
        headers,
        body: Vec::new(),
    }
}

/// Adds a header to a built response, before its Content-Length.
pub fn add_header(response: &mut Response, header: Header) {
    let length = response
        .headers
        .iter()
        .position(|h| matches!(h, Header::ContentLength(_)));
    let mut all: Vec<Header> = response.headers.clone().into_iter().collect();
    all.insert(length.unwrap_or(all.len()), header);
    response.headers = all.into();
}

/// The user part of the From URI: a GB28181 device's id.
pub fn from_user(message: &impl HeadersExt) -> Result<String, SipError> {
    let from = message.from_header().map_err(|_| SipError::Missing("From"))?;
    let typed = from.typed().map_err(|_| SipError::Missing("From"))?;
    typed
        .uri
        .user()
        .map(str::to_string)
        .ok_or(SipError::Missing("From"))
}

/// The tag of the To header, if any (a dialog's remote tag in a response to our request).
pub fn to_tag(message: &impl HeadersExt) -> Option<String> {
    let to = message.to_header().ok()?.typed().ok()?;
    to.tag().map(|t| t.value().to_string())
}

/// The CSeq number and method.
pub fn cseq(message: &impl HeadersExt) -> Result<(u32, Method), SipError> {
    let cseq = message.cseq_header().map_err(|_| SipError::Missing("CSeq"))?;
    let typed = cseq.typed().map_err(|_| SipError::Missing("CSeq"))?;
    Ok((typed.seq, typed.method))
}

/// The Call-ID's value.
pub fn call_id(message: &impl HeadersExt) -> Result<String, SipError> {
    let id = message
        .call_id_header()
        .map_err(|_| SipError::Missing("Call-ID"))?;
    Ok(id.value().trim().to_string())
}

/// The URI inside the first Contact header, e.g. `sip:34020000001320000001@192.168.1.64:5060`.
pub fn contact_uri(message: &impl HeadersExt) -> Option<String> {
    let contact = message.contact_header().ok()?.typed().ok()?;
    Some(contact.uri.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures;

    #[test]
    fn response_copies_the_transaction_headers() {
        let SipMessage::Request(register) = parse(fixtures::REGISTER.as_bytes()).unwrap() else {
            panic!("not a request");
        };
        let ok = response(&register, 200, Some("srv1"));
        let text = ok.to_string();
        assert!(text.starts_with("SIP/2.0 200 OK\r\n"), "{text}");
        assert!(text.contains("Via: SIP/2.0/UDP 192.168.1.64:5060;rport;branch=z9hG4bK1371463273"));
        assert!(text.contains("To: <sip:34020000001320000001@3402000000>;tag=srv1"));
        assert!(text.contains("Call-ID: 1011047669"));
        assert!(text.contains("CSeq: 1 REGISTER"));
        assert_eq!(from_user(&register).unwrap(), "34020000001320000001");
        assert_eq!(call_id(&register).unwrap(), "1011047669");
        assert_eq!(cseq(&register).unwrap(), (1, Method::Register));
        assert_eq!(
            contact_uri(&register).as_deref(),
            Some("sip:34020000001320000001@192.168.1.64:5060")
        );
        // The reply parses back, as the device will read it.
        assert!(parse(text.as_bytes()).unwrap().is_response());
    }

    #[test]
    fn request_has_what_a_device_expects() {
        let local = fixtures::local();
        let ids = DialogIds {
            call_id: "c1".into(),
            from_tag: "t1".into(),
            branch: "b1".into(),
        };
        let body = b"<Query/>".to_vec();
        let out = OutgoingRequest {
            method: Method::Message,
            uri: "sip:34020000001320000001@192.168.1.64:5060",
            to: "<sip:34020000001320000001@3402000000>",
            cseq: 20,
            branch: "b1",
            body: Some(("Application/MANSCDP+xml", body)),
            extra: Vec::new(),
        };
        let text = request(&local, &ids, out).unwrap().to_string();
        assert!(text.starts_with("MESSAGE sip:34020000001320000001@192.168.1.64:5060 SIP/2.0\r\n"));
        assert!(text.contains("Via: SIP/2.0/UDP 192.168.1.10:5060;rport;branch=z9hG4bKb1\r\n"));
        assert!(text.contains("From: <sip:34020000002000000001@3402000000>;tag=t1\r\n"));
        assert!(text.contains("CSeq: 20 MESSAGE\r\n"));
        assert!(text.contains("Content-Length: 8\r\n"));
        assert!(text.ends_with("\r\n\r\n<Query/>"));
        let SipMessage::Request(back) = parse(text.as_bytes()).unwrap() else {
            panic!()
        };
        assert_eq!(back.body, b"<Query/>");
    }

    #[test]
    fn compact_header_names() {
        let compact = "MESSAGE sip:34020000002000000001@3402000000 SIP/2.0\r\n\
            v: SIP/2.0/UDP 192.168.1.64:5060;branch=z9hG4bK1\r\n\
            f: <sip:34020000001320000001@3402000000>;tag=1\r\n\
            t: <sip:34020000002000000001@3402000000>\r\n\
            i: abc\r\nCSeq: 1 MESSAGE\r\nl: 0\r\n\r\n";
        let SipMessage::Request(request) = parse(compact.as_bytes()).unwrap() else {
            panic!()
        };
        assert_eq!(from_user(&request).unwrap(), "34020000001320000001");
        assert_eq!(call_id(&request).unwrap(), "abc");
        let text = response(&request, 200, None).to_string();
        assert!(
            text.contains("Via: SIP/2.0/UDP 192.168.1.64:5060;branch=z9hG4bK1\r\n"),
            "{text}"
        );
    }

    #[test]
    fn garbage_is_an_error() {
        assert!(parse(b"hello").is_err());
        assert!(parse(b"").is_err());
    }
}
