//! The box init: the process `h5i-runc` starts as a box sandbox's payload (`h5i-runc box-init`),
//! pid 1 of the box's pid namespace, already confined exactly as a per-run box command would be.
//!
//! Owns serving run requests (see the protocol in the parent module) on the listening socket it
//! inherited as descriptor 3, reaping every process of its pid namespace (orphans included),
//! and ending itself after an idle period with no run in flight. Single-threaded: it forks.
//! A run's child resets what the init changed for itself (signal mask, `SIGPIPE`), takes the
//! request's standard descriptors, starts a session of its own, reports ready, waits for the
//! host's go (by then the host has placed it in the run's cgroup), closes every descriptor of the
//! init's (all close-on-exec) and execs.
//!
//! Must never: exec a command before the host's go, hand a run any descriptor but the three
//! the request carried, or keep serving after the listening socket failed.

use std::collections::HashMap;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use h5i_sys::fd_passing::{send_with_fds, FdPassError};
use h5i_sys::fork_exec::{ExecArgs, Forked};
use h5i_sys::poll::{POLLERR, POLLHUP, POLLIN, POLLNVAL};
use h5i_sys::signals::SignalFd;

use super::{recv, RunEnd, RunRequest, DONE, FAILED, GO, MAX_REQUEST, READY};

/// The descriptor the listening socket arrives on (`--preserve-fds 1`).
pub const LISTEN_FD: RawFd = 3;

/// Why the init stopped serving.
#[derive(Debug, thiserror::Error)]
pub enum InitError {
    /// Descriptor 3 is not a listening socket.
    #[error("refusing: box-init needs a listening unix socket on descriptor 3; to fix: start it only through h5i (h5i box run)")]
    NoListener,
    /// A kernel call the loop depends on failed.
    #[error("box-init: {call}: {source}")]
    Kernel {
        /// Which call.
        call: &'static str,
        /// The error.
        source: io::Error,
    },
}

fn kernel(call: &'static str) -> impl FnOnce(io::Error) -> InitError {
    move |source| InitError::Kernel { call, source }
}

/// Serve until idle for `idle` with no run in flight (or the listener fails).
pub fn serve(idle: Duration) -> Result<(), InitError> {
    // A run has the same uid and no capabilities: non-dumpable, the init's memory and
    // descriptors are out of its reach (ptrace and /proc/1/{mem,fd} need CAP_SYS_PTRACE).
    h5i_sys::caps::set_not_dumpable().map_err(kernel("prctl(PR_SET_DUMPABLE)"))?;
    // SAFETY: LISTEN_FD is only borrowed for the getsockopt call.
    if !h5i_sys::seqpacket::is_listening(unsafe { BorrowedFd::borrow_raw(LISTEN_FD) }) {
        return Err(InitError::NoListener);
    }
    // SAFETY: descriptor 3 was handed to this process for this purpose and nothing else owns it.
    let listener = unsafe { OwnedFd::from_raw_fd(LISTEN_FD) };
    // A run must never inherit the listener.
    h5i_sys::fds::set_cloexec(&listener).map_err(kernel("fcntl(FD_CLOEXEC)"))?;
    // SIGCHLD blocked for the init's whole life (the SignalFd is never dropped before it
    // returns) and read from a close-on-exec, non-blocking signalfd.
    let sigchld = SignalFd::block(&[libc::SIGCHLD]).map_err(kernel("signalfd"))?;
    // child pid -> its request's connection
    let mut runs: HashMap<i32, OwnedFd> = HashMap::new();
    // Idle is counted from the last run, not the last wakeup: h5i's `status` (box ls, the
    // console's refresh) connects to learn whether the init answers, and such a connection
    // carries no run, so it must not keep the sandbox up.
    let mut last_run = Instant::now();
    loop {
        if !runs.is_empty() {
            last_run = Instant::now();
        }
        let pids: Vec<i32> = runs.keys().copied().collect();
        let mut fds = vec![
            h5i_sys::poll::entry(listener.as_raw_fd(), POLLIN),
            h5i_sys::poll::entry(sigchld.as_fd().as_raw_fd(), POLLIN),
        ];
        // Connections are polled for POLLHUP only (events empty): the child reads its go.
        fds.extend(
            pids.iter()
                .filter_map(|p| runs.get(p))
                .map(|c| h5i_sys::poll::entry(c.as_raw_fd(), 0)),
        );
        let timeout = if runs.is_empty() {
            let left = idle.saturating_sub(last_run.elapsed());
            if left.is_zero() {
                return Ok(());
            }
            Some(left)
        } else {
            None
        };
        let n = match h5i_sys::poll::wait(&mut fds, timeout) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                return Err(InitError::Kernel {
                    call: "poll",
                    source: e,
                })
            }
        };
        if n == 0 && runs.is_empty() {
            return Ok(());
        }
        let ready = |i: usize| fds[i].revents;
        let accept = ready(0) & POLLIN != 0;
        if ready(0) & (POLLERR | POLLNVAL) != 0 {
            return Err(InitError::NoListener);
        }
        let reap = ready(1) & POLLIN != 0;
        let hung: Vec<i32> = pids
            .iter()
            .enumerate()
            .filter(|(i, _)| ready(i + 2) & (POLLHUP | POLLERR) != 0)
            .map(|(_, pid)| *pid)
            .collect();
        drop(fds);
        for pid in hung {
            // The host went away mid-run: the command ends with it (the host's next run
            // removes whatever it left in the run's cgroup). The pid is our own unreaped
            // child's, so the pidfd opened now names that child.
            if let Ok(child) = h5i_sys::pidfd::open(pid) {
                let _ = h5i_sys::pidfd::kill(&child);
            }
        }
        if reap {
            while sigchld.read().is_some() {}
            reap_all(&mut runs);
        }
        if accept {
            if let Ok(conn) = h5i_sys::seqpacket::accept(&listener) {
                if let Some(pid) = start(&conn) {
                    runs.insert(pid, conn);
                }
            }
        }
    }
}

/// Reap every exited process; report the ones that are runs.
fn reap_all(runs: &mut HashMap<i32, OwnedFd>) {
    while let Ok(Some(h5i_sys::proc::Reaped {
        pid,
        status,
        usage: ru,
    })) = h5i_sys::proc::reap_any_with_usage_nohang()
    {
        if let Some(conn) = runs.remove(&pid) {
            let us = |tv: libc::timeval| {
                (tv.tv_sec.max(0) as u64) * 1_000_000 + tv.tv_usec.max(0) as u64
            };
            let n = |v: libc::c_long| v.max(0) as u64;
            let end = RunEnd {
                status,
                usage: [
                    us(ru.ru_utime),
                    us(ru.ru_stime),
                    n(ru.ru_maxrss),
                    n(ru.ru_minflt),
                    n(ru.ru_majflt),
                    n(ru.ru_inblock),
                    n(ru.ru_oublock),
                    n(ru.ru_nvcsw),
                    n(ru.ru_nivcsw),
                ],
            };
            let mut msg = vec![DONE];
            msg.extend(serde_json::to_vec(&end).unwrap_or_default());
            let _ = send_with_fds(conn, &msg, &[]);
        }
    }
}

fn refuse(conn: &OwnedFd, why: &str) {
    let mut msg = vec![FAILED];
    msg.extend(why.as_bytes());
    let _ = send_with_fds(conn, &msg, &[]);
}

/// Read one request from `conn` and fork its child; the child's pid, or None when refused.
fn start(conn: &OwnedFd) -> Option<i32> {
    let got = match recv(conn.as_fd(), MAX_REQUEST + 1) {
        Ok(g) => g,
        Err(FdPassError::DataTruncated { .. }) => {
            refuse(conn, "the request is larger than the sandbox reads");
            return None;
        }
        Err(e) => {
            refuse(conn, &format!("reading the request: {e}"));
            return None;
        }
    };
    let req: RunRequest = match serde_json::from_slice(&got.bytes) {
        Ok(r) => r,
        Err(e) => {
            refuse(conn, &format!("unreadable request: {e}"));
            return None;
        }
    };
    let wanted = req.stdio.iter().filter(|o| **o).count();
    let doubled = req.stdio.iter().zip(req.pty).any(|(s, p)| *s && p);
    if got.fds.len() != wanted || req.argv.is_empty() || doubled {
        refuse(conn, "the request's descriptors or argv do not match it");
        return None;
    }
    let prepared = match Prepared::from(&req) {
        Ok(p) => p,
        Err(why) => {
            refuse(conn, &why);
            return None;
        }
    };
    // SAFETY: the init is single-threaded, so the child may run ordinary code until exec.
    match unsafe { h5i_sys::fork_exec::fork_single_threaded() } {
        Err(e) => {
            refuse(conn, &format!("fork: {e}"));
            None
        }
        Ok(Forked::Child) => {
            let code = child(conn, &req, &got.fds, &prepared);
            h5i_sys::fork_exec::exit_now(code)
        }
        Ok(Forked::Parent(pid)) => Some(pid),
    }
}

/// The request's strings as C strings, made before the fork.
struct Prepared {
    exec: ExecArgs,
    cwd: CString,
    /// Candidate paths for `argv[0]`, in `PATH` order (just `argv[0]` when it holds a slash).
    candidates: Vec<CString>,
}

impl Prepared {
    fn from(req: &RunRequest) -> Result<Prepared, String> {
        let c = |s: &str| CString::new(s).map_err(|_| format!("{s:?} holds a NUL byte"));
        let argv = req
            .argv
            .iter()
            .map(|a| c(a))
            .collect::<Result<Vec<_>, _>>()?;
        let env = req
            .env
            .iter()
            .map(|a| c(a))
            .collect::<Result<Vec<_>, _>>()?;
        let cwd = c(&req.cwd.to_string_lossy())?;
        let prog = &req.argv[0];
        let candidates = if prog.contains('/') {
            vec![c(prog)?]
        } else {
            let path = req
                .env
                .iter()
                .find_map(|e| e.strip_prefix("PATH="))
                .unwrap_or("/usr/local/bin:/usr/bin:/bin");
            path.split(':')
                .filter(|d| !d.is_empty())
                .map(|d| c(&format!("{d}/{prog}")))
                .collect::<Result<Vec<_>, _>>()?
        };
        Ok(Prepared {
            exec: ExecArgs::new(argv, env),
            cwd,
            candidates,
        })
    }
}

/// The child's side: returns the exit code when it could not exec.
fn child(conn: &OwnedFd, req: &RunRequest, fds: &[OwnedFd], p: &Prepared) -> i32 {
    // Undo what the init set for itself: the blocked SIGCHLD and Rust's ignored SIGPIPE
    // (both are inherited across exec).
    let _ = h5i_sys::signals::unblock_all();
    let _ = h5i_sys::signals::reset_to_default(libc::SIGPIPE);
    // The child is not a group leader (a fresh fork), so this cannot fail.
    let _ = h5i_sys::proc::new_session();
    // The box's own terminal, opened here (in the box's devpts, under its Landlock domain and
    // seccomp filter): this child leads the new session, so the slave becomes its controlling
    // terminal and its process group the terminal's foreground job.
    let terminal = if req.has_pty() {
        match crate::pty::PtyPair::open(None)
            .map_err(|e| e.to_string())
            .and_then(|pair| {
                crate::pty::take_as_controlling_terminal(&pair.slave)
                    .map(|()| pair)
                    .map_err(|e| format!("TIOCSCTTY: {e}"))
            }) {
            Ok(pair) => Some(pair),
            Err(why) => {
                refuse(conn, &format!("no terminal in the box: {why}"));
                return 126;
            }
        }
    } else {
        None
    };
    let mut given = fds.iter();
    for (target, open) in req.stdio.iter().enumerate() {
        let slave = terminal
            .as_ref()
            .filter(|_| req.pty[target])
            .map(|pair| &pair.slave);
        // dup2 onto a standard descriptor clears its close-on-exec flag.
        if let Some(slave) = slave {
            if h5i_sys::fds::point_std(target as RawFd, slave.as_fd()).is_err() {
                return 126;
            }
        } else if *open {
            if let Some(fd) = given.next() {
                if h5i_sys::fds::point_std(target as RawFd, fd.as_fd()).is_err() {
                    return 126;
                }
            }
        } else {
            // The caller had this standard descriptor closed: so does the command.
            let _ = h5i_sys::fds::close_std(target as RawFd);
        }
    }
    if let Err(e) = h5i_sys::proc::change_dir(&p.cwd) {
        say(&format!("h5i: cannot enter {}: {e}\n", req.cwd.display()));
        return 126;
    }
    // The master goes to the host with READY and is closed here: no box process holds it.
    let master: Vec<BorrowedFd<'_>> = terminal.iter().map(|p| p.master.as_fd()).collect();
    if send_with_fds(conn, &[READY], &master).is_err() {
        return 126;
    }
    drop(master);
    drop(terminal);
    match recv(conn.as_fd(), 16) {
        Ok(g) if g.bytes == [GO] => {}
        _ => return 126,
    }
    let mut first_error = libc::ENOENT;
    for cand in &p.candidates {
        // Every descriptor but 0-2 is close-on-exec.
        let errno = p.exec.exec(cand).raw_os_error().unwrap_or(0);
        if errno != libc::ENOENT && errno != libc::ENOTDIR && first_error == libc::ENOENT {
            first_error = errno;
        }
    }
    say(&format!(
        "h5i: cannot run `{}`: {}\n",
        req.argv[0],
        std::io::Error::from_raw_os_error(first_error)
    ));
    if first_error == libc::ENOENT {
        127
    } else {
        126
    }
}

/// Best effort to the command's stderr.
fn say(text: &str) {
    // Descriptor 2 may be closed (then EBADF): nothing more to do.
    let _ = h5i_sys::fds::write_raw(2, text.as_bytes());
}
