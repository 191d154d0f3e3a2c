//! HTTP digest authentication as SIP uses it (RFC 2617 with `qop=auth`, and RFC 7616's
//! SHA-256): the server's challenge, the client's credentials, and the check of one against a
//! password. Nonces come from the caller, so tests are deterministic and the registrar decides
//! how long one stays valid.

use md5::Md5;
use sha2::{Digest, Sha256};

/// The hash a challenge asks for. GB28181 devices almost all answer MD5; SHA-256 is there
/// for the ones that follow RFC 7616.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    Md5,
    Sha256,
}

impl Algorithm {
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Md5 => "MD5",
            Algorithm::Sha256 => "SHA-256",
        }
    }

    fn parse(name: &str) -> Option<Algorithm> {
        // `-sess` variants need the client's first cnonce kept per session; no GB28181
        // device sends them, so they are refused rather than half supported.
        match name.to_ascii_uppercase().as_str() {
            "MD5" => Some(Algorithm::Md5),
            "SHA-256" => Some(Algorithm::Sha256),
            _ => None,
        }
    }

    fn hash(self, data: &str) -> String {
        match self {
            Algorithm::Md5 => hex(&Md5::digest(data.as_bytes())),
            Algorithm::Sha256 => hex(&Sha256::digest(data.as_bytes())),
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Why an Authorization header could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DigestError {
    #[error("authorization scheme is not Digest")]
    NotDigest,
    #[error("authorization header is malformed near {0:?}")]
    Malformed(String),
    #[error("authorization header lacks the {0} parameter")]
    Missing(&'static str),
    #[error("digest algorithm {0:?} is not supported (MD5 or SHA-256)")]
    UnsupportedAlgorithm(String),
    #[error("qop {0:?} is not supported (auth only)")]
    UnsupportedQop(String),
}

/// A `WWW-Authenticate: Digest ...` challenge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Challenge {
    pub realm: String,
    pub nonce: String,
    pub algorithm: Algorithm,
    pub opaque: Option<String>,
    /// Set when the client used a nonce we no longer accept, so it retries without asking
    /// the user for a password again (RFC 2617 §3.2.1).
    pub stale: bool,
}

impl Challenge {
    pub fn new(realm: &str, nonce: &str, algorithm: Algorithm) -> Challenge {
        Challenge {
            realm: realm.to_string(),
            nonce: nonce.to_string(),
            algorithm,
            opaque: None,
            stale: false,
        }
    }

    /// The header value, `Digest realm="...",nonce="...",...`.
    pub fn header_value(&self) -> String {
        let mut value = format!(
            "Digest realm=\"{}\",nonce=\"{}\",algorithm={},qop=\"auth\"",
            self.realm,
            self.nonce,
            self.algorithm.name()
        );
        if let Some(opaque) = &self.opaque {
            value.push_str(&format!(",opaque=\"{opaque}\""));
        }
        if self.stale {
            value.push_str(",stale=TRUE");
        }
        value
    }
}

/// The client's answer to a challenge, as read from an `Authorization` header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credentials {
    pub username: String,
    pub realm: String,
    pub nonce: String,
    pub uri: String,
    pub response: String,
    pub algorithm: Algorithm,
    /// `Some((nc, cnonce))` for `qop=auth`; `None` for RFC 2069 style answers, which many
    /// older cameras still send.
    pub qop_auth: Option<(String, String)>,
    pub opaque: Option<String>,
}

impl Credentials {
    /// Reads an `Authorization` header value. rsip's typed header drops `nc` and `cnonce`,
    /// which `qop=auth` needs, so the parameters are read here.
    pub fn parse(value: &str) -> Result<Credentials, DigestError> {
        let value = value.trim_start();
        let (scheme, rest) = value
            .split_once(char::is_whitespace)
            .ok_or(DigestError::NotDigest)?;
        if !scheme.eq_ignore_ascii_case("digest") {
            return Err(DigestError::NotDigest);
        }
        let params = parse_params(rest)?;
        let get = |name: &'static str| {
            params
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.clone())
        };
        let need = |name: &'static str| get(name).ok_or(DigestError::Missing(name));
        let algorithm = match get("algorithm") {
            None => Algorithm::Md5,
            Some(name) => Algorithm::parse(&name).ok_or(DigestError::UnsupportedAlgorithm(name))?,
        };
        let qop_auth = match get("qop") {
            None => None,
            Some(qop) if qop.eq_ignore_ascii_case("auth") => Some((need("nc")?, need("cnonce")?)),
            Some(qop) => return Err(DigestError::UnsupportedQop(qop)),
        };
        Ok(Credentials {
            username: need("username")?,
            realm: need("realm")?,
            nonce: need("nonce")?,
            uri: need("uri")?,
            response: need("response")?,
            algorithm,
            qop_auth,
            opaque: get("opaque"),
        })
    }

    /// Whether `response` is what `password` gives for a request with this `method`.
    pub fn verify(&self, method: &str, password: &str) -> bool {
        let expected = response(&ResponseInput {
            algorithm: self.algorithm,
            username: &self.username,
            realm: &self.realm,
            password,
            method,
            uri: &self.uri,
            nonce: &self.nonce,
            qop_auth: self
                .qop_auth
                .as_ref()
                .map(|(nc, cnonce)| (nc.as_str(), cnonce.as_str())),
        });
        constant_time_eq(expected.as_bytes(), self.response.to_ascii_lowercase().as_bytes())
    }
}

/// Everything the digest `response` is computed from.
#[derive(Debug, Clone, Copy)]
pub struct ResponseInput<'a> {
    pub algorithm: Algorithm,
    pub username: &'a str,
    pub realm: &'a str,
    pub password: &'a str,
    pub method: &'a str,
    pub uri: &'a str,
    pub nonce: &'a str,
    /// `(nc, cnonce)` for `qop=auth`.
    pub qop_auth: Option<(&'a str, &'a str)>,
}

/// The digest `response` (lowercase hex), as a client computes it and a server checks it.
pub fn response(input: &ResponseInput<'_>) -> String {
    let h = |s: &str| input.algorithm.hash(s);
    let ha1 = h(&format!("{}:{}:{}", input.username, input.realm, input.password));
    let ha2 = h(&format!("{}:{}", input.method, input.uri));
    match input.qop_auth {
        Some((nc, cnonce)) => h(&format!("{ha1}:{}:{nc}:{cnonce}:auth:{ha2}", input.nonce)),
        None => h(&format!("{ha1}:{}:{ha2}", input.nonce)),
    }
}

/// Compares without stopping at the first difference, so timing does not leak how much of
/// a guessed response was right.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// `key=value, key="quoted \" value", ...` as RFC 7235's auth-param list.
fn parse_params(mut rest: &str) -> Result<Vec<(String, String)>, DigestError> {
    let mut params = Vec::new();
    loop {
        rest = rest.trim_start_matches(|c: char| c == ',' || c.is_whitespace());
        if rest.is_empty() {
            return Ok(params);
        }
        let (key, after) = rest
            .split_once('=')
            .ok_or_else(|| DigestError::Malformed(rest.chars().take(20).collect()))?;
        let after = after.trim_start();
        let (value, remaining) = match after.strip_prefix('"') {
            Some(quoted) => {
                read_quoted(quoted).ok_or_else(|| DigestError::Malformed(after.chars().take(20).collect()))?
            }
            None => {
                let end = after.find(',').unwrap_or(after.len());
                (after[..end].trim().to_string(), &after[end..])
            }
        };
        params.push((key.trim().to_string(), value));
        rest = remaining;
    }
}

/// Reads a quoted string whose opening quote is already consumed; returns it unescaped and
/// what follows the closing quote.
fn read_quoted(s: &str) -> Option<(String, &str)> {
    let mut value = String::new();
    let mut chars = s.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return Some((value, &s[i + 1..])),
            '\\' => value.push(chars.next()?.1),
            c => value.push(c),
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc2617_worked_example() {
        let header = r#"Digest username="Mufasa", realm="testrealm@host.com",
            nonce="dcd98b7102dd2f0e8b11d0f600bfb0c093", uri="/dir/index.html", qop=auth,
            nc=00000001, cnonce="0a4f113b", response="6629fae49393a05397450978507c4ef1",
            opaque="5ccc069c403ebaf9f0171e9517f40e41""#;
        let credentials = Credentials::parse(header).unwrap();
        assert_eq!(credentials.username, "Mufasa");
        assert_eq!(credentials.algorithm, Algorithm::Md5);
        assert_eq!(
            credentials.opaque.as_deref(),
            Some("5ccc069c403ebaf9f0171e9517f40e41")
        );
        assert!(credentials.verify("GET", "Circle Of Life"));
        assert!(!credentials.verify("GET", "Circle of Life"));
        assert!(!credentials.verify("POST", "Circle Of Life"));
    }

    #[test]
    fn rfc7616_sha256_and_md5_examples() {
        let common = r#"username="Mufasa", realm="http-auth@example.org", uri="/dir/index.html",
            nonce="7ypf/xlj9XXwfDPEoM4URrv/xwf94BcCAzFZH4GiTo0v", nc=00000001,
            cnonce="f2/wE4q74E6zIJEtWaHKaf5wv/H5QzzpXusqGemxURZJ", qop=auth,
            opaque="FQhe/qaU925kfnzjCev0ciny7QMkPqMAFRtzCUYo5tdS""#;
        let sha = format!(
            "Digest {common}, algorithm=SHA-256, \
             response=\"753927fa0e85d155564e2e272a28d1802ca10daf4496794697cf8db5856cb6c1\""
        );
        let credentials = Credentials::parse(&sha).unwrap();
        assert_eq!(credentials.algorithm, Algorithm::Sha256);
        assert!(credentials.verify("GET", "Circle of Life"));
        let md5 = format!("Digest {common}, algorithm=MD5, response=\"8ca523f5e9506fed4657c9700eebdbec\"");
        assert!(Credentials::parse(&md5).unwrap().verify("GET", "Circle of Life"));
    }

    #[test]
    fn rfc2069_answer_without_qop() {
        let input = ResponseInput {
            algorithm: Algorithm::Md5,
            username: "34020000001320000001",
            realm: "3402000000",
            password: "12345678",
            method: "REGISTER",
            uri: "sip:34020000002000000001@3402000000",
            nonce: "9bd055",
            qop_auth: None,
        };
        let header = format!(
            "Digest username=\"{}\",realm=\"{}\",nonce=\"{}\",uri=\"{}\",response=\"{}\",algorithm=MD5",
            input.username,
            input.realm,
            input.nonce,
            input.uri,
            response(&input)
        );
        let credentials = Credentials::parse(&header).unwrap();
        assert_eq!(credentials.qop_auth, None);
        assert!(credentials.verify("REGISTER", "12345678"));
        assert!(!credentials.verify("REGISTER", "wrong"));
    }

    #[test]
    fn refuses_what_it_cannot_check() {
        assert_eq!(
            Credentials::parse("Basic QWxhZGRpbg=="),
            Err(DigestError::NotDigest)
        );
        assert_eq!(
            Credentials::parse(r#"Digest username="a", realm="r", nonce="n", uri="u""#),
            Err(DigestError::Missing("response"))
        );
        assert!(matches!(
            Credentials::parse(r#"Digest username="a", algorithm=MD5-sess"#),
            Err(DigestError::UnsupportedAlgorithm(_))
        ));
        assert!(matches!(
            Credentials::parse(r#"Digest username="a, realm="r""#),
            Err(DigestError::Malformed(_))
        ));
        assert!(matches!(
            Credentials::parse("Digest garbage"),
            Err(DigestError::Malformed(_))
        ));
    }

    #[test]
    fn challenge_header() {
        let mut challenge = Challenge::new("3402000000", "abc123", Algorithm::Md5);
        assert_eq!(
            challenge.header_value(),
            r#"Digest realm="3402000000",nonce="abc123",algorithm=MD5,qop="auth""#
        );
        challenge.stale = true;
        assert!(challenge.header_value().ends_with(",stale=TRUE"));
    }
}
