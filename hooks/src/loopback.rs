//! `h5i-hook loopback`: bring up `lo` inside the box's network namespace.
//!
//! A fresh network namespace starts with `lo` down, so nothing in the box could reach its own
//! dev server. Two ways in:
//! - as a `createContainer` hook (`loopback --inside`, what h5i's bundles declare): the runtime
//!   runs it inside the container's namespaces, before capabilities are dropped, so it acts on
//!   its own network namespace, refusing if that is the host's (pid 1's as its /proc sees it);
//!   this works rootless, where the container's init is not dumpable and cannot be entered;
//! - as a `createRuntime` hook (`loopback`): it enters the container's network namespace by pid
//!   (root only).
//!
//! Either way it sets `IFF_UP` on `lo` and changes nothing else.

use std::fs::File;
use std::io;
use std::os::fd::AsFd;

/// Why the loopback could not be brought up.
#[derive(Debug, thiserror::Error)]
pub enum LoopbackError {
    /// A namespace could not be opened or entered.
    #[error("refusing: cannot enter the box's {ns} namespace (pid {pid}): {source}; to fix: the container must still be alive at createRuntime")]
    Enter {
        /// Which namespace.
        ns: &'static str,
        /// The container pid.
        pid: i64,
        /// The OS error.
        source: io::Error,
    },
    /// `--inside` ran in the host's network namespace.
    #[error("refusing: h5i-hook loopback --inside is running in the host's network namespace; to fix: declare it as a createContainer hook of a container with its own network namespace")]
    HostNamespace,
    /// The interface flags could not be changed.
    #[error("refusing: cannot bring up lo in the box: {0}; to fix: report this as an h5i bug")]
    Ioctl(io::Error),
}

/// The identity (device, inode) of a path's target, if it can be read.
fn identity(path: &str) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// Whether this process shares the network namespace of pid 1 (as its /proc sees it): the
/// host's, for a hook that should be in a box's own.
///
/// The namespace links are the direct answer, but reading pid 1's needs ptrace rights over it,
/// which a rootless hook never has and root may not have either (seen here: pid 1 holds a
/// capability root's shell lacks, and the link answers EACCES). Each network namespace has its
/// own `/proc/<pid>/net` entries, readable without those rights, so `net/dev`'s identity answers
/// then. When neither can be read the answer is "shared": the caller refuses.
pub(crate) fn in_pid1_netns() -> bool {
    for (mine, init) in [
        ("/proc/self/ns/net", "/proc/1/ns/net"),
        ("/proc/self/net/dev", "/proc/1/net/dev"),
    ] {
        if let (Some(a), Some(b)) = (identity(mine), identity(init)) {
            return a == b;
        }
    }
    true
}

fn enter(pid: i64, ns: &'static str, kind: h5i_sys::ns::Namespace) -> Result<(), LoopbackError> {
    let path = format!("/proc/{pid}/ns/{ns}");
    let f = File::open(&path).map_err(|source| LoopbackError::Enter { ns, pid, source })?;
    // The process is single-threaded (the hook binary spawns no threads), which entering a
    // user namespace requires.
    h5i_sys::ns::enter(f.as_fd(), kind).map_err(|source| LoopbackError::Enter { ns, pid, source })
}

/// Enter the network namespace of `pid` (a createRuntime hook, as root) and set `lo` up.
pub fn bring_up(pid: i64) -> Result<(), LoopbackError> {
    enter(pid, "net", h5i_sys::ns::Namespace::Network)?;
    set_lo_up()
}

/// Set `lo` up in this process's own network namespace (a createContainer hook), refusing when
/// that namespace is the host's.
pub fn bring_up_inside() -> Result<(), LoopbackError> {
    if in_pid1_netns() {
        return Err(LoopbackError::HostNamespace);
    }
    set_lo_up()
}

fn set_lo_up() -> Result<(), LoopbackError> {
    h5i_sys::netif::set_up("lo").map_err(LoopbackError::Ioctl)
}
