//! The uplink's tap device, made by `net-inside` in the box's own network namespace before the
//! sentry starts pasta on it.
//!
//! Owns [`make_persistent`]: open `/dev/net/tun`, `TUNSETIFF` the name with
//! `IFF_TAP | IFF_NO_PI` (the flags pasta asks for), `TUNSETPERSIST 1`, close. The kernel
//! makes a tun/tap device in the network namespace of the process that opened `/dev/net/tun`,
//! so this must run inside the box (the createContainer hook does).
//!
//! Why persistent: the uplink opens an existing device by name (its own `TUNSETIFF`), and when
//! it exits, closing a persistent device's last fd only detaches it. When the uplink made the
//! device itself, closing that fd unregistered it, and that teardown cost 18-27 ms (measured
//! with slirp4netns, then started per run; 0.4 ms with the device persistent). The device then
//! goes when the box's network namespace goes.
//!
//! Ownership: none is set (`TUNSETOWNER`/`TUNSETGROUP` left unset). The kernel lets a process
//! attach to an existing device when the device has no owner, or when it holds
//! `CAP_NET_ADMIN` over the device's network namespace; pasta always holds that (it joins
//! the box's user namespace, or is root, or shares rootless Podman's namespace, and it needs the
//! capability anyway to configure the device), so an owner would add nothing it relies on. Only
//! one process can be attached to a non-multiqueue device at a time (`EBUSY` for any other), and
//! while the box runs that is the uplink; before, the box's init is blocked in `net-inside`.
//!
//! Must never: make the device anywhere but in the caller's own network namespace (the caller,
//! `net-inside`, first refuses the host's), or leave a device behind on failure in a namespace
//! that outlives the box. Guarded by the unit tests below and `hooks/tests/supervised_net.rs`
//! (every supervised box's uplink runs on a device made here: rootful, unprivileged, and both
//! Podman modes).

use std::io;
use std::os::fd::AsFd;

/// Where the tun/tap clone device is.
const TUN: &str = "/dev/net/tun";

/// Why the device could not be made.
#[derive(Debug, thiserror::Error)]
pub enum TapError {
    /// The name does not fit an interface name.
    #[error("refusing: {0:?} is not a valid interface name (1-15 bytes, no '/', ':' or whitespace); to fix: report this as an h5i bug")]
    Name(String),
    /// `/dev/net/tun` could not be opened.
    #[error("refusing: cannot open {TUN} in the box: {0}; to fix: check /dev/net/tun exists and is usable by this user (mode 0666 for unprivileged and rootless boxes)")]
    Open(io::Error),
    /// An ioctl failed.
    #[error("refusing: cannot make the persistent tap device {name} in the box ({step}): {source}; to fix: the box needs its own network namespace and CAP_NET_ADMIN in it at createContainer")]
    Ioctl {
        /// The device.
        name: String,
        /// `TUNSETIFF` or `TUNSETPERSIST`.
        step: &'static str,
        /// The OS error.
        source: io::Error,
    },
}

/// Refuse a name the kernel would mangle or cut (1-15 bytes, no `/`, `:`, NUL or whitespace).
fn check_name(name: &str) -> Result<(), TapError> {
    let bytes = name.as_bytes();
    let valid = !bytes.is_empty()
        && bytes.len() < libc::IFNAMSIZ
        && !bytes
            .iter()
            .any(|b| *b == b'/' || *b == b':' || *b == 0 || b.is_ascii_whitespace());
    if !valid {
        return Err(TapError::Name(name.to_string()));
    }
    Ok(())
}

/// Make the persistent tap device `name` in this process's network namespace (or attach to it
/// and make it persistent, when a tap of that name already exists there), then let go of it.
pub fn make_persistent(name: &str) -> Result<(), TapError> {
    check_name(name)?;
    let tun = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(TUN)
        .map_err(TapError::Open)?;
    h5i_sys::netif::make_tap_persistent(tun.as_fd(), name).map_err(|e| TapError::Ioctl {
        name: name.to_string(),
        step: e.step,
        source: e.source,
    })?;
    // Closing the fd (dropping `tun`) detaches it; the device stays, down, for pasta.
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn names_the_kernel_would_mangle_or_cut_are_refused() {
        for bad in ["", "a/b", "tap:0", "tap 0", "tap\0x", "0123456789abcdef"] {
            assert!(matches!(check_name(bad), Err(TapError::Name(_))), "{bad:?}");
        }
        assert!(check_name("0123456789abcde").is_ok(), "15 bytes fit");
    }
}
