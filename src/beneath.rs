//! Reading and writing inside a tree a box controls, without following anything the box planted.
//!
//! Owns two things. Writing: walk `root/rel` one component at a time with `openat(O_NOFOLLOW |
//! O_DIRECTORY)`, then write the file through a temporary name and `renameat` it into place
//! ([`write_file`]). Reading: [`Dir`], a directory held open, beneath which every path is
//! resolved with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)` (a
//! per-component `O_NOFOLLOW` walk where the kernel has no `openat2`), and a file is read only
//! after `fstat` on the open descriptor says it is a regular file; a directory is listed from
//! its own descriptor ([`Dir::entries`]), never by path.
//! A symlink anywhere on the path is refused. Must never: resolve a path through a symlink,
//! read or write outside `root`, open a fifo or device for reading, or trust a check made
//! before the open.

use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path};

use rustix::fs::{AtFlags, Mode, OFlags, ResolveFlags};

fn cstr(s: &OsStr) -> io::Result<CString> {
    CString::new(s.as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in path"))
}

/// The open flags a caller passed (`libc::O_*`), as rustix takes them, close-on-exec always.
fn oflags(flags: libc::c_int) -> OFlags {
    OFlags::from_bits_retain(flags as u32) | OFlags::CLOEXEC
}

fn open_dir_at(dir: BorrowedFd<'_>, name: &std::ffi::OsStr) -> io::Result<OwnedFd> {
    let c = cstr(name)?;
    Ok(rustix::fs::openat(
        dir,
        &c,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
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
    // The root itself is h5i's own directory.
    let mut dir = rustix::fs::open(
        &cstr(root.as_os_str())?,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    for d in dirs {
        dir = open_dir_at(dir.as_fd(), d)?;
    }
    let tmp = cstr(std::ffi::OsStr::new(&format!(
        ".h5i-tmp-{}",
        std::process::id()
    )))?;
    let target = cstr(file)?;
    // O_EXCL|O_NOFOLLOW make a fresh regular file only.
    let f = rustix::fs::openat(
        &dir,
        &tmp,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o644),
    )?;
    let mut out = std::fs::File::from(f);
    let written = io::Write::write_all(&mut out, bytes).and_then(|_| out.sync_all());
    if let Err(e) = written {
        let _ = rustix::fs::unlinkat(&dir, &tmp, AtFlags::empty());
        return Err(e);
    }
    if let Err(e) = rustix::fs::renameat(&dir, &tmp, &dir, &target) {
        let _ = rustix::fs::unlinkat(&dir, &tmp, AtFlags::empty());
        return Err(e.into());
    }
    Ok(())
}

/// A directory of a tree a box controls, held open: every read beneath it is resolved relative
/// to this descriptor, with no symlink followed anywhere on the way (not a planted one, not a
/// `..`, not a `/proc` magic link), so a rename inside the tree between two reads can never
/// steer a read outside it.
#[derive(Debug)]
pub struct Dir {
    fd: OwnedFd,
}

/// The held directory's descriptor, for a caller that makes entries of its own beneath a
/// directory h5i owns (never for reading a box's tree: use the methods, which follow nothing).
impl std::os::fd::AsRawFd for Dir {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.fd.as_raw_fd()
    }
}

/// The same descriptor, borrowed (for `h5i_sys` and rustix calls relative to it).
impl std::os::fd::AsFd for Dir {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// One name of a directory and its type: `S_IFMT` bits from [`Dir::typed_entries`] (the raw
/// `d_type` inside the listing).
pub type Entry<T = u32> = (Vec<u8>, T);

/// What [`Dir::stat_at`] found at a path.
#[derive(Debug, Clone, Copy)]
pub struct Found {
    /// `st_mode` (type and permission bits).
    pub mode: u32,
    /// Size in bytes.
    pub size: u64,
    /// Device and inode, to tell a swapped file from the one looked at.
    pub dev_ino: (u64, u64),
    /// The raw `stat`, for callers that key a cache on all of it.
    pub stat: libc::stat,
}

impl Found {
    fn kind(&self) -> u32 {
        self.mode & libc::S_IFMT
    }

    /// A regular file.
    pub fn is_file(&self) -> bool {
        self.kind() == libc::S_IFREG
    }

    /// A symbolic link.
    pub fn is_symlink(&self) -> bool {
        self.kind() == libc::S_IFLNK
    }

    /// A directory.
    pub fn is_dir(&self) -> bool {
        self.kind() == libc::S_IFDIR
    }

    /// Set-user-id or set-group-id on a regular file: a file the host would run with its
    /// owner's identity.
    pub fn is_setid_file(&self) -> bool {
        self.is_file() && self.mode & (libc::S_ISUID | libc::S_ISGID) != 0
    }

    /// What a non-file, non-link, non-directory is, for messages.
    pub fn special_kind(&self) -> &'static str {
        match self.kind() {
            libc::S_IFIFO => "fifo",
            libc::S_IFSOCK => "socket",
            libc::S_IFCHR | libc::S_IFBLK => "device",
            _ => "special file",
        }
    }
}

fn fstat(fd: BorrowedFd<'_>) -> io::Result<libc::stat> {
    h5i_sys::fs::stat_of(fd)
}

fn found(st: libc::stat) -> Found {
    Found {
        mode: st.st_mode,
        size: st.st_size as u64,
        dev_ino: (st.st_dev, st.st_ino),
        stat: st,
    }
}

/// Whether the kernel lacks `openat2` (answered once per process).
fn openat2_missing() -> &'static std::sync::atomic::AtomicBool {
    static MISSING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    &MISSING
}

/// `openat2(dir, rel, flags, RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)`.
fn openat2_beneath(dir: BorrowedFd<'_>, rel: &CString, flags: libc::c_int) -> io::Result<OwnedFd> {
    let resolve = ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
    loop {
        match rustix::fs::openat2(dir, rel, oflags(flags), Mode::empty(), resolve) {
            // openat2 with RESOLVE_BENEATH answers EAGAIN when a concurrent rename may have
            // moved something across the root during resolution: retry, as the man page says.
            Err(rustix::io::Errno::AGAIN) => continue,
            other => return Ok(other?),
        }
    }
}

/// The fallback where `openat2` is missing: one `openat(O_NOFOLLOW)` per component, each
/// directory opened `O_PATH | O_DIRECTORY` from the one before.
fn walk_nofollow(dir: BorrowedFd<'_>, parts: &[&[u8]], flags: libc::c_int) -> io::Result<OwnedFd> {
    let Some((last, dirs)) = parts.split_last() else {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty path"));
    };
    let mut held: Option<OwnedFd> = None;
    for d in dirs {
        let at = held.as_ref().map_or(dir, |f| f.as_fd());
        held = Some(openat_nofollow(
            at,
            d,
            libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW,
        )?);
    }
    let at = held.as_ref().map_or(dir, |f| f.as_fd());
    openat_nofollow(at, last, flags | libc::O_NOFOLLOW)
}

/// `openat(dir, name, flags | O_CLOEXEC)`; every caller's flags carry `O_NOFOLLOW`.
fn openat_nofollow(dir: BorrowedFd<'_>, name: &[u8], flags: libc::c_int) -> io::Result<OwnedFd> {
    let c = cstr(OsStr::from_bytes(name))?;
    Ok(rustix::fs::openat(dir, &c, oflags(flags), Mode::empty())?)
}

/// Split a relative path into plain components, refusing `.`, `..`, empty components and a
/// leading `/` (no caller has a reason to send one).
fn plain_parts(rel: &[u8]) -> io::Result<Vec<&[u8]>> {
    let parts: Vec<&[u8]> = rel.split(|b| *b == b'/').collect();
    if parts
        .iter()
        .any(|p| p.is_empty() || *p == b"." || *p == b"..")
    {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "path must be relative and plain",
        ));
    }
    Ok(parts)
}

impl Dir {
    /// Hold `path` open as the root of every read. `path` is h5i's own (a box's workspace under
    /// the store): its last component is not followed if it is a symlink.
    pub fn open(path: &Path) -> io::Result<Dir> {
        let fd = rustix::fs::open(
            &cstr(path.as_os_str())?,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(Dir { fd })
    }

    /// The root directory of process `pid`, as its mount namespace shows it, held open through
    /// the host's `/proc/PID/root` (a magic link h5i follows on purpose: it is the kernel's, not
    /// the box's). Everything beneath it is then resolved with no symlink followed, so a link
    /// the box planted can never lead a host verb back out to the host's own tree.
    pub fn root_of(pid: i32) -> io::Result<Dir> {
        let fd = rustix::fs::open(
            format!("/proc/{pid}/root"),
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(Dir { fd })
    }

    /// Open `rel` beneath this directory with `flags`, following no symlink at any component
    /// (`ELOOP` when there is one, `ENOTDIR` when a parent is not a directory).
    pub fn open_at(&self, rel: &[u8], flags: libc::c_int) -> io::Result<OwnedFd> {
        let parts = plain_parts(rel)?;
        let missing = openat2_missing();
        if !missing.load(std::sync::atomic::Ordering::Relaxed) {
            let c = cstr(OsStr::from_bytes(rel))?;
            match openat2_beneath(self.fd.as_fd(), &c, flags) {
                Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => {
                    missing.store(true, std::sync::atomic::Ordering::Relaxed);
                }
                other => return other,
            }
        }
        walk_nofollow(self.fd.as_fd(), &parts, flags)
    }

    /// The directory `rel` beneath this one, held open (no symlink followed on the way).
    pub fn subdir(&self, rel: &[u8]) -> io::Result<Dir> {
        if rel.is_empty() {
            return Ok(Dir {
                fd: self.fd.try_clone()?,
            });
        }
        Ok(Dir {
            fd: self.open_at(rel, libc::O_PATH | libc::O_DIRECTORY)?,
        })
    }

    /// `fstatat(name, AT_SYMLINK_NOFOLLOW)` of one entry of this directory.
    pub fn stat_at(&self, name: &[u8]) -> io::Result<Found> {
        single(name)?;
        let c = cstr(OsStr::from_bytes(name))?;
        Ok(found(h5i_sys::fs::lstat_at(&self.fd, &c)?))
    }

    /// The target of the symlink `name` in this directory.
    pub fn readlink_at(&self, name: &[u8]) -> io::Result<Vec<u8>> {
        single(name)?;
        let c = cstr(OsStr::from_bytes(name))?;
        Ok(rustix::fs::readlinkat(&self.fd, &c, Vec::new())?.into_bytes())
    }

    /// Open the regular file `name` of this directory for reading: `O_NOFOLLOW | O_NONBLOCK`,
    /// then `fstat` on the open descriptor (a fifo, device, directory or symlink swapped in is
    /// never read). `None` when what was opened is not a regular file. The caller streams it,
    /// trusting the size `fstat` gave, never the one a look before the open gave.
    pub fn open_file(&self, name: &[u8]) -> io::Result<Option<(std::fs::File, Found)>> {
        single(name)?;
        let fd = match openat_nofollow(
            self.fd.as_fd(),
            name,
            libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY,
        ) {
            Ok(fd) => fd,
            Err(e) if matches!(e.raw_os_error(), Some(libc::ELOOP) | Some(libc::ENXIO)) => {
                return Ok(None)
            }
            Err(e) => return Err(e),
        };
        let st = found(fstat(fd.as_fd())?);
        if !st.is_file() {
            return Ok(None);
        }
        Ok(Some((std::fs::File::from(fd), st)))
    }

    /// The names in this directory (not `.` or `..`), listed from this descriptor (a rename of
    /// the directory, or of anything above it, cannot redirect the listing), at most `limit` of
    /// them; the `bool` says whether there were more.
    pub fn entries(&self, limit: usize) -> io::Result<(Vec<Vec<u8>>, bool)> {
        let (listed, more) = self.read_dir(limit)?;
        Ok((listed.into_iter().map(|(name, _)| name).collect(), more))
    }

    /// [`Dir::entries`], each name with its type as the listing gave it (`S_IFDIR`,
    /// `S_IFREG`, ...; `fstatat` without following, from this descriptor, where the file system
    /// does not say). The type is what was there when the directory was listed, no more: a
    /// reader still checks what it opens.
    pub fn typed_entries(&self, limit: usize) -> io::Result<(Vec<Entry>, bool)> {
        let (listed, more) = self.read_dir(limit)?;
        let mut typed = Vec::with_capacity(listed.len());
        for (name, d_type) in listed {
            let fmt = match d_type {
                libc::DT_DIR => libc::S_IFDIR,
                libc::DT_REG => libc::S_IFREG,
                libc::DT_LNK => libc::S_IFLNK,
                libc::DT_FIFO => libc::S_IFIFO,
                libc::DT_SOCK => libc::S_IFSOCK,
                libc::DT_CHR => libc::S_IFCHR,
                libc::DT_BLK => libc::S_IFBLK,
                _ => match self.stat_at(&name) {
                    Ok(st) => st.mode & libc::S_IFMT,
                    // Gone since the listing: it is not there to be typed.
                    Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(e),
                },
            };
            typed.push((name, fmt));
        }
        Ok((typed, more))
    }

    /// `getdents` from this descriptor: each name with its `d_type`, at most `limit` of them.
    fn read_dir(&self, limit: usize) -> io::Result<(Vec<Entry<u8>>, bool)> {
        // A readable descriptor of this very directory: `.` beneath an O_PATH descriptor.
        let fd = openat_nofollow(
            self.fd.as_fd(),
            b".",
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
        )?;
        let mut names = Vec::new();
        for entry in rustix::fs::Dir::new(fd)? {
            let entry = entry?;
            let name = entry.file_name().to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            if names.len() >= limit {
                return Ok((names, true));
            }
            names.push((name.to_vec(), d_type(entry.file_type())));
        }
        Ok((names, false))
    }

    /// `fstat` of this directory itself, from its descriptor.
    pub fn stat(&self) -> io::Result<Found> {
        fstat(self.fd.as_fd()).map(found)
    }
}

/// A listing's file type as `readdir`'s `d_type` (`DT_UNKNOWN` where the file system did not
/// say).
fn d_type(kind: rustix::fs::FileType) -> u8 {
    use rustix::fs::FileType;
    match kind {
        FileType::Directory => libc::DT_DIR,
        FileType::RegularFile => libc::DT_REG,
        FileType::Symlink => libc::DT_LNK,
        FileType::Fifo => libc::DT_FIFO,
        FileType::Socket => libc::DT_SOCK,
        FileType::CharacterDevice => libc::DT_CHR,
        FileType::BlockDevice => libc::DT_BLK,
        _ => libc::DT_UNKNOWN,
    }
}

/// Refuse anything but one plain path component.
fn single(name: &[u8]) -> io::Result<()> {
    if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a single path component",
        ));
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

    #[test]
    fn reads_a_regular_file_beneath_plain_directories() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("a/b")).unwrap();
        std::fs::write(d.path().join("a/b/c"), b"bytes").unwrap();
        let root = Dir::open(d.path()).unwrap();
        let dir = root.subdir(b"a/b").unwrap();
        assert!(dir.stat_at(b"c").unwrap().is_file());
        let (mut f, st) = dir.open_file(b"c").unwrap().unwrap();
        assert!(st.is_file());
        assert_eq!(st.size, 5);
        let mut b = Vec::new();
        io::Read::read_to_end(&mut f, &mut b).unwrap();
        assert_eq!(b, b"bytes");
    }

    #[test]
    fn a_directory_swapped_for_a_symlink_is_never_read_through() {
        let d = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("canary"), b"secret").unwrap();
        std::os::unix::fs::symlink(outside.path(), d.path().join("d")).unwrap();
        let root = Dir::open(d.path()).unwrap();
        let e = root.subdir(b"d").unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ELOOP), "{e}");
        let e = root.open_at(b"d/canary", libc::O_RDONLY).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ELOOP), "{e}");
        assert!(root.subdir(b"../x").is_err());
        // The fallback walk refuses the same way.
        let parts = plain_parts(b"d/canary").unwrap();
        let e = walk_nofollow(root.fd.as_fd(), &parts, libc::O_RDONLY).unwrap_err();
        assert!(
            matches!(e.raw_os_error(), Some(libc::ELOOP) | Some(libc::ENOTDIR)),
            "{e}"
        );
    }

    #[test]
    fn a_fifo_or_symlink_in_place_of_a_file_is_not_opened() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        let c = CString::new(p.as_os_str().as_bytes()).unwrap();
        // SAFETY: c is a valid C string for the call.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        std::os::unix::fs::symlink("/etc/hostname", d.path().join("l")).unwrap();
        let root = Dir::open(d.path()).unwrap();
        assert!(root.open_file(b"f").unwrap().is_none());
        assert!(root.open_file(b"l").unwrap().is_none());
        assert_eq!(root.stat_at(b"f").unwrap().special_kind(), "fifo");
        assert_eq!(root.readlink_at(b"l").unwrap(), b"/etc/hostname");
    }

    #[test]
    fn set_id_bits_on_a_file_are_seen() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("s");
        std::fs::write(&p, b"x").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o4755)).unwrap();
        let root = Dir::open(d.path()).unwrap();
        assert!(root.stat_at(b"s").unwrap().is_setid_file());
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o2755)).unwrap();
        assert!(root.stat_at(b"s").unwrap().is_setid_file());
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(!root.stat_at(b"s").unwrap().is_setid_file());
    }
}

/// Test support: the directory-swap race every walk of a box's tree is tested against.
#[cfg(test)]
pub(crate) mod swap_race {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    use std::path::Path;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    /// How many `d<i>`/`l<i>` pairs a swap race test makes: many pairs make the window between
    /// a listing and the reads that follow it wide.
    pub(crate) const SWAP_PAIRS: usize = 48;

    /// Exchange each `d<i>` with `l<i>` under `dir` with `renameat2(RENAME_EXCHANGE)`, pair after
    /// pair, until `stop`; returns how many exchanges succeeded.
    pub(crate) fn swapper(dir: &Path, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<u64> {
        let pairs: Vec<(CString, CString)> = (0..SWAP_PAIRS)
            .map(|i| {
                let name = |n: String| CString::new(dir.join(n).as_os_str().as_bytes()).unwrap();
                (name(format!("d{i}")), name(format!("l{i}")))
            })
            .collect();
        std::thread::spawn(move || {
            let mut swaps = 0;
            while !stop.load(Ordering::Relaxed) {
                for (a, b) in &pairs {
                    // SAFETY: a and b are valid C strings for the call.
                    let r = unsafe {
                        libc::syscall(
                            libc::SYS_renameat2,
                            libc::AT_FDCWD,
                            a.as_ptr(),
                            libc::AT_FDCWD,
                            b.as_ptr(),
                            libc::RENAME_EXCHANGE,
                        )
                    };
                    if r == 0 {
                        swaps += 1;
                    }
                }
            }
            swaps
        })
    }
}
