//! The workspace tier's backend: the command runs on the host, in the box's workspace, under
//! the supervisor (its whole process group killed at the wall clock).
//!
//! Owns the host command of a workspace-tier run and its wiring. The workspace tier has no
//! mount namespace, so it cannot place the workspace at `/work`: its runs see host paths (the
//! workspace's, under the parent's `.git/.h5i`, and the spool's); only the kernel tiers hide
//! them (`h5i_policy::inbox`). Must never: claim any confinement for such a run.

use std::ffi::OsString;
use std::process::Command;

use h5i_runtime::pty::{self, PtyError, PtyPair, PtyProxy};
use h5i_runtime::supervise::{run_supervised, run_supervised_session};

use super::{PidSource, Resolved, RunRequest, Starting, Stdio, TierBackend, TierRun};
use crate::error::BoxError;
use crate::store::StoredBox;

/// The workspace tier.
pub(super) struct Workspace;

/// The command for a workspace-tier run of `argv`: in the workspace, with the box's variables.
fn workspace_command(sb: &StoredBox, argv: &[OsString]) -> Command {
    // An empty command line spawns "": that fails, and the supervisor says so.
    let mut args = argv.iter();
    let mut cmd = Command::new(args.next().map(OsString::as_os_str).unwrap_or_default());
    cmd.args(args)
        .current_dir(sb.paths.workspace())
        .env("H5I_ENV_ID", &sb.manifest.name)
        .env("H5I_ENV_POLICY_DIGEST", &sb.manifest.policy_digest)
        .env("H5I_ENV_CAPTURE_SPOOL", sb.paths.spool());
    cmd
}

impl TierBackend for Workspace {
    fn run(&self, resolved: Resolved<'_>, req: RunRequest<'_>) -> Result<TierRun, BoxError> {
        let mut cmd = workspace_command(resolved.sb, &req.argv);
        let report = match req.stdio {
            Stdio::Caller => {
                let _files = crate::secrets::inject_workspace(&mut cmd, &resolved.secrets)?;
                h5i_runtime::stdio::close_in_child(&mut cmd);
                run_supervised(cmd, req.wall)?
            }
            Stdio::Terminal => {
                let _files = crate::secrets::inject_workspace(&mut cmd, &resolved.secrets)?;
                let pair = PtyPair::open(pty::window_size(0).as_ref())?;
                pty::attach_slave(&mut cmd, &pair.slave).map_err(|source| PtyError::Open {
                    call: "dup(slave)",
                    source,
                })?;
                drop(pair.slave);
                let mut proxy = PtyProxy::with_master(pair.master)?;
                let r = run_supervised_session(cmd, req.wall, &mut || false, &mut proxy);
                // The terminal is restored before anything is printed or returned.
                drop(proxy);
                r?
            }
            Stdio::Service { stdout, starting } => {
                starting(Starting {
                    pid: PidSource::Wrapper,
                    own_network: false,
                    container: None,
                });
                cmd.stdin(std::process::Stdio::null())
                    .stdout(std::process::Stdio::from(stdout));
                let _files = crate::secrets::inject_workspace(&mut cmd, &resolved.secrets)?;
                run_supervised(cmd, req.wall)?
            }
        };
        Ok(TierRun::supervised(report, None, None))
    }
}
