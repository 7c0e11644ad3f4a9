//! A directory held open and worked in by name: open it without following a symlink, list
//! its names, open an entry without following one (and without blocking on a FIFO), remove an
//! entry, each relative to the held descriptor, so a path component swapped for a symlink
//! after the open changes nothing.
//!
//! For a directory another user may write (h5i-log's relay directory, which the engine user
//! owns and root's h5i drains). Must never: follow a symlink at the directory or at an entry,
//! block opening an entry, or hand out a descriptor without close-on-exec. Guarded by the unit
//! tests below and `tests/log.rs` (the hostile relay entries).

use std::ffi::OsString;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use rustix::fs::{AtFlags, FileType, Mode, OFlags};

/// What `fstat` says of an open file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Facts {
    /// Its owner.
    pub uid: u32,
    /// Its permission bits (`0o7777`).
    pub mode: u32,
    /// Its hard links.
    pub nlink: u64,
    /// A directory.
    pub is_dir: bool,
    /// A regular file.
    pub is_file: bool,
    /// Its size, bytes.
    pub size: u64,
}

/// `fstat(fd)`.
pub fn facts(fd: impl AsFd) -> io::Result<Facts> {
    let st = rustix::fs::fstat(fd)?;
    let kind = FileType::from_raw_mode(st.st_mode);
    Ok(Facts {
        uid: st.st_uid,
        mode: st.st_mode & 0o7777,
        nlink: st.st_nlink,
        is_dir: kind == FileType::Directory,
        is_file: kind == FileType::RegularFile,
        size: u64::try_from(st.st_size).unwrap_or(0),
    })
}

/// Open the directory `path` itself, refusing a symlink there (`ELOOP`/`ENOTDIR`).
pub fn open_dir(path: &Path) -> io::Result<OwnedFd> {
    Ok(rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// The names in `dir` (without `.` and `..`), at most `max` of them.
pub fn names(dir: BorrowedFd<'_>, max: usize) -> io::Result<Vec<OsString>> {
    let mut listing = rustix::fs::Dir::read_from(dir)?;
    let mut out = Vec::new();
    while out.len() < max {
        let Some(entry) = listing.read() else {
            break;
        };
        let name = entry?.file_name().to_bytes().to_vec();
        if name != b"." && name != b".." {
            out.push(OsString::from(std::ffi::OsStr::from_bytes(&name)));
        }
    }
    Ok(out)
}

/// Open `name` in `dir` for reading: never through a symlink (`ELOOP`), never waiting for a
/// FIFO's writer (`O_NONBLOCK`), never as a controlling terminal.
pub fn open_entry(dir: BorrowedFd<'_>, name: &std::ffi::OsStr) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// Remove the entry `name` of `dir` (not a directory; a symlink itself, never its target).
pub fn remove_entry(dir: BorrowedFd<'_>, name: &std::ffi::OsStr) -> io::Result<()> {
    Ok(rustix::fs::unlinkat(dir, name, AtFlags::empty())?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn a_symlinked_directory_or_entry_is_refused_and_a_fifo_opens_without_blocking() {
        let d = tempfile::tempdir().unwrap();
        let real = d.path().join("real");
        std::fs::create_dir(&real).unwrap();
        std::fs::write(real.join("a"), b"x").unwrap();
        std::os::unix::fs::symlink(&real, d.path().join("link")).unwrap();
        assert!(open_dir(&d.path().join("link")).is_err());
        let dir = open_dir(&real).unwrap();
        assert!(facts(&dir).unwrap().is_dir);
        std::os::unix::fs::symlink("/etc/hostname", real.join("s")).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            real.join("f"),
            FileType::Fifo,
            Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        let mut listed = names(dir.as_fd(), 10).unwrap();
        listed.sort();
        assert_eq!(listed, ["a", "f", "s"]);
        assert_eq!(names(dir.as_fd(), 1).unwrap().len(), 1);
        let e = open_entry(dir.as_fd(), "s".as_ref()).unwrap_err();
        assert_eq!(
            e.raw_os_error(),
            Some(rustix::io::Errno::LOOP.raw_os_error())
        );
        let f = open_entry(dir.as_fd(), "f".as_ref()).unwrap();
        assert!(!facts(&f).unwrap().is_file);
        let a = facts(open_entry(dir.as_fd(), "a".as_ref()).unwrap()).unwrap();
        assert!(a.is_file && a.nlink == 1 && a.size == 1);
        remove_entry(dir.as_fd(), "s".as_ref()).unwrap();
        assert!(std::fs::symlink_metadata(real.join("s")).is_err());
        assert!(std::path::Path::new("/etc/hostname").exists());
    }
}
