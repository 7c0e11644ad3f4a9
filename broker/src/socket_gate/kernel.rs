//! The kernel seam of the socket gate: every `unsafe` call the gate makes, one small safe
//! wrapper each.
//!
//! Owns the seccomp user-notification ioctls (`SECCOMP_IOCTL_NOTIF_RECV`, `_ID_VALID`,
//! `_SEND`) and `poll(2)`; the hand-off's `recvmsg` with `SCM_RIGHTS` and `SO_PEERCRED` are
//! h5i-sys's (`fd_passing`, `fds`). Must never: decide anything (that is `decide`/`classify`
//! in the parent module).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// One pending notification, as the kernel reported it.
pub(super) type Notification = libc::seccomp_notif;

/// Receive the next notification on `notify` (blocks only when none is pending: call it after
/// `poll` reported `POLLIN`). `ENOENT` means the caller died before we read it.
pub(super) fn recv(notify: BorrowedFd<'_>) -> io::Result<Notification> {
    // SAFETY: `seccomp_notif` is plain old data (integers only); all-zero is a valid value, and
    // the kernel requires the buffer to be zeroed before RECV.
    let mut notif: Notification = unsafe { std::mem::zeroed() };
    // SAFETY: `notify` is a live descriptor for the borrow's lifetime; the ioctl writes at most
    // `size_of::<seccomp_notif>()` bytes (its size is encoded in the request number) into
    // `notif`, which we own exclusively.
    let rc = unsafe {
        libc::ioctl(
            notify.as_raw_fd(),
            libc::SECCOMP_IOCTL_NOTIF_RECV,
            &mut notif as *mut Notification,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(notif)
}

/// Whether notification `id` is still pending (its caller still blocked in the syscall).
pub(super) fn id_valid(notify: BorrowedFd<'_>, id: u64) -> io::Result<bool> {
    // SAFETY: `notify` is live; the kernel reads one `u64` from the pointer, which points at
    // `id` on our stack for the duration of the call.
    let rc = unsafe {
        libc::ioctl(
            notify.as_raw_fd(),
            libc::SECCOMP_IOCTL_NOTIF_ID_VALID,
            &id as *const u64,
        )
    };
    if rc == 0 {
        return Ok(true);
    }
    let err = io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::ENOENT) {
        Ok(false)
    } else {
        Err(err)
    }
}

/// Answer notification `id`: let the syscall run (`SECCOMP_USER_NOTIF_FLAG_CONTINUE`) or fail
/// it with `-errno`. `Ok(false)` when the caller is already gone (`ENOENT`).
pub(super) fn answer(notify: BorrowedFd<'_>, id: u64, errno: Option<i32>) -> io::Result<bool> {
    let resp = libc::seccomp_notif_resp {
        id,
        val: 0,
        error: errno.map_or(0, |e| -e),
        flags: if errno.is_none() {
            libc::SECCOMP_USER_NOTIF_FLAG_CONTINUE as u32
        } else {
            0
        },
    };
    // SAFETY: `notify` is live; the kernel reads `size_of::<seccomp_notif_resp>()` bytes from
    // `resp`, a fully initialised value on our stack.
    let rc = unsafe {
        libc::ioctl(
            notify.as_raw_fd(),
            libc::SECCOMP_IOCTL_NOTIF_SEND,
            &resp as *const libc::seccomp_notif_resp,
        )
    };
    if rc == 0 {
        return Ok(true);
    }
    let err = io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::ENOENT) {
        Ok(false)
    } else {
        Err(err)
    }
}

/// `poll(2)` over `fds`; `timeout_ms < 0` waits without limit. `EINTR` is reported as zero
/// ready descriptors.
pub(super) fn poll(fds: &mut [libc::pollfd], timeout_ms: i32) -> io::Result<usize> {
    let timeout = u64::try_from(timeout_ms)
        .ok()
        .map(std::time::Duration::from_millis);
    match h5i_sys::poll::wait(fds, timeout) {
        Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(0),
        other => other,
    }
}

/// This process's effective uid.
pub(super) fn euid() -> u32 {
    h5i_sys::ids::euid()
}

/// Whether `fd` is a seccomp user-notification descriptor (an anonymous inode the kernel
/// names `[seccomp notify]`).
pub(super) fn is_seccomp_notify(fd: BorrowedFd<'_>) -> bool {
    std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .map(|target| target.as_os_str() == "anon_inode:seccomp notify")
        .unwrap_or(false)
}
