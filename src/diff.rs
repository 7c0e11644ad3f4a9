//! `h5i box diff NAME`: what changed against the pinned base, as git would show it.
//!
//! Owns printing the same tree the export gate starts from (a snapshot of the workspace against
//! the pinned base, built in host-private scratch), and [`snapshot_bounded`], the bounded
//! snapshot every host verb that only looks (`diff`, `rm`'s has-changes check) takes: the
//! workspace is scanned first ([`crate::bounded::scan_tree`]: set-id files, fifos, devices, a
//! `.gitignore` git would block on or read whole), no file over the export per-file cap is read,
//! and nothing that is not a regular file is opened; what was left unread is returned, to be
//! named in the verb's output. The box wrote those bytes, and they go to the user's terminal:
//! every line is redacted and escaped.
//!
//! The tree is read as export reads it: under the box's lock taken exclusively (refused, not
//! waited for, while a run or shell is live) with every service frozen (`crate::freeze`).
//!
//! Must never: read a tree a run, shell or live service can change while it is read, read the
//! box's own index or config, write objects into the parent repository,
//! read a file over the cap or a non-regular file, drop a skipped path without naming it, or
//! print a raw box byte below 0x20.

use std::io::Write;

use crate::bounded::{scan_tree, TreeScan};
use crate::error::BoxError;
use crate::export::ExportCaps;
use crate::snapshot::{Seen, Snapshot, SnapshotObjects, TakeOptions, Verdict};
use crate::store::{BoxStore, StoredBox};

/// What a bounded snapshot did not read, and what the scan found: every entry is named in the
/// verb's output.
#[derive(Debug, Default)]
pub struct Unread {
    /// The workspace scan (set-id files, special files, early stops).
    pub scan: TreeScan,
    /// Paths the snapshot skipped, with why (escaped).
    pub skipped: Vec<String>,
}

impl Unread {
    /// One escaped line per finding and skipped path.
    pub fn lines(&self) -> Vec<String> {
        let mut out = self.scan.lines();
        out.extend(self.skipped.iter().cloned());
        out
    }
}

/// A snapshot of the box's workspace that reads nothing unbounded (see the module doc). A
/// file git itself would block on or read whole refuses it, naming the file.
pub fn snapshot_bounded(sb: &StoredBox) -> Result<(Snapshot, Unread), BoxError> {
    let ws = sb.paths.workspace();
    let cap = ExportCaps::default().per_file;
    let scan = scan_tree(&ws, cap).map_err(|skip| BoxError::HostileWorkspace {
        name: sb.manifest.name.clone(),
        what: format!("its root, which is {skip}"),
    })?;
    if let Some(f) = scan.blocks_git().next() {
        return Err(BoxError::HostileWorkspace {
            name: sb.manifest.name.clone(),
            what: format!("{}: {}", crate::escape::bytes(&f.path), f.what),
        });
    }
    let mut skipped = Vec::new();
    let mut inspect = |seen: Seen<'_>| {
        let (path, why) = match seen {
            Seen::File { .. } | Seen::Symlink { .. } => return Verdict::Keep,
            Seen::TooLarge { path, size } => (
                path,
                format!("{size} bytes, over the {cap} byte cap (never read)"),
            ),
            Seen::Special { path, kind } => (path, format!("a {kind} (never opened)")),
            Seen::SetId { path, mode } => (
                path,
                format!("set-user-id or set-group-id, mode {mode:o} (never read)"),
            ),
            Seen::Unreadable { path, error } => (path, format!("unreadable: {error}")),
            Seen::NestedRepository { path } => {
                (path, "a nested repository (never staged)".to_string())
            }
            Seen::GitlinkReplaced { path } => (
                path,
                "a gitlink of the base replaced by a non-directory (base kept)".to_string(),
            ),
        };
        skipped.push(format!("{}: {why}", crate::escape::bytes(path)));
        Verdict::Skip
    };
    let snap = Snapshot::take_with(
        &sb.manifest.store,
        &ws,
        &sb.paths.scratch(),
        &sb.manifest.base,
        TakeOptions::new(SnapshotObjects::Scratch)
            .max_file_size(cap)
            .inspect(&mut inspect),
    )?;
    Ok((snap, Unread { scan, skipped }))
}

/// [`snapshot_bounded`] under the same hold as export: no run or shell is live (the box's lock,
/// taken exclusively: refused busy, not waited for) and every service is frozen until the
/// snapshot is taken (thawed on every way out).
pub fn snapshot_held(sb: &StoredBox) -> Result<(Snapshot, Unread), BoxError> {
    let _lock = crate::store::BoxLock::take(&sb.paths, &sb.manifest.name)?;
    let _frozen = crate::freeze::hold(sb)?;
    snapshot_bounded(sb)
}

/// A box's diff (or its stat) made displayable: each line redacted and escaped, and what was
/// not read, named and redacted. What `h5i box diff` prints and the console shows.
#[derive(Debug)]
pub struct DiffText {
    /// The diff's lines, without their newlines.
    pub lines: Vec<String>,
    /// One line per path or finding the snapshot did not read.
    pub unread: Vec<String>,
}

/// The box's diff against its pinned base (its `--stat` when `stat`), taken under export's hold.
pub fn diff_text(store: &BoxStore, name: &str, stat: bool) -> Result<DiffText, BoxError> {
    let sb = store.find(name)?;
    let (snap, unread) = snapshot_held(&sb)?;
    let out = if stat {
        snap.stat(&sb.manifest.base)?
    } else {
        snap.patch(&sb.manifest.base)?
    };
    let policy = crate::store::load_policy(&sb)?;
    let redactor = crate::secrets::redactor_for(&policy);
    let body = out.strip_suffix(b"\n").unwrap_or(&out);
    let lines = match body.is_empty() {
        true => Vec::new(),
        false => body
            .split(|b| *b == b'\n')
            .map(|line| crate::export::gate::display_text(&redactor, line))
            .collect(),
    };
    Ok(DiffText {
        lines,
        unread: unread
            .lines()
            .iter()
            .map(|line| redactor.redact(line).0)
            .collect(),
    })
}

/// Print the box's diff (or its stat) to stdout; what was not read goes to stderr, named.
pub fn print_diff(store: &BoxStore, name: &str, stat: bool) -> Result<(), BoxError> {
    let text = diff_text(store, name, stat)?;
    let mut stdout = std::io::stdout().lock();
    let mut write = || -> std::io::Result<()> {
        for line in &text.lines {
            stdout.write_all(line.as_bytes())?;
            stdout.write_all(b"\n")?;
        }
        stdout.flush()
    };
    match write() {
        // The reader left (`h5i box diff b | head`): what it wanted was written.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
        other => other.map_err(|e| BoxError::io(std::path::Path::new("<stdout>"), e))?,
    }
    for line in &text.unread {
        eprintln!("h5i: box {name}: not in the diff: {line}");
    }
    Ok(())
}
