//! Holding the spec's read-only cgroup mount, which libcontainer 0.7 drops on cgroup v1.
//!
//! libcontainer mounts each v1 hierarchy into the container read-write whatever the spec's
//! `/sys/fs/cgroup` mount says (HOST.md: container root could raise its own memory limit).
//! After `create` has built the container (init waits for `start`, already in its mount
//! namespace and past `pivot_root`), h5i-runc forks a child that joins that mount namespace and
//! makes the cgroup mount and everything beneath it read-only with one recursive
//! `mount_setattr(MOUNT_ATTR_RDONLY)`. Paths resolve inside the container's root, never the
//! host's: a container without a mount namespace shares h5i-runc's, and its cgroup mount is
//! then the one libcontainer made under its rootfs (h5i-runc once remounted the host's
//! `/sys/fs/cgroup` read-only there). A failure fails `create`.
//!
//! Must never: make a cgroup mount the spec asked to be read-write read-only, or touch a mount
//! of the host's namespace. Guarded by `tests/runc.rs`
//! (`cgroup_mount_marked_ro_is_read_only_inside`,
//! `no_mount_namespace_leaves_the_hosts_cgroup_mounts_writable`) and `tests/podman.rs`.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use libcontainer::oci_spec::runtime::Spec;

const MOUNT_ATTR_RDONLY: u64 = 0x1;

/// `struct mount_attr` (linux/mount.h).
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// Why the read-only cgroup mount could not be held.
#[derive(Debug, thiserror::Error)]
pub enum CgroupRoError {
    /// A step failed.
    #[error("refusing: cannot make the container's cgroup mount {dest} read-only as the spec asks ({step}): {source}; to fix: drop \"ro\" from that mount only if the container may change its own limits")]
    Step {
        /// The mount destination.
        dest: PathBuf,
        /// Which step.
        step: &'static str,
        /// The OS error.
        source: io::Error,
    },
}

/// The destination of a `cgroup` mount the spec wants read-only, if any.
pub fn readonly_cgroup_mount(spec: &Spec) -> Option<PathBuf> {
    spec.mounts().as_ref()?.iter().find_map(|m| {
        let is_cgroup = m.typ().as_deref() == Some("cgroup");
        let ro = m
            .options()
            .as_ref()
            .is_some_and(|o| o.iter().any(|x| x == "ro"));
        (is_cgroup && ro).then(|| m.destination().clone())
    })
}

/// `mount_setattr(MOUNT_ATTR_RDONLY)` on `path` and every mount beneath it, without following
/// a symlink at `path`. Makes no allocation, so it may run in a forked child.
fn setattr_readonly(path: &CString, attr: &MountAttr) -> libc::c_long {
    // SAFETY: path is a valid C string and attr a valid mount_attr of the size passed.
    unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            path.as_ptr(),
            (libc::AT_RECURSIVE | libc::AT_SYMLINK_NOFOLLOW) as libc::c_uint,
            attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    }
}

/// Make `dest` and every mount beneath it read-only inside `init_pid`'s mount namespace. A
/// container without a mount namespace of its own shares ours: its cgroup mount is then
/// `dest` under its root file system `rootfs` (where libcontainer mounted it), never the
/// host's `dest`.
pub fn enforce(init_pid: i32, dest: &Path, rootfs: &Path) -> Result<(), CgroupRoError> {
    let step = |step: &'static str| {
        let dest = dest.to_path_buf();
        move |source: io::Error| CgroupRoError::Step { dest, step, source }
    };
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_RDONLY,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    let ns =
        std::fs::File::open(format!("/proc/{init_pid}/ns/mnt")).map_err(step("open mnt ns"))?;
    let own = std::fs::metadata("/proc/self/ns/mnt").map_err(step("stat own mnt ns"))?;
    let theirs = ns.metadata().map_err(step("stat mnt ns"))?;
    use std::os::unix::fs::MetadataExt;
    if (own.dev(), own.ino()) == (theirs.dev(), theirs.ino()) {
        let inside = in_rootfs(rootfs, dest).map_err(step("resolve inside the rootfs"))?;
        let path = CString::new(inside.as_os_str().as_bytes())
            .map_err(|e| step("path")(io::Error::new(io::ErrorKind::InvalidInput, e)))?;
        if setattr_readonly(&path, &attr) != 0 {
            return Err(step("mount_setattr")(io::Error::last_os_error()));
        }
        return Ok(());
    }
    let path = CString::new(dest.as_os_str().as_bytes())
        .map_err(|e| step("path")(io::Error::new(io::ErrorKind::InvalidInput, e)))?;
    use std::os::fd::AsRawFd;
    let ns_fd = ns.as_raw_fd();

    // SAFETY: h5i-runc is single-threaded here; the child only makes raw syscalls on memory
    // prepared before the fork (ns_fd, path, attr) and leaves with _exit.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(step("fork")(io::Error::last_os_error()));
    }
    if pid == 0 {
        // SAFETY: in the forked child; async-signal-safe syscalls only, then _exit.
        unsafe {
            if libc::setns(ns_fd, libc::CLONE_NEWNS) != 0 {
                libc::_exit(10);
            }
            if setattr_readonly(&path, &attr) != 0 {
                let errno = *libc::__errno_location();
                libc::_exit(20 + errno.clamp(0, 200));
            }
            libc::_exit(0);
        }
    }
    let mut status = 0;
    // SAFETY: waiting for the child we just forked; status is a valid out pointer.
    let rc = unsafe { libc::waitpid(pid, &mut status, 0) };
    if rc < 0 {
        return Err(step("waitpid")(io::Error::last_os_error()));
    }
    match libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status)) {
        Some(0) => Ok(()),
        Some(10) => Err(step("setns")(io::Error::other(
            "could not join the container's mount namespace",
        ))),
        Some(code) if code >= 20 => Err(step("mount_setattr")(io::Error::from_raw_os_error(
            code - 20,
        ))),
        _ => Err(step("child")(io::Error::other(format!(
            "helper ended with status {status:#x}"
        )))),
    }
}

/// `dest` resolved under `rootfs`, refused when a symlink leads it out of the rootfs (it would
/// name a mount of the host's).
fn in_rootfs(rootfs: &Path, dest: &Path) -> io::Result<PathBuf> {
    let root = std::fs::canonicalize(rootfs)?;
    let inner = dest.strip_prefix("/").unwrap_or(dest);
    let resolved = std::fs::canonicalize(root.join(inner))?;
    if !resolved.starts_with(&root) {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("{} leads outside the rootfs", resolved.display()),
        ));
    }
    Ok(resolved)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(mounts: &str) -> Spec {
        let json = format!(r#"{{"ociVersion":"1.0.2","mounts":{mounts}}}"#);
        serde_json::from_str(&json).unwrap()
    }

    #[test]
    fn finds_a_readonly_cgroup_mount() {
        let s = spec(
            r#"[{"destination":"/proc","type":"proc","source":"proc"},
                {"destination":"/sys/fs/cgroup","type":"cgroup","source":"cgroup","options":["nosuid","ro"]}]"#,
        );
        assert_eq!(
            readonly_cgroup_mount(&s),
            Some(PathBuf::from("/sys/fs/cgroup"))
        );
    }

    #[test]
    fn leaves_a_read_write_cgroup_mount_alone() {
        let s = spec(
            r#"[{"destination":"/sys/fs/cgroup","type":"cgroup","source":"cgroup","options":["rw"]}]"#,
        );
        assert_eq!(readonly_cgroup_mount(&s), None);
        let s =
            spec(r#"[{"destination":"/sys","type":"sysfs","source":"sysfs","options":["ro"]}]"#);
        assert_eq!(readonly_cgroup_mount(&s), None);
    }
}
