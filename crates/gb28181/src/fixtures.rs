//! GB28181 messages as devices send them, for the unit tests.

use crate::sip::LocalEndpoint;

/// A first REGISTER from a Hikvision-style camera, no credentials yet.
pub const REGISTER: &str = "REGISTER sip:34020000002000000001@3402000000 SIP/2.0\r\n\
Via: SIP/2.0/UDP 192.168.1.64:5060;rport;branch=z9hG4bK1371463273\r\n\
From: <sip:34020000001320000001@3402000000>;tag=2043466181\r\n\
To: <sip:34020000001320000001@3402000000>\r\n\
Call-ID: 1011047669\r\n\
CSeq: 1 REGISTER\r\n\
Contact: <sip:34020000001320000001@192.168.1.64:5060>\r\n\
Max-Forwards: 70\r\n\
User-Agent: IP Camera\r\n\
Expires: 3600\r\n\
Content-Length: 0\r\n\r\n";

pub const DEVICE_ID: &str = "34020000001320000001";
pub const PASSWORD: &str = "12345678";

pub fn local() -> LocalEndpoint {
    LocalEndpoint {
        server_id: "34020000002000000001".into(),
        domain: "3402000000".into(),
        host: "192.168.1.10".into(),
        port: 5060,
        tcp: false,
    }
}
