//! Supervising one child process: spawn it in its own process group, wait on a pidfd (never a
//! sleep loop), forward the user's interrupt signals to its group, enforce the wall clock, and
//! reap it with `wait4` so the resource usage is the kernel's account, not the child's.
//!
//! A `box shell` session is the same loop with the child in its own session (it has a terminal
//! of its own, never the user's) and a [`Companion`], the pty proxy, polled beside it.
//!
//! Owns the waiting, not the confinement: the tier backends hand in a fully prepared `Command`.
//! Must never: leave a child unreaped, leave the terminal's foreground group pointing at a dead
//! group, or report a timeout as anything but `timed_out` (the CLI turns that into 124).
//!
//! Guarded by the unit tests below (exit codes, signals, the wall clock, rusage) and by the
//! CLI's integration tests (`tests/box_run.rs`).

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::{Duration, Instant};

use h5i_policy::receipt::{ExitOutcome, Rusage};

/// Signals h5i forwards to the supervised group instead of dying of them itself.
const FORWARDED: [libc::c_int; 4] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT];

/// Why supervising failed before the child could be observed.
#[derive(Debug, thiserror::Error)]
pub enum SuperviseError {
    /// The command could not be started.
    #[error("refusing: could not start `{program}`: {source}; to fix: check that it exists inside the box and is executable")]
    Spawn {
        /// The program that failed to start.
        program: String,
        /// The OS error.
        source: io::Error,
    },
    /// A kernel call the supervisor depends on failed.
    #[error("refusing: {call} failed: {source}; to fix: this kernel must support pidfd_open (Linux 5.3+) and signalfd")]
    Kernel {
        /// Which call.
        call: &'static str,
        /// The OS error.
        source: io::Error,
    },
}

/// What the kernel said about a finished child.
#[derive(Debug, Clone)]
pub struct ChildReport {
    /// How it ended.
    pub exit: ExitOutcome,
    /// `wait4` usage of the child and every descendant it reaped.
    pub rusage: Rusage,
    /// Wall time from spawn to reap.
    pub wall: Duration,
    /// The child's pid (as seen by h5i).
    pub pid: i32,
}

/// Run `cmd` to completion under supervision, killing its whole process group when `wall`
/// elapses. The child becomes the terminal's foreground group while it runs when stdin is a
/// terminal, so job-control keys reach it and not h5i.
pub fn run_supervised(cmd: Command, wall: Option<Duration>) -> Result<ChildReport, SuperviseError> {
    run_supervised_with(cmd, wall, &mut || false)
}

/// How long a runtime gets to clean up after `on_wall` killed its payload, before its own
/// group is killed too.
pub const WALL_GRACE: Duration = Duration::from_secs(10);

/// [`run_supervised`], calling `on_wall` when the wall clock fires. A runtime whose payload lives
/// outside the child's process group (a container init in its own session) kills it there and
/// returns true: the runtime then sees its container die and cleans up (state, cgroups) within
/// [`WALL_GRACE`] before the group is killed. Returning false kills the group at once.
pub fn run_supervised_with(
    cmd: Command,
    wall: Option<Duration>,
    on_wall: &mut dyn FnMut() -> bool,
) -> Result<ChildReport, SuperviseError> {
    supervise(cmd, wall, on_wall, &mut |_| false, None)
}

/// [`run_supervised_with`], calling `on_signal` with each interrupt signal h5i receives. A
/// runtime whose payload lives outside the child's process group delivers it there and returns
/// true (the runtime then sees its payload end as it would on a terminal); false, or nothing to
/// deliver it to yet, sends it to the child's group as [`run_supervised`] does.
pub fn run_supervised_forwarding(
    cmd: Command,
    wall: Option<Duration>,
    on_wall: &mut dyn FnMut() -> bool,
    on_signal: &mut dyn FnMut(libc::c_int) -> bool,
) -> Result<ChildReport, SuperviseError> {
    supervise(cmd, wall, on_wall, on_signal, None)
}

/// Runs beside a supervised child in the supervisor's own poll loop (`box shell`'s pty proxy),
/// so the child's exit, the wall clock and the companion's descriptors are one `poll(2)`.
pub trait Companion {
    /// Append the descriptors to watch this round.
    fn interest(&mut self, fds: &mut Vec<libc::pollfd>);
    /// Handle the events of the descriptors `interest` appended (same order and count).
    fn ready(&mut self, fds: &[libc::pollfd]);
    /// The child has exited and is about to be reaped: finish what is in flight.
    fn child_exited(&mut self);
}

/// [`run_supervised_with`] for a child with a terminal of its own (`box shell`). The caller
/// makes the child a session leader in `pre_exec` (setsid, and its own controlling terminal if
/// any); the supervisor then neither moves it to a process group nor hands it the user's
/// terminal, and runs `companion` in its poll loop until the child exits. A child that is not
/// a session leader is killed and refused.
pub fn run_supervised_session(
    cmd: Command,
    wall: Option<Duration>,
    on_wall: &mut dyn FnMut() -> bool,
    companion: &mut dyn Companion,
) -> Result<ChildReport, SuperviseError> {
    supervise(cmd, wall, on_wall, &mut |_| false, Some(companion))
}

fn supervise(
    mut cmd: Command,
    wall: Option<Duration>,
    on_wall: &mut dyn FnMut() -> bool,
    on_signal: &mut dyn FnMut(libc::c_int) -> bool,
    mut companion: Option<&mut dyn Companion>,
) -> Result<ChildReport, SuperviseError> {
    let program = cmd.get_program().to_string_lossy().into_owned();
    let blocked = SignalBlock::forwarded()?;
    // SAFETY: the closure makes only sigprocmask on stack data (async-signal-safe) between fork
    // and exec, as pre_exec requires: the child starts with the forwarded signals unblocked.
    unsafe {
        cmd.pre_exec(|| h5i_sys::signals::unblock(&FORWARDED));
    }
    if companion.is_none() {
        cmd.process_group(0);
    }
    let started = Instant::now();
    let child = cmd.spawn().map_err(|source| SuperviseError::Spawn {
        program: program.clone(),
        source,
    })?;
    h5i_log::spawned(&cmd, Some(child.id()));
    // The parent's copies of the child's stdio (a pty slave) close now, not at return.
    drop(cmd);
    let pid = child.id() as i32;
    // `child` is never waited through std: the pid is reaped below by wait4, once.
    drop(child);
    let pidfd = pidfd_open(pid)?;
    let terminal = if companion.is_none() {
        ForegroundTerminal::hand_to(pid)
    } else {
        if h5i_sys::proc::session_of(pid).ok() != Some(pid) {
            kill_group(pid, libc::SIGKILL);
            // The child may not lead a group: it is signalled itself, through its pidfd.
            let _ = h5i_sys::pidfd::kill(&pidfd);
            reap(pid)?;
            return Err(SuperviseError::Spawn {
                program,
                source: io::Error::other("a session child must call setsid before exec"),
            });
        }
        ForegroundTerminal { previous: None }
    };
    let mut deadline = wall.map(|w| started + w);
    let mut timed_out = false;
    loop {
        let timeout = match deadline {
            None => None,
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    if !timed_out {
                        timed_out = true;
                        if on_wall() {
                            deadline = Some(Instant::now() + WALL_GRACE);
                            continue;
                        }
                    }
                    kill_group(pid, libc::SIGKILL);
                    deadline = None;
                    None
                } else {
                    Some(left)
                }
            }
        };
        let mut fds = vec![
            libc::pollfd {
                fd: pidfd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: blocked.fd().as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        if let Some(c) = companion.as_deref_mut() {
            c.interest(&mut fds);
        }
        if let Err(err) = h5i_sys::poll::wait(&mut fds, timeout) {
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            kill_group(pid, libc::SIGKILL);
            reap(pid)?;
            return Err(SuperviseError::Kernel {
                call: "poll",
                source: err,
            });
        }
        if fds[1].revents & libc::POLLIN != 0 {
            if let Some(sig) = blocked.read_signal() {
                if !on_signal(sig) {
                    kill_group(pid, sig);
                }
            }
        }
        if let Some(c) = companion.as_deref_mut() {
            c.ready(&fds[2..]);
        }
        if fds[0].revents & libc::POLLIN != 0 {
            if let Some(c) = companion.as_deref_mut() {
                c.child_exited();
            }
            break;
        }
    }
    let (status, rusage) = reap(pid)?;
    let wall = started.elapsed();
    drop(terminal);
    // The group may still hold descendants that outlived the leader; a box run leaves none.
    kill_group(pid, libc::SIGKILL);
    let exit = ExitOutcome {
        code: status.code,
        signal: status.signal,
        timed_out,
        oom_killed: false,
    };
    Ok(ChildReport {
        exit,
        rusage,
        wall,
        pid,
    })
}

fn kill_group(pid: i32, sig: libc::c_int) {
    // ESRCH (group already gone) is the expected outcome after a clean exit and is ignored.
    let _ = h5i_sys::proc::signal_group(pid, sig);
}

fn pidfd_open(pid: i32) -> Result<OwnedFd, SuperviseError> {
    // The child is not yet reaped (only this function's caller reaps it), so the pid cannot
    // have been reused.
    h5i_sys::pidfd::open(pid).map_err(|source| {
        kill_group(pid, libc::SIGKILL);
        let _ = reap(pid);
        SuperviseError::Kernel {
            call: "pidfd_open",
            source,
        }
    })
}

fn reap(pid: i32) -> Result<(h5i_sys::proc::Ended, Rusage), SuperviseError> {
    let (ended, ru) =
        h5i_sys::proc::reap_with_usage(pid).map_err(|source| SuperviseError::Kernel {
            call: "wait4",
            source,
        })?;
    let us = |tv: libc::timeval| (tv.tv_sec as u64) * 1_000_000 + tv.tv_usec as u64;
    let rusage = Rusage {
        user_us: us(ru.ru_utime),
        sys_us: us(ru.ru_stime),
        maxrss_kb: ru.ru_maxrss.max(0) as u64,
        minflt: ru.ru_minflt.max(0) as u64,
        majflt: ru.ru_majflt.max(0) as u64,
        inblock: ru.ru_inblock.max(0) as u64,
        oublock: ru.ru_oublock.max(0) as u64,
        nvcsw: ru.ru_nvcsw.max(0) as u64,
        nivcsw: ru.ru_nivcsw.max(0) as u64,
    };
    Ok((ended, rusage))
}

/// The forwarded signals, blocked in h5i and readable from a signalfd while a child runs.
pub(crate) struct SignalBlock {
    signals: h5i_sys::signals::SignalFd,
}

impl SignalBlock {
    pub(crate) fn forwarded() -> Result<Self, SuperviseError> {
        let signals = h5i_sys::signals::SignalFd::block(&FORWARDED).map_err(|source| {
            SuperviseError::Kernel {
                call: "signalfd",
                source,
            }
        })?;
        Ok(SignalBlock { signals })
    }

    /// The descriptor to poll: readable while a forwarded signal is pending.
    pub(crate) fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        std::os::fd::AsFd::as_fd(&self.signals)
    }

    pub(crate) fn read_signal(&self) -> Option<libc::c_int> {
        self.signals.read()
    }
}

/// While alive, the child's group owns the terminal's foreground; dropping hands it back.
struct ForegroundTerminal {
    previous: Option<libc::pid_t>,
}

impl ForegroundTerminal {
    fn hand_to(pgid: libc::pid_t) -> Self {
        let previous = h5i_sys::tty::foreground_is_ours();
        if previous.is_some() {
            h5i_sys::tty::set_foreground(pgid);
        }
        ForegroundTerminal { previous }
    }
}

impl Drop for ForegroundTerminal {
    fn drop(&mut self) {
        if let Some(pg) = self.previous {
            h5i_sys::tty::set_foreground(pg);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Command {
        let mut c = Command::new("/bin/sh");
        c.arg("-c").arg(script);
        c
    }

    #[test]
    fn exit_code_passes_through() {
        let r = run_supervised(sh("exit 7"), None).unwrap();
        assert_eq!(r.exit.code, Some(7));
        assert_eq!(r.exit.passthrough_code(), 7);
        assert!(!r.exit.timed_out);
    }

    #[test]
    fn a_signal_death_is_reported_as_the_signal() {
        let r = run_supervised(sh("kill -TERM $$"), None).unwrap();
        assert_eq!(r.exit.signal, Some(libc::SIGTERM));
        assert_eq!(r.exit.passthrough_code(), 128 + libc::SIGTERM);
    }

    #[test]
    fn the_wall_clock_kills_the_whole_group_and_reports_timeout() {
        let started = Instant::now();
        let r =
            run_supervised(sh("sleep 30 & sleep 30"), Some(Duration::from_millis(200))).unwrap();
        assert!(r.exit.timed_out);
        assert_eq!(r.exit.passthrough_code(), 124);
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the timeout did not fire"
        );
    }

    #[test]
    fn rusage_comes_from_wait4() {
        let r =
            run_supervised(sh("i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done"), None).unwrap();
        assert_eq!(r.exit.code, Some(0));
        assert!(r.rusage.user_us + r.rusage.sys_us > 0);
        assert!(r.rusage.maxrss_kb > 0);
    }

    #[derive(Default)]
    struct Watcher {
        rounds: usize,
        exited: bool,
    }

    impl Companion for Watcher {
        fn interest(&mut self, _fds: &mut Vec<libc::pollfd>) {}
        fn ready(&mut self, fds: &[libc::pollfd]) {
            assert!(fds.is_empty());
            self.rounds += 1;
        }
        fn child_exited(&mut self) {
            self.exited = true;
        }
    }

    #[test]
    fn a_session_child_leads_its_own_session_and_the_companion_sees_it_exit() {
        // Field 6 of /proc/PID/stat is the session id.
        let mut c = sh("read -r _ _ _ _ _ sid _ < /proc/$$/stat; [ \"$sid\" = \"$$\" ]");
        // SAFETY: setsid is async-signal-safe.
        unsafe {
            c.pre_exec(|| {
                libc::setsid();
                Ok(())
            });
        }
        let mut w = Watcher::default();
        let r = run_supervised_session(c, None, &mut || false, &mut w).unwrap();
        assert_eq!(r.exit.code, Some(0));
        assert!(w.exited && w.rounds >= 1);
    }

    #[test]
    fn a_session_child_that_did_not_setsid_is_refused() {
        let mut w = Watcher::default();
        let err = run_supervised_session(sh("sleep 5"), None, &mut || false, &mut w).unwrap_err();
        assert!(matches!(err, SuperviseError::Spawn { .. }), "{err}");
    }

    #[test]
    fn a_missing_program_is_a_spawn_refusal() {
        let err = run_supervised(Command::new("/nonexistent/h5i-test"), None).unwrap_err();
        assert!(matches!(err, SuperviseError::Spawn { .. }));
        assert!(err.to_string().contains("to fix:"));
    }
}
