//! `h5i box rebase NAME`: re-pin a worktree box onto its parent branch's current tip, carrying
//! the box's changes across with a three-way merge.
//!
//! Owns the re-pin: the merge is computed first (`git merge-tree`, in the snapshot's scratch
//! object directory, with the box's services held still), and only a clean result moves
//! anything. The move is journaled: the snapshot's scratch (its index and every object of the
//! merge) becomes the box's `rebase/` directory and `rebase/journal.json` is written whole —
//! the commit point — before the first workspace file changes; then the workspace is checked
//! out to the merged tree, the box's own branch and index follow, then the pin, the event and
//! the manifest, and the journal goes last. Every step after the commit point can be done
//! again, so a rebase killed at any point leaves the old box whole (before the commit point)
//! or a journal that the next `h5i box rebase NAME` finishes (after it); until then every
//! other verb but `rm` refuses the box ([`crate::store::BoxLock`]) and `doctor` names the mend.
//!
//! Must never: start a second rebase over an interrupted one; move the workspace from a tree
//! other than the one snapshotted (a fresh checkout is git's two-tree merge, which refuses a
//! file changed since); move the pin from anything but the journal's old base; or write an
//! object of the box's into the parent's store.

use std::fs;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::apply::parent_branch;
use crate::error::BoxError;
use crate::events::{self, Event};
use crate::export::gate::ExportGate;
use crate::git::Git;
use crate::snapshot::{Snapshot, SnapshotObjects};
use crate::store::{require_active, write_atomic, write_manifest, BoxLock, BoxStore, StoredBox};

/// The old and new base of a rebased box.
#[derive(Debug)]
pub struct Rebased {
    /// The base before.
    pub from: String,
    /// The base now.
    pub to: String,
    /// Whether this finished a rebase that was interrupted, rather than starting one.
    pub resumed: bool,
}

/// `rebase/journal.json`: a rebase past its commit point, everything needed to finish it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Journal {
    /// The base before.
    pub from: String,
    /// The parent's tip: the base after.
    pub to: String,
    /// The parent branch, for the event.
    pub branch: String,
    /// The tree the workspace held when it was snapshotted.
    pub work_tree: String,
    /// The merged tree the workspace moves to (its objects are in `rebase/objects`).
    pub merged_tree: String,
}

const JOURNAL_FILE: &str = "journal.json";

/// The journal of an interrupted rebase of this box, if there is one.
pub fn interrupted(sb: &StoredBox) -> Result<Option<Journal>, BoxError> {
    let path = sb.paths.rebase_journal().join(JOURNAL_FILE);
    let bytes = match fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(BoxError::io(&path, e)),
    };
    let corrupt = |what: String| BoxError::Corrupt {
        path: path.clone(),
        what,
    };
    let journal: Journal = serde_json::from_slice(&bytes).map_err(|e| corrupt(e.to_string()))?;
    let ids = [
        &journal.from,
        &journal.to,
        &journal.work_tree,
        &journal.merged_tree,
    ];
    if !ids.iter().all(|id| is_object_id(id)) {
        return Err(corrupt("an id in it is not a full object id".into()));
    }
    Ok(Some(journal))
}

fn is_object_id(s: &str) -> bool {
    matches!(s.len(), 40 | 64) && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Rebase the box called `name` onto the tip of its parent branch, or finish its interrupted
/// rebase.
pub fn rebase(store: &BoxStore, name: &str) -> Result<Rebased, BoxError> {
    let mut sb = store.find(name)?;
    let _lock = BoxLock::take_mid_rebase(&sb.paths, name)?;
    if let Some(journal) = interrupted(&sb)? {
        let _frozen = crate::freeze::hold(&sb)?;
        finish(&mut sb, &journal, Checkout::Resume)?;
        return Ok(Rebased {
            from: journal.from,
            to: journal.to,
            resumed: true,
        });
    }
    // A rebase killed before its commit point left only the scratch it was keeping.
    let kept = sb.paths.rebase_journal();
    match fs::remove_dir_all(&kept) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(BoxError::io(&kept, e)),
    }
    require_active(&sb, "rebase")?;
    let branch = parent_branch(&sb, "rebase")?;
    let git = || Git::at(&store.common_dir);
    let base = sb.manifest.base.clone();
    let tip = git()
        .args([
            "rev-parse",
            "--verify",
            &format!("refs/heads/{branch}^{{commit}}"),
        ])
        .text()?;
    if tip == base {
        return Err(BoxError::BadRequest {
            what: format!("box `{name}` is already pinned to the tip of `{branch}`"),
            mend: "nothing to rebase".into(),
        });
    }
    // Only a tree the export gate passes whole is carried. The box's services are held still
    // while the tree is read and rewritten (thawed on every way out), and every object the
    // carry makes stays in the snapshot's scratch: the new base is the parent's own commit, so
    // nothing of the box's ever needs to enter the parent's store.
    let policy = crate::store::load_policy(&sb)?;
    let redactor = crate::secrets::redactor_for(&policy);
    let _frozen = crate::freeze::hold(&sb)?;
    let gate = ExportGate::new(&redactor, Default::default());
    let snap = gate.take(
        &sb.manifest.store,
        &sb.paths.workspace(),
        &sb.paths.scratch(),
        &base,
        SnapshotObjects::Scratch,
    )?;
    let gated = gate.check(&snap, &sb.paths.workspace(), &base)?;
    if !gated.excluded.is_empty() {
        return Err(BoxError::BadRequest {
            what: format!(
                "the export gate excludes {} path(s) of box `{name}`, so its tree cannot be carried onto the new base",
                gated.excluded.len()
            ),
            mend: format!("review them with `h5i box export {name} --out DIR` and remove them from the box first"),
        });
    }
    let work_tree = snap.write_tree()?;
    let work_commit = snap
        .git_objects()
        .args([
            "commit-tree",
            &work_tree,
            "-p",
            &base,
            "-m",
            &format!("h5i: box {name} before rebase"),
        ])
        .text()?;
    let merged = snap
        .git_objects()
        .args([
            "merge-tree",
            "--write-tree",
            "--name-only",
            "--merge-base",
            &base,
            &tip,
            &work_commit,
        ])
        .text()
        .map_err(|e| BoxError::ParentNotReady {
            what: format!("box `{name}`'s changes conflict with `{branch}` ({e})"),
            mend: format!("nothing was changed; resolve by exporting (`h5i box export {name} --out DIR`) and applying the patch by hand"),
        })?;
    let journal = Journal {
        from: base,
        to: tip,
        branch,
        work_tree,
        merged_tree: merged.lines().next().unwrap_or_default().to_string(),
    };
    if !is_object_id(&journal.merged_tree) {
        return Err(BoxError::ParentNotReady {
            what: format!("git merge-tree printed no tree for box `{name}`"),
            mend: "nothing was changed; report this as an h5i bug, with `git --version`".into(),
        });
    }
    // The commit point: the scratch (index and objects) kept, the checkout tried without
    // writing (git refuses a file changed since the snapshot: then nothing has moved), and the
    // journal written whole.
    snap.keep_as(&kept)?;
    if let Err(e) = check_out(&sb, &journal, Checkout::Verify) {
        let _ = fs::remove_dir_all(&kept);
        return Err(BoxError::ParentNotReady {
            what: format!("box `{name}`'s workspace cannot be moved to the merged tree ({e})"),
            mend: "nothing was changed; stop what writes in the box (its services, runs and shells), then retry".into(),
        });
    }
    let record = serde_json::to_vec_pretty(&journal).map_err(|e| BoxError::Corrupt {
        path: kept.join(JOURNAL_FILE),
        what: e.to_string(),
    })?;
    write_atomic(&kept.join(JOURNAL_FILE), &record)?;
    finish(&mut sb, &journal, Checkout::Fresh)?;
    Ok(Rebased {
        from: journal.from,
        to: journal.to,
        resumed: false,
    })
}

/// How the workspace is moved to the merged tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Checkout {
    /// [`Checkout::Fresh`] without writing anything: whether it would go through.
    Verify,
    /// Straight after the snapshot: git's two-tree merge from the snapshotted tree, which
    /// refuses (writing nothing) if a file changed since.
    Fresh,
    /// After a kill: the workspace is part old, part new, so the merged tree is written over
    /// every path that differs from it.
    Resume,
}

/// Everything after the commit point, each step safe to do again after a kill.
fn finish(sb: &mut StoredBox, journal: &Journal, how: Checkout) -> Result<(), BoxError> {
    let kept = sb.paths.rebase_journal();
    let ws = sb.paths.workspace();
    check_out(sb, journal, how).map_err(|e| BoxError::ParentNotReady {
        what: format!(
            "could not move box `{}`'s workspace to the merged tree ({e})",
            sb.manifest.name
        ),
        mend: format!(
            "the rebase is journaled; `h5i box rebase {}` finishes it, writing the merged tree over any file changed since (or `h5i box rm --force {}`)",
            sb.manifest.name, sb.manifest.name
        ),
    })?;
    // The box's own repository is box-writable: its branch and index are written as plain files
    // beneath the workspace (no git reads its config), refusing any planted symlink.
    let index = kept.join("box-index");
    remove_stale_lock(&index)?;
    Git::at(&sb.manifest.store)
        .index(&index)
        .args(["read-tree", &journal.to])
        .output()?;
    let index_bytes = fs::read(&index).map_err(|e| BoxError::io(&index, e))?;
    let branch_ref = Path::new(".git/refs/heads").join(&sb.manifest.branch);
    crate::beneath::write_file(&ws, &branch_ref, format!("{}\n", journal.to).as_bytes())
        .map_err(|e| BoxError::io(&ws.join(&branch_ref), e))?;
    crate::beneath::write_file(&ws, Path::new(".git/index"), &index_bytes)
        .map_err(|e| BoxError::io(&ws.join(".git/index"), e))?;
    // What root just wrote into a root caller's box is handed back to the box range, so the
    // box can go on editing it (`identity`); the workspace tier has no box identity.
    if sb.manifest.tier != h5i_policy::Tier::Workspace.as_str() {
        crate::identity::Mapping::for_caller()?.own(std::slice::from_ref(&ws))?;
    }
    let pin = Git::at(&sb.manifest.store)
        .args(["rev-parse", "--verify", "--quiet", &sb.manifest.base_ref])
        .text()
        .unwrap_or_default();
    if pin != journal.to {
        // A killed rebase may have left git's `base.lock`: the box's lock says it is ours.
        crate::pin::BoxPin::new(&sb.manifest.store, &sb.manifest.name)
            .advance(&journal.from, &journal.to)?;
    }
    let event = Event::new(
        "rebased",
        format!(
            "base {} -> {} ({})",
            journal.from, journal.to, journal.branch
        ),
    );
    let logged = events::read(&sb.paths)?.last().is_some_and(|e| {
        e.as_ref()
            .is_ok_and(|e| e.event == event.event && e.detail == event.detail)
    });
    if !logged {
        events::append(&sb.paths, &event)?;
    }
    if sb.manifest.base != journal.to {
        sb.manifest.base = journal.to.clone();
        write_manifest(&sb.paths, &sb.manifest)?;
    }
    // Done: the journal goes in one rename (the box is whole from here), then its scratch.
    Snapshot::discard_kept(&kept, &sb.paths.scratch())?;
    Ok(())
}

/// Move the workspace to the journal's merged tree, with the journal's index and objects.
fn check_out(sb: &StoredBox, journal: &Journal, how: Checkout) -> Result<(), BoxError> {
    let kept = sb.paths.rebase_journal();
    let index = kept.join("index");
    remove_stale_lock(&index)?;
    let git = || {
        Git::at(&sb.manifest.store)
            .work_tree(&sb.paths.workspace())
            .index(&index)
            .objects_into(&kept.join("objects"), &sb.manifest.store.join("objects"))
            .env("GIT_ATTR_SOURCE", &journal.merged_tree)
    };
    // Fresh stat data lets read-tree tell untouched files from edited ones; a refresh that
    // finds edits exits non-zero, which read-tree then handles (refuses, or overwrites).
    let _ = git().args(["update-index", "-q", "--refresh"]).output();
    let two_tree = ["-m", "-u", &journal.work_tree, &journal.merged_tree];
    let merge = match how {
        Checkout::Verify => git().args(["read-tree", "--dry-run"]).args(two_tree),
        Checkout::Fresh => git().args(["read-tree"]).args(two_tree),
        Checkout::Resume => git().args(["read-tree", "--reset", "-u", &journal.merged_tree]),
    };
    merge.output()?;
    Ok(())
}

/// A git killed with the rebase leaves `INDEX.lock`; the box's lock, held exclusively, says
/// nobody else uses this index.
fn remove_stale_lock(index: &Path) -> Result<(), BoxError> {
    let lock = index.with_file_name(format!(
        "{}.lock",
        index.file_name().unwrap_or_default().to_string_lossy()
    ));
    match fs::remove_file(&lock) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(BoxError::io(&lock, e)),
    }
}
