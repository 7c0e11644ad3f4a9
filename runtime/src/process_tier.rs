//! The process tier: a box run as an OCI bundle through `h5i-runc`, inside a resource cage.
//!
//! Owns the order of one run: cage (limits) -> bundle -> `h5i-runc run` supervised on a pidfd
//! (with `--console-socket` and the pty proxy polled beside it for `box shell`)
//! -> cage evidence -> cage removal. The wall clock kills the container's init by the pid
//! `h5i-runc` wrote (its pid namespace goes with it), then the runtime's group.
//!
//! Must never: start the command when the cage or the bundle could not be made as planned.

use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::bundle::{write_bundle, BundleNotes, BundlePlan};
use crate::cage::{CageError, CageReport, ResourceCage};

use crate::pty::new_session;
use crate::supervise::{
    run_supervised_forwarding, run_supervised_session, ChildReport, Companion, SuperviseError,
};

/// Why a process-tier run could not start.
#[derive(Debug, thiserror::Error)]
pub enum ProcessTierError {
    /// The resource cage could not be made.
    #[error(transparent)]
    Cage(#[from] CageError),
    /// The bundle could not be written.
    #[error("refusing: cannot write the run's bundle in {dir}: {source}; to fix: check free space and permissions of the box directory")]
    Bundle {
        /// Where.
        dir: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// Supervising failed.
    #[error(transparent)]
    Supervise(#[from] SuperviseError),
}

/// How to reach `h5i-runc` and where it keeps state.
#[derive(Debug, Clone)]
pub struct RuncInvocation {
    /// The `h5i-runc` binary.
    pub binary: PathBuf,
    /// Its `--root`, when the default does not suit the caller.
    pub root: Option<PathBuf>,
}

/// What one process-tier run observed.
#[derive(Debug)]
pub struct ProcessRunReport {
    /// The runtime's exit, as the supervisor saw it (the container's code passes through).
    pub child: ChildReport,
    /// The cage's evidence.
    pub cage: CageReport,
    /// What the bundle left out.
    pub notes: BundleNotes,
}

/// The box's own terminal for a run (`box shell`): `h5i-runc` gets `--console-socket`, opens a
/// pty inside the box and sends its master there; `companion` (the pty proxy) takes it from the
/// socket and proxies it. The runtime runs in its own session with no controlling terminal and
/// none of the user's terminal descriptors.
pub struct Console<'a> {
    /// Passed as `--console-socket`.
    pub socket: &'a Path,
    /// Polled beside the runtime until it exits.
    pub companion: &'a mut dyn Companion,
    /// The runtime's own stderr (the user's terminal belongs to the proxy while the session
    /// runs); the caller shows it once the terminal is restored.
    pub runtime_stderr: std::fs::File,
}

/// Run `plan` in `bundle_dir` under `mem`/`procs` limits and the wall clock.
pub fn run(
    runc: &RuncInvocation,
    plan: BundlePlan,
    bundle_dir: &Path,
    mem: Option<u64>,
    procs: Option<u64>,
    wall: Option<Duration>,
) -> Result<ProcessRunReport, ProcessTierError> {
    run_with_console(runc, plan, bundle_dir, mem, procs, wall, None)
}

/// [`run`], with the box's own terminal when `console` is given (`process.terminal` is set
/// from it).
pub fn run_with_console(
    runc: &RuncInvocation,
    mut plan: BundlePlan,
    bundle_dir: &Path,
    mem: Option<u64>,
    procs: Option<u64>,
    wall: Option<Duration>,
    console: Option<Console<'_>>,
) -> Result<ProcessRunReport, ProcessTierError> {
    plan.terminal = console.is_some();
    // The sealed copy of h5i-runc is made beside the cage and the bundle (a second thread, on a
    // second core) and the runtime is exec'd from it: h5i-runc finds itself sealed and skips
    // its own copy-and-re-exec (see runc::seal), which otherwise sits on every run's path.
    let sealing = std::thread::spawn({
        let binary = runc.binary.clone();
        move || {
            std::fs::File::open(&binary)
                .ok()
                .map(|f| crate::runc::seal::sealed_copy_of(&f))
        }
    });
    // A host that cannot give h5i a cgroup cannot hold mem/procs: the run goes ahead and the
    // reason is carried out for `status` to mark the limits `*` (the manual's rule), never
    // listed as enforced.
    let (cage, unheld) = match ResourceCage::create(&plan.id, mem, procs) {
        Ok(c) => (Some(c), None),
        Err(e) => (None, Some(e.to_string())),
    };
    plan.cgroups_path = cage.as_ref().map(ResourceCage::container_path);
    let mut notes = write_bundle(&plan, bundle_dir).map_err(|source| ProcessTierError::Bundle {
        dir: bundle_dir.to_path_buf(),
        source,
    })?;
    notes.limits_unheld = unheld;
    let pid_file = bundle_dir.join("init.pid");
    // Without a sealed copy (it could not be made here), h5i-runc makes its own and refuses
    // to run unsealed: the guarantee is h5i-runc's, this is only where the copy happens.
    let sealed = sealing.join().ok().flatten().and_then(Result::ok);
    let mut cmd = match &sealed {
        Some(memfd) => {
            // The child opens /proc/self/fd/N before exec closes N (CLOEXEC); argv[0] stays
            // the real path for messages.
            let mut c = Command::new(format!("/proc/self/fd/{}", memfd.as_raw_fd()));
            c.arg0(&runc.binary);
            c
        }
        None => Command::new(&runc.binary),
    };
    if let Some(root) = &runc.root {
        cmd.arg("--root").arg(root);
    }
    cmd.arg("run")
        .arg("--bundle")
        .arg(bundle_dir)
        .arg("--pid-file")
        .arg(&pid_file);
    if let Some(c) = &console {
        cmd.arg("--console-socket").arg(c.socket);
    }
    cmd.arg(&plan.id);
    let mut on_wall = || {
        // Killing the init ends its pid namespace; h5i-runc sees it go and deletes the
        // container (state, cgroup) before exiting, so nothing outlives the run.
        if let Some(pid) = std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|t| t.trim().parse::<i32>().ok())
            .filter(|p| *p > 1)
        {
            // The pid was written by h5i-runc for this run and the init is not yet reaped by
            // anyone else (its parent, h5i-runc, is still alive: we are before the group
            // kill), so the pidfd opened now is the init's.
            h5i_sys::pidfd::open(pid)
                .and_then(|fd| h5i_sys::pidfd::send_signal(&fd, libc::SIGKILL))
                .is_ok()
        } else {
            false
        }
    };
    let child = match console {
        None => {
            crate::stdio::close_in_child(&mut cmd);
            // An interrupt is the box's command's, as on a terminal: delivered to every process
            // in the run's cage. Sent to h5i-runc's group instead, it never reached the command
            // (h5i-runc does not relay it), and the run went on after the user's Ctrl-C.
            let mut on_signal = |sig| match &cage {
                Some(c) => {
                    c.signal_members(sig);
                    true
                }
                None => false,
            };
            run_supervised_forwarding(cmd, wall, &mut on_wall, &mut on_signal)?
        }
        Some(c) => {
            new_session(&mut cmd);
            cmd.stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(c.runtime_stderr);
            run_supervised_session(cmd, wall, &mut on_wall, c.companion)?
        }
    };
    let cage_report = cage.as_ref().map(ResourceCage::report).unwrap_or_default();
    drop(cage);
    let _ = std::fs::remove_dir_all(bundle_dir);
    Ok(ProcessRunReport {
        child,
        cage: cage_report,
        notes,
    })
}
