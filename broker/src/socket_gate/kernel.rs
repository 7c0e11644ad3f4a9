//! The kernel seam of the socket gate: every `unsafe` call the gate makes, one small safe
//! wrapper each.
//!
//! Owns the seccomp user-notification ioctls (`SECCOMP_IOCTL_NOTIF_RECV`, `_ID_VALID`,
//! `_SEND`), `poll(2)`, `recvmsg(2)` with `SCM_RIGHTS`, and `SO_PEERCRED`. Must never: decide
//! anything (that is `decide`/`classify` in the parent module), or hand out a received
//! descriptor other than as an `OwnedFd` (so every refused descriptor is closed on drop).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

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
    // SAFETY: `fds` is a valid, exclusively borrowed slice of `pollfd`; the kernel writes only
    // `revents` of its `len()` elements.
    let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
    if rc < 0 {
        let err = io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::EINTR) {
            return Ok(0);
        }
        return Err(err);
    }
    Ok(rc as usize)
}

/// What one `recvmsg` brought.
pub(super) struct Received {
    /// Bytes written into the caller's buffer; 0 is end of stream.
    pub len: usize,
    /// Descriptors passed with `SCM_RIGHTS` (close-on-exec).
    pub fds: Vec<OwnedFd>,
    /// The kernel cut the data or the control message short (`MSG_TRUNC`/`MSG_CTRUNC`).
    pub truncated: bool,
}

/// Room for this many descriptors in one control message; more is reported as truncated.
const MAX_FDS: usize = 4;

/// One non-blocking `recvmsg` on a connected unix stream, collecting `SCM_RIGHTS`
/// descriptors as close-on-exec `OwnedFd`s.
pub(super) fn recv_with_fds(sock: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<Received> {
    // u64 elements keep the control buffer aligned for `cmsghdr`.
    let mut control = [0u64; 16];
    // SAFETY: CMSG_SPACE is a pure size computation.
    let space = unsafe { libc::CMSG_SPACE((MAX_FDS * std::mem::size_of::<RawFd>()) as u32) };
    let control_len = (space as usize).min(std::mem::size_of_val(&control));
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: `msghdr` is plain old data; all-zero is a valid (empty) header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = control_len as _;
    // SAFETY: `sock` is live; `msg` points at `iov` (our exclusively borrowed `buf`) and at
    // `control`, both alive for the call and sized as declared in `msg`.
    let n = unsafe {
        libc::recvmsg(
            sock.as_raw_fd(),
            &mut msg,
            libc::MSG_CMSG_CLOEXEC | libc::MSG_DONTWAIT,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut fds = Vec::new();
    // SAFETY: `msg` was filled by a successful recvmsg; CMSG_FIRSTHDR/CMSG_NXTHDR walk only
    // within `msg_control[..msg_controllen]`.
    let mut cmsg = unsafe { libc::CMSG_FIRSTHDR(&msg) };
    while !cmsg.is_null() {
        // SAFETY: `cmsg` is non-null and points inside the control buffer (see above).
        let hdr = unsafe { &*cmsg };
        if hdr.cmsg_level == libc::SOL_SOCKET && hdr.cmsg_type == libc::SCM_RIGHTS {
            // SAFETY: CMSG_LEN is a pure size computation.
            let header = unsafe { libc::CMSG_LEN(0) } as usize;
            let count =
                (hdr.cmsg_len as usize).saturating_sub(header) / std::mem::size_of::<RawFd>();
            // SAFETY: an SCM_RIGHTS message's data is `count` ints within the buffer.
            let data = unsafe { libc::CMSG_DATA(cmsg) }.cast::<RawFd>();
            for i in 0..count {
                // SAFETY: `i < count`, so the read stays inside this message's data; the data
                // may be unaligned, hence read_unaligned.
                let raw = unsafe { data.add(i).read_unaligned() };
                // SAFETY: the kernel just installed `raw` in our table for us; nothing else owns
                // it, so the OwnedFd becomes its only owner (and closes it on drop).
                fds.push(unsafe { OwnedFd::from_raw_fd(raw) });
            }
        }
        // SAFETY: as for CMSG_FIRSTHDR; returns null past the last message.
        cmsg = unsafe { libc::CMSG_NXTHDR(&msg, cmsg) };
    }
    Ok(Received {
        len: n as usize,
        fds,
        truncated: msg.msg_flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) != 0,
    })
}

/// The uid of the process at the other end of a connected unix socket (`SO_PEERCRED`).
pub(super) fn peer_uid(sock: BorrowedFd<'_>) -> io::Result<u32> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: u32::MAX,
        gid: u32::MAX,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `sock` is live; the kernel writes at most `len` bytes into `cred`, which we own,
    // and updates `len`.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(cred.uid)
}

/// This process's effective uid.
pub(super) fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Whether `fd` is a seccomp user-notification descriptor (an anonymous inode the kernel
/// names `[seccomp notify]`).
pub(super) fn is_seccomp_notify(fd: BorrowedFd<'_>) -> bool {
    std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .map(|target| target.as_os_str() == "anon_inode:seccomp notify")
        .unwrap_or(false)
}
