//! A TCP listener made inside another process's network namespace: what h5i serves a box's
//! credential proxy on when the box's network namespace outlives the run (the box sandbox), so
//! each run gets a listener of its own on the box's loopback without a hook per run.
//!
//! Owns the socket's making only (through [`crate::ns_socket::made_in`]: a forked child enters
//! the namespaces, binds and listens, and hands the socket back). Must never: bind in any
//! namespace but the one named, or bind any address but the one the caller passed.

use std::io;
use std::net::SocketAddrV4;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::time::Duration;

/// A listening TCP socket bound to `addr` inside the network namespace `net` (entered through
/// the user namespace `user` first, when given), close-on-exec. The child that makes it gets
/// `within` to answer.
pub fn listener_in(
    net: BorrowedFd<'_>,
    user: Option<BorrowedFd<'_>>,
    addr: SocketAddrV4,
    within: Duration,
) -> io::Result<OwnedFd> {
    crate::ns_socket::made_in(net, user, within, || {
        // Only raw system calls here: this runs in the forked child (rustix's bind converts
        // the address on the stack).
        let errno = |e: rustix::io::Errno| e.raw_os_error();
        let sock = rustix::net::socket_with(
            rustix::net::AddressFamily::INET,
            rustix::net::SocketType::STREAM,
            rustix::net::SocketFlags::CLOEXEC,
            None,
        )
        .map_err(errno)?;
        rustix::net::bind(&sock, &addr).map_err(errno)?;
        rustix::net::listen(&sock, 128).map_err(errno)?;
        Ok(sock)
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, TcpListener, TcpStream};
    use std::os::fd::AsFd;

    /// Made "in" the caller's own network namespace, the listener is a real one on the address
    /// asked for: a connection to it is accepted.
    #[test]
    fn a_listener_made_in_the_own_network_namespace_accepts_a_connection() {
        let net = std::fs::File::open("/proc/self/ns/net").unwrap();
        let probe = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let port = probe.local_addr().unwrap().port();
        drop(probe);
        let addr = SocketAddrV4::new(Ipv4Addr::LOCALHOST, port);
        let fd = listener_in(net.as_fd(), None, addr, Duration::from_secs(5)).unwrap();
        let listener = TcpListener::from(fd);
        assert_eq!(listener.local_addr().unwrap(), addr.into());
        let _client = TcpStream::connect(addr).unwrap();
        listener.accept().unwrap();
    }
}
