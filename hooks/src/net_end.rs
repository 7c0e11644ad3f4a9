//! The end of a supervised run's net directory, when h5i-runc chose it (`net-down`, poststop).
//!
//! h5i-runc gives a spec that names no `h5i.net.dir` one of its own choosing
//! (`<base>/h5i-net/<first 16 of the id>`, `<base>` = `/run` for real root, else
//! `$XDG_RUNTIME_DIR`) and marks it `h5i.net.dir.made-by = h5i-runc`. Such a directory belongs
//! to one run: when it ends, [`finish`] copies the tally and the sentry's log into the bundle
//! (`h5i-net-tally.json`, `h5i-net-sentry.log`: they live as long as the container does, and
//! `podman rm` removes them with it), then removes the directory. A directory the caller named
//! (h5i's own supervised tier names one, and reads the tally there) is never touched.
//!
//! Must never: follow a symlink (the directory, or any entry in it, may be one: a link is
//! removed as a link, and a file is read only through `O_NOFOLLOW`), remove anything but that
//! one directory directly beneath a private `h5i-net` of this user's, or write anywhere but
//! those two files in the bundle. Guarded by the unit tests below and the Podman tests in
//! `hooks/tests/supervised_net.rs`.

use std::io::{self, Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::net_spec::{SENTRY_LOG, TALLY};

pub use h5i_policy::spec_names::annotation::NET_DIR_MADE_BY as ANNOTATION_MADE_BY;
use h5i_policy::spec_names::annotation::{NET, NET_DIR};
pub use h5i_policy::spec_names::value::MADE_BY_H5I_RUNC;
use h5i_policy::spec_names::value::NET_SUPERVISED;
/// The parent directory's name.
const NET_DIR_NAME: &str = "h5i-net";
/// Where the tally is kept in the bundle.
pub const KEPT_TALLY: &str = "h5i-net-tally.json";
/// Where the sentry's log is kept in the bundle.
pub const KEPT_LOG: &str = "h5i-net-sentry.log";
/// The most of either file kept.
const MAX_KEPT: u64 = 1 << 20;

/// Why the directory could not be removed.
#[derive(Debug, thiserror::Error)]
#[error("refusing: cannot remove the supervised network's directory {dir}: {source}; to fix: remove it by hand (it held one finished run)")]
pub struct NetEndError {
    /// The directory.
    pub dir: PathBuf,
    /// The OS error.
    pub source: io::Error,
}

/// What [`finish`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finished {
    /// The directory was the caller's own (or not h5i-runc's shape): left alone.
    NotOurs,
    /// Removed; the sentry's log is kept at `log` when there was one to keep.
    Removed {
        /// The kept log, in the bundle.
        log: Option<PathBuf>,
    },
}

/// At the end of container `id`'s run: keep the tally and log in `bundle`, then remove the net
/// directory, when the spec `config` says h5i-runc made it.
pub fn finish(config: &Value, id: &str, bundle: &Path) -> Result<Finished, NetEndError> {
    finish_with(config, id, bundle, is_real_root())
}

/// [`finish`] with the caller's kind given (real root's directory is under `/run` only).
fn finish_with(
    config: &Value,
    id: &str,
    bundle: &Path,
    real_root: bool,
) -> Result<Finished, NetEndError> {
    let Some(dir) = made_for(config, id, real_root) else {
        return Ok(Finished::NotOurs);
    };
    let failed = |source| NetEndError {
        dir: dir.clone(),
        source,
    };
    let meta = match std::fs::symlink_metadata(&dir) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Ok(Finished::Removed { log: None })
        }
        Err(e) => return Err(failed(e)),
    };
    if !meta.file_type().is_dir() {
        // Something planted in its place: unlinked (a symlink is never followed).
        std::fs::remove_file(&dir).map_err(failed)?;
        return Ok(Finished::Removed { log: None });
    }
    if meta.uid() != euid() {
        return Err(failed(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("owned by uid {}, not this user", meta.uid()),
        )));
    }
    // Keeping is best effort: a file that is missing, a link or not regular is not kept.
    let _ = keep(&dir.join(TALLY), &bundle.join(KEPT_TALLY));
    let log = keep(&dir.join(SENTRY_LOG), &bundle.join(KEPT_LOG))
        .ok()
        .map(|()| bundle.join(KEPT_LOG));
    // Removes every entry without following a symlink (a link inside is removed as a link).
    std::fs::remove_dir_all(&dir).map_err(failed)?;
    Ok(Finished::Removed { log })
}

/// The spec's net directory when h5i-runc made it for this run: the marker, the shape
/// `<base>/h5i-net/<first 16 of id>` (`/run` as real root), and a parent that is a private
/// directory of this user's (never a symlink).
fn made_for(config: &Value, id: &str, real_root: bool) -> Option<PathBuf> {
    let ann = config.get("annotations")?;
    let get = |k: &str| ann.get(k).and_then(Value::as_str);
    if get(NET) != Some(NET_SUPERVISED) || get(ANNOTATION_MADE_BY) != Some(MADE_BY_H5I_RUNC) {
        return None;
    }
    let dir = PathBuf::from(get(NET_DIR)?);
    let short: String = id.chars().take(16).collect();
    let parent = dir.parent()?;
    let shaped = dir.is_absolute()
        && !short.is_empty()
        && dir.file_name() == Some(std::ffi::OsStr::new(&short))
        && parent.file_name() == Some(std::ffi::OsStr::new(NET_DIR_NAME))
        && (!real_root || parent == Path::new("/run").join(NET_DIR_NAME));
    let meta = std::fs::symlink_metadata(parent).ok()?;
    let private = meta.file_type().is_dir() && meta.uid() == euid() && meta.mode() & 0o077 == 0;
    (shaped && private).then_some(dir)
}

/// Copy the regular file `from` (opened without following a symlink, at most [`MAX_KEPT`]) to
/// a new file `to` (whatever was at `to` is unlinked first; the new one is made exclusively,
/// mode 0600, so a link planted there is never written through).
fn keep(from: &Path, to: &Path) -> io::Result<()> {
    let src = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(from)?;
    if !src.metadata()?.file_type().is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    let mut bytes = Vec::new();
    src.take(MAX_KEPT).read_to_end(&mut bytes)?;
    match std::fs::remove_file(to) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(to)?
        .write_all(&bytes)
}

fn euid() -> u32 {
    h5i_sys::ids::euid()
}

/// Root in the initial user namespace (rootless Podman's hooks run as uid 0 in its own).
fn is_real_root() -> bool {
    let initial = std::fs::read_to_string("/proc/self/uid_map")
        .is_ok_and(|m| m.split_whitespace().collect::<Vec<_>>() == ["0", "0", "4294967295"]);
    euid() == 0 && initial
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};

    const ID: &str = "0123456789abcdef0123";

    /// `<tmp>/h5i-net/<first 16 of ID>` (both 0700), a bundle, and a victim tree outside.
    struct Run {
        tmp: tempfile::TempDir,
        dir: PathBuf,
        bundle: PathBuf,
        victim: PathBuf,
    }

    impl Run {
        fn new() -> Run {
            let tmp = tempfile::tempdir().unwrap();
            let parent = tmp.path().join(NET_DIR_NAME);
            let dir = parent.join(&ID[..16]);
            for d in [&parent, &dir] {
                std::fs::DirBuilder::new().mode(0o700).create(d).unwrap();
            }
            let bundle = tmp.path().join("bundle");
            let victim = tmp.path().join("victim");
            for d in [&bundle, &victim] {
                std::fs::create_dir(d).unwrap();
            }
            std::fs::write(victim.join("secret"), "host secret").unwrap();
            Run {
                tmp,
                dir,
                bundle,
                victim,
            }
        }

        fn config(&self, made_by: bool) -> Value {
            let mut ann = json!({"h5i.net": "supervised", "h5i.net.dir": self.dir});
            if made_by {
                ann[ANNOTATION_MADE_BY] = json!(MADE_BY_H5I_RUNC);
            }
            json!({ "annotations": ann })
        }

        fn finish(&self, config: &Value) -> Result<Finished, NetEndError> {
            finish_with(config, ID, &self.bundle, false)
        }

        fn victim_intact(&self) {
            assert_eq!(
                std::fs::read_to_string(self.victim.join("secret")).unwrap(),
                "host secret"
            );
        }
    }

    #[test]
    fn the_tally_and_log_are_kept_in_the_bundle_and_the_directory_is_removed() {
        let r = Run::new();
        std::fs::write(r.dir.join(TALLY), r#"{"egress":{}}"#).unwrap();
        std::fs::write(r.dir.join(SENTRY_LOG), "uplink up\n").unwrap();
        let done = r.finish(&r.config(true)).unwrap();
        assert_eq!(
            done,
            Finished::Removed {
                log: Some(r.bundle.join(KEPT_LOG))
            }
        );
        assert!(std::fs::symlink_metadata(&r.dir).is_err());
        assert!(r.dir.parent().unwrap().is_dir(), "h5i-net itself stays");
        assert_eq!(
            std::fs::read_to_string(r.bundle.join(KEPT_TALLY)).unwrap(),
            r#"{"egress":{}}"#
        );
        let kept = std::fs::metadata(r.bundle.join(KEPT_LOG)).unwrap();
        assert_eq!(kept.mode() & 0o777, 0o600);
    }

    #[test]
    fn a_symlink_planted_in_place_of_the_net_dir_is_unlinked_and_never_read() {
        let r = Run::new();
        std::fs::write(r.victim.join(TALLY), "victim's").unwrap();
        std::fs::remove_dir(&r.dir).unwrap();
        std::os::unix::fs::symlink(&r.victim, &r.dir).unwrap();
        assert_eq!(
            r.finish(&r.config(true)).unwrap(),
            Finished::Removed { log: None }
        );
        assert!(
            std::fs::symlink_metadata(&r.dir).is_err(),
            "the link is gone"
        );
        r.victim_intact();
        assert!(r.victim.join(TALLY).exists());
        assert!(
            !r.bundle.join(KEPT_TALLY).exists(),
            "nothing read through the link"
        );
    }

    #[test]
    fn links_and_directories_planted_inside_are_removed_without_being_followed() {
        let r = Run::new();
        std::os::unix::fs::symlink(r.victim.join("secret"), r.dir.join(TALLY)).unwrap();
        std::os::unix::fs::symlink(&r.victim, r.dir.join(SENTRY_LOG)).unwrap();
        let sub = r.dir.join("planted");
        std::fs::create_dir(&sub).unwrap();
        std::os::unix::fs::symlink(&r.victim, sub.join("deeper")).unwrap();
        std::fs::write(sub.join("file"), "x").unwrap();
        // A link planted in the bundle where the tally goes is replaced, not written through.
        std::os::unix::fs::symlink(r.victim.join("secret"), r.bundle.join(KEPT_LOG)).unwrap();
        assert_eq!(
            r.finish(&r.config(true)).unwrap(),
            Finished::Removed { log: None }
        );
        assert!(std::fs::symlink_metadata(&r.dir).is_err());
        r.victim_intact();
        assert!(
            !r.bundle.join(KEPT_TALLY).exists(),
            "a linked tally is not kept"
        );

        let r = Run::new();
        std::fs::write(r.dir.join(SENTRY_LOG), "log").unwrap();
        std::os::unix::fs::symlink(r.victim.join("secret"), r.bundle.join(KEPT_LOG)).unwrap();
        r.finish(&r.config(true)).unwrap();
        r.victim_intact();
        let kept = r.bundle.join(KEPT_LOG);
        assert!(std::fs::symlink_metadata(&kept).unwrap().is_file());
        assert_eq!(std::fs::read_to_string(kept).unwrap(), "log");
    }

    #[test]
    fn a_directory_the_caller_named_or_of_another_shape_is_never_touched() {
        let r = Run::new();
        std::fs::write(r.dir.join(TALLY), "{}").unwrap();
        // No marker: the caller's own directory (h5i's supervised tier reads the tally there).
        assert_eq!(r.finish(&r.config(false)).unwrap(), Finished::NotOurs);
        // Another container's id.
        let mut c = r.config(true);
        assert_eq!(
            finish_with(&c, "fedcba9876543210", &r.bundle, false).unwrap(),
            Finished::NotOurs
        );
        // Real root's directories are under /run/h5i-net only.
        assert_eq!(
            finish_with(&c, ID, &r.bundle, true).unwrap(),
            Finished::NotOurs
        );
        // Not directly beneath `h5i-net`.
        c["annotations"]["h5i.net.dir"] = json!(r.victim);
        assert_eq!(
            finish_with(&c, "victim", &r.bundle, false).unwrap(),
            Finished::NotOurs
        );
        // A parent others can enter is not a private h5i-net.
        let parent = r.dir.parent().unwrap();
        std::fs::set_permissions(parent, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(r.finish(&r.config(true)).unwrap(), Finished::NotOurs);
        // A symlinked h5i-net is not followed to a directory of that name elsewhere.
        std::fs::set_permissions(parent, std::fs::Permissions::from_mode(0o700)).unwrap();
        let elsewhere = r.tmp.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        let linked = elsewhere.join(NET_DIR_NAME);
        std::os::unix::fs::symlink(parent, &linked).unwrap();
        let mut c = r.config(true);
        c["annotations"]["h5i.net.dir"] = json!(linked.join(&ID[..16]));
        assert_eq!(
            finish_with(&c, ID, &r.bundle, false).unwrap(),
            Finished::NotOurs
        );
        assert!(r.dir.join(TALLY).exists());
        assert!(!r.bundle.join(KEPT_TALLY).exists());
    }
}
