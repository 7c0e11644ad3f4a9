//! Descriptor hygiene: closing (or marking close-on-exec) what a process inherited,
//! close-on-exec pipes, a descriptor's close-on-exec and non-blocking flags, duplicating above
//! a floor, pointing a standard descriptor elsewhere or closing it, placing descriptors at
//! fixed numbers for a program about to be exec'd, reads and writes by descriptor number, and
//! the uid behind a unix socket.
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

/// Mark every descriptor from 3 up close-on-exec (a `pre_exec` child: marking rather than
/// closing keeps std's own exec-error pipe working until the exec). Async-signal-safe:
/// `close_range(CLOSE_RANGE_CLOEXEC)`, or on kernels before 5.11 `F_SETFD` on every number the
/// open-files limit allows, no allocation.
pub fn mark_inherited_cloexec() -> io::Result<()> {
    // SAFETY: close_range with CLOSE_RANGE_CLOEXEC only changes descriptor flags.
    let r = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3u32,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    };
    if r == 0 {
        return Ok(());
    }
    // SAFETY: sysconf has no preconditions.
    let max = unsafe { libc::sysconf(libc::_SC_OPEN_MAX) }.clamp(3, 1 << 20) as libc::c_int;
    for fd in 3..max {
        // SAFETY: F_SETFD on a number that may not be open fails with EBADF, harmlessly.
        unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    }
    Ok(())
}

/// Mark `fd` close-on-exec (a descriptor a process inherited on purpose and must not pass on).
pub fn set_cloexec(fd: impl AsFd) -> io::Result<()> {
    Ok(rustix::io::fcntl_setfd(fd, rustix::io::FdFlags::CLOEXEC)?)
}

/// Turn `O_NONBLOCK` on (`true`) or off for the open file behind `fd` (shared by every copy
/// of it), keeping its other status flags.
pub fn set_nonblocking(fd: impl AsFd, on: bool) -> io::Result<()> {
    let fd = fd.as_fd();
    let mut flags = rustix::fs::fcntl_getfl(fd)?;
    flags.set(rustix::fs::OFlags::NONBLOCK, on);
    Ok(rustix::fs::fcntl_setfl(fd, flags)?)
}

/// Close the standard descriptor `target` (0, 1 or 2; else `EBADF`), in a child that must run
/// with it closed. Async-signal-safe.
pub fn close_std(target: RawFd) -> io::Result<()> {
    if !(0..=2).contains(&target) {
        return Err(io::Error::from_raw_os_error(libc::EBADF));
    }
    // SAFETY: closing a standard descriptor number; this process's std handles only ever name
    // it by number, so no owned descriptor is invalidated.
    if unsafe { libc::close(target) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// One `read(2)` from the descriptor number `fd`, which may not be open (a standard one a
/// process was handed: then `EBADF`). Async-signal-safe.
pub fn read_raw(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: `buf` is writable for its length for the call.
    let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// One `write(2)` to the descriptor number `fd`, which may not be open (a standard one a
/// process was handed: then `EBADF`). Async-signal-safe: no lock, no allocation, so a signal
/// handler or a forked child may call it.
pub fn write_raw(fd: RawFd, bytes: &[u8]) -> io::Result<usize> {
    // SAFETY: `bytes` is readable for its length for the call.
    let n = unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// Clear close-on-exec on the descriptor number `fd` (a `pre_exec` child handing it to the
/// program it becomes). Async-signal-safe; a number that is not open answers `EBADF`.
pub fn keep_across_exec(fd: RawFd) -> io::Result<()> {
    // SAFETY: F_GETFD only reads the descriptor's flags.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
    // SAFETY: F_SETFD only changes the descriptor's flags.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether the descriptor number `fd` (handed over at exec at a fixed number, so perhaps not
/// open) is a socket in the listening state.
pub fn is_listening_socket(fd: RawFd) -> bool {
    let mut on: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes one int into `on`, whose size `len` gives; a non-socket or a
    // number that is not open answers -1.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_ACCEPTCONN,
            (&mut on as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    rc == 0 && on == 1
}

/// Whether the descriptor number `fd` (perhaps not open) is open and a pipe.
pub fn is_pipe(fd: RawFd) -> bool {
    // SAFETY: fstat writes into a zeroed stat struct on this stack; a number that is not open
    // answers EBADF.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        libc::fstat(fd, &mut st) == 0 && st.st_mode & libc::S_IFMT == libc::S_IFIFO
    }
}

/// Whether the descriptor number `fd` (perhaps not open: a standard one the caller closed) is
/// open for reading.
pub fn is_open_for_reading(fd: RawFd) -> bool {
    // SAFETY: F_GETFL only reads the open file's status flags.
    let fl = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    fl >= 0 && (fl & libc::O_ACCMODE) != libc::O_WRONLY
}

/// Whether the descriptor number `fd` is open (`F_GETFD` answers). Async-signal-safe: an
/// `.init_array` constructor may ask before Rust's runtime puts `/dev/null` on a closed
/// standard descriptor.
pub fn is_open(fd: RawFd) -> bool {
    // SAFETY: F_GETFD only reads the descriptor table; a number that is not open answers EBADF.
    unsafe { libc::fcntl(fd, libc::F_GETFD) != -1 }
}

/// The open-file status flags (`F_GETFL`: access mode, `O_APPEND`, `O_NONBLOCK`, ...) of the
/// descriptor number `fd`; `None` when it is not open.
pub fn status_flags(fd: RawFd) -> Option<i32> {
    // SAFETY: F_GETFL only reads the open file's status flags.
    let f = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    (f >= 0).then_some(f)
}

/// The device number (`st_rdev`) of the descriptor number `fd` when it is open and a
/// character device.
pub fn char_device_of(fd: RawFd) -> Option<u64> {
    // SAFETY: fstat writes into a zeroed stat struct on this stack; a number that is not open
    // answers EBADF.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        (libc::fstat(fd, &mut st) == 0 && st.st_mode & libc::S_IFMT == libc::S_IFCHR)
            .then_some(st.st_rdev)
    }
}

/// The device number of the character device at `path` (followed if a symlink).
pub fn char_device_at(path: &std::ffi::CStr) -> Option<u64> {
    // SAFETY: stat writes into a zeroed struct on this stack; `path` is NUL-terminated.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        (libc::stat(path.as_ptr(), &mut st) == 0 && st.st_mode & libc::S_IFMT == libc::S_IFCHR)
            .then_some(st.st_rdev)
    }
}

/// Point the standard descriptor `target` (0, 1 or 2; else `EBADF`) at a fresh open of
/// `/dev/null` with the open flags `flags` (inherited across exec). Async-signal-safe: open,
/// dup2 and close, no allocation, so a child between fork and exec may call it.
pub fn point_std_at_dev_null(target: RawFd, flags: i32) -> io::Result<()> {
    if !(0..=2).contains(&target) {
        return Err(io::Error::from_raw_os_error(libc::EBADF));
    }
    // SAFETY: open of a NUL-terminated path; returns a new descriptor or -1.
    let new = unsafe { libc::open(c"/dev/null".as_ptr(), flags | libc::O_CLOEXEC) };
    if new < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: dup2 between the descriptor just opened and a standard one (dup2 clears
    // close-on-exec on the target); no memory involved.
    let rc = unsafe { libc::dup2(new, target) };
    let err = io::Error::last_os_error();
    // SAFETY: `new` is this function's own and no longer needed.
    unsafe { libc::close(new) };
    if rc < 0 {
        return Err(err);
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
    fn flags_set_are_the_flags_read_and_a_raw_write_reaches_the_reader() {
        let (r, w) = pipe().unwrap();
        let plain = dup_at_least(&r, 50).unwrap();
        rustix::io::fcntl_setfd(&plain, rustix::io::FdFlags::empty()).unwrap();
        set_cloexec(&plain).unwrap();
        assert!(rustix::io::fcntl_getfd(&plain)
            .unwrap()
            .contains(rustix::io::FdFlags::CLOEXEC));
        set_nonblocking(&r, true).unwrap();
        let mut buf = [0u8; 4];
        let empty = read_raw(r.as_raw_fd(), &mut buf).unwrap_err();
        assert_eq!(empty.kind(), io::ErrorKind::WouldBlock);
        assert_eq!(write_raw(w.as_raw_fd(), b"hey").unwrap(), 3);
        assert_eq!(read_raw(r.as_raw_fd(), &mut buf).unwrap(), 3);
        set_nonblocking(&r, false).unwrap();
        assert!(!rustix::fs::fcntl_getfl(&r)
            .unwrap()
            .contains(rustix::fs::OFlags::NONBLOCK));
        assert_eq!(close_std(3).unwrap_err().raw_os_error(), Some(libc::EBADF));
    }

    #[test]
    fn probes_by_number_tell_a_listener_a_pipe_and_a_closed_number_apart() {
        let listener =
            std::os::unix::net::UnixListener::bind(tempfile::tempdir().unwrap().path().join("s"))
                .unwrap();
        let (r, w) = pipe().unwrap();
        let closed = dup_at_least(&r, 300).unwrap();
        let closed_no = closed.as_raw_fd();
        drop(closed);
        assert!(is_listening_socket(listener.as_raw_fd()));
        assert!(!is_listening_socket(r.as_raw_fd()) && !is_listening_socket(closed_no));
        assert!(is_pipe(r.as_raw_fd()) && !is_pipe(listener.as_raw_fd()) && !is_pipe(closed_no));
        assert!(is_open_for_reading(r.as_raw_fd()));
        assert!(!is_open_for_reading(w.as_raw_fd()) && !is_open_for_reading(closed_no));
        assert_eq!(
            keep_across_exec(closed_no).unwrap_err().raw_os_error(),
            Some(libc::EBADF)
        );
        keep_across_exec(r.as_raw_fd()).unwrap();
        assert!(!rustix::io::fcntl_getfd(&r)
            .unwrap()
            .contains(rustix::io::FdFlags::CLOEXEC));
    }

    /// In a forked child (its standard descriptors are its own): stdout pointed at a
    /// read-only /dev/null refuses writes, pointed at a write-only one takes them; both are the
    /// same character device as the path; a closed number is neither open nor has flags.
    #[test]
    fn a_standard_descriptor_pointed_at_dev_null_takes_its_flags() {
        // SAFETY: the child makes only the async-signal-safe calls of the functions it tests.
        let status = unsafe {
            crate::fork_exec::in_forked_child(|| {
                let null = char_device_at(c"/dev/null");
                let ro = point_std_at_dev_null(1, libc::O_RDONLY).is_ok()
                    && write_raw(1, b"x").is_err()
                    && status_flags(1).map(|f| f & libc::O_ACCMODE) == Some(libc::O_RDONLY);
                let wo = point_std_at_dev_null(1, libc::O_WRONLY).is_ok()
                    && write_raw(1, b"x").ok() == Some(1)
                    && null.is_some()
                    && char_device_of(1) == null;
                let closed = close_std(1).is_ok() && !is_open(1) && status_flags(1).is_none();
                if ro && wo && closed && point_std_at_dev_null(7, 0).is_err() {
                    0
                } else {
                    1
                }
            })
        }
        .unwrap();
        assert_eq!(crate::proc::Ended::from_wait_status(status).code, Some(0));
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
