//! One `poll(2)` over descriptors with any events (a loop that also writes, or watches a pty
//! master for `POLLOUT`, needs more than [`crate::fds::poll_readable`]'s readability).
//!
//! Owns the call only: which descriptors and what their events mean are the caller's. Must
//! never: wait past the caller's bound, or retry on its own (an interrupted wait is returned as
//! `ErrorKind::Interrupted`, so the caller's loop recomputes its time left).

use std::io;
use std::time::Duration;

pub use libc::pollfd as PollEntry;
pub use libc::{POLLERR, POLLHUP, POLLIN, POLLNVAL, POLLOUT};

/// An entry for `fd` waiting for `events`.
pub fn entry(fd: std::os::fd::RawFd, events: libc::c_short) -> PollEntry {
    PollEntry {
        fd,
        events,
        revents: 0,
    }
}

/// Wait until an entry of `fds` has an event or `timeout` passed (`None`: no bound). Returns
/// how many entries have events (0: the time ran out). The wait is rounded up to the next
/// millisecond, so a caller waiting for a deadline never wakes just before it.
pub fn wait(fds: &mut [PollEntry], timeout: Option<Duration>) -> io::Result<usize> {
    let ms = match timeout {
        None => -1,
        Some(t) => {
            let ms = t.as_nanos().div_ceil(1_000_000);
            ms.min(i32::MAX as u128) as libc::c_int
        }
    };
    let n = fds.len() as libc::nfds_t;
    // SAFETY: `fds` is a valid, writable array of `n` pollfd entries for the whole call.
    let r = unsafe { libc::poll(fds.as_mut_ptr(), n, ms) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(r as usize)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

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
}
