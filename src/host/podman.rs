//! Podman's configuration for h5i: the host's `containers.conf`, a user's rootless config, and
//! the supervised tier's hooks.d entries with the `h5i-hook` they run.
//!
//! The values are what the container tier needs on the hosts h5i is developed on (HOST.md):
//! Podman asks for `nofile=1048576`, which root cannot raise past 20000 there; crun refuses
//! hybrid cgroup hosts, runc works; without systemd, cgroupfs and file events. Rootless Podman
//! falls back to vfs without a `storage.conf` selecting overlay.
//! Must never: write a user's file as root without handing it to the user, or point hooks.d at
//! an `h5i-hook` that is not installed.

use std::path::Path;

use super::files::{ensure_dir, write_if_differs, Owner};
use super::{Change, HostError, HostRoot};

/// `containers.conf`, for root and for a prepared user alike.
pub const CONTAINERS_CONF: &str = "# Written by `h5i host setup`.
# nofile: root may be unable to raise the hard limit past 20000 (Podman asks 1048576).
# runc: crun refuses hybrid cgroup v1 hosts. No systemd here: cgroupfs + file events.
[containers]
default_ulimits = [\"nofile=20000:20000\", \"nproc=32768:32768\"]

[engine]
runtime = \"runc\"
cgroup_manager = \"cgroupfs\"
events_logger = \"file\"
";

/// A user's `storage.conf`: native rootless overlay (else Podman falls back to vfs).
pub const STORAGE_CONF: &str = "# Written by `h5i host setup`: native rootless overlay.
[storage]
driver = \"overlay\"
";

/// Where Podman reads hooks.d (measured on Podman 4.3.1: rootful and rootless alike).
pub const HOOKS_D: &str = "/usr/share/containers/oci/hooks.d";
/// Where the entries point.
pub const HOOK_BIN: &str = "/usr/local/libexec/h5i/h5i-hook";

/// The hooks.d entries (hooks/oci/*.json), by file name.
pub const HOOK_ENTRIES: [(&str, &str); 3] = [
    (
        "h5i-supervised-net-up.json",
        include_str!("../../hooks/oci/h5i-supervised-net-up.json"),
    ),
    (
        "h5i-supervised-net-inside.json",
        include_str!("../../hooks/oci/h5i-supervised-net-inside.json"),
    ),
    (
        "h5i-supervised-net-down.json",
        include_str!("../../hooks/oci/h5i-supervised-net-down.json"),
    ),
];

/// `/etc/containers/containers.conf`.
pub fn host_config(root: &HostRoot, changes: &mut Vec<Change>) -> Result<(), HostError> {
    let p = root.path("/etc/containers/containers.conf");
    if write_if_differs(&p, CONTAINERS_CONF.as_bytes(), 0o644, Owner::ROOT)? {
        changes.push(Change(format!("wrote {}", p.display())));
    }
    Ok(())
}

/// The hooks.d entries and `hook` copied to [`HOOK_BIN`].
pub fn install_hooks(
    root: &HostRoot,
    hook: &Path,
    changes: &mut Vec<Change>,
) -> Result<(), HostError> {
    let bin = std::fs::read(hook).map_err(HostError::io("read", hook))?;
    let dest = root.path(HOOK_BIN);
    if write_if_differs(&dest, &bin, 0o755, Owner::ROOT)? {
        changes.push(Change(format!(
            "installed {HOOK_BIN} from {}",
            hook.display()
        )));
    }
    for (name, text) in HOOK_ENTRIES {
        let p = root.path(HOOKS_D).join(name);
        if write_if_differs(&p, text.as_bytes(), 0o644, Owner::ROOT)? {
            changes.push(Change(format!("installed {}", p.display())));
        }
    }
    Ok(())
}

/// A user's `~/.config/containers/{containers,storage}.conf`, owned by the user. A
/// `storage.conf` the user already has is left alone (it may select fuse-overlayfs).
pub fn user_config(home: &Path, owner: Owner, changes: &mut Vec<Change>) -> Result<(), HostError> {
    let dir = home.join(".config/containers");
    for d in [home.join(".config"), dir.clone()] {
        if ensure_dir(&d, 0o755, owner)? {
            changes.push(Change(format!("created {}", d.display())));
        }
    }
    let conf = dir.join("containers.conf");
    if write_if_differs(&conf, CONTAINERS_CONF.as_bytes(), 0o644, owner)? {
        changes.push(Change(format!("wrote {}", conf.display())));
    }
    let storage = dir.join("storage.conf");
    if !storage.exists() && write_if_differs(&storage, STORAGE_CONF.as_bytes(), 0o644, owner)? {
        changes.push(Change(format!("wrote {}", storage.display())));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hooks_are_installed_once_over_a_temp_root() {
        if h5i_sys::ids::euid() != 0 {
            h5i_testsupport::skipped!(
                "hooks_are_installed_once_over_a_temp_root: needs root (root-owned files)"
            );
            return;
        }
        let d = tempfile::tempdir().unwrap();
        let hook = d.path().join("h5i-hook-built");
        std::fs::write(&hook, b"\x7fELF stand-in").unwrap();
        let root = HostRoot::at(&d.path().join("root"));
        let mut ch = Vec::new();
        install_hooks(&root, &hook, &mut ch).unwrap();
        assert_eq!(ch.len(), 4, "{ch:?}");
        ch.clear();
        install_hooks(&root, &hook, &mut ch).unwrap();
        host_config(&root, &mut ch).unwrap();
        assert_eq!(ch.len(), 1, "{ch:?}");
        let entry = std::fs::read_to_string(root.path(HOOKS_D).join(HOOK_ENTRIES[0].0)).unwrap();
        assert!(entry.contains(HOOK_BIN));
    }
}
