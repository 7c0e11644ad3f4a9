//! Confinement the OCI spec cannot carry, applied by h5i-runc's `Executor` just before `exec`.
//!
//! Owns the `h5i.*` annotations and what they mean:
//! - `h5i.landlock`: JSON Landlock request (format in `landlock.rs`), enforced fully or the
//!   container does not run;
//! - `h5i.seccomp`: `"h5i-v1"` selects h5i's deny list (`denylist.rs`), installed last;
//! - `h5i.net.unix`: `"true"` (default) or `"false"`; `false` adds the `socket(AF_UNIX)` entry
//!   and requires `h5i.seccomp`.
//!
//! With no `h5i.*` annotation the executor is plain OCI. With any, the order inside the
//! container's init is: `PR_SET_NO_NEW_PRIVS`, Landlock `restrict_self`, seccomp, `execvp`.
//!
//! libcontainer applies the spec's own `linux.seccomp` *before* calling the executor, so a spec
//! profile used together with these annotations must allow `landlock_create_ruleset`,
//! `landlock_add_rule`, `landlock_restrict_self`, `prctl` and `seccomp`.
//!
//! Plans are pure (`ConfinementPlan::from_annotations`); the kernel sits behind
//! `kernel::ConfinementKernel`. Guarded by the unit tests here and by `tests/runc.rs`
//! (`landlock_annotation_*`, `seccomp_*`) and `tests/podman.rs`.
//! Must never: run the payload partially confined, or confine a bundle that did not ask.

pub mod denylist;
pub mod executor;
pub mod kernel;
pub mod landlock;
pub mod seccomp;

use std::collections::HashMap;

use seccompiler::BpfProgram;

use self::kernel::{ConfinementKernel, KernelError};
use self::landlock::{LandlockPlan, LandlockPlanError, LandlockRequest};
use self::seccomp::{SeccompError, SeccompProfile};

/// Annotation carrying the Landlock request (JSON).
pub const ANNOTATION_LANDLOCK: &str = "h5i.landlock";
/// Annotation selecting h5i's seccomp deny list.
pub const ANNOTATION_SECCOMP: &str = "h5i.seccomp";
/// Annotation for the policy's `net.unix` switch.
pub const ANNOTATION_NET_UNIX: &str = "h5i.net.unix";

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
}

impl ConfinementPlan {
    /// Plan from the spec's annotations; `landlock_abi` is the kernel's answer to the ABI probe
    /// (only consulted when Landlock is asked for).
    pub fn from_annotations(
        annotations: Option<&HashMap<String, String>>,
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
        let seccomp = match ann.get(ANNOTATION_SECCOMP) {
            Some(name) => {
                let profile = SeccompProfile::named(name, net_unix)?;
                let programs = profile.compile()?;
                Some((profile, programs))
            }
            None if !net_unix => return Err(ConfineError::NetUnixWithoutSeccomp),
            None => None,
        };
        Ok(Self { landlock, seccomp })
    }

    /// True when the bundle asked for nothing (plain OCI behaviour).
    pub fn is_empty(&self) -> bool {
        self.landlock.is_none() && self.seccomp.is_none()
    }

    /// Apply in order: no_new_privs, Landlock, seccomp. Stops at the first failure.
    pub fn apply(&self, kernel: &mut dyn ConfinementKernel) -> Result<(), ConfineError> {
        if self.is_empty() {
            return Ok(());
        }
        kernel.set_no_new_privs()?;
        if let Some(plan) = &self.landlock {
            kernel.restrict_landlock(plan)?;
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
        let plan = ConfinementPlan::from_annotations(None, || panic!("no probe needed")).unwrap();
        assert!(plan.is_empty());
        let other = ann(&[("org.opencontainers.image.ref.name", "x")]);
        let plan = ConfinementPlan::from_annotations(Some(&other), || 7).unwrap();
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
        let plan = ConfinementPlan::from_annotations(Some(&a), || 7).unwrap();
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
        let plan = ConfinementPlan::from_annotations(Some(&a), || 7).unwrap();
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
        let e = ConfinementPlan::from_annotations(Some(&a), || -libc::ENOSYS).unwrap_err();
        assert!(matches!(
            e,
            ConfineError::Landlock(LandlockPlanError::Unavailable(_))
        ));
    }

    #[test]
    fn net_unix_false_without_seccomp_is_refused() {
        let a = ann(&[(ANNOTATION_NET_UNIX, "false")]);
        let e = ConfinementPlan::from_annotations(Some(&a), || 7).unwrap_err();
        assert!(matches!(e, ConfineError::NetUnixWithoutSeccomp));
        let a = ann(&[(ANNOTATION_NET_UNIX, "no"), (ANNOTATION_SECCOMP, "h5i-v1")]);
        let e = ConfinementPlan::from_annotations(Some(&a), || 7).unwrap_err();
        assert!(matches!(e, ConfineError::NetUnixValue(_)));
    }

    #[test]
    fn net_unix_false_selects_the_unix_entry() {
        let a = ann(&[
            (ANNOTATION_SECCOMP, "h5i-v1"),
            (ANNOTATION_NET_UNIX, "false"),
        ]);
        let plan = ConfinementPlan::from_annotations(Some(&a), || 7).unwrap();
        let (profile, _) = plan.seccomp.unwrap();
        assert!(!profile.net_unix);
    }
}
