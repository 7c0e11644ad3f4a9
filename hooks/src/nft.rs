//! The supervised box's nftables table, as text, and the tally read back from it. Pure.
//!
//! Owns [`render`]: from the pinned rules to the `nft -f` script loaded inside the box's network
//! namespace, and [`tally`]: from `nft -j list table inet h5i` back to an [`EgressTally`]. The
//! table (`inet h5i`), measured against nftables 1.0.6:
//! - output, default drop: accept `lo`; accept `ct state established,related`; accept the
//!   IPv6 neighbour-discovery messages the link itself needs (they end at slirp4netns); per
//!   pinned rule `ip[6] daddr {addrs} tcp dport PORT ct state new counter accept` (TCP only);
//!   link-scope IPv6 multicast (`ff02::/16`: MLD reports) is dropped uncounted, since it never
//!   leaves the link;
//!   everything else is added to a dynamic set keyed `daddr . l4proto . dport` (with a counter
//!   per element; port 0 for protocols without ports) and then rejected with
//!   `icmpx admin-prohibited`, so a refused TCP connect fails at once with `EHOSTUNREACH` (a
//!   refused UDP send fails with `EPERM`) instead of hanging. slirp4netns's DNS (10.0.2.3) and
//!   gateway (10.0.2.2, the host) are never pinned (`egress` refuses them), so they are refused
//!   like every other destination.
//! - input, default drop: accept `lo`, established/related and neighbour discovery; nothing
//!   outside can open a connection in.
//!
//! Counting: an allowed rule's counter counts the packets that opened a connection (a SYN
//! retransmission counts again); a denied key counts refused packets (one per refused connect,
//! since the immediate reject stops retries; one per UDP datagram). The sets hold at most
//! [`DENIED_SET_SIZE`] keys each; attempts beyond that are still refused and counted by the final
//! rule's counter, and the tally shows them under [`UNRECORDED_KEY`].
//!
//! Must never: accept anything not listed above, depend on anything but its input (the digest
//! compares runs), or report a count the table did not hold.
//!
//! Guarded by the unit tests below and `hooks/tests/supervised_net.rs`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::IpAddr;

use h5i_policy::receipt::{EgressTally, PinnedRule};
use serde_json::Value;

/// The table's family and name, as `nft` spells them.
pub const TABLE: &str = "inet h5i";
/// [`TABLE`]'s family, alone (nft's JSON names the two apart).
const TABLE_FAMILY: &str = "inet";
/// [`TABLE`]'s name, alone.
const TABLE_NAME: &str = "h5i";
/// Distinct denied keys kept per address family.
pub const DENIED_SET_SIZE: u32 = 4096;
/// The denied-tally key for refusals the sets had no room to key.
pub const UNRECORDED_KEY: &str = "*:*/*";
/// Protocols whose transport header carries a destination port.
const PORTED: &str = "{ tcp, udp, udplite, sctp, dccp }";
const DENIED_COMMENT: &str = "h5i-denied";
const ALLOW_COMMENT: &str = "h5i-allow-";

/// Why the table's counters could not be read.
#[derive(Debug, thiserror::Error)]
pub enum TallyError {
    /// `nft -j` output was not the JSON expected.
    #[error("refusing: cannot read the table's counters: {0}; to fix: report this as an h5i bug (nft's JSON output changed?)")]
    Json(String),
}

/// `script` (a [`render`]ed table) as a replacement of the table in force: one transaction that
/// deletes the old table and adds the new one, so no packet ever meets a half-made table, and
/// every counter and denied set of the new one starts at zero.
pub fn replace(script: &str) -> String {
    format!("delete table {TABLE}\n{script}")
}

/// The `nft -f` script for `rules`. Addresses must already be checked (`egress::pin`).
pub fn render(rules: &[PinnedRule]) -> String {
    let mut s = String::new();
    s.push_str("table inet h5i {\n");
    for (name, ty) in [("denied4", "ipv4_addr"), ("denied6", "ipv6_addr")] {
        let _ = write!(
            s,
            "  set {name} {{\n    type {ty} . inet_proto . inet_service\n    flags dynamic\n    counter\n    size {DENIED_SET_SIZE}\n  }}\n"
        );
    }
    s.push_str("  chain output {\n    type filter hook output priority filter; policy drop;\n");
    s.push_str("    oif \"lo\" accept\n    ct state established,related accept\n");
    s.push_str(
        "    icmpv6 type { nd-router-solicit, nd-neighbor-solicit, nd-neighbor-advert } accept\n",
    );
    // Link-scope multicast (MLD reports and the like) never leaves the link: dropped, and not
    // counted as an egress attempt.
    s.push_str("    ip6 daddr ff02::/16 drop\n");
    for (i, rule) in rules.iter().enumerate() {
        let (v4, v6): (Vec<IpAddr>, Vec<IpAddr>) = rule
            .addrs
            .iter()
            .filter_map(|a| a.parse::<IpAddr>().ok())
            .partition(IpAddr::is_ipv4);
        for (family, addrs) in [("ip", v4), ("ip6", v6)] {
            if addrs.is_empty() {
                continue;
            }
            let list: Vec<String> = addrs.iter().map(ToString::to_string).collect();
            let _ = writeln!(
                s,
                "    {family} daddr {{ {} }} tcp dport {} ct state new counter accept comment \"{ALLOW_COMMENT}{i}\"",
                list.join(", "),
                rule.port
            );
        }
    }
    for (nfproto, set, daddr) in [
        ("ipv4", "denied4", "ip daddr"),
        ("ipv6", "denied6", "ip6 daddr"),
    ] {
        let _ = writeln!(
            s,
            "    meta nfproto {nfproto} meta l4proto {PORTED} add @{set} {{ {daddr} . meta l4proto . th dport }}"
        );
        let _ = writeln!(
            s,
            "    meta nfproto {nfproto} meta l4proto != {PORTED} add @{set} {{ {daddr} . meta l4proto . 0 }}"
        );
    }
    let _ = writeln!(
        s,
        "    counter reject with icmpx admin-prohibited comment \"{DENIED_COMMENT}\""
    );
    s.push_str("  }\n  chain input {\n    type filter hook input priority filter; policy drop;\n");
    s.push_str("    iif \"lo\" accept\n    ct state established,related accept\n");
    s.push_str(
        "    icmpv6 type { nd-router-advert, nd-neighbor-solicit, nd-neighbor-advert } accept\n",
    );
    s.push_str("  }\n}\n");
    s
}

/// The JSON request for what `nft -j list table inet h5i` prints, for an `nft -j -f -` that was
/// started earlier and waits on its stdin (the sentry's counter reader).
///
/// JSON, not the text command: nftables 1.0.6 with `-j -f -` hands stdin to its JSON parser
/// first, which consumes it; a text command then reaches the text parser as an empty input, and
/// nft exits 0 having printed nothing (measured). [`tally`] refuses an empty listing either way.
pub fn list_request() -> String {
    serde_json::json!({"nftables": [{"list": {"table": {"family": TABLE_FAMILY, "name": TABLE_NAME}}}]})
        .to_string()
}

/// `sha256:<hex>` of the script as loaded.
pub fn digest(script: &str) -> String {
    h5i_policy::resolved::PolicyDigest::of(script.as_bytes())
        .as_str()
        .to_string()
}

/// Whether any pinned address is IPv6 (the uplink then needs IPv6 too).
pub fn needs_ipv6(rules: &[PinnedRule]) -> bool {
    rules
        .iter()
        .flat_map(|r| &r.addrs)
        .any(|a| a.parse::<IpAddr>().is_ok_and(|ip| ip.is_ipv6()))
}

/// The tally from `nft -j list table inet h5i` output: allowed connections per `host:port`
/// (every pinned rule appears, with 0 when unused) and denied attempts per
/// `address:port/proto` (IPv6 addresses in brackets).
pub fn tally(json: &[u8], rules: &[PinnedRule]) -> Result<EgressTally, TallyError> {
    let doc: Value = serde_json::from_slice(json).map_err(|e| TallyError::Json(e.to_string()))?;
    let items = doc
        .get("nftables")
        .and_then(Value::as_array)
        .ok_or_else(|| TallyError::Json("no \"nftables\" array".into()))?;
    let mut allowed: BTreeMap<String, u64> = rules
        .iter()
        .map(|r| (format!("{}:{}", r.host, r.port), 0))
        .collect();
    let mut denied = BTreeMap::new();
    let mut denied_total = None;
    let mut keyed = 0u64;
    for item in items {
        if let Some(rule) = item.get("rule") {
            let comment = rule.get("comment").and_then(Value::as_str).unwrap_or("");
            let packets = rule_packets(rule);
            if let Some(i) = comment.strip_prefix(ALLOW_COMMENT) {
                let i: usize = i
                    .parse()
                    .map_err(|_| TallyError::Json(format!("rule comment {comment:?}")))?;
                let r = rules
                    .get(i)
                    .ok_or_else(|| TallyError::Json(format!("rule comment {comment:?}")))?;
                *allowed.entry(format!("{}:{}", r.host, r.port)).or_default() +=
                    packets.unwrap_or(0);
            } else if comment == DENIED_COMMENT {
                denied_total = packets;
            }
        } else if let Some(set) = item.get("set") {
            let name = set.get("name").and_then(Value::as_str).unwrap_or("");
            if name != "denied4" && name != "denied6" {
                continue;
            }
            for elem in set
                .get("elem")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let (key, packets) = denied_element(elem)?;
                keyed += packets;
                *denied.entry(key).or_default() += packets;
            }
        }
    }
    let total = denied_total
        .ok_or_else(|| TallyError::Json("no counter on the final reject rule".into()))?;
    if total > keyed {
        denied.insert(UNRECORDED_KEY.to_string(), total - keyed);
    }
    Ok(EgressTally {
        allowed,
        denied,
        uncounted: None,
    })
}

fn rule_packets(rule: &Value) -> Option<u64> {
    rule.get("expr")?
        .as_array()?
        .iter()
        .find_map(|e| e.get("counter")?.get("packets")?.as_u64())
}

fn denied_element(elem: &Value) -> Result<(String, u64), TallyError> {
    let bad = || TallyError::Json(format!("set element {elem}"));
    let inner = elem.get("elem").ok_or_else(bad)?;
    let parts = inner
        .get("val")
        .and_then(|v| v.get("concat"))
        .and_then(Value::as_array)
        .ok_or_else(bad)?;
    let [addr, proto, port] = parts.as_slice() else {
        return Err(bad());
    };
    let addr: IpAddr = addr.as_str().and_then(|a| a.parse().ok()).ok_or_else(bad)?;
    let proto = match proto {
        Value::String(s) => s.clone(),
        Value::Number(n) => format!("proto-{n}"),
        _ => return Err(bad()),
    };
    let port = port.as_u64().ok_or_else(bad)?;
    let packets = inner
        .get("counter")
        .and_then(|c| c.get("packets"))
        .and_then(Value::as_u64)
        .ok_or_else(bad)?;
    let addr = match addr {
        IpAddr::V4(a) => a.to_string(),
        IpAddr::V6(a) => format!("[{a}]"),
    };
    Ok((format!("{addr}:{port}/{proto}"), packets))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn rules() -> Vec<PinnedRule> {
        vec![
            PinnedRule {
                host: "api.test".into(),
                port: 443,
                addrs: vec!["198.18.0.2".into(), "2001:db8::2".into()],
            },
            PinnedRule {
                host: "git.test".into(),
                port: 22,
                addrs: vec!["198.18.0.7".into()],
            },
        ]
    }

    /// The table's accepting lines: everything that can let a packet out or in.
    fn accepts(script: &str) -> Vec<&str> {
        script
            .lines()
            .map(str::trim)
            .filter(|l| l.contains("accept"))
            .collect()
    }

    #[test]
    fn the_table_accepts_exactly_lo_established_nd_and_the_pinned_tcp_ports() {
        let s = render(&rules());
        assert_eq!(
            accepts(&s),
            vec![
                "oif \"lo\" accept",
                "ct state established,related accept",
                "icmpv6 type { nd-router-solicit, nd-neighbor-solicit, nd-neighbor-advert } accept",
                "ip daddr { 198.18.0.2 } tcp dport 443 ct state new counter accept comment \"h5i-allow-0\"",
                "ip6 daddr { 2001:db8::2 } tcp dport 443 ct state new counter accept comment \"h5i-allow-0\"",
                "ip daddr { 198.18.0.7 } tcp dport 22 ct state new counter accept comment \"h5i-allow-1\"",
                "iif \"lo\" accept",
                "ct state established,related accept",
                "icmpv6 type { nd-router-advert, nd-neighbor-solicit, nd-neighbor-advert } accept",
            ]
        );
        assert_eq!(s.matches("policy drop;").count(), 2);
        assert!(s.contains("counter reject with icmpx admin-prohibited"));
        assert!(s.contains("ip6 daddr ff02::/16 drop"));
        assert!(!s.contains("udp dport"), "no UDP is ever accepted");
    }

    #[test]
    fn deny_all_has_no_pinned_rule_and_still_counts() {
        let s = render(&[]);
        assert_eq!(accepts(&s).len(), 6);
        assert!(s.contains("add @denied4 { ip daddr . meta l4proto . th dport }"));
        assert!(s.contains("add @denied6 { ip6 daddr . meta l4proto . 0 }"));
    }

    #[test]
    fn the_digest_is_of_the_script_and_stable() {
        let a = render(&rules());
        assert_eq!(digest(&a), digest(&render(&rules())));
        assert!(digest(&a).starts_with("sha256:") && digest(&a).len() == 7 + 64);
        assert_ne!(digest(&a), digest(&render(&rules()[..1])));
        assert!(needs_ipv6(&rules()) && !needs_ipv6(&rules()[1..]));
    }

    /// `nft -j list table inet h5i` as nftables 1.0.6 printed it for a box that made two
    /// allowed connections, two refused connects and a UDP send (trimmed to what is read).
    const LISTED: &str = r#"{"nftables": [{"metainfo": {"version": "1.0.6", "json_schema_version": 1}},
      {"table": {"family": "inet", "name": "h5i", "handle": 1}},
      {"set": {"family": "inet", "name": "denied4", "table": "h5i", "type": ["ipv4_addr", "inet_proto", "inet_service"], "handle": 3, "size": 4096,
        "elem": [{"elem": {"val": {"concat": ["198.18.0.2", "tcp", 9090]}, "counter": {"packets": 1, "bytes": 60}}},
                 {"elem": {"val": {"concat": ["198.18.0.3", "tcp", 443]}, "counter": {"packets": 1, "bytes": 60}}},
                 {"elem": {"val": {"concat": ["198.18.0.2", "udp", 53]}, "counter": {"packets": 1, "bytes": 29}}}]}},
      {"set": {"family": "inet", "name": "denied6", "table": "h5i", "type": ["ipv6_addr", "inet_proto", "inet_service"], "handle": 4, "size": 4096,
        "elem": [{"elem": {"val": {"concat": ["2001:db8::9", "ipv6-icmp", 0]}, "counter": {"packets": 2, "bytes": 128}}}]}},
      {"rule": {"family": "inet", "table": "h5i", "chain": "output", "handle": 9, "comment": "h5i-allow-0",
        "expr": [{"match": {"op": "==", "left": {"payload": {"protocol": "ip", "field": "daddr"}}, "right": "198.18.0.2"}},
                 {"counter": {"packets": 2, "bytes": 120}}, {"accept": null}]}},
      {"rule": {"family": "inet", "table": "h5i", "chain": "output", "handle": 10, "comment": "h5i-allow-0",
        "expr": [{"counter": {"packets": 1, "bytes": 80}}, {"accept": null}]}},
      {"rule": {"family": "inet", "table": "h5i", "chain": "output", "handle": 14, "comment": "h5i-denied",
        "expr": [{"counter": {"packets": 7, "bytes": 400}}, {"reject": {"type": "icmpx", "expr": "admin-prohibited"}}]}}]}"#;

    #[test]
    fn the_tally_reads_rule_counters_and_set_elements() {
        let t = tally(LISTED.as_bytes(), &rules()).unwrap();
        assert_eq!(
            t.allowed,
            BTreeMap::from([("api.test:443".into(), 3), ("git.test:22".into(), 0)])
        );
        assert_eq!(
            t.denied,
            BTreeMap::from([
                ("198.18.0.2:9090/tcp".into(), 1),
                ("198.18.0.3:443/tcp".into(), 1),
                ("198.18.0.2:53/udp".into(), 1),
                ("[2001:db8::9]:0/ipv6-icmp".into(), 2),
                (UNRECORDED_KEY.into(), 2),
            ])
        );
    }

    #[test]
    fn the_list_request_names_the_table_in_nfts_json_grammar() {
        let v: Value = serde_json::from_str(&list_request()).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"nftables": [{"list": {"table": {"family": "inet", "name": "h5i"}}}]})
        );
        assert_eq!(TABLE, format!("{TABLE_FAMILY} {TABLE_NAME}"));
        assert!(list_request().len() < 4096, "one pipe write");
    }

    #[test]
    fn an_empty_listing_is_refused() {
        assert!(tally(b"", &rules()).is_err());
    }

    #[test]
    fn a_listing_that_is_not_the_table_is_refused() {
        assert!(tally(b"not json", &rules()).is_err());
        assert!(tally(br#"{"nftables": []}"#, &rules()).is_err());
        let foreign = LISTED.replace("h5i-allow-0", "h5i-allow-7");
        assert!(tally(foreign.as_bytes(), &rules()).is_err());
    }
}
