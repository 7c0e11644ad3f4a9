//! Walking a tree a refresh box wrote, on the host, beneath directory descriptors: the install
//! step is the box's (its package manager unpacks what the registry served), so every name in
//! the tree is hostile input.
//!
//! Owns [`check_links`] (before h5i takes the tree back: no file in it may be a hard link to an
//! inode outside it, which taking it back would chown and [`normalize_modes`] chmod) and
//! [`normalize_modes`] (directories 0755, files 0644 or 0755, set-id bits cleared). Each
//! directory is opened `O_DIRECTORY | O_NOFOLLOW` beneath the descriptor of its parent, each
//! other entry `O_PATH | O_NOFOLLOW`, and a mode is set on the opened descriptor (a file's
//! through its `/proc/self/fd` link, which names the opened inode and nothing else): a symlink
//! is never followed, and a name renamed or swapped for a symlink between the listing and the
//! open is either refused by `O_NOFOLLOW` or is the inode h5i then checks and changes.
//!
//! Must never: follow a symlink, chmod or chown an inode outside the tree, or use a path twice
//! (each step is relative to a descriptor h5i holds).
//!
//! Guarded by the unit tests below and `tests/box_cache.rs`.

use std::collections::HashMap;
use std::ffi::CStr;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fs::{FileType, Mode, OFlags};

use super::CacheError;
use crate::error::BoxError;

/// The open flags of a directory walked.
fn dir_flags() -> OFlags {
    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC
}

fn io_err(path: &Path, e: rustix::io::Errno) -> CacheError {
    BoxError::io(path, std::io::Error::from(e)).into()
}

/// One entry met in the walk: its descriptor (a directory's open for reading, anything else's
/// `O_PATH`), its file type and the path it is reported under.
struct Entry<'a> {
    fd: &'a OwnedFd,
    kind: FileType,
    stat: &'a rustix::fs::Stat,
    path: &'a Path,
}

/// Visit `root` and everything beneath it, never following a symlink (`root` itself must be a
/// directory, not a symlink to one).
fn walk(
    root: &Path,
    mut visit: impl FnMut(Entry<'_>) -> Result<(), CacheError>,
) -> Result<(), CacheError> {
    let top = rustix::fs::open(root, dir_flags(), Mode::empty()).map_err(|e| io_err(root, e))?;
    let stat = rustix::fs::fstat(&top).map_err(|e| io_err(root, e))?;
    visit(Entry {
        fd: &top,
        kind: FileType::Directory,
        stat: &stat,
        path: root,
    })?;
    let mut stack: Vec<(OwnedFd, PathBuf)> = vec![(top, root.to_path_buf())];
    while let Some((dir, path)) = stack.pop() {
        let mut names: Vec<std::ffi::CString> = Vec::new();
        let mut listing = rustix::fs::Dir::read_from(&dir).map_err(|e| io_err(&path, e))?;
        while let Some(entry) = listing.read() {
            let entry = entry.map_err(|e| io_err(&path, e))?;
            let name = entry.file_name();
            if name != c"." && name != c".." {
                names.push(name.to_owned());
            }
        }
        for name in names {
            let here = path.join(std::ffi::OsStr::from_bytes(name.to_bytes()));
            let fd = open_entry(&dir, &name).map_err(|e| io_err(&here, e))?;
            let stat = rustix::fs::fstat(&fd).map_err(|e| io_err(&here, e))?;
            let kind = FileType::from_raw_mode(stat.st_mode);
            visit(Entry {
                fd: &fd,
                kind,
                stat: &stat,
                path: &here,
            })?;
            if kind == FileType::Directory {
                stack.push((fd, here));
            }
        }
    }
    Ok(())
}

/// Open `name` beneath `dir` without following it: a directory for reading, anything else
/// (a symlink too) as an `O_PATH` descriptor of the entry itself.
fn open_entry(dir: &OwnedFd, name: &CStr) -> rustix::io::Result<OwnedFd> {
    let fd = rustix::fs::openat(
        dir,
        name,
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let stat = rustix::fs::fstat(&fd)?;
    if FileType::from_raw_mode(stat.st_mode) != FileType::Directory {
        return Ok(fd);
    }
    // Reopened through the descriptor just checked, so the directory read is that inode.
    let dir_fd = rustix::fs::openat(&fd, c".", dir_flags(), Mode::empty())?;
    Ok(dir_fd)
}

/// Refuse a tree in which any non-directory is a hard link to an inode with links outside the
/// tree (its link count is more than the links to it met here): taking the tree back would
/// change that outside file's owner and mode.
pub fn check_links(root: &Path) -> Result<(), CacheError> {
    // (dev, ino) -> (link count, links met, the first path met)
    let mut linked: HashMap<(u64, u64), (u64, u64, PathBuf)> = HashMap::new();
    walk(root, |e| {
        if e.kind != FileType::Directory && e.stat.st_nlink > 1 {
            let seen = linked
                .entry((e.stat.st_dev, e.stat.st_ino))
                .or_insert_with(|| (e.stat.st_nlink, 0, e.path.to_path_buf()));
            seen.1 += 1;
        }
        Ok(())
    })?;
    match linked.into_values().find(|(count, met, _)| met < count) {
        None => Ok(()),
        Some((count, met, path)) => Err(BoxError::BadRequest {
            what: format!(
                "the install step left {} linked to a file outside the cache ({count} links, {met} of them in it)",
                path.display()
            ),
            mend: "nothing was stored; check the project's dependencies and the registry, then refresh again".into(),
        }
        .into()),
    }
}

/// Directories 0755 and files 0644 (executables 0755), set-id bits cleared: readable by every
/// box identity, writable by none. Symlinks are left as they are and never followed; anything
/// else (a FIFO, a socket) gets 0644.
pub fn normalize_modes(root: &Path) -> Result<(), CacheError> {
    walk(root, |e| {
        let mode = match e.kind {
            FileType::Symlink => return Ok(()),
            FileType::Directory => 0o755,
            _ if e.stat.st_mode & 0o100 != 0 => 0o755,
            _ => 0o644,
        };
        let set = match e.kind {
            FileType::Directory => rustix::fs::fchmod(e.fd, Mode::from_raw_mode(mode)),
            // fchmod refuses an O_PATH descriptor: its /proc link names the opened inode.
            _ => rustix::fs::chmod(
                format!("/proc/self/fd/{}", e.fd.as_fd().as_raw_fd()).as_str(),
                Mode::from_raw_mode(mode),
            ),
        };
        set.map_err(|err| io_err(e.path, err))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
    }

    fn set(p: &Path, m: u32) {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
    }

    #[test]
    fn modes_are_set_beneath_the_tree_and_a_symlink_out_of_it_changes_nothing() {
        let t = tempfile::tempdir().unwrap();
        let outside = t.path().join("outside");
        std::fs::write(&outside, "secret").unwrap();
        set(&outside, 0o600);
        let outside_dir = t.path().join("outside-dir");
        std::fs::create_dir(&outside_dir).unwrap();
        set(&outside_dir, 0o700);
        let tree = t.path().join("tree");
        std::fs::create_dir_all(tree.join("sub")).unwrap();
        std::fs::write(tree.join("sub/file"), "x").unwrap();
        set(&tree.join("sub/file"), 0o4700);
        std::fs::write(tree.join("plain"), "x").unwrap();
        set(&tree.join("plain"), 0o600);
        std::os::unix::fs::symlink(&outside, tree.join("to-file")).unwrap();
        std::os::unix::fs::symlink(&outside_dir, tree.join("to-dir")).unwrap();
        set(&tree.join("sub"), 0o700);
        check_links(&tree).unwrap();
        normalize_modes(&tree).unwrap();
        assert_eq!(mode(&tree.join("sub")), 0o755);
        assert_eq!(mode(&tree.join("sub/file")), 0o755);
        assert_eq!(mode(&tree.join("plain")), 0o644);
        assert_eq!(mode(&outside), 0o600);
        assert_eq!(mode(&outside_dir), 0o700);
    }

    #[test]
    fn a_hard_link_to_a_file_outside_the_tree_is_refused_and_the_file_left_alone() {
        let t = tempfile::tempdir().unwrap();
        let outside = t.path().join("outside");
        std::fs::write(&outside, "secret").unwrap();
        set(&outside, 0o600);
        let tree = t.path().join("tree");
        std::fs::create_dir(&tree).unwrap();
        std::fs::hard_link(&outside, tree.join("planted")).unwrap();
        let err = check_links(&tree).unwrap_err().to_string();
        assert!(
            err.contains("planted") && err.contains("outside the cache"),
            "{err}"
        );
        assert_eq!(mode(&outside), 0o600);
        // Two links, both in the tree: taken as they are.
        std::fs::remove_file(tree.join("planted")).unwrap();
        std::fs::write(tree.join("a"), "x").unwrap();
        std::fs::hard_link(tree.join("a"), tree.join("b")).unwrap();
        check_links(&tree).unwrap();
    }

    #[test]
    fn a_root_that_is_a_symlink_is_not_followed() {
        let t = tempfile::tempdir().unwrap();
        let outside = t.path().join("outside-dir");
        std::fs::create_dir(&outside).unwrap();
        set(&outside, 0o700);
        let link = t.path().join("tree");
        std::os::unix::fs::symlink(&outside, &link).unwrap();
        assert!(normalize_modes(&link).is_err());
        assert!(check_links(&link).is_err());
        assert_eq!(mode(&outside), 0o700);
    }
}
