//! The narrow seam between confinement plans and the kernel.
//!
//! Owns the kernel operations the Executor performs before `exec`: probing the Landlock ABI,
//! `PR_SET_NO_NEW_PRIVS`, Landlock `restrict_self`, installing seccomp programs, and, for an
//! exec'd process of a gated box, installing the socket gate's notify filter and handing its
//! listener to the gate. The
//! real implementation (`LinuxKernel`) runs inside the container's init (after `pivot_root`);
//! unit tests use `RecordingKernel` to check order and fail-closed behaviour without root.
//! Must never: report success for a partially enforced ruleset.

use std::io;
use std::os::fd::{AsFd, FromRawFd, OwnedFd, RawFd};

use landlock::{
    CompatLevel, Compatible, NetPort, PathBeneath, PathFd, RestrictionStatus, Ruleset, RulesetAttr,
    RulesetCreatedAttr, RulesetStatus,
};
use seccompiler::BpfProgram;

use super::landlock::LandlockPlan;

/// A kernel operation that failed; confinement is then refused, never partial.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// prctl(PR_SET_NO_NEW_PRIVS) failed.
    #[error("refusing to run: prctl(PR_SET_NO_NEW_PRIVS) failed: {0}")]
    NoNewPrivs(io::Error),
    /// The Landlock crate or syscall failed.
    #[error("refusing to run: Landlock ruleset failed: {0}; to fix: check that the spec's seccomp profile allows landlock_* syscalls")]
    Landlock(String),
    /// The kernel enforced less than asked.
    #[error("refusing to run: Landlock was only {0:?}, not fully enforced")]
    NotFullyEnforced(RulesetStatus),
    /// A path rule's path could not be opened for a reason other than absence.
    #[error("refusing to run: cannot open Landlock path {path}: {reason}")]
    Path {
        /// The container path.
        path: String,
        /// Why.
        reason: String,
    },
    /// Installing a seccomp program failed.
    #[error("refusing to run: installing the h5i seccomp filter failed: {0}; to fix: check that the spec's seccomp profile allows seccomp(2)/prctl(PR_SET_SECCOMP)")]
    Seccomp(String),
    /// The socket gate's notify filter could not be installed or handed to the gate.
    #[error("refusing to run: handing the socket gate its listener failed: {0}; to fix: check that the box's network sentry is running")]
    GateHandoff(io::Error),
}

/// The kernel operations confinement needs.
pub trait ConfinementKernel {
    /// `landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION)`: the ABI, or a
    /// negative errno when Landlock is unavailable.
    fn landlock_abi(&self) -> i32;
    /// `prctl(PR_SET_NO_NEW_PRIVS, 1)`.
    fn set_no_new_privs(&mut self) -> Result<(), KernelError>;
    /// Build, fill and enforce a Landlock ruleset; fully or not at all.
    fn restrict_landlock(&mut self, plan: &LandlockPlan) -> Result<(), KernelError>;
    /// Install one seccomp program on the calling thread.
    fn install_seccomp(&mut self, program: &BpfProgram) -> Result<(), KernelError>;
    /// Install `program` with a new user-notification listener and send that listener, with
    /// `message`, as `SCM_RIGHTS` on the connected socket `to` (inherited from h5i-runc's
    /// `exec`, owned by nothing else in this process); both descriptors are closed afterwards,
    /// whatever happened.
    fn hand_off_notify_filter(
        &mut self,
        program: &BpfProgram,
        to: RawFd,
        message: &[u8],
    ) -> Result<(), KernelError>;
}

/// The real kernel.
#[derive(Debug, Default, Clone, Copy)]
pub struct LinuxKernel;

impl ConfinementKernel for LinuxKernel {
    fn landlock_abi(&self) -> i32 {
        match h5i_sys::landlock::abi_version() {
            Ok(v) => i32::try_from(v).unwrap_or(i32::MAX),
            Err(e) => -e.raw_os_error().unwrap_or(libc::ENOSYS),
        }
    }

    fn set_no_new_privs(&mut self) -> Result<(), KernelError> {
        h5i_sys::landlock::set_no_new_privs().map_err(KernelError::NoNewPrivs)
    }

    fn restrict_landlock(&mut self, plan: &LandlockPlan) -> Result<(), KernelError> {
        let ll = |e: landlock::RulesetError| KernelError::Landlock(e.to_string());
        let mut ruleset = Ruleset::default()
            .set_compatibility(CompatLevel::HardRequirement)
            .handle_access(plan.handled_fs)
            .map_err(ll)?;
        if !plan.handled_net.is_empty() {
            ruleset = ruleset.handle_access(plan.handled_net).map_err(ll)?;
        }
        let mut created = ruleset.create().map_err(ll)?;
        for rule in &plan.path_rules {
            let meta = match std::fs::metadata(&rule.path) {
                Ok(m) => m,
                // A grant for a path that does not exist grants nothing: skip it.
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    tracing::debug!(path = ?rule.path, "landlock: granted path absent, skipped");
                    continue;
                }
                Err(e) => {
                    return Err(KernelError::Path {
                        path: rule.path.display().to_string(),
                        reason: e.to_string(),
                    })
                }
            };
            let access = if meta.is_dir() {
                rule.access
            } else {
                rule.access & landlock::AccessFs::from_file(plan.abi)
            };
            let fd = PathFd::new(&rule.path).map_err(|e| KernelError::Path {
                path: rule.path.display().to_string(),
                reason: e.to_string(),
            })?;
            created = created.add_rule(PathBeneath::new(fd, access)).map_err(ll)?;
        }
        for rule in &plan.port_rules {
            created = created
                .add_rule(NetPort::new(rule.port, rule.access))
                .map_err(ll)?;
        }
        let status: RestrictionStatus = created.restrict_self().map_err(ll)?;
        if status.ruleset != RulesetStatus::FullyEnforced {
            return Err(KernelError::NotFullyEnforced(status.ruleset));
        }
        Ok(())
    }

    fn install_seccomp(&mut self, program: &BpfProgram) -> Result<(), KernelError> {
        seccompiler::apply_filter(program).map_err(|e| KernelError::Seccomp(e.to_string()))
    }

    fn hand_off_notify_filter(
        &mut self,
        program: &BpfProgram,
        to: RawFd,
        message: &[u8],
    ) -> Result<(), KernelError> {
        // SAFETY: per the trait's contract `to` is this process's copy of the socket h5i-runc
        // connected before forking the exec'd process, and nothing else here owns or uses it;
        // taking ownership closes it when this call returns.
        let to = unsafe { OwnedFd::from_raw_fd(to) };
        let listener = install_with_listener(program).map_err(KernelError::GateHandoff)?;
        h5i_sys::fd_passing::send_with_fds(&to, message, &[listener.as_fd()])
            .map_err(|e| KernelError::GateHandoff(e.into()))
    }
}

/// `seccomp(SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_NEW_LISTENER, program)`: the
/// listener descriptor (close-on-exec, as the kernel makes it). No-new-privs is set before
/// this (the plan applies it first).
fn install_with_listener(program: &BpfProgram) -> io::Result<OwnedFd> {
    // seccompiler's instruction and libc's have the same fields; copied, not cast.
    let program: Vec<h5i_sys::seccomp::Instruction> = program
        .iter()
        .map(|i| h5i_sys::seccomp::Instruction {
            code: i.code,
            jt: i.jt,
            jf: i.jf,
            k: i.k,
        })
        .collect();
    h5i_sys::seccomp::install_with_listener(&program)
}

/// A test double that records the calls in order.
#[cfg(test)]
#[derive(Debug, Default)]
pub struct RecordingKernel {
    /// What `landlock_abi` answers.
    pub abi: i32,
    /// Calls made, in order.
    pub calls: Vec<String>,
    /// Make `restrict_landlock` fail.
    pub fail_landlock: bool,
}

#[cfg(test)]
impl ConfinementKernel for RecordingKernel {
    fn landlock_abi(&self) -> i32 {
        self.abi
    }
    fn set_no_new_privs(&mut self) -> Result<(), KernelError> {
        self.calls.push("no_new_privs".into());
        Ok(())
    }
    fn restrict_landlock(&mut self, plan: &LandlockPlan) -> Result<(), KernelError> {
        self.calls
            .push(format!("landlock({} rules)", plan.path_rules.len()));
        if self.fail_landlock {
            return Err(KernelError::NotFullyEnforced(
                RulesetStatus::PartiallyEnforced,
            ));
        }
        Ok(())
    }
    fn install_seccomp(&mut self, program: &BpfProgram) -> Result<(), KernelError> {
        self.calls.push(format!("seccomp({} insns)", program.len()));
        Ok(())
    }
    fn hand_off_notify_filter(
        &mut self,
        program: &BpfProgram,
        to: RawFd,
        message: &[u8],
    ) -> Result<(), KernelError> {
        self.calls.push(format!(
            "gate_handoff(fd {to}, {} insns, {} bytes)",
            program.len(),
            message.len()
        ));
        Ok(())
    }
}
