//! `h5i browser url`: where a human's viewer of a box's browser connects, token included.
//!
//! Owns `<box>/browser/viewer.token`, the box's viewer token (32 random bytes as 64 hex
//! digits, mode 0600, in the box directory, which no grant exposes: the box can neither read
//! nor write it), minted when the box is created ([`mint`]; a box made before that gets it the
//! first time it is asked for), and the URL built from it: loopback only, on the port asked for
//! ([`DEFAULT_PORT`] unless told), the token in the query.
//!
//! Must never: print a URL for anything but loopback, mint a second token for a box that has
//! one (a viewer already opened keeps its URL), or leave a partial token: a new one is written
//! to a private file and hard-linked into place, so a killed verb leaves no token or a whole
//! one, and two racing verbs both print the one linked first.
//!
//! Guarded by the unit tests below and `tests/browser.rs`.

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::control::{self, ControlError};
use crate::error::BoxError;
use crate::store::{BoxPaths, BoxStore};

/// The viewer's port unless `--port` says otherwise (the manual's `h5i box view` default).
pub const DEFAULT_PORT: u16 = 7331;

/// Random bytes in a token.
const TOKEN_BYTES: usize = 32;

/// The viewer URL of box `name`'s browser on loopback `port`, minting the box's token if it
/// has none. Refuses a box that is not a browser box.
pub fn url(store: &BoxStore, name: &str, port: u16) -> Result<String, ControlError> {
    let sb = control::browser_box(store, name)?;
    Ok(url_with(&token(&sb.paths)?, port))
}

/// The viewer URL on loopback `port` carrying `token`.
pub fn url_with(token: &str, port: u16) -> String {
    format!("http://127.0.0.1:{port}/?token={token}")
}

/// Mint the viewer token of a browser box being created (in its staging directory).
pub fn mint(paths: &BoxPaths) -> Result<(), BoxError> {
    token(paths).map(drop)
}

fn token_path(paths: &BoxPaths) -> PathBuf {
    control::dir(paths).join("viewer.token")
}

/// Whether `given` is the box's token `expected`, compared in constant time (every byte of
/// equal-length inputs is looked at whatever the first difference).
pub fn token_matches(expected: &str, given: &str) -> bool {
    let (e, g) = (expected.as_bytes(), given.as_bytes());
    e.len() == g.len() && e.iter().zip(g).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
}

/// The box's token, minted on first ask.
pub(super) fn token(paths: &BoxPaths) -> Result<String, BoxError> {
    let path = token_path(paths);
    if let Some(t) = read_token(&path)? {
        return Ok(t);
    }
    let dir = control::dir(paths);
    match fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(BoxError::io(&dir, e)),
    }
    let hex = crate::random::hex_for_box(TOKEN_BYTES)?;
    let tmp = dir.join(format!(".viewer.token.new-{}", std::process::id()));
    // A file of this name is a killed verb's (pids are not reused while we run).
    let _ = fs::remove_file(&tmp);
    let linked = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .and_then(|mut f| {
            f.write_all(hex.as_bytes())?;
            f.sync_all()
        })
        .and_then(|()| match fs::hard_link(&tmp, &path) {
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => Err(e),
            _ => Ok(()),
        });
    let _ = fs::remove_file(&tmp);
    linked.map_err(|e| BoxError::io(&path, e))?;
    read_token(&path)?.ok_or_else(|| BoxError::Corrupt {
        path,
        what: "the viewer token vanished as it was written".into(),
    })
}

/// The token at `path`, `None` when there is none yet.
fn read_token(path: &Path) -> Result<Option<String>, BoxError> {
    match fs::read_to_string(path) {
        Ok(t) if t.len() == 2 * TOKEN_BYTES && t.bytes().all(|b| b.is_ascii_hexdigit()) => {
            Ok(Some(t))
        }
        Ok(_) => Err(BoxError::Corrupt {
            path: path.to_path_buf(),
            what: format!("not a viewer token of {} hex digits", 2 * TOKEN_BYTES),
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(BoxError::io(path, e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn paths(t: &tempfile::TempDir) -> BoxPaths {
        BoxPaths {
            dir: t.path().to_path_buf(),
        }
    }

    #[test]
    fn a_token_is_minted_once_private_and_kept() {
        let t = tempfile::tempdir().unwrap();
        let p = paths(&t);
        let first = token(&p).unwrap();
        assert_eq!(first.len(), 2 * TOKEN_BYTES);
        assert_eq!(token(&p).unwrap(), first);
        let mode = fs::metadata(token_path(&p)).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let left: Vec<_> = fs::read_dir(control::dir(&p)).unwrap().flatten().collect();
        assert_eq!(left.len(), 1, "a temporary file was left: {left:?}");
        let other = tempfile::tempdir().unwrap();
        assert_ne!(token(&paths(&other)).unwrap(), first);
    }

    #[test]
    fn only_the_whole_token_matches() {
        let t = "ab".repeat(TOKEN_BYTES);
        assert!(token_matches(&t, &t));
        for bad in [
            "",
            "ab",
            &format!("{t}0"),
            &"ab".repeat(TOKEN_BYTES - 1),
            &"ba".repeat(TOKEN_BYTES),
        ] {
            assert!(!token_matches(&t, bad), "{bad}");
        }
    }

    #[test]
    fn a_damaged_token_is_refused_not_reminted() {
        let t = tempfile::tempdir().unwrap();
        let p = paths(&t);
        fs::create_dir(control::dir(&p)).unwrap();
        for bad in [
            "",
            "zz",
            &"g".repeat(2 * TOKEN_BYTES),
            &"a".repeat(2 * TOKEN_BYTES + 1),
        ] {
            fs::write(token_path(&p), bad).unwrap();
            let err = token(&p).unwrap_err().to_string();
            assert!(err.starts_with("refusing: "), "{err}");
            assert_eq!(fs::read_to_string(token_path(&p)).unwrap(), bad);
        }
    }
}
