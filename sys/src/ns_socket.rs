//! A socket made inside another process's namespaces. A threaded process cannot enter a user
//! namespace, and a socket belongs for its whole life to the network namespace it was made in:
//! so a forked child (single-threaded) enters the user namespace when one is given, then the
//! network namespace, makes the socket there with the caller's step, and hands it back over a
//! socketpair; the parent waits for the answer within a bound, then reaps the child.
//!
//! Owns the fork, the entering, the hand-back and the reaping. Must never: let the child
//! allocate or take a lock (between fork and `_exit` it makes only raw system calls: the
//! caller's step must do the same), hand out a socket the child did not make in the namespaces
//! named, wait without the caller's bound, or leave the child unreaped.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::time::Duration;

use crate::fd_passing::{self, Wait};
use crate::poll::readable as poll_readable;

/// The user namespace that owns the namespace `ns` (`NS_GET_USERNS`), close-on-exec.
pub fn owning_user_namespace(ns: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    // SAFETY: NS_GET_USERNS takes no argument and returns a new descriptor, or -1.
    let fd = unsafe { libc::ioctl(ns.as_raw_fd(), libc::NS_GET_USERNS) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is the fresh descriptor the ioctl returned, owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The parent of the user namespace `user` (`NS_GET_PARENT`), close-on-exec: where an
/// unprivileged caller that owns an ancestor holds the capabilities a nested namespace's own
/// non-root ids lose at exec.
pub fn parent_user_namespace(user: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    // SAFETY: NS_GET_PARENT takes no argument and returns a new descriptor, or -1.
    let fd = unsafe { libc::ioctl(user.as_raw_fd(), libc::NS_GET_PARENT) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is the fresh descriptor the ioctl returned, owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The socket `make` returns when run in a forked child that entered `user` (when given), then
/// `net`. `make` runs in that child: it must make only raw system calls, and says a failure by
/// its errno. The answer is awaited at most `within`; a child that gives none is killed.
pub fn made_in(
    net: BorrowedFd<'_>,
    user: Option<BorrowedFd<'_>>,
    within: Duration,
    make: impl FnOnce() -> Result<OwnedFd, i32>,
) -> io::Result<OwnedFd> {
    let (ours, theirs) = rustix::net::socketpair(
        rustix::net::AddressFamily::UNIX,
        rustix::net::SocketType::SEQPACKET,
        rustix::net::SocketFlags::CLOEXEC,
        None,
    )?;
    // SAFETY: fork has no memory preconditions; the child below makes only raw system calls
    // (setns, the caller's step, sendmsg through `send_with_fds`, which allocates nothing) and
    // `_exit`s, so it never touches a lock another thread of the parent may have held.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    if pid == 0 {
        let code = match enter(net, user).and_then(|()| make()) {
            Ok(sock) => fd_passing::send_with_fds(&theirs, b"s", &[sock.as_fd()]).is_err(),
            Err(errno) => fd_passing::send_with_fds(&theirs, &errno.to_ne_bytes(), &[]).is_err(),
        };
        // SAFETY: _exit ends the child at once, running no destructor or atexit handler of
        // the parent's state.
        unsafe { libc::_exit(i32::from(code)) };
    }
    drop(theirs);
    let answer = receive_socket(&ours, within);
    if answer.is_err() {
        // SAFETY: kill(2) of the child forked above, not yet reaped, so its pid is still its.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    let mut status = 0;
    // SAFETY: waitpid on our own child with a valid out-pointer; it has exited or been killed.
    while unsafe { libc::waitpid(pid, &mut status, 0) } < 0 {
        if io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            break;
        }
    }
    answer
}

/// In the forked child: enter the namespaces; the errno on failure.
fn enter(net: BorrowedFd<'_>, user: Option<BorrowedFd<'_>>) -> Result<(), i32> {
    let errno = |e: io::Error| e.raw_os_error().unwrap_or(libc::EIO);
    if let Some(user) = user {
        crate::ns::enter(user, crate::ns::Namespace::User).map_err(errno)?;
    }
    crate::ns::enter(net, crate::ns::Namespace::Network).map_err(errno)
}

/// A step for [`made_in`]: take `group` as the real, effective and saved gid (so the socket
/// is of that group in the namespaces entered), then connect a close-on-exec TCP socket to
/// `127.0.0.1:port`, a send (and so connect) bounded by `bound`. Async-signal-safe: system
/// calls on stack values only, the failure said by its errno.
pub fn connect_loopback_as(group: u32, port: u16, bound: Duration) -> Result<OwnedFd, i32> {
    use rustix::net::{sockopt, AddressFamily, SocketFlags, SocketType};
    let errno = |e: rustix::io::Errno| e.raw_os_error();
    let gid = rustix::process::Gid::from_raw(group);
    rustix::thread::set_thread_res_gid(gid, gid, gid).map_err(errno)?;
    let sock = rustix::net::socket_with(
        AddressFamily::INET,
        SocketType::STREAM,
        SocketFlags::CLOEXEC,
        None,
    )
    .map_err(errno)?;
    sockopt::set_socket_timeout(&sock, sockopt::Timeout::Send, Some(bound)).map_err(errno)?;
    let addr = std::net::SocketAddrV4::new(std::net::Ipv4Addr::LOCALHOST, port);
    rustix::net::connect(&sock, &addr).map_err(errno)?;
    Ok(sock)
}

/// This thread's errno, for a step that failed (EIO when the kernel set none).
pub fn errno() -> i32 {
    io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

fn receive_socket(ours: &OwnedFd, within: Duration) -> io::Result<OwnedFd> {
    if poll_readable(&[ours.as_fd()], Some(within))?.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "the child entering the namespaces did not answer",
        ));
    }
    let mut buf = [0u8; 4];
    let got = fd_passing::recv_with_fds(ours, &mut buf, 1, Wait::Block).map_err(io::Error::from)?;
    match (got.len, got.fds.into_iter().next()) {
        (1, Some(sock)) if buf[0] == b's' => Ok(sock),
        (4, None) => Err(io::Error::from_raw_os_error(i32::from_ne_bytes(buf))),
        _ => Err(io::Error::other(
            "the child entering the namespaces answered out of protocol",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// In this process's own network namespace (entered again through its descriptor, which
    /// needs CAP_SYS_ADMIN: unprivileged, the kernel's EPERM is the answer), taking its own
    /// gid: the socket comes back connected to a listener here; a closed port answers
    /// ECONNREFUSED.
    #[test]
    fn a_loopback_connect_made_in_a_child_comes_back_connected_or_refused() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let net = std::fs::File::open("/proc/self/ns/net").unwrap();
        let gid = crate::ids::egid();
        let (within, bound) = (Duration::from_secs(15), Duration::from_secs(5));
        let connect = || {
            made_in(net.as_fd(), None, within, || {
                connect_loopback_as(gid, port, bound)
            })
        };
        if crate::ids::euid() != 0 {
            let err = connect().unwrap_err();
            assert_eq!(err.raw_os_error(), Some(libc::EPERM), "{err}");
            return;
        }
        let ours = std::net::TcpStream::from(connect().unwrap());
        let (_, from) = l.accept().unwrap();
        assert_eq!(ours.local_addr().unwrap(), from);
        drop(l);
        let err = connect().unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ECONNREFUSED), "{err}");
    }
}
