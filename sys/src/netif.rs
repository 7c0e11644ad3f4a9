//! Network interfaces of the caller's network namespace, by name: setting one up
//! (`SIOCGIFFLAGS`, then `SIOCSIFFLAGS` with `IFF_UP` added), which a fresh namespace's `lo`
//! needs before anything in a box can reach its own dev server; and a persistent tap device
//! made on an open `/dev/net/tun` (`TUNSETIFF` with `IFF_TAP | IFF_NO_PI`, `TUNSETPERSIST`);
//! and the addresses assigned to the namespace's interfaces ([`addresses`]).
//!
//! Must never: change a flag other than `IFF_UP`, or act on a namespace other than the
//! calling thread's (the caller enters the box's first; a tap is made in the namespace of the
//! process that opened `/dev/net/tun`).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

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

/// A tap-device step that failed, named (`TUNSETIFF` or `TUNSETPERSIST`).
#[derive(Debug, thiserror::Error)]
#[error("{step}: {source}")]
pub struct TapCallError {
    /// Which step.
    pub step: &'static str,
    /// The kernel's error.
    pub source: io::Error,
}

/// The `ifreq` asking for the tap device `name` without packet information; `EINVAL` for a
/// name that does not fit (`IFNAMSIZ` with its NUL) or holds a NUL.
fn tap_request(name: &str) -> io::Result<libc::ifreq> {
    // SAFETY: ifreq is plain data; zeroed is a valid value (and NUL-terminates the name).
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    if name.is_empty() || name.len() >= req.ifr_name.len() || name.contains('\0') {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    for (dst, src) in req.ifr_name.iter_mut().zip(name.bytes()) {
        *dst = src as libc::c_char;
    }
    req.ifr_ifru.ifru_flags = (libc::IFF_TAP | libc::IFF_NO_PI) as libc::c_short;
    Ok(req)
}

/// On `tun` (an open `/dev/net/tun`), make the tap device `name` without packet information
/// (or attach to the one of that name) and make it persistent: it stays, down, once `tun` is
/// closed. A name [`tap_request`] refuses is a `TUNSETIFF` error (`EINVAL`).
pub fn make_tap_persistent(tun: BorrowedFd<'_>, name: &str) -> Result<(), TapCallError> {
    let failed = |step| move |source| TapCallError { step, source };
    let mut req = tap_request(name).map_err(failed("TUNSETIFF"))?;
    // SAFETY: TUNSETIFF reads (and may rewrite the name in) a valid ifreq that lives across the
    // call, on a live descriptor.
    if unsafe { libc::ioctl(tun.as_raw_fd(), libc::TUNSETIFF, &mut req) } != 0 {
        return Err(failed("TUNSETIFF")(io::Error::last_os_error()));
    }
    // SAFETY: TUNSETPERSIST takes its flag by value, not through a pointer; the descriptor is
    // attached to the device just made.
    if unsafe { libc::ioctl(tun.as_raw_fd(), libc::TUNSETPERSIST, 1 as libc::c_ulong) } != 0 {
        return Err(failed("TUNSETPERSIST")(io::Error::last_os_error()));
    }
    Ok(())
}

/// The addresses assigned to the interfaces of the calling thread's network namespace
/// (`getifaddrs`, IPv4 and IPv6 only), copied out of the list the C library allocates and
/// frees.
pub fn addresses() -> io::Result<Vec<std::net::IpAddr>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: `head` is a valid out-pointer; on success the list is freed below with
    // `freeifaddrs`, exactly once.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut out = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a non-null node of the list `getifaddrs` returned, not yet freed.
        let ifa = unsafe { &*cur };
        if !ifa.ifa_addr.is_null() {
            // SAFETY: `ifa_addr` is non-null and points to a sockaddr whose family field is
            // always readable.
            let family = i32::from(unsafe { (*ifa.ifa_addr).sa_family });
            if family == libc::AF_INET {
                // SAFETY: the family is AF_INET, so the storage is a `sockaddr_in`.
                let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                out.push(std::net::IpAddr::V4(std::net::Ipv4Addr::from(
                    u32::from_be(sin.sin_addr.s_addr),
                )));
            } else if family == libc::AF_INET6 {
                // SAFETY: the family is AF_INET6, so the storage is a `sockaddr_in6`.
                let sin6 = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
                out.push(std::net::IpAddr::V6(std::net::Ipv6Addr::from(
                    sin6.sin6_addr.s6_addr,
                )));
            }
        }
        cur = ifa.ifa_next;
    }
    // SAFETY: `head` came from a successful `getifaddrs` and is freed once; no reference into
    // the list outlives this call (addresses were copied out).
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
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

    #[test]
    fn the_tap_request_names_a_tap_without_packet_information_and_a_bad_name_is_einval() {
        let req = tap_request("tap0").unwrap();
        let name: Vec<u8> = req.ifr_name.iter().map(|c| *c as u8).collect();
        assert_eq!(&name[..5], b"tap0\0");
        // SAFETY: reading the union member tap_request wrote.
        let flags = unsafe { req.ifr_ifru.ifru_flags };
        assert_eq!(flags, (libc::IFF_TAP | libc::IFF_NO_PI) as libc::c_short);
        assert!(tap_request("0123456789abcde").is_ok(), "15 bytes fit");
        let null = std::fs::File::open("/dev/null").unwrap();
        for bad in ["", "0123456789abcdef", "t\0p"] {
            let err = make_tap_persistent(std::os::fd::AsFd::as_fd(&null), bad).unwrap_err();
            assert_eq!(
                (err.step, err.source.raw_os_error()),
                ("TUNSETIFF", Some(libc::EINVAL))
            );
        }
    }

    #[test]
    fn the_addresses_include_loopback() {
        let all = addresses().unwrap();
        assert!(all.iter().any(|a| a.is_loopback()), "{all:?}");
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
