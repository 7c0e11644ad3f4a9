//! What a Podman run from a test's own directory leaves behind when its containers are gone:
//! containers/storage's private mounts under that directory, and conmon's cgroup under the
//! `--cgroup-parent` the test gave it.

use std::path::{Path, PathBuf};

/// Unmount whatever containers/storage left mounted under `dir`, deepest first (before the
/// directory is removed).
pub fn unmount_under(dir: &Path) {
    let prefix = dir.to_string_lossy().into_owned();
    let mut mounts: Vec<PathBuf> = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().nth(4).map(PathBuf::from))
        .filter(|m| m.starts_with(&prefix))
        .collect();
    mounts.sort_by_key(|m| std::cmp::Reverse(m.components().count()));
    for m in mounts {
        let c = std::ffi::CString::new(m.to_string_lossy().as_bytes()).unwrap();
        // SAFETY: umount2 with a valid NUL-terminated path and MNT_DETACH.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    }
}

/// Remove `<parent>/conmon` and `parent` (relative to each hierarchy's root) where empty.
pub fn remove_cgroup_parent(parent: &str) {
    crate::cgroup::remove(&format!("{parent}/conmon"));
    crate::cgroup::remove(parent);
}
