//! `h5i box allow`: the persistent, user-level egress allowlist at `~/.config/h5i/allow.txt`.
//!
//! Owns where the file lives, listing it, adding an entry (validated with the policy's own host
//! normalization, written atomically, the file 0600 in a 0700 directory), refusing to run inside
//! a box, and loading it for a run. The file format and the merge rule (only into a profile that
//! already sets `net.egress`; a deny-all profile is never widened) live in
//! [`h5i_broker::egress`]. Must never: run inside a box (a box must not widen its own egress),
//! or write anywhere but the allowlist file and its directory.
//!
//! Guarded by the unit tests below and `broker/tests/broker_egress.rs`
//! (`the_user_allowlist_does_not_widen_a_deny_all_profile`).

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use h5i_broker::egress::{parse_user_allowlist, render_user_allowlist, AllowlistError};
use h5i_policy::values::ValueProblem;
use h5i_policy::HostPort;

/// The allowlist could not be read or changed.
#[derive(Debug, thiserror::Error)]
pub enum AllowError {
    /// Run inside a box.
    #[error("refusing: `h5i box allow` inside box {id}: a box must not widen its own egress; to fix: run it on the host, outside every box")]
    InsideBox {
        /// The box's id (`H5I_ENV_ID`).
        id: String,
    },
    /// No usable HOME.
    #[error("refusing: HOME is unset or not an absolute path, so ~/.config/h5i/allow.txt has no place; to fix: set HOME to your home directory")]
    NoHome,
    /// The entry given is not a destination.
    #[error("refusing: `{entry}` is not an egress destination: {what}; to fix: {mend}")]
    BadEntry {
        /// What was given.
        entry: String,
        /// What is wrong.
        what: String,
        /// How to mend it.
        mend: String,
    },
    /// The file holds a bad line.
    #[error("{source} (in {path})")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// The bad line.
        source: AllowlistError,
    },
    /// Reading or writing failed.
    #[error("refusing: {path}: {source}; to fix: check ~/.config/h5i is yours and writable")]
    Io {
        /// The path.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
}

/// Refuse when `H5I_ENV_ID` (read through `env`) says this process is inside a box.
pub fn refuse_inside_box(env: impl Fn(&str) -> Option<String>) -> Result<(), AllowError> {
    match env("H5I_ENV_ID").filter(|v| !v.is_empty()) {
        Some(id) => Err(AllowError::InsideBox { id }),
        None => Ok(()),
    }
}

/// `~/.config/h5i/allow.txt` for the HOME `env` gives.
pub fn allowlist_path(env: impl Fn(&str) -> Option<String>) -> Result<PathBuf, AllowError> {
    let home = env("HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .ok_or(AllowError::NoHome)?;
    Ok(home.join(".config").join("h5i").join("allow.txt"))
}

/// The entries in the file at `path` (none when it does not exist).
pub fn list(path: &Path) -> Result<Vec<HostPort>, AllowError> {
    let text = match fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(AllowError::Io {
                path: path.to_owned(),
                source,
            })
        }
    };
    parse_user_allowlist(&text).map_err(|source| AllowError::Invalid {
        path: path.to_owned(),
        source,
    })
}

/// Add `entry` (`host` or `host:port`, port 443 when absent). Returns the normalized entry and
/// whether it was new.
pub fn add(path: &Path, entry: &str) -> Result<(HostPort, bool), AllowError> {
    let hp: HostPort = entry
        .parse()
        .map_err(|p: ValueProblem| AllowError::BadEntry {
            entry: entry.to_owned(),
            what: p.what,
            mend: p.mend,
        })?;
    let mut entries = list(path)?;
    if entries.contains(&hp) {
        return Ok((hp, false));
    }
    entries.push(hp.clone());
    write(path, render_user_allowlist(&entries).as_bytes())?;
    Ok((hp, true))
}

fn write(path: &Path, bytes: &[u8]) -> Result<(), AllowError> {
    let io_err = |p: &Path| {
        let p = p.to_owned();
        move |source| AllowError::Io { path: p, source }
    };
    let dir = path.parent().unwrap_or(Path::new("."));
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(io_err(dir))?;
    let tmp = dir.join(format!(".allow.txt.tmp-{}", std::process::id()));
    let res = (|| {
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if let Err(e) = res {
        let _ = fs::remove_file(&tmp);
        return Err(io_err(path)(e));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_refuses_inside_a_box_naming_the_mend() {
        let err =
            refuse_inside_box(|k| (k == "H5I_ENV_ID").then(|| "box-1".to_string())).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.starts_with("refusing: ") && msg.contains("box-1"),
            "{msg}"
        );
        assert!(msg.contains("to fix: run it on the host"), "{msg}");
        assert!(refuse_inside_box(|_| None).is_ok());
        assert!(refuse_inside_box(|_| Some(String::new())).is_ok());
    }

    #[test]
    fn the_file_lives_under_the_users_config_dir() {
        let p = allowlist_path(|k| (k == "HOME").then(|| "/home/u".to_string())).unwrap();
        assert_eq!(p, PathBuf::from("/home/u/.config/h5i/allow.txt"));
        assert!(matches!(allowlist_path(|_| None), Err(AllowError::NoHome)));
        assert!(matches!(
            allowlist_path(|_| Some("rel".into())),
            Err(AllowError::NoHome)
        ));
    }

    #[test]
    fn add_validates_normalizes_and_deduplicates() {
        let t = tempfile::tempdir().unwrap();
        let path = t.path().join(".config/h5i/allow.txt");
        assert!(list(&path).unwrap().is_empty());
        let (hp, new) = add(&path, "API.GitHub.com").unwrap();
        assert_eq!(hp.to_string(), "api.github.com:443");
        assert!(new);
        assert!(!add(&path, "api.github.com:443").unwrap().1);
        add(&path, "registry.npmjs.org").unwrap();
        let err = add(&path, "https://x.test").unwrap_err();
        assert!(matches!(err, AllowError::BadEntry { .. }), "{err}");
        assert_eq!(
            list(&path)
                .unwrap()
                .iter()
                .map(|h| h.to_string())
                .collect::<Vec<_>>(),
            ["api.github.com:443", "registry.npmjs.org:443"]
        );
        use std::os::unix::fs::PermissionsExt;
        let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        fs::write(&path, "ok.test\nnot a host\n").unwrap();
        let err = list(&path).unwrap_err();
        assert!(err.to_string().contains("line 2"), "{err}");
    }
}
