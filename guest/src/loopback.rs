//! Bring `lo` up in the calling thread's network namespace (a fresh namespace, and a booted
//! guest, start with it down, and `127.0.0.1` is not there until it is up).
//!
//! Must never: touch any interface but `lo`.

use std::io;

/// Set `IFF_UP` on `lo` (idempotent).
pub fn up() -> io::Result<()> {
    // SAFETY: socket(2) makes a new descriptor, closed below on every path.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: ifreq is plain data; zeroed is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (slot, b) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *slot = *b as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS/SIOCSIFFLAGS read and write one ifreq that lives across the calls;
    // the union's flags member is the one these requests use.
    let result = unsafe {
        if libc::ioctl(fd, libc::SIOCGIFFLAGS as _, &mut req) != 0 {
            Err(io::Error::last_os_error())
        } else {
            req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
            match libc::ioctl(fd, libc::SIOCSIFFLAGS as _, &req) {
                0 => Ok(()),
                _ => Err(io::Error::last_os_error()),
            }
        }
    };
    // SAFETY: fd was made above and is closed once.
    unsafe { libc::close(fd) };
    result
}
