//! The kernel seam of the socket gate: every kernel call the gate makes, one small function
//! each, all of them h5i-sys's: the seccomp user-notification ioctls
//! (`h5i_sys::seccomp`), `poll(2)` (`h5i_sys::poll`), and the hand-off's `recvmsg` with
//! `SCM_RIGHTS` and `SO_PEERCRED` (`fd_passing`, `fds`). Must never: decide anything (that is `decide`/`classify`
//! in the parent module).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// One pending notification, as the kernel reported it.
pub(super) type Notification = h5i_sys::seccomp::Notification;

/// Receive the next notification on `notify` (blocks only when none is pending: call it after
/// `poll` reported `POLLIN`). `ENOENT` means the caller died before we read it.
pub(super) fn recv(notify: BorrowedFd<'_>) -> io::Result<Notification> {
    h5i_sys::seccomp::recv(notify)
}

/// Whether notification `id` is still pending (its caller still blocked in the syscall).
pub(super) fn id_valid(notify: BorrowedFd<'_>, id: u64) -> io::Result<bool> {
    h5i_sys::seccomp::id_valid(notify, id)
}

/// Answer notification `id`: let the syscall run (`SECCOMP_USER_NOTIF_FLAG_CONTINUE`) or fail
/// it with `-errno`. `Ok(false)` when the caller is already gone (`ENOENT`).
pub(super) fn answer(notify: BorrowedFd<'_>, id: u64, errno: Option<i32>) -> io::Result<bool> {
    h5i_sys::seccomp::answer(notify, id, errno)
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
