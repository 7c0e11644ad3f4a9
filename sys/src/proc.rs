//! This process's ties to others, where no pidfd can be held: dying with its parent and
//! leading a session of its own (set in a forked child before exec), the working directory,
//! whether a pid from a file names a live process, signalling a process group (a group has no
//! pidfd), and reaping children (with their resource use) and decoding how they ended.
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

/// How a reaped child ended: its exit code, or the signal that ended it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ended {
    /// The exit code, when it exited.
    pub code: Option<i32>,
    /// The signal, when one ended it.
    pub signal: Option<i32>,
}

/// Wait for the child `pid` to end and reap it (`wait4`, resumed when a signal interrupts it):
/// how it ended and the resources it and its reaped descendants used. Only the parent that
/// forked `pid` may call it, once: a reaped pid is free for the kernel to hand out again.
pub fn reap_with_usage(pid: i32) -> io::Result<(Ended, libc::rusage)> {
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value for the kernel to overwrite.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: `status` and `usage` are valid, writable and live for the call.
        let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
        if r == pid {
            break;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    Ok((Ended::from_wait_status(status), usage))
}

impl Ended {
    /// How a child ended, from the raw status `wait4` wrote (a status passed along as a
    /// number, as the box sandbox's init sends it to the host).
    pub fn from_wait_status(status: i32) -> Ended {
        Ended {
            code: libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status)),
            signal: libc::WIFSIGNALED(status).then(|| libc::WTERMSIG(status)),
        }
    }
}

/// A child reaped with its resource use.
pub struct Reaped {
    /// Its pid (free for the kernel to hand out again from now on).
    pub pid: i32,
    /// The raw wait status ([`Ended::from_wait_status`] decodes it).
    pub status: i32,
    /// What it and its reaped descendants used.
    pub usage: libc::rusage,
}

/// Reap one child of this process that has ended (`wait4(-1, WNOHANG)`), with its resource
/// use, without waiting: `None` when none has ended yet; `ECHILD` when there are no children.
/// An init that reaps orphans calls it until `None`.
pub fn reap_any_with_usage_nohang() -> io::Result<Option<Reaped>> {
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value for the kernel to overwrite.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `status` and `usage` are valid, writable and live for the call.
    let pid = unsafe { libc::wait4(-1, &mut status, libc::WNOHANG, &mut usage) };
    match pid {
        0 => Ok(None),
        p if p < 0 => Err(io::Error::last_os_error()),
        pid => Ok(Some(Reaped { pid, status, usage })),
    }
}

/// Make `dir` the working directory of this process (a forked child before exec).
pub fn change_dir(dir: &std::ffi::CStr) -> io::Result<()> {
    Ok(rustix::process::chdir(dir)?)
}

/// Reap one child of this process that has ended, in any process group, without waiting:
/// `None` when none has ended yet, `ECHILD` when the process has no children at all.
pub fn reap_any_nohang() -> io::Result<Option<(i32, Ended)>> {
    // `wait` is wait4(-1, ...): any child. (rustix's `waitpid(None, ...)` is wait4(0, ...),
    // the caller's own process group only, which a container in a session of its own is not.)
    let reaped = rustix::process::wait(rustix::process::WaitOptions::NOHANG)?;
    Ok(reaped.map(|(pid, status)| {
        (
            pid.as_raw_nonzero().get(),
            Ended {
                code: status.exit_status(),
                signal: status.terminating_signal(),
            },
        )
    }))
}

/// The session id of process `pid` (`getsid`).
pub fn session_of(pid: i32) -> io::Result<i32> {
    let pid = Pid::from_raw(pid)
        .filter(|_| pid > 0)
        .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
    Ok(rustix::process::getsid(Some(pid))?.as_raw_nonzero().get())
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
        cmd.args([
            "-c",
            r#"read -r _ _ _ _ _ sid _ < /proc/$$/stat; [ "$sid" = "$$" ]"#,
        ]);
        // SAFETY: the closure makes one system call (async-signal-safe).
        unsafe { cmd.pre_exec(new_session) };
        assert!(cmd.status().unwrap().success());
    }

    // The children are reaped by the function under test, not through `Child::wait`.
    #[allow(clippy::zombie_processes)]
    #[test]
    fn a_reaped_child_tells_its_code_or_its_signal_and_its_usage() {
        let child = Command::new("sh").args(["-c", "exit 7"]).spawn().unwrap();
        let (ended, _) = reap_with_usage(child.id() as i32).unwrap();
        assert_eq!(
            ended,
            Ended {
                code: Some(7),
                signal: None
            }
        );
        let child = Command::new("sh")
            .args([
                "-c",
                "head -c 4000000 /dev/zero | tr -d x >/dev/null; kill -9 $$",
            ])
            .spawn()
            .unwrap();
        let (ended, usage) = reap_with_usage(child.id() as i32).unwrap();
        assert_eq!(
            ended,
            Ended {
                code: None,
                signal: Some(libc::SIGKILL)
            }
        );
        assert!(usage.ru_maxrss > 0);
        assert_eq!(
            reap_with_usage(child.id() as i32)
                .unwrap_err()
                .raw_os_error(),
            Some(libc::ECHILD)
        );
    }

    /// Only this test's own children are reaped: the harness's threads spawn none of theirs
    /// while it runs in a child process of its own. The child leads a process group of its own
    /// (as a container's init does): a reap of the caller's group only would miss it.
    // The children are reaped by the function under test, not through `Child::wait`.
    #[allow(clippy::zombie_processes)]
    #[test]
    fn a_child_that_ended_is_reaped_without_waiting_and_none_left_is_echild() {
        if std::env::var_os("H5I_SYS_REAP_CHILD").is_some() {
            let child = Command::new("sh")
                .args(["-c", "exit 3"])
                .process_group(0)
                .spawn()
                .unwrap();
            let pid = child.id() as i32;
            let fd = crate::pidfd::open(pid).unwrap();
            assert!(crate::pidfd::wait_exited(&fd, std::time::Duration::from_secs(10)).unwrap());
            let (got, ended) = reap_any_nohang().unwrap().unwrap();
            assert_eq!((got, ended.code, ended.signal), (pid, Some(3), None));
            assert_eq!(
                reap_any_nohang().unwrap_err().raw_os_error(),
                Some(libc::ECHILD)
            );
            let mut sleeper = Command::new("sleep").arg("30").spawn().unwrap();
            assert_eq!(reap_any_nohang().unwrap(), None);
            sleeper.kill().unwrap();
            sleeper.wait().unwrap();
            println!("reaped");
            return;
        }
        let out = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "proc::tests::a_child_that_ended_is_reaped_without_waiting_and_none_left_is_echild",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("H5I_SYS_REAP_CHILD", "1")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success() && text.contains("reaped"), "{text}");
    }

    #[test]
    fn a_session_child_leads_its_session_and_this_process_does_not_lead_its_childs() {
        let mut cmd = Command::new("sleep");
        cmd.arg("30");
        // SAFETY: the closure makes one system call (async-signal-safe).
        unsafe { cmd.pre_exec(new_session) };
        let mut child = cmd.spawn().unwrap();
        let pid = child.id() as i32;
        assert_eq!(session_of(pid).unwrap(), pid);
        assert_ne!(session_of(std::process::id() as i32).unwrap(), pid);
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(
            session_of(0).unwrap_err().raw_os_error(),
            Some(libc::EINVAL)
        );
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
        let mut child = Command::new("sleep")
            .arg("30")
            .process_group(0)
            .spawn()
            .unwrap();
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
