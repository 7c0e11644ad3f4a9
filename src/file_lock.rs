//! File locks: the one place h5i opens a lock file and takes, waits for or downgrades a
//! `flock(2)` on it.
//!
//! Owns the lock file's opening (created mode 0600, a symlink at its last component refused)
//! and the lock's kinds: shared or exclusive, waited for or tried, a wait restarted when a
//! signal interrupts it; and the one way to lock a file that another h5i may remove together
//! with its directory ([`FileLock::take_in_place`]).
//!
//! Must never: report as held a lock that is not (a lock on a file no longer at its path
//! guards nothing), or read any error but "held elsewhere" as "held elsewhere".

use std::fs::{self, File};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::Path;

use rustix::fs::{flock, FlockOperation};

/// Which lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockKind {
    /// Held by any number at once, none exclusive.
    Shared,
    /// Held by one.
    Exclusive,
}

/// A held lock; released when dropped (the lock lives as long as the open file).
#[derive(Debug)]
pub struct FileLock {
    file: File,
}

/// How many times [`FileLock::take_in_place`] locks again after another h5i removed the file
/// it locked (each retry means another removal happened meanwhile).
const IN_PLACE_ATTEMPTS: usize = 8;

impl FileLock {
    /// Wait for `kind` on `path`, creating the file.
    pub fn wait(path: &Path, kind: LockKind) -> io::Result<FileLock> {
        let file = open(path)?;
        let op = match kind {
            LockKind::Shared => FlockOperation::LockShared,
            LockKind::Exclusive => FlockOperation::LockExclusive,
        };
        lock(&file, op)?;
        Ok(FileLock { file })
    }

    /// Take `kind` on `path`, creating the file, unless a conflicting lock is held there:
    /// then `Ok(None)`, without waiting.
    pub fn try_take(path: &Path, kind: LockKind) -> io::Result<Option<FileLock>> {
        let file = open(path)?;
        let op = match kind {
            LockKind::Shared => FlockOperation::NonBlockingLockShared,
            LockKind::Exclusive => FlockOperation::NonBlockingLockExclusive,
        };
        match lock(&file, op) {
            Ok(()) => Ok(Some(FileLock { file })),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Wait for the exclusive lock on `dir/name`, making `dir` (mode 0700) when it is not
    /// there, for a directory another h5i may remove, lock file included, between this one's
    /// `mkdir` and its `flock` (a sweep of directories that look abandoned): the lock is
    /// taken again, boundedly, until the file locked is the one at the path.
    pub fn take_in_place(dir: &Path, name: &str) -> io::Result<FileLock> {
        FileLock::take_in_place_as(dir, name, LockKind::Exclusive)
    }

    /// [`FileLock::take_in_place`] for a lock of `kind`.
    pub fn take_in_place_as(dir: &Path, name: &str, kind: LockKind) -> io::Result<FileLock> {
        let path = dir.join(name);
        let mut last = None;
        for _ in 0..IN_PLACE_ATTEMPTS {
            match fs::DirBuilder::new().mode(0o700).create(dir) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e),
            }
            let held = match FileLock::wait(&path, kind) {
                Ok(held) => held,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    last = Some(e);
                    continue;
                }
                Err(e) => return Err(e),
            };
            let locked = held.file.metadata()?;
            match fs::symlink_metadata(&path) {
                Ok(now) if now.dev() == locked.dev() && now.ino() == locked.ino() => {
                    return Ok(held)
                }
                Ok(_) => last = None,
                Err(e) if e.kind() == io::ErrorKind::NotFound => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| io::Error::other("the lock file kept being replaced")))
    }

    /// Turn a held exclusive lock into a shared one, atomically.
    pub fn downgrade(&self) -> io::Result<()> {
        lock(&self.file, FlockOperation::LockShared)
    }
}

fn open(path: &Path) -> io::Result<File> {
    fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
}

fn lock(file: &File, op: FlockOperation) -> io::Result<()> {
    loop {
        match flock(file, op) {
            Ok(()) => return Ok(()),
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exclusive_lock_refuses_a_try_and_a_shared_one_admits_shared_tries() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("lock");
        let held = FileLock::wait(&p, LockKind::Exclusive).unwrap();
        assert!(FileLock::try_take(&p, LockKind::Shared).unwrap().is_none());
        assert!(FileLock::try_take(&p, LockKind::Exclusive)
            .unwrap()
            .is_none());
        held.downgrade().unwrap();
        let shared = FileLock::try_take(&p, LockKind::Shared).unwrap();
        assert!(shared.is_some(), "a downgraded lock admits readers");
        assert!(FileLock::try_take(&p, LockKind::Exclusive)
            .unwrap()
            .is_none());
        drop((held, shared));
        assert!(FileLock::try_take(&p, LockKind::Exclusive)
            .unwrap()
            .is_some());
    }

    #[test]
    fn a_symlink_planted_at_the_lock_path_is_refused_not_followed() {
        let d = tempfile::tempdir().unwrap();
        let target = d.path().join("elsewhere");
        let p = d.path().join("lock");
        std::os::unix::fs::symlink(&target, &p).unwrap();
        let err = FileLock::wait(&p, LockKind::Exclusive).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ELOOP));
        assert!(!target.exists(), "nothing created through the link");
    }

    #[test]
    fn taking_in_place_remakes_a_removed_directory_and_locks_the_file_that_is_there() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("sandbox");
        drop(FileLock::take_in_place(&dir, "lock").unwrap());
        fs::remove_dir_all(&dir).unwrap();
        let held = FileLock::take_in_place(&dir, "lock").unwrap();
        let now = fs::symlink_metadata(dir.join("lock")).unwrap();
        assert_eq!(held.file.metadata().unwrap().ino(), now.ino());
        assert!(dir.is_dir());
    }
}
