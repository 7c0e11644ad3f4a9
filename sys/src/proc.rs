//! This process's ties to others, where no pidfd can be held: dying with its parent and
//! leading a session of its own (set in a forked child before exec), whether a pid from a file names a live process, and signalling a
//! process group (a group has no pidfd).
//!
//! On rustix. [`die_with_parent`] and [`new_session`] are async-signal-safe (system calls only, no
//! allocation), so a `pre_exec` closure may call them. Must never: signal a single process by pid (that is
//! [`crate::pidfd`]'s, which cannot reach a process that later took the same pid).

use std::io;

use rustix::process::{Pid, Signal};

/// Have the kernel `SIGKILL` this (forked, not yet exec'd) process when the thread that forked
/// it ends, and refuse (`ESRCH`) when `parent` (the forker's pid, taken before the fork) has
/// ended already: a child forked just before its parent died would otherwise never get the
/// signal.
pub fn die_with_parent(parent: u32) -> io::Result<()> {
    rustix::process::set_parent_process_death_signal(Some(Signal::KILL))?;
    match rustix::process::getppid() {
        Some(p) if p.as_raw_nonzero().get() as u32 == parent => Ok(()),
        _ => Err(io::Error::from_raw_os_error(libc::ESRCH)),
    }
}

/// Make this (forked, not yet exec'd) process the leader of a new session and process group,
/// with no controlling terminal: a terminal's signals for the caller's group never reach it.
/// Async-signal-safe (one system call).
pub fn new_session() -> io::Result<()> {
    rustix::process::setsid()?;
    Ok(())
}

/// Whether `pid` names a process that exists (a zombie included), asked with signal 0, which
/// reaches nothing. An answer other than "no such process" (`EPERM`: it exists and is
/// another user's) counts as alive, so a probe never takes someone's process for gone. A pid
/// of 0 or below names no single process: true, the answer that keeps what it guards.
pub fn exists(pid: i32) -> bool {
    let Some(pid) = Pid::from_raw(pid).filter(|_| pid > 0) else {
        return true;
    };
    !matches!(
        rustix::process::test_kill_process(pid),
        Err(rustix::io::Errno::SRCH)
    )
}

/// Send `signal` (a standard signal, 1..=31) to every process of the group `pgid` (> 0). The
/// caller holds a pidfd of the group's leader (so the group id cannot be recycled while it
/// signals) or accepts that it may be.
pub fn signal_group(pgid: i32, signal: i32) -> io::Result<()> {
    let pgid = Pid::from_raw(pgid)
        .filter(|_| pgid > 0)
        .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
    if !(1..=31).contains(&signal) {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: `signal` is a standard signal number (checked above), never one of the real-time
    // signals libc reserves for itself.
    let signal = unsafe { Signal::from_raw_unchecked(signal) };
    Ok(rustix::process::kill_process_group(pgid, signal)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::{CommandExt, ExitStatusExt};
    use std::process::Command;

    #[test]
    fn a_child_tied_to_a_parent_that_is_not_its_own_is_refused_and_to_its_own_runs() {
        let me = std::process::id();
        let mut cmd = Command::new("true");
        // SAFETY: the closure makes only die_with_parent's system calls (async-signal-safe).
        unsafe { cmd.pre_exec(move || die_with_parent(me)) };
        assert!(cmd.status().unwrap().success());
        let mut cmd = Command::new("true");
        // SAFETY: as above.
        unsafe { cmd.pre_exec(move || die_with_parent(me + 1)) };
        assert_eq!(cmd.status().unwrap_err().raw_os_error(), Some(libc::ESRCH));
    }

    #[test]
    fn a_child_in_a_new_session_leads_it() {
        let mut cmd = Command::new("sh");
        // Field 6 of /proc/PID/stat is the session id.
        cmd.args(["-c", r#"read -r _ _ _ _ _ sid _ < /proc/$$/stat; [ "$sid" = "$$" ]"#]);
        // SAFETY: the closure makes one system call (async-signal-safe).
        unsafe { cmd.pre_exec(new_session) };
        assert!(cmd.status().unwrap().success());
    }

    #[test]
    fn a_live_child_exists_and_a_reaped_one_does_not() {
        let mut child = Command::new("sleep").arg("30").spawn().unwrap();
        let pid = child.id() as i32;
        assert!(exists(pid));
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(!exists(pid));
        assert!(exists(0) && exists(-1));
    }

    #[test]
    fn a_group_signal_reaches_the_group_and_a_bad_group_or_signal_is_refused() {
        let mut child = Command::new("sleep").arg("30").process_group(0).spawn().unwrap();
        signal_group(child.id() as i32, libc::SIGTERM).unwrap();
        assert_eq!(child.wait().unwrap().signal(), Some(libc::SIGTERM));
        for (pgid, sig) in [(0, libc::SIGTERM), (-1, libc::SIGTERM), (1, 0), (1, 40)] {
            assert_eq!(
                signal_group(pgid, sig).unwrap_err().raw_os_error(),
                Some(libc::EINVAL)
            );
        }
    }
}
