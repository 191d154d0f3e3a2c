//! Which stream URLs the server may open: a request that adds a stream must not make the
//! server read its own files or connect to its own services (loopback, the cloud metadata
//! endpoint).
//!
//! [`StreamPolicy`] is the setting as plain data; [`UrlPolicy`] is it checked and ready
//! (file roots canonicalized, host rules parsed) with the [`HostResolver`] it asks. A
//! stream is judged when it is added, before anything is opened, and an RTSP camera again
//! before every connection: names can resolve differently later, so the address checked
//! is the one connected to. The decisions themselves are pure ([`address`]).

pub mod address;

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures_util::future::BoxFuture;
use serde::Deserialize;
use url::{Host, Url};

use crate::config::SourceUrl;
use address::{HostAllowList, RefusedRange};

/// The schemes a stream URL may have; anything else is a settings mistake.
const KNOWN_SCHEMES: [&str; 6] = ["rtsp", "rtsps", "rtp", "rtp+tcp", "gb28181", "file"];
/// RTSP's port when the URL names none.
const RTSP_PORT: u16 = 554;

/// The stream URL policy (`[stream_policy]`). The default allows RTSP cameras anywhere
/// except on loopback, link-local, multicast, broadcast and metadata addresses, and no
/// files.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct StreamPolicy {
    /// URL schemes a stream may ask for (`rtsp`, `rtsps`, `rtp`, `rtp+tcp`; `file` comes
    /// with `file_roots`). The RTSP source refuses rtsps today, with its own message.
    /// Pushed RTP (`rtp`, `rtp+tcp`) is off by default: such a stream opens a listening
    /// port on this machine (an active `rtp+tcp` connection's host is judged like an
    /// RTSP camera's).
    pub allowed_schemes: Vec<String>,
    /// Directories file streams may come from; a file must resolve (symlinks and `..`
    /// followed) to a path under one of them. Empty: no file streams.
    pub file_roots: Vec<PathBuf>,
    /// CIDRs, addresses or exact host names allowed even in a refused range.
    pub allow_hosts: Vec<String>,
}

impl Default for StreamPolicy {
    fn default() -> Self {
        Self {
            allowed_schemes: vec!["rtsp".into(), "rtsps".into()],
            file_roots: Vec::new(),
            allow_hosts: Vec::new(),
        }
    }
}

/// Why a stream URL is refused; the message names the setting that would allow it.
/// Never carries a password: only hosts, addresses and file paths.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum UrlRefusal {
    #[error(
        "scheme {scheme} is not allowed (allowed: {allowed}); allow it with stream_policy.allowed_schemes"
    )]
    Scheme { scheme: String, allowed: String },
    #[error("file streams are off; allow a directory with stream_policy.file_roots (--stream-file-roots)")]
    NoFileRoots,
    #[error("file {path} is not under a directory of stream_policy.file_roots ({roots})")]
    OutsideRoots { path: String, roots: String },
    #[error("file {path} cannot be checked: {reason}")]
    Unreadable { path: String, reason: String },
    #[error("the url names no host")]
    NoHost,
    #[error("GB28181 is off on this server: gb28181:// streams need its SIP server (--gb28181-listen, or [gb28181] in the config file)")]
    Gb28181Off,
    #[error("host {0} is a number in a form other than a.b.c.d; write the address as a dotted quad")]
    NumericHost(String),
    #[error("host {0:?} is not a plain host name or address")]
    OddHost(String),
    #[error("host {host} does not resolve: {reason}")]
    Unresolved { host: String, reason: String },
    #[error(
        "host {host} {}; allow it with stream_policy.allow_hosts",
        what_address(host, address, range)
    )]
    Address {
        host: String,
        address: IpAddr,
        range: RefusedRange,
    },
}

fn what_address(host: &str, address: &IpAddr, range: &RefusedRange) -> String {
    match host.trim_matches(['[', ']']).parse::<IpAddr>() {
        Ok(_) => format!("is a {range} address"),
        Err(_) => format!("resolves to {address}, a {range} address"),
    }
}

/// Turns a host name into addresses: the system's resolver, or a test's answers.
pub trait HostResolver: Send + Sync + 'static {
    fn resolve(&self, host: &str, port: u16) -> BoxFuture<'static, std::io::Result<Vec<IpAddr>>>;
}

/// The system resolver (getaddrinfo, through tokio's `lookup_host`).
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemResolver;

impl HostResolver for SystemResolver {
    fn resolve(&self, host: &str, port: u16) -> BoxFuture<'static, std::io::Result<Vec<IpAddr>>> {
        let target = format!("{host}:{port}");
        Box::pin(async move { Ok(tokio::net::lookup_host(target).await?.map(|a| a.ip()).collect()) })
    }
}

/// A [`StreamPolicy`] ready to judge URLs.
pub struct UrlPolicy {
    schemes: Vec<String>,
    /// Canonical, so a file's canonical path can be compared with them.
    file_roots: Vec<PathBuf>,
    allow: HostAllowList,
    resolver: Arc<dyn HostResolver>,
}

impl std::fmt::Debug for UrlPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UrlPolicy")
            .field("schemes", &self.schemes)
            .field("file_roots", &self.file_roots)
            .field("allow", &self.allow)
            .finish_non_exhaustive()
    }
}

impl UrlPolicy {
    /// Checks the settings: known schemes, parseable host rules, file roots that exist.
    pub fn new(policy: &StreamPolicy, resolver: Arc<dyn HostResolver>) -> Result<Self, String> {
        let mut schemes = Vec::new();
        for scheme in &policy.allowed_schemes {
            let scheme = scheme.trim().to_ascii_lowercase();
            if !KNOWN_SCHEMES.contains(&scheme.as_str()) {
                return Err(format!(
                    "allowed_schemes: unknown scheme {scheme:?} (known: rtsp, rtsps, rtp, rtp+tcp, gb28181, file)"
                ));
            }
            schemes.push(scheme);
        }
        let file_in_schemes = schemes.iter().any(|s| s == "file");
        if file_in_schemes && policy.file_roots.is_empty() {
            return Err("allowed_schemes has file but file_roots is empty: name the directories file streams may come from".into());
        }
        if !policy.file_roots.is_empty() && !file_in_schemes {
            schemes.push("file".into());
        }
        let file_roots = policy
            .file_roots
            .iter()
            .map(|root| match root.canonicalize() {
                Ok(c) if c.is_dir() => Ok(c),
                Ok(_) => Err(format!("file_roots: {} is not a directory", root.display())),
                Err(e) => Err(format!("file_roots: {}: {e}", root.display())),
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            schemes,
            file_roots,
            allow: HostAllowList::parse(&policy.allow_hosts)?,
            resolver,
        })
    }

    fn scheme_allowed(&self, scheme: &str) -> Result<(), UrlRefusal> {
        match self.schemes.iter().any(|s| s == scheme) {
            true => Ok(()),
            false => Err(UrlRefusal::Scheme {
                scheme: scheme.to_string(),
                allowed: self.schemes.join(", "),
            }),
        }
    }

    /// The path to open for a file stream: the file's canonical path, if it lies under a
    /// file root. A file that does not exist yet is judged by its canonical folder (the
    /// stream then fails to open, as any missing file does).
    pub fn file_path(&self, path: &Path) -> Result<PathBuf, UrlRefusal> {
        if self.file_roots.is_empty() {
            return Err(UrlRefusal::NoFileRoots);
        }
        let shown = path.display().to_string();
        let unreadable = |e: std::io::Error| UrlRefusal::Unreadable {
            path: shown.clone(),
            reason: e.to_string(),
        };
        let canonical = match path.canonicalize() {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
                    return Err(unreadable(e));
                };
                let parent = if parent.as_os_str().is_empty() {
                    Path::new(".")
                } else {
                    parent
                };
                parent.canonicalize().map_err(unreadable)?.join(name)
            }
            Err(e) => return Err(unreadable(e)),
        };
        match self.file_roots.iter().any(|root| canonical.starts_with(root)) {
            true => Ok(canonical),
            false => Err(UrlRefusal::OutsideRoots {
                path: shown,
                roots: self
                    .file_roots
                    .iter()
                    .map(|r| r.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
            }),
        }
    }

    /// Judges a stream's source before anything of it is opened. A camera name that does
    /// not resolve now is let in: DNS being down must not stop a server's start or lose a
    /// camera; the check before every connection refuses it until it resolves (the stream
    /// backs off with the reason), and judges the address it resolves to then.
    pub(crate) async fn admit(&self, source: &SourceUrl) -> Result<(), UrlRefusal> {
        let url = match source {
            SourceUrl::Rtsp(url) => url,
            SourceUrl::Rtp(endpoint) if endpoint.connects_out() => &endpoint.url,
            // It listens: only its scheme is judged.
            SourceUrl::Rtp(endpoint) => return self.scheme_allowed(endpoint.url.scheme()),
            // A registered, authenticated device pushes to us: only the scheme is judged.
            SourceUrl::Gb28181(channel) => return self.scheme_allowed(channel.url.scheme()),
            SourceUrl::File(path) => return self.file_path(path).map(|_| ()),
        };
        match self.rtsp_address(url).await {
            Ok(_) | Err(UrlRefusal::Unresolved { .. }) => Ok(()),
            Err(refusal) => Err(refusal),
        }
    }

    /// The address an RTSP URL (or an active `rtp+tcp` one) may be connected to: its
    /// host's, resolved now, if no address of it is refused.
    pub async fn rtsp_address(&self, url: &Url) -> Result<IpAddr, UrlRefusal> {
        self.scheme_allowed(url.scheme())?;
        let port = url.port().unwrap_or(RTSP_PORT);
        let host = match url.host() {
            None => return Err(UrlRefusal::NoHost),
            Some(Host::Ipv4(ip)) => return self.literal(ip.to_string(), IpAddr::V4(ip)),
            Some(Host::Ipv6(ip)) => return self.literal(format!("[{ip}]"), IpAddr::V6(ip)),
            // Names are case-insensitive; non-special URLs keep the case as written.
            Some(Host::Domain(d)) => d.to_ascii_lowercase(),
        };
        if let Ok(ip) = host.parse::<Ipv4Addr>() {
            return self.literal(host.to_string(), IpAddr::V4(ip));
        }
        let host = host.as_str();
        if address::is_legacy_numeric_host(host) {
            return Err(UrlRefusal::NumericHost(host.to_string()));
        }
        let plain = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_');
        if host.is_empty() || !host.chars().all(plain) {
            return Err(UrlRefusal::OddHost(host.to_string()));
        }
        let unresolved = |reason: String| UrlRefusal::Unresolved {
            host: host.to_string(),
            reason,
        };
        let addresses = self
            .resolver
            .resolve(host, port)
            .await
            .map_err(|e| unresolved(e.to_string()))?;
        if addresses.is_empty() {
            return Err(unresolved("no addresses".into()));
        }
        self.judge(host.to_string(), &addresses)
    }

    /// Judges an address the server is told to connect to by a peer rather than by a URL
    /// (a GB28181 device's answer naming its media port): the address rules only, as for
    /// an RTSP camera's address.
    pub(crate) fn peer_address(&self, ip: IpAddr) -> Result<(), UrlRefusal> {
        self.literal(ip.to_string(), ip).map(|_| ())
    }

    fn literal(&self, host: String, ip: IpAddr) -> Result<IpAddr, UrlRefusal> {
        self.judge(host, &[ip])
    }

    fn judge(&self, host: String, addresses: &[IpAddr]) -> Result<IpAddr, UrlRefusal> {
        address::choose_address(&host, addresses, &self.allow).map_err(|r| UrlRefusal::Address {
            host,
            address: r.address,
            range: r.range,
        })
    }
}

#[cfg(test)]
mod tests;
