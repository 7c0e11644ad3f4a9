//! The supervised box's nftables table, as text. Pure.
//!
//! Owns [`render`]: from the pinned rules to the `nft -f` script loaded inside the box's network
//! namespace, and the comments by which `nft_counters` reads its counters back. The
//! table (`inet h5i`), measured against nftables 1.0.6:
//! - output, default drop: accept `lo`; accept `ct state established,related`; accept the
//!   IPv6 neighbour-discovery messages the link itself needs (they end at the uplink); per
//!   pinned rule `ip[6] daddr {addrs} tcp dport PORT ct state new counter accept` (TCP only);
//!   link-scope IPv6 multicast (`ff02::/16`: MLD reports) is dropped uncounted, since it never
//!   leaves the link;
//!   everything else is added to a dynamic set keyed `daddr . l4proto . dport` (with a counter
//!   per element; port 0 for protocols without ports) and then rejected with
//!   `icmpx admin-prohibited`, so a refused TCP connect fails at once with `EHOSTUNREACH` (a
//!   refused UDP send fails with `EPERM`) instead of hanging. The unprivileged uplink's own
//!   network (10.0.2.0/24: its gateway 10.0.2.2, the old DNS forwarder's 10.0.2.3) is never
//!   pinned (`egress` refuses it), so it is refused like every other destination.
//! - input, default drop: accept `lo`, established/related and neighbour discovery; nothing
//!   outside can open a connection in.
//!
//! Counting: an allowed rule's counter counts the packets that opened a connection (a SYN
//! retransmission counts again); a denied key counts refused packets (one per refused connect,
//! since the immediate reject stops retries; one per UDP datagram). The sets hold at most
//! [`DENIED_SET_SIZE`] keys each; attempts beyond that are still refused and counted by the final
//! rule's counter, and the tally (`nft_counters::tally`) shows them under [`UNRECORDED_KEY`].
//!
//! Must never: accept anything not listed above, depend on anything but its input (the digest
//! compares runs), or report a count the table did not hold.
//!
//! Guarded by the unit tests below and `hooks/tests/supervised_net.rs`.

use std::fmt::Write as _;
use std::net::IpAddr;

use h5i_policy::receipt::PinnedRule;

/// The table's family and name, as `nft` spells them.
pub const TABLE: &str = "inet h5i";
/// Distinct denied keys kept per address family.
pub const DENIED_SET_SIZE: u32 = 4096;
/// The denied-tally key for refusals the sets had no room to key.
pub const UNRECORDED_KEY: &str = "*:*/*";
/// Protocols whose transport header carries a destination port.
const PORTED: &str = "{ tcp, udp, udplite, sctp, dccp }";
/// The final reject rule's comment (`nft_counters` reads its counter by it).
pub(crate) const DENIED_COMMENT: &str = "h5i-denied";
/// An allowed rule's comment, before the pinned rule's index.
pub(crate) const ALLOW_COMMENT: &str = "h5i-allow-";

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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(crate) mod tests {
    use super::*;

    /// Two pinned rules, one with an IPv6 address too (shared with `nft_counters`' tests).
    pub(crate) fn rules() -> Vec<PinnedRule> {
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
}
