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
//! mode kept), since the hooks read it there: Podman runs poststop hooks itself, with its own
//! copy of the annotations, but with this bundle.
//!
//! Must never: touch a bundle that does not ask for the supervised network, change anything in
//! the spec but that one annotation, or reuse a directory that is not a private directory of
//! this user's.

use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::RuncError;

/// The subdirectory under `/run` or `$XDG_RUNTIME_DIR`.
pub const NET_DIR_NAME: &str = "h5i-net";
/// The run files a reused directory is cleared of (the sentry's, see `h5i-hook`'s `net_spec`).
const RUN_FILES: &[&str] = &[
    "net.sock",
    "gate.sock",
    "tally.json",
    "tally.tmp",
    "sentry.pid",
    "sentry.tmp",
    "sentry.log",
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
    ann.and_then(|a| a.get("h5i.net")).and_then(Value::as_str) == Some("supervised")
        && ann.and_then(|a| a.get("h5i.net.dir")).is_none()
}

/// Set `h5i.net.dir` in `<bundle>/config.json` when the spec asks for the supervised network
/// and names none; a no-op otherwise.
pub fn ensure(bundle: &Path, id: &str) -> Result<(), RuncError> {
    let path = bundle.join("config.json");
    let bytes = std::fs::read(&path).map_err(RuncError::io("cannot read", &path))?;
    let Ok(config) = serde_json::from_slice::<Value>(&bytes) else {
        // Not JSON: libcontainer refuses it with its own words.
        return Ok(());
    };
    if !wants_default(&config) {
        return Ok(());
    }
    let dir = default_dir(
        id,
        super::is_real_root(),
        std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from),
    )?;
    write_back(&path, config, &dir)
}

/// Make `dir` private and write it into the spec at `path` as `h5i.net.dir`.
fn write_back(path: &Path, mut config: Value, dir: &Path) -> Result<(), RuncError> {
    let path = path.to_path_buf();
    let bundle = path.parent().unwrap_or(Path::new("/"));
    make_private_dir(dir)?;
    if let Some(Value::Object(ann)) = config.get_mut("annotations") {
        ann.insert(
            "h5i.net.dir".into(),
            Value::String(dir.display().to_string()),
        );
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
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
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
}
