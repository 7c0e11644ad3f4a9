//! The last step of `h5i box apply`: moving the parent's branch, index and work tree from the
//! branch's tip to the commit that carries a box's changes, written so that a kill at any
//! instant leaves either the parent as it was or a journal the next `apply` finishes.
//!
//! Owns `.git/.h5i/landing.json` (which box lands on which branch, from which commit to which)
//! and `.git/.h5i/landing.lock`, held for a landing's whole life so that a journal nobody holds
//! is one a killed `apply` left. Git itself is not crash-safe across a work-tree update and a
//! ref update (a `git merge` killed between them leaves the new files under the old `HEAD`), so
//! the order is: journal, work tree and index, branch (compare-and-swap), journal removed.
//! Must never: move the branch from anything but the journal's `from`, touch a path the landing
//! does not change, finish a landing over changes a person made since it was cut off, or remove
//! a git lock file older than its journal.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use crate::error::BoxError;
use crate::git::Git;
use crate::store::{write_atomic, BoxStore};

/// What one landing moves: box `name`'s commit `to` onto `branch`, whose tip was `from`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LandingPlan {
    /// The box whose changes land.
    pub name: String,
    /// When that box was made (its manifest's `created_ms`): a box made later under the same
    /// name is another box.
    pub created_ms: u64,
    /// The parent branch.
    pub branch: String,
    /// The branch's tip before the landing.
    pub from: String,
    /// The commit the branch, index and work tree move to.
    pub to: String,
}

/// The repository's landing lane: held exclusively for one landing (or one recovery) at a time.
pub struct LandingLane {
    store: BoxStore,
    _lock: fs::File,
}

impl LandingLane {
    /// Claim the lane of `store`'s repository, refusing (not waiting) while another `apply`
    /// is landing there.
    pub fn claim(store: &BoxStore) -> Result<LandingLane, BoxError> {
        let dir = store.common_dir.join(".h5i");
        fs::create_dir_all(&dir).map_err(|e| BoxError::io(&dir, e))?;
        let path = dir.join("landing.lock");
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| BoxError::io(&path, e))?;
        if let Err(e) = file.try_lock() {
            return Err(match e {
                fs::TryLockError::WouldBlock => BoxError::ParentNotReady {
                    what: "another `h5i box apply` is landing on this repository".into(),
                    mend: "wait for it to finish, then apply again".into(),
                },
                fs::TryLockError::Error(e) => BoxError::io(&path, e),
            });
        }
        Ok(LandingLane {
            store: store.clone(),
            _lock: file,
        })
    }

    fn journal(&self) -> PathBuf {
        self.store.common_dir.join(".h5i").join("landing.json")
    }

    /// The landing a killed `apply` left unfinished, if any.
    pub fn cut_off(&self) -> Result<Option<LandingPlan>, BoxError> {
        let path = self.journal();
        match fs::read(&path) {
            Ok(bytes) => {
                serde_json::from_slice(&bytes)
                    .map(Some)
                    .map_err(|e| BoxError::ParentNotReady {
                        what: format!("the landing journal {} is damaged ({e})", path.display()),
                        mend: format!(
                            "check the parent with `git status` and `git log`, then remove {}",
                            path.display()
                        ),
                    })
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(BoxError::io(&path, e)),
        }
    }

    /// Whether the work tree would take `plan` without losing an untracked file, checked
    /// before anything is written. git takes the index's lock even for a dry run, so the run
    /// reads a copy of the index in `scratch`: killed here, it leaves no lock in the parent.
    pub fn check(&self, plan: &LandingPlan, scratch: &Path) -> Result<(), BoxError> {
        let index = self.store.common_dir.join("index");
        let copy = scratch.join("landing-index");
        // A check killed before left its lock in the box's own scratch (held under the box's
        // exclusive lock): nobody else's.
        let _ = fs::remove_file(scratch.join("landing-index.lock"));
        fs::copy(&index, &copy).map_err(|e| BoxError::io(&index, e))?;
        let checked = self
            .git()
            .index(&copy)
            .args(["read-tree", "-m", "-u", "-n", &plan.from, &plan.to])
            .output();
        let _ = fs::remove_file(&copy);
        checked.map_err(|e| BoxError::ParentNotReady {
            what: format!(
                "the parent's work tree cannot take box `{}` ({e})",
                plan.name
            ),
            mend: "move the files git names out of the way, then apply again".into(),
        })?;
        Ok(())
    }

    /// Land `plan` on a parent whose branch is at `plan.from` with a clean index and work tree.
    pub fn land(&self, plan: &LandingPlan) -> Result<(), BoxError> {
        let mut bytes = serde_json::to_vec_pretty(plan).map_err(|e| BoxError::Corrupt {
            path: self.journal(),
            what: e.to_string(),
        })?;
        bytes.push(b'\n');
        write_atomic(&self.journal(), &bytes)?;
        self.git()
            .args(["read-tree", "-m", "-u", &plan.from, &plan.to])
            .output()?;
        self.move_branch(plan)
    }

    /// Finish `plan`, which a killed `apply` left at any point after its journal was written.
    /// Refuses, naming the repair, when the parent moved on since.
    pub fn finish(&self, plan: &LandingPlan) -> Result<(), BoxError> {
        let cut_off = |what: String| BoxError::ParentNotReady {
            what: format!(
                "the landing of box `{}` on `{}` was cut off, and {what}",
                plan.name, plan.branch
            ),
            mend: format!(
                "check the parent with `git status`, then remove {} to let apply go on",
                self.journal().display()
            ),
        };
        let head = Git::at(&self.store.common_dir)
            .args(["symbolic-ref", "-q", "HEAD"])
            .text()
            .unwrap_or_default();
        if head != format!("refs/heads/{}", plan.branch) {
            return Err(cut_off(format!(
                "the parent is no longer on `{}`",
                plan.branch
            )));
        }
        let tip = self.tip(&plan.branch)?;
        if tip != plan.from && tip != plan.to {
            return Err(cut_off(format!(
                "`{}` has moved to {tip} since",
                plan.branch
            )));
        }
        self.clear_stale_git_locks(plan, &cut_off)?;
        let landing: BTreeSet<Vec<u8>> =
            self.names(&["diff", "--name-only", "-z", &plan.from, &plan.to])?;
        let mut changed = self.names(&["diff", "--name-only", "-z", &plan.from])?;
        changed.extend(self.names(&["diff", "--cached", "--name-only", "-z", &plan.from])?);
        let outside: Vec<String> = changed
            .difference(&landing)
            .map(|p| String::from_utf8_lossy(p).into_owned())
            .collect();
        if !outside.is_empty() {
            return Err(cut_off(format!(
                "files it does not change have changed since: {}",
                crate::export::gate::escape_controls(&outside.join(", "))
            )));
        }
        // Nothing outside the landing's own paths differs from `from` (so from `to`): resetting
        // the index and work tree to `to` rewrites only the paths the landing changes.
        self.git()
            .args(["read-tree", "--reset", "-u", &plan.to])
            .output()?;
        if tip == plan.from {
            self.move_branch(plan)?;
        }
        Ok(())
    }

    /// Drop the journal: the landing is whole and the box's own state says so.
    pub fn close(&self) -> Result<(), BoxError> {
        let path = self.journal();
        match fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(BoxError::io(&path, e)),
        }
    }

    fn move_branch(&self, plan: &LandingPlan) -> Result<(), BoxError> {
        Git::at(&self.store.common_dir)
            .args([
                "update-ref",
                "-m",
                &format!("h5i: apply box {}", plan.name),
                &format!("refs/heads/{}", plan.branch),
                &plan.to,
                &plan.from,
            ])
            .output()?;
        Ok(())
    }

    fn tip(&self, branch: &str) -> Result<String, BoxError> {
        Ok(Git::at(&self.store.common_dir)
            .args([
                "rev-parse",
                "--verify",
                "-q",
                &format!("refs/heads/{branch}"),
            ])
            .text()?)
    }

    fn names(&self, args: &[&str]) -> Result<BTreeSet<Vec<u8>>, BoxError> {
        let out = self.git().args(args).output()?;
        Ok(out
            .split(|b| *b == 0)
            .filter(|p| !p.is_empty())
            .map(<[u8]>::to_vec)
            .collect())
    }

    /// The lock files a git killed with the landing may have left: the index's, `HEAD`'s and
    /// the branch's. One made after the journal is taken as that git's (h5i's git children die
    /// with it, and the lane being free says the landing's h5i is gone), so it is removed; an
    /// older one belongs to some other git and is left alone.
    fn clear_stale_git_locks(
        &self,
        plan: &LandingPlan,
        cut_off: &dyn Fn(String) -> BoxError,
    ) -> Result<(), BoxError> {
        let made = |p: &Path| fs::metadata(p).and_then(|m| m.modified());
        let journal_made = made(&self.journal()).unwrap_or(SystemTime::UNIX_EPOCH);
        let git_dir = &self.store.common_dir;
        let locks = [
            git_dir.join("index.lock"),
            git_dir.join("HEAD.lock"),
            git_dir.join(format!("refs/heads/{}.lock", plan.branch)),
        ];
        for lock in locks {
            let lock_made = match made(&lock) {
                Ok(t) => t,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(BoxError::io(&lock, e)),
            };
            if lock_made < journal_made {
                return Err(cut_off(format!(
                    "git's {} is older than the landing (some other git holds it; the landing waits for it)",
                    lock.display()
                )));
            }
            fs::remove_file(&lock).map_err(|e| BoxError::io(&lock, e))?;
        }
        Ok(())
    }

    fn git(&self) -> Git {
        Git::at(&self.store.common_dir)
            .work_tree(&self.store.repo_root)
            .current_dir(&self.store.repo_root)
    }
}
