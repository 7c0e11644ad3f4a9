//! `--open` (`h5i ui`, `h5i box view`): hand a URL that carries a secret (the console's
//! one-time code, which is not its session token; the viewer's per-box token, which lives in
//! the store already) to this desktop's browser without it appearing in another process's
//! argv or environment.
//!
//! Owns `.git/.h5i/handoff/` (mode 0700, in the store, which no box grant exposes) and the one
//! file per handoff in it, `<pid>-<start>-<random>.html` (created new, mode 0600, never
//! followed through a symlink): a page whose only content is a `meta refresh` to the URL.
//! `xdg-open` is given that file's path, never the URL, because `/proc/PID/cmdline` is readable
//! by every local user and the file by its owner only. The file is removed when the server
//! first admits its secret ([`Handoff::used`]: the browser followed it), when the console's
//! code expires, when `xdg-open` cannot
//! run or fails, and by the next handoff in the store once the process that wrote it has ended
//! (a killed server).
//!
//! What it does not cover: a browser confined away from the store (a snap or flatpak one)
//! cannot read the file; the URL printed on stdout is the way in then.
//!
//! Must never: put the token in an argv or an environment, leave the file readable by anyone
//! but its owner, write it anywhere but the store's private directory, or remove a file another
//! live process wrote.

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

use crate::service_state::ProcId;
use crate::store::BoxStore;

/// The opener the desktop provides.
const OPENER: &str = "xdg-open";

/// One URL handed to the desktop's browser through a private file.
#[derive(Debug)]
pub struct Handoff {
    /// The file, until it is removed.
    file: Mutex<Option<PathBuf>>,
}

/// Why a handoff did not happen (the URL is printed anyway, so none is fatal).
#[derive(Debug, thiserror::Error)]
pub enum HandoffError {
    /// The private directory or the file could not be made safely.
    #[error("refusing: cannot write the handoff file under {}: {source}; to fix: open the printed URL yourself", dir.display())]
    Write {
        /// The directory.
        dir: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The directory is not private to this user.
    #[error("refusing: {} is not a directory of this user's with mode 0700; to fix: remove it (h5i makes it again)", dir.display())]
    NotPrivate {
        /// The directory.
        dir: PathBuf,
    },
    /// `xdg-open` could not be started.
    #[error("refusing: cannot run {OPENER} ({source}); to fix: open the printed URL yourself")]
    Opener {
        /// Why.
        source: io::Error,
    },
}

/// `.git/.h5i/handoff/` of `store`.
pub fn dir(store: &BoxStore) -> PathBuf {
    store.common_dir.join(".h5i").join("handoff")
}

impl Handoff {
    /// Write the handoff file for `url` in `store`'s private directory and give its path to
    /// `xdg-open` (reaped on a thread of its own, which removes the file if the opener fails).
    pub fn open(store: &BoxStore, url: &str) -> Result<Arc<Handoff>, HandoffError> {
        let dir = dir(store);
        private_dir(&dir)?;
        sweep(&dir);
        let file = write_file(&dir, url).map_err(|source| HandoffError::Write {
            dir: dir.clone(),
            source,
        })?;
        let handoff = Arc::new(Handoff {
            file: Mutex::new(Some(file.clone())),
        });
        let spawned = Command::new(OPENER)
            .arg(&file)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn();
        match spawned {
            Ok(mut child) => {
                let mine = Arc::clone(&handoff);
                std::thread::spawn(move || {
                    if !child.wait().is_ok_and(|s| s.success()) {
                        mine.used();
                    }
                });
                Ok(handoff)
            }
            Err(source) => {
                handoff.used();
                Err(HandoffError::Opener { source })
            }
        }
    }

    /// The token was presented (or the opener failed): remove the file, once.
    pub fn used(&self) {
        let taken = match self.file.lock() {
            Ok(mut f) => f.take(),
            Err(poisoned) => poisoned.into_inner().take(),
        };
        if let Some(path) = taken {
            let _ = fs::remove_file(path);
        }
    }
}

/// Make `dir` (mode 0700), or check the one there is this user's, private, and no symlink.
fn private_dir(dir: &Path) -> Result<(), HandoffError> {
    match fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
    {
        Ok(()) => {}
        Err(source) => {
            return Err(HandoffError::Write {
                dir: dir.to_path_buf(),
                source,
            })
        }
    }
    let meta = fs::symlink_metadata(dir).map_err(|source| HandoffError::Write {
        dir: dir.to_path_buf(),
        source,
    })?;
    let me = h5i_sys::ids::euid();
    if !meta.is_dir() || meta.uid() != me || meta.permissions().mode() & 0o777 != 0o700 {
        return Err(HandoffError::NotPrivate {
            dir: dir.to_path_buf(),
        });
    }
    Ok(())
}

/// The page: a refresh to `url`, which h5i built (loopback, a port, a hex token); escaped all
/// the same.
fn page(url: &str) -> String {
    let attr: String = url
        .chars()
        .map(|c| match c {
            '&' => "&amp;".to_string(),
            '"' => "&quot;".to_string(),
            '<' => "&lt;".to_string(),
            '>' => "&gt;".to_string(),
            c => c.to_string(),
        })
        .collect();
    format!(
        "<!doctype html><meta charset=\"utf-8\"><meta name=\"referrer\" content=\"no-referrer\">\
         <meta http-equiv=\"refresh\" content=\"0;url={attr}\"><title>h5i</title>\n"
    )
}

/// Create `<pid>-<start>-<random>.html` in `dir`, new, 0600, holding the page for `url`.
fn write_file(dir: &Path, url: &str) -> io::Result<PathBuf> {
    let me = ProcId::of(std::process::id() as i32)
        .ok_or_else(|| io::Error::other("cannot read this process's start time"))?;
    let random = crate::random::hex(8)?;
    let path = dir.join(format!("{}-{}-{random}.html", me.pid, me.start));
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&path)?;
    let written = f
        .write_all(page(url).as_bytes())
        .and_then(|()| f.sync_all());
    if let Err(e) = written {
        let _ = fs::remove_file(&path);
        return Err(e);
    }
    Ok(path)
}

/// Remove the handoff files of processes that have ended (a server killed before its browser
/// came); a file of a live process, or of a name h5i does not write, is left alone.
fn sweep(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(owner) = name.to_str().and_then(owner_of) else {
            continue;
        };
        if !owner.alive() {
            let _ = fs::remove_file(entry.path());
        }
    }
}

/// The process named by a handoff file's name `<pid>-<start>-<random>.html`.
fn owner_of(name: &str) -> Option<ProcId> {
    let stem = name.strip_suffix(".html")?;
    let mut parts = stem.splitn(3, '-');
    let pid = parts.next()?.parse().ok()?;
    let start = parts.next()?.parse().ok()?;
    parts.next().filter(|r| r.len() == 16)?;
    Some(ProcId { pid, start })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_refreshes_to_the_url_and_escapes_what_would_end_the_attribute() {
        let p = page("http://127.0.0.1:1/?token=ab");
        assert!(
            p.contains("content=\"0;url=http://127.0.0.1:1/?token=ab\""),
            "{p}"
        );
        let hostile = page("http://a.test/\"><script>x</script>&");
        assert!(!hostile.contains("<script>"), "{hostile}");
        assert!(hostile.contains("&quot;&gt;&lt;script&gt;"), "{hostile}");
    }

    #[test]
    fn only_a_file_named_as_h5i_names_them_has_an_owner() {
        assert_eq!(
            owner_of("12-345-0123456789abcdef.html"),
            Some(ProcId {
                pid: 12,
                start: 345
            })
        );
        for other in [
            "12-345-0123456789abcdef.htm",
            "12-345-short.html",
            "x-345-0123456789abcdef.html",
            "notes.txt",
        ] {
            assert_eq!(owner_of(other), None, "{other}");
        }
    }

    #[test]
    fn a_dead_writers_file_is_swept_and_a_live_ones_kept() {
        let t = tempfile::tempdir().unwrap();
        let live = write_file(t.path(), "http://127.0.0.1:1/?token=ab").unwrap();
        let mode = fs::metadata(&live).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let dead = t.path().join("999999999-1-0123456789abcdef.html");
        fs::write(&dead, "x").unwrap();
        let foreign = t.path().join("notes.txt");
        fs::write(&foreign, "x").unwrap();
        sweep(t.path());
        assert!(live.exists() && foreign.exists() && !dead.exists());
    }

    #[test]
    fn a_directory_open_to_others_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("handoff");
        fs::DirBuilder::new().mode(0o755).create(&d).unwrap();
        fs::set_permissions(&d, fs::Permissions::from_mode(0o755)).unwrap();
        assert!(matches!(
            private_dir(&d),
            Err(HandoffError::NotPrivate { .. })
        ));
        fs::set_permissions(&d, fs::Permissions::from_mode(0o700)).unwrap();
        private_dir(&d).unwrap();
    }
}
