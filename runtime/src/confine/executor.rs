//! `H5iExecutor`: libcontainer's `Executor` with h5i's confinement in front of `execvp`.
//!
//! Owns the hand-off point: `validate` (runs in the container's init before `start`, so a bad
//! annotation fails `create`, not the payload) plans confinement and probes the kernel;
//! `exec` plans again, applies the plan through `LinuxKernel` and then does what
//! libcontainer's default executor does (`execvp` of `process.args`). Before confinement it
//! gives the standard descriptors back the shape the caller handed `h5i-runc` (see
//! `crate::stdio`: libcontainer's init reopens a `/dev/null` one read-only).
//! Must never: exec the payload after any confinement step failed.

use libcontainer::oci_spec::runtime::Spec;
use libcontainer::workload::{default, Executor, ExecutorError, ExecutorValidationError};

use super::kernel::{ConfinementKernel, LinuxKernel};
use super::{ConfinementPlan, GateHandoff};
use crate::stdio::{ClosedStdio, StdioSnapshot};

/// The executor `h5i-runc` hands libcontainer for init and exec'd processes.
#[derive(Debug, Clone, Default)]
pub struct H5iExecutor {
    /// `exec` into a gated box: h5i-runc's connection to the gate (see `GateHandoff`).
    pub gate_handoff: Option<GateHandoff>,
    /// The standard descriptors as `h5i-runc` received them, restored before the exec.
    pub stdio: StdioSnapshot,
}

/// The standard descriptors the caller had closed, as the spec's annotation names them.
fn closed_by_annotation(spec: &Spec) -> Result<ClosedStdio, crate::stdio::BadClosedAnnotation> {
    match spec
        .annotations()
        .as_ref()
        .and_then(|a| a.get(crate::stdio::ANNOTATION_CLOSED))
    {
        Some(v) => ClosedStdio::from_annotation(v),
        None => Ok(ClosedStdio::default()),
    }
}

impl H5iExecutor {
    fn plan(&self, spec: &Spec) -> Result<ConfinementPlan, super::ConfineError> {
        let kernel = LinuxKernel;
        ConfinementPlan::from_spec(spec, self.gate_handoff.as_ref(), || kernel.landlock_abi())
    }
}

impl Executor for H5iExecutor {
    fn exec(&self, spec: &Spec) -> Result<(), ExecutorError> {
        let terminal = spec
            .process()
            .as_ref()
            .and_then(|p| p.terminal())
            .unwrap_or(false);
        let closed = closed_by_annotation(spec).map_err(|e| ExecutorError::Other(e.to_string()))?;
        self.stdio.also_closed(closed).restore(terminal).map_err(|e| {
            tracing::error!(error = %e, "cannot restore the caller's stdio; not executing the payload");
            ExecutorError::Other(format!("restoring the caller's standard descriptors: {e}"))
        })?;
        let plan = self
            .plan(spec)
            .map_err(|e| ExecutorError::Other(e.to_string()))?;
        plan.apply(&mut LinuxKernel).map_err(|e| {
            tracing::error!(error = %e, "h5i confinement failed; not executing the payload");
            ExecutorError::Other(e.to_string())
        })?;
        if let Some(argv) = spec.process().as_ref().and_then(|p| p.args().as_ref()) {
            h5i_log::spawned_argv(argv, Some(std::process::id()), "h5i-runc");
        }
        default::get_executor().exec(spec)
    }

    fn validate(&self, spec: &Spec) -> Result<(), ExecutorValidationError> {
        default::get_executor().validate(spec)?;
        closed_by_annotation(spec)
            .map_err(|e| ExecutorValidationError::ArgValidationError(e.to_string()))?;
        self.plan(spec)
            .map_err(|e| ExecutorValidationError::ArgValidationError(e.to_string()))?;
        Ok(())
    }
}
