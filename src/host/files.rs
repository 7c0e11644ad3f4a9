//! Writing a host file only when it differs, atomically, with the mode and owner asked for.
//!
//! Must never: leave a half-written file (write a sibling, then rename), or rewrite a file whose
//! bytes, mode and owner are already right (setup is idempotent and says what it changed).

use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use super::HostError;

/// Who a written file belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner {
    /// uid.
    pub uid: u32,
    /// gid.
    pub gid: u32,
}

impl Owner {
    /// root:root.
    pub const ROOT: Owner = Owner { uid: 0, gid: 0 };
}

/// Make `path` hold exactly `content` with `mode` and `owner`; true when something changed.
/// Missing parent directories are made 0755 with the same owner.
pub fn write_if_differs(
    path: &Path,
    content: &[u8],
    mode: u32,
    owner: Owner,
) -> Result<bool, HostError> {
    if let Ok(meta) = std::fs::metadata(path) {
        let same = std::fs::read(path).is_ok_and(|old| old == content)
            && meta.mode() & 0o7777 == mode
            && (meta.uid(), meta.gid()) == (owner.uid, owner.gid);
        if same {
            return Ok(false);
        }
    }
    if let Some(dir) = path.parent() {
        ensure_dir(dir, 0o755, owner)?;
    }
    let tmp = path.with_extension("h5i-tmp");
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(content)?;
        f.set_permissions(std::fs::Permissions::from_mode(mode))?;
        std::os::unix::fs::chown(&tmp, Some(owner.uid), Some(owner.gid))?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        HostError::io("write", path)(e)
    })?;
    Ok(true)
}

/// Make `dir` (and missing parents) exist; a directory made here gets `mode` and `owner`.
pub fn ensure_dir(dir: &Path, mode: u32, owner: Owner) -> Result<bool, HostError> {
    if dir.is_dir() {
        return Ok(false);
    }
    if let Some(parent) = dir.parent() {
        ensure_dir(parent, 0o755, Owner::ROOT)?;
    }
    std::fs::create_dir(dir).map_err(HostError::io("create", dir))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))
        .map_err(HostError::io("chmod", dir))?;
    std::os::unix::fs::chown(dir, Some(owner.uid), Some(owner.gid))
        .map_err(HostError::io("chown", dir))?;
    Ok(true)
}

/// Make `path` a directory with exactly `mode` and `owner`; true when something changed.
pub fn ensure_private_dir(path: &Path, mode: u32, owner: Owner) -> Result<bool, HostError> {
    let made = ensure_dir(path, mode, owner)?;
    let meta = std::fs::metadata(path).map_err(HostError::io("stat", path))?;
    let mut changed = made;
    if (meta.uid(), meta.gid()) != (owner.uid, owner.gid) {
        std::os::unix::fs::chown(path, Some(owner.uid), Some(owner.gid))
            .map_err(HostError::io("chown", path))?;
        changed = true;
    }
    if meta.mode() & 0o7777 != mode {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
            .map_err(HostError::io("chmod", path))?;
        changed = true;
    }
    Ok(changed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn me() -> Owner {
        // SAFETY: getuid/getgid have no preconditions.
        unsafe {
            Owner {
                uid: libc::getuid(),
                gid: libc::getgid(),
            }
        }
    }

    #[test]
    fn a_second_write_of_the_same_bytes_changes_nothing() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("etc/x.conf");
        assert!(write_if_differs(&p, b"a\n", 0o644, me()).unwrap());
        assert!(!write_if_differs(&p, b"a\n", 0o644, me()).unwrap());
        assert!(write_if_differs(&p, b"b\n", 0o644, me()).unwrap());
        assert!(write_if_differs(&p, b"b\n", 0o600, me()).unwrap());
        assert_eq!(std::fs::read(&p).unwrap(), b"b\n");
        assert!(!p.with_extension("h5i-tmp").exists());
    }

    #[test]
    fn a_private_dir_gets_its_mode_back() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("run/user/1000");
        assert!(ensure_private_dir(&p, 0o700, me()).unwrap());
        assert!(!ensure_private_dir(&p, 0o700, me()).unwrap());
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(ensure_private_dir(&p, 0o700, me()).unwrap());
        assert_eq!(std::fs::metadata(&p).unwrap().mode() & 0o777, 0o700);
    }
}
