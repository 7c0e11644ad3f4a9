//! The bounded reader: the only way host verbs read bytes a box controls outside a snapshot.
//!
//! Owns three operations. [`read_beneath`] reads one small file below a directory the host
//! trusts, walking every component with `openat(O_NOFOLLOW)` from a directory fd, refusing
//! anything that is not a regular file (checked by `fstat` on the opened fd, opened
//! `O_NONBLOCK` so a fifo cannot stall it) and anything over its cap; [`open_regular`] does the
//! same for one file the caller will stream; [`scan_tree`] walks a workspace from directory fds
//! without following a symlink, reading no file's bytes, and names what host verbs must know:
//! set-id files, fifos/sockets/devices, and the files git itself would read whole (`.gitignore`,
//! `.gitattributes`, `.gitmodules`) when one of them is not a plain file under the cap.
//! Every refusal is a [`Skip`] the verb names in its output; nothing is dropped silently.
//!
//! Must never: follow a symlink below the root it was given, block on a fifo, read more than its
//! cap, or read a file's bytes while scanning. Guarded by the unit tests below and
//! `tests/hostile_reads.rs`.

use std::ffi::{CString, OsStr};
use std::fmt;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path};

/// Why a path was not read.
#[derive(Debug)]
pub enum Skip {
    /// Nothing is there.
    Missing,
    /// A symbolic link, where a file (or a directory on the way) was expected.
    Symlink,
    /// Not a regular file: `fifo`, `socket`, `character device`, `block device`, `directory`.
    NotRegular(&'static str),
    /// A regular file over the cap.
    TooLarge {
        /// Its size, bytes.
        size: u64,
        /// The cap, bytes.
        cap: u64,
    },
    /// Replaced by something else between the look and the open.
    Swapped,
    /// The OS refused.
    Unreadable(io::Error),
}

impl fmt::Display for Skip {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Skip::Missing => write!(f, "missing"),
            Skip::Symlink => write!(f, "a symbolic link (never followed)"),
            Skip::NotRegular(kind) => write!(f, "a {kind}, not a regular file (never opened)"),
            Skip::TooLarge { size, cap } => {
                write!(f, "{} bytes, over the {} byte cap (never read)", size, cap)
            }
            Skip::Swapped => write!(f, "replaced while it was being opened (not read)"),
            Skip::Unreadable(e) => write!(f, "unreadable: {e}"),
        }
    }
}

/// The kind of a file, from its `st_mode`.
pub fn kind_of(mode: u32) -> &'static str {
    match mode & libc::S_IFMT {
        libc::S_IFREG => "regular file",
        libc::S_IFDIR => "directory",
        libc::S_IFLNK => "symbolic link",
        libc::S_IFIFO => "fifo",
        libc::S_IFSOCK => "socket",
        libc::S_IFCHR => "character device",
        libc::S_IFBLK => "block device",
        _ => "file of unknown type",
    }
}

fn cstr(s: &OsStr) -> io::Result<CString> {
    CString::new(s.as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in a path"))
}

fn openat(dir: BorrowedFd<'_>, name: &OsStr, flags: libc::c_int) -> io::Result<OwnedFd> {
    // O_NOFOLLOW, O_CLOEXEC and O_NOCTTY are always added: no symlink is followed and no fd
    // leaks.
    h5i_sys::fs::open_at_nofollow(dir, &cstr(name)?, flags)
}

fn fstat(fd: BorrowedFd<'_>) -> io::Result<libc::stat> {
    h5i_sys::fs::stat_of(fd)
}

fn lstat_at(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<libc::stat> {
    // AT_SYMLINK_NOFOLLOW: a link is stat'ed itself.
    h5i_sys::fs::lstat_at(dir, &cstr(name)?)
}

fn skip_of(e: io::Error) -> Skip {
    match e.raw_os_error() {
        Some(libc::ENOENT) => Skip::Missing,
        Some(libc::ELOOP) => Skip::Symlink,
        Some(libc::ENOTDIR) => Skip::NotRegular("file where a directory was expected"),
        Some(libc::ENXIO) => Skip::NotRegular("socket"),
        _ => Skip::Unreadable(e),
    }
}

fn plain_parts(rel: &Path) -> Result<Vec<&OsStr>, Skip> {
    rel.components()
        .map(|c| match c {
            Component::Normal(n) => Ok(n),
            _ => Err(Skip::Unreadable(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the path must be relative and plain",
            ))),
        })
        .collect()
}

fn open_root(root: &Path) -> Result<OwnedFd, Skip> {
    let c = cstr(root.as_os_str()).map_err(Skip::Unreadable)?;
    // The root is a directory the host chose.
    h5i_sys::fs::open_dir(&c).map_err(skip_of)
}

/// Open `root/rel` for reading: every component below `root` walked with `O_NOFOLLOW`, the last
/// one a regular file (by `fstat` of what was opened, the open itself `O_NONBLOCK`) of at most
/// `cap` bytes. Returns the file and its size.
pub fn open_regular(root: &Path, rel: &Path, cap: u64) -> Result<(File, u64), Skip> {
    let parts = plain_parts(rel)?;
    let Some((last, dirs)) = parts.split_last() else {
        return Err(Skip::NotRegular("directory"));
    };
    let mut dir = open_root(root)?;
    for d in dirs {
        dir = match openat(dir.as_fd(), d, libc::O_RDONLY | libc::O_DIRECTORY) {
            Ok(next) => next,
            // Name what stands where a directory should: O_NOFOLLOW|O_DIRECTORY says only
            // ENOTDIR for a symlink.
            Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => {
                return Err(match lstat_at(dir.as_fd(), d) {
                    Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFLNK => Skip::Symlink,
                    Ok(st) => Skip::NotRegular(kind_of(st.st_mode)),
                    Err(e) => skip_of(e),
                })
            }
            Err(e) => return Err(skip_of(e)),
        };
    }
    // Refuse a special file before opening it: opening a device can act on it.
    let seen = lstat_at(dir.as_fd(), last).map_err(skip_of)?;
    if seen.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(match seen.st_mode & libc::S_IFMT {
            libc::S_IFLNK => Skip::Symlink,
            m => Skip::NotRegular(kind_of(m)),
        });
    }
    let fd = openat(dir.as_fd(), last, libc::O_RDONLY | libc::O_NONBLOCK).map_err(skip_of)?;
    let st = fstat(fd.as_fd()).map_err(Skip::Unreadable)?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG
        || st.st_ino != seen.st_ino
        || st.st_dev != seen.st_dev
    {
        return Err(Skip::Swapped);
    }
    let size = u64::try_from(st.st_size).unwrap_or(0);
    if size > cap {
        return Err(Skip::TooLarge { size, cap });
    }
    Ok((File::from(fd), size))
}

/// Read `root/rel` whole, as [`open_regular`] opens it; a file that grows past `cap` while it is
/// read is refused too.
pub fn read_beneath(root: &Path, rel: &Path, cap: u64) -> Result<Vec<u8>, Skip> {
    let (f, size) = open_regular(root, rel, cap)?;
    let mut out = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
    f.take(cap.saturating_add(1))
        .read_to_end(&mut out)
        .map_err(Skip::Unreadable)?;
    let got = out.len() as u64;
    if got > cap {
        return Err(Skip::TooLarge { size: got, cap });
    }
    Ok(out)
}

/// Most entries [`scan_tree`] looks at before it stops (and says so).
pub const SCAN_MAX_ENTRIES: usize = 1_000_000;
/// Deepest directory [`scan_tree`] descends into before it stops there (and says so).
pub const SCAN_MAX_DEPTH: usize = 256;
/// Files git reads whole from a work tree it looks at: each must be a plain file under the cap,
/// or git would block on it (a fifo) or read it into memory (a sparse giant).
const GIT_READS: &[&[u8]] = &[b".gitignore", b".gitattributes", b".gitmodules"];

/// What [`scan_tree`] found at one path.
#[derive(Debug)]
pub enum Finding {
    /// A non-directory with the set-user-id or set-group-id bit: on the host, it runs as its
    /// owner for whoever can reach it.
    SetId {
        /// Its full `st_mode` permission bits.
        mode: u32,
    },
    /// A fifo, socket or device: never opened by a host verb.
    Special(&'static str),
    /// A file git would read whole that is not a plain file under the cap.
    GitReads(Skip),
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Finding::SetId { mode } => write!(f, "set-id file (mode {:04o})", mode & 0o7777),
            Finding::Special(kind) => write!(f, "a {kind} (never opened)"),
            Finding::GitReads(skip) => write!(f, "a file git reads, but {skip}"),
        }
    }
}

/// One finding and where (relative to the scanned root).
#[derive(Debug)]
pub struct Found {
    /// The path, relative to the root, as bytes.
    pub path: Vec<u8>,
    /// What is there.
    pub what: Finding,
}

/// What a scan of a tree found.
#[derive(Debug, Default)]
pub struct TreeScan {
    /// Every finding, in walk order.
    pub found: Vec<Found>,
    /// Entries looked at.
    pub entries: usize,
    /// Where and why the walk stopped early, if it did: what lies beyond was not checked.
    pub stopped: Vec<String>,
}

impl TreeScan {
    /// The set-id findings.
    pub fn setid(&self) -> impl Iterator<Item = &Found> {
        self.found
            .iter()
            .filter(|f| matches!(f.what, Finding::SetId { .. }))
    }

    /// The findings that stop git from reading the tree safely.
    pub fn blocks_git(&self) -> impl Iterator<Item = &Found> {
        self.found
            .iter()
            .filter(|f| matches!(f.what, Finding::GitReads(_)))
    }

    /// One line per finding and per early stop, escaped for a terminal.
    pub fn lines(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .found
            .iter()
            .map(|f| format!("{}: {}", crate::escape::bytes(&f.path), f.what))
            .collect();
        out.extend(
            self.stopped
                .iter()
                .map(|s| crate::escape::escape_controls(s)),
        );
        out
    }
}

/// Walk the tree at `root` from directory fds, never following a symlink and never reading a
/// file's bytes, and report set-id files, special files, and files git reads that are not plain
/// files of at most `cap` bytes. Bounded by [`SCAN_MAX_ENTRIES`] and [`SCAN_MAX_DEPTH`].
pub fn scan_tree(root: &Path, cap: u64) -> Result<TreeScan, Skip> {
    let dir = crate::beneath::Dir::open(root).map_err(skip_of)?;
    let mut scan = TreeScan::default();
    let mut rel = Vec::new();
    scan_dir(&dir, &mut rel, 0, false, cap, &mut scan);
    Ok(scan)
}

fn scan_dir(
    dir: &crate::beneath::Dir,
    rel: &mut Vec<u8>,
    depth: usize,
    in_git: bool,
    cap: u64,
    scan: &mut TreeScan,
) {
    let shown = |rel: &[u8]| {
        if rel.is_empty() {
            ".".to_string()
        } else {
            String::from_utf8_lossy(rel).into_owned()
        }
    };
    if depth >= SCAN_MAX_DEPTH {
        scan.stopped.push(format!(
            "{}: deeper than {SCAN_MAX_DEPTH} directories, not checked",
            shown(rel)
        ));
        return;
    }
    // The directory is listed through its own fd, so a rename above it cannot redirect the walk.
    let budget = SCAN_MAX_ENTRIES.saturating_sub(scan.entries);
    if budget == 0 && scan.stopped.iter().any(|l| l.starts_with("stopped after")) {
        return;
    }
    let (names, more) = match dir.entries(budget) {
        Ok(e) => e,
        Err(e) => {
            scan.stopped.push(format!(
                "{}: could not be listed ({e}), not checked",
                shown(rel)
            ));
            return;
        }
    };
    scan.entries += names.len();
    if more {
        scan.stopped.push(format!(
            "stopped after {SCAN_MAX_ENTRIES} entries: the rest of the tree was not checked"
        ));
    }
    for name in names {
        let keep = rel.len();
        if !rel.is_empty() {
            rel.push(b'/');
        }
        rel.extend_from_slice(&name);
        match dir.stat_at(&name) {
            Ok(st) => {
                let fmt = st.mode & libc::S_IFMT;
                let git_reads = !in_git && GIT_READS.contains(&name.as_slice());
                if fmt != libc::S_IFDIR && st.mode & 0o6000 != 0 {
                    scan.found.push(Found {
                        path: rel.clone(),
                        what: Finding::SetId { mode: st.mode },
                    });
                }
                match fmt {
                    libc::S_IFDIR => {
                        if git_reads {
                            scan.found.push(Found {
                                path: rel.clone(),
                                what: Finding::GitReads(Skip::NotRegular("directory")),
                            });
                        }
                        // Opened beneath this directory's descriptor with no symlink followed:
                        // one swapped in since the lstat is refused, not walked through.
                        match dir.subdir(&name) {
                            Ok(sub) => {
                                scan_dir(&sub, rel, depth + 1, in_git || name == b".git", cap, scan)
                            }
                            Err(e) => scan.stopped.push(format!(
                                "{}: could not be opened ({e}), not checked",
                                shown(rel)
                            )),
                        }
                    }
                    libc::S_IFREG | libc::S_IFLNK => {
                        if git_reads && fmt == libc::S_IFREG && st.size > cap {
                            scan.found.push(Found {
                                path: rel.clone(),
                                what: Finding::GitReads(Skip::TooLarge { size: st.size, cap }),
                            });
                        }
                    }
                    other => {
                        let what = if git_reads {
                            Finding::GitReads(Skip::NotRegular(kind_of(other)))
                        } else {
                            Finding::Special(kind_of(other))
                        };
                        scan.found.push(Found {
                            path: rel.clone(),
                            what,
                        });
                    }
                }
            }
            Err(e) => scan
                .stopped
                .push(format!("{}: could not be looked at ({e})", shown(rel))),
        }
        rel.truncate(keep);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn mkfifo(p: &Path) {
        let c = CString::new(p.as_os_str().as_bytes()).unwrap();
        // SAFETY: c is a valid path string.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    }

    #[test]
    fn reads_a_small_regular_file_beneath() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("a/b")).unwrap();
        std::fs::write(d.path().join("a/b/f"), b"hi").unwrap();
        assert_eq!(
            read_beneath(d.path(), Path::new("a/b/f"), 2).unwrap(),
            b"hi"
        );
        assert!(matches!(
            read_beneath(d.path(), Path::new("a/b/f"), 1),
            Err(Skip::TooLarge { size: 2, cap: 1 })
        ));
        assert!(matches!(
            read_beneath(d.path(), Path::new("a/nope"), 9),
            Err(Skip::Missing)
        ));
    }

    #[test]
    fn refuses_dev_zero_symlinks_fifos_and_directory_symlinks_without_blocking() {
        let d = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("/dev/zero", d.path().join("zero")).unwrap();
        mkfifo(&d.path().join("fifo"));
        std::os::unix::fs::symlink("/etc", d.path().join("etc")).unwrap();
        assert!(matches!(
            read_beneath(d.path(), Path::new("zero"), 1 << 20),
            Err(Skip::Symlink)
        ));
        assert!(matches!(
            read_beneath(d.path(), Path::new("fifo"), 1 << 20),
            Err(Skip::NotRegular("fifo"))
        ));
        assert!(matches!(
            read_beneath(d.path(), Path::new("etc/hostname"), 1 << 20),
            Err(Skip::Symlink)
        ));
    }

    #[test]
    fn scan_names_setid_special_and_git_read_files_without_following_links() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path();
        std::fs::create_dir_all(root.join("sub/.git")).unwrap();
        std::fs::write(root.join("sub/s"), b"x").unwrap();
        std::fs::set_permissions(root.join("sub/s"), std::fs::Permissions::from_mode(0o4755))
            .unwrap();
        mkfifo(&root.join("p"));
        mkfifo(&root.join("sub/.gitignore"));
        mkfifo(&root.join("sub/.git/.gitignore"));
        let big = std::fs::File::create(root.join(".gitattributes")).unwrap();
        big.set_len(10).unwrap();
        std::os::unix::fs::symlink("/", root.join("up")).unwrap();
        let scan = scan_tree(root, 5).unwrap();
        let shown: Vec<String> = scan.lines();
        let has = |s: &str| shown.iter().any(|l| l == s);
        assert!(has("sub/s: set-id file (mode 4755)"), "{shown:?}");
        assert!(has("p: a fifo (never opened)"), "{shown:?}");
        assert!(
            has("sub/.gitignore: a file git reads, but a fifo, not a regular file (never opened)"),
            "{shown:?}"
        );
        // Inside a .git, ignore files are no business of git's: a plain special file.
        assert!(
            has("sub/.git/.gitignore: a fifo (never opened)"),
            "{shown:?}"
        );
        assert!(
            has(".gitattributes: a file git reads, but 10 bytes, over the 5 byte cap (never read)"),
            "{shown:?}"
        );
        assert_eq!(scan.blocks_git().count(), 2);
        assert_eq!(scan.setid().count(), 1);
        // The symlink to / was not followed: far fewer entries than the host has.
        assert!(scan.entries < 20, "{}", scan.entries);
    }
}
