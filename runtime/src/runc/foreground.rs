//! Staying attached to a container process (`run` without `-d`, `exec` without `-d`): forward
//! signals to it and return its exit status, reaping with `waitpid` (the process is our child:
//! libcontainer clones it with `CLONE_PARENT`). No polling: `sigwait` sleeps until a signal.
//!
//! Exit status convention (runc's): the process's exit code, or 128 + signal number.

use std::io;

use nix::sys::signal::{self, SigSet, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

/// Block every signal on this thread so they queue for `wait_forwarding` instead of killing us.
/// Call after the container process exists (it must not inherit the mask) and before it can
/// exit unobserved.
pub fn block_signals() -> io::Result<()> {
    SigSet::all().thread_block().map_err(io::Error::from)
}

/// Map a wait status to a shell-style exit code.
pub fn exit_code(status: WaitStatus) -> Option<i32> {
    match status {
        WaitStatus::Exited(_, code) => Some(code),
        WaitStatus::Signaled(_, sig, _) => Some(128 + sig as i32),
        _ => None,
    }
}

fn reap(pid: Pid) -> io::Result<Option<i32>> {
    loop {
        match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) => return Ok(None),
            Ok(status) => {
                if status.pid() == Some(pid) {
                    if let Some(code) = exit_code(status) {
                        return Ok(Some(code));
                    }
                }
                // Another child (e.g. a reparented helper): keep reaping.
            }
            Err(nix::errno::Errno::ECHILD) => {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    "container process is not our child",
                ))
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Wait for `pid` to end while forwarding signals to it. Signals must already be blocked
/// (`block_signals`).
pub fn wait_forwarding(pid: Pid) -> io::Result<i32> {
    if let Some(code) = reap(pid)? {
        return Ok(code);
    }
    let all = SigSet::all();
    loop {
        match all.wait().map_err(io::Error::from)? {
            Signal::SIGCHLD => {
                if let Some(code) = reap(pid)? {
                    return Ok(code);
                }
            }
            // Window changes and urgent-data notices are for us, not the payload.
            Signal::SIGWINCH | Signal::SIGURG => {}
            sig => {
                if let Err(e) = signal::kill(pid, sig) {
                    tracing::warn!(?sig, error = %e, "could not forward signal");
                }
            }
        }
    }
}
