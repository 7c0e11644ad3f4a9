//! Runs whose h5i is gone: a container run's lock, and the reaper that finds runs nobody holds.
//!
//! Owns the run lock protocol. Every container run holds an exclusive lock on
//! `<runs dir>/run-<id>.lock` for its whole life (made under a dot-name, locked, then renamed
//! into place, so no reaper ever sees it unlocked). An h5i killed with SIGKILL runs no cleanup:
//! its container keeps running under conmon and its run directory, cage and (as root) the
//! attachments in the engine's mount namespace stay. The kernel drops the lock with the
//! process, so the next container run, `abort` or `rm` finds the lock free and removes what the
//! run left, in the order that stops the box first: the cage's processes killed, the container
//! removed, the attachments detached, the run directory and the lock removed. Conmon's own
//! `--timeout` (`podman_args`) bounds a run whose reaper never comes.
//!
//! Must never: touch a run whose lock is held (a live run of any box), or follow a name from
//! the runs directory out of it.

use std::fs;
use std::io;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::engine::Engine;
use super::engine_ns;

/// The lock a live run holds; removed (then released) when the run ends.
#[derive(Debug)]
pub struct RunLock {
    path: PathBuf,
    _file: fs::File,
}

fn lock_path(runs: &Path, id: &str) -> PathBuf {
    runs.join(format!("run-{id}.lock"))
}

impl RunLock {
    /// Take run `id`'s lock in `runs` (the directory its run directory will be made in).
    pub fn take(runs: &Path, id: &str) -> io::Result<RunLock> {
        let staged = runs.join(format!(".run-{id}.lock"));
        let file = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&staged)?;
        let locked = file.try_lock().map_err(io::Error::from).and_then(|()| {
            let path = lock_path(runs, id);
            fs::rename(&staged, &path).map(|()| path)
        });
        match locked {
            Ok(path) => Ok(RunLock { path, _file: file }),
            Err(e) => {
                let _ = fs::remove_file(&staged);
                Err(e)
            }
        }
    }
}

impl Drop for RunLock {
    fn drop(&mut self) {
        // Unlinked while still held: a reaper that opened it before sees another inode at the
        // path once it gets the lock, and leaves it.
        let _ = fs::remove_file(&self.path);
    }
}

/// The run ids in `runs` whose lock nobody holds, each returned with its lock now held by the
/// caller (so two reapers never reap one run).
fn unheld(runs: &Path) -> Vec<(String, fs::File)> {
    let Ok(entries) = fs::read_dir(runs) else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(id) = name
            .to_str()
            .and_then(|n| n.strip_prefix("run-"))
            .and_then(|n| n.strip_suffix(".lock"))
        else {
            continue;
        };
        if !plain_id(id) {
            continue;
        }
        let path = e.path();
        let Ok(file) = fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
            .open(&path)
        else {
            continue;
        };
        if file.try_lock().is_err() {
            continue;
        }
        // The lock we hold must still be the one at the path (its run may have ended and
        // removed it between our open and our lock).
        let same = match (file.metadata(), fs::symlink_metadata(&path)) {
            (Ok(held), Ok(now)) => held.ino() == now.ino() && held.dev() == now.dev(),
            _ => false,
        };
        if same && file.metadata().is_ok_and(|m| m.is_file()) {
            found.push((id.to_owned(), file));
        }
    }
    found
}

/// An id h5i could have made (`<box>-<pid>-<ms>`): one path component that cannot climb.
fn plain_id(id: &str) -> bool {
    !id.is_empty()
        && !id.starts_with('.')
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// Remove what every run in `runs` whose h5i is gone left behind; the ids reaped.
pub fn reap(engine: &Engine, runs: &Path) -> Vec<String> {
    let orphans = unheld(runs);
    let mut reaped = Vec::new();
    for (id, _held) in orphans {
        let _ = h5i_runtime::cage::remove_tree(&id);
        engine.podman_quiet(&["rm", "--force", "--time", "0", &format!("h5i-{id}")]);
        let dir = runs.join(format!("run-{id}"));
        if engine.switches_user {
            if let Ok(ns) = engine_ns::engine_namespace(engine) {
                let targets: Vec<PathBuf> = ["work", "spool", "objects", "alternates"]
                    .iter()
                    .map(|t| dir.join(t))
                    .chain(
                        ["h5i-runc", "h5i-hook"]
                            .iter()
                            .map(|b| dir.join("bin").join(b)),
                    )
                    .collect();
                engine_ns::detach_all(&ns, &targets);
            }
        }
        match fs::remove_dir_all(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(_) => continue,
        }
        let _ = fs::remove_file(lock_path(runs, &id));
        reaped.push(id);
    }
    reaped
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runs() -> tempfile::TempDir {
        tempfile::tempdir().unwrap()
    }

    #[test]
    fn a_held_lock_is_never_reaped_and_an_unheld_one_is() {
        let d = runs();
        let _live = RunLock::take(d.path(), "b-1-2").unwrap();
        assert!(d.path().join("run-b-1-2.lock").is_file());
        assert!(!d.path().join(".run-b-1-2.lock").exists());
        assert!(unheld(d.path()).is_empty());
        // What a run killed with SIGKILL leaves: the file, with no holder.
        fs::write(d.path().join("run-b-3-4.lock"), "").unwrap();
        let found: Vec<String> = unheld(d.path()).into_iter().map(|(id, _)| id).collect();
        assert_eq!(found, ["b-3-4"]);
    }

    #[test]
    fn a_run_that_ends_removes_its_lock() {
        let d = runs();
        drop(RunLock::take(d.path(), "b-1-2").unwrap());
        assert_eq!(fs::read_dir(d.path()).unwrap().count(), 0);
    }

    #[test]
    fn names_that_are_not_run_locks_are_left_alone() {
        let d = runs();
        for n in [
            "run-.lock",
            "run-..lock",
            "run-a b.lock",
            ".run-x.lock",
            "run-x",
            "other.lock",
        ] {
            fs::write(d.path().join(n), "").unwrap();
        }
        std::os::unix::fs::symlink("/etc/passwd", d.path().join("run-s.lock")).unwrap();
        assert!(unheld(d.path()).is_empty());
    }

    #[test]
    fn two_takes_of_one_id_cannot_both_hold_it() {
        let d = runs();
        let _a = RunLock::take(d.path(), "b-1-2").unwrap();
        fs::write(d.path().join(".run-b-1-2.lock"), "").unwrap();
        assert!(RunLock::take(d.path(), "b-1-2").is_err());
    }
}
