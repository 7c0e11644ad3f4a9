//! `create`'s socket-gate step for specs h5i did not write: a bundle annotated
//! `h5i.net = supervised` (Podman: `--annotation h5i.net=supervised`) gets the gate's notify
//! rule merged into its seccomp profile, listening at `<h5i.net.dir>/gate.sock`, before
//! libcontainer reads `config.json` (`crate::socket_gate::inject` says what changes).
//!
//! The bundle's `config.json` is rewritten in place (a temporary file renamed over it, so a
//! reader never sees half a spec); h5i's own bundles already carry the rule, and for them
//! nothing is written. Must never: let a supervised bundle through without the rule (any
//! failure refuses `create`), or touch a bundle that did not ask for the supervised network.
//! Guarded by the unit tests here and `tests/socket_gate.rs` (Podman + h5i-runc).

use std::io::Write;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::socket_gate::{inject, GateSpecError};

use h5i_policy::spec_names::annotation::{NET as ANNOTATION_NET, NET_DIR as ANNOTATION_NET_DIR};
pub use h5i_policy::spec_names::net_dir::GATE_SOCK as GATE_SOCKET;
use h5i_policy::spec_names::value::NET_SUPERVISED;

/// Why the gate could not be put into a bundle.
#[derive(Debug, thiserror::Error)]
pub enum GateInjectError {
    /// `config.json` could not be read, parsed or written back.
    #[error("refusing: cannot {what} bundle spec {path}: {reason}; to fix: check the bundle")]
    Bundle {
        /// read, parse, write.
        what: &'static str,
        /// The config.json path.
        path: PathBuf,
        /// The OS or parser error.
        reason: String,
    },
    /// `h5i.net = supervised` with no usable network directory.
    #[error("refusing: h5i.net=supervised needs annotation h5i.net.dir (an absolute directory for the gate's socket), found {0:?}; to fix: set h5i.net.dir")]
    NetDir(Option<String>),
    /// The spec's seccomp profile cannot take the gate.
    #[error(transparent)]
    Spec(#[from] GateSpecError),
}

/// The gate's listener for a supervised spec, or `None` when the spec did not ask for the
/// supervised network.
pub fn listener_for(config: &Value) -> Result<Option<PathBuf>, GateInjectError> {
    let annotations = config.get("annotations");
    let get = |key: &str| annotations.and_then(|a| a.get(key)).and_then(Value::as_str);
    if get(ANNOTATION_NET) != Some(NET_SUPERVISED) {
        return Ok(None);
    }
    match get(ANNOTATION_NET_DIR) {
        Some(dir) if Path::new(dir).is_absolute() => Ok(Some(Path::new(dir).join(GATE_SOCKET))),
        other => Err(GateInjectError::NetDir(other.map(str::to_string))),
    }
}

/// Merge the gate into `<bundle>/config.json` when it asks for the supervised network.
pub fn inject_into_bundle(bundle: &Path) -> Result<(), GateInjectError> {
    let path = bundle.join("config.json");
    let failed = |what, reason: String| GateInjectError::Bundle {
        what,
        path: path.clone(),
        reason,
    };
    let text = std::fs::read(&path).map_err(|e| failed("read", e.to_string()))?;
    let mut config: Value =
        serde_json::from_slice(&text).map_err(|e| failed("parse", e.to_string()))?;
    let Some(listener) = listener_for(&config)? else {
        return Ok(());
    };
    let before = config.clone();
    inject(&mut config, &listener)?;
    if config == before {
        return Ok(());
    }
    let bytes = serde_json::to_vec(&config).map_err(|e| failed("encode", e.to_string()))?;
    replace_file(&path, &bytes).map_err(|e| failed("write", e.to_string()))
}

/// Write `bytes` to a new file beside `path` (same mode) and rename it over `path`; the new
/// file is removed again if any step fails.
fn replace_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mode = std::fs::metadata(path)?.permissions();
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".h5i-gate-{}", std::process::id()));
    let tmp = PathBuf::from(name);
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .and_then(|mut f| {
            f.write_all(bytes)?;
            f.sync_all()?;
            f.set_permissions(mode)
        })
        .and_then(|()| std::fs::rename(&tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn bundle(config: &Value) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
        dir
    }

    fn read(dir: &tempfile::TempDir) -> Value {
        serde_json::from_slice(&std::fs::read(dir.path().join("config.json")).unwrap()).unwrap()
    }

    #[test]
    fn a_bundle_without_the_supervised_network_is_left_alone() {
        for annotations in [
            json!(null),
            json!({}),
            json!({"h5i.net": "deny"}),
            json!({"h5i.net.dir": "/run/x"}),
        ] {
            let config = json!({"linux": {}, "annotations": annotations});
            let dir = bundle(&config);
            let before = std::fs::read(dir.path().join("config.json")).unwrap();
            inject_into_bundle(dir.path()).unwrap();
            assert_eq!(
                std::fs::read(dir.path().join("config.json")).unwrap(),
                before
            );
        }
    }

    #[test]
    fn a_supervised_bundle_gets_the_rule_at_its_net_dir() {
        let config = json!({
            "linux": {"seccomp": {"defaultAction": "SCMP_ACT_ERRNO",
                                  "syscalls": [{"names": ["socket", "read"], "action": "SCMP_ACT_ALLOW"}]}},
            "annotations": {"h5i.net": "supervised", "h5i.net.dir": "/run/h5i-net/0123456789abcdef"}
        });
        let dir = bundle(&config);
        inject_into_bundle(dir.path()).unwrap();
        let c = read(&dir);
        assert_eq!(
            c["linux"]["seccomp"]["listenerPath"],
            "/run/h5i-net/0123456789abcdef/gate.sock"
        );
        assert_eq!(
            c["linux"]["seccomp"]["syscalls"],
            json!([{"names": ["read"], "action": "SCMP_ACT_ALLOW"},
                   {"names": ["socket", "socketpair"], "action": "SCMP_ACT_NOTIFY"}])
        );
        assert_eq!(c["annotations"]["h5i.net.gate"], "on");
        // A second create-time pass over the same bundle writes nothing new.
        let once = std::fs::read(dir.path().join("config.json")).unwrap();
        inject_into_bundle(dir.path()).unwrap();
        assert_eq!(std::fs::read(dir.path().join("config.json")).unwrap(), once);
    }

    #[test]
    fn a_supervised_bundle_without_a_usable_net_dir_is_refused_untouched() {
        for dir_value in [json!(null), json!("relative/dir"), json!("")] {
            let config = json!({"linux": {},
                                "annotations": {"h5i.net": "supervised", "h5i.net.dir": dir_value}});
            let dir = bundle(&config);
            let before = std::fs::read(dir.path().join("config.json")).unwrap();
            let e = inject_into_bundle(dir.path()).unwrap_err();
            assert!(matches!(e, GateInjectError::NetDir(_)), "{e}");
            assert!(e.to_string().contains("to fix"));
            assert_eq!(
                std::fs::read(dir.path().join("config.json")).unwrap(),
                before
            );
        }
    }

    #[test]
    fn a_profile_with_its_own_listener_is_refused_untouched() {
        let config = json!({
            "linux": {"seccomp": {"defaultAction": "SCMP_ACT_ALLOW", "listenerPath": "/run/other.sock"}},
            "annotations": {"h5i.net": "supervised", "h5i.net.dir": "/run/n"}
        });
        let dir = bundle(&config);
        let before = std::fs::read(dir.path().join("config.json")).unwrap();
        let e = inject_into_bundle(dir.path()).unwrap_err();
        assert!(matches!(
            e,
            GateInjectError::Spec(GateSpecError::OtherListener(_))
        ));
        assert_eq!(
            std::fs::read(dir.path().join("config.json")).unwrap(),
            before
        );
    }

    #[test]
    fn the_rewrite_keeps_the_file_mode() {
        use std::os::unix::fs::PermissionsExt;
        let config =
            json!({"linux": {}, "annotations": {"h5i.net": "supervised", "h5i.net.dir": "/run/n"}});
        let dir = bundle(&config);
        let path = dir.path().join("config.json");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        inject_into_bundle(dir.path()).unwrap();
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o640
        );
        assert_eq!(read(&dir)["annotations"]["h5i.net.gate"], "on");
    }
}
