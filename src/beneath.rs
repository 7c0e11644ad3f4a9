//! Writing a file inside a tree a box controls, without following anything the box planted.
//!
//! Owns one operation: walk `root/rel` one component at a time with `openat(O_NOFOLLOW |
//! O_DIRECTORY)`, then write the file through a temporary name and `renameat` it into place.
//! A symlink anywhere on the path is refused. Must never: resolve a path through a symlink, or
//! write outside `root`.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path};

fn cstr(s: &std::ffi::OsStr) -> io::Result<CString> {
    CString::new(s.as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in path"))
}

fn open_dir_at(dirfd: libc::c_int, name: &std::ffi::OsStr) -> io::Result<OwnedFd> {
    let c = cstr(name)?;
    // SAFETY: c is a valid NUL-terminated string for the call; the flags refuse symlinks.
    let fd = unsafe {
        libc::openat(
            dirfd,
            c.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd was just returned by openat and is owned here.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Write `bytes` to `root/rel`, refusing a symlink at any component below `root`.
pub fn write_file(root: &Path, rel: &Path, bytes: &[u8]) -> io::Result<()> {
    let parts: Vec<&std::ffi::OsStr> = rel
        .components()
        .map(|c| match c {
            Component::Normal(n) => Ok(n),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "path must be relative and plain",
            )),
        })
        .collect::<io::Result<_>>()?;
    let Some((file, dirs)) = parts.split_last() else {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty path"));
    };
    let root_c = cstr(root.as_os_str())?;
    // SAFETY: root_c is a valid NUL-terminated string; the root itself is h5i's own directory.
    let fd = unsafe {
        libc::open(
            root_c.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd was just returned by open and is owned here.
    let mut dir = unsafe { OwnedFd::from_raw_fd(fd) };
    for d in dirs {
        dir = open_dir_at(dir.as_raw_fd(), d)?;
    }
    let tmp = cstr(std::ffi::OsStr::new(&format!(
        ".h5i-tmp-{}",
        std::process::id()
    )))?;
    let target = cstr(file)?;
    // SAFETY: tmp is a valid C string; O_EXCL|O_NOFOLLOW make a fresh regular file only.
    let f = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            tmp.as_ptr(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            0o644 as libc::c_uint,
        )
    };
    if f < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: f was just returned by openat and is owned by the File.
    let mut out = unsafe { std::fs::File::from_raw_fd(f) };
    let written = io::Write::write_all(&mut out, bytes).and_then(|_| out.sync_all());
    if let Err(e) = written {
        // SAFETY: unlinking the temporary name this function created, relative to dir.
        unsafe { libc::unlinkat(dir.as_raw_fd(), tmp.as_ptr(), 0) };
        return Err(e);
    }
    // SAFETY: both names are valid C strings relative to the same directory fd.
    let r = unsafe {
        libc::renameat(
            dir.as_raw_fd(),
            tmp.as_ptr(),
            dir.as_raw_fd(),
            target.as_ptr(),
        )
    };
    if r != 0 {
        let e = io::Error::last_os_error();
        // SAFETY: as above.
        unsafe { libc::unlinkat(dir.as_raw_fd(), tmp.as_ptr(), 0) };
        return Err(e);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_through_plain_directories() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("a/b")).unwrap();
        write_file(d.path(), Path::new("a/b/c"), b"hi").unwrap();
        assert_eq!(std::fs::read(d.path().join("a/b/c")).unwrap(), b"hi");
    }

    #[test]
    fn refuses_a_planted_directory_symlink() {
        let d = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path(), d.path().join("a")).unwrap();
        assert!(write_file(d.path(), Path::new("a/c"), b"x").is_err());
        assert!(!outside.path().join("c").exists());
    }

    #[test]
    fn replaces_a_planted_file_symlink_instead_of_following_it() {
        let d = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let victim = outside.path().join("victim");
        std::fs::write(&victim, b"keep").unwrap();
        std::os::unix::fs::symlink(&victim, d.path().join("c")).unwrap();
        write_file(d.path(), Path::new("c"), b"new").unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
        assert_eq!(std::fs::read(d.path().join("c")).unwrap(), b"new");
    }

    #[test]
    fn refuses_dotdot() {
        let d = tempfile::tempdir().unwrap();
        assert!(write_file(d.path(), Path::new("../x"), b"x").is_err());
    }
}
