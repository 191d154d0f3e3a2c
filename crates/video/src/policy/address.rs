//! Which network addresses a stream may connect to: pure decisions over addresses that were
//! already resolved, so every rule is unit-tested without DNS.
//!
//! Refused by default: loopback, link-local, unspecified, multicast, broadcast and the
//! cloud metadata addresses, whatever form the address takes (IPv4-mapped and
//! IPv4-compatible IPv6, NAT64 are judged by the IPv4 address inside). Private LAN ranges
//! (10/8, 172.16/12, 192.168/16, fc00::/7) stay allowed: that is where cameras live.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;

/// Why an address is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusedRange {
    Loopback,
    LinkLocal,
    Unspecified,
    Multicast,
    Broadcast,
    Metadata,
}

impl fmt::Display for RefusedRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Loopback => "loopback",
            Self::LinkLocal => "link-local",
            Self::Unspecified => "unspecified",
            Self::Multicast => "multicast",
            Self::Broadcast => "broadcast",
            Self::Metadata => "cloud metadata",
        })
    }
}

/// Instance metadata services (AWS IPv4 is also link-local; AWS IPv6, Alibaba Cloud).
const METADATA_V4: [Ipv4Addr; 2] = [
    Ipv4Addr::new(169, 254, 169, 254),
    Ipv4Addr::new(100, 100, 100, 200),
];
const METADATA_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x0ec2, 0, 0, 0, 0, 0, 0x0254);

/// The range `ip` falls in if a stream must not connect there, else `None`.
pub fn refused_range(ip: IpAddr) -> Option<RefusedRange> {
    match ip {
        IpAddr::V4(v4) => refused_v4(v4),
        IpAddr::V6(v6) => match embedded_v4(v6) {
            Some(v4) => refused_v4(v4),
            None => refused_v6(v6),
        },
    }
}

fn refused_v4(ip: Ipv4Addr) -> Option<RefusedRange> {
    // Metadata first: 169.254.169.254 is link-local too, but the more telling name wins.
    if METADATA_V4.contains(&ip) {
        Some(RefusedRange::Metadata)
    } else if ip.is_loopback() {
        Some(RefusedRange::Loopback)
    } else if ip.is_link_local() {
        Some(RefusedRange::LinkLocal)
    } else if ip.is_unspecified() || ip.octets()[0] == 0 {
        // 0.0.0.0/8 is "this network": Linux connects 0.x.y.z to the local host.
        Some(RefusedRange::Unspecified)
    } else if ip.is_multicast() {
        Some(RefusedRange::Multicast)
    } else if ip.is_broadcast() {
        Some(RefusedRange::Broadcast)
    } else {
        None
    }
}

fn refused_v6(ip: Ipv6Addr) -> Option<RefusedRange> {
    let first = ip.segments()[0];
    if ip == METADATA_V6 {
        Some(RefusedRange::Metadata)
    } else if ip.is_loopback() {
        Some(RefusedRange::Loopback)
    } else if ip.is_unspecified() {
        Some(RefusedRange::Unspecified)
    } else if first & 0xffc0 == 0xfe80 {
        Some(RefusedRange::LinkLocal)
    } else if ip.is_multicast() {
        Some(RefusedRange::Multicast)
    } else {
        None
    }
}

/// The IPv4 address an IPv6 address stands for, where the network would reach an IPv4
/// host with it: IPv4-mapped (`::ffff:a.b.c.d`), IPv4-compatible (`::a.b.c.d`, not `::`
/// or `::1`) and the NAT64 well-known prefix (`64:ff9b::a.b.c.d`).
fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    if let Some(v4) = ip.to_ipv4_mapped() {
        return Some(v4);
    }
    let s = ip.segments();
    let low = Ipv4Addr::from((u32::from(s[6]) << 16) | u32::from(s[7]));
    let compatible = s[..6].iter().all(|&x| x == 0) && u32::from(low) > 1;
    let nat64 = s[..6] == [0x64, 0xff9b, 0, 0, 0, 0];
    (compatible || nat64).then_some(low)
}

/// `stream_policy.allow_hosts`, parsed: networks, and host names matched exactly.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HostAllowList {
    networks: Vec<IpNet>,
    names: Vec<String>,
}

impl HostAllowList {
    /// Each entry is a CIDR (`10.1.0.0/16`), one address (`127.0.0.1`, `::1`) or a host
    /// name (`camera.local`, case-insensitive).
    pub fn parse(entries: &[String]) -> Result<Self, String> {
        let mut list = Self::default();
        for entry in entries.iter().map(|e| e.trim()) {
            if let Ok(net) = entry.parse::<IpNet>() {
                list.networks.push(net.trunc());
            } else if let Ok(ip) = entry.parse::<IpAddr>() {
                list.networks.push(IpNet::from(ip));
            } else if is_host_name(entry) {
                list.names.push(normal_name(entry));
            } else {
                return Err(format!(
                    "allow_hosts entry {entry:?} is neither a CIDR (10.0.0.0/8), an address nor a host name"
                ));
            }
        }
        Ok(list)
    }

    /// The host name itself is allowed, whatever it resolves to.
    pub fn allows_name(&self, host: &str) -> bool {
        let host = normal_name(host);
        self.names.contains(&host)
    }

    pub fn allows_address(&self, ip: IpAddr) -> bool {
        let v4 = match ip {
            IpAddr::V6(v6) => embedded_v4(v6).map(IpAddr::V4),
            IpAddr::V4(_) => None,
        };
        self.networks
            .iter()
            .any(|n| n.contains(&ip) || v4.is_some_and(|v4| n.contains(&v4)))
    }
}

fn normal_name(host: &str) -> String {
    host.trim_end_matches('.').to_ascii_lowercase()
}

fn is_host_name(s: &str) -> bool {
    let s = s.strip_suffix('.').unwrap_or(s);
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        })
}

/// A refused address of a host, as the caller reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RefusedAddress {
    pub address: IpAddr,
    pub range: RefusedRange,
}

/// The address to connect to, if no address of `host` is refused: the host may resolve
/// to several and the connection may use any of them, so one refused address refuses
/// the host. `addresses` must not be empty.
pub fn choose_address(
    host: &str,
    addresses: &[IpAddr],
    allow: &HostAllowList,
) -> Result<IpAddr, RefusedAddress> {
    if !allow.allows_name(host) {
        for &address in addresses {
            if let Some(range) = refused_range(address).filter(|_| !allow.allows_address(address)) {
                return Err(RefusedAddress { address, range });
            }
        }
    }
    Ok(addresses[0])
}

/// A host written as a number in a form other than the dotted quad (`2130706433`,
/// `0x7f.1`, `0177.0.0.1`, `127.1`): the system resolver turns these into addresses
/// (inet_aton), so they are refused rather than judged by a name.
pub fn is_legacy_numeric_host(host: &str) -> bool {
    let parts: Vec<&str> = host.trim_end_matches('.').split('.').collect();
    let numeric = |p: &&str| {
        let digits = p.strip_prefix("0x").or_else(|| p.strip_prefix("0X"));
        match digits {
            Some(hex) => hex.chars().all(|c| c.is_ascii_hexdigit()),
            None => !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()),
        }
    };
    parts.len() <= 4 && parts.iter().all(numeric) && host.parse::<Ipv4Addr>().is_err()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn refuses_every_local_and_metadata_range_in_every_spelling() {
        let cases = [
            ("127.0.0.1", Some(RefusedRange::Loopback)),
            ("127.255.0.9", Some(RefusedRange::Loopback)),
            ("::1", Some(RefusedRange::Loopback)),
            ("::ffff:127.0.0.1", Some(RefusedRange::Loopback)),
            ("::127.0.0.1", Some(RefusedRange::Loopback)),
            ("64:ff9b::7f00:1", Some(RefusedRange::Loopback)),
            ("169.254.1.1", Some(RefusedRange::LinkLocal)),
            ("fe80::1", Some(RefusedRange::LinkLocal)),
            ("febf::1", Some(RefusedRange::LinkLocal)),
            ("0.0.0.0", Some(RefusedRange::Unspecified)),
            ("0.1.2.3", Some(RefusedRange::Unspecified)),
            ("::", Some(RefusedRange::Unspecified)),
            ("224.0.0.1", Some(RefusedRange::Multicast)),
            ("ff02::1", Some(RefusedRange::Multicast)),
            ("255.255.255.255", Some(RefusedRange::Broadcast)),
            ("169.254.169.254", Some(RefusedRange::Metadata)),
            ("::ffff:169.254.169.254", Some(RefusedRange::Metadata)),
            ("fd00:ec2::254", Some(RefusedRange::Metadata)),
            ("100.100.100.200", Some(RefusedRange::Metadata)),
        ];
        for (address, want) in cases {
            assert_eq!(refused_range(ip(address)), want, "{address}");
        }
    }

    #[test]
    fn lan_and_public_addresses_are_allowed() {
        for address in [
            "10.0.0.5",
            "172.16.3.4",
            "172.31.255.1",
            "192.168.1.64",
            "8.8.8.8",
            "100.100.100.201",
            "fd12:3456::1",
            "2001:db8::1",
            "::ffff:192.168.1.2",
            "fec0::1",
        ] {
            assert_eq!(refused_range(ip(address)), None, "{address}");
        }
    }

    #[test]
    fn one_refused_address_refuses_the_host_unless_allowed() {
        let none = HostAllowList::default();
        let mixed = [ip("192.168.1.2"), ip("127.0.0.1")];
        assert_eq!(
            choose_address("cam.example", &mixed, &none),
            Err(RefusedAddress {
                address: ip("127.0.0.1"),
                range: RefusedRange::Loopback
            })
        );
        assert_eq!(
            choose_address("cam.example", &mixed[..1], &none),
            Ok(ip("192.168.1.2"))
        );
        let by_net = HostAllowList::parse(&["127.0.0.0/8".into()]).unwrap();
        assert_eq!(
            choose_address("cam.example", &mixed, &by_net),
            Ok(ip("192.168.1.2"))
        );
        let mapped = [ip("::ffff:127.0.0.1")];
        assert!(
            choose_address("x", &mapped, &by_net).is_ok(),
            "a mapped address matches its IPv4 network"
        );
        let by_name = HostAllowList::parse(&["Metadata.Internal.".into()]).unwrap();
        assert!(choose_address("metadata.internal", &[ip("169.254.169.254")], &by_name).is_ok());
        assert!(choose_address("other.internal", &[ip("169.254.169.254")], &by_name).is_err());
        let one = HostAllowList::parse(&["::1".into()]).unwrap();
        assert!(choose_address("h", &[ip("::1")], &one).is_ok());
        assert!(choose_address("h", &[ip("127.0.0.1")], &one).is_err());
    }

    #[test]
    fn allow_list_entries_must_be_networks_addresses_or_names() {
        assert!(HostAllowList::parse(&["10.0.0.0/8".into(), "cam-1.lan".into(), "fe80::/10".into()]).is_ok());
        for bad in ["10.0.0.0/33", "http://x", "a b", "", "x..y"] {
            let e = HostAllowList::parse(&[bad.into()]).unwrap_err();
            assert!(e.contains("CIDR"), "{bad}: {e}");
        }
    }

    #[test]
    fn numbers_the_resolver_would_read_as_addresses_are_spotted() {
        for host in [
            "2130706433",
            "0x7f000001",
            "0177.0.0.1",
            "127.1",
            "0x7f.0.0.1",
            "017700000001",
            "127.0.0.1.",
        ] {
            assert!(is_legacy_numeric_host(host), "{host}");
        }
        for host in [
            "127.0.0.1",
            "cam1",
            "10.0.0.5",
            "1cam.lan",
            "0xcafe.example",
            "a.1",
        ] {
            assert!(!is_legacy_numeric_host(host), "{host}");
        }
    }
}
