//! `h5i host setup --user NAME`: what an unprivileged user needs to run kernel-tier boxes.
//!
//! Owns, for one existing user: subordinate id ranges, `/run/user/<uid>` (0700, the user's; no
//! logind makes it on hosts without systemd), a delegated cgroup (see `cgroups`), and rootless
//! Podman's per-user configuration. Must never: prepare root, or create the user.

use std::ffi::CString;
use std::path::{Path, PathBuf};

use super::files::{ensure_private_dir, Owner};
use super::{cgroups, podman, subids, Change, HostError, HostRoot};

/// A user from the password database.
#[derive(Debug, Clone)]
pub struct User {
    /// Login name.
    pub name: String,
    /// uid.
    pub uid: u32,
    /// Primary gid.
    pub gid: u32,
    /// Home directory.
    pub home: PathBuf,
}

/// The password entry of `name`: `None` when there is none, an error when the database could
/// not be read (so a lookup failure is never taken for a missing user).
pub fn passwd_entry(name: &str) -> std::io::Result<Option<User>> {
    let Ok(c) = CString::new(name) else {
        return Ok(None);
    };
    let mut pw: libc::passwd = unsafe_zeroed_passwd();
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    let mut out: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: getpwnam_r writes into `pw` and `buf` (sized as passed) and sets `out` to `&pw`
    // on success; every pointer read below points into `buf`, alive for this function.
    let rc =
        unsafe { libc::getpwnam_r(c.as_ptr(), &mut pw, buf.as_mut_ptr(), buf.len(), &mut out) };
    if rc != 0 {
        return Err(std::io::Error::from_raw_os_error(rc));
    }
    if out.is_null() {
        return Ok(None);
    }
    // SAFETY: pw_dir is a NUL-terminated string inside `buf` (see above).
    let home = unsafe { std::ffi::CStr::from_ptr(pw.pw_dir) };
    Ok(Some(User {
        name: name.to_string(),
        uid: pw.pw_uid,
        gid: pw.pw_gid,
        home: PathBuf::from(home.to_string_lossy().into_owned()),
    }))
}

fn unsafe_zeroed_passwd() -> libc::passwd {
    // SAFETY: passwd is plain data (integers and pointers); all-zero is a valid value that
    // getpwnam_r overwrites.
    unsafe { std::mem::zeroed() }
}

/// The user `name`, refused when missing or root.
pub fn lookup(name: &str) -> Result<User, HostError> {
    let u = passwd_entry(name)
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
    if root.is_system() {
        cgroups::delegate(user.uid, user.gid, changes)?;
    }
    podman::user_config(&root.path(&user.home), owner, changes)
}
