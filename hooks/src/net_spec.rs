//! What a supervised box's spec asks of its network, read from the bundle's `config.json`, and
//! the files of its net directory.
//!
//! Owns the `h5i.net*` annotations as the network hooks read them (`h5i.net` = `supervised`,
//! `h5i.net.dir`, `h5i.net.egress`, `h5i.net.unix`), the net directory's rules (absolute,
//! short enough for unix socket paths, a real directory owned by the caller with no group or
//! other access) and the spec checks that keep the table meaningful: the box gets a network
//! namespace of its own (not the host's, not one joined by path, which would already have a
//! way out), and holds no `CAP_NET_ADMIN` (which would let it rewrite its own table).
//!
//! Must never: accept a spec that fails one of those checks, or follow a symlink to the net
//! directory. Guarded by the unit tests below and `hooks/tests/supervised_net.rs`.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::egress::{self, EgressError, EgressRequest};

use h5i_policy::spec_names::annotation as key;
pub use h5i_policy::spec_names::net_dir::{GATE_SOCK, NET_SOCK, SENTRY_LOG, SENTRY_PID, TALLY};
/// Longest net directory: `<dir>/gate.sock` must fit a unix socket path (107 bytes).
pub const MAX_DIR_LEN: usize = 107 - 1 - GATE_SOCK.len();

/// Why the spec was refused.
#[derive(Debug, thiserror::Error)]
pub enum NetSpecError {
    /// config.json could not be read or parsed.
    #[error("refusing: cannot read the bundle's spec {path}: {reason}; to fix: run the hook as an OCI hook of this bundle")]
    Spec {
        /// The config.json path.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// `h5i.net` is not `supervised`.
    #[error("refusing: the spec's h5i.net annotation is {0:?}, not \"supervised\"; to fix: set h5i.net=supervised, or do not declare the supervised network hooks")]
    NotSupervised(Option<String>),
    /// No `h5i.net.dir`.
    #[error("refusing: the spec has no h5i.net.dir annotation; to fix: run the box with h5i-runc, which sets it, or set it to a private (0700) directory")]
    NoDir,
    /// The net directory breaks a rule.
    #[error("refusing: h5i.net.dir {dir} {why}; to fix: use a short absolute path to a directory of your own with mode 0700")]
    BadDir {
        /// The directory.
        dir: String,
        /// Which rule.
        why: String,
    },
    /// The box would share a network namespace.
    #[error("refusing: {0}; to fix: give the box a network namespace of its own (podman: --network none)")]
    Network(&'static str),
    /// The box would hold CAP_NET_ADMIN.
    #[error("refusing: the spec grants CAP_NET_ADMIN (process.capabilities.{0}), which would let the box rewrite its own egress table; to fix: drop it (podman: no --cap-add NET_ADMIN, no --privileged)")]
    NetAdmin(String),
    /// The egress annotation was refused.
    #[error(transparent)]
    Egress(#[from] EgressError),
}

/// A supervised box's network, as its spec declares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetSpec {
    /// The private net directory.
    pub dir: PathBuf,
    /// The egress request (empty: deny all).
    pub egress: Vec<EgressRequest>,
    /// Whether `socket(AF_UNIX)` is allowed (`h5i.net.unix=true`).
    pub unix: bool,
    /// Address families granted (`h5i.net.families`, comma-separated names).
    pub families: Vec<String>,
}

/// Read `<bundle>/config.json`.
pub fn read_config(bundle: &Path) -> Result<Value, NetSpecError> {
    let path = bundle.join("config.json");
    let bytes = std::fs::read(&path).map_err(|e| NetSpecError::Spec {
        path: path.clone(),
        reason: e.to_string(),
    })?;
    serde_json::from_slice(&bytes).map_err(|e| NetSpecError::Spec {
        path,
        reason: e.to_string(),
    })
}

fn annotation<'a>(config: &'a Value, key: &str) -> Option<&'a str> {
    config.get("annotations")?.get(key)?.as_str()
}

/// The net directory the spec names (checked against the rules).
pub fn net_dir(config: &Value) -> Result<PathBuf, NetSpecError> {
    match annotation(config, key::NET) {
        Some("supervised") => {}
        other => return Err(NetSpecError::NotSupervised(other.map(str::to_string))),
    }
    let dir = PathBuf::from(annotation(config, key::NET_DIR).ok_or(NetSpecError::NoDir)?);
    check_dir(&dir)?;
    Ok(dir)
}

/// The net directory's rules: absolute, short, a real directory owned by this process's
/// effective uid, no group or other access.
pub fn check_dir(dir: &Path) -> Result<(), NetSpecError> {
    let bad = |why: &str| NetSpecError::BadDir {
        dir: dir.display().to_string(),
        why: why.to_string(),
    };
    if !dir.is_absolute() {
        return Err(bad("is not absolute"));
    }
    if dir.as_os_str().len() > MAX_DIR_LEN {
        return Err(bad(&format!(
            "is longer than {MAX_DIR_LEN} bytes (unix socket paths are short)"
        )));
    }
    let meta = std::fs::symlink_metadata(dir).map_err(|e| bad(&format!("cannot be read: {e}")))?;
    if !meta.file_type().is_dir() {
        return Err(bad("is not a directory (a symlink is not followed)"));
    }
    let euid = h5i_sys::ids::euid();
    if meta.uid() != euid {
        return Err(bad(&format!(
            "is owned by uid {}, not this user ({euid})",
            meta.uid()
        )));
    }
    if meta.mode() & 0o077 != 0 {
        return Err(bad(&format!(
            "has mode {:o}: others could reach the sentry",
            meta.mode() & 0o7777
        )));
    }
    Ok(())
}

/// Everything the createRuntime hook checks before it starts a sentry.
pub fn load(config: &Value) -> Result<NetSpec, NetSpecError> {
    let dir = net_dir(config)?;
    check_network_namespace(config)?;
    check_no_net_admin(config)?;
    let egress = egress::parse(annotation(config, key::NET_EGRESS))?;
    Ok(NetSpec {
        dir,
        egress,
        unix: annotation(config, key::NET_UNIX) == Some("true"),
        families: annotation(config, key::NET_FAMILIES)
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(str::to_owned)
            .collect(),
    })
}

fn check_network_namespace(config: &Value) -> Result<(), NetSpecError> {
    let namespaces = config
        .pointer("/linux/namespaces")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let net = namespaces
        .iter()
        .find(|n| n.get("type").and_then(Value::as_str) == Some("network"));
    match net {
        None => Err(NetSpecError::Network(
            "the spec gives the box the host's network namespace",
        )),
        Some(n) if n.get("path").is_some_and(|p| !p.is_null()) => Err(NetSpecError::Network(
            "the spec joins an existing network namespace by path, which may already have a way out",
        )),
        Some(_) => Ok(()),
    }
}

fn check_no_net_admin(config: &Value) -> Result<(), NetSpecError> {
    let Some(caps) = config
        .pointer("/process/capabilities")
        .and_then(Value::as_object)
    else {
        return Ok(());
    };
    for (set, list) in caps {
        let holds = list
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c.as_str() == Some("CAP_NET_ADMIN"));
        if holds {
            return Err(NetSpecError::NetAdmin(set.clone()));
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::os::unix::fs::PermissionsExt;

    fn private_dir() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        d
    }

    fn spec(dir: &Path) -> Value {
        json!({
            "process": {"capabilities": {"bounding": ["CAP_KILL"], "effective": []}},
            "linux": {"namespaces": [{"type": "pid"}, {"type": "network"}]},
            "annotations": {
                "h5i.net": "supervised",
                "h5i.net.dir": dir,
                "h5i.net.egress": r#"[{"host":"api.test","port":443,"addrs":["198.18.0.2"]}]"#,
                "h5i.net.unix": "true",
            }
        })
    }

    #[test]
    fn a_supervised_spec_loads() {
        let d = private_dir();
        let s = load(&spec(d.path())).unwrap();
        assert_eq!(s.dir, d.path());
        assert_eq!(s.egress.len(), 1);
        assert!(s.unix);
    }

    #[test]
    fn a_box_on_the_hosts_or_a_joined_network_namespace_is_refused() {
        let d = private_dir();
        let mut host = spec(d.path());
        host["linux"]["namespaces"] = json!([{"type": "pid"}]);
        assert!(matches!(load(&host), Err(NetSpecError::Network(_))));
        let mut joined = spec(d.path());
        joined["linux"]["namespaces"] = json!([{"type": "network", "path": "/run/netns/x"}]);
        assert!(matches!(load(&joined), Err(NetSpecError::Network(_))));
    }

    #[test]
    fn a_box_holding_cap_net_admin_is_refused() {
        let d = private_dir();
        for set in [
            "bounding",
            "effective",
            "permitted",
            "inheritable",
            "ambient",
        ] {
            let mut s = spec(d.path());
            s["process"]["capabilities"][set] = json!(["CAP_CHOWN", "CAP_NET_ADMIN"]);
            assert!(
                matches!(load(&s), Err(NetSpecError::NetAdmin(ref x)) if x == set),
                "{set}"
            );
        }
    }

    #[test]
    fn net_directories_others_could_reach_are_refused() {
        let d = private_dir();
        let mut s = spec(d.path());
        s["annotations"]["h5i.net"] = json!("off");
        assert!(matches!(load(&s), Err(NetSpecError::NotSupervised(_))));
        let mut s = spec(d.path());
        s["annotations"]
            .as_object_mut()
            .unwrap()
            .remove("h5i.net.dir");
        assert!(matches!(load(&s), Err(NetSpecError::NoDir)));

        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o750)).unwrap();
        assert!(matches!(
            check_dir(d.path()),
            Err(NetSpecError::BadDir { .. })
        ));
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        let link = d.path().join("link");
        let inner = d.path().join("inner");
        std::fs::create_dir(&inner).unwrap();
        std::fs::set_permissions(&inner, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::os::unix::fs::symlink(&inner, &link).unwrap();
        assert!(check_dir(&inner).is_ok());
        assert!(matches!(check_dir(&link), Err(NetSpecError::BadDir { .. })));
        assert!(matches!(
            check_dir(Path::new("relative/dir")),
            Err(NetSpecError::BadDir { .. })
        ));
        let long = PathBuf::from(format!("/{}", "x".repeat(MAX_DIR_LEN)));
        assert!(matches!(check_dir(&long), Err(NetSpecError::BadDir { .. })));
    }
}
