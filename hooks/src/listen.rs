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
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;

use h5i_sys::fd_passing::send_with_fds;

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
    hand_over(send, b"L", listener.as_fd()).map_err(err)
}

/// Hand `fd` to the h5i waiting on the AF_UNIX socket `send` (the `--send` of this hook and of
/// `loopback --deny-counted`): one data byte, `tag`, carries it (h5i reads exactly one).
pub(crate) fn hand_over(send: &Path, tag: &[u8; 1], fd: BorrowedFd<'_>) -> io::Result<()> {
    let sock = UnixStream::connect(send)?;
    send_with_fds(&sock, tag, &[fd]).map_err(io::Error::from)
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
}
