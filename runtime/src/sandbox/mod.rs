//! The box-lifetime sandbox: one container per box, made once (lazily, by the first run), whose
//! process is a small box init ([`init`]) holding the namespaces, mounts, Landlock domain,
//! seccomp filters, rlimits and empty capability sets `h5i-runc` applied to it. A run is a
//! request to that init over a unix socket: it forks, the child is placed in a cgroup of its own
//! under the box's (by the host, before it may exec) and execs the command. Everything the
//! per-run container applied to its process is inherited across fork and exec (Landlock
//! domain, seccomp filters, `no_new_privs`, rlimits, uid/gid, capability bounding set), so a
//! run costs a fork and an exec, not a container.
//!
//! The protocol (`SOCK_SEQPACKET`, one message per step):
//! 1. host -> init: a JSON [`RunRequest`] with the caller's open standard descriptors as
//!    `SCM_RIGHTS`;
//! 2. the run's child -> host: [`READY`]; the host's socket has `SO_PASSCRED`, so the kernel
//!    attaches the child's pid, translated into the host's pid namespace. A request with a
//!    terminal ([`RunRequest::pty`]: `box shell`, `box run` on a terminal) has the child open a
//!    pty in the box's own devpts, lead its session with the slave as controlling terminal (so
//!    it is the terminal's foreground job: job control, `^C`, `/dev/tty` work), and send the
//!    master with [`READY`] (the console-socket pattern, over this connection); the host
//!    proxies it to the user's terminal ([`crate::pty::PtyProxy`]: raw mode, window size at
//!    start and on `SIGWINCH`) until the run ends, and no box process holds the master or the
//!    user's terminal;
//! 3. host -> child: [`GO`], once the host has written that pid into the run's cgroup (the
//!    child blocks until then, so nothing the command starts escapes the run's group);
//! 4. init -> host: [`DONE`] + JSON [`RunEnd`] (wait status and `wait4` usage) when the child
//!    was reaped; or [`FAILED`] + text when the request could not be served.
//!
//! The host side ([`run`]) owns the per-run cgroup ([`crate::cage::ResourceCage`] below the
//! box's group): the policy's memory and process limits apply per run, the OOM evidence is the
//! run's own, the wall clock kills every member of the run's group, and when the run ends
//! every process left in its group (a background job the command started) is killed before
//! [`run`] returns, so nothing from one run outlives it.
//!
//! The listening socket lives in h5i's private runtime directory (0700) and reaches the init
//! only as an inherited descriptor: no path inside the box leads to it. The init makes itself
//! non-dumpable, so a run (same uid, no capabilities) can neither ptrace it nor open its
//! `/proc/1/{mem,fd}`; as its pid namespace's init it ignores every signal sent from inside.
//!
//! Must never: let the command exec before it is in the run's cgroup, return from a run while a
//! process of that run is alive, or pass the init's own descriptors to a run.
//! Guarded by `tests/sandbox.rs` and every confinement test at the process tier (which run
//! through the sandbox by default).

pub mod init;

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use h5i_policy::receipt::{ExitOutcome, Rusage};
use h5i_sys::fd_passing::{self, send_with_fds, FdPassError, Wait};
use serde::{Deserialize, Serialize};

use crate::cage::{CageError, CageReport, ResourceCage};
use crate::supervise::{ChildReport, Companion};

/// The child is ready and blocked until [`GO`].
pub const READY: u8 = b'R';
/// The child may exec.
pub const GO: u8 = b'G';
/// The child was reaped; a JSON [`RunEnd`] follows.
pub const DONE: u8 = b'D';
/// The request could not be served; text follows.
pub const FAILED: u8 = b'F';

/// The largest request the init reads (argv + environment as JSON).
pub const MAX_REQUEST: usize = 256 * 1024;

/// Where the init program is mounted inside the box.
pub const INIT_PATH_IN_BOX: &str = "/.h5i-box-init";
/// The `h5i-runc` verb that runs the box init (hidden: only h5i starts it, inside a box).
pub const INIT_VERB: &str = "box-init";

/// One command for the init to run.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct RunRequest {
    /// Command and arguments; `argv[0]` is looked up on the request's `PATH` when it holds no
    /// slash.
    pub argv: Vec<String>,
    /// The complete environment, `K=V`.
    pub env: Vec<String>,
    /// Working directory inside the box.
    pub cwd: PathBuf,
    /// Which of the standard descriptors 0, 1, 2 come with the request (in that order); the
    /// others are closed in the command, as they were closed in the caller, unless `pty`
    /// names them.
    pub stdio: [bool; 3],
    /// Which of the standard descriptors 0, 1, 2 are a pseudo-terminal the run's child opens
    /// inside the box (its own devpts) and makes its controlling terminal: the child leads the
    /// pty's session and is its foreground process group, and sends the master back with
    /// [`READY`]. None of them may also come with the request.
    #[serde(default)]
    pub pty: [bool; 3],
}

impl RunRequest {
    /// Whether the run has a terminal of the box's own.
    pub fn has_pty(&self) -> bool {
        self.pty.iter().any(|p| *p)
    }
}

/// How the child ended, as the init's `wait4` saw it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct RunEnd {
    /// The raw wait status.
    pub status: i32,
    /// `wait4` usage: utime µs, stime µs, maxrss KiB, minflt, majflt, inblock, oublock,
    /// nvcsw, nivcsw.
    pub usage: [u64; 9],
}

/// Why a sandbox run could not be served.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// The run's cgroup could not be made: without it nothing guarantees that the run's
    /// processes end with it, so the caller must not use the sandbox.
    #[error(transparent)]
    Cage(#[from] CageError),
    /// Talking to the box init failed.
    #[error("refusing: the box's sandbox did not answer ({step}): {source}; to fix: run the command again (h5i rebuilds the sandbox), or remove {socket} to force a rebuild")]
    Socket {
        /// Which step.
        step: &'static str,
        /// The init's socket.
        socket: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The box's terminal could not be proxied to the user's.
    #[error(transparent)]
    Terminal(crate::pty::PtyError),
    /// The init refused the request.
    #[error("refusing: the box's sandbox could not serve the command: {0}; to fix: run it again (a sandbox whose init ended is rebuilt), or set H5I_SANDBOX=off for a container per run")]
    Refused(String),
    /// The run's process could not be placed in its cgroup, or given its OOM score.
    #[error("refusing: cannot place the run (its cgroup and OOM score): {path}: {source}; to fix: run as root, or have root delegate a cgroup to you (make setup does it for the test user)")]
    Place {
        /// The file that refused: the cgroup's `cgroup.procs` or the run's `oom_score_adj`.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

/// What one sandbox run observed.
#[derive(Debug)]
pub struct SandboxRunReport {
    /// Exit, usage and wall time.
    pub child: ChildReport,
    /// The run's cgroup evidence (OOM, pids refused).
    pub cage: CageReport,
}

/// What the host needs to serve one run.
#[derive(Debug)]
pub struct RunSlot<'a> {
    /// The init's socket.
    pub socket: &'a Path,
    /// The run's cgroup id below `<own>/h5i/` (`<sandbox>/c/run-<pid>-<n>`).
    pub cage_id: &'a str,
    /// The run's memory limit.
    pub mem: Option<u64>,
    /// The run's process limit.
    pub procs: Option<u64>,
    /// The wall clock.
    pub wall: Option<Duration>,
}

fn sock_err<'a, E: Into<std::io::Error>>(
    step: &'static str,
    socket: &'a Path,
) -> impl FnOnce(E) -> SandboxError + 'a {
    move |e| SandboxError::Socket {
        step,
        socket: socket.to_path_buf(),
        source: e.into(),
    }
}

/// A listening `SOCK_SEQPACKET` socket at `path` (close-on-exec), for the init to inherit.
pub fn listen_at(path: &Path) -> Result<OwnedFd, SandboxError> {
    h5i_sys::seqpacket::listen_at(path, 64).map_err(sock_err("listen", path))
}

/// Connect to the init at `path`. `ECONNREFUSED`/`ENOENT` mean no init is listening (it ended:
/// idle timeout, killed): the caller rebuilds.
pub fn connect(path: &Path) -> Result<OwnedFd, SandboxError> {
    h5i_sys::seqpacket::connect_with_credentials(path).map_err(sock_err("connect", path))
}

/// Most descriptors one protocol message carries (the request's standard descriptors).
const MAX_FDS: usize = 3;

/// One received message.
pub(crate) struct Received {
    /// Its bytes (empty: the peer closed).
    pub bytes: Vec<u8>,
    /// Descriptors that came with it (close-on-exec).
    pub fds: Vec<OwnedFd>,
    /// The sender's pid in our pid namespace, when `SO_PASSCRED` is on.
    pub pid: Option<i32>,
}

/// Receive one message of at most `max` bytes; a longer one, or one with more than
/// [`MAX_FDS`] descriptors, is refused (`FdPassError::DataTruncated`, ...).
pub(crate) fn recv(conn: BorrowedFd<'_>, max: usize) -> Result<Received, FdPassError> {
    let mut buf = vec![0u8; max];
    let got = fd_passing::recv_with_fds(conn, &mut buf, MAX_FDS, Wait::Block)?;
    buf.truncate(got.len);
    Ok(Received {
        bytes: buf,
        fds: got.fds,
        pid: got.sender_pid,
    })
}

/// Wait until the init reports the run's end on `conn` or `deadline` passes (`false`),
/// delivering each interrupt signal h5i receives meanwhile to every process in the run's
/// `cage`, and moving the box's terminal (`companion`, when the run has one) in the same
/// `poll(2)`. Never sleeps past an event.
fn end_by(
    conn: &OwnedFd,
    signals: &crate::supervise::SignalBlock,
    cage: &ResourceCage,
    deadline: Option<Instant>,
    mut companion: Option<&mut dyn Companion>,
) -> std::io::Result<bool> {
    use h5i_sys::poll::{entry, wait, POLLIN};
    loop {
        let timeout = match deadline {
            None => None,
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Ok(false);
                }
                Some(left)
            }
        };
        let mut fds = vec![
            entry(conn.as_raw_fd(), POLLIN),
            entry(signals.fd().as_raw_fd(), POLLIN),
        ];
        if let Some(c) = companion.as_deref_mut() {
            c.interest(&mut fds);
        }
        match wait(&mut fds, timeout) {
            Ok(0) => continue,
            Ok(_) => {
                let ended = fds[0].revents != 0;
                if fds[1].revents != 0 {
                    while let Some(sig) = signals.read_signal() {
                        cage.signal_members(sig);
                    }
                }
                if let Some(c) = companion.as_deref_mut() {
                    c.ready(&fds[2..]);
                }
                if ended {
                    return Ok(true);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
}

/// The box's terminal proxy, when the run has one, as the wait loop's companion.
fn companion(terminal: &mut Option<crate::pty::PtyProxy>) -> Option<&mut dyn Companion> {
    terminal.as_mut().map(|p| p as &mut dyn Companion)
}

/// The pty master a run's child sent with its READY, when the request asked for a terminal
/// (exactly one descriptor, a pty master); none sent otherwise.
fn master_of(req: &RunRequest, fds: Vec<OwnedFd>) -> Result<Option<OwnedFd>, SandboxError> {
    let mut fds = fds.into_iter();
    match (req.has_pty(), fds.next(), fds.next()) {
        (false, None, _) => Ok(None),
        (true, Some(m), None) if crate::pty::is_pty_master(&m) => Ok(Some(m)),
        _ => Err(SandboxError::Refused(
            "the run's child sent descriptors its request did not ask for".into(),
        )),
    }
}

/// What a run's `oom_score_adj` is set to before it execs (the init keeps 0). The sandbox's
/// own cgroup holds the box's memory over all its runs and what they left behind (tmpfs and
/// shared memory pages, in no process's RSS): when that ceiling is met, the kernel's choice
/// among the cgroup's processes must fall on a run's, never on the init that serves every run
/// (a run's few pages of RSS can be fewer than the init's). Written by the caller, outside the
/// box (the init's Landlock domain grants no write under /proc); the box, holding no
/// capability, cannot lower it again.
const RUN_OOM_SCORE_ADJ: &str = "500";

/// Run `req` in the sandbox listening at `slot.socket`: make the run's cgroup, wait for
/// `ready` (what the caller started before, such as the sentry's table swap, overlaps the
/// cgroup's making; its refusal ends the run before the init hears of it), hand the init the
/// request and the caller's standard descriptors, place the child, let it exec, wait for it
/// (killing the run's group when the wall clock ends), then kill whatever the run left and
/// remove its group.
pub fn run(
    slot: &RunSlot<'_>,
    conn: OwnedFd,
    req: &RunRequest,
    stdio: &[BorrowedFd<'_>],
    ready: impl FnOnce() -> Result<(), String>,
) -> Result<SandboxRunReport, SandboxError> {
    let cage = ResourceCage::create(slot.cage_id, slot.mem, slot.procs)?;
    ready().map_err(SandboxError::Refused)?;
    let socket = slot.socket;
    let body = serde_json::to_vec(req).map_err(|e| SandboxError::Refused(e.to_string()))?;
    if body.len() > MAX_REQUEST {
        return Err(SandboxError::Refused(format!(
            "the command and environment take {} bytes, over the sandbox's {MAX_REQUEST}",
            body.len()
        )));
    }
    // From here until the run ends, an interrupt sent to h5i (Ctrl-C, `kill`, a CI cancel) is
    // the run's: it goes to every process in the run's group, never ends h5i before the run.
    let signals = crate::supervise::SignalBlock::forwarded()
        .map_err(|e| SandboxError::Refused(e.to_string()))?;
    let started = Instant::now();
    send_with_fds(&conn, &body, stdio).map_err(sock_err("send the request", socket))?;
    let ready = recv(conn.as_fd(), 4096).map_err(sock_err("wait for the child", socket))?;
    let pid = match (ready.bytes.first(), ready.pid) {
        (Some(&READY), Some(pid)) if pid > 0 => {
            h5i_log::spawned_argv(&req.argv, Some(pid as u32), "box sandbox");
            pid
        }
        (Some(&FAILED), _) => {
            return Err(SandboxError::Refused(
                String::from_utf8_lossy(&ready.bytes[1..]).into_owned(),
            ))
        }
        _ => {
            return Err(SandboxError::Refused(
                "the init answered out of protocol".into(),
            ))
        }
    };
    let placed = cage
        .admit(pid)
        .and_then(|()| {
            let score = PathBuf::from(format!("/proc/{pid}/oom_score_adj"));
            std::fs::write(&score, RUN_OOM_SCORE_ADJ).map_err(|e| (score, e))
        })
        .map_err(|(path, source)| SandboxError::Place { path, source })
        // The box's terminal: the user's is raw from here until `terminal` is dropped, and
        // the pty takes its window size before the command starts.
        .and_then(|()| master_of(req, ready.fds))
        .and_then(|master| {
            master
                .map(crate::pty::PtyProxy::with_master)
                .transpose()
                .map_err(SandboxError::Terminal)
        });
    let mut terminal = match placed {
        Ok(t) => t,
        Err(e) => {
            // The child has not exec'd: ending it here leaves nothing behind.
            cage.kill_members();
            // The pid the kernel named as the sender: the child waits for its go, unreaped.
            if let Ok(child) = h5i_sys::pidfd::open(pid) {
                let _ = h5i_sys::pidfd::kill(&child);
            }
            return Err(e);
        }
    };
    send_with_fds(&conn, &[GO], &[]).map_err(sock_err("release the child", socket))?;
    let deadline = slot.wall.map(|w| started + w);
    let mut timed_out = false;
    if !end_by(&conn, &signals, &cage, deadline, companion(&mut terminal))
        .map_err(sock_err("wait for the end", socket))?
    {
        timed_out = true;
        cage.kill_members();
        // The init reaps the killed child at once; an init that does not answer is broken.
        let grace = Some(Instant::now() + Duration::from_secs(10));
        if !end_by(&conn, &signals, &cage, grace, companion(&mut terminal))
            .map_err(sock_err("wait for the end", socket))?
        {
            return Err(SandboxError::Refused(
                "the init did not report the run the wall clock ended".into(),
            ));
        }
    }
    let end = recv(conn.as_fd(), 4096).map_err(sock_err("read the end", socket))?;
    let wall = started.elapsed();
    // What the command wrote before it ended is shown, then the user's terminal is restored
    // (closing the master hangs the box's pty up for whatever the run left on it).
    if let Some(t) = terminal.as_mut() {
        t.child_exited();
    }
    drop(terminal);
    // Whatever the command left running (a background job) ends with the run.
    cage.kill_members();
    let end: RunEnd = match end.bytes.split_first() {
        Some((&DONE, rest)) => serde_json::from_slice(rest)
            .map_err(|e| SandboxError::Refused(format!("unreadable end report: {e}")))?,
        Some((&FAILED, rest)) => {
            return Err(SandboxError::Refused(
                String::from_utf8_lossy(rest).into_owned(),
            ))
        }
        _ => {
            return Err(SandboxError::Refused(
                "the init went away before the run ended".into(),
            ))
        }
    };
    let ended = h5i_sys::proc::Ended::from_wait_status(end.status);
    let exit = ExitOutcome {
        code: ended.code,
        signal: ended.signal,
        timed_out,
        oom_killed: false,
    };
    let u = end.usage;
    let report = cage.report();
    Ok(SandboxRunReport {
        child: ChildReport {
            exit,
            rusage: Rusage {
                user_us: u[0],
                sys_us: u[1],
                maxrss_kb: u[2],
                minflt: u[3],
                majflt: u[4],
                inblock: u[5],
                oublock: u[6],
                nvcsw: u[7],
                nivcsw: u[8],
            },
            wall,
            pid,
        },
        cage: report,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_survives_its_encoding() {
        let req = RunRequest {
            argv: vec!["sh".into(), "-c".into(), "echo hi".into()],
            env: vec!["PATH=/usr/bin".into()],
            cwd: PathBuf::from("/work"),
            stdio: [true, false, true],
            pty: [false, true, false],
        };
        let text = serde_json::to_vec(&req).unwrap();
        assert_eq!(serde_json::from_slice::<RunRequest>(&text).unwrap(), req);
    }

    #[test]
    fn a_request_missing_a_field_is_refused() {
        assert!(serde_json::from_str::<RunRequest>(r#"{"argv":["true"],"env":[]}"#).is_err());
    }
}
