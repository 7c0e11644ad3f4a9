//! `h5i host setup --user NAME`: what an unprivileged user needs to run kernel-tier boxes.
//!
//! Owns, for one existing user: subordinate id ranges, `/run/user/<uid>` (0700, the user's; no
//! logind makes it on hosts without systemd), a delegated cgroup (see `cgroups`), and rootless
//! Podman's per-user configuration. Must never: prepare root, or create the user.

use std::path::Path;

use super::files::{ensure_private_dir, Owner};
use super::{cgroups, podman, subids, Change, HostError, HostRoot};

/// A user from the password database (`h5i_sys::users`, where the lookup lives).
pub use h5i_sys::users::Account as User;

/// The user `name`, refused when missing or root.
pub fn lookup(name: &str) -> Result<User, HostError> {
    let u = h5i_sys::users::by_name(name)
        .map_err(HostError::io(
            "look up the user in",
            Path::new("/etc/passwd"),
        ))?
        .ok_or_else(|| HostError::NoSuchUser(name.to_string()))?;
    if u.uid == 0 {
        return Err(HostError::UserIsRoot(name.to_string()));
    }
    Ok(u)
}

/// Prepare `user` on `root`.
pub fn prepare(root: &HostRoot, user: &User, changes: &mut Vec<Change>) -> Result<(), HostError> {
    // First: a cgroup delegated to another user refuses before anything is changed for this one.
    if root.is_system() {
        cgroups::delegate(user.uid, user.gid, changes)?;
    }
    let uid = user.uid.to_string();
    for file in ["/etc/subuid", "/etc/subgid"] {
        subids::ensure_range(&root.path(file), &[&user.name, &uid], changes)?;
    }
    let owner = Owner {
        uid: user.uid,
        gid: user.gid,
    };
    let run = root.path(format!("/run/user/{}", user.uid));
    if ensure_private_dir(&run, 0o700, owner)? {
        changes.push(Change(format!(
            "made {} (0700, {})",
            run.display(),
            user.name
        )));
    }
    podman::user_config(&root.path(&user.home), owner, changes)
}
