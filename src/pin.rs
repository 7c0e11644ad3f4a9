//! A box's pin: `refs/h5i/boxes/NAME/base` in the repository the box came from, which keeps the
//! box's base commit safe from git's garbage collection.
//!
//! Owns writing and deleting that ref. h5i alone writes the `refs/h5i/boxes/NAME/` namespace, and
//! only while it holds the name's claim ([`crate::store::BoxStore::claim_name`]: create for its
//! whole life, rm and gc while they drop a pin) or, for a box that exists, the box's exclusive
//! lock (rebase moves the pin), so a git lock file found for a pin was left by a killed h5i and
//! is removed. A loose pin is deleted with one `unlink`, not `git update-ref -d`:
//! git takes `packed-refs.lock` for every deletion, and a deletion killed while holding it leaves
//! a lock that refuses every later deletion in the person's repository, theirs included.
//!
//! Must never: set or delete a pin without holding its name's claim, or while a box of that
//! name exists (the pin is that box's); move a box's pin without its exclusive lock, or from
//! any commit but the one the box recorded; touch any ref outside `refs/h5i/boxes/NAME/`.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::error::BoxError;
use crate::git::Git;

/// The pin of box `name` in the git directory `git_dir` (the parent's common directory, or a
/// detached box's own `base.git`).
pub struct BoxPin<'a> {
    git_dir: &'a Path,
    name: &'a str,
}

impl<'a> BoxPin<'a> {
    /// The pin of `name` in `git_dir`; the caller holds the name's claim.
    pub fn new(git_dir: &'a Path, name: &'a str) -> Self {
        BoxPin { git_dir, name }
    }

    /// The ref's full name.
    pub fn refname(&self) -> String {
        format!("refs/h5i/boxes/{}/base", self.name)
    }

    fn loose(&self) -> PathBuf {
        self.git_dir.join(self.refname())
    }

    /// Point the pin at `base`, replacing an orphan a killed verb left (no box of the name
    /// exists while its claim is held).
    pub fn set(&self, base: &str) -> Result<(), BoxError> {
        self.clear_stale_lock()?;
        Git::at(self.git_dir)
            .args(["update-ref", &self.refname(), base])
            .output()?;
        Ok(())
    }

    /// Move the pin of an existing box from `from` to `to`; the caller holds the box's exclusive
    /// lock. A pin anyone else moved is refused by git, not overwritten.
    pub fn advance(&self, from: &str, to: &str) -> Result<(), BoxError> {
        self.clear_stale_lock()?;
        Git::at(self.git_dir)
            .args(["update-ref", &self.refname(), to, from])
            .output()?;
        Ok(())
    }

    /// Delete the pin, if there is one.
    pub fn remove(&self) -> Result<(), BoxError> {
        self.clear_stale_lock()?;
        if self.packed_or_reftable()? {
            Git::at(self.git_dir)
                .args(["update-ref", "-d", &self.refname()])
                .output()?;
            return Ok(());
        }
        let loose = self.loose();
        remove_file(&loose)?;
        remove_file(&self.git_dir.join("logs").join(self.refname()))?;
        // Empty parents go as git's own deletion takes them; a non-empty one stays.
        let stop = self.git_dir.join("refs");
        let mut up = loose.parent();
        while let Some(d) = up.filter(|d| *d != stop) {
            if fs::remove_dir(d).is_err() {
                break;
            }
            up = d.parent();
        }
        Ok(())
    }

    /// Remove `base.lock`: nobody else writes this ref while the claim is held.
    fn clear_stale_lock(&self) -> Result<(), BoxError> {
        let mut lock = self.loose().into_os_string();
        lock.push(".lock");
        remove_file(Path::new(&lock))
    }

    /// Whether the pin needs git to delete it: it sits in `packed-refs` (a `git pack-refs` or
    /// `gc` packed it), or the repository keeps its refs in a reftable.
    fn packed_or_reftable(&self) -> Result<bool, BoxError> {
        if self.git_dir.join("reftable").is_dir() {
            return Ok(true);
        }
        let packed = self.git_dir.join("packed-refs");
        let text = match fs::read(&packed) {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(BoxError::io(&packed, e)),
        };
        let refname = self.refname();
        Ok(text.split(|b| *b == b'\n').any(|line| {
            line.len() > refname.len() + 1
                && line.ends_with(refname.as_bytes())
                && line[line.len() - refname.len() - 1] == b' '
        }))
    }
}

fn remove_file(path: &Path) -> Result<(), BoxError> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(BoxError::io(path, e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    fn repo() -> (tempfile::TempDir, PathBuf, String) {
        let t = tempfile::tempdir().unwrap();
        let run = |args: &[&str]| {
            let out = Command::new("git")
                .args(args)
                .current_dir(t.path())
                .env("GIT_AUTHOR_NAME", "t")
                .env("GIT_AUTHOR_EMAIL", "t@example.com")
                .env("GIT_COMMITTER_NAME", "t")
                .env("GIT_COMMITTER_EMAIL", "t@example.com")
                .output()
                .unwrap();
            assert!(out.status.success(), "{args:?}: {out:?}");
            String::from_utf8(out.stdout).unwrap().trim().to_string()
        };
        run(&["init", "-q"]);
        run(&["commit", "-q", "--allow-empty", "-m", "c"]);
        let head = run(&["rev-parse", "HEAD"]);
        let git_dir = t.path().join(".git");
        (t, git_dir, head)
    }

    fn pinned(git_dir: &Path, name: &str) -> Option<String> {
        let out = Command::new("git")
            .args(["--git-dir"])
            .arg(git_dir)
            .args(["rev-parse", "--verify", "--quiet"])
            .arg(format!("refs/h5i/boxes/{name}/base"))
            .output()
            .unwrap();
        out.status
            .success()
            .then(|| String::from_utf8(out.stdout).unwrap().trim().to_string())
    }

    #[test]
    fn a_lock_a_killed_update_left_does_not_block_the_next_set_or_remove() {
        let (_t, git_dir, head) = repo();
        let pin = BoxPin::new(&git_dir, "b");
        fs::create_dir_all(git_dir.join("refs/h5i/boxes/b")).unwrap();
        fs::write(git_dir.join("refs/h5i/boxes/b/base.lock"), "").unwrap();
        pin.set(&head).unwrap();
        assert_eq!(pinned(&git_dir, "b").as_deref(), Some(head.as_str()));
        fs::write(git_dir.join("refs/h5i/boxes/b/base.lock"), "").unwrap();
        pin.remove().unwrap();
        assert_eq!(pinned(&git_dir, "b"), None);
        assert!(!git_dir.join("refs/h5i").exists());
    }

    #[test]
    fn advancing_clears_a_killed_updates_lock_but_never_moves_a_pin_someone_else_moved() {
        let (t, git_dir, head) = repo();
        let pin = BoxPin::new(&git_dir, "b");
        pin.set(&head).unwrap();
        let out = Command::new("git")
            .args(["commit", "-q", "--allow-empty", "-m", "d"])
            .env("GIT_AUTHOR_NAME", "t")
            .env("GIT_AUTHOR_EMAIL", "t@example.com")
            .env("GIT_COMMITTER_NAME", "t")
            .env("GIT_COMMITTER_EMAIL", "t@example.com")
            .current_dir(t.path())
            .output()
            .unwrap();
        assert!(out.status.success());
        let out = Command::new("git")
            .args(["rev-parse", "HEAD"])
            .current_dir(t.path())
            .output()
            .unwrap();
        let next = String::from_utf8(out.stdout).unwrap().trim().to_string();
        fs::write(git_dir.join("refs/h5i/boxes/b/base.lock"), "").unwrap();
        pin.advance(&head, &next).unwrap();
        assert_eq!(pinned(&git_dir, "b").as_deref(), Some(next.as_str()));
        assert!(
            pin.advance(&head, &next).is_err(),
            "the pin is no longer at the old base"
        );
        assert_eq!(pinned(&git_dir, "b").as_deref(), Some(next.as_str()));
    }

    #[test]
    fn removing_a_loose_pin_takes_no_packed_refs_lock() {
        let (_t, git_dir, head) = repo();
        let pin = BoxPin::new(&git_dir, "b");
        pin.set(&head).unwrap();
        // A lock another git holds on packed-refs would refuse `git update-ref -d`.
        fs::write(git_dir.join("packed-refs.lock"), "").unwrap();
        pin.remove().unwrap();
        assert_eq!(pinned(&git_dir, "b"), None);
        assert!(
            git_dir.join("packed-refs.lock").exists(),
            "not ours to take"
        );
    }

    #[test]
    fn a_packed_pin_is_deleted_through_git_so_it_does_not_come_back() {
        let (t, git_dir, head) = repo();
        let pin = BoxPin::new(&git_dir, "b");
        pin.set(&head).unwrap();
        let out = Command::new("git")
            .args(["pack-refs", "--all"])
            .current_dir(t.path())
            .output()
            .unwrap();
        assert!(out.status.success());
        assert!(pin.packed_or_reftable().unwrap());
        pin.remove().unwrap();
        assert_eq!(pinned(&git_dir, "b"), None);
        assert!(!BoxPin::new(&git_dir, "c").packed_or_reftable().unwrap());
    }

    #[test]
    fn removing_a_pin_that_is_not_there_is_not_an_error() {
        let (_t, git_dir, _) = repo();
        BoxPin::new(&git_dir, "nothing").remove().unwrap();
    }
}
