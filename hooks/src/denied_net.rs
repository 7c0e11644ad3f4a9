//! `h5i-hook loopback --inside --deny-counted [--send SOCKET]`: the process tier's network, in
//! which every connection the box makes itself is refused by its own kernel and counted by
//! destination.
//!
//! A box namespace with loopback only refuses a dial before any packet exists (`ENETUNREACH`:
//! no route), so nothing could count it. This hook gives the route somewhere to point without
//! giving the packets anywhere to go, in this order:
//! 1. the supervised tier's deny-all table, `nft::render(&[])` (no pinned rule: `lo` and
//!    nothing else is accepted; every other packet is keyed into `denied4`/`denied6` by
//!    `daddr . l4proto . dport`, counted, and rejected with `icmpx admin-prohibited`), loaded
//!    first, so no packet ever meets the namespace without it;
//! 2. a veth pair with both ends in the box's namespace: [`ROUTED_DEV`] up, carrying the box's
//!    source addresses ([`SOURCE_V4`], the IPv4 "dummy address" of RFC 7600, and [`SOURCE_V6`],
//!    without duplicate-address detection or a link-local address, so the kernel sends nothing
//!    of its own) and the default routes; [`VOID_DEV`], its peer, left down, so the link has no
//!    carrier and a packet that got past the table would still be dropped inside the namespace.
//!    (A veth pair, not a dummy device: every kernel h5i runs on has veth, not every one has
//!    dummy.)
//!
//! So a TCP dial is routed, meets the output chain, is counted and refused at once: the box
//! sees `EHOSTUNREACH` for IPv4 and `EACCES` for IPv6 (ICMP "administratively prohibited",
//! delivered to itself over `lo`); a UDP send sees `EPERM`. Loopback is untouched.
//!
//! With `--send`, the hook then makes a `NETLINK_NETFILTER` socket in the namespace and hands
//! it to h5i over the AF_UNIX socket h5i bound at SOCKET (as `listen` hands its listener): the
//! socket keeps the namespace and its table alive, so h5i reads the counters
//! (`nft_counters::CounterReader::from_socket`) after the box's last process ended.
//!
//! Must never: act in the host's network namespace (refused, as `loopback --inside` is), give
//! the namespace a device whose other end is outside it, or leave the namespace routed without
//! the table.
//!
//! Guarded by `tests/process_tier.rs` (the denied dial counted, nothing sent on the device,
//! loopback still working).

use std::io;
use std::os::fd::AsFd;
use std::path::Path;

use crate::netns::NetnsError;

/// The up end of the pair: where the default routes point.
pub const ROUTED_DEV: &str = "h5i-deny";
/// The down end: no carrier, and inside the same namespace.
pub const VOID_DEV: &str = "h5i-void";
/// The box's IPv4 source address (RFC 7600's IPv4 dummy address).
pub const SOURCE_V4: &str = "192.0.0.8";
/// The box's IPv6 source address (a unique-local address of h5i's own, /128).
pub const SOURCE_V6: &str = "fd68:3569:6465:6e79::1";

/// Why the counted refusal could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum DeniedNetError {
    /// `--inside` ran in the host's network namespace.
    #[error("refusing: h5i-hook loopback --inside --deny-counted is running in the host's network namespace; to fix: declare it as a createContainer hook of a container with its own network namespace")]
    HostNamespace,
    /// The socket path is not absolute.
    #[error("refusing: --send {0} is not an absolute path; to fix: pass the absolute path of h5i's socket")]
    Relative(String),
    /// `nft` or `ip` could not set the namespace up.
    #[error(transparent)]
    Netns(#[from] NetnsError),
    /// The counter socket could not be made or handed over.
    #[error("refusing: cannot hand the box's counter socket to h5i over {path}: {source}; to fix: h5i must be waiting on that socket (run the box through h5i)")]
    Send {
        /// The socket path.
        path: String,
        /// The OS error.
        source: io::Error,
    },
}

/// The `ip -batch` script that makes the pair, the addresses and the routes.
pub fn ip_script() -> String {
    format!(
        "link add {ROUTED_DEV} type veth peer name {VOID_DEV}\n\
         link set {ROUTED_DEV} addrgenmode none\n\
         link set {VOID_DEV} addrgenmode none\n\
         addr add {SOURCE_V4}/32 dev {ROUTED_DEV}\n\
         addr add {SOURCE_V6}/128 dev {ROUTED_DEV} nodad\n\
         link set {ROUTED_DEV} up\n\
         route add default dev {ROUTED_DEV}\n\
         route add ::/0 dev {ROUTED_DEV}\n"
    )
}

/// Set the counted refusal up in this process's own network namespace (lo is already up), then
/// hand a netfilter socket made there to h5i at `send`, when given.
pub fn set_up_inside(send: Option<&Path>) -> Result<(), DeniedNetError> {
    if let Some(p) = send.filter(|p| !p.is_absolute()) {
        return Err(DeniedNetError::Relative(p.display().to_string()));
    }
    if crate::loopback::in_pid1_netns() {
        return Err(DeniedNetError::HostNamespace);
    }
    // The table first: the routes exist only under it.
    crate::netns::host_nft(&["-f", "-"], crate::nft::render(&[]).as_bytes())?;
    crate::netns::host_ip(&["-batch", "-"], ip_script().as_bytes())?;
    let Some(send) = send else {
        return Ok(());
    };
    let err = |source| DeniedNetError::Send {
        path: send.display().to_string(),
        source,
    };
    let counters = h5i_sys::netlink::netfilter_socket().map_err(err)?;
    crate::listen::hand_over(send, b"N", counters.as_fd()).map_err(err)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_relative_socket_is_refused_before_anything_is_made() {
        assert!(matches!(
            set_up_inside(Some(Path::new("run/x.sock"))),
            Err(DeniedNetError::Relative(_))
        ));
    }

    #[test]
    fn both_ends_stay_in_the_namespace_and_only_the_routed_end_comes_up() {
        let s = ip_script();
        assert!(s.contains(&format!("type veth peer name {VOID_DEV}\n")));
        assert!(!s.contains("netns"), "no end is moved out: {s}");
        assert_eq!(s.matches(" up\n").count(), 1);
        assert!(s.contains(&format!("link set {ROUTED_DEV} up")));
        assert!(s.contains("nodad"));
        assert!(ROUTED_DEV.len() <= 15 && VOID_DEV.len() <= 15, "IFNAMSIZ");
    }
}
