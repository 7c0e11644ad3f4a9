//! `poll(2)`, the one place h5i waits on descriptors: [`readable`] for a set of descriptors
//! the caller holds (readable or hung up, resumed with the time left when a signal interrupts
//! it), and [`wait`] over the caller's own array of entries with any events (a loop that also
//! writes, watches a pty master for `POLLOUT`, or names a descriptor by a number that may not
//! be open, which the kernel reports as `POLLNVAL`).
//!
//! Owns the call only: which descriptors and what their events mean are the caller's. Must
//! never: wait past the caller's bound (`None` is the caller's explicit choice of no bound),
//! wake before it (a bound is rounded up to the next millisecond), or sleep in a loop. Tested
//! below on pipes and socketpairs.

use std::io;
use std::os::fd::{BorrowedFd, RawFd};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec};

pub use libc::pollfd as PollEntry;
pub use libc::{POLLERR, POLLHUP, POLLIN, POLLNVAL, POLLOUT};

/// An entry for `fd` waiting for `events`.
pub fn entry(fd: RawFd, events: libc::c_short) -> PollEntry {
    PollEntry {
        fd,
        events,
        revents: 0,
    }
}

/// Wait until an entry of `fds` has an event or `timeout` passed (`None`: no bound). Returns
/// how many entries have events (0: the time ran out), their `revents` filled in. The wait is
/// rounded up to the next millisecond, so a caller waiting for a deadline never wakes just
/// before it. An interrupted wait is returned as `ErrorKind::Interrupted`: the caller decides
/// whether a signal ends its wait. A descriptor in the array that is not open is reported as
/// `POLLNVAL`, never touched.
pub fn wait(fds: &mut [PollEntry], timeout: Option<Duration>) -> io::Result<usize> {
    let ms = match timeout {
        None => -1,
        Some(t) => {
            let ms = t.as_nanos().div_ceil(1_000_000);
            ms.min(i32::MAX as u128) as libc::c_int
        }
    };
    let n = fds.len() as libc::nfds_t;
    // SAFETY: `fds` is a valid, exclusively borrowed array of `n` pollfd entries for the whole
    // call; the kernel writes only their `revents`.
    let r = unsafe { libc::poll(fds.as_mut_ptr(), n, ms) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(r as usize)
}

/// Wait until one of `fds` is readable or hung up, at most `timeout` (`None`: no bound, for a
/// loop whose end is its peer's end). Returns the indexes that are ready; empty when the time
/// ran out. An interrupted wait is resumed with the time left.
pub fn readable(fds: &[BorrowedFd<'_>], timeout: Option<Duration>) -> io::Result<Vec<usize>> {
    let deadline = timeout.map(|t| Instant::now() + t);
    let mut pfds: Vec<PollFd<'_>> = fds
        .iter()
        .map(|fd| PollFd::from_borrowed_fd(*fd, PollFlags::IN))
        .collect();
    loop {
        let left = match deadline {
            None => None,
            Some(d) => Some(
                Timespec::try_from(d.saturating_duration_since(Instant::now()))
                    .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?,
            ),
        };
        match rustix::event::poll(&mut pfds, left.as_ref()) {
            Ok(_) => break,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(pfds
        .iter()
        .enumerate()
        .filter(|(_, p)| !p.revents().is_empty())
        .map(|(i, _)| i)
        .collect())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::os::fd::{AsFd, AsRawFd};
    use std::os::unix::net::UnixStream;

    #[test]
    fn a_written_pipe_is_readable_and_an_empty_one_times_out() {
        let (r, w) = crate::fds::pipe().unwrap();
        let mut fds = [entry(r.as_raw_fd(), POLLIN)];
        assert_eq!(wait(&mut fds, Some(Duration::from_millis(1))).unwrap(), 0);
        rustix::io::write(&w, b"x").unwrap();
        let mut fds = [entry(r.as_raw_fd(), POLLIN), entry(w.as_raw_fd(), POLLOUT)];
        assert_eq!(wait(&mut fds, None).unwrap(), 2);
        assert!(fds[0].revents & POLLIN != 0);
        assert!(fds[1].revents & POLLOUT != 0);
    }

    #[test]
    fn a_raw_wait_reports_the_events_asked_for_and_a_closed_descriptor_as_invalid() {
        let (a, b) = UnixStream::pair().unwrap();
        let mut fds = [entry(a.as_raw_fd(), POLLIN), entry(b.as_raw_fd(), POLLOUT)];
        assert_eq!(wait(&mut fds, Some(Duration::ZERO)).unwrap(), 1);
        assert_eq!((fds[0].revents, fds[1].revents), (0, POLLOUT));
        let gone = crate::fds::dup_at_least(&a, 200).unwrap();
        let raw = gone.as_raw_fd();
        drop(gone);
        let mut fds = [entry(raw, POLLIN)];
        assert_eq!(wait(&mut fds, Some(Duration::from_millis(5))).unwrap(), 1);
        assert_eq!(fds[0].revents, POLLNVAL);
    }

    #[test]
    fn a_wait_on_a_quiet_fd_ends_at_its_bound_and_a_written_one_is_ready() {
        let (a, b) = UnixStream::pair().unwrap();
        let (c, _d) = UnixStream::pair().unwrap();
        assert!(readable(&[a.as_fd()], Some(Duration::from_millis(20)))
            .unwrap()
            .is_empty());
        std::io::Write::write_all(&mut &b, b"x").unwrap();
        let ready = readable(&[c.as_fd(), a.as_fd()], None).unwrap();
        assert_eq!(ready, vec![1]);
    }
}
