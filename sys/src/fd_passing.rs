//! Descriptors passed over unix sockets (`SCM_RIGHTS`), with the sender's pid when the
//! receiving socket has `SO_PASSCRED` (`SCM_CREDENTIALS`).
//!
//! Sending is rustix's `sendmsg`. Receiving is one `recvmsg` on libc: rustix would read the
//! kernel's `ucred` into a `Pid` that may not be zero, and the kernel writes 0 for a sender
//! outside the receiver's pid namespace.
//!
//! A received message is refused, with every descriptor it brought closed, when the kernel cut
//! its descriptors short (`MSG_CTRUNC`), cut its data short (`MSG_TRUNC`, datagram and
//! seqpacket sockets), or it carried more descriptors than the caller takes. Must never: hand
//! out a descriptor without close-on-exec, or a descriptor of a refused message.

use std::io::{self, IoSlice};
use std::mem::{size_of, size_of_val, MaybeUninit};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};

/// Most descriptors one message may carry, either way.
pub const MAX_FDS: usize = 16;

/// Whether [`recv_with_fds`] waits for a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// Block until a message (or the end of the stream) arrives.
    Block,
    /// Answer `WouldBlock` at once when nothing is there (`MSG_DONTWAIT`).
    DontWait,
}

/// One received message.
#[derive(Debug)]
pub struct Received {
    /// Bytes written into the caller's buffer; 0 on a stream is its end.
    pub len: usize,
    /// The descriptors that came with it, close-on-exec, at most the caller's maximum.
    pub fds: Vec<OwnedFd>,
    /// The sender's pid in this process's pid namespace, when the socket has `SO_PASSCRED` and
    /// the sender is visible from here.
    pub sender_pid: Option<i32>,
}

/// Why a message was not sent or was refused.
#[derive(Debug, thiserror::Error)]
pub enum FdPassError {
    /// The call itself failed (`WouldBlock` included).
    #[error(transparent)]
    Io(#[from] io::Error),
    /// More descriptors than one message carries.
    #[error("refusing to send {count} descriptors in one message; at most {MAX_FDS} pass at once")]
    TooManyToSend {
        /// How many were asked for.
        count: usize,
    },
    /// Descriptors with no data byte (a stream socket would drop them).
    #[error("refusing to send a message with no data: descriptors travel with at least one byte")]
    NoData,
    /// The kernel took only part of the data (the descriptors went with that part).
    #[error("short send: {sent} of {len} bytes went")]
    ShortSend {
        /// Bytes sent.
        sent: usize,
        /// Bytes asked for.
        len: usize,
    },
    /// `MSG_CTRUNC`: more descriptors (or credentials) came than there was room for.
    #[error("refusing a message whose control data the kernel cut short (MSG_CTRUNC): more than {max} descriptors came")]
    ControlTruncated {
        /// The caller's maximum.
        max: usize,
    },
    /// `MSG_TRUNC`: the message was longer than the buffer.
    #[error("refusing a message longer than the {room} bytes read (MSG_TRUNC)")]
    DataTruncated {
        /// The buffer's length.
        room: usize,
    },
    /// More descriptors than the caller takes, within the room the kernel had.
    #[error("refusing a message with {count} descriptors; it may carry at most {max}")]
    TooManyReceived {
        /// How many came.
        count: usize,
        /// The caller's maximum.
        max: usize,
    },
}

impl From<FdPassError> for io::Error {
    fn from(e: FdPassError) -> Self {
        match e {
            FdPassError::Io(e) => e,
            other => io::Error::new(io::ErrorKind::InvalidData, other),
        }
    }
}

/// Send `data` with `fds` attached, in one `sendmsg` (`MSG_NOSIGNAL`: a closed peer is
/// `EPIPE`, not a signal). Allocates nothing, so a forked child may call it.
pub fn send_with_fds(
    sock: impl AsFd,
    data: &[u8],
    fds: &[BorrowedFd<'_>],
) -> Result<(), FdPassError> {
    if data.is_empty() {
        return Err(FdPassError::NoData);
    }
    if fds.len() > MAX_FDS {
        return Err(FdPassError::TooManyToSend { count: fds.len() });
    }
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(FdPassError::TooManyToSend { count: fds.len() });
    }
    let iov = [IoSlice::new(data)];
    let sent = loop {
        match rustix::net::sendmsg(&sock, &iov, &mut control, SendFlags::NOSIGNAL) {
            Ok(n) => break n,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(io::Error::from(e).into()),
        }
    };
    if sent != data.len() {
        return Err(FdPassError::ShortSend {
            sent,
            len: data.len(),
        });
    }
    Ok(())
}

/// Room for `MAX_FDS` descriptors and one `ucred`, as `u64`s so the buffer is aligned for
/// `cmsghdr`.
const CONTROL_WORDS: usize = 16;

/// Receive one message into `buf` with at most `max_fds` descriptors (capped at [`MAX_FDS`]).
/// An interrupted wait is resumed.
pub fn recv_with_fds(
    sock: impl AsFd,
    buf: &mut [u8],
    max_fds: usize,
    wait: Wait,
) -> Result<Received, FdPassError> {
    let max_fds = max_fds.min(MAX_FDS);
    let mut control = [0u64; CONTROL_WORDS];
    // SAFETY: CMSG_SPACE is a pure size computation.
    let room = unsafe {
        libc::CMSG_SPACE((max_fds * size_of::<RawFd>()) as u32)
            + libc::CMSG_SPACE(size_of::<libc::ucred>() as u32)
    } as usize;
    if room > size_of_val(&control) {
        return Err(io::Error::other("the control buffer is smaller than MAX_FDS needs").into());
    }
    let mut flags = libc::MSG_CMSG_CLOEXEC;
    if wait == Wait::DontWait {
        flags |= libc::MSG_DONTWAIT;
    }
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: msghdr is plain data; all-zero is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = room as _;
    let len = loop {
        // SAFETY: `msg` points at `iov` (over the caller's exclusively borrowed `buf`) and at
        // `control` (`room` bytes, checked above), all alive and writable for the call.
        let n = unsafe { libc::recvmsg(sock.as_fd().as_raw_fd(), &mut msg, flags) };
        if n >= 0 {
            break n as usize;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e.into());
        }
    };
    let mut fds = Vec::new();
    let mut sender_pid = None;
    // SAFETY: `msg` was filled by a successful recvmsg; CMSG_FIRSTHDR/CMSG_NXTHDR walk only
    // within `control[..msg_controllen]`, each header's payload is read within its cmsg_len
    // (unaligned reads), and every SCM_RIGHTS entry is a descriptor the kernel just installed
    // in this process, owned by nothing else, so each is taken into an OwnedFd exactly once.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            let data = libc::CMSG_DATA(cmsg);
            let payload = ((*cmsg).cmsg_len as usize).saturating_sub(data as usize - cmsg as usize);
            match ((*cmsg).cmsg_level, (*cmsg).cmsg_type) {
                (libc::SOL_SOCKET, libc::SCM_RIGHTS) => {
                    for i in 0..payload / size_of::<RawFd>() {
                        let fd = data.cast::<RawFd>().add(i).read_unaligned();
                        fds.push(OwnedFd::from_raw_fd(fd));
                    }
                }
                (libc::SOL_SOCKET, libc::SCM_CREDENTIALS)
                    if payload >= size_of::<libc::ucred>() =>
                {
                    let cred = data.cast::<libc::ucred>().read_unaligned();
                    sender_pid = (cred.pid > 0).then_some(cred.pid);
                }
                _ => {}
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(FdPassError::ControlTruncated { max: max_fds });
    }
    if msg.msg_flags & libc::MSG_TRUNC != 0 {
        return Err(FdPassError::DataTruncated { room: buf.len() });
    }
    if fds.len() > max_fds {
        return Err(FdPassError::TooManyReceived {
            count: fds.len(),
            max: max_fds,
        });
    }
    Ok(Received {
        len,
        fds,
        sender_pid,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::poll::readable as poll_readable;
    use std::io::{Read, Write};
    use std::os::unix::net::{UnixDatagram, UnixStream};
    use std::time::Duration;

    /// A pipe; the read end sees its end (read returns 0) only once every copy of the write
    /// end anywhere in this process is closed.
    fn pipe() -> (std::fs::File, OwnedFd) {
        let (r, w) = crate::fds::pipe().unwrap();
        (std::fs::File::from(r), w)
    }

    /// Every copy of the pipe's write end is closed: the reader sees the end at once.
    fn all_copies_closed(reader: &mut std::fs::File) -> bool {
        let ready = poll_readable(&[reader.as_fd()], Some(Duration::from_secs(5))).unwrap();
        let mut b = [0u8; 1];
        !ready.is_empty() && reader.read(&mut b).unwrap() == 0
    }

    fn seqpacket_pair() -> (OwnedFd, OwnedFd) {
        rustix::net::socketpair(
            rustix::net::AddressFamily::UNIX,
            rustix::net::SocketType::SEQPACKET,
            rustix::net::SocketFlags::CLOEXEC,
            None,
        )
        .unwrap()
    }

    #[test]
    fn descriptors_cross_a_socketpair_with_their_message_close_on_exec() {
        let (a, b) = UnixStream::pair().unwrap();
        let (mut reader, w) = pipe();
        let null = std::fs::File::open("/dev/null").unwrap();
        send_with_fds(&a, b"attach\n", &[w.as_fd(), null.as_fd()]).unwrap();
        drop(w);
        let mut buf = [0u8; 64];
        let got = recv_with_fds(&b, &mut buf, 2, Wait::Block).unwrap();
        assert_eq!(&buf[..got.len], b"attach\n");
        assert_eq!(got.fds.len(), 2);
        assert_eq!(got.sender_pid, None);
        for fd in &got.fds {
            let flags = rustix::io::fcntl_getfd(fd).unwrap();
            assert!(flags.contains(rustix::io::FdFlags::CLOEXEC));
        }
        let mut w = std::fs::File::from(got.fds.into_iter().next().unwrap());
        w.write_all(b"y").unwrap();
        let mut one = [0u8; 1];
        reader.read_exact(&mut one).unwrap();
        assert_eq!(&one, b"y");
        drop(w);
        assert!(all_copies_closed(&mut reader));
        send_with_fds(&a, b"stop\n", &[]).unwrap();
        let got = recv_with_fds(&b, &mut buf, 2, Wait::Block).unwrap();
        assert_eq!((&buf[..got.len], got.fds.len()), (&b"stop\n"[..], 0));
        drop(a);
        assert_eq!(recv_with_fds(&b, &mut buf, 2, Wait::Block).unwrap().len, 0);
    }

    #[test]
    fn the_senders_pid_comes_with_so_passcred() {
        let (a, b) = seqpacket_pair();
        rustix::net::sockopt::set_socket_passcred(&b, true).unwrap();
        send_with_fds(&a, b"R", &[]).unwrap();
        let mut buf = [0u8; 4];
        let got = recv_with_fds(&b, &mut buf, 0, Wait::Block).unwrap();
        assert_eq!(got.sender_pid, Some(std::process::id() as i32));
    }

    #[test]
    fn more_descriptors_than_the_receiver_takes_are_refused_and_each_is_closed() {
        let (a, b) = UnixStream::pair().unwrap();
        let (mut reader, w) = pipe();
        send_with_fds(&a, b"x", &[w.as_fd(), w.as_fd(), w.as_fd()]).unwrap();
        drop(w);
        let mut buf = [0u8; 8];
        let err = recv_with_fds(&b, &mut buf, 2, Wait::Block).unwrap_err();
        assert!(
            matches!(err, FdPassError::TooManyReceived { count: 3, max: 2 }),
            "{err}"
        );
        assert!(all_copies_closed(&mut reader));
    }

    #[test]
    fn a_control_message_the_kernel_cut_short_is_refused_and_each_descriptor_closed() {
        let (a, b) = UnixStream::pair().unwrap();
        let (mut reader, w) = pipe();
        let many = [w.as_fd(); MAX_FDS];
        send_with_fds(&a, b"x", &many).unwrap();
        drop(w);
        let mut buf = [0u8; 8];
        let err = recv_with_fds(&b, &mut buf, 1, Wait::Block).unwrap_err();
        assert!(
            matches!(err, FdPassError::ControlTruncated { max: 1 }),
            "{err}"
        );
        let io: io::Error = err.into();
        assert_eq!(io.kind(), io::ErrorKind::InvalidData);
        assert!(all_copies_closed(&mut reader));
    }

    #[test]
    fn a_message_longer_than_the_buffer_is_refused_and_its_descriptor_closed() {
        let (a, b) = seqpacket_pair();
        let (mut reader, w) = pipe();
        send_with_fds(&a, b"a longer message", &[w.as_fd()]).unwrap();
        drop(w);
        let mut buf = [0u8; 4];
        let err = recv_with_fds(&b, &mut buf, 1, Wait::Block).unwrap_err();
        assert!(
            matches!(err, FdPassError::DataTruncated { room: 4 }),
            "{err}"
        );
        assert!(all_copies_closed(&mut reader));
        let (d1, d2) = UnixDatagram::pair().unwrap();
        d1.send(b"0123456789").unwrap();
        assert!(matches!(
            recv_with_fds(&d2, &mut buf, 0, Wait::Block),
            Err(FdPassError::DataTruncated { room: 4 })
        ));
    }

    #[test]
    fn empty_data_and_too_many_descriptors_are_refused_before_any_send() {
        let (a, b) = UnixStream::pair().unwrap();
        let null = std::fs::File::open("/dev/null").unwrap();
        assert!(matches!(
            send_with_fds(&a, b"", &[null.as_fd()]),
            Err(FdPassError::NoData)
        ));
        let many = [null.as_fd(); MAX_FDS + 1];
        assert!(matches!(
            send_with_fds(&a, b"x", &many),
            Err(FdPassError::TooManyToSend { count }) if count == MAX_FDS + 1
        ));
        let mut buf = [0u8; 8];
        let quiet = recv_with_fds(&b, &mut buf, 1, Wait::DontWait).unwrap_err();
        assert_eq!(io::Error::from(quiet).kind(), io::ErrorKind::WouldBlock);
    }
}
