//! Writing the export bundle (`patch.diff`, `report.md`, `receipt.json`) all at once or not at
//! all.
//!
//! Owns the `--out` directory's life: an existing non-empty one is refused unless `force`; the
//! files are written into a private sibling (`.<name>.h5i-export-<pid>`, mode 0700), each fsynced,
//! then the directory fsynced and renamed into place (`RENAME_NOREPLACE`; an empty existing
//! directory is removed first; with `force` the old one is swapped out atomically with
//! `RENAME_EXCHANGE`, or renamed aside when the filesystem cannot, and then removed).
//!
//! Must never: leave anything under the requested name unless the whole bundle is there (a crash
//! or a kill part-way leaves at most the hidden sibling); write through a symlink planted in the
//! sibling; replace a non-empty directory without `force`.
//!
//! Guarded by the unit tests below and `tests/export_gate.rs` (an injected failure between files,
//! and a process killed mid-export).

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::rename::{rename_exchange, rename_noreplace};

/// The bundle could not be written.
#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    /// `--out` names no directory (`/`, `..`).
    #[error("refusing: --out {out} does not name a directory to create; to fix: give a directory path such as `--out ./review`")]
    BadOut {
        /// What was given.
        out: PathBuf,
    },
    /// `--out` exists and is not an empty directory.
    #[error("refusing: {out} already exists and is not an empty directory; to fix: choose another --out, or pass --force to replace it")]
    Exists {
        /// The directory.
        out: PathBuf,
    },
    /// A filesystem step failed.
    #[error("refusing: could not {what} {path}: {source}; to fix: check that {parent} exists, is writable by you and has space (nothing was left under the requested name)")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The directory `--out` lives in.
        parent: PathBuf,
        /// The OS error.
        source: io::Error,
    },
}

/// What is at `--out` now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OutState {
    Missing,
    EmptyDir,
    Occupied,
}

fn split_out(out: &Path) -> Result<(PathBuf, std::ffi::OsString), BundleError> {
    let name = out
        .file_name()
        .ok_or_else(|| BundleError::BadOut {
            out: out.to_path_buf(),
        })?
        .to_os_string();
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    Ok((parent, name))
}

fn out_state(out: &Path) -> io::Result<OutState> {
    match fs::symlink_metadata(out) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(OutState::Missing),
        Err(e) => Err(e),
        Ok(m) if m.file_type().is_dir() => {
            if fs::read_dir(out)?.next().is_none() {
                Ok(OutState::EmptyDir)
            } else {
                Ok(OutState::Occupied)
            }
        }
        Ok(_) => Ok(OutState::Occupied),
    }
}

/// Refuse early, before any work, when `out` could not be written.
pub fn preflight(out: &Path, force: bool) -> Result<(), BundleError> {
    let (parent, _) = split_out(out)?;
    let state = out_state(out).map_err(|source| BundleError::Io {
        what: "look at",
        path: out.to_path_buf(),
        parent: parent.clone(),
        source,
    })?;
    if state == OutState::Occupied && !force {
        return Err(BundleError::Exists {
            out: out.to_path_buf(),
        });
    }
    if !parent.is_dir() {
        return Err(BundleError::Io {
            what: "find the directory for",
            path: out.to_path_buf(),
            parent: parent.clone(),
            source: io::Error::from(io::ErrorKind::NotFound),
        });
    }
    Ok(())
}

/// Write `files` (name, bytes) as the directory `out`, atomically. `after_file` is called after
/// each file is written and synced; an error from it abandons the bundle (a test seam for a crash
/// between files).
pub fn write_bundle(
    out: &Path,
    force: bool,
    files: &[(&str, &[u8])],
    after_file: &mut dyn FnMut(&str) -> io::Result<()>,
) -> Result<(), BundleError> {
    let (parent, name) = split_out(out)?;
    let io_err = |what: &'static str, path: &Path| {
        let path = path.to_path_buf();
        let parent = parent.clone();
        move |source| BundleError::Io {
            what,
            path,
            parent,
            source,
        }
    };
    if out_state(out).map_err(io_err("look at", out))? == OutState::Occupied && !force {
        return Err(BundleError::Exists {
            out: out.to_path_buf(),
        });
    }
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(&name);
    tmp_name.push(format!(".h5i-export-{}", std::process::id()));
    let tmp = parent.join(&tmp_name);
    clear_dead_leftovers(&parent, &name);
    if fs::symlink_metadata(&tmp).is_ok() {
        fs::remove_dir_all(&tmp).map_err(io_err("clear a leftover", &tmp))?;
    }
    fs::DirBuilder::new()
        .mode(0o700)
        .create(&tmp)
        .map_err(io_err("create", &tmp))?;
    let written = fill(&tmp, files, after_file).map_err(|(what, path, source)| BundleError::Io {
        what,
        path,
        parent: parent.clone(),
        source,
    });
    let placed = written.and_then(|()| place(&tmp, out, force, &parent));
    if placed.is_err() {
        let _ = fs::remove_dir_all(&tmp);
    }
    placed
}

/// Remove siblings `.<name>.h5i-export-<pid>[.old]` left by exports that died part-way.
fn clear_dead_leftovers(parent: &Path, name: &std::ffi::OsStr) {
    let mut prefix = b".".to_vec();
    prefix.extend_from_slice(name.as_bytes());
    prefix.extend_from_slice(b".h5i-export-");
    let Ok(entries) = fs::read_dir(parent) else {
        return;
    };
    for e in entries.flatten() {
        let n = e.file_name();
        let Some(rest) = n.as_bytes().strip_prefix(prefix.as_slice()) else {
            continue;
        };
        let digits = rest.strip_suffix(b".old").unwrap_or(rest);
        let pid = std::str::from_utf8(digits)
            .ok()
            .and_then(|d| d.parse::<i32>().ok());
        if let Some(pid) = pid {
            if pid > 0 && pid != std::process::id() as i32 && !process_alive(pid) {
                let _ = fs::remove_dir_all(e.path());
            }
        }
    }
}

/// A probe, never a signal: a pid reused since only keeps a stale directory a while longer.
fn process_alive(pid: i32) -> bool {
    h5i_sys::proc::exists(pid)
}

type Failed = (&'static str, PathBuf, io::Error);

fn fill(
    tmp: &Path,
    files: &[(&str, &[u8])],
    after_file: &mut dyn FnMut(&str) -> io::Result<()>,
) -> Result<(), Failed> {
    for (name, bytes) in files {
        let path = tmp.join(name);
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)
            .map_err(|e| ("create", path.clone(), e))?;
        f.write_all(bytes)
            .and_then(|()| f.sync_all())
            .map_err(|e| ("write", path.clone(), e))?;
        after_file(name).map_err(|e| ("finish", path.clone(), e))?;
    }
    File::open(tmp)
        .and_then(|d| d.sync_all())
        .map_err(|e| ("sync", tmp.to_path_buf(), e))
}

/// Move the finished `tmp` to `out`.
fn place(tmp: &Path, out: &Path, force: bool, parent: &Path) -> Result<(), BundleError> {
    let io_err = |what: &'static str, path: &Path| {
        let path = path.to_path_buf();
        let parent = parent.to_path_buf();
        move |source| BundleError::Io {
            what,
            path,
            parent,
            source,
        }
    };
    match out_state(out).map_err(io_err("look at", out))? {
        OutState::Missing => {
            rename_noreplace(tmp, out).map_err(io_err("move the bundle to", out))?;
        }
        OutState::EmptyDir => {
            fs::remove_dir(out).map_err(io_err("replace the empty directory", out))?;
            rename_noreplace(tmp, out).map_err(io_err("move the bundle to", out))?;
        }
        OutState::Occupied if !force => {
            return Err(BundleError::Exists {
                out: out.to_path_buf(),
            })
        }
        OutState::Occupied => match rename_exchange(tmp, out) {
            Ok(()) => {
                // `tmp` now holds the old contents.
                fs::remove_dir_all(tmp).map_err(io_err("remove the replaced", tmp))?;
            }
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL) | Some(libc::ENOSYS)) => {
                let mut aside = tmp.as_os_str().to_os_string();
                aside.push(".old");
                let aside = PathBuf::from(aside);
                fs::rename(out, &aside).map_err(io_err("move aside", out))?;
                if let Err(e) = rename_noreplace(tmp, out) {
                    let _ = fs::rename(&aside, out);
                    return Err(io_err("move the bundle to", out)(e));
                }
                let removed = match fs::symlink_metadata(&aside) {
                    Ok(m) if m.is_dir() => fs::remove_dir_all(&aside),
                    Ok(_) => fs::remove_file(&aside),
                    Err(e) => Err(e),
                };
                removed.map_err(io_err("remove the replaced", &aside))?;
            }
            Err(e) => return Err(io_err("swap the bundle into", out)(e)),
        },
    }
    File::open(parent)
        .and_then(|d| d.sync_all())
        .map_err(io_err("sync", parent))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files() -> Vec<(&'static str, &'static [u8])> {
        vec![
            ("patch.diff", b"p"),
            ("report.md", b"r"),
            ("receipt.json", b"{}"),
        ]
    }

    fn ok(_: &str) -> io::Result<()> {
        Ok(())
    }

    fn siblings(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn writes_a_new_directory_and_fills_an_empty_one() {
        let d = tempfile::tempdir().unwrap();
        let out = d.path().join("review");
        write_bundle(&out, false, &files(), &mut ok).unwrap();
        assert_eq!(fs::read(out.join("report.md")).unwrap(), b"r");
        let empty = d.path().join("empty");
        fs::create_dir(&empty).unwrap();
        write_bundle(&empty, false, &files(), &mut ok).unwrap();
        assert_eq!(fs::read(empty.join("receipt.json")).unwrap(), b"{}");
        assert_eq!(siblings(d.path()), vec!["empty", "review"]);
    }

    #[test]
    fn a_non_empty_out_is_refused_without_force_and_replaced_with_it() {
        let d = tempfile::tempdir().unwrap();
        let out = d.path().join("review");
        fs::create_dir(&out).unwrap();
        fs::write(out.join("mine.txt"), b"keep").unwrap();
        let err = write_bundle(&out, false, &files(), &mut ok).unwrap_err();
        assert!(matches!(err, BundleError::Exists { .. }));
        assert!(err.to_string().contains("--force"));
        assert_eq!(fs::read(out.join("mine.txt")).unwrap(), b"keep");
        assert!(matches!(
            preflight(&out, false),
            Err(BundleError::Exists { .. })
        ));
        write_bundle(&out, true, &files(), &mut ok).unwrap();
        assert!(!out.join("mine.txt").exists());
        assert_eq!(fs::read(out.join("patch.diff")).unwrap(), b"p");
        assert_eq!(siblings(d.path()), vec!["review"]);
    }

    #[test]
    fn a_failure_between_files_leaves_nothing_under_the_name() {
        let d = tempfile::tempdir().unwrap();
        let out = d.path().join("review");
        let mut fail = |name: &str| {
            if name == "report.md" {
                Err(io::Error::other("injected"))
            } else {
                Ok(())
            }
        };
        assert!(write_bundle(&out, false, &files(), &mut fail).is_err());
        assert!(!out.exists());
        assert!(siblings(d.path()).is_empty(), "{:?}", siblings(d.path()));
    }

    #[test]
    fn out_must_name_a_directory() {
        assert!(matches!(
            write_bundle(Path::new("/"), false, &files(), &mut ok),
            Err(BundleError::BadOut { .. })
        ));
    }
}
