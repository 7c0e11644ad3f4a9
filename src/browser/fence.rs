//! The fence between a box and its browser: no process of the box opens a TCP connection to a
//! socket the box's browser sidecar listens on (Chromium's DevTools port, agent-browser's
//! stream and dashboard ports), so the relay (`super::relay`) is the box's only way to drive it.
//!
//! The runs share the sidecar's network namespace (the browser must reach the dev server the
//! runs start), so loopback alone would let a run speak CDP to Chromium and act while a human
//! holds control. The sidecar runs as the box's group [`SIDECAR_GID`] (the box's own processes
//! hold no capability and cannot change group), and an nftables table in the box's network
//! namespace, loaded by h5i before the sidecar's daemon starts ([`load`]), tells the two apart
//! by the group of the socket that sends each packet:
//! - a SYN sent by a socket of neither the sidecar's group nor the kernel's overflow group (what
//!   a socket of h5i's own, opened from the host's user namespace, shows: the viewer's) marks
//!   its connection as opened by the box;
//! - on such a connection a SYN-ACK is sent only by a listener of one of the box's groups
//!   ([`BoxGroups`]: 0 at the kernel tiers; at the container tier 0, the group of the listener
//!   the run's hook binds for its egress proxy, and the engine user's group, the box's own
//!   processes); any other (a listener of the sidecar's, or a syncookie SYN-ACK, which names no
//!   listener) is dropped and counted, so the handshake never completes and nothing the box
//!   sent is ever read.
//!
//! The box cannot undo it: changing a table needs `CAP_NET_ADMIN`, which no box process holds.
//!
//! Owns the table ([`script`]) and loading it. Must never: leave the daemon running before the
//! table is loaded (the sidecar's command waits on [`GATE`] until [`load`] opens it), or fence
//! anything the box itself listens on.
//!
//! Guarded by the unit test below and `tests/browser.rs`.

use std::fs::File;
use std::io::{self, Write};
use std::time::{Duration, Instant};

use crate::beneath::Dir;

pub use crate::browser_box::SIDECAR_GID;

/// The table's family and name, as `nft` spells them.
pub const TABLE: &str = "inet h5i_browser";

/// The connection mark of a connection a process of the box opened ("h5ib").
const BOX_OPENED: u32 = 0x6835_6962;

pub use crate::browser_box::GATE;

/// The groups, as the sidecar's network namespace's owning user namespace names them, whose
/// listeners may answer a connection the box opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BoxGroups(pub Vec<u32>);

impl BoxGroups {
    /// The kernel tiers: the box's processes are its group 0.
    pub fn kernel_tier() -> BoxGroups {
        BoxGroups(vec![0])
    }

    /// The container tier: group 0 (each run's createContainer hook binds its proxy
    /// listeners as the namespace's root) and the engine user's group `engine_gid`, which
    /// `--userns=keep-id` keeps as the box's processes' own.
    pub fn container_tier(engine_gid: u32) -> BoxGroups {
        let mut g = vec![0];
        if engine_gid != 0 && engine_gid != SIDECAR_GID {
            g.push(engine_gid);
        }
        BoxGroups(g)
    }

    fn set(&self) -> String {
        let ids: Vec<String> = self.0.iter().map(u32::to_string).collect();
        format!("{{ {} }}", ids.join(", "))
    }
}

/// The table for a kernel whose overflow group is `overflow_gid`, letting only listeners of
/// `box_groups` answer the box.
pub fn script(overflow_gid: u32, box_groups: &BoxGroups) -> String {
    let listeners = box_groups.set();
    format!(
        "table {TABLE}
delete table {TABLE}
table {TABLE} {{
  chain output {{
    type filter hook output priority 0; policy accept;
    tcp flags & (syn | ack) == syn meta skgid != {{ {SIDECAR_GID}, {overflow_gid} }} ct mark set {BOX_OPENED:#x}
    tcp flags & (syn | ack) == syn | ack ct mark {BOX_OPENED:#x} meta skgid {listeners} accept
    tcp flags & (syn | ack) == syn | ack ct mark {BOX_OPENED:#x} counter drop comment \"h5i-browser-fence\"
  }}
}}
"
    )
}

/// The kernel's overflow group: what a socket's group shows in a user namespace that does not
/// map it.
fn overflow_gid() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/overflowgid")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(65534)
}

/// Load the table into the network namespace of the sidecar whose container init is `pid`,
/// then open its [`GATE`] so its daemon starts. Bounded by `within`. `from_parent`: enter the
/// parent of the sidecar's user namespace rather than that namespace itself (the container
/// tier's unprivileged caller: the caller is a non-root id in the sidecar's `keep-id`
/// namespace, whose capabilities `nft` would lose at exec, and root in the rootless engine's
/// namespace above it, whose capabilities cover the sidecar's network namespace).
pub fn load(
    pid: i32,
    within: Duration,
    box_groups: &BoxGroups,
    from_parent: bool,
) -> Result<(), String> {
    let ns = |kind: &str| {
        File::open(format!("/proc/{pid}/ns/{kind}"))
            .map(std::os::fd::OwnedFd::from)
            .map_err(|e| format!("cannot open the sidecar's {kind} namespace: {e}"))
    };
    let mut user = ns("user")?;
    if from_parent {
        user = h5i_sys::ns_socket::parent_user_namespace(std::os::fd::AsFd::as_fd(&user))
            .map_err(|e| format!("cannot find the parent of the sidecar's user namespace: {e}"))?;
    }
    let spaces =
        h5i_hook::netns::BoxNamespaces::new(ns("net")?, user).map_err(|e| e.to_string())?;
    spaces
        .nft(&["-f", "-"], script(overflow_gid(), box_groups).as_bytes())
        .map_err(|e| e.to_string())?;
    open_gate(pid, within).map_err(|e| format!("cannot open the sidecar's gate {GATE}: {e}"))
}

/// Write a line to the sidecar's [`GATE`] once its command waits on it (the FIFO exists and
/// has a reader), never through a symlink and only into a FIFO.
fn open_gate(pid: i32, within: Duration) -> io::Result<()> {
    let deadline = Instant::now() + within;
    let mut pause = Duration::from_millis(5);
    let rel = GATE.trim_start_matches('/').as_bytes();
    loop {
        let opened = Dir::root_of(pid).and_then(|root| {
            root.open_at(
                rel,
                libc::O_WRONLY | libc::O_NONBLOCK | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        });
        match opened {
            Ok(fd) => {
                let fifo = rustix::fs::fstat(&fd).is_ok_and(|st| {
                    rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Fifo
                });
                if !fifo {
                    return Err(io::Error::other("it is not a FIFO"));
                }
                return File::from(fd).write_all(b"fenced\n");
            }
            // Not made yet (ENOENT) or no reader yet (ENXIO): the command has not reached it.
            Err(e)
                if Instant::now() < deadline
                    && matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENXIO)) =>
            {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(100));
            }
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_marks_the_boxs_connections_and_drops_only_their_foreign_syn_acks() {
        let s = script(65534, &BoxGroups::kernel_tier());
        assert!(
            s.contains("meta skgid != { 1, 65534 } ct mark set 0x68356962"),
            "{s}"
        );
        assert!(
            s.contains("ct mark 0x68356962 meta skgid { 0 } accept"),
            "{s}"
        );
        let drop = s.lines().find(|l| l.contains("drop")).unwrap();
        assert!(drop.contains("syn | ack ct mark 0x68356962"), "{s}");
        // The table is replaced whole: a reload never leaves an old rule beside a new one.
        assert!(
            s.starts_with(&format!("table {TABLE}\ndelete table {TABLE}\n")),
            "{s}"
        );
        assert!(!s.contains("policy drop"), "{s}");
    }

    #[test]
    fn at_the_container_tier_the_proxy_listener_and_the_engine_group_answer_the_box() {
        let s = script(65534, &BoxGroups::container_tier(1001));
        assert!(
            s.contains("ct mark 0x68356962 meta skgid { 0, 1001 } accept"),
            "{s}"
        );
        // The sidecar's own group is never one of the box's, whatever the engine's group is.
        assert_eq!(BoxGroups::container_tier(SIDECAR_GID), BoxGroups(vec![0]));
        assert!(s.contains("meta skgid != { 1, 65534 }"), "{s}");
    }
}
