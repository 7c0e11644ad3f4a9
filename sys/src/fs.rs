//! Changing who owns an entry of a directory held by descriptor, never through a symlink: the
//! one `fchownat` h5i makes when it hands a box's tree (or a file it wrote into one) to the box's
//! owner; a fresh private directory under a fixed parent ([`private_temp_dir`]); a whole-file
//! advisory lock (`flock`) held by an open file; and the stat and open calls of the bounded
//! readers, which never follow a symlink under a held directory ([`stat_of`],
//! [`lstat_at`], [`open_at_nofollow`], [`open_dir`]), returning libc's `stat` as is (the
//! snapshot's stat cache keys on its fields).
//!
//! On rustix, without unsafe, but `mkdtemp`, which rustix does not wrap. Must never: follow a symlink (one the box planted is re-owned
//! itself, its target untouched), or resolve a name with a `/` in it (an entry is one name in
//! the directory the caller holds).

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsFd, OwnedFd};

use rustix::fs::{AtFlags, Gid, Uid};

/// Hand the entry `name` of the directory `dir` to `uid:gid` without following a symlink; an
/// empty `name` changes `dir` itself. A name with a `/` is refused (`EINVAL`).
pub fn chown_nofollow(dir: impl AsFd, name: &CStr, uid: u32, gid: u32) -> io::Result<()> {
    if name.to_bytes().contains(&b'/') {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let flags = if name.is_empty() {
        AtFlags::EMPTY_PATH
    } else {
        AtFlags::SYMLINK_NOFOLLOW
    };
    Ok(rustix::fs::chownat(
        dir,
        name,
        Some(Uid::from_raw(uid)),
        Some(Gid::from_raw(gid)),
        flags,
    )?)
}

/// Make a new directory `parent/PREFIXxxxxxx` (six random characters) with mode 0700, which
/// no other entry had (`mkdtemp`), and return its path. A path with a NUL byte is refused
/// (`InvalidInput`).
pub fn private_temp_dir(parent: &std::path::Path, prefix: &str) -> io::Result<std::path::PathBuf> {
    use std::os::unix::ffi::{OsStrExt, OsStringExt};
    let template = std::ffi::CString::new(
        parent
            .join(format!("{prefix}XXXXXX"))
            .as_os_str()
            .as_bytes(),
    )
    .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let mut raw = template.into_bytes_with_nul();
    // SAFETY: `raw` is a writable NUL-terminated template ending in XXXXXX; mkdtemp fills the
    // X's in place and creates the directory with mode 0700.
    if unsafe { libc::mkdtemp(raw.as_mut_ptr().cast()) }.is_null() {
        return Err(io::Error::last_os_error());
    }
    raw.pop();
    Ok(std::ffi::OsString::from_vec(raw).into())
}

/// Take the exclusive `flock` of the open file `file`, waiting for another holder to let go
/// (a wait a signal interrupts is resumed). Released by [`unlock`], or by the kernel when the
/// last descriptor of that open file closes.
pub fn lock_exclusive(file: impl AsFd) -> io::Result<()> {
    loop {
        match rustix::fs::flock(&file, rustix::fs::FlockOperation::LockExclusive) {
            Err(rustix::io::Errno::INTR) => continue,
            other => return Ok(other?),
        }
    }
}

/// Release the `flock` the open file `file` holds.
pub fn unlock(file: impl AsFd) -> io::Result<()> {
    Ok(rustix::fs::flock(file, rustix::fs::FlockOperation::Unlock)?)
}

/// libc's `stat`, as [`stat_of`] and [`lstat_at`] return it.
pub use libc::stat as Stat;

/// `fstat` of the open descriptor `fd`.
pub fn stat_of(fd: impl AsFd) -> io::Result<Stat> {
    use std::os::fd::AsRawFd;
    // SAFETY: an all-zero stat is a valid value to be overwritten.
    let mut st: Stat = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is open for the call and `st` is writable memory of the right size.
    if unsafe { libc::fstat(fd.as_fd().as_raw_fd(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

/// `fstatat` of the entry `name` of the directory `dir` without following a symlink (a link
/// is stat'ed itself).
pub fn lstat_at(dir: impl AsFd, name: &CStr) -> io::Result<Stat> {
    use std::os::fd::AsRawFd;
    // SAFETY: an all-zero stat is a valid value to be overwritten.
    let mut st: Stat = unsafe { std::mem::zeroed() };
    // SAFETY: `name` is NUL-terminated, `st` writable, `dir` open for the call.
    let rc = unsafe {
        libc::fstatat(
            dir.as_fd().as_raw_fd(),
            name.as_ptr(),
            &mut st,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

/// Open the entry `name` of the directory `dir` with `flags`, plus `O_NOFOLLOW`, `O_CLOEXEC`
/// and `O_NOCTTY` always: a symlink there is refused (`ELOOP`), the descriptor never leaks into
/// a child, and a terminal never becomes the caller's controlling one.
pub fn open_at_nofollow(dir: impl AsFd, name: &CStr, flags: i32) -> io::Result<OwnedFd> {
    use std::os::fd::{AsRawFd, FromRawFd};
    // SAFETY: `name` is NUL-terminated for the call; `dir` is open.
    let fd = unsafe {
        libc::openat(
            dir.as_fd().as_raw_fd(),
            name.as_ptr(),
            flags | libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NOCTTY,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by openat and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Open the directory at `path` (read-only, close-on-exec; `ENOTDIR` for anything else).
pub fn open_dir(path: &CStr) -> io::Result<OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: `path` is NUL-terminated for the call.
    let fd = unsafe {
        libc::open(
            path.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by open and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    /// Re-owning to the ids a file already has is allowed to anyone, so this runs unprivileged;
    /// as root it also moves a symlink (not its target) to another owner.
    /// Two open files of one path: while the first holds the lock the second cannot take it
    /// without waiting (LOCK_NB answers EWOULDBLOCK); after unlock it can.
    #[test]
    fn an_exclusive_lock_keeps_another_open_file_out_until_unlocked() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("lock");
        let a = std::fs::File::create(&path).unwrap();
        let b = std::fs::File::open(&path).unwrap();
        lock_exclusive(&a).unwrap();
        let try_b = || rustix::fs::flock(&b, rustix::fs::FlockOperation::NonBlockingLockExclusive);
        assert_eq!(try_b(), Err(rustix::io::Errno::WOULDBLOCK));
        unlock(&a).unwrap();
        try_b().unwrap();
    }

    /// Under a held directory: a file is opened and stat'ed (the same inode both ways), a
    /// symlink is stat'ed itself and refused when opened (ELOOP), a file is no directory.
    #[test]
    fn entries_are_opened_and_stated_without_following_a_symlink() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("f"), b"x").unwrap();
        std::os::unix::fs::symlink("f", d.path().join("l")).unwrap();
        let path = std::ffi::CString::new(d.path().as_os_str().as_encoded_bytes()).unwrap();
        let dir = open_dir(&path).unwrap();
        let f = open_at_nofollow(&dir, c"f", libc::O_RDONLY).unwrap();
        assert_eq!(
            stat_of(&f).unwrap().st_ino,
            lstat_at(&dir, c"f").unwrap().st_ino
        );
        assert_eq!(
            lstat_at(&dir, c"l").unwrap().st_mode & libc::S_IFMT,
            libc::S_IFLNK
        );
        assert_eq!(
            open_at_nofollow(&dir, c"l", libc::O_RDONLY)
                .unwrap_err()
                .raw_os_error(),
            Some(libc::ELOOP)
        );
        let file =
            std::ffi::CString::new(d.path().join("f").as_os_str().as_encoded_bytes()).unwrap();
        assert_eq!(
            open_dir(&file).unwrap_err().raw_os_error(),
            Some(libc::ENOTDIR)
        );
    }

    #[test]
    fn a_private_temp_dir_is_new_and_0700_and_a_nul_is_refused() {
        let parent = tempfile::tempdir().unwrap();
        let a = private_temp_dir(parent.path(), "h5i-t-").unwrap();
        let b = private_temp_dir(parent.path(), "h5i-t-").unwrap();
        assert_ne!(a, b);
        assert_eq!(a.parent(), Some(parent.path()));
        assert!(a
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("h5i-t-"));
        assert_eq!(std::fs::metadata(&a).unwrap().mode() & 0o777, 0o700);
        let err = private_temp_dir(parent.path(), "a\0b").unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn a_symlink_is_re_owned_itself_and_its_target_never() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("target"), b"x").unwrap();
        std::os::unix::fs::symlink(d.path().join("target"), d.path().join("link")).unwrap();
        let dir = std::fs::File::open(d.path()).unwrap();
        let me = (crate::ids::euid(), crate::ids::egid());
        chown_nofollow(&dir, c"", me.0, me.1).unwrap();
        let other = if me.0 == 0 { (4242, 4343) } else { me };
        chown_nofollow(&dir, c"link", other.0, other.1).unwrap();
        let link = std::fs::symlink_metadata(d.path().join("link")).unwrap();
        let target = std::fs::metadata(d.path().join("target")).unwrap();
        assert_eq!((link.uid(), link.gid()), other);
        assert_eq!((target.uid(), target.gid()), me);
        assert_eq!(
            chown_nofollow(&dir, c"a/b", me.0, me.1)
                .unwrap_err()
                .raw_os_error(),
            Some(libc::EINVAL)
        );
    }
}
