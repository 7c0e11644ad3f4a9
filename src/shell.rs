//! `h5i box shell NAME [-- CMD...]`: an interactive confined session in which every process is
//! inside the box, on a terminal of the box's own.
//!
//! Owns the session path: load the box, verify its policy, pick the shell (`bash -l` when the
//! box can see bash, else `sh`), give the box its own pseudo-terminal and proxy it to the user's
//! (`h5i_runtime::pty`), and append the same host-observed `host-env-run` record `box run`
//! writes. At the workspace tier h5i opens the pty pair itself; at the process tier `h5i-runc`
//! opens it inside the box and sends the master over the console socket. With stdin not a
//! terminal there is nothing to proxy: the session is `box run` of the shell, stdio passed
//! through, so `echo 'make test' | h5i box shell NAME` works.
//!
//! Must never: let a box process hold a descriptor of the user's terminal (so no TIOCSTI into
//! the user's shell after the session, no reading what the user types next, no terminal modes
//! left behind), hand the box the user's terminal's foreground, or leave the user's terminal in
//! raw mode on any exit path.
//!
//! Guarded by `tests/box_shell.rs`.

use std::ffi::OsString;
use std::io::{Read, Seek};
use std::path::Path;
use std::time::Duration;

use h5i_policy::{ResolvedPolicy, Tier};
use h5i_runtime::process_tier::Console;
use h5i_runtime::pty::{self, ConsoleSocket, PtyError, PtyPair, PtyProxy};
use h5i_runtime::supervise::run_supervised_session;

use crate::error::BoxError;
use crate::run::RunOutcome;
use crate::secrets;
use crate::store::{load_policy, now_ms, require_active, BoxStore};

/// Why a session could not start.
#[derive(Debug, thiserror::Error)]
pub enum ShellError {
    /// The box refused (as `box run` would).
    #[error(transparent)]
    Box(#[from] BoxError),
    /// The box's terminal could not be made.
    #[error(transparent)]
    Pty(#[from] PtyError),
}

/// The shell a session runs when no command is given: `bash -l` when the box can see bash,
/// else `sh`.
pub fn default_shell(policy: &ResolvedPolicy) -> Vec<OsString> {
    let visible = |p: &str| {
        Path::new(p).is_file()
            && (policy.tier == Tier::Workspace
                || policy
                    .fs
                    .read
                    .iter()
                    .any(|r| h5i_policy::values::path_within(p, r)))
    };
    match ["/usr/bin/bash", "/bin/bash"]
        .into_iter()
        .find(|p| visible(p))
    {
        Some(bash) => vec![bash.into(), "-l".into()],
        None => vec!["/bin/sh".into()],
    }
}

/// Run an interactive session of `argv` (the default shell when empty) in the box `name`.
pub fn shell(store: &BoxStore, name: &str, argv: &[OsString]) -> Result<RunOutcome, ShellError> {
    let sb = store.find(name)?;
    let _lock = crate::store::BoxLock::shared(&sb.paths, name)?;
    require_active(&sb, "shell")?;
    let policy = load_policy(&sb)?;
    let argv = if argv.is_empty() {
        default_shell(&policy)
    } else {
        argv.to_vec()
    };
    if !pty::is_terminal(0) {
        drop(_lock);
        return Ok(crate::run::run(store, name, &argv)?);
    }
    let wall = policy.resources.wall_secs.map(Duration::from_secs);
    let secrets = secrets::resolve_for_run(&policy)?;
    // Fail closed before anything starts, as `box run` does: every auth grant must be servable.
    let creds = crate::credentials::ForRun::prepare(&policy)?;
    let scrub = creds.redactions();
    let started_ms = now_ms();

    let pinned = match policy.tier {
        Tier::Supervised => Some(crate::supervised::pin_egress(&policy)?),
        _ => None,
    };
    let mut oom = None;
    let mut egress = None;
    let mut socket_gate = None;
    let mut usage = crate::run::Usage::Supervisor;
    let report = match policy.tier {
        Tier::Workspace => {
            let pair = PtyPair::open(pty::window_size(0).as_ref())?;
            let mut cmd = crate::run::workspace_command(&sb, &argv[0], &argv[1..]);
            let _files = secrets::inject_workspace(&mut cmd, &secrets)?;
            pty::attach_slave(&mut cmd, &pair.slave).map_err(|source| PtyError::Open {
                call: "dup(slave)",
                source,
            })?;
            drop(pair.slave);
            let mut proxy = PtyProxy::with_master(pair.master)?;
            let r = run_supervised_session(cmd, wall, &mut || false, &mut proxy);
            // The terminal is restored before anything is printed or returned.
            drop(proxy);
            r.map_err(BoxError::from)?
        }
        Tier::Process | Tier::Supervised => {
            let socket = ConsoleSocket::bind()?;
            let socket_path = socket.path().to_path_buf();
            let tmp = std::env::temp_dir();
            let mut runtime_stderr =
                tempfile::tempfile_in(&tmp).map_err(|e| BoxError::io(&tmp, e))?;
            let for_runtime = runtime_stderr
                .try_clone()
                .map_err(|e| BoxError::io(&tmp, e))?;
            let mut proxy = PtyProxy::with_console_socket(socket)?;
            let mut plan = crate::process::plan(&sb, &policy, &argv)?;
            let net = match pinned {
                Some(rules) => Some(crate::supervised::attach(&mut plan, rules)?),
                None => None,
            };
            let (r, tally) = creds.serve_during(plan, |plan| {
                crate::process::run_plan(
                    &policy,
                    plan,
                    wall,
                    &secrets,
                    Some(Console {
                        socket: &socket_path,
                        companion: &mut proxy,
                        runtime_stderr: for_runtime,
                    }),
                )
            })?;
            let refused = proxy.refused().map(str::to_string);
            drop(proxy);
            let mut said = String::new();
            let _ = runtime_stderr
                .rewind()
                .and_then(|()| runtime_stderr.read_to_string(&mut said));
            if !said.is_empty() {
                eprint!("{said}");
            } else if let Some(why) = refused {
                // Only when the runtime said nothing itself: its own error is the cause.
                eprintln!("h5i: box {name}: no terminal for the session: {why}");
            }
            // After the terminal is restored: settling may warn on stderr.
            (egress, socket_gate) = crate::supervised::settle(&sb, net, tally)?;
            let run = r?;
            oom = run.cage.oom;
            run.child
        }
        Tier::Container => {
            // Podman gives the container a pty of its own (conmon holds the master) and
            // proxies it to this terminal: the box never holds the user's terminal.
            let run = crate::container::run(
                &sb,
                &policy,
                crate::container::RunInputs {
                    argv: &argv,
                    wall,
                    secrets: &secrets,
                    creds: creds.into_prepared(),
                    tty: true,
                },
            )?;
            oom = run.oom;
            egress = run.egress;
            usage = crate::run::Usage::Cgroup(run.usage);
            run.child
        }
        other => return Err(crate::run::tier_not_built(name, other).into()),
    };

    // The same host-observed record `box run` writes, argv being the session's command.
    Ok(crate::run::record_with(
        &sb,
        &policy,
        &argv,
        started_ms,
        &report,
        oom,
        "shell",
        crate::run::RunExtras {
            scrub,
            egress,
            socket_gate,
            usage,
        },
    )?)
}
