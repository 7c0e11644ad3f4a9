//! The container tier's backend: the run is a Podman container of the box's image
//! (`crate::container` owns the engine, the evidence check and the egress proxy).
//!
//! Owns handing the session's secrets, credentials and terminal choice to it, and the box's
//! browser: a detached command here is a browser box's sidecar (`crate::service` refuses every
//! other service at this tier), announced to its supervisor by its init's pid file and its
//! container's name; any other run of a box whose sidecar is running joins it
//! (`crate::browser_box::container_join`). Must never: take Podman's client's resource
//! figures for the box's (the box's come from its cgroup).

use super::{PidSource, Resolved, RunRequest, Starting, Stdio, TierBackend, TierRun, Usage};
use crate::container::{BrowserPart, SidecarIo};
use crate::error::BoxError;

/// The container tier.
pub(super) struct Container;

impl TierBackend for Container {
    fn run(&self, resolved: Resolved<'_>, req: RunRequest<'_>) -> Result<TierRun, BoxError> {
        // Podman gives a terminal session a pty of the container's own (conmon holds the
        // master) and proxies it to this terminal: the box never holds the user's terminal.
        let tty = matches!(req.stdio, Stdio::Terminal);
        let mut announce_to;
        let browser = match req.stdio {
            Stdio::Service { stdout, starting } => {
                announce_to = move |pid_file: std::path::PathBuf, container: String| {
                    starting(Starting {
                        pid: PidSource::InitPidFile(pid_file),
                        own_network: true,
                        container: Some(container),
                    })
                };
                BrowserPart::Sidecar(SidecarIo {
                    stdout,
                    announce: &mut announce_to,
                })
            }
            _ => match crate::browser_box::container_join(resolved.sb, resolved.policy) {
                Some(join) => BrowserPart::Join(join),
                None => BrowserPart::None,
            },
        };
        let run = crate::container::run(
            resolved.sb,
            resolved.policy,
            crate::container::RunInputs {
                argv: &req.argv,
                wall: req.wall,
                secrets: &resolved.secrets,
                creds: resolved.creds.into_prepared(),
                tty,
                browser,
                caches: req.caches,
            },
        )?;
        Ok(TierRun {
            report: run.child,
            oom: run.oom,
            egress: run.egress,
            socket_gate: None,
            usage: Usage::Cgroup(run.usage),
        })
    }
}
