//! A CONNECT tunnel's byte pump: both directions at once, half-closes passed on, and the bytes
//! moved kernel-side with `splice(2)` through a pipe (falling back to a large-buffer copy when
//! splice is refused).
//!
//! Owns copying and the close handshake. Must never: look at the bytes, or leave either socket
//! open when one direction fails.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// Bytes moved per `splice` call, and the pipe size asked for.
const CHUNK: usize = 1 << 20;
/// Buffer of the fallback copy.
const COPY_BUF: usize = 256 * 1024;

/// Pump `a <-> b` until both directions end. `a_to_b` and `b_to_a` are owned clones so one
/// direction can run on its own thread.
pub(crate) fn run(a: TcpStream, b: TcpStream) -> io::Result<()> {
    let a2 = a.try_clone()?;
    let b2 = b.try_clone()?;
    let other = std::thread::Builder::new()
        .name("h5i-egress-tunnel".into())
        .spawn(move || pump(&a2, &b2))?;
    let r1 = pump(&b, &a);
    let r2 = other
        .join()
        .unwrap_or_else(|_| Err(io::Error::other("tunnel thread panicked")));
    r1.and(r2)
}

/// Copy `from` -> `to` until EOF, then half-close `to`. On an error, shut both down so the other
/// direction ends too.
fn pump(from: &TcpStream, to: &TcpStream) -> io::Result<()> {
    let r = match splice_copy(from, to) {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => copy(from, to),
        other => other,
    };
    match r {
        Ok(()) => {
            let _ = to.shutdown(Shutdown::Write);
            Ok(())
        }
        Err(e) => {
            let _ = from.shutdown(Shutdown::Both);
            let _ = to.shutdown(Shutdown::Both);
            Err(e)
        }
    }
}

fn copy(mut from: &TcpStream, mut to: &TcpStream) -> io::Result<()> {
    let mut buf = vec![0u8; COPY_BUF];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        to.write_all(&buf[..n])?;
    }
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: `fds` is a valid two-element array for pipe2 to fill.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 succeeded, so both descriptors are open and owned by nobody else.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // A bigger pipe means fewer round trips; refusal (the pipe-max-size limit) is harmless.
    // SAFETY: F_SETPIPE_SZ on a pipe descriptor we own; the result is only checked, not trusted.
    let _ = unsafe { libc::fcntl(w.as_raw_fd(), libc::F_SETPIPE_SZ, CHUNK as libc::c_int) };
    Ok((r, w))
}

fn splice(from: RawFd, to: RawFd, len: usize) -> io::Result<usize> {
    loop {
        // SAFETY: both descriptors are open for the duration of the call (owned by the caller's
        // sockets and pipe); null offsets are allowed for sockets and pipes.
        let n = unsafe {
            libc::splice(
                from,
                std::ptr::null_mut(),
                to,
                std::ptr::null_mut(),
                len,
                libc::SPLICE_F_MOVE,
            )
        };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// `EINVAL` comes back only when nothing has moved yet (splice unsupported here), so the caller
/// can fall back to copying without losing bytes held in the pipe.
fn splice_copy(from: &TcpStream, to: &TcpStream) -> io::Result<()> {
    let (pr, pw) = pipe()?;
    let mut moved = false;
    loop {
        let n = match splice(from.as_raw_fd(), pw.as_raw_fd(), CHUNK) {
            Err(e) if moved && e.raw_os_error() == Some(libc::EINVAL) => {
                return Err(io::Error::other(e))
            }
            r => r?,
        };
        moved = true;
        if n == 0 {
            return Ok(());
        }
        let mut left = n;
        while left > 0 {
            // Bytes are in the pipe now: no error here may read as "splice unsupported".
            let m = splice(pr.as_raw_fd(), to.as_raw_fd(), left).map_err(io::Error::other)?;
            if m == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            left -= m;
        }
    }
}
