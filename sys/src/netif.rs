//! Network interfaces of the caller's network namespace, by name: setting one up
//! (`SIOCGIFFLAGS`, then `SIOCSIFFLAGS` with `IFF_UP` added), which a fresh namespace's `lo`
//! needs before anything in a box can reach its own dev server.
//!
//! Must never: change a flag other than `IFF_UP`, or act on a namespace other than the
//! calling thread's (the caller enters the box's first).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// Set the interface `name` up in this thread's network namespace (already up: no change). A
/// name that does not fit an interface name (`IFNAMSIZ` with its NUL) or holds a NUL is
/// refused (`EINVAL`); a missing interface answers `ENODEV`.
pub fn set_up(name: &str) -> io::Result<()> {
    // SAFETY: ifreq is plain data (a name array and a union of integers); all-zero is valid.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    if name.is_empty() || name.len() >= req.ifr_name.len() || name.contains('\0') {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    for (dst, src) in req.ifr_name.iter_mut().zip(name.bytes()) {
        *dst = src as libc::c_char;
    }
    // SAFETY: socket with constant arguments returns a new descriptor or -1.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by socket and nothing else owns it.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: `req` is a valid ifreq naming the interface (NUL-terminated: the array was zeroed
    // and the name is shorter than it); the kernel fills `ifru_flags`.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: reading the union member SIOCGIFFLAGS just filled.
    let flags = unsafe { req.ifr_ifru.ifru_flags };
    req.ifr_ifru.ifru_flags = flags | libc::IFF_UP as libc::c_short;
    // SAFETY: `req` is the same valid ifreq, now with the new flags; the kernel only reads it.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_that_is_no_interface_name_is_refused_and_a_missing_one_is_enodev() {
        for bad in ["", "a-name-longer-than-ifnamsiz", "l\0o"] {
            assert_eq!(set_up(bad).unwrap_err().raw_os_error(), Some(libc::EINVAL));
        }
        assert_eq!(
            set_up("h5inosuchif0").unwrap_err().raw_os_error(),
            Some(libc::ENODEV)
        );
    }

    /// `lo` of the test's own namespace: SIOCSIFFLAGS needs CAP_NET_ADMIN even when the flag is
    /// set already, so root sets it and an unprivileged user gets the kernel's EPERM.
    #[test]
    fn lo_is_set_up_with_net_admin_and_refused_without() {
        match set_up("lo") {
            Ok(()) => assert_eq!(crate::ids::euid(), 0),
            Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EPERM), "{e}"),
        }
    }
}
