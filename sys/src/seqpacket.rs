//! `AF_UNIX` `SOCK_SEQPACKET` sockets at a path: the box sandbox's init socket (the host binds
//! and listens, the init inherits the listener and accepts, each run's h5i connects with
//! `SO_PASSCRED`, so the kernel names the sender of every message it receives).
//!
//! Owns the calls only: the protocol spoken over them is `h5i_runtime::sandbox`'s. Must never:
//! hand out a descriptor without close-on-exec.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};

fn socket() -> io::Result<OwnedFd> {
    Ok(rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )?)
}

/// A listening socket bound at `path` with room for `backlog` pending connections.
pub fn listen_at(path: &Path, backlog: i32) -> io::Result<OwnedFd> {
    let fd = socket()?;
    rustix::net::bind(&fd, &SocketAddrUnix::new(path)?)?;
    rustix::net::listen(&fd, backlog)?;
    Ok(fd)
}

/// A socket connected to the listener at `path`, with `SO_PASSCRED` on (every message it
/// receives carries its sender's credentials).
pub fn connect_with_credentials(path: &Path) -> io::Result<OwnedFd> {
    let fd = socket()?;
    rustix::net::connect(&fd, &SocketAddrUnix::new(path)?)?;
    rustix::net::sockopt::set_socket_passcred(&fd, true)?;
    Ok(fd)
}

/// Whether `fd` is a listening socket (`SO_ACCEPTCONN`).
pub fn is_listening(fd: impl AsFd) -> bool {
    rustix::net::sockopt::socket_acceptconn(fd).unwrap_or(false)
}

/// Accept one pending connection on `listener`, close-on-exec.
pub fn accept(listener: impl AsFd) -> io::Result<OwnedFd> {
    Ok(rustix::net::accept_with(listener, SocketFlags::CLOEXEC)?)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_is_accepted_and_only_the_listener_listens() {
        let path = std::env::temp_dir().join(format!("h5i-sys-seqpacket-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let listener = listen_at(&path, 4).unwrap();
        assert!(is_listening(&listener));
        let conn = connect_with_credentials(&path).unwrap();
        assert!(!is_listening(&conn));
        let _accepted = accept(&listener).unwrap();
        std::fs::remove_file(&path).unwrap();
    }
}
