//! The remote image fetcher's address guard: which addresses a fetch may connect to, and the name
//! resolver that enforces it on every connection (the first URL and each redirect hop).
//!
//! A URL's host is resolved first; the addresses that are loopback, private, link-local, unique-local,
//! shared (carrier-grade NAT), cloud-metadata or otherwise special ([`refused_class`]) are dropped, and the
//! connection goes only to what is left, exactly those addresses (no second lookup that an attacker's DNS
//! could answer differently). When nothing is left the fetch fails with [`AddressRefused`]. IPv6 forms that
//! embed an IPv4 address (mapped, compatible, NAT64, 6to4) are judged by that address.
//! `--allow-private-remote-images` turns the guard off (an internal image host).

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use ureq::unversioned::resolver::{DefaultResolver, ResolvedSocketAddrs, Resolver};
use ureq::unversioned::transport::NextTimeout;

/// Why an IPv4 address is refused, or `None` for a public one.
fn v4_class(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, c, _] = ip.octets();
    match (a, b, c) {
        (127, ..) => Some("loopback"),
        (10, ..) | (192, 168, _) => Some("private"),
        (172, b, _) if b & 0xF0 == 16 => Some("private"),
        // 169.254.169.254 (AWS, GCP, Azure metadata), 169.254.170.2 (ECS) are in here.
        (169, 254, _) => Some("link-local (cloud metadata)"),
        // Carrier-grade NAT; 100.100.100.200 is a cloud metadata address.
        (100, b, _) if b & 0xC0 == 64 => Some("shared (carrier-grade NAT, cloud metadata)"),
        // 192.0.0.192 is a cloud metadata address.
        (192, 0, 0) => Some("special-purpose (cloud metadata)"),
        (0, ..) => Some("unspecified"),
        (192, 0, 2) | (198, 51, 100) | (203, 0, 113) => Some("documentation"),
        (198, b, _) if b & 0xFE == 18 => Some("benchmarking"),
        (224..=239, ..) => Some("multicast"),
        (240..=255, ..) => Some("reserved or broadcast"),
        _ => None,
    }
}

/// The IPv4 address an IPv6 address carries (mapped, compatible, NAT64 well-known prefix, 6to4).
fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = ip.segments();
    let low = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
    match s {
        [0, 0, 0, 0, 0, 0xFFFF, ..] | [0, 0, 0, 0, 0, 0, ..] => Some(low),
        [0x64, 0xFF9B, 0, 0, 0, 0, ..] => Some(low),
        [0x2002, hi, lo, ..] => Some(Ipv4Addr::new(
            (hi >> 8) as u8,
            hi as u8,
            (lo >> 8) as u8,
            lo as u8,
        )),
        _ => None,
    }
}

/// Why a fetch may not connect to `ip` (loopback, private, link-local, ...), or `None` for a public
/// address.
pub fn refused_class(ip: IpAddr) -> Option<&'static str> {
    let v6 = match ip {
        IpAddr::V4(v4) => return v4_class(v4),
        IpAddr::V6(v6) => v6,
    };
    if let Some(v4) = embedded_v4(v6) {
        // `::` and `::1` land in 0.0.0.0/8; a public IPv4 address in these forms is as public as itself.
        return v4_class(v4);
    }
    let s = v6.segments();
    match s[0] {
        0xFC00..=0xFDFF => Some("unique-local (cloud metadata)"),
        0xFE80..=0xFEBF => Some("link-local"),
        0xFEC0..=0xFEFF => Some("site-local"),
        0xFF00..=0xFFFF => Some("multicast"),
        // NAT64 local-use, Teredo and documentation prefixes, the discard prefix.
        0x0064 if s[1] == 0xFF9B => Some("NAT64"),
        0x2001 if s[1] == 0 || s[1] == 0x0DB8 => Some("Teredo or documentation"),
        0x0100 if s[1..4] == [0, 0, 0] => Some("discard"),
        _ => None,
    }
}

/// A fetch refused because its host resolves only to addresses the guard refuses.
#[derive(Debug)]
pub struct AddressRefused {
    pub host: String,
    pub ip: IpAddr,
    pub class: &'static str,
}

impl std::fmt::Display for AddressRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the host {} is {}, a {} address; the server does not fetch from such addresses (unless it \
             runs with --allow-private-remote-images)",
            self.host, self.ip, self.class
        )
    }
}

impl std::error::Error for AddressRefused {}

/// Fixed name -> address answers consulted before the system resolver (the serve tests' injected
/// resolver, `FLORENCE2_SERVE_TEST_RESOLVE=name=ip,...`); empty in production.
pub type Hosts = Arc<HashMap<String, IpAddr>>;

/// `name=ip,name=ip` (the test hook's format).
pub fn parse_hosts(s: &str) -> Result<HashMap<String, IpAddr>, String> {
    s.split(',')
        .filter(|e| !e.trim().is_empty())
        .map(|e| {
            let (name, ip) = e
                .split_once('=')
                .ok_or_else(|| format!("{e:?} is not name=ip"))?;
            let ip = ip
                .trim()
                .parse()
                .map_err(|_| format!("{ip:?} is not an IP address"))?;
            Ok((name.trim().to_ascii_lowercase(), ip))
        })
        .collect()
}

/// The resolver of a remote image fetch: resolves, then keeps the addresses `may_connect` allows.
#[derive(Debug)]
pub struct GuardedResolver {
    pub hosts: Hosts,
    /// Whether a fetch may connect to an address (all of them with --allow-private-remote-images).
    pub may_connect: fn(IpAddr) -> bool,
}

/// The guard's rule: public addresses only.
pub fn public_only(ip: IpAddr) -> bool {
    refused_class(ip).is_none()
}

pub fn any_address(_: IpAddr) -> bool {
    true
}

impl Resolver for GuardedResolver {
    fn resolve(
        &self,
        uri: &ureq::http::Uri,
        config: &ureq::config::Config,
        timeout: NextTimeout,
    ) -> Result<ResolvedSocketAddrs, ureq::Error> {
        let host = uri.host().unwrap_or_default();
        let found = match self.hosts.get(&host.to_ascii_lowercase()) {
            Some(ip) => {
                let port = uri
                    .port_u16()
                    .unwrap_or(if uri.scheme_str() == Some("https") {
                        443
                    } else {
                        80
                    });
                let mut v = self.empty();
                v.push(SocketAddr::new(*ip, port));
                v
            }
            None => DefaultResolver::default().resolve(uri, config, timeout)?,
        };
        let mut kept = self.empty();
        let mut refused = None;
        for a in found.iter() {
            if (self.may_connect)(a.ip()) {
                let _ = kept.try_push(*a);
            } else {
                refused.get_or_insert(a.ip());
            }
        }
        match (kept.is_empty(), refused) {
            (false, _) => Ok(kept),
            (true, Some(ip)) => Err(ureq::Error::Other(Box::new(AddressRefused {
                host: host.to_string(),
                ip,
                class: refused_class(ip).unwrap_or("refused"),
            }))),
            (true, None) => Err(ureq::Error::HostNotFound),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_addresses_are_refused_and_public_ones_kept() {
        for ip in [
            "127.0.0.1",
            "127.8.9.10",
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "169.254.170.2",
            "100.100.100.200",
            "100.64.0.1",
            "192.0.0.192",
            "0.0.0.0",
            "255.255.255.255",
            "224.0.0.1",
            "::1",
            "::",
            "fd00:ec2::254",
            "fc00::1",
            "fe80::1",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "::127.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "64:ff9b:1::1",
            "2002:7f00:1::",
            "2002:a00:1::1",
            "2001::1",
            "2001:db8::1",
        ] {
            let ip: IpAddr = ip.parse().unwrap();
            assert!(refused_class(ip).is_some(), "{ip} must be refused");
            assert!(!public_only(ip));
        }
        for ip in [
            "8.8.8.8",
            "1.1.1.1",
            "172.32.0.1",
            "100.128.0.1",
            "169.253.1.1",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
            "2002:808:808::1",
        ] {
            let ip: IpAddr = ip.parse().unwrap();
            assert_eq!(refused_class(ip), None, "{ip} is public");
        }
    }

    #[test]
    fn hosts_parse_as_name_equals_ip() {
        let h = parse_hosts("Internal.Test=127.0.0.1, v6.test=::1").unwrap();
        assert_eq!(h["internal.test"], IpAddr::from([127, 0, 0, 1]));
        assert_eq!(h["v6.test"], "::1".parse::<IpAddr>().unwrap());
        assert!(parse_hosts("x").is_err());
        assert!(parse_hosts("x=nope").is_err());
    }
}
