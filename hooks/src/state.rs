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
}

impl OciState {
    /// Parse and validate the state.
    pub fn parse(bytes: &[u8]) -> Result<OciState, StateError> {
        let s: OciState =
            serde_json::from_slice(bytes).map_err(|e| StateError::Parse(e.to_string()))?;
        if let Some(pid) = s.pid {
            if pid <= 1 || pid > i64::from(i32::MAX) {
                return Err(StateError::Pid(pid));
            }
        }
        if s.id.is_empty() || s.id.len() > 1024 || s.id.chars().any(char::is_control) {
            return Err(StateError::Parse("the id is empty or not printable".into()));
        }
        Ok(s)
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
    fn hostile_states_are_refused() {
        for bad in [
            &br#"{"ociVersion":"1.0.2","id":"b","pid":1}"#[..],
            br#"{"ociVersion":"1.0.2","id":"b","pid":0}"#,
            br#"{"ociVersion":"1.0.2","id":"b","pid":-5}"#,
            br#"{"ociVersion":"1.0.2","id":"b","pid":99999999999}"#,
            br#"{"ociVersion":"1.0.2","id":"","pid":42}"#,
            br#"{"ociVersion":"1.0.2","id":"a\u001b[2J","pid":42}"#,
            br#"not json"#,
            br#"{"id":"b","pid":42}"#,
            br#"{"ociVersion":"1.0.2","pid":42}"#,
        ] {
            assert!(
                OciState::parse(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
