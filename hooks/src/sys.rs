//! Small safe wrappers over the libc calls the supervised-network hooks share: pidfds, bounded
//! waits on fds, closing inherited fds, and passing fds over a unix socket.
//!
//! Owns nothing but the calls; every wait here is bounded by a timeout and made with `poll`
//! (never a sleep loop). Must never: block without a bound.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

/// A pidfd for `pid` (`pidfd_open`).
pub fn pidfd_open(pid: i32) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd was just returned by pidfd_open and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Wait until one of `fds` is readable (or hung up), at most `timeout` (`None`: no bound, for
/// the sentry's main loop whose end is the box's end). Returns the readable indexes; empty on
/// timeout. Retries on `EINTR` with the time left.
pub fn poll_readable(fds: &[BorrowedFd<'_>], timeout: Option<Duration>) -> io::Result<Vec<usize>> {
    let deadline = timeout.map(|t| Instant::now() + t);
    let mut pfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|fd| libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    loop {
        let ms = match deadline {
            None => -1,
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                i32::try_from(left.as_millis()).unwrap_or(i32::MAX)
            }
        };
        // SAFETY: pfds is a valid array of pfds.len() pollfd structs for the call's duration.
        let n = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, ms) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        return Ok(pfds
            .iter()
            .enumerate()
            .filter(|(_, p)| p.revents != 0)
            .map(|(i, _)| i)
            .collect());
    }
}

/// Wait (bounded) for the process behind `pidfd` to exit; true when it has.
pub fn wait_pidfd(pidfd: &OwnedFd, timeout: Duration) -> io::Result<bool> {
    Ok(!poll_readable(&[pidfd.as_fd_borrowed()], Some(timeout))?.is_empty())
}

/// Send `SIGKILL` through a pidfd (no pid reuse race).
pub fn pidfd_kill(pidfd: &OwnedFd) -> io::Result<()> {
    // SAFETY: pidfd_send_signal with a valid pidfd, a signal number, no siginfo, no flags.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            libc::SIGKILL,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if rc != 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::ESRCH) {
            return Err(e);
        }
    }
    Ok(())
}

/// Borrow an owned fd (a shorthand for `poll_readable`'s argument).
pub trait AsFdBorrowed {
    /// The fd, borrowed.
    fn as_fd_borrowed(&self) -> BorrowedFd<'_>;
}

impl<T: std::os::fd::AsFd> AsFdBorrowed for T {
    fn as_fd_borrowed(&self) -> BorrowedFd<'_> {
        self.as_fd()
    }
}

/// Close every fd from 3 up (a process that crosses a privilege boundary starts clean).
pub fn close_inherited_fds() -> io::Result<()> {
    // SAFETY: close_range closes fds in the range; nothing in this process holds fds >= 3 at
    // the point it is called (the first thing the sentry does).
    let rc = unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A duplicate of `fd` numbered at least `min`, close-on-exec.
pub fn dup_at_least(fd: RawFd, min: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: F_DUPFD_CLOEXEC duplicates a valid fd; the result is a new fd or -1.
    let new = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, min) };
    if new < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: new was just returned by fcntl and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(new) })
}

/// The uid of the process at the other end of a unix socket (`SO_PEERCRED`), as this
/// process's user namespace sees it.
pub fn peer_uid(sock: &UnixStream) -> io::Result<u32> {
    // SAFETY: ucred is plain data; zeroed is a valid value.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `cred`, a valid ucred.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(cred.uid)
}

/// Most fds one message may carry (the namespace handback sends two).
const MAX_FDS: usize = 4;

/// Send `data` with `fds` attached (`SCM_RIGHTS`) in one message.
pub fn send_with_fds(sock: &UnixStream, data: &[u8], fds: &[RawFd]) -> io::Result<()> {
    if fds.len() > MAX_FDS || data.is_empty() {
        return Err(io::Error::other("bad fd message"));
    }
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    // Aligned control buffer, larger than CMSG_SPACE(MAX_FDS * sizeof(int)).
    let mut control = [0u64; 8];
    let payload = std::mem::size_of_val(fds) as u32;
    // SAFETY: CMSG_SPACE is a pure size computation.
    let space = unsafe { libc::CMSG_SPACE(payload) } as usize;
    if space > std::mem::size_of_val(&control) {
        return Err(io::Error::other("control buffer too small"));
    }
    // SAFETY: msghdr is plain data; zeroed is a valid value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        // SAFETY: msg points at a control buffer of `space` bytes, enough for one header.
        let cmsg = unsafe { libc::CMSG_FIRSTHDR(&msg) };
        if cmsg.is_null() {
            return Err(io::Error::other("no room for the control message"));
        }
        // SAFETY: cmsg points into `control`, aligned and large enough; CMSG_DATA points at the
        // payload of `payload` bytes inside it.
        unsafe {
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(payload) as _;
            std::ptr::copy_nonoverlapping(
                fds.as_ptr().cast::<u8>(),
                libc::CMSG_DATA(cmsg),
                payload as usize,
            );
        }
    }
    // SAFETY: msg and everything it points to live across the call; the kernel only reads the
    // data buffer.
    let n = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    if n as usize != data.len() {
        return Err(io::Error::other("short send"));
    }
    Ok(())
}

/// Receive one message of at most `buf.len()` bytes and the fds attached to it (owned, close-on-
/// exec). A message that carried more fds than [`MAX_FDS`] or was cut short is refused.
pub fn recv_with_fds(sock: &UnixStream, buf: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut control = [0u64; 8];
    // SAFETY: msghdr is plain data; zeroed is a valid value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control) as _;
    // SAFETY: msg points at buffers that live across the call.
    let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut fds = Vec::new();
    // SAFETY: walking the control messages the kernel wrote into `control`, within
    // msg_controllen, with the libc macros.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg);
                let len = (*cmsg).cmsg_len as usize - (data as usize - cmsg as usize);
                for i in 0..len / std::mem::size_of::<RawFd>() {
                    let fd = std::ptr::read_unaligned(data.cast::<RawFd>().add(i));
                    fds.push(OwnedFd::from_raw_fd(fd));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    if msg.msg_flags & (libc::MSG_CTRUNC | libc::MSG_TRUNC) != 0 {
        return Err(io::Error::other("message or its fds were cut short"));
    }
    Ok((n as usize, fds))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn two_fds_cross_a_socket_with_their_message() {
        let (a, b) = UnixStream::pair().unwrap();
        let f1 = std::fs::File::open("/proc/self/ns/net").unwrap();
        let f2 = std::fs::File::open("/dev/null").unwrap();
        send_with_fds(&a, b"attach\n", &[f1.as_raw_fd(), f2.as_raw_fd()]).unwrap();
        let mut buf = [0u8; 64];
        let (n, fds) = recv_with_fds(&b, &mut buf).unwrap();
        assert_eq!(&buf[..n], b"attach\n");
        assert_eq!(fds.len(), 2);
        // SAFETY: geteuid has no preconditions.
        assert_eq!(peer_uid(&b).unwrap(), unsafe { libc::geteuid() });
        send_with_fds(&a, b"stop\n", &[]).unwrap();
        let (n, fds) = recv_with_fds(&b, &mut buf).unwrap();
        assert_eq!((&buf[..n], fds.len()), (&b"stop\n"[..], 0));
    }

    #[test]
    fn a_wait_on_a_quiet_fd_ends_at_its_bound() {
        let (a, _b) = UnixStream::pair().unwrap();
        let ready = poll_readable(&[a.as_fd_borrowed()], Some(Duration::from_millis(20))).unwrap();
        assert!(ready.is_empty());
    }
}
