//! The device registry as plain state: REGISTER with a digest challenge and an expiry,
//! Keepalive MESSAGEs for liveness, Catalog responses as the device's channels. Every input
//! returns the response to send and what changed; [`Registrar::tick`] turns the passage of
//! time into offline events. The caller owns sockets, clocks and randomness (nonces, ids).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use rsip::headers::{self, UntypedHeader};
use rsip::prelude::HeadersExt;
use rsip::{Method, Request, Response};

use crate::digest::{Algorithm, Challenge, Credentials};
use crate::manscdp::{self, CatalogItem, CatalogResponse, Manscdp};
use crate::sip::{self, DialogIds, LocalEndpoint, OutgoingRequest};

/// How the registrar treats devices. Defaults are GB28181's.
#[derive(Debug, Clone)]
pub struct RegistrarConfig {
    pub local: LocalEndpoint,
    /// The password every device of the domain authenticates with.
    pub password: String,
    pub algorithm: Algorithm,
    /// The device's keepalive period (GB28181: 60 s).
    pub keepalive_interval: Duration,
    /// Missed keepalives before a device counts as offline (GB28181: 3).
    pub keepalive_misses: u32,
    /// How long an issued nonce is accepted; a later REGISTER gets a `stale` challenge.
    pub nonce_lifetime: Duration,
    /// Most outstanding challenges kept; past it the oldest is forgotten, so a flood of
    /// REGISTERs from made-up ids cannot grow memory.
    pub max_pending_nonces: usize,
    /// Most channels kept per device: a catalog claiming more (or parts that never add up)
    /// is cut there rather than growing without bound. Large NVR platforms list thousands.
    pub max_channels: usize,
}

impl RegistrarConfig {
    pub fn new(local: LocalEndpoint, password: &str) -> RegistrarConfig {
        RegistrarConfig {
            local,
            password: password.to_string(),
            algorithm: Algorithm::Md5,
            keepalive_interval: Duration::from_secs(60),
            keepalive_misses: 3,
            nonce_lifetime: Duration::from_secs(600),
            max_pending_nonces: 4096,
            max_channels: 10_000,
        }
    }

    fn keepalive_timeout(&self) -> Duration {
        self.keepalive_interval * self.keepalive_misses
    }
}

/// A registered device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    pub id: String,
    /// The Contact URI it registered, where requests to it go.
    pub contact: Option<String>,
    /// The address its REGISTER came from (differs from the contact behind NAT).
    pub source: SocketAddr,
    pub user_agent: Option<String>,
    pub expires_at: Instant,
    pub last_seen: Instant,
    pub online: bool,
    /// The channels of its last complete Catalog response.
    pub channels: Vec<CatalogItem>,
    /// A catalog arriving in parts: its SN, total and the items so far.
    pending_catalog: Option<(u32, usize, Vec<CatalogItem>)>,
}

impl Device {
    /// Adds one part of a catalog response; when the parts add up to the total (or to
    /// `max_channels`), they replace the channels and the count is returned. A part with
    /// a new SN starts over rather than mixing two catalogs.
    fn add_catalog_part(&mut self, catalog: CatalogResponse, max_channels: usize) -> Option<usize> {
        let (sn, total, mut items) = match self.pending_catalog.take() {
            Some((sn, total, items)) if sn == catalog.sn => (sn, total, items),
            _ => (catalog.sn, catalog.sum_num, Vec::new()),
        };
        let room = max_channels.saturating_sub(items.len());
        items.extend(catalog.items.into_iter().take(room));
        if items.len() < total.min(max_channels) {
            self.pending_catalog = Some((sn, total, items));
            return None;
        }
        self.channels = items;
        Some(self.channels.len())
    }
}

/// Why a device went offline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OfflineReason {
    /// REGISTER with `Expires: 0`.
    Unregistered,
    /// Its registration ran out without a refresh.
    RegistrationExpired,
    /// `keepalive_misses` keepalive periods passed without one.
    KeepaliveLost,
}

/// What changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegistrarEvent {
    /// The device registered, or came back with a keepalive after being lost. The caller
    /// usually sends [`Registrar::catalog_query`] next.
    DeviceOnline { device_id: String },
    DeviceOffline {
        device_id: String,
        reason: OfflineReason,
    },
    /// A complete catalog arrived and replaced the device's channels.
    CatalogUpdated { device_id: String, channels: usize },
}

/// The answer to one request.
#[derive(Debug, Clone)]
pub struct Handled {
    pub response: Response,
    pub events: Vec<RegistrarEvent>,
}

#[derive(Debug)]
struct IssuedNonce {
    value: String,
    issued: Instant,
}

/// The registry of GB28181 devices of one domain.
#[derive(Debug)]
pub struct Registrar {
    config: RegistrarConfig,
    devices: HashMap<String, Device>,
    nonces: HashMap<String, IssuedNonce>,
    next_sn: u32,
    next_cseq: u32,
}

impl Registrar {
    pub fn new(config: RegistrarConfig) -> Registrar {
        Registrar {
            config,
            devices: HashMap::new(),
            nonces: HashMap::new(),
            next_sn: 1,
            next_cseq: 1,
        }
    }

    pub fn device(&self, id: &str) -> Option<&Device> {
        self.devices.get(id)
    }

    pub fn devices(&self) -> impl Iterator<Item = &Device> {
        self.devices.values()
    }

    /// Handles a request from a device. `nonce` is a fresh random value, used only if this
    /// request has to be challenged. Methods other than REGISTER and MESSAGE get 405: the
    /// caller routes dialog requests (BYE from a device) to the play sessions first.
    /// GB28181 devices set their clock from the `Date` of the 200 to REGISTER; with no wall
    /// clock here, the caller adds it ([`sip::add_header`]).
    pub fn handle(&mut self, request: &Request, source: SocketAddr, nonce: &str, now: Instant) -> Handled {
        let device_id = match sip::from_user(request) {
            Ok(id) => id,
            Err(_) => return plain(sip::response(request, 400, None)),
        };
        match request.method {
            Method::Register => self.register(request, &device_id, source, nonce, now),
            Method::Message => self.message(request, &device_id, now),
            _ => {
                let mut response = sip::response(request, 405, None);
                sip::add_header(&mut response, headers::Allow::new("REGISTER, MESSAGE").into());
                plain(response)
            }
        }
    }

    fn register(
        &mut self,
        request: &Request,
        device_id: &str,
        source: SocketAddr,
        nonce: &str,
        now: Instant,
    ) -> Handled {
        let Some(authorization) = request.authorization_header() else {
            return plain(self.challenge(request, device_id, nonce, false, now));
        };
        let Ok(credentials) = Credentials::parse(authorization.value()) else {
            return plain(self.challenge(request, device_id, nonce, false, now));
        };
        let issued = self.nonces.get(device_id);
        let fresh = issued.is_some_and(|n| {
            n.value == credentials.nonce && now.duration_since(n.issued) < self.config.nonce_lifetime
        });
        if !fresh {
            return plain(self.challenge(request, device_id, nonce, true, now));
        }
        // The digest `uri` is not compared with the Request-URI: devices write it in several
        // forms (with or without the port, the domain or the IP), and the response already
        // covers whatever they wrote.
        let matches_device =
            credentials.username == device_id && credentials.realm == self.config.local.domain;
        if !matches_device || !credentials.verify("REGISTER", &self.config.password) {
            return plain(sip::response(request, 403, Some(&self.config.local.server_id)));
        }
        let expires = requested_expires(request);
        let mut response = sip::response(request, 200, Some(&self.config.local.server_id));
        sip::add_header(&mut response, headers::Expires::new(expires.to_string()).into());
        if expires == 0 {
            let events = match self.devices.remove(device_id) {
                Some(_) => vec![offline(device_id, OfflineReason::Unregistered)],
                None => Vec::new(),
            };
            return Handled { response, events };
        }
        let device = self
            .devices
            .entry(device_id.to_string())
            .or_insert_with(|| Device {
                id: device_id.to_string(),
                contact: None,
                source,
                user_agent: None,
                expires_at: now,
                last_seen: now,
                online: false,
                channels: Vec::new(),
                pending_catalog: None,
            });
        device.contact = sip::contact_uri(request);
        device.source = source;
        device.user_agent = request.user_agent_header().map(|ua| ua.value().to_string());
        device.expires_at = now + Duration::from_secs(u64::from(expires));
        device.last_seen = now;
        let events = match std::mem::replace(&mut device.online, true) {
            true => Vec::new(),
            false => vec![RegistrarEvent::DeviceOnline {
                device_id: device_id.to_string(),
            }],
        };
        Handled { response, events }
    }

    fn challenge(
        &mut self,
        request: &Request,
        device_id: &str,
        nonce: &str,
        stale: bool,
        now: Instant,
    ) -> Response {
        if !self.nonces.contains_key(device_id) && self.nonces.len() >= self.config.max_pending_nonces {
            self.forget_oldest_nonce();
        }
        self.nonces.insert(
            device_id.to_string(),
            IssuedNonce {
                value: nonce.to_string(),
                issued: now,
            },
        );
        let mut challenge = Challenge::new(&self.config.local.domain, nonce, self.config.algorithm);
        challenge.stale = stale;
        let mut response = sip::response(request, 401, Some(&self.config.local.server_id));
        sip::add_header(
            &mut response,
            headers::WwwAuthenticate::new(challenge.header_value()).into(),
        );
        response
    }

    fn forget_oldest_nonce(&mut self) {
        let oldest = self
            .nonces
            .iter()
            .min_by_key(|(_, n)| n.issued)
            .map(|(id, _)| id.clone());
        if let Some(id) = oldest {
            self.nonces.remove(&id);
        }
    }

    fn message(&mut self, request: &Request, device_id: &str, now: Instant) -> Handled {
        let Some(device) = self.devices.get_mut(device_id) else {
            // Not registered (or expired): 403 makes most devices register again.
            return plain(sip::response(request, 403, Some(&self.config.local.server_id)));
        };
        let ok = sip::response(request, 200, Some(&self.config.local.server_id));
        let body = match manscdp::parse(&request.body) {
            Ok(body) => body,
            Err(_) => return plain(sip::response(request, 400, Some(&self.config.local.server_id))),
        };
        // Any message from the device shows it is alive, not only the Keepalive.
        device.last_seen = now;
        let mut events = Vec::new();
        if !device.online {
            device.online = true;
            events.push(RegistrarEvent::DeviceOnline {
                device_id: device_id.to_string(),
            });
        }
        if let Manscdp::Catalog(catalog) = body {
            if let Some(channels) = device.add_catalog_part(catalog, self.config.max_channels) {
                events.push(RegistrarEvent::CatalogUpdated {
                    device_id: device_id.to_string(),
                    channels,
                });
            }
        }
        Handled { response: ok, events }
    }

    /// Marks devices offline whose registration expired (they are removed) or whose
    /// keepalives stopped (they stay, and come back with the next message), and forgets
    /// stale nonces.
    pub fn tick(&mut self, now: Instant) -> Vec<RegistrarEvent> {
        let lifetime = self.config.nonce_lifetime;
        self.nonces.retain(|_, n| now.duration_since(n.issued) < lifetime);
        let mut events = Vec::new();
        let expired: Vec<String> = self
            .devices
            .values()
            .filter(|d| now >= d.expires_at)
            .map(|d| d.id.clone())
            .collect();
        for id in expired {
            self.devices.remove(&id);
            events.push(offline(&id, OfflineReason::RegistrationExpired));
        }
        let timeout = self.config.keepalive_timeout();
        for device in self.devices.values_mut() {
            if device.online && now.duration_since(device.last_seen) >= timeout {
                device.online = false;
                events.push(offline(&device.id, OfflineReason::KeepaliveLost));
            }
        }
        // HashMap order is arbitrary; events come out in a stable order for callers and tests.
        events.sort_by(|a, b| event_device(a).cmp(event_device(b)));
        events
    }

    /// When [`Registrar::tick`] next has something to do, for the caller's timer.
    pub fn next_deadline(&self) -> Option<Instant> {
        let timeout = self.config.keepalive_timeout();
        let devices = self.devices.values().map(|d| match d.online {
            true => d.expires_at.min(d.last_seen + timeout),
            false => d.expires_at,
        });
        let nonces = self
            .nonces
            .values()
            .map(|n| n.issued + self.config.nonce_lifetime);
        devices.chain(nonces).min()
    }

    /// A Catalog query MESSAGE for a registered device, or `None` if it is unknown or
    /// registered no Contact.
    pub fn catalog_query(&mut self, device_id: &str, ids: &DialogIds) -> Option<Request> {
        let device = self.devices.get(device_id)?;
        let uri = device.contact.clone()?;
        let sn = self.next_sn;
        self.next_sn = self.next_sn.wrapping_add(1);
        let cseq = self.next_cseq;
        self.next_cseq = self.next_cseq.wrapping_add(1);
        let to = format!("<sip:{device_id}@{}>", self.config.local.domain);
        let out = OutgoingRequest {
            method: Method::Message,
            uri: &uri,
            to: &to,
            cseq,
            branch: &ids.branch,
            body: Some(("Application/MANSCDP+xml", manscdp::catalog_query(sn, device_id))),
            extra: Vec::new(),
        };
        sip::request(&self.config.local, ids, out).ok()
    }
}

/// The registration period the device asked for: the Expires header, else the Contact's
/// `expires` parameter, else RFC 3261's default of an hour.
fn requested_expires(request: &Request) -> u32 {
    if let Some(expires) = request.expires_header().and_then(|e| e.seconds().ok()) {
        return expires;
    }
    let contact = request
        .contact_header()
        .ok()
        .map(|c| c.value().to_ascii_lowercase());
    contact
        .and_then(|c| {
            c.split(';')
                .find_map(|p| p.trim().strip_prefix("expires=")?.trim().parse().ok())
        })
        .unwrap_or(3600)
}

fn plain(response: Response) -> Handled {
    Handled {
        response,
        events: Vec::new(),
    }
}

fn offline(device_id: &str, reason: OfflineReason) -> RegistrarEvent {
    RegistrarEvent::DeviceOffline {
        device_id: device_id.to_string(),
        reason,
    }
}

fn event_device(event: &RegistrarEvent) -> &str {
    match event {
        RegistrarEvent::DeviceOnline { device_id }
        | RegistrarEvent::DeviceOffline { device_id, .. }
        | RegistrarEvent::CatalogUpdated { device_id, .. } => device_id,
    }
}

#[cfg(test)]
#[path = "registrar_tests.rs"]
mod tests;
