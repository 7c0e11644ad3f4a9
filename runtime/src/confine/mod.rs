//! Confinement the OCI spec cannot carry, applied by h5i-runc's `Executor` just before `exec`.
//!
//! Owns the `h5i.*` annotations and what they mean:
//! - `h5i.landlock`: JSON Landlock request (format in `landlock.rs`), enforced fully or the
//!   container does not run;
//! - `h5i.seccomp`: `"h5i-v2"` selects the default-deny base (`allowlist.rs`: unknown calls
//!   answer `ENOSYS`) with h5i's deny list (`denylist.rs`) as its second layer; `"h5i-v1"` the
//!   deny list alone. Installed last; `seccomp.rs` compiles both per architecture;
//! - `h5i.net.unix`: `"true"` (default) or `"false"`; `false` adds the `socket(AF_UNIX)` entry
//!   and requires `h5i.seccomp`;
//! - `h5i.net.families`: comma-separated address-family names the policy grants
//!   (`net.families`); every family `h5i_policy::families` does not allow, and that is not
//!   named here, answers `EPERM` from `socket()`. A name that cannot be granted is refused;
//! - `h5i.net.gate`: `"on"` says the spec's own `linux.seccomp` routes `socket`/`socketpair` to
//!   the socket gate's listener. Believed only when the spec really does
//!   (`crate::socket_gate::routes_sockets_to_listener`), else refused; requires `h5i.seccomp`.
//!   With a verified gate the deny list leaves out its `socket` entries: an `ERRNO` answer
//!   outranks `USER_NOTIF`, so they would hide those calls from the gate (which refuses them
//!   itself, and counts them). Without the annotation the list is exactly as without a gate.
//!
//! With no `h5i.*` annotation the executor is plain OCI. With any, the order inside the
//! container's init is: `PR_SET_NO_NEW_PRIVS`, Landlock `restrict_self`, seccomp, `execvp`.
//!
//! An exec'd process of a gated box gets no `linux.seccomp` from libcontainer 0.7 (it rebuilds
//! `linux` for exec'd processes), so h5i-runc's `exec` connects to the gate's listener on the
//! host and hands the executor that socket ([`GateHandoff`]); the executor then installs the
//! same notify rule itself (`crate::socket_gate::notify_program`) and sends its listener to
//! the gate, before h5i's own filters. Without a hand-off such a process is refused.
//!
//! libcontainer applies the spec's own `linux.seccomp` *before* calling the executor, so a spec
//! profile used together with these annotations must allow `landlock_create_ruleset`,
//! `landlock_add_rule`, `landlock_restrict_self`, `prctl` and `seccomp`. The h5i-v2 base is
//! installed first of h5i's own programs, so it allows what the executor does after it:
//! `seccomp` for the deny list's programs, then `execve`.
//!
//! Plans are pure (`ConfinementPlan::from_annotations`); the kernel sits behind
//! `kernel::ConfinementKernel`. Guarded by the unit tests here and by `tests/runc.rs`
//! (`landlock_annotation_*`, `seccomp_*`) and `tests/podman.rs`.
//! Must never: run the payload partially confined, or confine a bundle that did not ask.

pub mod allowlist;
pub mod denylist;
pub mod executor;
pub mod kernel;
pub mod landlock;
pub mod seccomp;
pub mod syscalls;

use std::collections::HashMap;
use std::os::fd::RawFd;

use libcontainer::oci_spec::runtime::Spec;
use seccompiler::BpfProgram;

use self::kernel::{ConfinementKernel, KernelError};
use self::landlock::{LandlockPlan, LandlockPlanError, LandlockRequest};
use self::seccomp::{SeccompError, SeccompProfile};

pub use h5i_policy::spec_names::annotation::{
    LANDLOCK as ANNOTATION_LANDLOCK, NET_FAMILIES as ANNOTATION_NET_FAMILIES,
    NET_GATE as ANNOTATION_NET_GATE, NET_UNIX as ANNOTATION_NET_UNIX,
    SECCOMP as ANNOTATION_SECCOMP,
};
pub use h5i_policy::spec_names::value::NET_GATE_ON;

/// Why confinement could not be planned or applied.
#[derive(Debug, thiserror::Error)]
pub enum ConfineError {
    /// `h5i.landlock` is malformed or cannot be enforced here.
    #[error(transparent)]
    Landlock(#[from] LandlockPlanError),
    /// `h5i.seccomp` is malformed.
    #[error(transparent)]
    Seccomp(#[from] SeccompError),
    /// `h5i.net.unix` has a value other than "true"/"false".
    #[error("refusing: annotation h5i.net.unix is {0:?}; to fix: use \"true\" or \"false\"")]
    NetUnixValue(String),
    /// `h5i.net.unix = "false"` without the filter that enforces it.
    #[error("refusing: h5i.net.unix=false is enforced by seccomp but h5i.seccomp is not set; to fix: add h5i.seccomp=h5i-v1")]
    NetUnixWithoutSeccomp,
    /// `h5i.net.gate` has a value other than "on".
    #[error("refusing: annotation h5i.net.gate is {0:?}; to fix: use \"on\" or drop it")]
    NetGateValue(String),
    /// `h5i.net.gate = "on"` and the spec has no `linux.seccomp` at all: what libcontainer 0.7
    /// hands the executor for an exec'd process (it rebuilds `linux` without seccomp).
    #[error("refusing: h5i.net.gate=on but this process has no seccomp profile of its own (libcontainer leaves it out of exec'd processes) and no connection to the socket gate was handed over, so its socket calls would bypass the gate; to fix: exec with h5i-runc, which connects it")]
    NetGateNoProfile,
    /// `h5i.net.gate = "on"` but the spec does not route every socket call to a listener.
    #[error("refusing: h5i.net.gate=on but the spec's linux.seccomp does not send socket and socketpair to a listener (one unconditional SCMP_ACT_NOTIFY rule each, absolute listenerPath); to fix: add that rule, or drop h5i.net.gate")]
    NetGateNotInSpec,
    /// `h5i.net.gate = "on"` without h5i's deny list (io_uring could make sockets around it).
    #[error("refusing: h5i.net.gate=on needs h5i.seccomp (its io_uring denial keeps sockets from being made around the gate); to fix: add h5i.seccomp=h5i-v1")]
    NetGateWithoutSeccomp,
    /// A kernel step failed.
    #[error(transparent)]
    Kernel(#[from] KernelError),
}

/// Everything the executor will apply, decided before any kernel call.
#[derive(Debug, Default)]
pub struct ConfinementPlan {
    /// Landlock ruleset, if asked for.
    pub landlock: Option<LandlockPlan>,
    /// Seccomp programs in install order, if asked for.
    pub seccomp: Option<(SeccompProfile, Vec<BpfProgram>)>,
    /// For an exec'd process of a gated box: the socket gate's notify filter, installed here
    /// and its listener handed to the gate.
    pub gate_handoff: Option<GateHandoff>,
}

/// What an exec'd process needs to give the socket gate its listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GateHandoff {
    /// A unix stream h5i-runc connected to the gate's `listenerPath` (close-on-exec, inherited
    /// across the fork into the exec'd process).
    pub socket: RawFd,
    /// The OCI `ContainerProcessState` JSON to send with the listener.
    pub message: Vec<u8>,
}

impl ConfinementPlan {
    /// Plan for a parsed spec: its annotations, and whether its own `linux.seccomp` routes
    /// socket calls to a listener.
    /// `handoff` is h5i-runc `exec`'s connection to the gate, when it made one: used only when
    /// the spec asks for the gate but carries no seccomp profile (an exec'd process).
    pub fn from_spec(
        spec: &Spec,
        handoff: Option<&GateHandoff>,
        landlock_abi: impl FnOnce() -> i32,
    ) -> Result<Self, ConfineError> {
        let seccomp = spec.linux().as_ref().and_then(|l| l.seccomp().as_ref());
        let gate_asked = spec
            .annotations()
            .as_ref()
            .is_some_and(|a| a.contains_key(ANNOTATION_NET_GATE));
        let (gate_in_spec, handoff) = match (seccomp, handoff) {
            (Some(profile), _) => (
                crate::socket_gate::routes_sockets_to_listener(profile),
                None,
            ),
            (None, Some(h)) if gate_asked => (true, Some(h.clone())),
            (None, None) if gate_asked => return Err(ConfineError::NetGateNoProfile),
            (None, _) => (false, None),
        };
        let mut plan =
            Self::from_annotations(spec.annotations().as_ref(), gate_in_spec, landlock_abi)?;
        plan.gate_handoff = handoff;
        Ok(plan)
    }

    /// Plan from the spec's annotations; `gate_in_spec` says whether the spec's seccomp
    /// profile routes socket calls to a listener; `landlock_abi` is the kernel's answer to the
    /// ABI probe (only consulted when Landlock is asked for).
    pub fn from_annotations(
        annotations: Option<&HashMap<String, String>>,
        gate_in_spec: bool,
        landlock_abi: impl FnOnce() -> i32,
    ) -> Result<Self, ConfineError> {
        let Some(ann) = annotations else {
            return Ok(Self::default());
        };
        let landlock = match ann.get(ANNOTATION_LANDLOCK) {
            Some(json) => Some(LandlockRequest::parse(json)?.plan(landlock_abi())?),
            None => None,
        };
        let net_unix = match ann.get(ANNOTATION_NET_UNIX).map(String::as_str) {
            None | Some("true") => true,
            Some("false") => false,
            Some(other) => return Err(ConfineError::NetUnixValue(other.to_string())),
        };
        let socket_gate = match ann.get(ANNOTATION_NET_GATE).map(String::as_str) {
            None => false,
            Some(NET_GATE_ON) if !gate_in_spec => return Err(ConfineError::NetGateNotInSpec),
            Some(NET_GATE_ON) if !ann.contains_key(ANNOTATION_SECCOMP) => {
                return Err(ConfineError::NetGateWithoutSeccomp)
            }
            Some(NET_GATE_ON) => true,
            Some(other) => return Err(ConfineError::NetGateValue(other.to_string())),
        };
        let seccomp = match ann.get(ANNOTATION_SECCOMP) {
            Some(name) => {
                let mut profile = SeccompProfile::named(name, net_unix, socket_gate)?;
                if let Some(granted) = ann.get(ANNOTATION_NET_FAMILIES) {
                    profile = profile.with_granted_families(granted)?;
                }
                let programs = profile.compile()?;
                Some((profile, programs))
            }
            None if !net_unix => return Err(ConfineError::NetUnixWithoutSeccomp),
            None => None,
        };
        Ok(Self {
            landlock,
            seccomp,
            gate_handoff: None,
        })
    }

    /// True when the bundle asked for nothing (plain OCI behaviour).
    pub fn is_empty(&self) -> bool {
        self.landlock.is_none() && self.seccomp.is_none() && self.gate_handoff.is_none()
    }

    /// Apply in order: no_new_privs, Landlock, the gate hand-off, seccomp. Stops at the first
    /// failure.
    pub fn apply(&self, kernel: &mut dyn ConfinementKernel) -> Result<(), ConfineError> {
        if self.is_empty() {
            return Ok(());
        }
        kernel.set_no_new_privs()?;
        if let Some(plan) = &self.landlock {
            kernel.restrict_landlock(plan)?;
        }
        if let Some(h) = &self.gate_handoff {
            let program = crate::socket_gate::notify_program();
            kernel.hand_off_notify_filter(&program, h.socket, &h.message)?;
        }
        if let Some((_, programs)) = &self.seccomp {
            for program in programs {
                kernel.install_seccomp(program)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::kernel::RecordingKernel;
    use super::*;

    fn ann(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn no_annotations_means_plain_oci() {
        let plan =
            ConfinementPlan::from_annotations(None, false, || panic!("no probe needed")).unwrap();
        assert!(plan.is_empty());
        let other = ann(&[("org.opencontainers.image.ref.name", "x")]);
        let plan = ConfinementPlan::from_annotations(Some(&other), false, || 7).unwrap();
        assert!(plan.is_empty());
        let mut k = RecordingKernel::default();
        plan.apply(&mut k).unwrap();
        assert!(
            k.calls.is_empty(),
            "plain OCI must not even set no_new_privs"
        );
    }

    #[test]
    fn order_is_nnp_then_landlock_then_seccomp() {
        let a = ann(&[
            (ANNOTATION_LANDLOCK, r#"{"read":["/"],"write":["/tmp"]}"#),
            (ANNOTATION_SECCOMP, "h5i-v1"),
        ]);
        let plan = ConfinementPlan::from_annotations(Some(&a), false, || 7).unwrap();
        let mut k = RecordingKernel {
            abi: 7,
            ..Default::default()
        };
        plan.apply(&mut k).unwrap();
        assert_eq!(k.calls[0], "no_new_privs");
        assert_eq!(k.calls[1], "landlock(2 rules)");
        assert!(k.calls[2..].iter().all(|c| c.starts_with("seccomp(")));
        assert_eq!(k.calls.len(), 2 + 3, "guard + ENOSYS + EPERM programs");
    }

    #[test]
    fn landlock_failure_stops_before_seccomp() {
        let a = ann(&[
            (ANNOTATION_LANDLOCK, r#"{"read":["/"]}"#),
            (ANNOTATION_SECCOMP, "h5i-v1"),
        ]);
        let plan = ConfinementPlan::from_annotations(Some(&a), false, || 7).unwrap();
        let mut k = RecordingKernel {
            abi: 7,
            fail_landlock: true,
            ..Default::default()
        };
        assert!(plan.apply(&mut k).is_err());
        assert_eq!(
            k.calls,
            vec!["no_new_privs".to_string(), "landlock(1 rules)".to_string()]
        );
    }

    #[test]
    fn landlock_on_a_kernel_without_it_is_refused() {
        let a = ann(&[(ANNOTATION_LANDLOCK, r#"{"read":["/"]}"#)]);
        let e = ConfinementPlan::from_annotations(Some(&a), false, || -libc::ENOSYS).unwrap_err();
        assert!(matches!(
            e,
            ConfineError::Landlock(LandlockPlanError::Unavailable(_))
        ));
    }

    #[test]
    fn net_unix_false_without_seccomp_is_refused() {
        let a = ann(&[(ANNOTATION_NET_UNIX, "false")]);
        let e = ConfinementPlan::from_annotations(Some(&a), false, || 7).unwrap_err();
        assert!(matches!(e, ConfineError::NetUnixWithoutSeccomp));
        let a = ann(&[(ANNOTATION_NET_UNIX, "no"), (ANNOTATION_SECCOMP, "h5i-v1")]);
        let e = ConfinementPlan::from_annotations(Some(&a), false, || 7).unwrap_err();
        assert!(matches!(e, ConfineError::NetUnixValue(_)));
    }

    #[test]
    fn net_unix_false_selects_the_unix_entry() {
        let a = ann(&[
            (ANNOTATION_SECCOMP, "h5i-v1"),
            (ANNOTATION_NET_UNIX, "false"),
        ]);
        let plan = ConfinementPlan::from_annotations(Some(&a), false, || 7).unwrap();
        let (profile, _) = plan.seccomp.unwrap();
        assert!(!profile.net_unix);
    }
    #[test]
    fn a_gate_annotation_is_believed_only_with_the_rule_in_the_spec() {
        let a = ann(&[
            (ANNOTATION_SECCOMP, "h5i-v1"),
            (ANNOTATION_NET_GATE, NET_GATE_ON),
        ]);
        let e = ConfinementPlan::from_annotations(Some(&a), false, || 7).unwrap_err();
        assert!(matches!(e, ConfineError::NetGateNotInSpec));
        let plan = ConfinementPlan::from_annotations(Some(&a), true, || 7).unwrap();
        assert!(plan.seccomp.unwrap().0.socket_gate);
    }

    #[test]
    fn net_families_grants_reach_the_profile_and_bad_names_are_refused() {
        let a = ann(&[
            (ANNOTATION_SECCOMP, "h5i-v1"),
            (ANNOTATION_NET_FAMILIES, "vsock,alg"),
        ]);
        let plan = ConfinementPlan::from_annotations(Some(&a), false, || 7).unwrap();
        let families = plan.seccomp.unwrap().0.families;
        assert!(families.contains(libc::AF_VSOCK as u32));
        assert!(families.contains(libc::AF_ALG as u32));
        assert!(!families.contains(libc::AF_CAN as u32));
        let a = ann(&[
            (ANNOTATION_SECCOMP, "h5i-v1"),
            (ANNOTATION_NET_FAMILIES, "packet"),
        ]);
        let e = ConfinementPlan::from_annotations(Some(&a), false, || 7).unwrap_err();
        assert!(matches!(
            e,
            ConfineError::Seccomp(SeccompError::Families(_))
        ));
    }

    #[test]
    fn a_gate_rule_without_the_annotation_changes_nothing() {
        let a = ann(&[(ANNOTATION_SECCOMP, "h5i-v1")]);
        let plan = ConfinementPlan::from_annotations(Some(&a), true, || 7).unwrap();
        assert!(!plan.seccomp.unwrap().0.socket_gate);
    }

    #[test]
    fn a_gate_needs_the_deny_list_and_a_known_value() {
        let a = ann(&[(ANNOTATION_NET_GATE, NET_GATE_ON)]);
        let e = ConfinementPlan::from_annotations(Some(&a), true, || 7).unwrap_err();
        assert!(matches!(e, ConfineError::NetGateWithoutSeccomp));
        let a = ann(&[(ANNOTATION_SECCOMP, "h5i-v1"), (ANNOTATION_NET_GATE, "yes")]);
        let e = ConfinementPlan::from_annotations(Some(&a), true, || 7).unwrap_err();
        assert!(matches!(e, ConfineError::NetGateValue(_)));
    }

    #[test]
    fn from_spec_verifies_the_seccomp_section_itself() {
        let spec_with = |seccomp: serde_json::Value| -> Spec {
            serde_json::from_value(serde_json::json!({
                "ociVersion": "1.0.2",
                "root": {"path": "rootfs"},
                "linux": {"seccomp": seccomp},
                "annotations": {"h5i.seccomp": "h5i-v1", "h5i.net.gate": "on"}
            }))
            .unwrap()
        };
        let gated = crate::socket_gate::notify_section(std::path::Path::new("/run/g.sock"));
        let plan = ConfinementPlan::from_spec(&spec_with(gated), None, || 7).unwrap();
        assert!(plan.seccomp.unwrap().0.socket_gate);
        let allow_all =
            serde_json::json!({"defaultAction": "SCMP_ACT_ALLOW", "listenerPath": "/run/g.sock"});
        let e = ConfinementPlan::from_spec(&spec_with(allow_all), None, || 7).unwrap_err();
        assert!(matches!(e, ConfineError::NetGateNotInSpec));
        // An exec'd process: libcontainer rebuilt `linux` without any seccomp.
        let mut exec_spec = spec_with(serde_json::json!({"defaultAction": "SCMP_ACT_ALLOW"}));
        exec_spec.set_linux(Some(Default::default()));
        let e = ConfinementPlan::from_spec(&exec_spec, None, || 7).unwrap_err();
        assert!(matches!(e, ConfineError::NetGateNoProfile));
        // With h5i-runc exec's connection to the gate, the executor installs the rule itself:
        // hand-off first, then h5i-v1 without its socket entries.
        let handoff = GateHandoff {
            socket: 9,
            message: b"{}".to_vec(),
        };
        let plan = ConfinementPlan::from_spec(&exec_spec, Some(&handoff), || 7).unwrap();
        assert!(plan.seccomp.as_ref().unwrap().0.socket_gate);
        let mut k = RecordingKernel::default();
        plan.apply(&mut k).unwrap();
        assert_eq!(k.calls[0], "no_new_privs");
        assert!(
            k.calls[1].starts_with("gate_handoff(fd 9, "),
            "{:?}",
            k.calls
        );
        assert!(k.calls[2..].iter().all(|c| c.starts_with("seccomp(")));
        // A spec that carries its own profile never uses a hand-off.
        let gated = crate::socket_gate::notify_section(std::path::Path::new("/run/g.sock"));
        let plan = ConfinementPlan::from_spec(&spec_with(gated), Some(&handoff), || 7).unwrap();
        assert!(plan.gate_handoff.is_none());
    }
}
