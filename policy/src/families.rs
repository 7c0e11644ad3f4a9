//! Socket address families: the one reviewed table of which a box may open, [`ADDRESS_FAMILIES`].
//!
//! Owns the decision per family and its reason. The kernel tiers apply it alike: h5i-runc's
//! seccomp list refuses `socket()` of every family this table does not allow (an allowlist:
//! a family the kernel grows later is refused until reviewed here), and the supervised tier's
//! socket gate consults the same table before its own, narrower rules. `net.families` in
//! env.toml grants a [`FamilyVerdict::Refused`] family by name; nothing else can be granted.
//!
//! Why an allowlist: a network namespace scopes only what the kernel implements per namespace
//! (inet, inet6, netlink, unix's abstract names). Other families reach hardware, the
//! hypervisor or kernel services shared with the host (vsock is the one the issue found: a
//! `net.mode = "deny"` box could reach the VM host's vsock services and its port space), or
//! autoload rarely exercised protocol modules that are a steady source of kernel bugs.
//!
//! Must never: allow a family without a reason, list a number twice, or let `net.families`
//! grant `unix` (that is `net.unix`), an allowed family, or a family refused for a reason no
//! grant can lift. Guarded by the table-walking tests below, by the seccomp tests in
//! `runtime/src/confine/seccomp.rs`, the gate's in `broker/src/socket_gate/tests.rs`, and by
//! real boxes in `tests/confine.rs`.

/// What a box gets for one family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FamilyVerdict {
    /// Always allowed: the box's own namespaces scope it.
    Allowed,
    /// Allowed only with `net.unix = true` (AF_UNIX).
    NetUnix,
    /// Refused unless `net.families` names it.
    Refused,
    /// Refused, and no policy key grants it.
    Never,
}

/// One row of the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddressFamily {
    /// The name `net.families` and `status` use (the kernel's `AF_` name, lowercase).
    pub name: &'static str,
    /// `AF_*` value (`linux/socket.h`).
    pub number: u32,
    /// The decision.
    pub verdict: FamilyVerdict,
    /// Why, in one line.
    pub why: &'static str,
}

/// `AF_MAX` of the kernels h5i knows (6.x): every family number below it has a row.
pub const AF_MAX: u32 = 46;

const fn row(
    name: &'static str,
    number: u32,
    verdict: FamilyVerdict,
    why: &'static str,
) -> AddressFamily {
    AddressFamily {
        name,
        number,
        verdict,
        why,
    }
}

use FamilyVerdict::{Allowed, NetUnix, Never, Refused};

/// Every address family, by number. Review every change; each row says why.
#[rustfmt::skip]
pub const ADDRESS_FAMILIES: &[AddressFamily] = &[
    row("unspec", 0, Refused, "no socket type exists for it; nothing to allow"),
    row("unix", 1, NetUnix, "reaches host listeners and passes descriptors: net.unix decides"),
    row("inet", 2, Allowed, "scoped by the box's network namespace (and nftables/proxy)"),
    row("ax25", 3, Refused, "amateur radio: devices outside any namespace, old unaudited code"),
    row("ipx", 4, Refused, "removed from the kernel; nothing a box needs"),
    row("appletalk", 5, Refused, "legacy protocol module autoloaded on use: kernel surface"),
    row("netrom", 6, Refused, "amateur radio: devices outside any namespace, old unaudited code"),
    row("bridge", 7, Refused, "no socket type; bridges are configured over netlink"),
    row("atmpvc", 8, Refused, "ATM hardware: not namespaced, rarely exercised code"),
    row("x25", 9, Refused, "legacy X.25 module autoloaded on use: kernel surface"),
    row("inet6", 10, Allowed, "scoped by the box's network namespace (and nftables/proxy)"),
    row("rose", 11, Refused, "amateur radio: devices outside any namespace, old unaudited code"),
    row("decnet", 12, Refused, "removed from the kernel; nothing a box needs"),
    row("netbeui", 13, Refused, "never implemented in Linux"),
    row("security", 14, Refused, "never implemented as a socket family"),
    row("key", 15, Refused, "PF_KEY: IPsec key management, administrator's business"),
    row("netlink", 16, Allowed, "per network namespace; libc's getaddrinfo and ip(8) read it"),
    row("packet", 17, Never, "link-layer frames: sniff and forge around egress rules"),
    row("ash", 18, Refused, "never implemented in Linux"),
    row("econet", 19, Refused, "removed from the kernel; nothing a box needs"),
    row("atmsvc", 20, Refused, "ATM hardware: not namespaced, rarely exercised code"),
    row("rds", 21, Refused, "RDS: history of privilege-escalation bugs, autoloaded on use"),
    row("sna", 22, Refused, "never implemented in Linux"),
    row("irda", 23, Refused, "removed from the kernel; nothing a box needs"),
    row("pppox", 24, Refused, "PPP sessions over host devices: not a build/test need"),
    row("wanpipe", 25, Refused, "removed from the kernel; nothing a box needs"),
    row("llc", 26, Refused, "raw 802.2 frames on host devices: sniff/forge below IP"),
    row("ib", 27, Refused, "InfiniBand addressing: reaches RDMA hardware, not namespaced"),
    row("mpls", 28, Refused, "no socket type; MPLS is configured over netlink"),
    row("can", 29, Refused, "CAN bus: raw frames on host hardware buses"),
    row("tipc", 30, Refused, "cluster IPC with its own name space; frequent kernel bugs"),
    row("bluetooth", 31, Refused, "host radio hardware, not scoped by any namespace"),
    row("iucv", 32, Refused, "s390 hypervisor communication: reaches outside the guest"),
    row("rxrpc", 33, Refused, "AFS RPC transport: kernel keyrings and surface a box never needs"),
    row("isdn", 34, Refused, "ISDN hardware: removed or rarely built, unaudited"),
    row("phonet", 35, Refused, "modem hardware protocol: not a build/test need"),
    row("ieee802154", 36, Refused, "low-power radio hardware, not scoped by any namespace"),
    row("caif", 37, Refused, "modem hardware protocol: not a build/test need"),
    row("alg", 38, Refused, "kernel crypto API: large attack surface; userspace crypto suffices"),
    row("nfc", 39, Refused, "NFC radio hardware, not scoped by any namespace"),
    row("vsock", 40, Refused, "hypervisor sockets: not netns-scoped, reach the VM host's services"),
    row("kcm", 41, Refused, "kernel connection multiplexor: eBPF-driven, rarely exercised"),
    row("qipcrtr", 42, Refused, "Qualcomm IPC router: reaches modem/DSP firmware services"),
    row("smc", 43, Refused, "shared-memory communications: RDMA hardware path around netns rules"),
    row("xdp", 44, Refused, "raw frames from a host NIC queue: sniff/forge below IP"),
    row("mctp", 45, Refused, "management bus to host firmware and BMCs"),
];

/// The row for family `number`, if the table has one.
pub fn by_number(number: u32) -> Option<&'static AddressFamily> {
    ADDRESS_FAMILIES.iter().find(|f| f.number == number)
}

/// The row named `name`, if the table has one.
pub fn by_name(name: &str) -> Option<&'static AddressFamily> {
    ADDRESS_FAMILIES.iter().find(|f| f.name == name)
}

/// Why `name` cannot be granted by `net.families`, if it cannot (`None`: grantable).
pub fn grant_problem(name: &str) -> Option<String> {
    match by_name(name) {
        None => Some(format!(
            "`{name}` is not an address family h5i knows (see `h5i box capabilities --json`)"
        )),
        Some(f) => match f.verdict {
            Refused => None,
            NetUnix => Some("`unix` is granted by net.unix, not net.families".to_owned()),
            Allowed => Some(format!("`{name}` is always allowed; it needs no grant")),
            Never => Some(format!("`{name}` is never granted: {}", f.why)),
        },
    }
}

/// The set of families a box may open, as a bit per family number (all numbers are < 64).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FamilySet(u64);

impl FamilySet {
    /// No family.
    pub const EMPTY: FamilySet = FamilySet(0);

    /// The families allowed with these grants: every `Allowed` row, `unix` when `net_unix`,
    /// and the `granted` names that are grantable (others are ignored: the policy refused them
    /// when it was parsed, and a runtime re-checks with [`grant_problem`]).
    pub fn allowed(net_unix: bool, granted: &[String]) -> Self {
        let mut bits = 0u64;
        for f in ADDRESS_FAMILIES {
            let on = match f.verdict {
                Allowed => true,
                NetUnix => net_unix,
                Refused => granted.iter().any(|g| g == f.name),
                Never => false,
            };
            if on {
                bits |= 1 << f.number;
            }
        }
        FamilySet(bits)
    }

    /// Only the `granted` names that are grantable ([`FamilyVerdict::Refused`] rows).
    pub fn granted_only(granted: &[String]) -> Self {
        let all = FamilySet::allowed(false, granted).0;
        let base = FamilySet::allowed(false, &[]).0;
        FamilySet(all & !base)
    }

    /// Whether family `number` (the kernel's `int`, as unsigned) is in the set.
    pub fn contains(self, number: u32) -> bool {
        number < 64 && self.0 & (1 << number) != 0
    }

    /// The numbers in the set, ascending.
    pub fn numbers(self) -> impl Iterator<Item = u32> {
        (0..64).filter(move |n| self.0 & (1u64 << n) != 0)
    }

    /// The names of the table's families that are not in the set, in table order.
    pub fn refused_names(self) -> Vec<&'static str> {
        ADDRESS_FAMILIES
            .iter()
            .filter(|f| !self.contains(f.number))
            .map(|f| f.name)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_number_below_af_max_has_exactly_one_row_with_a_reason() {
        for n in 0..AF_MAX {
            let rows: Vec<_> = ADDRESS_FAMILIES.iter().filter(|f| f.number == n).collect();
            assert_eq!(rows.len(), 1, "family {n}");
        }
        assert_eq!(
            ADDRESS_FAMILIES.len() as u32,
            AF_MAX,
            "a row outside 0..AF_MAX"
        );
        for (i, f) in ADDRESS_FAMILIES.iter().enumerate() {
            assert_eq!(f.number, i as u32, "{} out of order", f.name);
            assert!(!f.why.trim().is_empty(), "{} has no reason", f.name);
            assert!(
                f.name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()),
                "{}",
                f.name
            );
            assert_eq!(
                ADDRESS_FAMILIES.iter().filter(|g| g.name == f.name).count(),
                1,
                "name {} reused",
                f.name
            );
        }
    }

    #[test]
    fn only_namespace_scoped_families_are_allowed_by_default() {
        let allowed: Vec<_> = FamilySet::allowed(false, &[])
            .numbers()
            .map(|n| by_number(n).unwrap().name)
            .collect();
        assert_eq!(allowed, ["inet", "inet6", "netlink"]);
        let with_unix: Vec<_> = FamilySet::allowed(true, &[]).numbers().collect();
        assert_eq!(with_unix, [1, 2, 10, 16]);
    }

    #[test]
    fn vsock_is_refused_unless_granted() {
        let vsock = by_name("vsock").unwrap();
        assert_eq!(vsock.number, 40);
        assert!(!FamilySet::allowed(true, &[]).contains(40));
        assert!(FamilySet::allowed(false, &["vsock".to_owned()]).contains(40));
        assert!(FamilySet::allowed(false, &[])
            .refused_names()
            .contains(&"vsock"));
    }

    #[test]
    fn grants_cannot_open_unix_allowed_or_never_families() {
        assert!(grant_problem("vsock").is_none());
        assert!(grant_problem("alg").is_none());
        assert!(grant_problem("unix").unwrap().contains("net.unix"));
        assert!(grant_problem("inet").unwrap().contains("always allowed"));
        assert!(grant_problem("packet").unwrap().contains("never granted"));
        assert!(grant_problem("wifi")
            .unwrap()
            .contains("not an address family"));
        let granted = ["packet".to_owned(), "unix".to_owned()];
        let set = FamilySet::allowed(false, &granted);
        assert!(!set.contains(17) && !set.contains(1));
        let only = FamilySet::granted_only(&["vsock".to_owned(), "inet".to_owned()]);
        assert_eq!(only.numbers().collect::<Vec<_>>(), [40]);
    }

    #[test]
    fn numbers_beyond_the_set_are_never_contained() {
        let set = FamilySet::allowed(true, &["vsock".to_owned()]);
        for n in [64, 100, u32::MAX] {
            assert!(!set.contains(n));
        }
    }
}
