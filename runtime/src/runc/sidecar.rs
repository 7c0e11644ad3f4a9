//! h5i-runc's own per-container state, beside libcontainer's: `<root>/.h5i/<id>/`.
//!
//! libcontainer offers no way to change the cgroups path, so for a spec *without*
//! `linux.cgroupsPath`, or with a relative one, h5i-runc writes a shadow spec:
//! `<root>/.h5i/<id>/bundle/config.json` (the same spec with the placed cgroups path and an
//! absolute `root.path`), which libcontainer reads (patched: `with_config`) while the
//! container's bundle, as hooks and `state` see it, stays the caller's. `record.json` keeps the
//! original bundle and the cgroup directories to remove on delete. A spec that names an
//! absolute cgroups path (Podman's, h5i's) is used in place, unless one of the rootless
//! adjustments below applies to it (then it gets a shadow with its own path kept and nothing
//! to clean).
//!
//! Rootless on cgroup v1 (rootless Podman: uid 0 in its user namespace, `resources {}`):
//! libcontainer writes default device rules whenever `linux.resources` is present, and v1's
//! `devices.allow` needs real root. When the resources ask for no limit, the shadow spec drops
//! the empty `resources` (device rules cannot be held rootless anyway; the user namespace and
//! the container's own /dev are what confine devices there). Limits that cannot be held are
//! refused, not dropped.
//!
//! Rootless with a new user namespace (`podman --userns=keep-id`): Podman lists the process's
//! own primary gid as its only supplementary group, which libcontainer refuses for any
//! unprivileged caller (CVE-2014-8989). A supplementary list holding nothing but the primary
//! gid grants nothing the primary gid does not, so the shadow spec drops it; any other
//! supplementary group is left for libcontainer to refuse.
//!
//! Must never: modify the caller's bundle, or survive `delete` (also removed when `create`
//! fails).

use std::path::{Path, PathBuf};

use libcontainer::oci_spec::runtime::Spec;
use serde::{Deserialize, Serialize};

use super::{cgroup, RuncError};

/// Directory under the state root holding all sidecars.
pub const SIDECAR_DIR: &str = ".h5i";

/// What `record.json` holds.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Record {
    /// The bundle the caller passed.
    pub bundle: PathBuf,
    /// The cgroups path h5i-runc chose.
    pub cgroup_path: PathBuf,
    /// Cgroup directories to remove on delete (see `cgroup::dirs_to_clean`).
    pub cgroup_dirs: Vec<PathBuf>,
}

/// The bundle libcontainer should use.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// Original bundle, or the shadow bundle when a cgroups path was placed.
    pub bundle: PathBuf,
    /// Whether a sidecar was written.
    pub shadowed: bool,
}

/// `<root>/.h5i/<id>`.
pub fn dir(root: &Path, id: &str) -> PathBuf {
    root.join(SIDECAR_DIR).join(id)
}

/// Read the sidecar record, if there is one.
pub fn load(root: &Path, id: &str) -> Option<Record> {
    let text = std::fs::read_to_string(dir(root, id).join("record.json")).ok()?;
    serde_json::from_str(&text).ok()
}

/// Decide whether the bundle needs a shadow (no cgroups path) and write it if so.
pub fn prepare(root: &Path, id: &str, bundle: &Path) -> Result<Prepared, RuncError> {
    let config = bundle.join("config.json");
    let mut spec = Spec::load(&config).map_err(|source| RuncError::Spec {
        path: config.clone(),
        source,
    })?;
    let Some(linux) = spec.linux().clone() else {
        // libcontainer refuses a spec without `linux`; let it say so.
        return Ok(Prepared {
            bundle: bundle.to_path_buf(),
            shadowed: false,
        });
    };
    let rootless = super::in_user_namespace() || nix_euid() != 0;
    let drop_groups = rootless && only_primary_gid(&spec);
    let named_path = linux.cgroups_path().clone();
    let absolute = named_path.as_ref().is_some_and(|p| p.is_absolute());
    let layout = cgroup::detect_layout()?;
    let rootless_v1 = layout == cgroup::Layout::V1 && super::in_user_namespace();
    if absolute && !drop_groups && !(rootless_v1 && linux.resources().is_some()) {
        return Ok(Prepared {
            bundle: bundle.to_path_buf(),
            shadowed: false,
        });
    }
    let (cgroup_path, cgroup_dirs) = match named_path {
        Some(p) if absolute => (p, Vec::new()),
        named => {
            let (p, dirs, _) = cgroup::place(id, named.as_deref())?;
            (p, dirs)
        }
    };
    if drop_groups {
        if let Some(mut process) = spec.process().clone() {
            let mut user = process.user().clone();
            user.set_additional_gids(None);
            process.set_user(user);
            spec.set_process(Some(process));
        }
    }
    let sidecar = dir(root, id);
    let shadow = sidecar.join("bundle");
    if sidecar.exists() {
        // Leftover of a create that died hard: start clean.
        std::fs::remove_dir_all(&sidecar)
            .map_err(RuncError::io("cannot clear sidecar", &sidecar))?;
    }
    std::fs::create_dir_all(&shadow).map_err(RuncError::io("cannot create sidecar", &shadow))?;
    let result = write_shadow(&mut spec, linux, bundle, &shadow, &cgroup_path, rootless_v1)
        .and_then(|()| {
            let record = Record {
                bundle: bundle.to_path_buf(),
                cgroup_path,
                cgroup_dirs,
            };
            let path = sidecar.join("record.json");
            let text = serde_json::to_string_pretty(&record)
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
                .map_err(RuncError::io("cannot encode", &path))?;
            std::fs::write(&path, text).map_err(RuncError::io("cannot write", &path))
        });
    if let Err(e) = result {
        let _ = std::fs::remove_dir_all(&sidecar);
        return Err(e);
    }
    Ok(Prepared {
        bundle: shadow,
        shadowed: true,
    })
}

fn write_shadow(
    spec: &mut Spec,
    mut linux: libcontainer::oci_spec::runtime::Linux,
    bundle: &Path,
    shadow: &Path,
    cgroup_path: &Path,
    rootless_v1: bool,
) -> Result<(), RuncError> {
    linux.set_cgroups_path(Some(cgroup_path.to_path_buf()));
    if rootless_v1 {
        match linux.resources() {
            Some(r) if !limitless(r) => return Err(RuncError::RootlessV1Limits),
            Some(_) => {
                linux.set_resources(None);
            }
            None => {}
        }
    }
    spec.set_linux(Some(linux));
    if let Some(mut root) = spec.root().clone() {
        let rootfs = bundle.join(root.path());
        let rootfs = std::fs::canonicalize(&rootfs).map_err(RuncError::io("rootfs", &rootfs))?;
        root.set_path(rootfs);
        spec.set_root(Some(root));
    }
    let config = shadow.join("config.json");
    spec.save(&config).map_err(|source| RuncError::Spec {
        path: config.clone(),
        source,
    })?;
    Ok(())
}

/// Write `spec` (rewritten by `stage`) as the staged spec beside the shadow bundle's and return
/// its path: libcontainer reads it while the state (and every hook) keeps the caller's bundle.
/// Removed with the sidecar.
pub fn write_staged(root: &Path, id: &str, spec: &Spec) -> Result<PathBuf, RuncError> {
    let shadow = dir(root, id).join("bundle");
    std::fs::create_dir_all(&shadow).map_err(RuncError::io("cannot create sidecar", &shadow))?;
    let config = shadow.join("staged.json");
    spec.save(&config).map_err(|source| RuncError::Spec {
        path: config.clone(),
        source,
    })?;
    Ok(config)
}

/// True when the process's supplementary groups are exactly its own primary gid.
fn only_primary_gid(spec: &Spec) -> bool {
    spec.process().as_ref().is_some_and(|p| {
        let user = p.user();
        user.additional_gids()
            .as_deref()
            .is_some_and(|g| !g.is_empty() && g.iter().all(|&x| x == user.gid()))
    })
}

fn nix_euid() -> u32 {
    h5i_sys::ids::euid()
}

/// True when `resources` asks for nothing but device rules (which v1 cannot hold rootless).
pub fn limitless(resources: &libcontainer::oci_spec::runtime::LinuxResources) -> bool {
    let Ok(serde_json::Value::Object(mut fields)) = serde_json::to_value(resources) else {
        return false;
    };
    fields.remove("devices");
    fields.values().all(|v| match v {
        serde_json::Value::Null => true,
        serde_json::Value::Object(o) => o.is_empty(),
        serde_json::Value::Array(a) => a.is_empty(),
        _ => false,
    })
}

/// Remove the sidecar and the cgroup directories it recorded (those still in use wait in the
/// ledger for the delete that empties them: `cgroup::settle`). Idempotent.
pub fn cleanup(root: &Path, id: &str) {
    let sidecar = dir(root, id);
    let dirs = load(root, id).map(|r| r.cgroup_dirs).unwrap_or_default();
    if let Err(e) = cgroup::settle(&root.join(SIDECAR_DIR), &dirs) {
        tracing::warn!(error = %e, "cgroup directories may be left behind");
    }
    match std::fs::remove_dir_all(&sidecar) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!(?sidecar, error = %e, "could not remove sidecar"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use libcontainer::oci_spec::runtime::LinuxResources;

    fn resources(json: &str) -> LinuxResources {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn empty_and_device_only_resources_are_limitless() {
        assert!(limitless(&resources("{}")));
        assert!(limitless(&resources(
            r#"{"devices":[{"allow":false,"access":"rwm"}]}"#
        )));
    }

    fn spec_with_groups(gid: u32, groups: Option<Vec<u32>>) -> Spec {
        let mut spec = Spec::default();
        let mut process = spec.process().clone().unwrap();
        let mut user = process.user().clone();
        user.set_gid(gid);
        user.set_additional_gids(groups);
        process.set_user(user);
        spec.set_process(Some(process));
        spec
    }

    #[test]
    fn only_the_primary_gid_as_supplementary_group_is_redundant() {
        assert!(only_primary_gid(&spec_with_groups(1001, Some(vec![1001]))));
        assert!(only_primary_gid(&spec_with_groups(7, Some(vec![7, 7]))));
        // Any other group is a real grant: left for libcontainer to judge.
        assert!(!only_primary_gid(&spec_with_groups(
            1001,
            Some(vec![1001, 27])
        )));
        assert!(!only_primary_gid(&spec_with_groups(1001, Some(vec![]))));
        assert!(!only_primary_gid(&spec_with_groups(1001, None)));
    }

    #[test]
    fn any_limit_is_not_limitless() {
        assert!(!limitless(&resources(r#"{"memory":{"limit":1048576}}"#)));
        assert!(!limitless(&resources(r#"{"pids":{"limit":10}}"#)));
        assert!(!limitless(&resources(r#"{"cpu":{"shares":512}}"#)));
    }
}
