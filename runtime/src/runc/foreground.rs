//! Staying attached to a container process (`run` without `-d`, `exec` without `-d`): forward
//! signals to it and return its exit status, reaping with `waitpid` (the process is our child:
//! libcontainer clones it with `CLONE_PARENT`). No polling: `sigwait` sleeps until a signal.
//!
//! Exit status convention (runc's): the process's exit code, or 128 + signal number.

use std::io;
use std::os::fd::OwnedFd;

use h5i_sys::signals::{block_all, wait_any};

/// Block every signal on this thread so they queue for `wait_forwarding` instead of killing us.
/// Call after the container process exists (it must not inherit the mask) and before it can
/// exit unobserved.
pub fn block_signals() -> io::Result<()> {
    block_all()
}

/// A shell-style exit code: the exit code, or 128 + the signal that ended the process.
pub fn exit_code(ended: h5i_sys::proc::Ended) -> Option<i32> {
    match (ended.code, ended.signal) {
        (Some(code), _) => Some(code),
        (None, Some(sig)) => Some(128 + sig),
        (None, None) => None,
    }
}

fn reap(pid: i32) -> io::Result<Option<i32>> {
    loop {
        match h5i_sys::proc::reap_any_nohang() {
            Ok(None) => return Ok(None),
            Ok(Some((reaped, ended))) => {
                if reaped == pid {
                    if let Some(code) = exit_code(ended) {
                        return Ok(Some(code));
                    }
                }
                // Another child (e.g. a reparented helper): keep reaping.
            }
            Err(e) if e.raw_os_error() == Some(libc::ECHILD) => {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    "container process is not our child",
                ))
            }
            Err(e) => return Err(e),
        }
    }
}

/// Wait for `pid` to end while forwarding signals to it. Signals must already be blocked
/// (`block_signals`). Each signal reaches it through a pidfd opened while it is still our
/// unreaped child, so none can reach a process that later took its pid.
pub fn wait_forwarding(pid: i32) -> io::Result<i32> {
    let pidfd: Option<OwnedFd> = h5i_sys::pidfd::open(pid).ok();
    if let Some(code) = reap(pid)? {
        return Ok(code);
    }
    loop {
        match wait_any()? {
            libc::SIGCHLD => {
                if let Some(code) = reap(pid)? {
                    return Ok(code);
                }
            }
            // Window changes and urgent-data notices are for us, not the payload.
            libc::SIGWINCH | libc::SIGURG => {}
            sig => {
                let sent = match &pidfd {
                    Some(fd) => h5i_sys::pidfd::send_signal(fd, sig),
                    None => Err(io::Error::from_raw_os_error(libc::ESRCH)),
                };
                if let Err(e) = sent {
                    tracing::warn!(sig, error = %e, "could not forward signal");
                }
            }
        }
    }
}
