//! `h5i box rebase NAME`: re-pin a worktree box onto its parent branch's current tip, carrying
//! the box's changes across with a three-way merge.
//!
//! Owns the re-pin: the merge is computed first (`git merge-tree`, in the snapshot's scratch
//! object directory, with the box's services held still), and only a clean result moves
//! anything — the workspace files, the box's own branch and index, then the pin ref and the
//! manifest. Must never: leave the workspace half-merged, move the pin without the manifest, or
//! write an object of the box's into the parent's store.

use crate::apply::parent_branch;
use crate::error::BoxError;
use crate::events::{self, Event};
use crate::export::gate::ExportGate;
use crate::git::Git;
use crate::snapshot::SnapshotObjects;
use crate::store::{require_active, write_manifest, BoxLock, BoxStore};

/// The old and new base of a rebased box.
#[derive(Debug)]
pub struct Rebased {
    /// The base before.
    pub from: String,
    /// The base now.
    pub to: String,
}

/// Rebase the box called `name` onto the tip of its parent branch.
pub fn rebase(store: &BoxStore, name: &str) -> Result<Rebased, BoxError> {
    let mut sb = store.find(name)?;
    let _lock = BoxLock::take(&sb.paths, name)?;
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
    let merged_tree = merged.lines().next().unwrap_or_default().to_string();
    snap.checkout_tree(&work_tree, &merged_tree)?;
    // The box's own repository is box-writable: its branch and index are written as plain files
    // beneath the workspace (no git reads its config), refusing any planted symlink.
    let ws = sb.paths.workspace();
    let index = sb.paths.scratch().join("rebase-index");
    Git::at(&sb.manifest.store)
        .index(&index)
        .args(["read-tree", &tip])
        .output()?;
    let index_bytes = std::fs::read(&index).map_err(|e| BoxError::io(&index, e))?;
    let _ = std::fs::remove_file(&index);
    let branch_ref = std::path::Path::new(".git/refs/heads").join(&sb.manifest.branch);
    crate::beneath::write_file(&ws, &branch_ref, format!("{tip}\n").as_bytes())
        .map_err(|e| BoxError::io(&ws.join(&branch_ref), e))?;
    crate::beneath::write_file(&ws, std::path::Path::new(".git/index"), &index_bytes)
        .map_err(|e| BoxError::io(&ws.join(".git/index"), e))?;
    // What root just wrote into a root caller's box is handed back to the box range, so the
    // box can go on editing it (`identity`); the workspace tier has no box identity.
    if sb.manifest.tier != h5i_policy::Tier::Workspace.as_str() {
        crate::identity::Mapping::for_caller()?.own(std::slice::from_ref(&ws))?;
    }
    git()
        .args(["update-ref", &sb.manifest.base_ref, &tip, &base])
        .output()?;
    sb.manifest.base = tip.clone();
    write_manifest(&sb.paths, &sb.manifest)?;
    events::append(
        &sb.paths,
        &Event::new("rebased", format!("base {base} -> {tip} ({branch})")),
    )?;
    Ok(Rebased {
        from: base,
        to: tip,
    })
}
