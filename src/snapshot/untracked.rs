//! Listing a workspace's untracked paths as `git ls-files --others --exclude-standard` would,
//! without git ever looking at the workspace.
//!
//! Owns [`list`]: a breadth-first walk of the workspace from its directory descriptor
//! ([`beneath::Dir`]: every directory opened beneath it with `openat2(RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)` and listed from its own descriptor), deciding
//! as git does what is an untracked candidate: a regular file or symlink the index does not
//! hold, a directory the index holds nothing under (entered unless ignored, or listed as `dir/`
//! when it holds a repository of its own), never an entry named `.git`, nothing below a gitlink
//! of the index, no fifo, socket or device. Empty directories give nothing, as in git.
//!
//! Which names are ignored stays git's decision, made from copies: every `.gitignore` the walk
//! meets is read beneath the workspace's descriptor (a regular file only, opened `O_NONBLOCK`,
//! at most git's own 100 MiB) into a private mirror of the directories that matter ([`Mirror`]),
//! and a hardened `git check-ignore --no-index --stdin -z -v -n` ([`crate::git`]) with
//! that mirror as its work tree answers for each level of the walk (the store's `info/exclude`
//! and the user's global excludes apply, as they always did).
//!
//! Also owns what the walk saw, for the snapshot to hold its reads to ([`Listing::saw`],
//! [`Listing::verify_unchanged`]): the type of every tracked and untracked path in the
//! directories it listed, and each listed directory's identity and times.
//!
//! Must never: follow a symlink or `..` below the workspace; open anything there but
//! directories and, as regular files with a bounded read, a `.gitignore`, a `.git` file or a
//! nested `.git/HEAD`; hand git a workspace path to read (git sees only the mirror); or enter a
//! directory the index holds as a gitlink.

use std::collections::{HashMap, HashSet};
use std::ffi::CString;
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use super::{mode, IndexEntry, SnapshotError};
use crate::beneath;
use crate::git::Git;

/// The most of a `.gitignore` git reads (its `PATTERN_MAX_FILE_SIZE`): git ignores a bigger
/// one, so it is not copied.
const GITIGNORE_MAX: u64 = 100 << 20;

/// The most of a `.git` file git reads (its gitfile limit): a bigger one is not a gitfile.
const GITFILE_MAX: u64 = 1 << 20;

/// How much of a nested `.git/HEAD` (or `.git` file) is looked at: git reads 255 bytes of HEAD.
const PEEK: u64 = 255;

/// What the index says about paths, as the walk asks it.
pub(super) struct Index<'a> {
    /// Every path the index holds.
    tracked: HashSet<&'a [u8]>,
    /// Every directory above one of them.
    dirs: HashSet<&'a [u8]>,
    /// The entries that are gitlinks.
    gitlinks: HashSet<&'a [u8]>,
}

impl<'a> Index<'a> {
    /// The index of `entries`.
    pub(super) fn new(entries: &'a [IndexEntry]) -> Self {
        let mut idx = Index {
            tracked: HashSet::with_capacity(entries.len()),
            dirs: HashSet::new(),
            gitlinks: HashSet::new(),
        };
        for e in entries {
            idx.tracked.insert(&e.path);
            if e.mode == mode::GITLINK {
                idx.gitlinks.insert(&e.path);
            }
            // Longest directory first: once one is known, every shorter one is too.
            for (i, b) in e.path.iter().enumerate().rev() {
                if *b == b'/' && !idx.dirs.insert(&e.path[..i]) {
                    break;
                }
            }
        }
        idx
    }
}

/// What the walk saw at a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Saw {
    /// A directory above it could not be listed (named as unreadable): nothing is known.
    Unknown,
    /// A directory above it was missing, or not a directory, when the walk passed.
    Unreachable,
    /// Its directory was listed, without it.
    Absent,
    /// Its directory was listed with it in it, of this type (`S_IFMT` bits).
    Kind(u32),
}

impl Saw {
    /// For a message.
    pub(super) fn describe(self) -> String {
        match self {
            Saw::Unknown => "not known".into(),
            Saw::Unreachable => "beyond something that was not a directory".into(),
            Saw::Absent => "not there".into(),
            Saw::Kind(fmt) => format!("a {}", crate::bounded::kind_of(fmt)),
        }
    }
}

/// A directory's identity and times when it was listed: any entry added, removed or renamed in
/// it since moves its mtime and ctime.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Stamp {
    fn of(st: &libc::stat) -> Self {
        Stamp {
            dev: st.st_dev,
            ino: st.st_ino,
            mtime: (st.st_mtime, st.st_mtime_nsec),
            ctime: (st.st_ctime, st.st_ctime_nsec),
        }
    }
}

/// What [`list`] found.
#[derive(Debug, Default)]
pub(super) struct Listing {
    /// The untracked paths, sorted bytewise as git sorts them; a directory holding a repository
    /// of its own ends in `/`.
    pub(super) untracked: Vec<Vec<u8>>,
    /// Directories that could not be opened or listed (not for a change of the tree: for a
    /// permission, say), with why: what is below them was not seen, and must be named.
    pub(super) unlistable: Vec<(Vec<u8>, io::Error)>,
    listed: HashSet<Vec<u8>>,
    kinds: HashMap<Vec<u8>, u32>,
    stamps: Vec<(Vec<u8>, Stamp)>,
}

impl Listing {
    /// What the walk saw at `path` (a tracked path, or one of [`Listing::untracked`]).
    pub(super) fn saw(&self, path: &[u8]) -> Saw {
        if self.listed.contains(parent_of(path)) {
            return self.kinds.get(path).map_or(Saw::Absent, |k| Saw::Kind(*k));
        }
        if self.unlistable.iter().any(|(d, _)| under(path, d)) {
            Saw::Unknown
        } else {
            Saw::Unreachable
        }
    }

    /// Every directory the walk listed is still the same directory, untouched since: opened
    /// again beneath `root` (no symlink followed), its device, inode, mtime and ctime as they
    /// were. A directory something renamed, added to or removed from while the snapshot was
    /// read refuses it, named.
    pub(super) fn verify_unchanged(&self, root: &beneath::Dir) -> Result<(), SnapshotError> {
        for (rel, stamp) in &self.stamps {
            match root.subdir(rel).and_then(|d| d.stat()) {
                Ok(now) if Stamp::of(&now.stat) == *stamp => {}
                Ok(_) => {
                    return Err(changed(
                        rel,
                        "a directory whose entries were added, removed or renamed while h5i read the tree",
                    ))
                }
                Err(e) => {
                    return Err(changed(
                        rel,
                        &format!("a directory h5i listed, and could not open again ({e})"),
                    ))
                }
            }
        }
        Ok(())
    }
}

/// The refusal for a tree that changed under a read.
pub(super) fn changed(path: &[u8], what: &str) -> SnapshotError {
    SnapshotError::Changed {
        path: if path.is_empty() {
            ".".to_string()
        } else {
            crate::escape::bytes(path)
        },
        what: what.to_string(),
    }
}

fn parent_of(path: &[u8]) -> &[u8] {
    let path = path.strip_suffix(b"/").unwrap_or(path);
    match path.iter().rposition(|b| *b == b'/') {
        Some(i) => &path[..i],
        None => &path[..0],
    }
}

/// Whether `path` lies below the directory `dir` (`""` is the root).
fn under(path: &[u8], dir: &[u8]) -> bool {
    dir.is_empty() || (path.starts_with(dir) && path.get(dir.len()) == Some(&b'/'))
}

fn join(dir: &[u8], name: &[u8]) -> Vec<u8> {
    let mut p = Vec::with_capacity(dir.len() + 1 + name.len());
    if !dir.is_empty() {
        p.extend_from_slice(dir);
        p.push(b'/');
    }
    p.extend_from_slice(name);
    p
}

/// An error that says the thing was not there (or not a directory) when opened: the tree
/// changed between the listing that showed it and the open.
fn is_gone(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::NotFound
        || matches!(e.raw_os_error(), Some(libc::ELOOP) | Some(libc::ENOTDIR))
}

/// List the untracked paths beneath `root` (see the module doc). `skipped` paths are neither
/// entered nor listed. `scratch` is the snapshot's private scratch (where the mirror of ignore
/// rules goes on a host without `/dev/shm`); `store` is the host-controlled git directory whose
/// `info/exclude` applies.
pub(super) fn list(
    root: &beneath::Dir,
    index: &Index<'_>,
    skipped: &dyn Fn(&[u8]) -> bool,
    store: &Path,
    scratch: &Path,
) -> Result<Listing, SnapshotError> {
    let mut copies = Mirror::create(scratch)?;
    let mut listing = Listing::default();
    let mut level: Vec<Vec<u8>> = vec![Vec::new()];
    while !level.is_empty() {
        let mut asks: Vec<(Vec<u8>, u32)> = Vec::new();
        let mut next: Vec<Vec<u8>> = Vec::new();
        for rel in level {
            let listed = root.subdir(&rel).and_then(|dir| {
                let stamp = Stamp::of(&dir.stat()?.stat);
                let (entries, _) = dir.typed_entries(usize::MAX)?;
                Ok((dir, stamp, entries))
            });
            let (dir, stamp, entries) =
                match listed {
                    Ok(l) => l,
                    Err(source) if rel.is_empty() => {
                        return Err(SnapshotError::Workspace {
                            path: ".".into(),
                            source,
                        })
                    }
                    Err(e) if is_gone(&e) => return Err(changed(
                        &rel,
                        "a directory when its parent was listed, and not one when h5i opened it",
                    )),
                    Err(e) => {
                        listing.unlistable.push((rel, e));
                        continue;
                    }
                };
            for (name, fmt) in entries {
                if name == b".git" {
                    continue;
                }
                let path = join(&rel, &name);
                if index.tracked.contains(path.as_slice()) {
                    listing.kinds.insert(path.clone(), fmt);
                }
                if name == b".gitignore" && fmt == libc::S_IFREG {
                    copies.copy_gitignore(&dir, &path)?;
                }
                if skipped(&path) {
                    continue;
                }
                match fmt {
                    libc::S_IFDIR if index.gitlinks.contains(path.as_slice()) => {}
                    libc::S_IFDIR if index.dirs.contains(path.as_slice()) => next.push(path),
                    libc::S_IFDIR => {
                        copies.mkdir(&path)?;
                        asks.push((path, fmt));
                    }
                    libc::S_IFREG | libc::S_IFLNK if !index.tracked.contains(path.as_slice()) => {
                        asks.push((path, fmt));
                    }
                    _ => {}
                }
            }
            listing.listed.insert(rel.clone());
            listing.stamps.push((rel, stamp));
        }
        let ignored = Ignores {
            store,
            mirror: copies.path(),
        }
        .ignored(&asks)?;
        for ((path, fmt), ignored) in asks.into_iter().zip(ignored) {
            if ignored {
                continue;
            }
            listing.kinds.insert(path.clone(), fmt);
            if fmt != libc::S_IFDIR {
                listing.untracked.push(path);
                continue;
            }
            match root.subdir(&path) {
                Ok(sub) if holds_repository(root, &path, &sub) => {
                    let mut p = path;
                    p.push(b'/');
                    listing.untracked.push(p);
                }
                Ok(_) => next.push(path),
                Err(e) if is_gone(&e) => {
                    return Err(changed(
                        &path,
                        "a directory when its parent was listed, and not one when h5i opened it",
                    ))
                }
                Err(e) => listing.unlistable.push((path, e)),
            }
        }
        level = next;
    }
    listing.untracked.sort();
    Ok(listing)
}

/// Whether the directory `rel` (open as `dir`) holds a repository of its own, which git would
/// record as a gitlink (`is_nonbare_repository_dir`), decided from descriptors beneath `root`
/// with bounded reads:
///
/// - `.git` a directory: its `HEAD` a symlink into `refs/`, or a regular file naming a ref
///   (`ref: refs/...`) or an object id, and a `refs` entry. (git asks for `objects` too, but
///   never under a snapshot's `GIT_OBJECT_DIRECTORY`, so the answer h5i always gave is kept.)
/// - `.git` a regular file `gitdir: PATH` naming such a directory beneath the workspace (as
///   git, which checks the directory it names; a path outside the workspace is never looked
///   at, so it names no repository here, as it names none to git when nothing is there), or a
///   `.git` file that cannot be opened (git too counts that as a repository).
/// - `.git` a symlink (git would follow it; h5i does not, and keeps what is below out).
fn holds_repository(root: &beneath::Dir, rel: &[u8], dir: &beneath::Dir) -> bool {
    let Ok(dotgit) = dir.stat_at(b".git") else {
        return false;
    };
    if dotgit.is_symlink() {
        return true;
    }
    if dotgit.is_file() {
        if dotgit.size > GITFILE_MAX {
            return false;
        }
        let Some(text) = peek(dir, b".git") else {
            return true;
        };
        let Some(target) = trim_newlines(&text).strip_prefix(b"gitdir: ") else {
            return false;
        };
        return beneath_target(rel, target)
            .and_then(|t| root.subdir(&t).ok())
            .is_some_and(|g| is_git_dir(&g));
    }
    if !dotgit.is_dir() {
        return false;
    }
    dir.subdir(b".git").map_or(true, |g| is_git_dir(&g))
}

/// A `.git` directory as git's `is_git_directory` sees one (`objects` aside: see above).
fn is_git_dir(git: &beneath::Dir) -> bool {
    let refs = git
        .stat_at(b"refs")
        .is_ok_and(|r| r.is_dir() || r.is_symlink());
    refs && valid_head(git)
}

/// `target`, relative to the directory `rel`, as a plain path beneath the workspace root; `None`
/// when it is absolute, empty, or climbs out.
fn beneath_target(rel: &[u8], target: &[u8]) -> Option<Vec<u8>> {
    if target.is_empty() || target.starts_with(b"/") {
        return None;
    }
    let mut parts: Vec<&[u8]> = rel
        .split(|b| *b == b'/')
        .filter(|p| !p.is_empty())
        .collect();
    for part in target.split(|b| *b == b'/') {
        match part {
            b"" | b"." => {}
            b".." => {
                parts.pop()?;
            }
            p => parts.push(p),
        }
    }
    (!parts.is_empty()).then(|| parts.join(&b'/'))
}

/// git's `validate_headref`, from the `.git` directory's descriptor.
fn valid_head(git: &beneath::Dir) -> bool {
    let Ok(head) = git.stat_at(b"HEAD") else {
        return false;
    };
    if head.is_symlink() {
        return git
            .readlink_at(b"HEAD")
            .is_ok_and(|t| t.starts_with(b"refs/"));
    }
    if !head.is_file() {
        return false;
    }
    let Some(text) = peek(git, b"HEAD") else {
        return false;
    };
    if let Some(rest) = text.strip_prefix(b"ref:") {
        let rest = rest.trim_ascii_start();
        if rest.starts_with(b"refs/") {
            return true;
        }
    }
    let hex = text.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    hex >= 40
}

/// The first [`PEEK`] bytes of the regular file `name` of `dir` (`None` when it is not one, or
/// cannot be read).
fn peek(dir: &beneath::Dir, name: &[u8]) -> Option<Vec<u8>> {
    let (file, _) = dir.open_file(name).ok()??;
    let mut out = Vec::new();
    file.take(PEEK).read_to_end(&mut out).ok()?;
    Some(out)
}

fn trim_newlines(b: &[u8]) -> &[u8] {
    let end = b
        .iter()
        .rposition(|c| *c != b'\n' && *c != b'\r')
        .map_or(0, |i| i + 1);
    &b[..end]
}

/// The mirror of the workspace's directories, holding copies of its `.gitignore` files: the
/// only tree git reads ignore rules from. It holds the directories git must see as directories
/// (each untracked directory it is asked about, each directory a `.gitignore` was copied into,
/// and their parents), nothing else, and lives only while the walk runs: in `/dev/shm` where
/// the host has it (a directory costs milliseconds to make and remove on a busy ext4, measured
/// on this project's CI host), else in the snapshot's scratch. Private (0700) either way.
struct Mirror {
    dir: tempfile::TempDir,
    fd: beneath::Dir,
    made: HashSet<Vec<u8>>,
}

impl Mirror {
    fn create(scratch: &Path) -> Result<Mirror, SnapshotError> {
        let in_scratch = || {
            tempfile::Builder::new()
                .prefix("ignore-rules-")
                .tempdir_in(scratch)
        };
        let shm = Path::new("/dev/shm");
        let dir = match shm.is_dir() {
            true => tempfile::Builder::new()
                .prefix("h5i-ignore-rules-")
                .tempdir_in(shm)
                .or_else(|_| in_scratch()),
            false => in_scratch(),
        }
        .map_err(|source| SnapshotError::Scratch {
            path: scratch.to_path_buf(),
            source,
        })?;
        let fd = beneath::Dir::open(dir.path()).map_err(|source| SnapshotError::Scratch {
            path: dir.path().to_path_buf(),
            source,
        })?;
        Ok(Mirror {
            fd,
            dir,
            made: HashSet::new(),
        })
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn scratch_error(rel: &[u8], source: io::Error) -> SnapshotError {
        SnapshotError::Scratch {
            path: Path::new("<ignore-rule mirror>").join(std::ffi::OsStr::from_bytes(rel)),
            source,
        }
    }

    /// The directory `rel` in the mirror, and every directory above it.
    fn mkdir(&mut self, rel: &[u8]) -> Result<(), SnapshotError> {
        if rel.is_empty() || self.made.contains(rel) {
            return Ok(());
        }
        self.mkdir(parent_of(rel))?;
        let c = CString::new(rel).map_err(|_| Self::scratch_error(rel, io::Error::other("NUL")))?;
        // Relative to the mirror's own descriptor.
        match rustix::fs::mkdirat(&self.fd, &c, rustix::fs::Mode::from_raw_mode(0o700)) {
            Ok(()) | Err(rustix::io::Errno::EXIST) => {}
            Err(e) => return Err(Self::scratch_error(rel, e.into())),
        }
        self.made.insert(rel.to_vec());
        Ok(())
    }

    /// Copy the `.gitignore` of the workspace directory `dir` to `rel` (its path) in the mirror:
    /// opened from `dir`'s descriptor as a regular file only, at most [`GITIGNORE_MAX`] bytes
    /// (git ignores a bigger one, so it is left out here too).
    fn copy_gitignore(&mut self, dir: &beneath::Dir, rel: &[u8]) -> Result<(), SnapshotError> {
        // Replaced since the listing by something that is not a regular file: git would not
        // read it either, and the directory's changed times refuse the snapshot later.
        let Ok(Some((from, st))) = dir.open_file(b".gitignore") else {
            return Ok(());
        };
        if st.size > GITIGNORE_MAX {
            return Ok(());
        }
        self.mkdir(parent_of(rel))?;
        let c = CString::new(rel).map_err(|_| Self::scratch_error(rel, io::Error::other("NUL")))?;
        // Relative to the mirror's descriptor; O_EXCL|O_NOFOLLOW make a fresh regular file of
        // h5i's own.
        use rustix::fs::OFlags;
        let fd = rustix::fs::openat(
            &self.fd,
            &c,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            rustix::fs::Mode::from_raw_mode(0o600),
        )
        .map_err(|e| Self::scratch_error(rel, e.into()))?;
        let mut to = std::fs::File::from(fd);
        io::copy(&mut from.take(GITIGNORE_MAX), &mut to)
            .map_err(|e| Self::scratch_error(rel, e))?;
        Ok(())
    }
}

/// Asks git, a level of the walk at a time, which paths its ignore rules ignore.
struct Ignores<'a> {
    store: &'a Path,
    mirror: &'a Path,
}

impl Ignores<'_> {
    /// Which of `asks` git ignores, in order: one `git check-ignore --no-index --stdin -z -v -n`
    /// over the mirror, its output buffered (`GIT_FLUSH=0`: one answer per path, read when it
    /// ends).
    fn ignored(&self, asks: &[(Vec<u8>, u32)]) -> Result<Vec<bool>, SnapshotError> {
        if asks.is_empty() {
            return Ok(Vec::new());
        }
        let git_failed = |source| SnapshotError::Git {
            step: "ask git which untracked paths are ignored",
            source,
            mend:
                "check that the box's scratch directory is writable by you and the disk has space",
        };
        let mut input = Vec::with_capacity(asks.iter().map(|(p, _)| p.len() + 3).sum());
        for (path, _) in asks {
            // `./` first: a name starting with `:` is never read as pathspec magic.
            input.extend_from_slice(b"./");
            input.extend_from_slice(path);
            input.push(0);
        }
        let out = Git::at(self.store)
            .work_tree(self.mirror)
            .env("GIT_FLUSH", "0")
            .args([
                "check-ignore",
                "--no-index",
                "--stdin",
                "-z",
                "--verbose",
                "--non-matching",
            ])
            // check-ignore exits 1 when it ignored nothing it was asked about.
            .answer(&input, &[1])
            .map_err(git_failed)?;
        // One record per path, `-z -v -n`: source, line, pattern, path; the first three empty
        // when no pattern matched.
        let mut fields = out.split(|b| *b == 0);
        let mut ignored = Vec::with_capacity(asks.len());
        for (path, _) in asks {
            let (Some(_), Some(_), Some(pattern), Some(echo)) =
                (fields.next(), fields.next(), fields.next(), fields.next())
            else {
                return Err(SnapshotError::Parse {
                    what: "check-ignore output that ends early",
                });
            };
            if echo.get(..2) != Some(b"./") || echo[2..] != path[..] {
                return Err(SnapshotError::Parse {
                    what: "check-ignore output for another path",
                });
            }
            // A negative pattern (`!x`) matched last: not ignored.
            ignored.push(pattern.first().is_some_and(|b| *b != b'!'));
        }
        Ok(ignored)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_index_knows_its_directories_and_gitlinks() {
        let e = |path: &str, mode: u32| IndexEntry {
            mode,
            sha: "a".repeat(40),
            path: path.as_bytes().to_vec(),
        };
        let entries = vec![
            e("a/b/c", mode::FILE),
            e("a/d", mode::FILE),
            e("sub", mode::GITLINK),
        ];
        let idx = Index::new(&entries);
        for d in ["a", "a/b"] {
            assert!(idx.dirs.contains(d.as_bytes()), "{d}");
        }
        assert!(!idx.dirs.contains(b"a/b/c".as_slice()));
        assert!(idx.gitlinks.contains(b"sub".as_slice()));
        assert!(idx.tracked.contains(b"a/d".as_slice()));
    }

    #[test]
    fn paths_split_as_git_paths() {
        assert_eq!(parent_of(b"a/b/c"), b"a/b");
        assert_eq!(parent_of(b"c"), b"");
        assert_eq!(parent_of(b"sub/"), b"");
        assert!(under(b"a/b", b"a"));
        assert!(!under(b"ab/c", b"a"));
        assert!(under(b"x", b""));
        assert_eq!(join(b"", b"x"), b"x");
        assert_eq!(join(b"a", b"x"), b"a/x");
    }

    /// Whether `root/r` holds a repository, as the walk asks.
    fn holds(root: &Path) -> bool {
        let top = beneath::Dir::open(root).unwrap();
        holds_repository(&top, b"r", &top.subdir(b"r").unwrap())
    }

    fn repo_dir(root: &Path, head: &[u8], refs: bool) -> bool {
        std::fs::create_dir_all(root.join("r/.git")).unwrap();
        std::fs::write(root.join("r/.git/HEAD"), head).unwrap();
        if refs {
            std::fs::create_dir_all(root.join("r/.git/refs")).unwrap();
        }
        holds(root)
    }

    #[test]
    fn a_nested_repository_is_told_as_git_tells_it_without_following_anything() {
        let d = tempfile::tempdir().unwrap();
        let t = |head: &[u8], refs: bool| {
            let root = tempfile::tempdir_in(d.path()).unwrap();
            repo_dir(root.path(), head, refs)
        };
        assert!(t(b"ref: refs/heads/main\n", true));
        assert!(t(b"ref:   refs/heads/x", true));
        assert!(t(
            "0123456789abcdef0123456789abcdef01234567\n".as_bytes(),
            true
        ));
        assert!(!t(b"ref: refs/heads/main\n", false), "no refs");
        assert!(!t(b"ref: heads/main\n", true), "not under refs/");
        assert!(!t(b"0123456789abcdef\n", true), "a short id");
        // HEAD a fifo: never opened (git would block on it), so no repository.
        let root = tempfile::tempdir_in(d.path()).unwrap();
        std::fs::create_dir_all(root.path().join("r/.git/refs")).unwrap();
        let fifo = CString::new(root.path().join("r/.git/HEAD").as_os_str().as_bytes()).unwrap();
        // SAFETY: fifo is a valid C string for the call.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        assert!(!holds(root.path()));
        // HEAD a symlink into refs/, as old git wrote it.
        let root = tempfile::tempdir_in(d.path()).unwrap();
        std::fs::create_dir_all(root.path().join("r/.git/refs")).unwrap();
        std::os::unix::fs::symlink("refs/heads/main", root.path().join("r/.git/HEAD")).unwrap();
        assert!(holds(root.path()));
        // Gitfiles: one naming a repository beneath the workspace makes one; one naming a path
        // outside (never looked at) or nothing does not.
        for (text, is) in [
            (&b"gitdir: ../m/.git\n"[..], true),
            (b"gitdir: ../m/../m/.git", true),
            (b"gitdir: ../elsewhere\n", false),
            (b"gitdir: ../../../etc", false),
            (b"gitdir: /nonexistent/x", false),
            (b"gitdir: \n", false),
            (b"not a gitfile", false),
        ] {
            let root = tempfile::tempdir_in(d.path()).unwrap();
            std::fs::create_dir_all(root.path().join("r")).unwrap();
            std::fs::create_dir_all(root.path().join("m/.git/refs")).unwrap();
            std::fs::write(root.path().join("m/.git/HEAD"), "ref: refs/heads/main\n").unwrap();
            std::fs::write(root.path().join("r/.git"), text).unwrap();
            assert_eq!(holds(root.path()), is, "{text:?}");
        }
        // `.git` a symlink: not followed; what is below stays out.
        let root = tempfile::tempdir_in(d.path()).unwrap();
        std::fs::create_dir_all(root.path().join("r")).unwrap();
        std::os::unix::fs::symlink("/", root.path().join("r/.git")).unwrap();
        assert!(holds(root.path()));
        // No `.git` at all.
        let root = tempfile::tempdir_in(d.path()).unwrap();
        std::fs::create_dir_all(root.path().join("r/.gitx")).unwrap();
        assert!(!holds(root.path()));
    }
}
