//! `h5i.evidence.spec=/abs/path`: at `create`, h5i-runc writes the spec it was handed (the
//! caller's `config.json`, byte for byte, before any adjustment of h5i-runc's own) to that
//! path, so the caller (h5i's container tier) can show what Podman actually asked the runtime
//! to run. Written before any of the container's code exists, so the container cannot shape it.
//!
//! Must never: follow a symlink at the path, replace an existing file, or write anywhere but a
//! new file in an existing directory (mode 0600).
//!
//! Guarded by the unit tests below and `tests/container_tier.rs`.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// The annotation.
pub use h5i_policy::spec_names::annotation::EVIDENCE_SPEC as ANNOTATION;

/// Why the copy could not be written.
#[derive(Debug, thiserror::Error)]
#[error("refusing: cannot write the spec copy {ANNOTATION}={path}: {why}; to fix: name a new file in an existing directory by absolute path")]
pub struct SpecCopyError {
    /// The path asked for.
    pub path: PathBuf,
    /// What went wrong.
    pub why: String,
}

/// Copy `bundle/config.json` to the annotated path, when the spec asks for it.
pub fn copy_if_asked(bundle: &Path) -> Result<(), SpecCopyError> {
    let config = bundle.join("config.json");
    let Ok(bytes) = std::fs::read(&config) else {
        // libcontainer reports an unreadable spec itself.
        return Ok(());
    };
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(&bytes) else {
        return Ok(());
    };
    let Some(target) = v["annotations"][ANNOTATION].as_str() else {
        return Ok(());
    };
    write_new(Path::new(target), &bytes)
}

fn write_new(target: &Path, bytes: &[u8]) -> Result<(), SpecCopyError> {
    let err = |why: String| SpecCopyError {
        path: target.to_path_buf(),
        why,
    };
    if !target.is_absolute() {
        return Err(err("not an absolute path".into()));
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(target)
        .and_then(|mut f| f.write_all(bytes))
        .map_err(|e| err(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bundle(dir: &Path, annotation: Option<&str>) {
        let mut v = serde_json::json!({"ociVersion": "1.0.2", "process": {"env": ["A=1"]}});
        if let Some(a) = annotation {
            v["annotations"] = serde_json::json!({ ANNOTATION: a });
        }
        std::fs::write(dir.join("config.json"), v.to_string()).unwrap();
    }

    #[test]
    fn the_spec_is_copied_byte_for_byte_when_asked() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("spec.json");
        bundle(dir.path(), Some(out.to_str().unwrap()));
        copy_if_asked(dir.path()).unwrap();
        assert_eq!(
            std::fs::read(&out).unwrap(),
            std::fs::read(dir.path().join("config.json")).unwrap()
        );
        // Never replaced: a second create with the same path is refused.
        assert!(copy_if_asked(dir.path()).is_err());
    }

    #[test]
    fn nothing_is_written_unless_asked_and_symlinks_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        bundle(dir.path(), None);
        copy_if_asked(dir.path()).unwrap();
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        let link = dir.path().join("link.json");
        std::os::unix::fs::symlink(dir.path().join("elsewhere"), &link).unwrap();
        bundle(dir.path(), Some(link.to_str().unwrap()));
        assert!(copy_if_asked(dir.path()).is_err());
        assert!(!dir.path().join("elsewhere").exists());
        bundle(dir.path(), Some("relative.json"));
        assert!(copy_if_asked(dir.path()).is_err());
    }
}
