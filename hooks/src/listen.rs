//! `h5i-hook listen --inside --port PORT --send SOCKET`: bind a TCP listener on
//! `127.0.0.1:PORT` inside the box's network namespace and hand its fd to h5i.
//!
//! Declared as a `createContainer` hook (after `loopback --inside`, so `lo` is up): the runtime
//! runs it inside the box's namespaces, before `pivot_root`, seccomp and Landlock, so the bind
//! happens in the box's own network namespace and the host path `SOCKET` (h5i's private runtime
//! directory) is still reachable. It connects to the AF_UNIX socket h5i bound there, sends the
//! listening fd with `SCM_RIGHTS`, and exits. h5i serves the credential proxy on that fd from
//! the host: the box reaches the proxy on its own loopback and nothing else of the host.
//!
//! Must never: bind in the host's network namespace (refused, as `loopback --inside` does), or
//! bind any address but `127.0.0.1`.

use std::io;
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;

/// Why the listener could not be handed over.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    /// `--inside` ran in the host's network namespace.
    #[error("refusing: h5i-hook listen --inside is running in the host's network namespace; to fix: declare it as a createContainer hook of a container with its own network namespace")]
    HostNamespace,
    /// The socket path is not absolute.
    #[error("refusing: --send {0} is not an absolute path; to fix: pass the absolute path of h5i's socket")]
    Relative(String),
    /// The port is 0 (the box is told the port before the bind, so it must be fixed).
    #[error("refusing: --port 0; to fix: pass the port the box was told")]
    ZeroPort,
    /// The bind failed.
    #[error("refusing: cannot listen on 127.0.0.1:{port} in the box: {source}; to fix: bring lo up first (declare `loopback --inside` before this hook) or pick a free port")]
    Bind {
        /// The port.
        port: u16,
        /// The OS error.
        source: io::Error,
    },
    /// h5i's socket could not be reached or the fd not sent.
    #[error("refusing: cannot hand the listener to h5i over {path}: {source}; to fix: h5i must be waiting on that socket (run the box through h5i)")]
    Send {
        /// The socket path.
        path: String,
        /// The OS error.
        source: io::Error,
    },
}

/// Bind `127.0.0.1:port` in this process's own network namespace (refusing the host's) and send
/// the listening fd over the AF_UNIX socket at `send`.
pub fn listen_inside(port: u16, send: &Path) -> Result<(), ListenError> {
    if !send.is_absolute() {
        return Err(ListenError::Relative(send.display().to_string()));
    }
    if port == 0 {
        return Err(ListenError::ZeroPort);
    }
    if crate::loopback::in_pid1_netns() {
        return Err(ListenError::HostNamespace);
    }
    let listener = TcpListener::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port))
        .map_err(|source| ListenError::Bind { port, source })?;
    let err = |source| ListenError::Send {
        path: send.display().to_string(),
        source,
    };
    let sock = UnixStream::connect(send).map_err(err)?;
    send_fd(&sock, listener.as_raw_fd()).map_err(err)
}

/// Send `fd` over `sock` as one `SCM_RIGHTS` message carrying one data byte.
pub fn send_fd(sock: &UnixStream, fd: RawFd) -> io::Result<()> {
    let mut byte = [b'L'];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    // Aligned control buffer, larger than CMSG_SPACE(sizeof(int)) on every Linux ABI.
    let mut control = [0u64; 4];
    // SAFETY: CMSG_SPACE is a pure size computation.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
    if space > std::mem::size_of_val(&control) {
        return Err(io::Error::other("control buffer too small"));
    }
    // SAFETY: msghdr is plain data; zeroed is a valid value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: msg points at a control buffer of `space` bytes, enough for one header.
    let cmsg = unsafe { libc::CMSG_FIRSTHDR(&msg) };
    if cmsg.is_null() {
        return Err(io::Error::other("no room for the control message"));
    }
    // SAFETY: cmsg points into `control`, which is aligned and large enough; CMSG_DATA points
    // at the int-sized payload inside it.
    unsafe {
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>(), fd);
    }
    // SAFETY: msg and everything it points to live across the call.
    let n = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    if n != 1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn bad_arguments_are_refused_before_anything_is_bound() {
        assert!(matches!(
            listen_inside(4999, Path::new("run/x.sock")),
            Err(ListenError::Relative(_))
        ));
        assert!(matches!(
            listen_inside(0, Path::new("/run/x.sock")),
            Err(ListenError::ZeroPort)
        ));
    }

    #[test]
    fn an_fd_crosses_a_unix_socket() {
        let (a, b) = UnixStream::pair().unwrap();
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        send_fd(&a, l.as_raw_fd()).unwrap();
        let mut buf = [0u8; 1];
        use std::io::Read;
        (&b).read_exact(&mut buf).unwrap();
        assert_eq!(buf, [b'L']);
    }
}
