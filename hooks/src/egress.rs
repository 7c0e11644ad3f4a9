//! The supervised tier's egress request (`h5i.net.egress`) and its pinning into the rules the
//! nftables table is rendered from.
//!
//! Owns the annotation's shape — a JSON array of `{"host": NAME, "port": N, "addrs": [IP...]}`,
//! `addrs` optional — and the step that turns it into [`PinnedRule`]s: given addresses are
//! checked, missing ones are resolved once, at sentry start, through the broker's
//! [`Resolver`] seam (production: the host's resolver). Every address must pass the broker's
//! [`AddressRules`] and must not fall inside an uplink's own network: pasta's
//! (`10.0.2.0/24`, `fd00::/64`: the box's addresses and gateway there are pasta's, and the
//! host's own IPv6 network here is `fd00::/64`) or the veth pairs' range (`100.127.0.0/16`: the host sides are the host's, the box sides
//! other boxes).
//!
//! Must never: resolve a name later than sentry start (a name that re-resolves elsewhere must
//! not widen the table), accept an address the rules refuse, or let a malformed request through
//! as "no egress" (it is refused; an empty array is the way to say deny-all).
//!
//! Guarded by the unit tests below and `hooks/tests/supervised_net.rs`.

use std::collections::BTreeMap;
use std::net::IpAddr;

use h5i_broker::pin::{AddressRules, Resolver};
use h5i_policy::receipt::PinnedRule;
use serde::{Deserialize, Serialize};

/// Longest host name accepted (DNS's limit).
const MAX_HOST: usize = 253;
/// Most destinations one run may pin.
const MAX_RULES: usize = 256;
/// Most addresses one destination may pin.
const MAX_ADDRS: usize = 64;

/// Why the egress request was refused.
#[derive(Debug, thiserror::Error)]
pub enum EgressError {
    /// Not the annotation's JSON shape.
    #[error("refusing: h5i.net.egress is not a JSON array of {{\"host\",\"port\",\"addrs\"}}: {0}; to fix: write it as [{{\"host\":\"api.example.com\",\"port\":443}}] ([] denies all egress)")]
    Shape(String),
    /// A destination's host name is not one.
    #[error("refusing: h5i.net.egress names host {0:?}, which is not a host name or address; to fix: use a DNS name or an IP address")]
    Host(String),
    /// Port 0.
    #[error("refusing: h5i.net.egress gives {0} port 0; to fix: give the TCP port to allow")]
    Port(String),
    /// Too many destinations or addresses.
    #[error("refusing: h5i.net.egress is too large ({0}); to fix: allow at most {MAX_RULES} destinations of at most {MAX_ADDRS} addresses each")]
    TooLarge(String),
    /// A given address does not parse.
    #[error("refusing: h5i.net.egress gives {host}:{port} the address {addr:?}, which is not an IP address; to fix: give addresses as text (198.18.0.2, 2001:db8::1)")]
    Addr {
        /// The destination's host.
        host: String,
        /// Its port.
        port: u16,
        /// The text given.
        addr: String,
    },
    /// An address the rules refuse.
    #[error("refusing: {host}:{port} pins {addr}, which is {why}; to fix: allow only destinations outside the host and its uplink")]
    Refused {
        /// The destination's host.
        host: String,
        /// Its port.
        port: u16,
        /// The refused address.
        addr: IpAddr,
        /// Why, in words.
        why: &'static str,
    },
    /// A name without addresses did not resolve to any usable address.
    #[error("refusing: cannot pin {host}:{port}: {reason}; to fix: check the name resolves on the host, or give its addresses in h5i.net.egress")]
    Unresolved {
        /// The destination's host.
        host: String,
        /// Its port.
        port: u16,
        /// The resolver's or the rules' answer.
        reason: String,
    },
}

/// One destination as the annotation states it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EgressRequest {
    /// The name (or address literal) as the policy wrote it.
    pub host: String,
    /// The TCP port.
    pub port: u16,
    /// The addresses to pin; absent: the sentry resolves `host` once at start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub addrs: Option<Vec<String>>,
}

/// Parse `h5i.net.egress`. Absent means deny-all (the safe reading of "nothing granted").
pub fn parse(annotation: Option<&str>) -> Result<Vec<EgressRequest>, EgressError> {
    let Some(text) = annotation else {
        return Ok(Vec::new());
    };
    let reqs: Vec<EgressRequest> =
        serde_json::from_str(text).map_err(|e| EgressError::Shape(e.to_string()))?;
    if reqs.len() > MAX_RULES {
        return Err(EgressError::TooLarge(format!(
            "{} destinations",
            reqs.len()
        )));
    }
    for r in &reqs {
        if !is_host_name(&r.host) && r.host.parse::<IpAddr>().is_err() {
            return Err(EgressError::Host(r.host.clone()));
        }
        if r.port == 0 {
            return Err(EgressError::Port(r.host.clone()));
        }
        if r.addrs.as_ref().is_some_and(|a| a.len() > MAX_ADDRS) {
            return Err(EgressError::TooLarge(format!("{} addresses", r.host)));
        }
    }
    Ok(reqs)
}

fn is_host_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_HOST
        && s.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

/// The unprivileged uplink's own network (pasta's, as `uplink.rs` configures it): the box's
/// address and its gateway.
fn in_uplink_network(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            matches!(v4.octets(), [10, 0, 2, _]) || v4.octets()[..2] == crate::veth::RANGE
        }
        IpAddr::V6(v6) => {
            let s = v6.segments();
            s[0] == 0xfd00 && s[1..4] == [0, 0, 0]
        }
    }
}

fn check(rules: &AddressRules, host: &str, port: u16, addr: IpAddr) -> Result<(), EgressError> {
    let refused = |why| EgressError::Refused {
        host: host.to_string(),
        port,
        addr,
        why,
    };
    if in_uplink_network(addr) {
        return Err(refused(
            "inside an uplink's own network (pasta's 10.0.2.0/24 and fd00::/64, the veth pairs' 100.127.0.0/16)",
        ));
    }
    rules.check(addr).map_err(|r| refused(r.as_str()))
}

/// Pin every request: check given addresses, resolve missing ones once. The result is sorted
/// by host then port, one rule per (host, port) with its addresses merged and sorted, so the
/// same request always renders the same table.
pub fn pin(
    reqs: &[EgressRequest],
    resolver: &dyn Resolver,
    rules: &AddressRules,
) -> Result<Vec<PinnedRule>, EgressError> {
    let mut merged: BTreeMap<(String, u16), Vec<IpAddr>> = BTreeMap::new();
    for r in reqs {
        let addrs: Vec<IpAddr> = match &r.addrs {
            Some(given) => given
                .iter()
                .map(|a| {
                    a.parse::<IpAddr>().map_err(|_| EgressError::Addr {
                        host: r.host.clone(),
                        port: r.port,
                        addr: a.clone(),
                    })
                })
                .collect::<Result<_, _>>()?,
            None => match h5i_broker::pin::pin(&r.host, r.port, resolver, rules) {
                h5i_broker::pin::Pinned::Addrs(a) => a.iter().map(|s| s.ip()).collect(),
                h5i_broker::pin::Pinned::Unusable(reason) => {
                    return Err(EgressError::Unresolved {
                        host: r.host.clone(),
                        port: r.port,
                        reason,
                    })
                }
            },
        };
        for a in &addrs {
            check(rules, &r.host, r.port, *a)?;
        }
        let slot = merged.entry((r.host.clone(), r.port)).or_default();
        slot.extend(addrs);
    }
    Ok(merged
        .into_iter()
        .map(|((host, port), mut addrs)| {
            let mut mapped: Vec<IpAddr> = addrs
                .drain(..)
                .map(|a| match a {
                    IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(a, IpAddr::V4),
                    v4 => v4,
                })
                .collect();
            mapped.sort();
            mapped.dedup();
            PinnedRule {
                host,
                port,
                addrs: mapped.iter().map(ToString::to_string).collect(),
            }
        })
        .collect())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use h5i_broker::pin::MapResolver;

    #[test]
    fn absent_and_empty_mean_deny_all_and_malformed_is_refused() {
        assert!(parse(None).unwrap().is_empty());
        assert!(parse(Some("[]")).unwrap().is_empty());
        for bad in [
            "",
            "{}",
            r#"[{"host":"a.test"}]"#,
            r#"[{"host":"a.test","port":0}]"#,
            r#"[{"host":"a.test","port":70000}]"#,
            r#"[{"host":"a b","port":1}]"#,
            r#"[{"host":"-a.test","port":1}]"#,
            r#"[{"host":"a.test","port":1,"proto":"udp"}]"#,
            r#"[{"host":"","port":1}]"#,
        ] {
            assert!(parse(Some(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn given_addresses_are_checked_merged_and_sorted() {
        let reqs = parse(Some(
            r#"[{"host":"b.test","port":443,"addrs":["198.18.0.9","198.18.0.2"]},
                {"host":"a.test","port":80,"addrs":["2001:db8::1"]},
                {"host":"b.test","port":443,"addrs":["198.18.0.2","::ffff:198.18.0.3"]}]"#,
        ))
        .unwrap();
        let m = MapResolver::new();
        let rules = pin(&reqs, &m, &AddressRules::allowing_loopback()).unwrap();
        assert_eq!(
            rules,
            vec![
                PinnedRule {
                    host: "a.test".into(),
                    port: 80,
                    addrs: vec!["2001:db8::1".into()]
                },
                PinnedRule {
                    host: "b.test".into(),
                    port: 443,
                    addrs: vec![
                        "198.18.0.2".into(),
                        "198.18.0.3".into(),
                        "198.18.0.9".into()
                    ]
                },
            ]
        );
        assert_eq!(m.times_asked(), 0, "given addresses are never re-resolved");
    }

    #[test]
    fn a_name_without_addresses_is_resolved_once_and_checked() {
        let m = MapResolver::new();
        m.insert("api.test", 443, vec!["198.18.0.2:443".parse().unwrap()]);
        let reqs = parse(Some(r#"[{"host":"api.test","port":443}]"#)).unwrap();
        let rules = pin(&reqs, &m, &AddressRules::allowing_loopback()).unwrap();
        assert_eq!(rules[0].addrs, vec!["198.18.0.2".to_string()]);
        assert_eq!(m.times_asked(), 1);
        let unknown = parse(Some(r#"[{"host":"nope.test","port":443}]"#)).unwrap();
        assert!(matches!(
            pin(&unknown, &m, &AddressRules::allowing_loopback()),
            Err(EgressError::Unresolved { .. })
        ));
    }

    #[test]
    fn addresses_that_reach_the_host_or_the_uplink_are_refused() {
        let m = MapResolver::new();
        let prod = AddressRules::production().unwrap();
        for addr in [
            "127.0.0.1",
            "0.0.0.0",
            "169.254.169.254",
            "10.0.2.2",
            "10.0.2.3",
            "100.127.0.0",
            "100.127.3.1",
            "fd00::2",
            "::1",
            "224.0.0.1",
        ] {
            let reqs = vec![EgressRequest {
                host: "x.test".into(),
                port: 443,
                addrs: Some(vec![addr.into()]),
            }];
            assert!(
                matches!(pin(&reqs, &m, &prod), Err(EgressError::Refused { .. })),
                "{addr}"
            );
        }
        let not_ip = vec![EgressRequest {
            host: "x.test".into(),
            port: 443,
            addrs: Some(vec!["x.test".into()]),
        }];
        assert!(matches!(
            pin(&not_ip, &m, &prod),
            Err(EgressError::Addr { .. })
        ));
    }
}
