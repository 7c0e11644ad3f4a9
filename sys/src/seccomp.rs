//! seccomp's calls that neither rustix nor libc wraps: installing a compiled filter that
//! returns a user-notification listener (`seccomp(SECCOMP_SET_MODE_FILTER,
//! SECCOMP_FILTER_FLAG_NEW_LISTENER)`), and the listener's ioctls (`SECCOMP_IOCTL_NOTIF_RECV`,
//! `_ID_VALID`, `_SEND`).
//!
//! Owns the calls only: which filter is built (h5i-runc's confinement plan) and what a
//! notification is answered (the broker's socket gate) are the callers'. Must never: answer a
//! notification on its own, or install a filter without the caller having set
//! `no_new_privs` (the kernel refuses an unprivileged caller otherwise: `EACCES`). Tested
//! below on a listener-less descriptor; the gate's and the runtime's tests drive real
//! listeners.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// One pending notification, as the kernel reported it.
pub use libc::seccomp_notif as Notification;
/// One BPF instruction of a filter.
pub use libc::sock_filter as Instruction;

/// Install `program` on the calling thread and return the filter's notification listener
/// (close-on-exec, as the kernel makes it). A program longer than `u16::MAX` instructions is
/// refused (`InvalidInput`).
pub fn install_with_listener(program: &[Instruction]) -> io::Result<OwnedFd> {
    let len = u16::try_from(program.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "filter too long"))?;
    let prog = libc::sock_fprog {
        len,
        filter: program.as_ptr() as *mut Instruction,
    };
    // SAFETY: `prog` points at `program`'s `len` instructions, alive for the call; the kernel
    // copies them and returns a new descriptor or -1.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            libc::SECCOMP_FILTER_FLAG_NEW_LISTENER,
            &prog as *const libc::sock_fprog,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just made this descriptor for us; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// `Ok(false)` for the kernel's `ENOENT` (the notification's caller is gone), the error else.
fn gone_or(rc: libc::c_int) -> io::Result<bool> {
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

/// Receive the next notification on `listener` (blocks only when none is pending: call it
/// after a poll reported `POLLIN`). `ENOENT` means the caller died before it was read.
pub fn recv(listener: BorrowedFd<'_>) -> io::Result<Notification> {
    // SAFETY: `seccomp_notif` is plain old data (integers only); all-zero is a valid value, and
    // the kernel requires the buffer to be zeroed before RECV.
    let mut notif: Notification = unsafe { std::mem::zeroed() };
    // SAFETY: `listener` is live for the borrow; the ioctl writes at most
    // `size_of::<seccomp_notif>()` bytes (its size is encoded in the request number) into
    // `notif`, which this frame owns exclusively.
    let rc = unsafe {
        libc::ioctl(
            listener.as_raw_fd(),
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
pub fn id_valid(listener: BorrowedFd<'_>, id: u64) -> io::Result<bool> {
    // SAFETY: `listener` is live; the kernel reads one `u64` from the pointer, which points at
    // `id` on this stack for the duration of the call.
    gone_or(unsafe {
        libc::ioctl(
            listener.as_raw_fd(),
            libc::SECCOMP_IOCTL_NOTIF_ID_VALID,
            &id as *const u64,
        )
    })
}

/// Answer notification `id`: let the syscall run (`SECCOMP_USER_NOTIF_FLAG_CONTINUE`, for
/// `errno` `None`) or fail it with `-errno`. `Ok(false)` when the caller is already gone.
pub fn answer(listener: BorrowedFd<'_>, id: u64, errno: Option<i32>) -> io::Result<bool> {
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
    // SAFETY: `listener` is live; the kernel reads `size_of::<seccomp_notif_resp>()` bytes
    // from `resp`, a fully initialised value on this stack.
    gone_or(unsafe {
        libc::ioctl(
            listener.as_raw_fd(),
            libc::SECCOMP_IOCTL_NOTIF_SEND,
            &resp as *const libc::seccomp_notif_resp,
        )
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    /// A descriptor that is no listener is refused by the kernel, never read as one.
    #[test]
    fn a_descriptor_that_is_no_listener_is_refused() {
        let (r, _w) = crate::fds::pipe().unwrap();
        assert_eq!(
            recv(r.as_fd()).unwrap_err().raw_os_error(),
            Some(libc::ENOTTY)
        );
        assert_eq!(
            id_valid(r.as_fd(), 1).unwrap_err().raw_os_error(),
            Some(libc::ENOTTY)
        );
        assert_eq!(
            answer(r.as_fd(), 1, Some(libc::EPERM))
                .unwrap_err()
                .raw_os_error(),
            Some(libc::ENOTTY)
        );
    }
}
