//! Pinned destinations: a name is resolved once, when a run's plan is built, and the proxies
//! only ever dial the addresses resolved then.
//!
//! Owns the [`Resolver`] seam (production: [`SystemResolver`], the host's resolver, asked once
//! per destination per run; tests: [`MapResolver`], an in-process map, so no test resolves a
//! name through the system), and [`AddressRules`], the addresses no pinned destination may
//! have. Must never: resolve at request time (a name that later re-resolves elsewhere, DNS
//! rebinding, must never widen anything), or pin an address the rules refuse.
//!
//! Always refused, whatever the options: the unspecified addresses (`0.0.0.0/8`, `::`, which
//! reach the host itself), link-local (`169.254.0.0/16`, where cloud metadata services live,
//! and `fe80::/10`), multicast, broadcast and the reserved `240.0.0.0/4`. Loopback
//! (`127.0.0.0/8`, `::1`) and the host's own interface addresses are refused by
//! [`AddressRules::production`]; tests, whose stand-in upstreams listen on 127.0.0.1, clear
//! that with [`AddressRules::allowing_loopback`], explicitly. IPv4-mapped IPv6 addresses are
//! judged as the IPv4 address they carry.
//!
//! Guarded by the unit tests below and `tests/broker_egress.rs`
//! (`the_production_rules_refuse_a_name_that_resolves_to_loopback`,
//! `a_name_that_re_resolves_elsewhere_still_reaches_only_the_pinned_address`).

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs};
use std::sync::Mutex;

/// Turns `host:port` into the socket addresses to dial. Asked only while a plan is built.
pub trait Resolver: Send + Sync {
    /// The addresses for `host` and `port`. The answer may name another port (a test maps
    /// `api.example.test:443` to a listener on an ephemeral port); production keeps `port`.
    fn resolve(&self, host: &str, port: u16) -> io::Result<Vec<SocketAddr>>;
}

/// The host's resolver (`getaddrinfo`), for production: asked once per destination per run.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemResolver;

impl Resolver for SystemResolver {
    fn resolve(&self, host: &str, port: u16) -> io::Result<Vec<SocketAddr>> {
        Ok((host, port).to_socket_addrs()?.collect())
    }
}

/// An in-process name map, for tests (HOST.md: no test resolves through the system). Entries can
/// be changed after a plan is built, which is how the rebinding tests move a name.
#[derive(Debug, Default)]
pub struct MapResolver {
    map: Mutex<HashMap<(String, u16), Vec<SocketAddr>>>,
    asked: Mutex<u64>,
}

impl MapResolver {
    /// An empty map: every name fails to resolve.
    pub fn new() -> Self {
        MapResolver::default()
    }

    /// Answer `host:port` with `addrs` from now on (replacing an earlier answer).
    pub fn insert(&self, host: &str, port: u16, addrs: Vec<SocketAddr>) {
        if let Ok(mut m) = self.map.lock() {
            m.insert((host.to_ascii_lowercase(), port), addrs);
        }
    }

    /// How many times the map was asked (a proxy that resolved at request time would show here).
    pub fn times_asked(&self) -> u64 {
        self.asked.lock().map(|n| *n).unwrap_or(0)
    }
}

impl Resolver for MapResolver {
    fn resolve(&self, host: &str, port: u16) -> io::Result<Vec<SocketAddr>> {
        if let Ok(mut n) = self.asked.lock() {
            *n += 1;
        }
        let map = self
            .map
            .lock()
            .map_err(|_| io::Error::other("resolver map poisoned"))?;
        map.get(&(host.to_ascii_lowercase(), port))
            .cloned()
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("{host}:{port} is not in the map"),
                )
            })
    }
}

/// Why an address may not be pinned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressRefusal {
    /// `0.0.0.0/8` or `::`: dialing it reaches the host itself.
    Unspecified,
    /// `127.0.0.0/8` or `::1` (refused unless the rules allow loopback).
    Loopback,
    /// Link-local, where metadata services live.
    LinkLocal,
    /// Multicast, broadcast or reserved: never a unicast destination.
    NotUnicast,
    /// One of the host's own interface addresses.
    HostOwn,
}

impl AddressRefusal {
    /// Why, in words.
    pub fn as_str(self) -> &'static str {
        match self {
            AddressRefusal::Unspecified => "the unspecified address (reaches the host itself)",
            AddressRefusal::Loopback => "a loopback address (the host's own services)",
            AddressRefusal::LinkLocal => "a link-local address (metadata services live there)",
            AddressRefusal::NotUnicast => "not a unicast address",
            AddressRefusal::HostOwn => "one of the host's own interface addresses",
        }
    }
}

/// Which addresses a pinned destination may have.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddressRules {
    allow_loopback: bool,
    host_own: Vec<IpAddr>,
}

impl AddressRules {
    /// The rules every real run uses: loopback and the host's own interface addresses refused,
    /// besides the always-refused kinds. Fails when the host's addresses cannot be listed.
    pub fn production() -> io::Result<Self> {
        Ok(AddressRules {
            allow_loopback: false,
            host_own: host_interface_addresses()?,
        })
    }

    /// Rules that let a destination resolve to loopback, for tests whose stand-in upstreams listen
    /// on 127.0.0.1. Never used by a real run; the name says so at every call site.
    pub fn allowing_loopback() -> Self {
        AddressRules {
            allow_loopback: true,
            host_own: Vec::new(),
        }
    }

    /// Whether loopback destinations are allowed.
    pub fn allows_loopback(&self) -> bool {
        self.allow_loopback
    }

    /// Check one address.
    pub fn check(&self, ip: IpAddr) -> Result<(), AddressRefusal> {
        let ip = canonical(ip);
        if let Some(r) = always_refused(ip) {
            return Err(r);
        }
        if ip.is_loopback() && !self.allow_loopback {
            return Err(AddressRefusal::Loopback);
        }
        if self.host_own.iter().any(|own| canonical(*own) == ip) && !ip.is_loopback() {
            return Err(AddressRefusal::HostOwn);
        }
        Ok(())
    }
}

/// An IPv4-mapped IPv6 address as the IPv4 address it carries.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        v4 => v4,
    }
}

fn always_refused(ip: IpAddr) -> Option<AddressRefusal> {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            if a == 0 {
                Some(AddressRefusal::Unspecified)
            } else if a == 169 && b == 254 {
                Some(AddressRefusal::LinkLocal)
            } else if v4.is_multicast() || v4 == Ipv4Addr::BROADCAST || a >= 240 {
                Some(AddressRefusal::NotUnicast)
            } else {
                None
            }
        }
        IpAddr::V6(v6) => {
            let seg0 = v6.segments()[0];
            if v6 == Ipv6Addr::UNSPECIFIED {
                Some(AddressRefusal::Unspecified)
            } else if seg0 & 0xffc0 == 0xfe80 {
                Some(AddressRefusal::LinkLocal)
            } else if v6.is_multicast() {
                Some(AddressRefusal::NotUnicast)
            } else if let Some(v4) = v6.to_ipv4() {
                // IPv4-compatible (deprecated `::a.b.c.d`): judge the carried address too.
                if v6.segments()[..6].iter().all(|s| *s == 0) && !v6.is_loopback() {
                    always_refused(IpAddr::V4(v4))
                } else {
                    None
                }
            } else {
                None
            }
        }
    }
}

/// The addresses assigned to this host's interfaces (`getifaddrs`).
fn host_interface_addresses() -> io::Result<Vec<IpAddr>> {
    h5i_sys::netif::addresses()
}

/// A destination's pinned addresses, or why it has none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pinned {
    /// Usable addresses, in the resolver's order.
    Addrs(Vec<SocketAddr>),
    /// Nothing usable: the reason, in words.
    Unusable(String),
}

/// Resolve `host:port` once and keep only the addresses the rules allow. A dotted IPv4 host is
/// its own answer (the resolver is not asked).
pub fn pin(host: &str, port: u16, resolver: &dyn Resolver, rules: &AddressRules) -> Pinned {
    let answer = match host.parse::<IpAddr>() {
        Ok(ip) => vec![SocketAddr::new(ip, port)],
        Err(_) => match resolver.resolve(host, port) {
            Ok(a) if a.is_empty() => {
                return Pinned::Unusable(format!("{host} resolved to no address"))
            }
            Ok(a) => a,
            Err(e) => return Pinned::Unusable(format!("{host} did not resolve: {e}")),
        },
    };
    let mut usable = Vec::new();
    let mut refused = Vec::new();
    for a in answer {
        match rules.check(a.ip()) {
            Ok(()) => {
                if !usable.contains(&a) {
                    usable.push(a)
                }
            }
            Err(r) => refused.push(format!("{} is {}", a.ip(), r.as_str())),
        }
    }
    if usable.is_empty() {
        Pinned::Unusable(format!(
            "every address of {host} is refused: {}",
            refused.join("; ")
        ))
    } else {
        Pinned::Addrs(usable)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn always_refused_kinds_stay_refused_even_allowing_loopback() {
        let r = AddressRules::allowing_loopback();
        for (a, why) in [
            ("0.0.0.0", AddressRefusal::Unspecified),
            ("0.1.2.3", AddressRefusal::Unspecified),
            ("::", AddressRefusal::Unspecified),
            ("::ffff:0.0.0.0", AddressRefusal::Unspecified),
            ("169.254.169.254", AddressRefusal::LinkLocal),
            ("::ffff:169.254.169.254", AddressRefusal::LinkLocal),
            ("fe80::1", AddressRefusal::LinkLocal),
            ("224.0.0.1", AddressRefusal::NotUnicast),
            ("255.255.255.255", AddressRefusal::NotUnicast),
            ("240.0.0.1", AddressRefusal::NotUnicast),
            ("ff02::1", AddressRefusal::NotUnicast),
        ] {
            assert_eq!(r.check(ip(a)), Err(why), "{a}");
        }
        assert_eq!(r.check(ip("127.0.0.1")), Ok(()));
        assert_eq!(r.check(ip("198.18.0.5")), Ok(()));
    }

    #[test]
    fn production_rules_refuse_loopback_in_every_spelling() {
        let r = AddressRules::production().unwrap();
        for a in ["127.0.0.1", "127.255.0.9", "::1", "::ffff:127.0.0.1"] {
            assert_eq!(r.check(ip(a)), Err(AddressRefusal::Loopback), "{a}");
        }
        assert_eq!(r.check(ip("198.18.0.5")), Ok(()));
    }

    #[test]
    fn pin_keeps_only_allowed_addresses_and_never_asks_for_a_literal() {
        let m = MapResolver::new();
        m.insert(
            "mixed.test",
            443,
            vec![
                "127.0.0.1:443".parse().unwrap(),
                "198.18.0.9:443".parse().unwrap(),
            ],
        );
        let prod = AddressRules {
            allow_loopback: false,
            host_own: vec![],
        };
        assert_eq!(
            pin("mixed.test", 443, &m, &prod),
            Pinned::Addrs(vec!["198.18.0.9:443".parse().unwrap()])
        );
        assert!(matches!(
            pin("198.18.0.1", 80, &m, &prod),
            Pinned::Addrs(a) if a == vec!["198.18.0.1:80".parse().unwrap()]
        ));
        assert_eq!(m.times_asked(), 1);
        assert!(matches!(
            pin("nope.test", 443, &m, &prod),
            Pinned::Unusable(_)
        ));
    }
}
