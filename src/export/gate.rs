//! The export gate: what may leave a box, decided path by path, and never silently.
//!
//! Owns the checks every changed path passes before it can reach `patch.diff` (and, through
//! `box apply`, the parent): symlinks whose target is absolute, escapes the tree (resolved
//! lexically, following in-tree symlinks, at most [`SYMLINK_HOPS`] hops) or points into a `.git`;
//! nested `.git` directories and files anywhere below the root (found by walking the workspace,
//! so they are reported even where git skips them); gitlinks the box added or changed; paths with
//! a `.`/`..` component, an absolute path, a component git or another platform reads as `.git`
//! (`.GIT`, `.git.`, `.git `, `git~1`, HFS-ignorable code points), a backslash or a control
//! character; files over the per-file cap ([`ExportCaps::per_file`]); files whose name or content
//! matches the [`Redactor`]. Each is excluded (reset to the base) and reported as an
//! [`Exclusion`], with its path passed through the redactor. Then the whole patch is scanned again
//! and, if it still matches, the export is refused naming rule ids only; a patch over
//! [`ExportCaps::patch`] is refused too.
//!
//! A set-id file anywhere in the workspace (found by the walk, or by the snapshot's `fstat`)
//! refuses the whole export, naming every one: the host would run it as its owner.
//!
//! Must never: let a value the redactor knows reach an exclusion, an error or the patch; follow a
//! symlink out of the workspace while resolving one; drop a path without reporting it; let a
//! set-id file through.
//!
//! Guarded by the unit tests below and the hostile-tree table in `tests/export_gate.rs`.

use std::cell::RefCell;
use std::collections::{HashSet, VecDeque};
use std::fmt;
use std::path::Path;

use h5i_broker::redact::Redactor;
use serde::Serialize;

use super::ExportError;
use crate::beneath;
pub use crate::escape::escape_controls;
use crate::escape::is_control;
use crate::snapshot::{mode, Content, Seen, Snapshot, SnapshotObjects, TakeOptions, Verdict};

/// How many symlinks a target may pass through before it is called a loop (Linux's own limit).
pub const SYMLINK_HOPS: usize = 40;

/// Size limits on what an export writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExportCaps {
    /// Largest file that may be in the patch, bytes. Bigger files are excluded and reported.
    pub per_file: u64,
    /// Largest `patch.diff`, bytes. A bigger patch refuses the export.
    pub patch: u64,
    /// Largest `report.md`, bytes. The agent's proposal is cut first; the safety sections never.
    pub report: usize,
    /// Largest `receipt.json`, bytes. A bigger receipt refuses the export.
    pub receipt: usize,
}

impl Default for ExportCaps {
    fn default() -> Self {
        ExportCaps {
            per_file: 64 << 20,
            patch: 512 << 20,
            report: 4 << 20,
            receipt: 64 << 20,
        }
    }
}

/// One path kept out of the patch, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Exclusion {
    /// The path for display: lossy UTF-8, redacted, control characters escaped.
    pub path: String,
    /// Why it was kept out.
    pub reason: ExclusionReason,
}

/// Why a path was kept out of the patch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum ExclusionReason {
    /// A symlink with an absolute target.
    SymlinkAbsolute {
        /// The target, for display.
        target: String,
    },
    /// A symlink whose target leaves the tree.
    SymlinkEscapes {
        /// The target, for display.
        target: String,
    },
    /// A symlink that passes through more than [`SYMLINK_HOPS`] symlinks.
    SymlinkLoop {
        /// The target, for display.
        target: String,
    },
    /// A symlink that points into a `.git` directory.
    SymlinkIntoGit {
        /// The target, for display.
        target: String,
    },
    /// A nested `.git` below the workspace root.
    NestedGit {
        /// `directory`, `file` or `symlink`.
        entry: &'static str,
    },
    /// A gitlink the box added or changed (or a nested repository git would record as one).
    Gitlink {
        /// What the box did.
        detail: &'static str,
    },
    /// A path that must not be written on a reviewer's machine.
    UnsafePath {
        /// What is wrong with it.
        problem: &'static str,
    },
    /// A file over the per-file cap.
    TooLarge {
        /// Its size, bytes.
        size: u64,
        /// The cap, bytes.
        cap: u64,
    },
    /// The path's name matches a redaction rule.
    SecretInName {
        /// The rule ids (never the value).
        rules: Vec<String>,
    },
    /// The file's content matches a redaction rule.
    SecretInContent {
        /// The rule ids (never the value).
        rules: Vec<String>,
    },
    /// Not a regular file, symlink or directory.
    NotAFile {
        /// What it is.
        what: &'static str,
    },
    /// It could not be read, so it could not be checked.
    Unreadable {
        /// The OS error.
        error: String,
    },
}

impl fmt::Display for ExclusionReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExclusionReason::SymlinkAbsolute { target } => {
                write!(f, "symlink to an absolute path ({target})")
            }
            ExclusionReason::SymlinkEscapes { target } => {
                write!(f, "symlink that escapes the tree ({target})")
            }
            ExclusionReason::SymlinkLoop { target } => write!(
                f,
                "symlink through more than {SYMLINK_HOPS} symlinks ({target})"
            ),
            ExclusionReason::SymlinkIntoGit { target } => {
                write!(f, "symlink into a .git directory ({target})")
            }
            ExclusionReason::NestedGit { entry } => write!(f, "nested .git {entry}"),
            ExclusionReason::Gitlink { detail } => write!(f, "gitlink: {detail}"),
            ExclusionReason::UnsafePath { problem } => write!(f, "unsafe path: {problem}"),
            ExclusionReason::TooLarge { size, cap } => {
                write!(f, "{size} bytes, over the {cap}-byte per-file cap")
            }
            ExclusionReason::SecretInName { rules } => {
                write!(f, "name matches redaction rule(s) {}", rules.join(", "))
            }
            ExclusionReason::SecretInContent { rules } => {
                write!(f, "content matches redaction rule(s) {}", rules.join(", "))
            }
            ExclusionReason::NotAFile { what } => write!(f, "a {what}, which git cannot hold"),
            ExclusionReason::Unreadable { error } => {
                write!(f, "unreadable, so unchecked ({error})")
            }
        }
    }
}

/// The patch that may leave, and everything that was kept out of it.
#[derive(Debug, Clone)]
pub struct GatedPatch {
    /// `patch.diff`: applies with `git apply --3way` onto the base.
    pub patch: Vec<u8>,
    /// Every path kept out, sorted by display path.
    pub excluded: Vec<Exclusion>,
    /// Files the patch touches.
    pub files_changed: usize,
    /// Lines added.
    pub insertions: usize,
    /// Lines removed.
    pub deletions: usize,
    /// Files carried as binary patches.
    pub binary_files: usize,
}

/// What [`ExportGate::take`] learnt, for [`ExportGate::check`].
#[derive(Debug, Default)]
struct Memo {
    walked: bool,
    inspected: HashSet<String>,
    found: Found,
}

/// Decides what of a box's workspace may leave it.
#[derive(Debug)]
pub struct ExportGate<'r> {
    redactor: &'r Redactor,
    caps: ExportCaps,
    memo: RefCell<Memo>,
}

impl<'r> ExportGate<'r> {
    /// A gate scrubbing with `redactor`, within `caps`.
    pub fn new(redactor: &'r Redactor, caps: ExportCaps) -> Self {
        ExportGate {
            redactor,
            caps,
            memo: RefCell::new(Memo::default()),
        }
    }

    /// Snapshot `workspace` with every check applied as files are read: paths that must not
    /// leave are never staged, files over the cap are never read, and every blob staged has been
    /// scanned. Follow with [`ExportGate::check`] on the result.
    pub fn take(
        &self,
        store_git_dir: &Path,
        workspace: &Path,
        scratch: &Path,
        base: &str,
        objects: SnapshotObjects,
    ) -> Result<Snapshot, ExportError> {
        // git reads .gitignore and friends itself while listing the tree; a fifo there would
        // hang it, so those are checked from directory fds before git starts.
        if let Ok(scan) = crate::bounded::scan_tree(workspace, self.caps.per_file) {
            if let Some(f) = scan.blocks_git().next() {
                return Err(ExportError::GitWouldBlock {
                    what: format!("{}: {}", crate::escape::bytes(&f.path), f.what),
                });
            }
        }
        let (mut found, skip, walked_setid) = walk_workspace(workspace)?;
        let mut inspected = HashSet::new();
        let mut setid: Vec<String> = walked_setid
            .iter()
            .map(|p| display_text(self.redactor, p))
            .collect();
        let mut inspect = |seen: Seen<'_>| -> Verdict {
            if let Seen::SetId { path, .. } = seen {
                setid.push(display_text(self.redactor, path));
                return Verdict::Skip;
            }
            match self.judge(workspace, seen) {
                Judged::Keep(sha) => {
                    if let Some(sha) = sha {
                        inspected.insert(sha);
                    }
                    Verdict::Keep
                }
                Judged::Exclude(path, reason) => {
                    found.push((path, reason));
                    Verdict::Skip
                }
            }
        };
        let snap = Snapshot::take_with(
            store_git_dir,
            workspace,
            scratch,
            base,
            TakeOptions::new(objects)
                .skip(skip)
                .max_file_size(self.caps.per_file)
                .inspect(&mut inspect),
        )?;
        if !setid.is_empty() {
            setid.sort();
            setid.dedup();
            return Err(ExportError::SetId { paths: setid });
        }
        *self.memo.borrow_mut() = Memo {
            walked: true,
            inspected,
            found,
        };
        Ok(snap)
    }

    /// Check `snap` against `base`: exclude (reset to the base) every changed path that must not
    /// leave, then write the patch, refusing it if it is over the cap or still matches the
    /// redactor. Works on any snapshot; one from [`ExportGate::take`] skips the work already done.
    pub fn check(
        &self,
        snap: &Snapshot,
        workspace: &Path,
        base: &str,
    ) -> Result<GatedPatch, ExportError> {
        let memo = self.memo.take();
        let mut found = memo.found;
        if !memo.walked {
            let (more, _, setid) = walk_workspace(workspace)?;
            if !setid.is_empty() {
                return Err(ExportError::SetId {
                    paths: setid
                        .iter()
                        .map(|p| display_text(self.redactor, p))
                        .collect(),
                });
            }
            found.extend(more);
        }
        let changes = snap.changes_against(base)?;
        let mut exclude: Vec<Vec<u8>> = Vec::new();
        let mut unread: Vec<String> = Vec::new();
        let mut unread_paths: Vec<(String, Vec<u8>, u32)> = Vec::new();
        for c in &changes {
            if c.old_mode == mode::GITLINK || c.new_mode == mode::GITLINK {
                found.push((
                    c.path.clone(),
                    ExclusionReason::Gitlink {
                        detail: "the box added or changed a gitlink",
                    },
                ));
                exclude.push(c.path.clone());
                continue;
            }
            if !c.is_present() {
                continue;
            }
            if let Some(reason) = self.path_reason(&c.path, c.new_mode == mode::SYMLINK) {
                found.push((c.path.clone(), reason));
                exclude.push(c.path.clone());
                continue;
            }
            if !memo.inspected.contains(&c.new_sha) {
                if !unread.contains(&c.new_sha) {
                    unread.push(c.new_sha.clone());
                }
                unread_paths.push((c.new_sha.clone(), c.path.clone(), c.new_mode));
            }
        }
        if !unread.is_empty() {
            let blobs = snap.read_blobs(&unread)?;
            for (sha, path, m) in &unread_paths {
                let Some((_, bytes)) = blobs.iter().find(|(s, _)| s == sha) else {
                    continue;
                };
                let seen = if *m == mode::SYMLINK {
                    Seen::Symlink {
                        path,
                        sha,
                        target: bytes,
                    }
                } else if bytes.len() as u64 > self.caps.per_file {
                    Seen::TooLarge {
                        path,
                        size: bytes.len() as u64,
                    }
                } else {
                    Seen::File {
                        path,
                        sha,
                        executable: *m == mode::EXECUTABLE,
                        content: Content::Bytes(bytes),
                    }
                };
                if let Judged::Exclude(p, reason) = self.judge(workspace, seen) {
                    exclude.push(p.clone());
                    found.push((p, reason));
                }
            }
        }
        // Everything found is reset to the base, with what is beneath it: a directory the box
        // replaced with an escaping symlink keeps the base's files rather than losing them.
        exclude.extend(found.iter().map(|(p, _)| p.clone()));
        exclude.sort();
        exclude.dedup();
        snap.exclude_many(&exclude)?;
        let patch = snap.patch(base)?;
        if patch.len() as u64 > self.caps.patch {
            return Err(ExportError::PatchTooLarge {
                size: patch.len() as u64,
                cap: self.caps.patch,
            });
        }
        let rules = self.redactor.matches(&patch);
        if !rules.is_empty() {
            return Err(ExportError::SecretInPatch { rules });
        }
        let counts = count_patch(&patch);
        let mut excluded: Vec<Exclusion> = found
            .into_iter()
            .map(|(p, reason)| Exclusion {
                path: display_text(self.redactor, &p),
                reason,
            })
            .collect();
        excluded.sort_by(|a, b| a.path.cmp(&b.path));
        excluded.dedup();
        Ok(GatedPatch {
            patch,
            excluded,
            files_changed: counts.files,
            insertions: counts.insertions,
            deletions: counts.deletions,
            binary_files: counts.binary,
        })
    }

    /// [`ExportGate::take`] then [`ExportGate::check`], in scratch.
    pub fn run(
        &self,
        store_git_dir: &Path,
        workspace: &Path,
        scratch: &Path,
        base: &str,
    ) -> Result<GatedPatch, ExportError> {
        let snap = self.take(
            store_git_dir,
            workspace,
            scratch,
            base,
            SnapshotObjects::Scratch,
        )?;
        self.check(&snap, workspace, base)
    }

    /// Whether a path's name keeps it out (unsafe, or naming a secret).
    fn path_reason(&self, path: &[u8], symlink: bool) -> Option<ExclusionReason> {
        if let Some(problem) = path_problem(path, symlink) {
            return Some(ExclusionReason::UnsafePath { problem });
        }
        let rules = self.redactor.matches(path);
        if !rules.is_empty() {
            return Some(ExclusionReason::SecretInName { rules });
        }
        None
    }

    fn judge(&self, workspace: &Path, seen: Seen<'_>) -> Judged {
        let out = |p: &[u8], r| Judged::Exclude(p.to_vec(), r);
        match seen {
            Seen::File {
                path, sha, content, ..
            } => {
                if let Some(r) = self.path_reason(path, false) {
                    return out(path, r);
                }
                // The redactor looks at the whole file at once: read back from the spool, within
                // the per-file cap the snapshot already applied.
                let rules = match content.bytes() {
                    Ok(bytes) => self.redactor.matches(&bytes),
                    Err(e) => {
                        return out(
                            path,
                            ExclusionReason::Unreadable {
                                error: e.to_string(),
                            },
                        )
                    }
                };
                if !rules.is_empty() {
                    return out(path, ExclusionReason::SecretInContent { rules });
                }
                Judged::Keep(Some(sha.to_string()))
            }
            Seen::Symlink { path, sha, target } => {
                if let Some(r) = self.path_reason(path, true) {
                    return out(path, r);
                }
                let rules = self.redactor.matches(target);
                if !rules.is_empty() {
                    return out(path, ExclusionReason::SecretInContent { rules });
                }
                if let Some(r) = symlink_problem(workspace, path, target, self.redactor) {
                    return out(path, r);
                }
                Judged::Keep(Some(sha.to_string()))
            }
            Seen::TooLarge { path, size } => out(
                path,
                ExclusionReason::TooLarge {
                    size,
                    cap: self.caps.per_file,
                },
            ),
            Seen::Special { path, kind } => out(path, ExclusionReason::NotAFile { what: kind }),
            Seen::Unreadable { path, error } => out(
                path,
                ExclusionReason::Unreadable {
                    error: error.to_string(),
                },
            ),
            Seen::NestedRepository { path } => out(
                path,
                ExclusionReason::Gitlink {
                    detail:
                        "a nested repository the box created (git would record it as a gitlink)",
                },
            ),
            // `take` refuses the whole snapshot before a set-id file could reach here.
            Seen::SetId { path, .. } => out(
                path,
                ExclusionReason::NotAFile {
                    what: "set-id file",
                },
            ),
            Seen::GitlinkReplaced { path } => out(
                path,
                ExclusionReason::Gitlink {
                    detail: "the box replaced a submodule of the base; the base's gitlink is kept",
                },
            ),
        }
    }
}

/// Paths kept out, with why.
type Found = Vec<(Vec<u8>, ExclusionReason)>;

/// What the workspace walk found: paths kept out, paths the snapshot must skip, set-id files.
type Walked = (Found, Vec<Vec<u8>>, Vec<Vec<u8>>);

enum Judged {
    Keep(Option<String>),
    Exclude(Vec<u8>, ExclusionReason),
}

/// Walk the whole workspace (every directory, ignored or not) for nested `.git` entries, names
/// that must not be written elsewhere, and set-id files. Every directory is opened beneath the
/// workspace's descriptor with no symlink followed on its path ([`beneath::Dir::subdir`]) and
/// listed from its own descriptor, so a directory swapped for a symlink between its listing and
/// its descent is met as the symlink (and kept out), never walked through. Returns what it
/// found, the paths the snapshot must leave at base, and the set-id files.
fn walk_workspace(workspace: &Path) -> Result<Walked, ExportError> {
    let root = beneath::Dir::open(workspace).map_err(|source| ExportError::Workspace {
        path: workspace.to_path_buf(),
        source,
    })?;
    let mut found = Vec::new();
    let mut skip = Vec::new();
    let mut setid = Vec::new();
    let mut stack: Vec<Vec<u8>> = vec![Vec::new()];
    while let Some(rel) = stack.pop() {
        let listed = root.subdir(&rel).and_then(|dir| {
            dir.entries(crate::bounded::SCAN_MAX_ENTRIES)
                .map(|e| (dir, e))
        });
        let (dir, names) = match listed {
            Ok((dir, (names, false))) => (dir, names),
            Ok((_, (_, true))) => {
                found.push((
                    rel.clone(),
                    ExclusionReason::Unreadable {
                        error: format!(
                            "more than {} entries in one directory",
                            crate::bounded::SCAN_MAX_ENTRIES
                        ),
                    },
                ));
                skip.push(rel);
                continue;
            }
            Err(source) if rel.is_empty() => {
                return Err(ExportError::Workspace {
                    path: workspace.to_path_buf(),
                    source,
                })
            }
            Err(e) => {
                let error = if matches!(e.raw_os_error(), Some(libc::ELOOP) | Some(libc::ENOTDIR)) {
                    "it was replaced while h5i was reading it (never followed)".to_string()
                } else {
                    e.to_string()
                };
                found.push((rel.clone(), ExclusionReason::Unreadable { error }));
                skip.push(rel);
                continue;
            }
        };
        for name in names {
            let mut child = rel.clone();
            if !child.is_empty() {
                child.push(b'/');
            }
            child.extend_from_slice(&name);
            // An lstat from the directory's descriptor: a symlink is never followed to its
            // target's mode.
            let Ok(st) = dir.stat_at(&name) else {
                continue;
            };
            if st.is_setid_file() {
                setid.push(child.clone());
            }
            if name == b".git" {
                if !rel.is_empty() {
                    let entry = if st.is_dir() {
                        "directory"
                    } else if st.is_symlink() {
                        "symlink"
                    } else {
                        "file"
                    };
                    found.push((child.clone(), ExclusionReason::NestedGit { entry }));
                    skip.push(child);
                }
                continue;
            }
            if let Some(problem) = name_problem(&name, st.is_symlink()) {
                found.push((child.clone(), ExclusionReason::UnsafePath { problem }));
                skip.push(child);
                continue;
            }
            if st.is_dir() {
                stack.push(child);
            }
        }
    }
    Ok((found, skip, setid))
}

/// What is wrong with a whole path, if anything.
pub fn path_problem(path: &[u8], symlink: bool) -> Option<&'static str> {
    if path.is_empty() {
        return Some("an empty path");
    }
    if path[0] == b'/' {
        return Some("an absolute path");
    }
    let parts: Vec<&[u8]> = path.split(|b| *b == b'/').collect();
    let last = parts.len() - 1;
    for (i, part) in parts.iter().enumerate() {
        if *part == b".git" {
            return Some("a `.git` component");
        }
        if let Some(p) = name_problem(part, symlink && i == last) {
            return Some(p);
        }
    }
    None
}

/// What is wrong with one path component, if anything (an exact `.git` is the caller's call).
pub fn name_problem(name: &[u8], symlink: bool) -> Option<&'static str> {
    if name.is_empty() {
        return Some("an empty component");
    }
    if name == b"." || name == b".." {
        return Some("a `.` or `..` component");
    }
    if has_control(name) {
        return Some("a control character in a name");
    }
    if name.contains(&b'\\') {
        return Some("a backslash (a directory separator on Windows)");
    }
    if is_dotgit(name) {
        return Some("a name another platform reads as `.git` (case, trailing dots or spaces, `git~1`, ignorable Unicode)");
    }
    if symlink && is_git_control_file(name) {
        return Some(
            "a symlinked .gitattributes, .gitignore, .gitmodules or .mailmap (git refuses them)",
        );
    }
    None
}

/// Control characters a terminal acts on, and the Unicode ones that reorder or hide text.
fn has_control(bytes: &[u8]) -> bool {
    bytes.iter().any(|b| *b < 0x20 || *b == 0x7f)
        || String::from_utf8_lossy(bytes).chars().any(is_control)
}

/// Code points HFS+ ignores when comparing names (git's `is_hfs_dotgit` list).
fn hfs_ignorable(c: char) -> bool {
    matches!(
        c,
        '\u{200c}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{206a}'..='\u{206f}' | '\u{feff}'
    )
}

/// Whether a name is `.git` to git on some platform: any case, NTFS trailing dots and spaces or
/// stream suffix, the 8.3 short name `git~1`, or HFS-ignorable code points inside.
fn is_dotgit(name: &[u8]) -> bool {
    let folded: String = String::from_utf8_lossy(name)
        .chars()
        .filter(|c| !hfs_ignorable(*c))
        .collect::<String>()
        .to_ascii_lowercase();
    let stem = folded.split(':').next().unwrap_or_default();
    let trimmed = stem.trim_end_matches(['.', ' ']);
    trimmed == ".git" || trimmed == "git~1"
}

fn is_git_control_file(name: &[u8]) -> bool {
    let lower = String::from_utf8_lossy(name).to_ascii_lowercase();
    let trimmed = lower.trim_end_matches(['.', ' ']);
    matches!(
        trimmed,
        ".gitattributes" | ".gitignore" | ".gitmodules" | ".mailmap"
    )
}

/// Resolve a symlink's target lexically from the link's directory, following symlinks inside
/// the workspace as they are met; report a target that is absolute, leaves the tree, enters a
/// `.git`, or loops. `link` is the symlink's path relative to `workspace`.
pub fn symlink_problem(
    workspace: &Path,
    link: &[u8],
    target: &[u8],
    redactor: &Redactor,
) -> Option<ExclusionReason> {
    let shown = || display_text(redactor, target);
    if has_control(target) {
        return Some(ExclusionReason::UnsafePath {
            problem: "a control character in a symlink target",
        });
    }
    if target.first() == Some(&b'/') {
        return Some(ExclusionReason::SymlinkAbsolute { target: shown() });
    }
    let Ok(root) = beneath::Dir::open(workspace) else {
        return Some(ExclusionReason::SymlinkEscapes { target: shown() });
    };
    let mut stack: Vec<&[u8]> = link.split(|b| *b == b'/').collect();
    stack.pop();
    let mut stack: Vec<Vec<u8>> = stack.into_iter().map(<[u8]>::to_vec).collect();
    let mut queue: VecDeque<Vec<u8>> = target.split(|b| *b == b'/').map(<[u8]>::to_vec).collect();
    let mut hops = 0;
    while let Some(part) = queue.pop_front() {
        if part.is_empty() || part == b"." {
            continue;
        }
        if part == b".." {
            if stack.pop().is_none() {
                return Some(ExclusionReason::SymlinkEscapes { target: shown() });
            }
            continue;
        }
        if part == b".git" || is_dotgit(&part) {
            return Some(ExclusionReason::SymlinkIntoGit { target: shown() });
        }
        // Looked at from the workspace's descriptor, no symlink followed on the way: every
        // component before this one was found not to be a symlink, so one that is now was
        // swapped in, and the target is refused rather than resolved through it.
        let parent = stack.join(&b'/');
        let look = root
            .subdir(&parent)
            .and_then(|dir| dir.stat_at(&part).map(|st| (dir, st)));
        stack.push(part);
        let (dir, st) = match look {
            Ok(found) => found,
            Err(e) if matches!(e.raw_os_error(), Some(libc::ELOOP) | Some(libc::ENOTDIR)) => {
                return Some(ExclusionReason::SymlinkEscapes { target: shown() })
            }
            Err(_) => continue,
        };
        if !st.is_symlink() {
            continue;
        }
        hops += 1;
        if hops > SYMLINK_HOPS {
            return Some(ExclusionReason::SymlinkLoop { target: shown() });
        }
        let Some(name) = stack.last() else {
            continue;
        };
        let Ok(next) = dir.readlink_at(name) else {
            return Some(ExclusionReason::SymlinkEscapes { target: shown() });
        };
        if next.first() == Some(&b'/') {
            return Some(ExclusionReason::SymlinkEscapes { target: shown() });
        }
        stack.pop();
        for p in next.split(|b| *b == b'/').rev() {
            queue.push_front(p.to_vec());
        }
    }
    None
}

/// Box-supplied bytes for display: lossy UTF-8, redacted, then control characters escaped (so a
/// secret with a control character in it is still redacted whole).
pub fn display_text(redactor: &Redactor, bytes: &[u8]) -> String {
    let (redacted, _) = redactor.redact(&String::from_utf8_lossy(bytes));
    escape_controls(&redacted)
}

struct PatchCounts {
    files: usize,
    insertions: usize,
    deletions: usize,
    binary: usize,
}

/// Count files, added and removed lines, and binary files in a git patch.
fn count_patch(patch: &[u8]) -> PatchCounts {
    let mut c = PatchCounts {
        files: 0,
        insertions: 0,
        deletions: 0,
        binary: 0,
    };
    let mut in_hunk = false;
    for line in patch.split(|b| *b == b'\n') {
        if line.starts_with(b"diff --git ") {
            c.files += 1;
            in_hunk = false;
        } else if line.starts_with(b"@@ ") {
            in_hunk = true;
        } else if line.starts_with(b"GIT binary patch") {
            c.binary += 1;
            in_hunk = false;
        } else if in_hunk {
            match line.first() {
                Some(b'+') => c.insertions += 1,
                Some(b'-') => c.deletions += 1,
                _ => {}
            }
        }
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::beneath::swap_race::{swapper, SWAP_PAIRS};
    use h5i_broker::redact::SecretValue;
    use std::fs;

    /// The swap race against the workspace walk: [`SWAP_PAIRS`](crate::beneath::swap_race::SWAP_PAIRS) pairs of `d<i>/` (a real
    /// directory) and `l<i>` (a symlink to a directory outside holding a `.git` and a name with
    /// a control character) trade places as fast as the kernel allows while the walk runs, over
    /// and over. Many pairs make the race window wide: the walk lists the root (one `lstat` per
    /// name) and descends into each directory it saw much later, so a swap anywhere in between
    /// is met at the descent. Whatever it meets, the walk never lists the outside directory:
    /// nothing from it (`.git` under a pair, the bad name) is ever reported. The test insists
    /// the race happened: the walk must have met a swapped-in symlink where it had seen a
    /// directory at least [`MIN_RACES`] times (it walks until then, bounded), and says how often.
    #[test]
    fn a_directory_swapped_for_a_symlink_mid_walk_is_never_walked_through() {
        /// How many times the walk must have met the swap before the test believes it ran.
        const MIN_RACES: u64 = 200;
        const MAX_WALKS: u64 = 200_000;
        let ws = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        fs::create_dir(outside.path().join(".git")).unwrap();
        fs::write(outside.path().join("out\u{1b}side"), b"x").unwrap();
        for i in 0..SWAP_PAIRS {
            fs::create_dir(ws.path().join(format!("d{i}"))).unwrap();
            fs::write(ws.path().join(format!("d{i}/inside")), b"x").unwrap();
            std::os::unix::fs::symlink(outside.path(), ws.path().join(format!("l{i}"))).unwrap();
        }
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let swaps = swapper(ws.path(), stop.clone());
        let mut leaks = Vec::new();
        let mut races = 0;
        let mut walks = 0;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        while races < MIN_RACES && walks < MAX_WALKS && std::time::Instant::now() < deadline {
            walks += 1;
            let (found, _, _) = walk_workspace(ws.path()).unwrap();
            for (path, reason) in found {
                if path.ends_with(b"/.git") || path.windows(3).any(|w| w == b"out") {
                    leaks.push(String::from_utf8_lossy(&path).into_owned());
                } else if let ExclusionReason::Unreadable { error } = reason {
                    assert!(error.contains("replaced"), "{error}");
                    races += 1;
                }
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let swaps = swaps.join().unwrap();
        eprintln!(
            "{swaps} swaps over {walks} walks; the walk met a directory swapped for a symlink \
             {races} times"
        );
        assert!(
            leaks.is_empty(),
            "the walk listed the directory behind a swapped-in symlink: {leaks:?}"
        );
        assert!(
            races >= MIN_RACES,
            "the race was not exercised: the walk met a swapped directory {races} times in \
             {walks} walks ({swaps} swaps), fewer than {MIN_RACES}"
        );
    }

    #[test]
    fn names_git_reads_as_dotgit_are_unsafe() {
        for bad in [
            ".GIT",
            ".Git",
            ".git.",
            ".git ",
            ".git. .",
            "git~1",
            "GIT~1",
            ".git::$INDEX_ALLOCATION",
            ".g\u{200c}it",
        ] {
            assert!(name_problem(bad.as_bytes(), false).is_some(), "{bad:?}");
        }
        for fine in [
            ".gitx",
            "..x",
            "x..",
            ".github",
            "git",
            "a.git",
            ".gitignore",
        ] {
            assert!(name_problem(fine.as_bytes(), false).is_none(), "{fine:?}");
        }
        assert!(name_problem(b".gitignore", true).is_some());
        assert!(name_problem(b"a\x1bb", false).is_some());
        assert!(name_problem("a\u{202e}b".as_bytes(), false).is_some());
        assert!(name_problem(b"a\\..\\b", false).is_some());
    }

    #[test]
    fn whole_paths_are_checked_component_by_component() {
        assert_eq!(
            path_problem(b"/etc/passwd", false),
            Some("an absolute path")
        );
        assert_eq!(
            path_problem(b"a/.git/config", false),
            Some("a `.git` component")
        );
        assert!(path_problem(b"a/../b", false).is_some());
        assert!(path_problem(b"a//b", false).is_some());
        assert!(path_problem(b"a/..x/b", false).is_none());
    }

    #[test]
    fn symlinks_resolve_lexically_through_in_tree_links() {
        let d = tempfile::tempdir().unwrap();
        let ws = d.path();
        let r = Redactor::default();
        fs::create_dir_all(ws.join("sub/deeper")).unwrap();
        std::os::unix::fs::symlink("../..", ws.join("sub/up")).unwrap();
        std::os::unix::fs::symlink("sub/up", ws.join("chain")).unwrap();
        std::os::unix::fs::symlink("loop2", ws.join("loop1")).unwrap();
        std::os::unix::fs::symlink("loop1", ws.join("loop2")).unwrap();
        let p =
            |link: &str, target: &str| symlink_problem(ws, link.as_bytes(), target.as_bytes(), &r);
        assert!(p("x", "sub/deeper").is_none());
        assert!(p("sub/x", "../sub/deeper/../deeper").is_none());
        assert!(p("sub/deeper/x", "../../a").is_none());
        assert!(matches!(
            p("x", "/etc"),
            Some(ExclusionReason::SymlinkAbsolute { .. })
        ));
        assert!(matches!(
            p("x", "../etc"),
            Some(ExclusionReason::SymlinkEscapes { .. })
        ));
        assert!(matches!(
            p("x", "chain"),
            Some(ExclusionReason::SymlinkEscapes { .. })
        ));
        assert!(matches!(
            p("x", "chain/etc"),
            Some(ExclusionReason::SymlinkEscapes { .. })
        ));
        assert!(matches!(
            p("x", "loop1"),
            Some(ExclusionReason::SymlinkLoop { .. })
        ));
        assert!(matches!(
            p("x", ".git/hooks"),
            Some(ExclusionReason::SymlinkIntoGit { .. })
        ));
        assert!(matches!(
            p("x", "sub/.GIT"),
            Some(ExclusionReason::SymlinkIntoGit { .. })
        ));
    }

    #[test]
    fn displayed_paths_are_redacted_then_escaped() {
        let r = Redactor::new(vec![SecretValue::new("secret:K", "s3cr\x1bt")]);
        let shown = display_text(&r, b"dir/s3cr\x1bt\x1b[2J.txt");
        assert_eq!(shown, "dir/[REDACTED:secret:K]\\x1b[2J.txt");
    }

    #[test]
    fn patch_counts_ignore_headers_and_binary_bodies() {
        let patch = b"diff --git a/x b/x\nindex 1..2 100644\n--- a/x\n+++ b/x\n@@ -1,2 +1,2 @@\n-old\n+new\n ctx\n--- not a header\ndiff --git a/y b/y\nGIT binary patch\nliteral 3\nKcmZ?l\n";
        let c = count_patch(patch);
        assert_eq!((c.files, c.insertions, c.deletions, c.binary), (2, 1, 2, 1));
    }
}
