//! The supervised network's private directory, for bundles that ask for the network but name
//! no directory (Podman's: `--annotation h5i.net=supervised`).
//!
//! At `create`, before libcontainer reads the spec, a bundle whose annotations say
//! `h5i.net=supervised` and carry no `h5i.net.dir` gets one: `/run/h5i-net/<first 16 of id>`
//! for real root, else `$XDG_RUNTIME_DIR/h5i-net/<first 16 of id>` (rootless Podman runs
//! h5i-runc as uid 0 in its user namespace with `XDG_RUNTIME_DIR` set). Both levels are made
//! mode 0700; a directory left by an earlier container of the same id (`podman start` of a
//! stopped container creates it again) is reused after its run files are cleared. The
//! annotation is written back into the bundle's `config.json` (temp file + rename, the file's
//! mode kept), with `h5i.net.dir.made-by = h5i-runc` beside it, since the hooks read both
//! there: Podman runs poststop hooks itself, with its own copy of the annotations, but with
//! this bundle.
//!
//! The directory belongs to one run. Its end is `h5i-hook net-down` (poststop, which Podman
//! runs after `delete`): it keeps the tally and removes the directory, which the `made-by`
//! annotation allows it to. A run that never reaches poststop is cleaned up here: a `create`
//! that fails removes the directory it assigned ([`remove_assigned`]), and a `delete` of a
//! container that does not exist (Podman's, after a failed create; or a create that died)
//! removes the debris at the id's default place ([`remove_debris`]). Removal waits, bounded,
//! for a sentry named in `sentry.pid` to exit, never follows a symlink (the directory itself
//! may be one: the link is removed, not its target), and touches nothing but that one
//! directory beneath a private `h5i-net` of this user's.
//!
//! Must never: touch a bundle that does not ask for the supervised network, change anything in
//! the spec but those two annotations, reuse a directory that is not a private directory of
//! this user's, or remove anything outside it.

use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use super::RuncError;

/// The subdirectory under `/run` or `$XDG_RUNTIME_DIR`.
pub const NET_DIR_NAME: &str = "h5i-net";
pub use h5i_policy::spec_names::annotation::NET_DIR_MADE_BY as ANNOTATION_MADE_BY;
use h5i_policy::spec_names::annotation::{NET, NET_DIR};
use h5i_policy::spec_names::net_dir::{GATE_SOCK, NET_SOCK, SENTRY_LOG, SENTRY_PID, TALLY};
pub use h5i_policy::spec_names::value::MADE_BY_H5I_RUNC;
use h5i_policy::spec_names::value::NET_SUPERVISED;
/// How long removal waits for a sentry to finish (its own stop is bounded at 12 s).
const SENTRY_EXIT_TIMEOUT: Duration = Duration::from_secs(15);
/// The run files a reused directory is cleared of (the sentry's, see `h5i-hook`'s `net_spec`).
const RUN_FILES: &[&str] = &[
    NET_SOCK,
    GATE_SOCK,
    TALLY,
    "tally.tmp",
    SENTRY_PID,
    "sentry.tmp",
    SENTRY_LOG,
];

/// Where the directory goes for container `id`.
pub fn default_dir(
    id: &str,
    real_root: bool,
    xdg_runtime_dir: Option<PathBuf>,
) -> Result<PathBuf, RuncError> {
    let base = if real_root {
        PathBuf::from("/run")
    } else {
        match xdg_runtime_dir {
            Some(d) if d.is_absolute() => d,
            _ => return Err(RuncError::NoStateDir),
        }
    };
    let short: String = id.chars().take(16).collect();
    Ok(base.join(NET_DIR_NAME).join(short))
}

/// Whether the spec asks for the supervised network without naming its directory.
pub fn wants_default(config: &Value) -> bool {
    let ann = config.get("annotations");
    ann.and_then(|a| a.get(NET)).and_then(Value::as_str) == Some(NET_SUPERVISED)
        && ann.and_then(|a| a.get(NET_DIR)).is_none()
}

/// Set `h5i.net.dir` in `<bundle>/config.json` when the spec asks for the supervised network
/// and names none; a no-op otherwise. Returns the directory it assigned, for
/// [`remove_assigned`] should `create` fail later.
pub fn ensure(bundle: &Path, id: &str) -> Result<Option<PathBuf>, RuncError> {
    let path = bundle.join("config.json");
    let bytes = std::fs::read(&path).map_err(RuncError::io("cannot read", &path))?;
    let Ok(config) = serde_json::from_slice::<Value>(&bytes) else {
        // Not JSON: libcontainer refuses it with its own words.
        return Ok(None);
    };
    if !wants_default(&config) {
        return Ok(None);
    }
    let dir = default_for(id)?;
    match write_back(&path, config, &dir) {
        Ok(()) => Ok(Some(dir)),
        Err(e) => {
            remove_assigned(&dir);
            Err(e)
        }
    }
}

fn default_for(id: &str) -> Result<PathBuf, RuncError> {
    default_dir(
        id,
        super::is_real_root(),
        std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from),
    )
}

/// Remove the directory `ensure` assigned to a run that will not reach its poststop hooks (a
/// failed `create`). Best effort: a failure is logged, the caller's own error stands.
pub fn remove_assigned(dir: &Path) {
    if let Err(e) = remove_run_dir(dir, SENTRY_EXIT_TIMEOUT) {
        tracing::warn!(?dir, error = %e, "could not remove the supervised network's directory");
    }
}

/// Remove what a create that never finished left at container `id`'s default place (`delete`
/// of a container that does not exist).
pub fn remove_debris(id: &str) {
    if let Ok(dir) = default_for(id) {
        remove_assigned(&dir);
    }
}

/// Remove `dir`, one run's directory beneath a private `h5i-net` of this user's: nothing when
/// its parent is not that (never created, or not ours to judge); a symlink or other non-directory
/// in its place is unlinked, never followed; a directory of this user's is emptied and removed
/// without following any symlink inside (`std::fs::remove_dir_all` removes links as links),
/// after a sentry named in `sentry.pid` has exited (bounded by `sentry_timeout`).
fn remove_run_dir(dir: &Path, sentry_timeout: Duration) -> std::io::Result<()> {
    let Some(parent) = dir.parent() else {
        return Ok(());
    };
    if parent.file_name() != Some(std::ffi::OsStr::new(NET_DIR_NAME))
        || check_private(parent).is_err()
    {
        return Ok(());
    }
    let meta = match std::fs::symlink_metadata(dir) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    if !meta.file_type().is_dir() {
        return std::fs::remove_file(dir);
    }
    if meta.uid() != h5i_sys::ids::euid() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            "refusing: not this user's directory; to fix: remove it by hand",
        ));
    }
    wait_for_sentry(dir, sentry_timeout);
    std::fs::remove_dir_all(dir)
}

/// Wait until the sentry named in `<dir>/sentry.pid` (read without following a symlink) has
/// exited, at most `timeout`. A missing, unreadable or stale pid file is no sentry.
fn wait_for_sentry(dir: &Path, timeout: Duration) {
    let pid = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(dir.join(SENTRY_PID))
        .ok()
        .and_then(|f| {
            let mut text = String::new();
            std::io::Read::read_to_string(&mut std::io::Read::take(f, 32), &mut text).ok()?;
            text.trim().parse::<i32>().ok()
        })
        .filter(|pid| *pid > 1);
    let Some(pid) = pid else {
        return;
    };
    // Gone already, exited, or the bound reached: the caller goes on either way.
    if let Ok(pidfd) = h5i_sys::pidfd::open(pid) {
        let _ = h5i_sys::pidfd::wait_exited(&pidfd, timeout);
    }
}

/// Make `dir` private and write it into the spec at `path` as `h5i.net.dir`.
fn write_back(path: &Path, mut config: Value, dir: &Path) -> Result<(), RuncError> {
    let path = path.to_path_buf();
    let bundle = path.parent().unwrap_or(Path::new("/"));
    make_private_dir(dir)?;
    if let Some(Value::Object(ann)) = config.get_mut("annotations") {
        ann.insert(NET_DIR.into(), Value::String(dir.display().to_string()));
        ann.insert(ANNOTATION_MADE_BY.into(), MADE_BY_H5I_RUNC.into());
    }
    let text = serde_json::to_vec_pretty(&config)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
        .map_err(RuncError::io("cannot encode", &path))?;
    let mode = std::fs::metadata(&path)
        .map_err(RuncError::io("cannot stat", &path))?
        .permissions()
        .mode();
    let tmp = bundle.join(".config.json.h5i-net");
    let written = std::fs::write(&tmp, text)
        .and_then(|()| std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode)))
        .and_then(|()| std::fs::rename(&tmp, &path));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(RuncError::Io {
            what: "cannot write",
            path,
            source: e,
        });
    }
    Ok(())
}

/// Make `dir` and its parent mode 0700 (or check they are private directories of this user's
/// and clear the run files of a reused one).
fn make_private_dir(dir: &Path) -> Result<(), RuncError> {
    for d in [dir.parent().unwrap_or(dir), dir] {
        match std::fs::DirBuilder::new().mode(0o700).create(d) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => check_private(d)?,
            Err(e) => return Err(RuncError::io("cannot create", d)(e)),
        }
    }
    for name in RUN_FILES {
        match std::fs::remove_file(dir.join(name)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(RuncError::io("cannot clear", &dir.join(name))(e)),
        }
    }
    Ok(())
}

fn check_private(d: &Path) -> Result<(), RuncError> {
    let meta = std::fs::symlink_metadata(d).map_err(RuncError::io("cannot stat", d))?;
    let euid = h5i_sys::ids::euid();
    if !meta.file_type().is_dir() || meta.uid() != euid || meta.mode() & 0o077 != 0 {
        return Err(RuncError::Io {
            what: "refusing: the supervised network's directory is not a private (0700) directory of this user's:",
            path: d.to_path_buf(),
            source: std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                "to fix: remove it, or set h5i.net.dir to one",
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_default_is_under_run_for_root_and_the_runtime_dir_otherwise() {
        let id = "0123456789abcdef0123456789";
        assert_eq!(
            default_dir(id, true, None).unwrap(),
            PathBuf::from("/run/h5i-net/0123456789abcdef")
        );
        assert_eq!(
            default_dir("short", false, Some("/run/user/1001".into())).unwrap(),
            PathBuf::from("/run/user/1001/h5i-net/short")
        );
        assert!(default_dir(id, false, None).is_err());
        assert!(default_dir(id, false, Some("rel".into())).is_err());
    }

    #[test]
    fn only_a_supervised_spec_without_a_dir_gets_one() {
        assert!(wants_default(
            &json!({"annotations": {"h5i.net": "supervised"}})
        ));
        assert!(!wants_default(
            &json!({"annotations": {"h5i.net": "supervised", "h5i.net.dir": "/x"}})
        ));
        assert!(!wants_default(&json!({"annotations": {"h5i.net": "off"}})));
        assert!(!wants_default(&json!({})));
    }

    #[test]
    fn the_annotation_is_written_back_and_nothing_else_changes() {
        let base = tempfile::tempdir().unwrap();
        let bundle = tempfile::tempdir().unwrap();
        let config = bundle.path().join("config.json");
        let spec = json!({"ociVersion": "1.0.2", "process": {"args": ["true"]},
                          "annotations": {"h5i.net": "supervised", "other": "x"}});
        std::fs::write(&config, spec.to_string()).unwrap();
        std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o640)).unwrap();
        let dir = base.path().join(NET_DIR_NAME).join("abc");
        write_back(&config, spec.clone(), &dir).unwrap();
        let back: Value = serde_json::from_slice(&std::fs::read(&config).unwrap()).unwrap();
        assert_eq!(back["annotations"]["h5i.net.dir"], json!(dir));
        assert_eq!(back["annotations"][ANNOTATION_MADE_BY], MADE_BY_H5I_RUNC);
        assert_eq!(back["annotations"]["other"], "x");
        assert_eq!(back["process"], spec["process"]);
        assert_eq!(std::fs::metadata(&config).unwrap().mode() & 0o777, 0o640);
        for d in [dir.parent().unwrap(), &dir] {
            assert_eq!(std::fs::metadata(d).unwrap().mode() & 0o777, 0o700);
        }
        assert_eq!(
            std::fs::read_dir(bundle.path()).unwrap().count(),
            1,
            "no temp file left"
        );

        // Reused by a later container of the same id: run files cleared, the dir kept.
        std::fs::write(dir.join("tally.json"), "{}").unwrap();
        write_back(&config, spec.clone(), &dir).unwrap();
        assert!(!dir.join("tally.json").exists());

        // A directory others can enter is not reused.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(write_back(&config, spec, &dir).is_err());
    }

    /// `<tmp>/h5i-net/<name>`, both 0700, and a victim tree outside it.
    struct Planted {
        _tmp: tempfile::TempDir,
        dir: PathBuf,
        victim: PathBuf,
    }

    fn planted() -> Planted {
        let tmp = tempfile::tempdir().unwrap();
        let parent = tmp.path().join(NET_DIR_NAME);
        let dir = parent.join("0123456789abcdef");
        for d in [&parent, &dir] {
            std::fs::DirBuilder::new().mode(0o700).create(d).unwrap();
        }
        let victim = tmp.path().join("victim");
        std::fs::create_dir(&victim).unwrap();
        std::fs::write(victim.join("keep"), "keep").unwrap();
        Planted {
            _tmp: tmp,
            dir,
            victim,
        }
    }

    #[test]
    fn removing_a_run_dir_never_follows_a_symlink_inside_it() {
        let p = planted();
        std::fs::write(p.dir.join("tally.json"), "{}").unwrap();
        std::os::unix::fs::symlink(&p.victim, p.dir.join("sentry.log")).unwrap();
        std::os::unix::fs::symlink(p.victim.join("keep"), p.dir.join("net.sock")).unwrap();
        let sub = p.dir.join("sub");
        std::fs::create_dir(&sub).unwrap();
        std::os::unix::fs::symlink(&p.victim, sub.join("deeper")).unwrap();
        remove_run_dir(&p.dir, Duration::ZERO).unwrap();
        assert!(!p.dir.exists() && std::fs::symlink_metadata(&p.dir).is_err());
        assert!(p.dir.parent().unwrap().is_dir(), "h5i-net itself stays");
        assert_eq!(
            std::fs::read_to_string(p.victim.join("keep")).unwrap(),
            "keep"
        );
    }

    #[test]
    fn a_symlink_planted_in_place_of_the_run_dir_is_unlinked_not_followed() {
        let p = planted();
        std::fs::remove_dir(&p.dir).unwrap();
        std::os::unix::fs::symlink(&p.victim, &p.dir).unwrap();
        remove_run_dir(&p.dir, Duration::ZERO).unwrap();
        assert!(
            std::fs::symlink_metadata(&p.dir).is_err(),
            "the link is gone"
        );
        assert_eq!(
            std::fs::read_to_string(p.victim.join("keep")).unwrap(),
            "keep"
        );
    }

    #[test]
    fn nothing_is_removed_beneath_a_parent_that_is_not_a_private_h5i_net() {
        let p = planted();
        let parent = p.dir.parent().unwrap();
        std::fs::set_permissions(parent, std::fs::Permissions::from_mode(0o755)).unwrap();
        remove_run_dir(&p.dir, Duration::ZERO).unwrap();
        assert!(
            p.dir.is_dir(),
            "a parent others can enter is not ours to judge"
        );
        // A directory anywhere but directly beneath `h5i-net` is never a run's.
        remove_run_dir(&p.victim, Duration::ZERO).unwrap();
        assert!(p.victim.join("keep").exists());
    }

    #[test]
    fn removal_waits_for_the_sentry_named_in_the_pid_file_and_that_wait_is_bounded() {
        let p = planted();
        let mut finishing = std::process::Command::new("sleep")
            .arg("1")
            .spawn()
            .unwrap();
        std::fs::write(p.dir.join(SENTRY_PID), finishing.id().to_string()).unwrap();
        remove_run_dir(&p.dir, Duration::from_secs(60)).unwrap();
        // The removal waited for the exit (the child is a zombie, not yet reaped).
        assert!(finishing.try_wait().unwrap().is_some());
        assert!(!p.dir.exists());

        let p = planted();
        let mut stuck = std::process::Command::new("sleep")
            .arg("600")
            .spawn()
            .unwrap();
        std::fs::write(p.dir.join(SENTRY_PID), stuck.id().to_string()).unwrap();
        remove_run_dir(&p.dir, Duration::from_millis(50)).unwrap();
        assert!(!p.dir.exists(), "removed once the bound passed");
        assert!(stuck.try_wait().unwrap().is_none());
        stuck.kill().unwrap();
        stuck.wait().unwrap();
    }
}
