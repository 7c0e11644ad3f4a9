//! The supervised network's three OCI hooks: `net-up` (createRuntime), `net-inside`
//! (createContainer) and `net-down` (poststop). Each reads the OCI state on stdin and the spec
//! from the bundle it names (Podman's poststop state lacks h5i-runc's `h5i.net.dir`, its
//! bundle's `config.json` has it).
//!
//! - `net-up` checks the spec (`net_spec::load`), clears the last run's tally, starts the
//!   sentry detached (own session, stdio: the plan, the ready pipe, `sentry.log`), and waits,
//!   bounded, for its `ready` on the pipe; anything else fails the container before it starts.
//! - `net-inside` runs inside the box before `pivot_root`: brings `lo` up, makes the uplink's
//!   persistent tap device (`tap.rs`), sends the fds of its own network and user namespaces to
//!   the sentry (`attach`), and waits, bounded, for `ok`, which the sentry gives only once the
//!   table is loaded and the uplink is up. Until then the box's init is held here: no process of
//!   the box has run yet.
//! - `net-up --attach` does `net-inside`'s work itself, once the sentry is ready, for a box whose
//!   root is not host root (h5i as root maps it to an unprivileged range, which cannot reach the
//!   root-only net directory or its spec): as root, a forked child enters the box's network
//!   namespace by pid for `lo` and the tap, and the hook hands the namespaces over. h5i then
//!   declares no `net-inside`.
//! - `net-down` asks the sentry to finish (`stop`), waits (bounded) until it has answered and
//!   exited, and succeeds only if `tally.json` exists; it removes what the sentry left, and a
//!   net directory h5i-runc made for the run goes whatever the outcome (`net_end`).
//!
//! Must never: start a box whose table or uplink did not come up, wait without a bound, or
//! report success for a run without a tally.

use std::io::{self, Read, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::net_spec::{self, GATE_SOCK, NET_SOCK, SENTRY_LOG, SENTRY_PID, TALLY};
use crate::sentry::SentryPlan;
use crate::state::OciState;
use h5i_sys::fd_passing::send_with_fds;
use h5i_sys::pidfd;

/// How long the sentry may take to pin, bind and say ready.
const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// How long the sentry may take to load the table and bring the uplink up (each step inside
/// is bounded at 10 s).
const ATTACH_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the sentry may take to answer `stop` (read its counters, write the tally), and
/// again to exit: together inside the hooks.d entry's 30 s.
const STOP_TIMEOUT: Duration = Duration::from_secs(12);

/// Why a network hook failed (the container then does not start, or its end is reported).
#[derive(Debug, thiserror::Error)]
pub enum NetHookError {
    /// The state on stdin was refused.
    #[error(transparent)]
    State(#[from] crate::state::StateError),
    /// The spec was refused.
    #[error(transparent)]
    Spec(#[from] net_spec::NetSpecError),
    /// `lo` could not be brought up.
    #[error(transparent)]
    Loopback(#[from] crate::loopback::LoopbackError),
    /// The uplink's tap device could not be made.
    #[error(transparent)]
    Tap(#[from] crate::tap::TapError),
    /// The net directory h5i-runc made could not be removed.
    #[error(transparent)]
    End(#[from] crate::net_end::NetEndError),
    /// A step failed with an OS error.
    #[error("refusing: {what} {path}: {source}; to fix: {mend}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// On which path.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
        /// The mend.
        mend: &'static str,
    },
    /// The sentry said no, or said nothing in time.
    #[error("{answer} (sentry log: {log})")]
    Sentry {
        /// The sentry's answer, or what happened instead.
        answer: String,
        /// Where its log is.
        log: PathBuf,
    },
}

fn read_state() -> Result<OciState, NetHookError> {
    let mut buf = Vec::new();
    io::stdin()
        .take(1 << 20)
        .read_to_end(&mut buf)
        .map_err(|source| NetHookError::Io {
            what: "cannot read the OCI state from",
            path: "stdin".into(),
            source,
            mend: "run h5i-hook only as an OCI hook",
        })?;
    Ok(OciState::parse(&buf)?)
}

fn sentry_error(dir: &Path, answer: impl Into<String>) -> NetHookError {
    NetHookError::Sentry {
        answer: answer.into(),
        log: dir.join(SENTRY_LOG),
    }
}

/// Read one answer line from `conn` within `timeout`.
fn read_answer(conn: &mut UnixStream, timeout: Duration) -> Result<String, String> {
    let ready = h5i_sys::poll::readable(&[conn.as_fd()], Some(timeout))
        .map_err(|e| format!("refusing: waiting for the sentry failed: {e}"))?;
    if ready.is_empty() {
        return Err(format!(
            "refusing: the sentry did not answer within {}s",
            timeout.as_secs()
        ));
    }
    let mut buf = Vec::new();
    conn.take(4096)
        .read_to_end(&mut buf)
        .map_err(|e| format!("refusing: reading the sentry's answer failed: {e}"))?;
    Ok(String::from_utf8_lossy(&buf).trim_end().to_string())
}

/// `net-up`: check the spec, start the sentry, wait for it to be ready; with `attach`, then do
/// `net-inside`'s work from the host.
pub fn net_up(attach: bool) -> Result<(), NetHookError> {
    let state = read_state()?;
    let (dir, pid) = start_sentry(&state)?;
    if attach {
        attach_from_host(&dir, pid)?;
    }
    Ok(())
}

/// Start the sentry for the spec `state` names; returns its net directory and the box's pid.
fn start_sentry(state: &OciState) -> Result<(PathBuf, i32), NetHookError> {
    let pid = i32::try_from(state.runtime_pid()?).unwrap_or(0);
    let config = net_spec::read_config(state.bundle()?)?;
    let spec = net_spec::load(&config)?;
    let dir = spec.dir.clone();
    let io_err = |what, path: &Path, mend| {
        let path = path.to_path_buf();
        move |source| NetHookError::Io {
            what,
            path,
            source,
            mend,
        }
    };
    if dir.join(NET_SOCK).exists() {
        return Err(sentry_error(
            &dir,
            format!(
                "refusing: {} already has a sentry socket; to fix: give every run a fresh h5i.net.dir",
                dir.display()
            ),
        ));
    }
    match std::fs::remove_file(dir.join(TALLY)) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(io_err(
                "cannot clear the last run's tally",
                &dir.join(TALLY),
                "the net directory must be writable",
            )(e))
        }
    }
    let log = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .open(dir.join(SENTRY_LOG))
        .map_err(io_err(
            "cannot open",
            &dir.join(SENTRY_LOG),
            "the net directory must be writable",
        ))?;
    let plan = SentryPlan {
        dir: dir.clone(),
        init_pid: pid,
        egress: spec.egress,
        unix: spec.unix,
        families: spec.families,
    };
    let plan = serde_json::to_vec(&plan).map_err(|e| {
        io_err(
            "cannot encode the plan for",
            &dir,
            "report this as an h5i bug",
        )(io::Error::other(e))
    })?;
    let mut cmd = Command::new("/proc/self/exe");
    cmd.arg0("h5i-hook")
        .arg("sentry")
        .env_clear()
        .envs(
            h5i_log::passed_env()
                .iter()
                .filter_map(|kv| kv.split_once('=')),
        )
        .current_dir("/")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(log);
    // SAFETY: runs in the forked child before exec and makes one system call (setsid:
    // async-signal-safe, no allocation).
    unsafe {
        cmd.pre_exec(h5i_sys::proc::new_session);
    }
    let mut child = cmd.spawn().map_err(io_err(
        "cannot start the sentry for",
        &dir,
        "report this as an h5i bug",
    ))?;
    h5i_log::spawned(&cmd, Some(child.id()));
    let mut stdin = child.stdin.take();
    let sent = stdin.as_mut().map(|s| s.write_all(&plan));
    drop(stdin);
    let answer = match (sent, child.stdout.take()) {
        (Some(Ok(())), Some(mut out)) => {
            let ready = h5i_sys::poll::readable(&[out.as_fd()], Some(READY_TIMEOUT));
            match ready {
                Ok(r) if r.is_empty() => Err(format!(
                    "refusing: the sentry was not ready within {}s",
                    READY_TIMEOUT.as_secs()
                )),
                Ok(_) => {
                    let mut line = Vec::new();
                    // The sentry writes one line and closes (or, once ready, detaches) stdout.
                    let mut byte = [0u8; 1];
                    while line.len() < 4096 {
                        match out.read(&mut byte) {
                            Ok(1) if byte[0] != b'\n' => line.push(byte[0]),
                            _ => break,
                        }
                    }
                    Ok(String::from_utf8_lossy(&line).into_owned())
                }
                Err(e) => Err(format!("refusing: waiting for the sentry failed: {e}")),
            }
        }
        _ => Err("refusing: the sentry exited before reading its plan".to_string()),
    };
    match answer {
        Ok(line) if line == "ready" => Ok((dir, pid)),
        Ok(line) if line.is_empty() => {
            let _ = child.wait();
            Err(sentry_error(
                &dir,
                "refusing: the sentry exited without a word",
            ))
        }
        Ok(line) => {
            let _ = child.wait();
            Err(sentry_error(&dir, line))
        }
        Err(e) => {
            let _ = child.kill();
            let _ = child.wait();
            Err(sentry_error(&dir, e))
        }
    }
}

/// `net-inside`: bring `lo` up, make the uplink's tap device, hand the box's namespaces to the
/// sentry, wait for `ok`.
pub fn net_inside() -> Result<(), NetHookError> {
    let state = read_state()?;
    let config = net_spec::read_config(state.bundle()?)?;
    let dir = net_spec::net_dir(&config)?;
    // Refuses the host's network namespace, so the tap below is always the box's.
    crate::loopback::bring_up_inside()?;
    crate::tap::make_persistent(crate::uplink::DEVICE)?;
    let net = std::fs::File::open("/proc/self/ns/net");
    let user = std::fs::File::open("/proc/self/ns/user");
    hand_over(&dir, net, user)
}

/// `net-inside` from the host (root): `lo` and the tap in the network namespace of the box's
/// init `pid`, made by a forked child that enters it (entering changes the caller's namespace),
/// then the namespaces handed over by descriptor.
fn attach_from_host(dir: &Path, pid: i32) -> Result<(), NetHookError> {
    // SAFETY: the hook is single-threaded (it spawns processes, never threads), so the child
    // may run ordinary code: it enters the namespace, makes its changes and leaves with _exit.
    let status = unsafe {
        h5i_sys::fork_exec::in_forked_child(|| {
            let made = crate::loopback::bring_up(i64::from(pid))
                .map_err(NetHookError::from)
                .and_then(|()| {
                    crate::tap::make_persistent(crate::uplink::DEVICE).map_err(Into::into)
                });
            match made {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("h5i-hook: {e}");
                    1
                }
            }
        })
    }
    .map_err(|e| {
        sentry_error(
            dir,
            format!("refusing: cannot fork to enter the box's network namespace: {e}"),
        )
    })?;
    if h5i_sys::proc::Ended::from_wait_status(status).code != Some(0) {
        return Err(sentry_error(
            dir,
            format!("refusing: bringing up lo and the uplink's tap in the network namespace of pid {pid} failed (status {status})"),
        ));
    }
    let net = std::fs::File::open(format!("/proc/{pid}/ns/net"));
    let user = std::fs::File::open(format!("/proc/{pid}/ns/user"));
    hand_over(dir, net, user)
}

/// Send the box's network and user namespaces to the sentry in `dir`, wait for `ok`.
fn hand_over(
    dir: &Path,
    net: io::Result<std::fs::File>,
    user: io::Result<std::fs::File>,
) -> Result<(), NetHookError> {
    let sock = dir.join(NET_SOCK);
    let io_err = |what, source| NetHookError::Io {
        what,
        path: sock.clone(),
        source,
        mend: "net-up (the createRuntime hook) must have started the sentry",
    };
    let mut conn =
        UnixStream::connect(&sock).map_err(|e| io_err("cannot reach the sentry at", e))?;
    let net = net.map_err(|e| io_err("cannot open this box's network namespace for", e))?;
    let user = user.map_err(|e| io_err("cannot open this box's user namespace for", e))?;
    send_with_fds(&conn, b"attach\n", &[net.as_fd(), user.as_fd()])
        .map_err(|e| io_err("cannot send the namespaces to the sentry at", e.into()))?;
    match read_answer(&mut conn, ATTACH_TIMEOUT) {
        Ok(line) if line == "ok" => Ok(()),
        Ok(line) => Err(sentry_error(dir, line)),
        Err(e) => Err(sentry_error(dir, e)),
    }
}

/// `net-down`: ask the sentry to finish, wait until it has, check the tally exists; then end a
/// net directory h5i-runc made (its tally and log kept in the bundle).
pub fn net_down() -> Result<(), NetHookError> {
    let state = read_state()?;
    let bundle = state.bundle()?;
    let config = net_spec::read_config(bundle)?;
    let stopped = stop_sentry(&config);
    match (crate::net_end::finish(&config, &state.id, bundle), stopped) {
        (
            Ok(crate::net_end::Finished::Removed { log: Some(log) }),
            Err(NetHookError::Sentry { answer, .. }),
        ) => Err(NetHookError::Sentry { answer, log }),
        (Err(e), Ok(())) => Err(e.into()),
        (_, stopped) => stopped,
    }
}

fn stop_sentry(config: &serde_json::Value) -> Result<(), NetHookError> {
    let dir = net_spec::net_dir(config)?;
    let sentry = std::fs::read_to_string(dir.join(SENTRY_PID))
        .ok()
        .and_then(|s| s.trim().parse::<i32>().ok())
        .filter(|pid| *pid > 1)
        .and_then(|pid| pidfd::open(pid).ok());
    let mut answer = None;
    if let Ok(mut conn) = UnixStream::connect(dir.join(NET_SOCK)) {
        if send_with_fds(&conn, b"stop\n", &[]).is_ok() {
            answer = Some(read_answer(&mut conn, STOP_TIMEOUT));
        }
    }
    if let Some(sentry) = &sentry {
        if !matches!(pidfd::wait_exited(sentry, STOP_TIMEOUT), Ok(true)) {
            return Err(sentry_error(
                &dir,
                format!(
                    "refusing: the sentry did not exit within {}s of stop",
                    STOP_TIMEOUT.as_secs()
                ),
            ));
        }
    }
    for name in [NET_SOCK, GATE_SOCK, SENTRY_PID] {
        let _ = std::fs::remove_file(dir.join(name));
    }
    match answer {
        Some(Ok(line)) if line != "ok" && !line.is_empty() => Err(sentry_error(&dir, line)),
        Some(Err(e)) if !dir.join(TALLY).exists() => Err(sentry_error(&dir, e)),
        _ if dir.join(TALLY).exists() => Ok(()),
        _ => Err(sentry_error(
            &dir,
            format!(
                "refusing: the sentry ended without writing {}",
                dir.join(TALLY).display()
            ),
        )),
    }
}
