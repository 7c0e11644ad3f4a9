//! Multi-range uid/gid maps for a container's new user namespace, written by h5i-runc itself
//! when it runs as root inside a user namespace (rootless Podman with `--userns=keep-id`).
//!
//! libcontainer writes a one-range map to `/proc/PID/{uid,gid}_map` itself but hands a
//! multi-range map to `newuidmap`/`newgidmap` found on `PATH`, and ignores their exit status.
//! Inside rootless Podman's user namespace those setuid helpers cannot work (they look the
//! caller, uid 0 there, up in `/etc/subuid`), so the map is never written and the container's
//! init fails later with a bare EINVAL. Root of the parent user namespace needs no helper: the
//! kernel lets a writer holding CAP_SETUID/CAP_SETGID over the parent namespace install any map
//! of ids mapped there. So `create` puts a private directory first on `PATH` holding
//! `newuidmap` and `newgidmap` links to this very binary, and `main` recognizes those names and
//! writes the map directly, in one write as the kernel requires.
//!
//! Must never: stand in for the real helpers outside a user namespace (on the host they enforce
//! `/etc/subuid` and stay in charge), write anything but `/proc/<pid>/{uid,gid}_map`, or accept
//! a map that is not whole numbers in triples.
//!
//! Guarded by the unit tests below and the keep-id runs in `tests/container_tier.rs`.

use std::ffi::{OsStr, OsString};
use std::io::Write;
use std::path::{Path, PathBuf};

use libcontainer::oci_spec::runtime::{LinuxNamespaceType, Spec};

/// Which map a helper invocation writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MapKind {
    /// `newuidmap`: `/proc/PID/uid_map`.
    Uid,
    /// `newgidmap`: `/proc/PID/gid_map`.
    Gid,
}

impl MapKind {
    fn helper(self) -> &'static str {
        match self {
            MapKind::Uid => "newuidmap",
            MapKind::Gid => "newgidmap",
        }
    }

    fn file(self) -> &'static str {
        match self {
            MapKind::Uid => "uid_map",
            MapKind::Gid => "gid_map",
        }
    }
}

/// Why a map could not be written.
#[derive(Debug, thiserror::Error)]
pub enum IdmapError {
    /// The arguments are not `PID (INSIDE OUTSIDE COUNT)...`.
    #[error(
        "usage: {helper} PID INSIDE OUTSIDE COUNT [INSIDE OUTSIDE COUNT...] (whole numbers): {why}"
    )]
    Usage {
        /// Which helper name was called.
        helper: &'static str,
        /// What is wrong.
        why: String,
    },
    /// The kernel refused the map.
    #[error("cannot write {path}: {source}")]
    Write {
        /// The map file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The helper directory could not be made.
    #[error("refusing: cannot prepare the id-map helpers in {dir}: {source}; to fix: check that the runtime's state directory is writable")]
    Install {
        /// The directory.
        dir: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

/// The helper this binary was called as, from `argv[0]`'s file name.
pub fn helper_called(argv0: &OsStr) -> Option<MapKind> {
    match Path::new(argv0).file_name()?.to_str()? {
        "newuidmap" => Some(MapKind::Uid),
        "newgidmap" => Some(MapKind::Gid),
        _ => None,
    }
}

/// The map file's text for `args` = `PID INSIDE OUTSIDE COUNT...`, and the pid.
pub fn parse(kind: MapKind, args: &[OsString]) -> Result<(u32, String), IdmapError> {
    let usage = |why: String| IdmapError::Usage {
        helper: kind.helper(),
        why,
    };
    let numbers: Vec<u32> = args
        .iter()
        .map(|a| {
            a.to_str()
                .and_then(|s| s.parse::<u32>().ok())
                .ok_or_else(|| usage(format!("`{}` is not a whole number", a.to_string_lossy())))
        })
        .collect::<Result<_, _>>()?;
    let Some((&pid, ranges)) = numbers.split_first() else {
        return Err(usage("no pid".into()));
    };
    if pid == 0 {
        return Err(usage("pid 0".into()));
    }
    if ranges.is_empty() || ranges.len() % 3 != 0 {
        return Err(usage(format!(
            "{} numbers after the pid, not a non-empty multiple of 3",
            ranges.len()
        )));
    }
    let mut text = String::new();
    for r in ranges.chunks(3) {
        text.push_str(&format!("{} {} {}\n", r[0], r[1], r[2]));
    }
    Ok((pid, text))
}

/// Run as the helper: write the map for `args` (everything after `argv[0]`).
pub fn run_helper(kind: MapKind, args: &[OsString]) -> Result<(), IdmapError> {
    let (pid, text) = parse(kind, args)?;
    let path = PathBuf::from(format!("/proc/{pid}/{}", kind.file()));
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .map_err(|source| IdmapError::Write { path, source })
}

/// Whether creating `spec` needs the helpers: a new user namespace with a multi-range map,
/// created by a runtime that is root inside a user namespace of its own.
pub fn needs_helpers(spec: &Spec, runtime_in_userns: bool, euid: u32) -> bool {
    if !runtime_in_userns || euid != 0 {
        return false;
    }
    let Some(linux) = spec.linux() else {
        return false;
    };
    let new_userns = linux.namespaces().as_ref().is_some_and(|ns| {
        ns.iter()
            .any(|n| n.typ() == LinuxNamespaceType::User && n.path().is_none())
    });
    let multi = |m: &Option<Vec<_>>| m.as_ref().is_some_and(|v| v.len() > 1);
    new_userns && (multi(linux.uid_mappings()) || multi(linux.gid_mappings()))
}

/// Make `dir` hold `newuidmap` and `newgidmap` links to this binary (through
/// `/proc/self/exe`, which in the exec'ing runtime is its sealed copy) and return `PATH` with
/// `dir` first.
pub fn install(dir: &Path) -> Result<OsString, IdmapError> {
    let err = |source| IdmapError::Install {
        dir: dir.to_path_buf(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(err)?;
    for kind in [MapKind::Uid, MapKind::Gid] {
        let link = dir.join(kind.helper());
        match std::fs::remove_file(&link) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(err(e)),
        }
        std::os::unix::fs::symlink("/proc/self/exe", &link).map_err(err)?;
    }
    let mut paths = vec![dir.to_path_buf()];
    if let Some(old) = std::env::var_os("PATH") {
        paths.extend(std::env::split_paths(&old));
    }
    std::env::join_paths(paths).map_err(|e| err(std::io::Error::other(e)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<OsString> {
        a.iter().map(OsString::from).collect()
    }

    #[test]
    fn the_helper_names_are_recognized_by_file_name() {
        assert_eq!(
            helper_called(OsStr::new("/run/x/newuidmap")),
            Some(MapKind::Uid)
        );
        assert_eq!(helper_called(OsStr::new("newgidmap")), Some(MapKind::Gid));
        assert_eq!(helper_called(OsStr::new("/usr/bin/h5i-runc")), None);
        assert_eq!(helper_called(OsStr::new("newuidmap2")), None);
    }

    #[test]
    fn a_keep_id_map_becomes_one_line_per_range() {
        let (pid, text) = parse(
            MapKind::Uid,
            &args(&[
                "42", "0", "1", "1001", "1001", "0", "1", "1002", "1002", "64535",
            ]),
        )
        .unwrap();
        assert_eq!(pid, 42);
        assert_eq!(text, "0 1 1001\n1001 0 1\n1002 1002 64535\n");
    }

    #[test]
    fn malformed_maps_are_refused() {
        for bad in [
            &[][..],
            &["42"][..],
            &["42", "0", "1"][..],
            &["0", "0", "1", "1"][..],
            &["42", "0", "x", "1"][..],
            &["42", "0", "-1", "1"][..],
            &["/proc/1", "0", "1", "1"][..],
        ] {
            assert!(parse(MapKind::Gid, &args(bad)).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn only_a_root_runtime_inside_a_user_namespace_uses_the_helpers() {
        let spec: Spec = serde_json::from_str(
            r#"{"ociVersion":"1.0.2","linux":{"namespaces":[{"type":"user"}],
            "uidMappings":[{"containerID":0,"hostID":1,"size":1001},{"containerID":1001,"hostID":0,"size":1}],
            "gidMappings":[{"containerID":0,"hostID":1,"size":1001},{"containerID":1001,"hostID":0,"size":1}]}}"#,
        )
        .unwrap();
        assert!(needs_helpers(&spec, true, 0));
        assert!(
            !needs_helpers(&spec, false, 0),
            "on the host: the real helpers"
        );
        assert!(
            !needs_helpers(&spec, true, 1000),
            "not root there: the real helpers"
        );
        let one: Spec = serde_json::from_str(
            r#"{"ociVersion":"1.0.2","linux":{"namespaces":[{"type":"user"}],
            "uidMappings":[{"containerID":0,"hostID":0,"size":1}],
            "gidMappings":[{"containerID":0,"hostID":0,"size":1}]}}"#,
        )
        .unwrap();
        assert!(
            !needs_helpers(&one, true, 0),
            "libcontainer writes one range itself"
        );
    }
}
