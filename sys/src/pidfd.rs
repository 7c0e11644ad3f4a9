//! Process descriptors: a pidfd names one process for its whole life, so signalling and waiting
//! through it can never reach a process that later took the same pid.
//!
//! Must never: signal by pid, or wait without a bound.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::time::Duration;

use rustix::process::{Pid, PidfdFlags, Signal};

use crate::poll::readable as poll_readable;

/// A pidfd (close-on-exec) for `pid`. `ESRCH` when no such process is left (a reaped child
/// included; a zombie still has one); `EINVAL` for a pid that names no single process (0 or
/// negative).
pub fn open(pid: i32) -> io::Result<OwnedFd> {
    let pid = Pid::from_raw(pid).ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
    Ok(rustix::process::pidfd_open(pid, PidfdFlags::empty())?)
}

/// Send `signal` (a standard signal, 1..=31) to the process behind `pidfd`. A process that
/// already ended answers `ESRCH`, returned as is.
pub fn send_signal(pidfd: impl AsFd, signal: i32) -> io::Result<()> {
    if !(1..=31).contains(&signal) {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: `signal` is a standard signal number (1..=31, checked above), never one of the
    // real-time signals libc reserves for itself.
    let signal = unsafe { Signal::from_raw_unchecked(signal) };
    Ok(rustix::process::pidfd_send_signal(pidfd, signal)?)
}

/// `SIGKILL` through `pidfd`; a process that already ended is not an error (it is gone either
/// way).
pub fn kill(pidfd: impl AsFd) -> io::Result<()> {
    match rustix::process::pidfd_send_signal(pidfd, Signal::KILL) {
        Ok(()) | Err(rustix::io::Errno::SRCH) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Wait at most `timeout` for the process behind `pidfd` to end (its pidfd turns readable);
/// true when it has. Never reaps: a child stays the parent's to `wait` for.
pub fn wait_exited(pidfd: impl AsFd, timeout: Duration) -> io::Result<bool> {
    Ok(!poll_readable(&[pidfd.as_fd()], Some(timeout))?.is_empty())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};

    #[test]
    fn a_pidfd_sees_its_child_end_and_no_pidfd_is_left_for_a_reaped_child() {
        let mut child = Command::new("sleep").arg("30").spawn().unwrap();
        let pid = child.id() as i32;
        let fd = open(pid).unwrap();
        assert!(!wait_exited(&fd, Duration::from_millis(20)).unwrap());
        kill(&fd).unwrap();
        assert!(wait_exited(&fd, Duration::from_secs(10)).unwrap());
        // Ended, not yet reaped: the zombie still has a pidfd; a kill of it is not an error.
        assert!(open(pid).is_ok());
        kill(&fd).unwrap();
        assert!(!child.wait().unwrap().success());
        let gone = open(pid).unwrap_err();
        assert_eq!(gone.raw_os_error(), Some(libc::ESRCH));
        assert_eq!(
            send_signal(&fd, libc::SIGTERM).unwrap_err().raw_os_error(),
            Some(libc::ESRCH)
        );
    }

    #[test]
    fn a_pid_that_names_no_single_process_and_a_non_standard_signal_are_refused() {
        for pid in [0, -1, i32::MIN] {
            assert_eq!(open(pid).unwrap_err().raw_os_error(), Some(libc::EINVAL));
        }
        let mut child = Command::new("true").stdout(Stdio::null()).spawn().unwrap();
        let fd = open(child.id() as i32).unwrap();
        for signal in [0, 32, libc::SIGRTMIN(), 65, -9] {
            assert_eq!(
                send_signal(&fd, signal).unwrap_err().raw_os_error(),
                Some(libc::EINVAL)
            );
        }
        assert!(wait_exited(&fd, Duration::from_secs(10)).unwrap());
        assert!(child.wait().unwrap().success());
    }
}
