//! The OCI state a hook receives on stdin.

use serde::Deserialize;

/// Why the state on stdin was refused.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// Not the OCI state shape.
    #[error("refusing: the OCI state on stdin is not valid: {0}; to fix: run h5i-hook only as an OCI hook")]
    Parse(String),
    /// A pid that cannot be a container's.
    #[error("refusing: the OCI state names pid {0}; to fix: run h5i-hook only as a createRuntime hook, once the container exists")]
    Pid(i64),
    /// A hook that reads the spec got no bundle.
    #[error("refusing: the OCI state names no bundle; to fix: run h5i-hook only as an OCI hook of a runtime that reports the bundle (runc, h5i-runc, Podman)")]
    NoBundle,
    /// A hook that acts by pid got no pid.
    #[error("refusing: the OCI state names no pid; to fix: declare `h5i-hook loopback` as a createRuntime hook, or use `--inside` as a createContainer hook")]
    NoPid,
}

/// The fields of the OCI state h5i's hooks read (others are accepted and ignored, since
/// runtimes add their own).
#[derive(Debug, Clone, Deserialize)]
pub struct OciState {
    /// The OCI version the runtime speaks.
    #[serde(rename = "ociVersion")]
    pub oci_version: String,
    /// The container id.
    pub id: String,
    /// The container's init pid, as seen from the runtime's pid namespace (runtimes omit it
    /// for hooks that run inside the container).
    pub pid: Option<i64>,
    /// The bundle directory (its `config.json` is the spec the container was made from).
    #[serde(default)]
    pub bundle: Option<std::path::PathBuf>,
}

impl OciState {
    /// Parse and validate the state.
    pub fn parse(bytes: &[u8]) -> Result<OciState, StateError> {
        let s: OciState =
            serde_json::from_slice(bytes).map_err(|e| StateError::Parse(e.to_string()))?;

        if s.id.is_empty() || s.id.len() > 1024 || s.id.chars().any(char::is_control) {
            return Err(StateError::Parse("the id is empty or not printable".into()));
        }
        if s.bundle.as_ref().is_some_and(|b| !b.is_absolute()) {
            return Err(StateError::Parse("the bundle path is not absolute".into()));
        }
        Ok(s)
    }

    /// The bundle directory, for a hook that reads the spec.
    pub fn bundle(&self) -> Result<&std::path::Path, StateError> {
        self.bundle.as_deref().ok_or(StateError::NoBundle)
    }

    /// The pid of the container's init in the runtime's pid namespace, for a hook that acts on
    /// it from outside (createRuntime). Inside hooks see the runtime's own choice (none, or 1).
    pub fn runtime_pid(&self) -> Result<i64, StateError> {
        match self.pid {
            None => Err(StateError::NoPid),
            Some(pid) if pid <= 1 || pid > i64::from(i32::MAX) => Err(StateError::Pid(pid)),
            Some(pid) => Ok(pid),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_valid_state_parses() {
        let s = OciState::parse(
            br#"{"ociVersion":"1.0.2","id":"b","pid":42,"status":"creating","bundle":"/x"}"#,
        )
        .unwrap();
        assert_eq!(s.pid, Some(42));
        let inside =
            OciState::parse(br#"{"ociVersion":"1.0.2","id":"b","status":"creating"}"#).unwrap();
        assert_eq!(inside.pid, None);
    }

    #[test]
    fn pids_a_runtime_hook_cannot_act_on_are_refused() {
        for pid in ["1", "0", "-5", "99999999999"] {
            let text = format!(r#"{{"ociVersion":"1.0.2","id":"b","pid":{pid}}}"#);
            let s = OciState::parse(text.as_bytes()).unwrap();
            assert!(s.runtime_pid().is_err(), "{pid}");
        }
        let none = OciState::parse(br#"{"ociVersion":"1.0.2","id":"b"}"#).unwrap();
        assert!(matches!(none.runtime_pid(), Err(StateError::NoPid)));
    }

    #[test]
    fn hostile_states_are_refused() {
        for bad in [
            &br#"{"ociVersion":"1.0.2","id":"","pid":42}"#[..],
            br#"{"ociVersion":"1.0.2","id":"a\u001b[2J","pid":42}"#,
            br#"not json"#,
            br#"{"id":"b","pid":42}"#,
            br#"{"ociVersion":"1.0.2","pid":42}"#,
            br#"{"ociVersion":"1.0.2","id":"b","bundle":"rel/dir"}"#,
        ] {
            assert!(
                OciState::parse(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
