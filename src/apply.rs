//! `h5i box apply NAME`: land a worktree box's changes on its parent branch, a human's step on
//! the host.
//!
//! Owns the checks before anything moves (a worktree box, the parent on its branch and clean, the
//! export gate passing with nothing excluded, no conflict) and the landing itself: one commit on
//! top of the pinned base, merged into the parent branch. Must never: move any ref but the
//! parent branch, land a path the export gate would exclude, or leave a half-merged parent.

use crate::error::BoxError;
use crate::events::{self, Event};
use crate::export::gate::ExportGate;
use crate::git::Git;
use crate::secrets;
use crate::snapshot::SnapshotObjects;
use crate::store::{
    load_policy, require_active, write_manifest, BoxLock, BoxState, BoxStore, StoredBox,
};

/// What `apply` landed.
#[derive(Debug)]
pub struct Applied {
    /// The branch it landed on.
    pub branch: String,
    /// The commit that carries the box's changes.
    pub commit: String,
}

/// The parent branch a worktree box lands on, or the refusal for a box that cannot.
pub fn parent_branch(sb: &StoredBox, verb: &'static str) -> Result<String, BoxError> {
    match &sb.manifest.source {
        crate::store::BoxSource::Worktree {
            parent_branch: Some(b),
            ..
        } => Ok(b.clone()),
        crate::store::BoxSource::Worktree { from, .. } => Err(BoxError::BadRequest {
            what: format!(
                "box `{}` was made from `{from}`, which is not a branch, so `{verb}` has no branch to land on",
                sb.manifest.name
            ),
            mend: format!(
                "`h5i box export {} --out DIR` and apply the patch where you want it",
                sb.manifest.name
            ),
        }),
        other => Err(BoxError::Detached {
            name: sb.manifest.name.clone(),
            origin: other.label(),
            verb,
        }),
    }
}

/// Apply the box called `name` onto its parent branch.
pub fn apply(store: &BoxStore, name: &str) -> Result<Applied, BoxError> {
    let mut sb = store.find(name)?;
    let _lock = BoxLock::take(&sb.paths, name)?;
    require_active(&sb, "apply")?;
    let branch = parent_branch(&sb, "apply")?;
    let parent = Git::at(&store.common_dir).work_tree(&store.repo_root);
    let head = Git::at(&store.common_dir)
        .args(["symbolic-ref", "-q", "HEAD"])
        .text()
        .unwrap_or_default();
    if head != format!("refs/heads/{branch}") {
        return Err(BoxError::ParentNotReady {
            what: format!("the parent repository is not on `{branch}` (the box's parent branch)"),
            mend: format!("`git switch {branch}` in {}", store.repo_root.display()),
        });
    }
    let dirty = parent
        .current_dir(&store.repo_root)
        .args(["status", "--porcelain", "--untracked-files=no"])
        .text()?;
    if !dirty.is_empty() {
        return Err(BoxError::ParentNotReady {
            what: format!("the parent's `{branch}` has uncommitted changes"),
            mend: "commit or stash them, then apply again".into(),
        });
    }
    let policy = load_policy(&sb)?;
    let redactor = secrets::redactor_for(&policy);
    let base = sb.manifest.base.clone();
    // The gate takes the snapshot itself, so a path it excludes never has its blob written into
    // the parent's object store.
    let gate = ExportGate::new(&redactor, Default::default());
    let snap = gate.take(
        &sb.manifest.store,
        &sb.paths.workspace(),
        &sb.paths.scratch(),
        &base,
        SnapshotObjects::Store,
    )?;
    let gated = gate.check(&snap, &sb.paths.workspace(), &base)?;
    if !gated.excluded.is_empty() {
        let list: Vec<String> = gated
            .excluded
            .iter()
            .map(|e| format!("{} ({})", e.path, e.reason))
            .collect();
        return Err(BoxError::BadRequest {
            what: format!("the export gate excludes paths from box `{name}`: {}", list.join(", ")),
            mend: format!("review them with `h5i box export {name} --out DIR`; apply lands only a tree the gate passes whole"),
        });
    }
    let tree = snap.write_tree()?;
    let base_tree = Git::at(&store.common_dir)
        .args(["rev-parse", &format!("{base}^{{tree}}")])
        .text()?;
    if tree == base_tree {
        return Err(BoxError::BadRequest {
            what: format!("box `{name}` has no changes against its base"),
            mend: "nothing to apply".into(),
        });
    }
    let commit = Git::at(&store.common_dir)
        .args([
            "commit-tree",
            &tree,
            "-p",
            &base,
            "-m",
            &format!("h5i: apply box {name}"),
        ])
        .text()?;
    let tip = Git::at(&store.common_dir)
        .args(["rev-parse", &format!("refs/heads/{branch}")])
        .text()?;
    if tip != base {
        let clean = Git::at(&store.common_dir)
            .args(["merge-tree", "--write-tree", "--name-only", &tip, &commit])
            .output();
        if let Err(e) = clean {
            return Err(BoxError::ParentNotReady {
                what: format!("box `{name}` conflicts with `{branch}` as it is now ({e})"),
                mend: format!("`h5i box rebase {name}` onto the new tip, resolve, then apply"),
            });
        }
    }
    Git::at(&store.common_dir)
        .work_tree(&store.repo_root)
        .current_dir(&store.repo_root)
        .args(["merge", "--quiet", "--no-edit", &commit])
        .output()?;
    sb.manifest.state = BoxState::Applied;
    write_manifest(&sb.paths, &sb.manifest)?;
    events::append(
        &sb.paths,
        &Event::new("applied", format!("commit {commit} merged into {branch}")),
    )?;
    Ok(Applied { branch, commit })
}
