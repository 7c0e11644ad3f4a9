//! Descriptor hygiene: closing what a process inherited, close-on-exec pipes, duplicating
//! above a floor, pointing a standard descriptor elsewhere, placing descriptors at fixed
//! numbers for a program about to be exec'd, and the uid behind a unix socket.
//!
//! Must never: wait on a descriptor (that is [`crate::poll`]'s), or leave a descriptor it made
//! inheritable across exec unless the caller asked for exactly that ([`point_std`],
//! [`place_for_exec`]).

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};

/// Close every descriptor from 3 up (a process that crosses a privilege boundary starts clean).
pub fn close_inherited_fds() -> io::Result<()> {
    // SAFETY: close_range only closes descriptors; the caller holds none from 3 up that it
    // still means to use (it is the first thing such a process does).
    let rc = unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A close-on-exec pipe: (read end, write end).
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    Ok(rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?)
}

/// A close-on-exec duplicate of `fd` numbered at least `min`.
pub fn dup_at_least(fd: impl AsFd, min: RawFd) -> io::Result<OwnedFd> {
    Ok(rustix::io::fcntl_dupfd_cloexec(fd, min)?)
}

/// Point the standard descriptor `target` (0, 1 or 2) of this process at `to`, as dup2 does
/// (what a child spawned from now on inherits there).
pub fn point_std(target: RawFd, to: BorrowedFd<'_>) -> io::Result<()> {
    if !(0..=2).contains(&target) {
        return Err(io::Error::from_raw_os_error(libc::EBADF));
    }
    // SAFETY: dup2 of a live descriptor onto a standard one; no memory is involved, and the
    // descriptor it replaces is a standard one this process's std handles only ever name by
    // number.
    if unsafe { libc::dup2(to.as_raw_fd(), target) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The most descriptors [`place_for_exec`] places at once.
pub const MAX_PLACED: usize = 8;

/// In a forked child about to exec (a `pre_exec` closure): make each `(source, target)` pair's
/// `target` a copy of `source`, inherited across exec (no close-on-exec), whatever the numbers
/// (a source may sit at another pair's target: every source is first copied out of the way,
/// close-on-exec, above every target). Async-signal-safe: system calls on a stack array, no
/// allocation. More than [`MAX_PLACED`] pairs, or a negative number, are refused (`EINVAL`).
pub fn place_for_exec(pairs: &[(RawFd, RawFd)]) -> io::Result<()> {
    if pairs.len() > MAX_PLACED || pairs.iter().any(|&(s, t)| s < 0 || t < 0) {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let floor = pairs.iter().map(|&(_, t)| t + 1).max().unwrap_or(0).max(10);
    let mut moved: [RawFd; MAX_PLACED] = [-1; MAX_PLACED];
    for (m, &(source, _)) in moved.iter_mut().zip(pairs) {
        // SAFETY: F_DUPFD_CLOEXEC makes a new descriptor and touches no memory; a source that
        // is not open answers EBADF.
        *m = unsafe { libc::fcntl(source, libc::F_DUPFD_CLOEXEC, floor) };
        if *m < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    for (&m, &(_, target)) in moved.iter().zip(pairs) {
        // SAFETY: dup2 of a descriptor made above onto the caller's target number, which the
        // caller (a child about to exec) means to replace; no memory is involved.
        if unsafe { libc::dup2(m, target) } < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The uid of the process at the other end of a connected unix socket (`SO_PEERCRED`), as this
/// process's user namespace sees it.
pub fn peer_uid(sock: impl AsFd) -> io::Result<u32> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: u32::MAX,
        gid: u32::MAX,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: the kernel writes at most `len` bytes into `cred`, a `ucred` this frame owns, and
    // updates `len`; `sock` is a live descriptor for the call.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_fd().as_raw_fd(),
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    /// Two sockets placed at 3 and 4 and the first again at 5: the shell the child becomes finds
    /// each where it was put (reading through 3 what was written into the socket placed there),
    /// and none of the copies made on the way at 10..=12 (the shell itself keeps a saved stdin
    /// at 10, so 11 and 12 are looked at).
    #[test]
    fn descriptors_placed_for_exec_land_at_their_targets_even_crossed() {
        use std::os::unix::process::CommandExt;
        let (r1, mut w1) = UnixStream::pair().unwrap();
        let (r2, mut w2) = UnixStream::pair().unwrap();
        std::io::Write::write_all(&mut w1, b"one\n").unwrap();
        std::io::Write::write_all(&mut w2, b"two\n").unwrap();
        let (a, b) = (r1.as_raw_fd(), r2.as_raw_fd());
        let pairs = [(a, 3), (b, 4), (a, 5)];
        let mut cmd = std::process::Command::new("sh");
        cmd.args([
            "-c",
            "read x <&3; read y <&4; [ \"$x$y\" = onetwo ] && [ -e /proc/self/fd/5 ] && [ ! -e /proc/self/fd/11 ] && [ ! -e /proc/self/fd/12 ] || { echo \"$x$y\"; ls -l /proc/self/fd; exit 1; }",
        ]);
        // SAFETY: the closure calls only place_for_exec (async-signal-safe).
        unsafe { cmd.pre_exec(move || place_for_exec(&pairs)) };
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
        assert_eq!(
            place_for_exec(&[(a, -1)]).unwrap_err().raw_os_error(),
            Some(libc::EINVAL)
        );
        drop((w1, w2));
    }

    #[test]
    fn a_duplicate_lands_above_its_floor_and_the_peer_is_this_user() {
        let (a, b) = UnixStream::pair().unwrap();
        let dup = dup_at_least(&a, 100).unwrap();
        assert!(dup.as_raw_fd() >= 100);
        // SAFETY: geteuid has no preconditions.
        assert_eq!(peer_uid(&b).unwrap(), unsafe { libc::geteuid() });
    }
}
