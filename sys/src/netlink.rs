//! Netfilter netlink sockets opened inside another network namespace (or the caller's own), and
//! the bounded send and receive a request/dump exchange on one needs.
//!
//! A netlink socket belongs to the network namespace it was made in, for its whole life: one
//! made in a box's namespace by [`crate::ns_socket::made_in`] lets the caller speak to that
//! namespace's nf_tables without starting a program per request.
//!
//! Owns the calls only: what a message means is the caller's. Must never: block without the
//! caller's bound, or hand out a socket made in any namespace but the one named.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::Duration;

use rustix::net::{netlink, AddressFamily, RecvFlags, SendFlags, SocketFlags, SocketType};

use crate::poll::readable as poll_readable;

/// How long the forked child may take to hand the socket back.
const CHILD_TIMEOUT: Duration = Duration::from_secs(5);

/// A `NETLINK_NETFILTER` socket in the caller's own network namespace, close-on-exec: what a
/// hook running inside a box's namespaces hands to h5i, so h5i reads that namespace's
/// nf_tables after the box is gone (the socket keeps the namespace alive).
pub fn netfilter_socket() -> io::Result<OwnedFd> {
    Ok(rustix::net::socket_with(
        AddressFamily::NETLINK,
        SocketType::RAW,
        SocketFlags::CLOEXEC,
        Some(netlink::NETFILTER),
    )?)
}

/// A `NETLINK_NETFILTER` socket made inside the network namespace `net` (entered through the
/// user namespace `user` first, when given), close-on-exec.
pub fn netfilter_socket_in(
    net: BorrowedFd<'_>,
    user: Option<BorrowedFd<'_>>,
) -> io::Result<OwnedFd> {
    crate::ns_socket::made_in(net, user, CHILD_TIMEOUT, || {
        rustix::net::socket_with(
            AddressFamily::NETLINK,
            SocketType::RAW,
            SocketFlags::CLOEXEC,
            Some(netlink::NETFILTER),
        )
        .map_err(|e| e.raw_os_error())
    })
}

/// Send one whole netlink request (to the kernel: no address needed on an unbound socket).
pub fn send(sock: impl AsFd, request: &[u8]) -> io::Result<()> {
    let sent = rustix::net::send(&sock, request, SendFlags::empty())?;
    if sent != request.len() {
        return Err(io::Error::other(format!(
            "short netlink send: {sent} of {} bytes",
            request.len()
        )));
    }
    Ok(())
}

/// Receive one netlink datagram into `buf`, waiting at most `timeout`. A datagram larger than
/// `buf` is refused (`MSG_TRUNC` tells its real size), never read in part.
pub fn recv(sock: impl AsFd, buf: &mut [u8], timeout: Duration) -> io::Result<usize> {
    if poll_readable(&[sock.as_fd()], Some(timeout))?.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("no netlink answer within {}s", timeout.as_secs()),
        ));
    }
    loop {
        match rustix::net::recv(&sock, &mut *buf, RecvFlags::TRUNC) {
            Ok((_, whole)) if whole > buf.len() => {
                return Err(io::Error::other(format!(
                    "a netlink message of {whole} bytes does not fit the {}-byte buffer",
                    buf.len()
                )))
            }
            Ok((got, _)) => return Ok(got),
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// A socket made "in" the caller's own namespaces answers nf_tables like any other: a
    /// request of an unknown message type is refused by the kernel, proving the socket is a
    /// netfilter netlink socket and the exchange round-trips.
    #[test]
    fn a_socket_made_in_the_own_network_namespace_reaches_the_kernel() {
        let net = std::fs::File::open("/proc/self/ns/net").unwrap();
        let sock = netfilter_socket_in(net.as_fd(), None).unwrap();
        // nlmsghdr (len 20, type NFNL_SUBSYS_NFTABLES << 8 | 0xff, NLM_F_REQUEST|NLM_F_ACK)
        // and an nfgenmsg.
        let mut req = Vec::new();
        req.extend_from_slice(&20u32.to_ne_bytes());
        req.extend_from_slice(&((10u16 << 8) | 0xff).to_ne_bytes());
        req.extend_from_slice(&5u16.to_ne_bytes());
        req.extend_from_slice(&1u32.to_ne_bytes());
        req.extend_from_slice(&0u32.to_ne_bytes());
        req.extend_from_slice(&[1, 0, 0, 0]);
        send(&sock, &req).unwrap();
        let mut buf = [0u8; 8192];
        let n = recv(&sock, &mut buf, Duration::from_secs(5)).unwrap();
        assert!(n >= 20, "{n}");
        let ty = u16::from_ne_bytes([buf[4], buf[5]]);
        assert_eq!(ty, 2, "NLMSG_ERROR");
        let errno = i32::from_ne_bytes([buf[16], buf[17], buf[18], buf[19]]);
        assert!(errno < 0, "an unknown message type is refused: {errno}");
    }

    #[test]
    fn a_descriptor_that_is_not_a_namespace_is_refused() {
        let null = std::fs::File::open("/dev/null").unwrap();
        let e = netfilter_socket_in(null.as_fd(), None).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{e}");
    }
}
