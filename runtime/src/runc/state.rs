//! `state`: print a container's OCI state as JSON (runc's field set; Podman parses it).
//!
//! `bundle` is the bundle the caller passed, even when h5i-runc created it from a shadow spec
//! (see `sidecar`); `pid` is 0 once the container has stopped, as runc reports it.

use std::collections::HashMap;
use std::path::PathBuf;

use libcontainer::container::{Container, ContainerStatus};
use libcontainer::oci_spec::runtime::Spec;
use serde::Serialize;

use super::{sidecar, Context, RuncError};

/// The printed state.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct StateReport {
    /// OCI runtime-spec version.
    pub oci_version: String,
    /// Container id.
    pub id: String,
    /// Init pid, 0 when stopped.
    pub pid: i32,
    /// `creating`, `created`, `running`, `paused` or `stopped`.
    pub status: String,
    /// Bundle directory as passed to create.
    pub bundle: PathBuf,
    /// Root filesystem.
    pub rootfs: PathBuf,
    /// Creation time (RFC 3339).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created: Option<String>,
    /// Name of the creating user.
    pub owner: String,
    /// The spec's annotations.
    #[serde(skip_serializing_if = "HashMap::is_empty")]
    pub annotations: HashMap<String, String>,
}

/// Lower-case status word of the OCI state.
pub fn status_word(status: ContainerStatus) -> &'static str {
    match status {
        ContainerStatus::Creating => "creating",
        ContainerStatus::Created => "created",
        ContainerStatus::Running => "running",
        ContainerStatus::Stopped => "stopped",
        ContainerStatus::Paused => "paused",
    }
}

/// Build the report for a loaded container.
pub fn report(ctx: &Context, container: &Container) -> StateReport {
    let status = container.status();
    // A container created before h5i-runc kept its spec apart from the bundle has the shadow
    // as its bundle; the sidecar still names the caller's.
    let bundle = sidecar::load(&ctx.root, container.id())
        .map(|r| r.bundle)
        .unwrap_or_else(|| container.bundle().clone());
    let rootfs = Spec::load(super::spec_path(container))
        .ok()
        .and_then(|s| s.root().as_ref().map(|r| bundle.join(r.path())))
        .unwrap_or_default();
    let pid = match status {
        ContainerStatus::Stopped => 0,
        _ => container.pid().map(|p| p.as_raw()).unwrap_or(0),
    };
    StateReport {
        oci_version: container.state.oci_version.clone(),
        id: container.id().to_string(),
        pid,
        status: status_word(status).to_string(),
        bundle,
        rootfs,
        created: container.created().map(|c| c.to_rfc3339()),
        owner: container
            .creator()
            .map(|c| c.to_string_lossy().into_owned())
            .unwrap_or_default(),
        annotations: container.state.annotations.clone().unwrap_or_default(),
    }
}

/// State of container `id`.
pub fn state(ctx: &Context, id: &str) -> Result<StateReport, RuncError> {
    let container = ctx.load(id)?;
    Ok(report(ctx, &container))
}
