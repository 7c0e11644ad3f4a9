//! A snapshot of a box's workspace as a git index, built host-side in private scratch.
//!
//! Owns turning the files under a box's workspace into a temporary index over the pinned base:
//! `git read-tree <base>`, then every path git would take (the base's entries, and the untracked
//! paths, found by h5i's own walk of the workspace from its directory descriptor with git's
//! ignore rules decided by git from copies: [`untracked`]) is read here, beneath the workspace's
//! directory descriptor ([`beneath::Dir`]: `openat2` with no symlink followed, `fstat` after
//! open, regular files only) and hashed as it streams by, in bounded memory whatever its size
//! (the blob header's size is `fstat`'s, and a file that is not exactly that long when read is
//! refused); what differs from the base is copied, as it is hashed, into a spool file in the
//! snapshot's scratch, streamed from there into one pack (`git fast-import`, which streams
//! blobs over 1 MiB too), and the index written with `git update-index --index-info` from
//! those ids. git never reads a workspace file to list or stage it: what is staged is exactly
//! what h5i read and inspected. The result is what `git add -A` would stage (bytes as written: a
//! base `.gitattributes` asking for end-of-line conversion is not applied), in a handful of git
//! processes whatever the number of changed files. Then: the entries, the changes and the patch
//! against the base, the tree, exclusions (a path reset to its base entry), and handing the
//! scratch on as `box rebase`'s journal ([`Snapshot::keep_as`]).
//!
//! A snapshot is of one state of the tree or of none: every read must find what the listing
//! saw at its path (the same kind of thing, or nothing, or nothing reachable), a file must be
//! as long as `fstat` said all through its read, and every directory listed must be the same
//! directory with the same times once everything was read. Anything else means the tree
//! changed under the read, and the snapshot refuses ([`SnapshotError::Changed`]), naming the
//! path: a mix of two moments (a directory seen under one name and read under another, a file
//! listed and gone) never comes out as a diff that is silently empty or partial.
//!
//! Every object a snapshot makes (blobs, trees, and the commits a verb writes through
//! [`Snapshot::git_objects`]) goes into a private object directory that borrows the store's
//! objects as an alternate ([`SnapshotObjects::Scratch`]). Nothing lands in the parent until a
//! verb has validated the whole snapshot and calls [`Snapshot::publish_objects`] (`box apply`,
//! just before it moves the branch).
//!
//! Must never: run git with the box's own `.git` as `GIT_DIR` or read its index or config; let
//! git read a workspace path; follow a symlink the box planted when listing or reading, or act
//! on a check made before the open; stage what was read while the tree changed; read a
//! set-id file (it is refused, named); let box-written `.gitattributes` steer a host git
//! (attributes come from the pinned base, `GIT_ATTR_SOURCE`); add a nested repository as a
//! gitlink; write into the store's objects before [`Snapshot::publish_objects`]; or leave its
//! scratch behind (dropping a snapshot removes it; only [`Snapshot::keep_as`] hands it on).
//!
//! Guarded by the unit tests below and `tests/export_gate.rs`.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::beneath;
use crate::git::{Git, GitError};

mod untracked;

use untracked::Saw;

/// Where a snapshot writes the objects it creates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotObjects {
    /// Into `<scratch>/…/objects`, with the store's objects as an alternate: the parent is never
    /// written until [`Snapshot::publish_objects`]. The only place a snapshot writes: there is
    /// deliberately no variant that writes the store directly.
    Scratch,
}

/// A snapshot could not be taken or read.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// The base is not a full object id.
    #[error("refusing: base `{base}` is not a full commit id; to fix: the box manifest is damaged, check it with `h5i box doctor`")]
    BadBase {
        /// What was given.
        base: String,
    },
    /// The scratch directory could not be prepared or written.
    #[error("refusing: could not prepare snapshot scratch {path}: {source}; to fix: check that the box's scratch directory is writable by you and the disk has space")]
    Scratch {
        /// The path involved.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// A git step failed.
    #[error("refusing: could not {step} ({}); to fix: {mend}", describe(.source))]
    Git {
        /// What was being done.
        step: &'static str,
        /// The git failure.
        source: GitError,
        /// What to do about it.
        mend: &'static str,
    },
    /// git printed something this module cannot parse.
    #[error("refusing: git printed {what} that h5i cannot parse; to fix: report this as an h5i bug, with `git --version`")]
    Parse {
        /// Which output.
        what: &'static str,
    },
    /// A workspace file could not be read, and nobody was asked what to do about it.
    #[error("refusing: could not read {path} in the workspace: {source}; to fix: make it readable by you, or remove it from the box")]
    Workspace {
        /// The path, as text.
        path: String,
        /// The OS error.
        source: io::Error,
    },
    /// A set-id file in the workspace: the host would run it as its owner.
    #[error("refusing: {path} in the workspace is set-user-id or set-group-id (mode {mode:o}), which would run as its owner on the host; to fix: `chmod ug-s` it in the box (or remove it), then retry")]
    SetId {
        /// The path, as text.
        path: String,
        /// Its `st_mode`.
        mode: u32,
    },
    /// The tree changed while it was read: what was read is not one state of it.
    #[error("refusing: the workspace changed while h5i read it ({path}: {what}), so what was read is no one state of the tree; to fix: stop what writes in the box (`h5i box service stop` its services, let its runs and shells end), then retry")]
    Changed {
        /// The path, escaped.
        path: String,
        /// What was seen.
        what: String,
    },
    /// A file is not a regular file, symlink or directory, and nobody was asked about it.
    #[error("refusing: {path} in the workspace is a {kind}, which git cannot hold; to fix: remove it from the box")]
    Special {
        /// The path, as text.
        path: String,
        /// What it is.
        kind: &'static str,
    },
}

/// A git failure, without the `refusing:` its own message carries (this module adds its own).
fn describe(e: &GitError) -> String {
    match e {
        GitError::Spawn(io) => format!("git could not be started: {io}"),
        GitError::Failed { args, stderr } => format!("`git {args}` failed: {stderr}"),
        GitError::Input { args, source } => {
            format!("could not feed `git {args}` its input: {source}")
        }
    }
}

const MEND_BASE: &str = "check that the box's pinned base is still in its store (`h5i box doctor`)";
const MEND_SCRATCH: &str =
    "check that the box's scratch directory is writable by you and the disk has space";

/// What a snapshot tells its inspector about a path it is about to stage.
#[derive(Debug)]
pub enum Seen<'a> {
    /// A regular file whose bytes or mode differ from the base.
    File {
        /// Path relative to the workspace.
        path: &'a [u8],
        /// The blob id of `content`.
        sha: &'a str,
        /// Whether it is staged as 100755.
        executable: bool,
        /// Its bytes, as read (once) through `O_NOFOLLOW`.
        content: Content<'a>,
    },
    /// A symlink whose target differs from the base.
    Symlink {
        /// Path relative to the workspace.
        path: &'a [u8],
        /// The blob id of `target`.
        sha: &'a str,
        /// The link's target, as `readlink` returned it.
        target: &'a [u8],
    },
    /// A regular file over the size limit given to [`TakeOptions::max_file_size`]; never read.
    TooLarge {
        /// Path relative to the workspace.
        path: &'a [u8],
        /// Its size in bytes.
        size: u64,
    },
    /// Something git cannot hold (a fifo, socket or device) where git would look for a file.
    Special {
        /// Path relative to the workspace.
        path: &'a [u8],
        /// What it is.
        kind: &'static str,
    },
    /// A file that could not be read.
    Unreadable {
        /// Path relative to the workspace.
        path: &'a [u8],
        /// Why.
        error: &'a io::Error,
    },
    /// A directory holding its own repository, which `git add -A` would record as a gitlink.
    /// Never staged.
    NestedRepository {
        /// Path relative to the workspace (no trailing slash).
        path: &'a [u8],
    },
    /// A gitlink of the base whose path the box turned into something other than a directory.
    /// The base's gitlink is kept.
    GitlinkReplaced {
        /// Path relative to the workspace.
        path: &'a [u8],
    },
    /// A regular file with the set-user-id or set-group-id bit: never read, and never staged.
    SetId {
        /// Path relative to the workspace.
        path: &'a [u8],
        /// Its `st_mode`.
        mode: u32,
    },
}

/// The bytes of a changed file, as read once: in memory, or in a spool file of the snapshot's
/// scratch (a workspace file always is: nothing of its size is held in memory unless an
/// inspector asks for [`Content::bytes`]).
#[derive(Debug, Clone, Copy)]
pub enum Content<'a> {
    /// Bytes in memory.
    Bytes(&'a [u8]),
    /// `len` bytes at `offset` of `file`.
    Spooled {
        /// The spool file.
        file: &'a fs::File,
        /// Where the bytes start.
        offset: u64,
        /// How many there are.
        len: u64,
    },
}

impl Content<'_> {
    /// How many bytes there are.
    pub fn len(&self) -> u64 {
        match self {
            Content::Bytes(b) => b.len() as u64,
            Content::Spooled { len, .. } => *len,
        }
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// All of it at once, for an inspector that must see every byte together (a spooled file
    /// is read back whole: the caller's size cap bounds it).
    pub fn bytes(&self) -> io::Result<std::borrow::Cow<'_, [u8]>> {
        match self {
            Content::Bytes(b) => Ok(std::borrow::Cow::Borrowed(b)),
            Content::Spooled { file, offset, len } => {
                let mut out = vec![0u8; usize::try_from(*len).map_err(io::Error::other)?];
                std::os::unix::fs::FileExt::read_exact_at(*file, &mut out, *offset)?;
                Ok(std::borrow::Cow::Owned(out))
            }
        }
    }

    /// Copy it to `out` a chunk at a time.
    pub fn copy_to(&self, out: &mut dyn io::Write) -> io::Result<()> {
        match self {
            Content::Bytes(b) => out.write_all(b),
            Content::Spooled { file, offset, len } => {
                let mut buf = vec![0u8; STREAM_CHUNK.min(usize::try_from(*len).unwrap_or(0))];
                let mut done = 0u64;
                while done < *len {
                    let n = usize::try_from((*len - done).min(buf.len() as u64))
                        .map_err(io::Error::other)?;
                    std::os::unix::fs::FileExt::read_exact_at(*file, &mut buf[..n], offset + done)?;
                    out.write_all(&buf[..n])?;
                    done += n as u64;
                }
                Ok(())
            }
        }
    }
}

/// The inspector's answer for one path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Stage it.
    Keep,
    /// Leave the base's entry (or no entry) in place.
    Skip,
}

/// An inspector: told about every path a snapshot is about to stage.
pub type Inspector<'a> = &'a mut dyn FnMut(Seen<'_>) -> Verdict;

/// How to take a snapshot.
pub struct TakeOptions<'a> {
    objects: SnapshotObjects,
    skip: HashSet<Vec<u8>>,
    max_file_size: Option<u64>,
    inspect: Option<Inspector<'a>>,
}

impl<'a> TakeOptions<'a> {
    /// Stage everything git would, writing blobs as `objects` says.
    pub fn new(objects: SnapshotObjects) -> Self {
        TakeOptions {
            objects,
            skip: HashSet::new(),
            max_file_size: None,
            inspect: None,
        }
    }

    /// Keep these paths (and everything beneath them) at the base: never read, never staged.
    pub fn skip(mut self, paths: impl IntoIterator<Item = Vec<u8>>) -> Self {
        self.skip.extend(paths);
        self
    }

    /// Never read a file bigger than this; it is reported as [`Seen::TooLarge`] and kept at base.
    pub fn max_file_size(mut self, bytes: u64) -> Self {
        self.max_file_size = Some(bytes);
        self
    }

    /// Ask `inspect` about every path before it is staged.
    pub fn inspect(mut self, inspect: Inspector<'a>) -> Self {
        self.inspect = Some(inspect);
        self
    }
}

/// One index entry (`git ls-files -s`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexEntry {
    /// Git mode (`0o100644`, `0o100755`, `0o120000`, `0o160000`).
    pub mode: u32,
    /// Object id.
    pub sha: String,
    /// Path bytes, relative to the workspace.
    pub path: Vec<u8>,
}

/// One change of the snapshot against a tree (`git diff-index --cached --raw`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// Mode in the base (0 when added).
    pub old_mode: u32,
    /// Mode in the snapshot (0 when deleted).
    pub new_mode: u32,
    /// Object id in the base (all zeros when added).
    pub old_sha: String,
    /// Object id in the snapshot (all zeros when deleted).
    pub new_sha: String,
    /// git's status letter: `A`, `M`, `D` or `T`.
    pub status: u8,
    /// Path bytes, relative to the workspace.
    pub path: Vec<u8>,
}

impl Change {
    /// Whether the snapshot has something at this path (not a deletion).
    pub fn is_present(&self) -> bool {
        self.new_mode != 0
    }
}

/// Git modes.
pub mod mode {
    /// A regular file.
    pub const FILE: u32 = 0o100644;
    /// An executable file.
    pub const EXECUTABLE: u32 = 0o100755;
    /// A symbolic link.
    pub const SYMLINK: u32 = 0o120000;
    /// A gitlink (a submodule's commit).
    pub const GITLINK: u32 = 0o160000;
}

/// How much of a workspace file is read (and hashed, and spooled) at a time; a file no bigger
/// is read whole and spooled only if it differs from the base.
const STREAM_CHUNK: usize = 256 << 10;

/// Blobs over this are streamed by `fast-import` into the pack, not gathered in its memory.
const FAST_IMPORT_STREAM_OVER: &str = "--big-file-threshold=1m";

/// Keeps glibc's allocator from returning memory to the kernel after every blob, which costs a
/// `brk` per object in git's bulk paths.
const MALLOC_TUNING: &str = "glibc.malloc.trim_threshold=268435456:glibc.malloc.top_pad=16777216";

static SNAPSHOT_SEQ: AtomicU64 = AtomicU64::new(0);

/// A temporary index of the workspace over a pinned base. Dropping it removes its scratch.
#[derive(Debug)]
pub struct Snapshot {
    store: PathBuf,
    workspace: PathBuf,
    dir: PathBuf,
    objects: SnapshotObjects,
    base: String,
    changes: RefCell<Option<(String, Vec<Change>)>>,
}

impl Snapshot {
    /// Snapshot `workspace` over `base` (a commit in the host-controlled `store_git_dir`), with its
    /// index and (for `Scratch`) new objects under `scratch_dir`.
    pub fn take(
        store_git_dir: &Path,
        workspace: &Path,
        scratch_dir: &Path,
        base: &str,
        objects: SnapshotObjects,
    ) -> Result<Snapshot, SnapshotError> {
        Snapshot::take_with(
            store_git_dir,
            workspace,
            scratch_dir,
            base,
            TakeOptions::new(objects),
        )
    }

    /// [`Snapshot::take`], with paths to skip, a size limit and an inspector.
    pub fn take_with(
        store_git_dir: &Path,
        workspace: &Path,
        scratch_dir: &Path,
        base: &str,
        mut opts: TakeOptions<'_>,
    ) -> Result<Snapshot, SnapshotError> {
        let started = unix_secs();
        let snap = Snapshot::over_base(store_git_dir, workspace, scratch_dir, base, opts.objects)?;
        let cache = stat_cache::load(scratch_dir, base);
        let root = beneath::Dir::open(workspace).map_err(|source| SnapshotError::Workspace {
            path: workspace.display().to_string(),
            source,
        })?;
        let tracked = snap.entries()?;
        let listing = snap.list_untracked(&root, &tracked, &opts.skip)?;

        let mut candidates = Vec::with_capacity(tracked.len() + listing.untracked.len());
        for e in &tracked {
            candidates.push(Candidate {
                path: &e.path,
                base: Some((e.mode, e.sha.as_str())),
                saw: listing.saw(&e.path),
            });
        }
        for p in &listing.untracked {
            candidates.push(Candidate {
                path: p,
                base: None,
                saw: listing.saw(p),
            });
        }
        let mut stager = Stager::new(&snap, &root, &mut opts, &cache);
        for (path, error) in &listing.unlistable {
            stager.ask(Seen::Unreadable { path, error })?;
        }
        for chunk in candidates.chunks(PROBE_CHUNK) {
            stager.chunk(chunk)?;
        }
        // Every look agreed with the listing; now every directory listed must be as it was.
        listing.verify_unchanged(&root)?;
        let Stager {
            mut removals,
            additions,
            pending,
            learnt,
            ..
        } = stager;
        stat_cache::save(scratch_dir, base, started, &learnt);
        snap.fast_import(&pending)?;
        // Removals first, so a file that became a directory (or the reverse) is replaced.
        removals.extend_from_slice(&additions);
        snap.index_info(
            &removals,
            "stage the workspace's changes in the scratch index",
        )?;
        Ok(snap)
    }

    /// A snapshot's scratch with its index holding the base, nothing of the workspace read yet.
    fn over_base(
        store_git_dir: &Path,
        workspace: &Path,
        scratch_dir: &Path,
        base: &str,
        objects: SnapshotObjects,
    ) -> Result<Snapshot, SnapshotError> {
        if !is_object_id(base) {
            return Err(SnapshotError::BadBase {
                base: base.to_string(),
            });
        }
        let snap = Snapshot {
            store: store_git_dir.to_path_buf(),
            workspace: workspace.to_path_buf(),
            dir: make_scratch(scratch_dir, objects)?,
            objects,
            base: base.to_string(),
            changes: RefCell::new(None),
        };
        snap.git()
            .args(["read-tree", base])
            .output()
            .map_err(|source| SnapshotError::Git {
                step: "read the pinned base into a scratch index",
                source,
                mend: MEND_BASE,
            })?;
        Ok(snap)
    }

    /// The base this snapshot was taken over.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// git against the store, writing new objects into this snapshot's private object
    /// directory (no index, no work tree): for the commits and merges a verb makes from the
    /// snapshot's tree before it has validated everything.
    pub fn git_objects(&self) -> Git {
        Git::at(&self.store).objects_into(&self.dir.join("objects"), &self.store.join("objects"))
    }

    /// Move every object this snapshot (and [`Snapshot::git_objects`]) wrote into the store:
    /// loose objects first, then packs, each `.pack` before its `.idx` so git never sees an
    /// index without its pack. Call only once the whole snapshot has been validated.
    pub fn publish_objects(&self) -> Result<(), SnapshotError> {
        let from = self.dir.join("objects");
        let to = self.store.join("objects");
        let err = |path: &Path| {
            let path = path.to_path_buf();
            move |source| SnapshotError::Scratch { path, source }
        };
        for entry in fs::read_dir(&from).map_err(err(&from))? {
            let entry = entry.map_err(err(&from))?;
            let name = entry.file_name();
            let fan_out = name.len() == 2 && name.as_bytes().iter().all(u8::is_ascii_hexdigit);
            if !fan_out {
                continue;
            }
            for obj in fs::read_dir(entry.path()).map_err(err(&entry.path()))? {
                let obj = obj.map_err(err(&entry.path()))?;
                move_object(&obj.path(), &to.join(&name).join(obj.file_name()))?;
            }
        }
        let packs = from.join("pack");
        let mut files: Vec<PathBuf> = fs::read_dir(&packs)
            .map_err(err(&packs))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
        files.sort_by_key(|p| (p.extension() == Some(OsStr::new("idx")), p.clone()));
        for f in files {
            if let Some(name) = f.file_name() {
                move_object(&f, &to.join("pack").join(name))?;
            }
        }
        Ok(())
    }

    /// The workspace's untracked paths over the index `tracked` ([`untracked::list`]); nothing
    /// under a `skip` path.
    fn list_untracked(
        &self,
        root: &beneath::Dir,
        tracked: &[IndexEntry],
        skip: &HashSet<Vec<u8>>,
    ) -> Result<untracked::Listing, SnapshotError> {
        let skipped = |path: &[u8]| covered(skip, path);
        untracked::list(
            root,
            &untracked::Index::new(tracked),
            &skipped,
            &self.store,
            &self.dir,
        )
    }

    /// git against the store, with this snapshot's index, work tree and object directory.
    fn git(&self) -> Git {
        let g = Git::at(&self.store)
            .work_tree(&self.workspace)
            .index(&self.dir.join("index"))
            .env("GIT_ATTR_SOURCE", &self.base);
        match self.objects {
            SnapshotObjects::Scratch => {
                g.objects_into(&self.dir.join("objects"), &self.store.join("objects"))
            }
        }
    }

    /// `git update-index --add --replace -z --index-info` with `records` (`<mode> SP <id> TAB
    /// <path> NUL`; mode 0 removes): the index is written from what h5i read and hashed itself,
    /// so git never reads a workspace file to stage it.
    fn index_info(&self, records: &[u8], step: &'static str) -> Result<(), SnapshotError> {
        if records.is_empty() {
            return Ok(());
        }
        self.git()
            .env("GLIBC_TUNABLES", MALLOC_TUNING)
            .args(["update-index", "--add", "--replace", "-z", "--index-info"])
            .output_with_input(records)
            .map_err(|source| SnapshotError::Git {
                step,
                source,
                mend: MEND_SCRATCH,
            })?;
        Ok(())
    }

    /// Write `blobs` into the object directory as one pack, streamed from where they are held.
    fn fast_import(&self, blobs: &[Held]) -> Result<(), SnapshotError> {
        if blobs.is_empty() {
            return Ok(());
        }
        self.git()
            .env("GLIBC_TUNABLES", MALLOC_TUNING)
            .args([
                "-c",
                "fastimport.unpackLimit=0",
                "-c",
                "pack.compression=0",
                "fast-import",
                "--quiet",
                "--done",
                FAST_IMPORT_STREAM_OVER,
            ])
            .output_with_writer(|w| {
                let mut w = io::BufWriter::with_capacity(64 << 10, w);
                for blob in blobs {
                    let content = blob.content();
                    io::Write::write_all(
                        &mut w,
                        format!("blob\ndata {}\n", content.len()).as_bytes(),
                    )?;
                    content.copy_to(&mut w)?;
                    io::Write::write_all(&mut w, b"\n")?;
                }
                io::Write::write_all(&mut w, b"done\n")?;
                io::Write::flush(&mut w)
            })
            .map_err(|source| SnapshotError::Git {
                step: "write the workspace's new blobs",
                source,
                mend: MEND_SCRATCH,
            })?;
        Ok(())
    }

    /// Every entry of the snapshot's index.
    pub fn entries(&self) -> Result<Vec<IndexEntry>, SnapshotError> {
        let out = self
            .git()
            .args(["ls-files", "-s", "-z"])
            .output()
            .map_err(|source| SnapshotError::Git {
                step: "list the scratch index",
                source,
                mend: MEND_SCRATCH,
            })?;
        parse_ls_files(&out)
    }

    /// What differs between the snapshot and `base` (no rename detection).
    pub fn changes_against(&self, base: &str) -> Result<Vec<Change>, SnapshotError> {
        if let Some((b, c)) = self.changes.borrow().as_ref() {
            if b == base {
                return Ok(c.clone());
            }
        }
        require_rev(base)?;
        let out = self
            .git()
            .args([
                "diff-index",
                "--cached",
                "--raw",
                "-z",
                "--no-renames",
                "--ignore-submodules=none",
                base,
                "--",
            ])
            .output()
            .map_err(|source| SnapshotError::Git {
                step: "compare the snapshot with the base",
                source,
                mend: MEND_BASE,
            })?;
        let changes = parse_raw(&out)?;
        *self.changes.borrow_mut() = Some((base.to_string(), changes.clone()));
        Ok(changes)
    }

    /// The snapshot as a patch against `base`: binary-safe, full blob ids (so `git apply --3way`
    /// can fall back to a merge), no rename detection, and none of the user's diff settings.
    pub fn patch(&self, base: &str) -> Result<Vec<u8>, SnapshotError> {
        require_rev(base)?;
        self.git()
            .args([
                "diff-index",
                "--cached",
                "-p",
                "--binary",
                "--full-index",
                "--no-renames",
                "-U3",
                "--no-color",
                "--no-ext-diff",
                "--no-textconv",
                "--ignore-submodules=none",
                "--src-prefix=a/",
                "--dst-prefix=b/",
                base,
                "--",
            ])
            .output()
            .map_err(|source| SnapshotError::Git {
                step: "write the patch against the base",
                source,
                mend: MEND_BASE,
            })
    }

    /// A diffstat of the snapshot against `base`, for a terminal.
    pub fn stat(&self, base: &str) -> Result<Vec<u8>, SnapshotError> {
        require_rev(base)?;
        self.git()
            .args([
                "diff-index",
                "--cached",
                "--stat",
                "--no-renames",
                "--no-color",
                base,
                "--",
            ])
            .output()
            .map_err(|source| SnapshotError::Git {
                step: "summarise the snapshot against the base",
                source,
                mend: MEND_BASE,
            })
    }

    /// Reset each of `paths` (and everything beneath it) to the base this snapshot was taken
    /// over, in one git process: entries the base has get their base entry back, entries it
    /// lacks are removed.
    pub fn exclude_many(&self, paths: &[Vec<u8>]) -> Result<(), SnapshotError> {
        if paths.is_empty() {
            return Ok(());
        }
        let base = self.base.clone();
        let changes = self.changes_against(&base)?;
        let prefixes: HashSet<&[u8]> = paths.iter().map(|p| p.as_slice()).collect();
        let zero = "0".repeat(self.base.len());
        let mut removals = Vec::new();
        let mut restores = Vec::new();
        for c in changes.iter().filter(|c| under_any(&c.path, &prefixes)) {
            if c.old_mode == 0 {
                removals.extend_from_slice(format!("0 {zero}\t").as_bytes());
                removals.extend_from_slice(&c.path);
                removals.push(0);
            } else {
                restores.extend_from_slice(format!("{:o} {}\t", c.old_mode, c.old_sha).as_bytes());
                restores.extend_from_slice(&c.path);
                restores.push(0);
            }
        }
        if removals.is_empty() && restores.is_empty() {
            return Ok(());
        }
        removals.extend_from_slice(&restores);
        *self.changes.borrow_mut() = None;
        self.index_info(&removals, "reset excluded paths in the scratch index")
    }

    /// Write the snapshot's tree (into scratch or the store, as taken) and return its id.
    pub fn write_tree(&self) -> Result<String, SnapshotError> {
        let tree = self
            .git()
            .args(["write-tree"])
            .text()
            .map_err(|source| SnapshotError::Git {
                step: "write the snapshot's tree",
                source,
                mend: MEND_SCRATCH,
            })?;
        if !is_object_id(&tree) {
            return Err(SnapshotError::Parse {
                what: "a tree id from write-tree",
            });
        }
        Ok(tree)
    }

    /// Remove a scratch kept by [`Snapshot::keep_as`]: first renamed back into `scratch_dir`
    /// under this process's snapshot name (one rename: `dir` is gone at once), then deleted; a
    /// kill during the delete leaves it where the next snapshot reclaims it.
    pub fn discard_kept(dir: &Path, scratch_dir: &Path) -> Result<(), SnapshotError> {
        let err = |path: &Path| {
            let path = path.to_path_buf();
            move |source| SnapshotError::Scratch { path, source }
        };
        fs::create_dir_all(scratch_dir).map_err(err(scratch_dir))?;
        let n = SNAPSHOT_SEQ.fetch_add(1, Ordering::Relaxed);
        let gone = scratch_dir.join(format!("snap-{}-{n}", std::process::id()));
        fs::rename(dir, &gone).map_err(err(dir))?;
        fs::remove_dir_all(&gone).map_err(err(&gone))
    }

    /// Keep this snapshot's scratch (its index and the objects it and [`Snapshot::git_objects`]
    /// wrote) as `dir`, one rename on the same filesystem, and let go of it: `box rebase`'s
    /// journal, so a rebase killed after its commit point can be finished from what it
    /// computed. `dir` must not exist; the caller owns it from here on.
    pub fn keep_as(self, dir: &Path) -> Result<(), SnapshotError> {
        fs::rename(&self.dir, dir).map_err(|source| SnapshotError::Scratch {
            path: dir.to_path_buf(),
            source,
        })
    }

    /// The bytes of these blobs, in one `git cat-file --batch`, as `(id, bytes)` in order.
    pub fn read_blobs(&self, ids: &[String]) -> Result<Vec<(String, Vec<u8>)>, SnapshotError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut input = Vec::new();
        for id in ids {
            if !is_object_id(id) {
                return Err(SnapshotError::Parse {
                    what: "an object id",
                });
            }
            input.extend_from_slice(id.as_bytes());
            input.push(b'\n');
        }
        let out = self
            .git()
            .args(["cat-file", "--batch"])
            .output_with_input(&input)
            .map_err(|source| SnapshotError::Git {
                step: "read the snapshot's blobs",
                source,
                mend: MEND_SCRATCH,
            })?;
        parse_batch(&out, ids.len())
    }
}

impl Drop for Snapshot {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// Candidates probed per batch: each batch is read and hashed in parallel, then inspected in
/// order. What a batch read is in the probers' spool files, not in memory.
const PROBE_CHUNK: usize = 1024;

/// A path git would consider: a tracked entry of the base, or an untracked path.
struct Candidate<'a> {
    path: &'a [u8],
    /// The base's mode and blob id, for a tracked entry.
    base: Option<(u32, &'a str)>,
    /// What the listing saw there: the read must find the same.
    saw: Saw,
}

/// What is at a candidate's path now.
enum Probe {
    /// Nothing (or a directory where a file was): a deletion for a tracked entry.
    Gone,
    /// A directory above it is missing, a symlink or not a directory now: nothing beneath it
    /// is read, and a tracked entry is removed.
    BeyondLink,
    /// A directory: a gitlink of the base is still in place.
    Dir,
    /// A fifo, socket or device.
    Special(&'static str),
    /// A regular file over the size limit.
    TooLarge(u64),
    /// It could not be looked at.
    Unreadable(io::Error),
    /// Swapped for something else between its `fstatat` and its open: never read.
    Swapped,
    /// A regular file with set-user-id or set-group-id (its `st_mode`): never read.
    SetId(u32),
    /// The same mode and bytes as the base.
    Unchanged,
    /// A regular file different from the base, its bytes spooled.
    ChangedFile {
        mode: u32,
        sha: String,
        spooled: Spooled,
    },
    /// A symlink whose target differs from the base.
    ChangedLink { sha: String, target: Vec<u8> },
}

/// A prober's spool: an unnamed file in the snapshot's scratch that the bytes of changed files
/// are appended to as they are hashed.
struct Spool {
    file: Arc<fs::File>,
    end: u64,
}

/// One file's bytes in a spool.
struct Spooled {
    file: Arc<fs::File>,
    offset: u64,
    len: u64,
}

/// A blob waiting for `fast-import`.
enum Held {
    /// A symlink's target.
    Bytes(Vec<u8>),
    /// A file's bytes.
    Spooled(Spooled),
}

impl Spooled {
    fn content(&self) -> Content<'_> {
        Content::Spooled {
            file: &self.file,
            offset: self.offset,
            len: self.len,
        }
    }
}

impl Held {
    fn content(&self) -> Content<'_> {
        match self {
            Held::Bytes(b) => Content::Bytes(b),
            Held::Spooled(s) => s.content(),
        }
    }
}

/// Reads candidates from the workspace, hashing them as git would.
///
/// Every look is made afresh relative to the workspace's directory descriptor: the parent
/// directory is opened beneath it with no symlink followed (`openat2`), the entry is `fstatat`ed
/// and opened from that descriptor with `O_NOFOLLOW`, and a file is only read after `fstat` on
/// the open descriptor says it is a regular file. Nothing learnt about a directory is kept from
/// one path to the next, so a directory swapped for a symlink between two looks is met as a
/// symlink by the second.
struct Prober<'w, 'p> {
    cfg: ProbeCfg<'w>,
    /// Where this prober appends the bytes of changed files (made on first use).
    spool: &'p mut Option<Spool>,
    /// Tracked paths found to hold the base's bytes this time, for the next snapshot.
    learnt: Vec<(Vec<u8>, stat_cache::StatKey)>,
}

/// What every prober of one snapshot shares.
#[derive(Clone, Copy)]
struct ProbeCfg<'w> {
    root: &'w beneath::Dir,
    /// The snapshot's private scratch, where spools are made.
    scratch: &'w Path,
    max_file_size: Option<u64>,
    sha256: bool,
    /// Tracked paths known to hold the base's bytes while their `lstat` is unchanged.
    cache: &'w HashMap<Vec<u8>, stat_cache::StatKey>,
}

impl Prober<'_, '_> {
    /// What is at the candidate's path now, and what kind of thing was found there (to hold
    /// against what the listing saw).
    fn probe(&mut self, c: &Candidate<'_>) -> (Probe, Saw) {
        let cfg = self.cfg;
        let (dir, name) = match c.path.iter().rposition(|b| *b == b'/') {
            Some(i) => (&c.path[..i], &c.path[i + 1..]),
            None => (&c.path[..0], c.path),
        };
        let parent = match cfg.root.subdir(dir) {
            Ok(d) => d,
            Err(e) if matches!(e.raw_os_error(), Some(libc::ELOOP) | Some(libc::ENOTDIR)) => {
                return (Probe::BeyondLink, Saw::Unreachable)
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return (Probe::BeyondLink, Saw::Unreachable)
            }
            Err(e) => return (Probe::Unreadable(e), Saw::Unknown),
        };
        let meta = match parent.stat_at(name) {
            Ok(m) => m,
            Err(e)
                if e.kind() == io::ErrorKind::NotFound
                    || e.raw_os_error() == Some(libc::ENOTDIR) =>
            {
                return (Probe::Gone, Saw::Absent)
            }
            Err(e) => return (Probe::Unreadable(e), Saw::Unknown),
        };
        (
            self.probe_found(c, &parent, name, meta),
            Saw::Kind(meta.mode & libc::S_IFMT),
        )
    }

    /// [`Prober::probe`], once `name` in `parent` was found (`meta`, its `lstat`).
    fn probe_found(
        &mut self,
        c: &Candidate<'_>,
        parent: &beneath::Dir,
        name: &[u8],
        meta: beneath::Found,
    ) -> Probe {
        let cfg = self.cfg;
        if c.base.is_some_and(|(m, _)| m == mode::GITLINK) {
            return if meta.is_dir() {
                Probe::Dir
            } else {
                Probe::Gone
            };
        }
        if meta.is_setid_file() {
            return Probe::SetId(meta.mode);
        }
        let key = stat_cache::StatKey::of(&meta.stat);
        if c.base.is_some() && cfg.cache.get(c.path) == Some(&key) {
            self.learnt.push((c.path.to_vec(), key));
            return Probe::Unchanged;
        }
        if meta.is_file() {
            let limit = cfg.max_file_size.unwrap_or(u64::MAX);
            if meta.size > limit {
                return Probe::TooLarge(meta.size);
            }
            let (file, st) = match parent.open_file(name) {
                Ok(Some(opened)) => opened,
                Ok(None) => return Probe::Swapped,
                Err(e) => return Probe::Unreadable(e),
            };
            if st.is_setid_file() {
                return Probe::SetId(st.mode);
            }
            if st.size > limit {
                return Probe::TooLarge(st.size);
            }
            let git_mode = if st.mode & 0o100 != 0 {
                mode::EXECUTABLE
            } else {
                mode::FILE
            };
            return self.stream(c, key, file, st.size, git_mode);
        }
        if meta.is_dir() {
            return Probe::Gone;
        }
        if !meta.is_symlink() {
            return Probe::Special(meta.special_kind());
        }
        let target = match parent.readlink_at(name) {
            Ok(t) => t,
            Err(e) => return Probe::Unreadable(e),
        };
        let mut h = digest::BlobHasher::new(cfg.sha256, target.len() as u64);
        h.update(&target);
        let sha = h.finish();
        if c.base == Some((mode::SYMLINK, sha.as_str())) {
            self.learnt.push((c.path.to_vec(), key));
            return Probe::Unchanged;
        }
        Probe::ChangedLink { sha, target }
    }

    /// Hash the open regular `file` as git would (its blob header from `size`, `fstat`'s) while
    /// it streams by, `STREAM_CHUNK` at a time; spool its bytes if it differs from the base. A
    /// file that is not exactly `size` bytes long by the time it is read was rewritten while
    /// h5i read it, and is refused as swapped.
    fn stream(
        &mut self,
        c: &Candidate<'_>,
        key: stat_cache::StatKey,
        mut file: fs::File,
        size: u64,
        git_mode: u32,
    ) -> Probe {
        let mut hasher = digest::BlobHasher::new(self.cfg.sha256, size);
        let start = match self.spool() {
            Ok(sp) => sp.end,
            Err(e) => return Probe::Unreadable(e),
        };
        // A small file is read whole (one byte more than it holds, to see it grew) and spooled
        // only if it differs from the base; a big one is spooled as it is hashed, at the
        // spool's end, which is given back if it turns out unchanged.
        let small = size <= STREAM_CHUNK as u64;
        let mut buf = vec![
            0u8;
            if small {
                size as usize + 1
            } else {
                STREAM_CHUNK
            }
        ];
        let mut total = 0u64;
        loop {
            let at = if small { total as usize } else { 0 };
            let n = match io::Read::read(&mut file, &mut buf[at..]) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Probe::Unreadable(e),
            };
            if total + n as u64 > size {
                return Probe::Swapped;
            }
            if !small {
                hasher.update(&buf[..n]);
                if let Err(e) = self.spool_at(start + total, &buf[..n]) {
                    return Probe::Unreadable(e);
                }
            }
            total += n as u64;
        }
        if total != size {
            return Probe::Swapped;
        }
        if small {
            hasher.update(&buf[..total as usize]);
        }
        let sha = hasher.finish();
        if c.base == Some((git_mode, sha.as_str())) {
            self.learnt.push((c.path.to_vec(), key));
            return Probe::Unchanged;
        }
        if small {
            if let Err(e) = self.spool_at(start, &buf[..total as usize]) {
                return Probe::Unreadable(e);
            }
        }
        let Some(spool) = self.spool.as_mut() else {
            return Probe::Unreadable(io::Error::other("the spool vanished"));
        };
        spool.end = start + size;
        Probe::ChangedFile {
            mode: git_mode,
            sha,
            spooled: Spooled {
                file: Arc::clone(&spool.file),
                offset: start,
                len: size,
            },
        }
    }

    /// This prober's spool, made in the snapshot's scratch on first use (unnamed: it goes when
    /// the last handle does).
    fn spool(&mut self) -> io::Result<&mut Spool> {
        if self.spool.is_none() {
            let file = tempfile::tempfile_in(self.cfg.scratch)?;
            *self.spool = Some(Spool {
                file: Arc::new(file),
                end: 0,
            });
        }
        self.spool
            .as_mut()
            .ok_or_else(|| io::Error::other("no spool"))
    }

    fn spool_at(&mut self, offset: u64, bytes: &[u8]) -> io::Result<()> {
        let spool = self.spool()?;
        std::os::unix::fs::FileExt::write_all_at(&*spool.file, bytes, offset)
    }
}

/// Probes git's candidate paths, asks the inspector about what differs from the base, and
/// collects what to stage.
struct Stager<'s, 'o, 'i> {
    snap: &'s Snapshot,
    /// The workspace, held open: every read is beneath it.
    root: &'s beneath::Dir,
    opts: &'o mut TakeOptions<'i>,
    /// `update-index --index-info` records removing a tracked entry.
    removals: Vec<u8>,
    /// `update-index --index-info` records staging what was read.
    additions: Vec<u8>,
    /// Blobs for `fast-import`.
    pending: Vec<Held>,
    pending_ids: HashSet<String>,
    threads: usize,
    /// One spool per prober thread, kept from one batch to the next.
    spools: Vec<Option<Spool>>,
    cache: &'s HashMap<Vec<u8>, stat_cache::StatKey>,
    learnt: Vec<(Vec<u8>, stat_cache::StatKey)>,
}

impl<'s, 'o, 'i> Stager<'s, 'o, 'i> {
    fn new(
        snap: &'s Snapshot,
        root: &'s beneath::Dir,
        opts: &'o mut TakeOptions<'i>,
        cache: &'s HashMap<Vec<u8>, stat_cache::StatKey>,
    ) -> Self {
        let threads = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
            .clamp(1, 8);
        Stager {
            snap,
            root,
            opts,
            removals: Vec::new(),
            additions: Vec::new(),
            pending: Vec::new(),
            pending_ids: HashSet::new(),
            threads,
            spools: (0..threads).map(|_| None).collect(),
            cache,
            learnt: Vec::new(),
        }
    }

    fn ask(&mut self, seen: Seen<'_>) -> Result<Verdict, SnapshotError> {
        if let Some(inspect) = self.opts.inspect.as_mut() {
            return Ok(inspect(seen));
        }
        match seen {
            Seen::File { .. } | Seen::Symlink { .. } => Ok(Verdict::Keep),
            Seen::NestedRepository { .. } | Seen::GitlinkReplaced { .. } => Ok(Verdict::Skip),
            Seen::TooLarge { .. } => Ok(Verdict::Skip),
            Seen::SetId { path, mode } => Err(SnapshotError::SetId {
                path: String::from_utf8_lossy(path).into_owned(),
                mode,
            }),
            Seen::Special { path, kind } => Err(SnapshotError::Special {
                path: String::from_utf8_lossy(path).into_owned(),
                kind,
            }),
            Seen::Unreadable { path, error } => Err(SnapshotError::Workspace {
                path: String::from_utf8_lossy(path).into_owned(),
                source: io::Error::new(error.kind(), error.to_string()),
            }),
        }
    }

    fn skipped(&self, path: &[u8]) -> bool {
        covered(&self.opts.skip, path)
    }

    /// Probe one batch (in parallel), then act on each result in order.
    fn chunk(&mut self, chunk: &[Candidate<'_>]) -> Result<(), SnapshotError> {
        let mut todo: Vec<&Candidate<'_>> = Vec::with_capacity(chunk.len());
        for c in chunk {
            if c.base.is_none() {
                if let Some(dir) = c.path.strip_suffix(b"/") {
                    if !self.skipped(dir) {
                        self.ask(Seen::NestedRepository { path: dir })?;
                    }
                    continue;
                }
            }
            if !self.skipped(c.path) {
                todo.push(c);
            }
        }
        let probes = self.probe_all(&todo)?;
        if probes.len() != todo.len() {
            return Err(SnapshotError::Parse {
                what: "a probe count that does not match the paths",
            });
        }
        for (c, (probe, found)) in todo.into_iter().zip(probes) {
            // A look that disagrees with the listing: the tree moved under the snapshot, which
            // refuses rather than stage a mix of two states of it (or leave out what was only
            // elsewhere for an instant).
            if c.saw != found && c.saw != Saw::Unknown && found != Saw::Unknown {
                return Err(untracked::changed(
                    c.path,
                    &format!(
                        "{} when its directory was listed, {} when h5i read it",
                        c.saw.describe(),
                        found.describe()
                    ),
                ));
            }
            self.act(c, probe)?;
        }
        Ok(())
    }

    fn probe_all(&mut self, todo: &[&Candidate<'_>]) -> Result<Vec<(Probe, Saw)>, SnapshotError> {
        let cfg = ProbeCfg {
            root: self.root,
            scratch: &self.snap.dir,
            max_file_size: self.opts.max_file_size,
            sha256: self.snap.base.len() == 64,
            cache: self.cache,
        };
        if self.threads < 2 || todo.len() < 64 {
            let mut p = Prober {
                cfg,
                spool: &mut self.spools[0],
                learnt: Vec::new(),
            };
            let probes = todo.iter().map(|c| p.probe(c)).collect();
            self.learnt.append(&mut p.learnt);
            return Ok(probes);
        }
        let per = todo.len().div_ceil(self.threads);
        type Part = (Vec<(Probe, Saw)>, Vec<(Vec<u8>, stat_cache::StatKey)>);
        let parts: Vec<Option<Part>> = std::thread::scope(|scope| {
            let handles: Vec<_> = todo
                .chunks(per)
                .zip(self.spools.iter_mut())
                .map(|(part, spool)| {
                    let mut p = Prober {
                        cfg,
                        spool,
                        learnt: Vec::new(),
                    };
                    scope.spawn(move || {
                        let probes: Vec<(Probe, Saw)> = part.iter().map(|c| p.probe(c)).collect();
                        (probes, p.learnt)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().ok()).collect()
        });
        let mut probes = Vec::with_capacity(todo.len());
        for part in parts {
            let Some((mut p, mut learnt)) = part else {
                return Err(SnapshotError::Workspace {
                    path: "<workspace>".into(),
                    source: io::Error::other("a thread reading the workspace panicked"),
                });
            };
            probes.append(&mut p);
            self.learnt.append(&mut learnt);
        }
        Ok(probes)
    }

    fn act(&mut self, c: &Candidate<'_>, probe: Probe) -> Result<(), SnapshotError> {
        let path = c.path;
        let tracked = c.base.is_some();
        match probe {
            Probe::Unchanged => {}
            Probe::Dir => {}
            Probe::Gone if c.base.is_some_and(|(m, _)| m == mode::GITLINK) => {
                self.ask(Seen::GitlinkReplaced { path })?;
            }
            Probe::Gone | Probe::BeyondLink => {
                if tracked {
                    let zero = "0".repeat(self.snap.base.len());
                    self.removals
                        .extend_from_slice(format!("0 {zero}\t").as_bytes());
                    self.removals.extend_from_slice(path);
                    self.removals.push(0);
                }
            }
            Probe::Swapped => {
                return Err(untracked::changed(
                    path,
                    "a file replaced or rewritten while h5i read it",
                ));
            }
            Probe::SetId(st_mode) => {
                self.ask(Seen::SetId {
                    path,
                    mode: st_mode,
                })?;
            }
            Probe::Special(kind) => {
                self.ask(Seen::Special { path, kind })?;
            }
            Probe::TooLarge(size) => {
                self.ask(Seen::TooLarge { path, size })?;
            }
            Probe::Unreadable(error) => {
                self.ask(Seen::Unreadable {
                    path,
                    error: &error,
                })?;
            }
            Probe::ChangedLink { sha, target } => {
                let verdict = self.ask(Seen::Symlink {
                    path,
                    sha: &sha,
                    target: &target,
                })?;
                self.stage(c, verdict, mode::SYMLINK, sha, Held::Bytes(target));
            }
            Probe::ChangedFile {
                mode: git_mode,
                sha,
                spooled,
            } => {
                let verdict = self.ask(Seen::File {
                    path,
                    sha: &sha,
                    executable: git_mode == mode::EXECUTABLE,
                    content: spooled.content(),
                })?;
                self.stage(c, verdict, git_mode, sha, Held::Spooled(spooled));
            }
        }
        Ok(())
    }

    /// Record a kept entry for the index, and its blob for `fast-import` unless the store (or
    /// this snapshot) has it already.
    fn stage(
        &mut self,
        c: &Candidate<'_>,
        verdict: Verdict,
        git_mode: u32,
        sha: String,
        blob: Held,
    ) {
        if verdict == Verdict::Skip {
            return;
        }
        self.additions
            .extend_from_slice(format!("{git_mode:o} {sha}\t").as_bytes());
        self.additions.extend_from_slice(c.path);
        self.additions.push(0);
        if c.base.map(|(_, s)| s) != Some(sha.as_str()) && self.pending_ids.insert(sha) {
            self.pending.push(blob);
        }
    }
}

/// Make a private directory for one snapshot under `scratch`, clearing ones that dead processes
/// left behind.
fn make_scratch(scratch: &Path, objects: SnapshotObjects) -> Result<PathBuf, SnapshotError> {
    use std::os::unix::fs::DirBuilderExt;
    let err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| SnapshotError::Scratch { path, source }
    };
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(scratch)
        .map_err(err(scratch))?;
    if let Ok(entries) = fs::read_dir(scratch) {
        for e in entries.flatten() {
            let name = e.file_name();
            let Some(rest) = name.to_str().and_then(|n| n.strip_prefix("snap-")) else {
                continue;
            };
            let pid = rest.split('-').next().and_then(|p| p.parse::<i32>().ok());
            if let Some(pid) = pid {
                if pid != std::process::id() as i32 && !process_alive(pid) {
                    let _ = fs::remove_dir_all(e.path());
                }
            }
        }
    }
    let n = SNAPSHOT_SEQ.fetch_add(1, Ordering::Relaxed);
    let dir = scratch.join(format!("snap-{}-{n}", std::process::id()));
    if dir.exists() {
        fs::remove_dir_all(&dir).map_err(err(&dir))?;
    }
    fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .map_err(err(&dir))?;
    {
        let SnapshotObjects::Scratch = objects;
        let o = dir.join("objects");
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(o.join("pack"))
            .map_err(err(&o))?;
        fs::create_dir(o.join("info")).map_err(err(&o))?;
    }
    Ok(dir)
}

/// Move one object file into the store (copy then rename where the store is on another
/// filesystem). An object already there is left as it is: same name, same bytes.
fn move_object(src: &Path, dst: &Path) -> Result<(), SnapshotError> {
    let err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| SnapshotError::Scratch { path, source }
    };
    if fs::symlink_metadata(dst).is_ok() {
        return Ok(());
    }
    if let Some(dir) = dst.parent() {
        match fs::create_dir(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(err(dir)(e)),
        }
    }
    match fs::rename(src, dst) {
        Ok(()) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::EXDEV) => {
            let tmp = dst.with_extension(format!("h5i-tmp-{}", std::process::id()));
            fs::copy(src, &tmp)
                .and_then(|_| fs::File::open(&tmp)?.sync_all())
                .and_then(|()| fs::rename(&tmp, dst))
                .map_err(|e| {
                    let _ = fs::remove_file(&tmp);
                    err(dst)(e)
                })
        }
        Err(e) => Err(err(dst)(e)),
    }
}

/// A probe, never a signal (a pid of 0 or below counts as alive: nothing is removed for it).
fn process_alive(pid: i32) -> bool {
    h5i_sys::proc::exists(pid)
}

/// Whether `path` is one of `skip`, or lies beneath one.
fn covered(skip: &HashSet<Vec<u8>>, path: &[u8]) -> bool {
    if skip.is_empty() {
        return false;
    }
    let mut end = 0;
    while end <= path.len() {
        let next = path[end..]
            .iter()
            .position(|b| *b == b'/')
            .map_or(path.len(), |p| end + p);
        if skip.contains(&path[..next]) {
            return true;
        }
        end = next + 1;
    }
    false
}

fn under_any(path: &[u8], prefixes: &HashSet<&[u8]>) -> bool {
    if prefixes.contains(path) {
        return true;
    }
    path.iter()
        .enumerate()
        .filter(|(_, b)| **b == b'/')
        .any(|(i, _)| prefixes.contains(&path[..i]))
}

fn is_object_id(s: &str) -> bool {
    (s.len() == 40 || s.len() == 64) && s.bytes().all(|b| b.is_ascii_hexdigit())
}

fn require_rev(rev: &str) -> Result<(), SnapshotError> {
    if crate::git::plain_rev(rev) {
        Ok(())
    } else {
        Err(SnapshotError::BadBase {
            base: rev.to_string(),
        })
    }
}

fn parse_mode(s: &[u8]) -> Option<u32> {
    u32::from_str_radix(std::str::from_utf8(s).ok()?, 8).ok()
}

/// `git ls-files -s -z`: `<mode> SP <sha> SP <stage> TAB <path> NUL`.
fn parse_ls_files(out: &[u8]) -> Result<Vec<IndexEntry>, SnapshotError> {
    let bad = || SnapshotError::Parse {
        what: "an index listing",
    };
    let mut entries = Vec::new();
    for rec in out.split(|b| *b == 0).filter(|r| !r.is_empty()) {
        let tab = rec.iter().position(|b| *b == b'\t').ok_or_else(bad)?;
        let mut fields = rec[..tab].split(|b| *b == b' ');
        let mode = fields.next().and_then(parse_mode).ok_or_else(bad)?;
        let sha = fields
            .next()
            .and_then(|s| std::str::from_utf8(s).ok())
            .filter(|s| is_object_id(s))
            .ok_or_else(bad)?;
        entries.push(IndexEntry {
            mode,
            sha: sha.to_string(),
            path: rec[tab + 1..].to_vec(),
        });
    }
    Ok(entries)
}

/// `git diff-index --raw -z`: `:<old> <new> <oldsha> <newsha> <status> NUL <path> NUL`.
fn parse_raw(out: &[u8]) -> Result<Vec<Change>, SnapshotError> {
    let bad = || SnapshotError::Parse { what: "a raw diff" };
    let mut parts = out.split(|b| *b == 0);
    let mut changes = Vec::new();
    while let Some(head) = parts.next() {
        if head.is_empty() {
            continue;
        }
        let head = head.strip_prefix(b":").ok_or_else(bad)?;
        let f: Vec<&[u8]> = head.split(|b| *b == b' ').collect();
        if f.len() != 5 {
            return Err(bad());
        }
        let sha = |s: &[u8]| {
            std::str::from_utf8(s)
                .ok()
                .filter(|s| is_object_id(s))
                .map(str::to_string)
                .ok_or_else(bad)
        };
        let path = parts.next().ok_or_else(bad)?;
        changes.push(Change {
            old_mode: parse_mode(f[0]).ok_or_else(bad)?,
            new_mode: parse_mode(f[1]).ok_or_else(bad)?,
            old_sha: sha(f[2])?,
            new_sha: sha(f[3])?,
            status: *f[4].first().ok_or_else(bad)?,
            path: path.to_vec(),
        });
    }
    Ok(changes)
}

/// `git cat-file --batch`: `<sha> SP <type> SP <size> LF <bytes> LF`, or `<sha> missing LF`.
fn parse_batch(out: &[u8], count: usize) -> Result<Vec<(String, Vec<u8>)>, SnapshotError> {
    let bad = || SnapshotError::Parse {
        what: "cat-file output",
    };
    let mut res = Vec::with_capacity(count);
    let mut at = 0;
    while at < out.len() {
        let nl = out[at..].iter().position(|b| *b == b'\n').ok_or_else(bad)? + at;
        let head = std::str::from_utf8(&out[at..nl]).map_err(|_| bad())?;
        let f: Vec<&str> = head.split(' ').collect();
        if f.len() != 3 {
            return Err(bad());
        }
        let size: usize = f[2].parse().map_err(|_| bad())?;
        let start = nl + 1;
        let end = start.checked_add(size).ok_or_else(bad)?;
        if end >= out.len() || out[end] != b'\n' {
            return Err(bad());
        }
        res.push((f[0].to_string(), out[start..end].to_vec()));
        at = end + 1;
    }
    if res.len() != count {
        return Err(bad());
    }
    Ok(res)
}

fn unix_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// A host-private cache, `<scratch>/stat-cache`, of tracked paths that held exactly the base's
/// bytes when last read, keyed by their whole `lstat` (device, inode, mode, size, mtime and ctime
/// to the nanosecond), so a later snapshot need not read them again.
///
/// What makes it safe to trust: the file lives in host-private scratch, never in the workspace;
/// it is dropped when the base changes; an entry is used only if its ctime is more than a second
/// older than the snapshot that wrote it (any write after that read moves the ctime, which no
/// unprivileged process can set back); and an entry can only say "the base's bytes", so a stale
/// one could at worst leave a change out of the patch — it can never let unread bytes through.
mod stat_cache {
    use std::collections::HashMap;
    use std::fs;
    use std::io::{Read, Write};
    use std::os::unix::fs::OpenOptionsExt;
    use std::path::Path;

    const FILE: &str = "stat-cache";
    const MAGIC: &str = "h5i-stat-cache 1";

    /// The `lstat` facts that must all match.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct StatKey {
        dev: u64,
        ino: u64,
        mode: u32,
        size: u64,
        mtime: i64,
        mtime_ns: i64,
        ctime: i64,
        ctime_ns: i64,
    }

    impl StatKey {
        pub fn of(m: &libc::stat) -> Self {
            StatKey {
                dev: m.st_dev,
                ino: m.st_ino,
                mode: m.st_mode,
                size: m.st_size as u64,
                mtime: m.st_mtime,
                mtime_ns: m.st_mtime_nsec,
                ctime: m.st_ctime,
                ctime_ns: m.st_ctime_nsec,
            }
        }
    }

    /// The entries usable for a snapshot over `base` (none if the cache is missing, damaged or
    /// for another base).
    pub fn load(scratch: &Path, base: &str) -> HashMap<Vec<u8>, StatKey> {
        let mut out = HashMap::new();
        let mut bytes = Vec::new();
        let opened = fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(scratch.join(FILE));
        if opened.and_then(|mut f| f.read_to_end(&mut bytes)).is_err() {
            return out;
        }
        let Some(nl) = bytes.iter().position(|b| *b == b'\n') else {
            return out;
        };
        let head = String::from_utf8_lossy(&bytes[..nl]).into_owned();
        let Some(rest) = head.strip_prefix(MAGIC) else {
            return out;
        };
        let mut f = rest.split_whitespace();
        if f.next() != Some(base) {
            return out;
        }
        let Some(written) = f.next().and_then(|t| t.parse::<i64>().ok()) else {
            return out;
        };
        for rec in bytes[nl + 1..].split(|b| *b == 0).filter(|r| !r.is_empty()) {
            let Some(tab) = rec.iter().position(|b| *b == b'\t') else {
                return HashMap::new();
            };
            let nums: Vec<i128> = String::from_utf8_lossy(&rec[..tab])
                .split(' ')
                .filter_map(|n| n.parse().ok())
                .collect();
            let [dev, ino, mode, size, mtime, mtime_ns, ctime, ctime_ns] = nums[..] else {
                return HashMap::new();
            };
            let key = StatKey {
                dev: dev as u64,
                ino: ino as u64,
                mode: mode as u32,
                size: size as u64,
                mtime: mtime as i64,
                mtime_ns: mtime_ns as i64,
                ctime: ctime as i64,
                ctime_ns: ctime_ns as i64,
            };
            if key.ctime < written - 1 {
                out.insert(rec[tab + 1..].to_vec(), key);
            }
        }
        out
    }

    /// Replace the cache with `entries`, stamped with `started` (when the snapshot began, before
    /// any file was read). Best effort: a cache that cannot be written is just not there.
    pub fn save(scratch: &Path, base: &str, started: i64, entries: &[(Vec<u8>, StatKey)]) {
        let mut buf = format!("{MAGIC} {base} {started}\n").into_bytes();
        for (path, k) in entries {
            buf.extend_from_slice(
                format!(
                    "{} {} {} {} {} {} {} {}\t",
                    k.dev, k.ino, k.mode, k.size, k.mtime, k.mtime_ns, k.ctime, k.ctime_ns
                )
                .as_bytes(),
            );
            buf.extend_from_slice(path);
            buf.push(0);
        }
        let tmp = scratch.join(format!("{FILE}.tmp-{}", std::process::id()));
        let _ = fs::remove_file(&tmp);
        let written = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)
            .and_then(|mut f| f.write_all(&buf))
            .and_then(|()| fs::rename(&tmp, scratch.join(FILE)));
        if written.is_err() {
            let _ = fs::remove_file(&tmp);
        }
    }
}

/// The object hashes a snapshot needs: git's blob ids (SHA-1, and SHA-256 for repositories in
/// that object format) and plain SHA-256 for digests of exported files.
///
/// Used as a cache key only: a staged blob's id is always the one git computed, and a mismatch
/// with the id computed here just means git's bytes are read back and inspected again.
pub mod digest {
    use sha1::Sha1;
    use sha2::{Digest, Sha256};

    /// git's blob id, computed as the bytes go by: the header carries the size, so it is given
    /// first (a caller reading a file takes it from `fstat` on the open descriptor).
    pub enum BlobHasher {
        /// A SHA-1 repository.
        Sha1(Sha1),
        /// A SHA-256 repository.
        Sha256(Sha256),
    }

    impl BlobHasher {
        /// A hasher for a blob of `size` bytes.
        pub fn new(sha256: bool, size: u64) -> Self {
            let header = format!("blob {size}\0");
            if sha256 {
                BlobHasher::Sha256(Sha256::new_with_prefix(header.as_bytes()))
            } else {
                BlobHasher::Sha1(Sha1::new_with_prefix(header.as_bytes()))
            }
        }

        /// The next bytes of the blob.
        pub fn update(&mut self, bytes: &[u8]) {
            match self {
                BlobHasher::Sha1(h) => h.update(bytes),
                BlobHasher::Sha256(h) => h.update(bytes),
            }
        }

        /// The id, as hex.
        pub fn finish(self) -> String {
            match self {
                BlobHasher::Sha1(h) => hex(&h.finalize()),
                BlobHasher::Sha256(h) => hex(&h.finalize()),
            }
        }
    }

    /// SHA-256 of `data`, as hex.
    pub fn sha256_hex(data: &[u8]) -> String {
        hex(&Sha256::digest(data))
    }

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_match_known_answers() {
        assert_eq!(
            digest::sha256_hex(b""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(
            digest::sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        let long = vec![b'a'; 1_000_000];
        assert_eq!(
            digest::sha256_hex(&long),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"
        );
        let blob_sha1 = |content: &[u8]| {
            let mut h = digest::BlobHasher::new(false, content.len() as u64);
            h.update(content);
            h.finish()
        };
        // Fed in pieces, the same id.
        let mut h = digest::BlobHasher::new(false, 3);
        for piece in [&b"a"[..], b"", b"bc"] {
            h.update(piece);
        }
        assert_eq!(h.finish(), "f2ba8f84ab5c1bce84a7b441cb1959cfc7093b7f");
        // `git hash-object` of the empty blob and of "abc".
        assert_eq!(blob_sha1(b""), "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391");
        assert_eq!(
            blob_sha1(b"abc"),
            "f2ba8f84ab5c1bce84a7b441cb1959cfc7093b7f"
        );
        // 55, 56 and 64 bytes of header+content straddle the padding boundary.
        for n in [47usize, 48, 49, 55, 56, 57, 63, 64, 65, 119, 120, 1000] {
            let data = vec![b'x'; n];
            let mut h = digest_reference_sha1(&data);
            h.truncate(40);
            assert_eq!(blob_sha1(&data), h, "length {n}");
        }
    }

    /// git's own answer, for the boundary lengths.
    fn digest_reference_sha1(data: &[u8]) -> String {
        Git::detached()
            .args(["hash-object", "--stdin"])
            .output_with_input(data)
            .map(|o| String::from_utf8_lossy(&o).trim().to_string())
            .unwrap()
    }

    #[test]
    fn raw_diff_and_index_listings_parse() {
        let z = "0".repeat(40);
        let a = "a".repeat(40);
        let raw = format!(":100644 000000 {a} {z} D\0gone\0:000000 120000 {z} {a} A\0we\tird\0");
        let c = parse_raw(raw.as_bytes()).unwrap();
        assert_eq!(c.len(), 2);
        assert_eq!(c[0].status, b'D');
        assert!(!c[0].is_present());
        assert_eq!(c[1].new_mode, mode::SYMLINK);
        assert_eq!(c[1].path, b"we\tird");
        let ls = format!("100755 {a} 0\tx y\0");
        let e = parse_ls_files(ls.as_bytes()).unwrap();
        assert_eq!(e[0].mode, mode::EXECUTABLE);
        assert_eq!(e[0].path, b"x y");
        assert!(parse_raw(b"garbage\0").is_err());
    }

    #[test]
    fn cat_file_batch_output_parses_binary_bodies() {
        let a = "a".repeat(40);
        let b = "b".repeat(40);
        let mut out = format!("{a} blob 3\n").into_bytes();
        out.extend_from_slice(b"\n\0\n\n");
        out.extend_from_slice(format!("{b} blob 0\n\n").as_bytes());
        let r = parse_batch(&out, 2).unwrap();
        assert_eq!(r[0].1, b"\n\0\n");
        assert!(r[1].1.is_empty());
        assert!(parse_batch(&out[..10], 2).is_err());
    }

    /// A store (a repository's `.git`) whose base commit holds `files` (and gitlinks at
    /// `gitlinks`), and a workspace holding the same files, as a box's does when it starts.
    struct Fx {
        dir: tempfile::TempDir,
        store: PathBuf,
        ws: PathBuf,
        base: String,
    }

    fn put(root: &Path, rel: &str, bytes: &[u8]) {
        let p = root.join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, bytes).unwrap();
    }

    impl Fx {
        fn new(files: &[(&str, &[u8])], gitlinks: &[&str]) -> Fx {
            let dir = tempfile::tempdir().unwrap();
            let repo = dir.path().join("repo");
            let ws = dir.path().join("ws");
            fs::create_dir_all(&ws).unwrap();
            Git::detached()
                .args([OsStr::new("init"), OsStr::new("-q"), repo.as_os_str()])
                .output()
                .unwrap();
            let store = repo.join(".git");
            for (rel, bytes) in files {
                put(&ws, rel, bytes);
            }
            let idx = dir.path().join("base-index");
            let git = || Git::at(&store).work_tree(&ws).index(&idx);
            git()
                .env("GIT_LITERAL_PATHSPECS", "1")
                .args(["add", "-f", "--"])
                .args(files.iter().map(|(rel, _)| rel))
                .output()
                .unwrap();
            for link in gitlinks {
                let info = format!("160000,{},{link}", "1".repeat(40));
                git()
                    .args(["update-index", "--add", "--cacheinfo", &info])
                    .output()
                    .unwrap();
            }
            let tree = git().args(["write-tree"]).text().unwrap();
            let base = Git::at(&store)
                .args(["-c", "user.name=t", "-c", "user.email=t@example.test"])
                .args(["commit-tree", &tree, "-m", "base"])
                .text()
                .unwrap();
            Fx {
                dir,
                store,
                ws,
                base,
            }
        }

        fn scratch(&self) -> PathBuf {
            self.dir.path().join("scratch")
        }

        fn take(&self, inspect: Inspector<'_>) -> Result<Snapshot, SnapshotError> {
            Snapshot::take_with(
                &self.store,
                &self.ws,
                &self.scratch(),
                &self.base,
                TakeOptions::new(SnapshotObjects::Scratch).inspect(inspect),
            )
        }
    }

    fn shown(paths: &[Vec<u8>]) -> Vec<String> {
        paths
            .iter()
            .map(|p| String::from_utf8_lossy(p).into_owned())
            .collect()
    }

    /// h5i's own walk lists exactly what `git ls-files --others --exclude-standard` (the
    /// listing it replaces, run as it was: the snapshot's git, the workspace as its work tree)
    /// lists, in the same order, over a tree holding every case git treats specially.
    #[test]
    fn the_untracked_walk_lists_what_git_ls_files_others_lists() {
        let fx = Fx::new(
            &[
                (
                    ".gitignore",
                    b"*.log\n!keep.log\nbuild/\n/top-only\nnode_modules\n".as_slice(),
                ),
                ("src/.gitignore", b"gen/\n*.tmp\n"),
                ("src/main.rs", b"fn main() {}\n"),
                ("build/keep.txt", b"tracked in an ignored directory\n"),
                ("docs/a.md", b"a\n"),
                ("was_file", b"a file in the base\n"),
                ("was_dir/x", b"in a directory of the base\n"),
                ("holds_repo/f", b"tracked\n"),
            ],
            &["sub"],
        );
        let ws = &fx.ws;
        fs::write(fx.store.join("info/exclude"), "from-info-exclude\n").unwrap();
        // The box's own repository at the root: never listed.
        put(ws, ".git/HEAD", b"ref: refs/heads/main\n");
        fs::create_dir_all(ws.join(".git/refs")).unwrap();
        for (rel, bytes) in [
            ("new.txt", &b"new\n"[..]),
            ("x.log", b"ignored\n"),
            ("keep.log", b"re-included\n"),
            ("a/keep.log", b"re-included\n"),
            ("a/b.log", b"ignored\n"),
            ("build/new.txt", b"in an ignored tracked directory\n"),
            ("node_modules/pkg/index.js", b"ignored directory\n"),
            ("top-only", b"ignored at the top\n"),
            ("src/top-only", b"not ignored below\n"),
            ("src/gen/out.rs", b"ignored by src/.gitignore\n"),
            ("src/x.tmp", b"ignored by src/.gitignore\n"),
            ("x.tmp", b"not ignored at the top\n"),
            ("other/build", b"a file: build/ is for directories\n"),
            ("logs.log/inner", b"a directory *.log ignores\n"),
            (
                "from-info-exclude",
                b"ignored by the store's info/exclude\n",
            ),
            ("sub/inner.txt", b"below a gitlink\n"),
            ("nested/file", b"in a nested repository\n"),
            ("nested/.git/HEAD", b"ref: refs/heads/main\n"),
            ("wt/file", b"behind a gitfile\n"),
            ("wt/.git", b"gitdir: ../nested/.git\n"),
            ("holds_repo/new", b"a repository in a tracked directory\n"),
            ("holds_repo/.git/HEAD", b"ref: refs/heads/main\n"),
            ("d1/d2/d3/d4/deep", b"deep\n"),
            ("lnkig/.gitignore-target", b"*\n"),
            ("lnkig/seen", b"a symlinked .gitignore is not read\n"),
            ("new\nline", b"x"),
            ("\x1b]0;title\x07", b"x"),
            ("-rf", b"x"),
            (":(glob)*", b"x"),
            ("back\\slash", b"x"),
            ("sp ace/*star", b"x"),
            ("\u{fc}n\u{ef}", b"x"),
        ] {
            put(ws, rel, bytes);
        }
        for repo in ["nested", "holds_repo"] {
            fs::create_dir_all(ws.join(repo).join(".git/refs")).unwrap();
            fs::create_dir_all(ws.join(repo).join(".git/objects")).unwrap();
        }
        fs::create_dir_all(ws.join("empty")).unwrap();
        fs::create_dir_all(ws.join("emptier/a/b")).unwrap();
        fs::remove_dir_all(ws.join("was_dir")).unwrap();
        std::os::unix::fs::symlink("src", ws.join("was_dir")).unwrap();
        std::os::unix::fs::symlink("src", ws.join("lnkdir")).unwrap();
        std::os::unix::fs::symlink(".gitignore-target", ws.join("lnkig/.gitignore")).unwrap();
        fs::remove_file(ws.join("was_file")).unwrap();
        put(ws, "was_file/inner.txt", b"a file became a directory\n");
        let fifo = std::ffi::CString::new(ws.join("pipe").as_os_str().as_bytes()).unwrap();
        // SAFETY: fifo is a valid C string for the call.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);

        let snap = Snapshot::over_base(
            &fx.store,
            ws,
            &fx.scratch(),
            &fx.base,
            SnapshotObjects::Scratch,
        )
        .unwrap();
        let tracked = snap.entries().unwrap();
        let root = beneath::Dir::open(ws).unwrap();
        let ours = snap
            .list_untracked(&root, &tracked, &HashSet::new())
            .unwrap();
        assert!(ours.unlistable.is_empty());
        let theirs: Vec<Vec<u8>> = snap
            .git()
            .args(["ls-files", "-z", "--others", "--exclude-standard"])
            .output()
            .unwrap()
            .split(|b| *b == 0)
            .filter(|p| !p.is_empty())
            .map(<[u8]>::to_vec)
            .collect();
        assert_eq!(shown(&ours.untracked), shown(&theirs));
        // The table holds what it claims: every special case is in it, or rightly not.
        for listed in [
            "nested/",
            "wt/",
            "holds_repo/new",
            "keep.log",
            "was_dir",
            "-rf",
        ] {
            assert!(
                ours.untracked.iter().any(|p| p == listed.as_bytes()),
                "{listed}"
            );
        }
        for absent in [
            "sub/inner.txt",
            "build/new.txt",
            "pipe",
            "x.log",
            ".git/HEAD",
        ] {
            assert!(
                !ours.untracked.iter().any(|p| p == absent.as_bytes()),
                "{absent}"
            );
        }
    }

    /// An inspector that does something to the tree the first time it is asked, then keeps
    /// everything.
    fn meddle(act: impl FnOnce()) -> impl FnMut(Seen<'_>) -> Verdict {
        let mut act = Some(act);
        move |_| {
            if let Some(a) = act.take() {
                a();
            }
            Verdict::Keep
        }
    }

    /// Paths listed, then moved away before they are read (here by the inspector, between two
    /// batches of reads; by a service in the wild): the snapshot refuses, naming the path and
    /// what was seen, where it used to leave them out of the diff without a word.
    #[test]
    fn paths_listed_then_moved_before_they_are_read_refuse_the_snapshot() {
        let mut files: Vec<(String, Vec<u8>)> = (0..PROBE_CHUNK + 10)
            .map(|i| (format!("t/{i:05}"), b"base\n".to_vec()))
            .collect();
        files.push(("a-first".into(), b"base\n".to_vec()));
        let refs: Vec<(&str, &[u8])> = files
            .iter()
            .map(|(p, b)| (p.as_str(), b.as_slice()))
            .collect();
        let fx = Fx::new(&refs, &[]);
        fs::write(fx.ws.join("a-first"), "edited\n").unwrap();
        put(&fx.ws, "zz/new", b"listed, then moved away\n");
        let (from, to) = (fx.ws.join("zz"), fx.ws.join("zz-moved"));
        let mut inspect = meddle(move || fs::rename(from, to).unwrap());
        let e = fx.take(&mut inspect).unwrap_err();
        let said = e.to_string();
        assert!(matches!(e, SnapshotError::Changed { .. }), "{said}");
        assert!(said.starts_with("refusing: the workspace changed while h5i read it (zz/new: a regular file when its directory was listed, beyond something that was not a directory when h5i read it)"), "{said}");
        assert!(
            said.contains("; to fix: stop what writes in the box"),
            "{said}"
        );
    }

    /// A directory replaced (same names, same kinds: every read agrees with the listing) after
    /// it was listed: the final look at every listed directory refuses the snapshot.
    #[test]
    fn a_directory_replaced_after_its_listing_refuses_the_snapshot() {
        let fx = Fx::new(&[("a-first", b"base\n"), ("docs/a.md", b"a\n")], &[]);
        fs::write(fx.ws.join("a-first"), "edited\n").unwrap();
        let ws = fx.ws.clone();
        let mut inspect = meddle(move || {
            fs::rename(ws.join("docs"), ws.join("docs-old")).unwrap();
            put(&ws, "docs/a.md", b"other bytes\n");
        });
        let said = fx.take(&mut inspect).unwrap_err().to_string();
        assert!(
            said.starts_with("refusing: the workspace changed while h5i read it (docs: a directory whose entries were added, removed or renamed while h5i read the tree)")
                || said.starts_with("refusing: the workspace changed while h5i read it (.: "),
            "{said}"
        );
        // Left alone, the same tree is read.
        fs::remove_dir_all(fx.ws.join("docs-old")).unwrap();
        let mut keep = |_: Seen<'_>| Verdict::Keep;
        assert!(fx.take(&mut keep).is_ok());
    }

    /// The swap race against a whole snapshot: pairs of `d<i>/` (tracked `f`, untracked `u`)
    /// and `l<i>` (a symlink to a directory outside holding a canary, a `.git` and a name with
    /// an escape character) trade places as fast as the kernel allows while snapshots are
    /// taken. Each snapshot either refuses as changed, or is of one state of every pair (`d<i>`
    /// the directory: `d<i>/u` and the symlink `l<i>` added; or swapped: `d<i>/f` deleted, the
    /// symlink `d<i>` and `l<i>/f`, `l<i>/u` added), never a mix, never an empty diff, and
    /// nothing from outside is listed or read. The race must have been met (refusals counted).
    #[test]
    fn a_directory_swapped_for_a_symlink_mid_snapshot_is_refused_or_read_whole() {
        use crate::beneath::swap_race::{swapper, SWAP_PAIRS};
        const MIN_REFUSALS: u64 = 20;
        const MAX_TAKES: u64 = 400;
        let outside = tempfile::tempdir().unwrap();
        let canary = format!("H5I-CANARY-{}", std::process::id());
        fs::write(outside.path().join("canary"), &canary).unwrap();
        fs::create_dir(outside.path().join(".git")).unwrap();
        fs::write(outside.path().join("out\u{1b}side"), &canary).unwrap();
        let files: Vec<(String, Vec<u8>)> = (0..SWAP_PAIRS)
            .map(|i| (format!("d{i}/f"), format!("inside {i}\n").into_bytes()))
            .collect();
        let refs: Vec<(&str, &[u8])> = files
            .iter()
            .map(|(p, b)| (p.as_str(), b.as_slice()))
            .collect();
        let fx = Fx::new(&refs, &[]);
        for i in 0..SWAP_PAIRS {
            put(&fx.ws, &format!("d{i}/u"), b"untracked\n");
            std::os::unix::fs::symlink(outside.path(), fx.ws.join(format!("l{i}"))).unwrap();
        }
        let states = |i: usize| {
            let set = |v: &[(&str, u8)]| {
                let mut v: Vec<(String, u8)> = v
                    .iter()
                    .map(|(p, s)| (p.replace('N', &i.to_string()), *s))
                    .collect();
                v.sort();
                v
            };
            [
                set(&[("dN/u", b'A'), ("lN", b'A')]),
                set(&[("dN", b'A'), ("dN/f", b'D'), ("lN/f", b'A'), ("lN/u", b'A')]),
            ]
        };
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let swaps = swapper(&fx.ws, stop.clone());
        let (mut refused, mut whole, mut takes) = (0u64, 0u64, 0u64);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        let mut problems = Vec::new();
        while refused < MIN_REFUSALS && takes < MAX_TAKES && std::time::Instant::now() < deadline {
            takes += 1;
            let mut keep = |_: Seen<'_>| Verdict::Keep;
            let snap = match fx.take(&mut keep) {
                Err(SnapshotError::Changed { .. }) => {
                    refused += 1;
                    continue;
                }
                Err(e) => panic!("{e}"),
                Ok(s) => s,
            };
            whole += 1;
            let changes = snap.changes_against(&fx.base).unwrap();
            for i in 0..SWAP_PAIRS {
                let (d, l) = (format!("d{i}"), format!("l{i}"));
                let mut got: Vec<(String, u8)> = changes
                    .iter()
                    .map(|c| (String::from_utf8_lossy(&c.path).into_owned(), c.status))
                    .filter(|(p, _)| {
                        p == &d
                            || p == &l
                            || p.starts_with(&format!("{d}/"))
                            || p.starts_with(&format!("{l}/"))
                    })
                    .collect();
                got.sort();
                if !states(i).contains(&got) {
                    problems.push(format!("pair {i}: {got:?}"));
                }
            }
            let patch = snap.patch(&fx.base).unwrap();
            if patch.windows(canary.len()).any(|w| w == canary.as_bytes())
                || patch.windows(3).any(|w| w == b"out")
            {
                problems.push("the outside directory reached the patch".into());
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let swaps = swaps.join().unwrap();
        eprintln!(
            "{swaps} swaps over {takes} snapshots: {refused} refused as changed, {whole} read whole"
        );
        assert!(problems.is_empty(), "{problems:?}");
        assert!(
            refused >= MIN_REFUSALS,
            "the race was not met: {refused} of {takes} snapshots refused ({swaps} swaps)"
        );
    }

    #[test]
    fn skip_prefixes_cover_what_is_beneath() {
        let set: HashSet<&[u8]> = [b"a/b".as_slice()].into_iter().collect();
        assert!(under_any(b"a/b", &set));
        assert!(under_any(b"a/b/c", &set));
        assert!(!under_any(b"a/bc", &set));
        assert!(!under_any(b"a", &set));
    }
}
