//! `h5i box apply NAME`: land a worktree box's changes on its parent branch, a human's step on
//! the host.
//!
//! Owns the checks before anything moves (a worktree box, the parent on its branch and clean,
//! every granted secret resolvable so it can be scanned for, the box's services held still,
//! the export gate passing with nothing excluded and no set-id file, no change to the clone's
//! `.h5i/` policy unless `--allow-policy-change`, no conflict) and the landing itself: one commit
//! on top of the pinned base, made in the snapshot's scratch object directory, published into
//! the parent's store only after every check, then landed on the parent branch by
//! [`crate::landing`] (a merge commit made in scratch too when the branch moved on). A landing
//! a killed `apply` left is finished by the next one, before anything else. Must never: move
//! any ref but the parent branch, land a path the export gate would exclude, write an object
//! into the parent before every check passed, or leave a half-merged parent.

use crate::error::BoxError;
use crate::events::{self, Event};
use crate::export::gate::ExportGate;
use crate::git::Git;
use crate::landing::{LandingLane, LandingPlan};
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
    /// The commit now at the branch's tip: the box's own, or the merge of it when the branch
    /// had moved on since the box's base.
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

/// What a human allowed `apply` to do beyond the default.
#[derive(Debug, Clone, Copy, Default)]
pub struct ApplyOptions {
    /// Land a patch that changes the clone's `.h5i/` policy (`--allow-policy-change`).
    pub allow_policy_change: bool,
    /// Go ahead although a granted secret cannot be resolved in this shell, so it is not
    /// scanned for (`--skip-secret-check`).
    pub skip_secret_check: bool,
}

/// Apply the box called `name` onto its parent branch.
pub fn apply(store: &BoxStore, name: &str, opts: ApplyOptions) -> Result<Applied, BoxError> {
    let mut sb = store.find(name)?;
    let _lock = BoxLock::take(&sb.paths, name)?;
    let lane = LandingLane::claim(store)?;
    if let Some(plan) = lane.cut_off()? {
        lane.finish(&plan)?;
        if plan.name == name && plan.created_ms == sb.manifest.created_ms {
            return landed(&mut sb, &plan, &lane);
        }
        if let Ok(mut other) = store.find(&plan.name) {
            if other.manifest.created_ms == plan.created_ms {
                let _other_lock = BoxLock::take(&other.paths, &plan.name)?;
                landed(&mut other, &plan, &lane)?;
            }
        }
        lane.close()?;
    }
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
    let redactor = secrets::redactor_for_export(&policy, opts.skip_secret_check, "apply")?.redactor;
    let base = sb.manifest.base.clone();
    // The box's services are held still while the tree is read (dropped, so thawed, on every
    // way out of this function).
    let _frozen = crate::freeze::hold(&sb)?;
    // The gate takes the snapshot itself, in scratch: nothing reaches the parent's object store
    // until every check below has passed.
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
    if let Some(change) = crate::export::policy_change::detect(&snap, &base, &policy.profile)? {
        if !opts.allow_policy_change {
            return Err(BoxError::BadRequest {
                // Box-written text (paths, profile names, service commands) through the escaper.
                what: crate::export::gate::escape_controls(&format!(
                    "box `{name}` changes the clone's policy ({}): {}",
                    change.paths.join(", "),
                    change.summary()
                )),
                mend: format!("review it in report.md (`h5i box export {name} --out DIR`), then `h5i box apply {name} --allow-policy-change` to land it"),
            });
        }
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
    let commit = snap
        .git_objects()
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
    let to = if tip == base {
        commit.clone()
    } else {
        let merged = snap
            .git_objects()
            .args(["merge-tree", "--write-tree", "--name-only", &tip, &commit])
            .text()
            .map_err(|e| BoxError::ParentNotReady {
                what: format!("box `{name}` conflicts with `{branch}` as it is now ({e})"),
                mend: format!("`h5i box rebase {name}` onto the new tip, resolve, then apply"),
            })?;
        let tree = merged.lines().next().unwrap_or_default();
        snap.git_objects()
            .args([
                "commit-tree",
                tree,
                "-p",
                &tip,
                "-p",
                &commit,
                "-m",
                &format!("h5i: merge box {name} into {branch}"),
            ])
            .text()?
    };
    let plan = LandingPlan {
        name: name.to_string(),
        created_ms: sb.manifest.created_ms,
        branch,
        from: tip,
        to,
    };
    // Everything is validated: only now do the snapshot's objects enter the parent's store.
    snap.publish_objects()?;
    lane.check(&plan, &sb.paths.scratch())?;
    lane.land(&plan)?;
    landed(&mut sb, &plan, &lane)
}

/// Record on box `sb` that `plan` landed, then drop the landing's journal.
fn landed(sb: &mut StoredBox, plan: &LandingPlan, lane: &LandingLane) -> Result<Applied, BoxError> {
    if sb.manifest.state != BoxState::Applied {
        sb.manifest.state = BoxState::Applied;
        write_manifest(&sb.paths, &sb.manifest)?;
        events::append(
            &sb.paths,
            &Event::new(
                "applied",
                format!("commit {} merged into {}", plan.to, plan.branch),
            ),
        )?;
    }
    lane.close()?;
    Ok(Applied {
        branch: plan.branch.clone(),
        commit: plan.to.clone(),
    })
}
