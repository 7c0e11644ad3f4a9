//! `delete`: remove a stopped (or, with `--force`, any) container: its processes (force),
//! cgroup, state directory and h5i's sidecar, then its poststop hooks. A supervised network's
//! directory is left to the poststop hook `net-down` (Podman runs it after `delete`), except
//! the debris of a container that does not exist (`net_dir`).
//!
//! Poststop hooks are run here, not by libcontainer: its delete stops at the first failing hook
//! with the state directory still in place, so the container could never be deleted (and with
//! the bundle gone, `delete -f` failed the same way). The runtime spec says a failing poststop
//! hook is a warning and the remaining hooks and the delete go on; runc does the same. So the
//! hooks are taken out of libcontainer's copy of the config before its delete (and put back if
//! that delete fails), and run one by one afterwards, each failure logged as a warning.
//!
//! With `--force`, every process in the container's cgroup is killed and waited for first
//! (`cgroup::end_processes`), so the cgroup can be removed even when a killed `create` left
//! processes the state never named.
//!
//! Must never: fail a delete because of a poststop hook, or skip the hooks after one fails.
//! Guarded by `tests/runc.rs` (`failing_poststop_hook_is_a_warning_and_delete_finishes`).

use std::path::Path;

use libcontainer::config::YoukiConfig;
use libcontainer::container::{Container, ContainerStatus};
use libcontainer::oci_spec::runtime::Hook;

use super::{cgroup, net_dir, sidecar, Context, RuncError};

/// Delete container `id`.
pub fn delete(ctx: &Context, id: &str, force: bool) -> Result<(), RuncError> {
    let mut container = match ctx.load(id) {
        Ok(c) => c,
        Err(e @ RuncError::NotFound { .. }) => {
            // A sidecar or network directory without a container is debris from a create
            // that failed or died; clear it, but still tell the caller the container does not
            // exist. So is a container directory without state.json (a runtime killed between
            // its mkdir and the first save): runc removes it too.
            sidecar::cleanup(&ctx.root, id);
            net_dir::remove_debris(id);
            let dir = ctx.root.join(id);
            if let Err(err) = std::fs::remove_dir_all(&dir) {
                if err.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!(?dir, error = %err, "could not remove a container directory without state");
                }
            }
            return Err(e);
        }
        Err(e) => return Err(e),
    };
    remove(ctx, &mut container, force)
}

/// Delete a loaded container (also the end of `run`): libcontainer's delete without the
/// poststop hooks, the sidecar, then the hooks, each failure a warning.
pub fn remove(ctx: &Context, container: &mut Container, force: bool) -> Result<(), RuncError> {
    let id = container.id().to_string();
    let state_dir = ctx.root.join(&id);
    let poststop = take_poststop_hooks(&state_dir);
    // A paused container is thawed and killed by libcontainer itself (a frozen process would
    // not die before the thaw); every other one's processes are ended here and waited for.
    if force && container.status() != ContainerStatus::Paused {
        if let Ok(config) = container.spec() {
            cgroup::end_processes(&config.cgroup_path);
        }
    }
    if let Err(source) = container.delete(force) {
        if let Some((config, _)) = &poststop {
            if state_dir.exists() {
                if let Err(e) = config.save(&state_dir) {
                    tracing::warn!(id, error = %e, "could not restore the poststop hooks");
                }
            }
        }
        return Err(RuncError::Container { id, source });
    }
    sidecar::cleanup(&ctx.root, &id);
    if let Some((_, hooks)) = poststop {
        run_poststop(container, &hooks);
    }
    Ok(())
}

/// Remove the poststop hooks from libcontainer's saved config; returns the config as it was
/// and the hooks. `None` when there are none (or no config: libcontainer then runs none).
fn take_poststop_hooks(state_dir: &Path) -> Option<(YoukiConfig, Vec<Hook>)> {
    let original = YoukiConfig::load(state_dir).ok()?;
    let hooks = original.hooks.as_ref()?.poststop().clone()?;
    let mut stripped = original.clone();
    if let Some(h) = stripped.hooks.as_mut() {
        h.set_poststop(None);
    }
    match stripped.save(state_dir) {
        Ok(()) => Some((original, hooks)),
        Err(e) => {
            // libcontainer keeps the hooks and runs them itself (stopping at a failure).
            tracing::warn!(error = %e, "could not take over the poststop hooks");
            None
        }
    }
}

/// Run each poststop hook with the `stopped` state (no pid: the process is gone); a failure is
/// a warning and the next hook still runs.
fn run_poststop(container: &Container, hooks: &[Hook]) {
    let mut state = container.state.clone();
    state.status = ContainerStatus::Stopped;
    state.pid = None;
    for hook in hooks {
        let one = vec![hook.clone()];
        if let Err(e) = libcontainer::hooks::run_hooks(Some(&one), Some(&state), None, None, None) {
            tracing::warn!(
                id = container.id(),
                hook = %hook.path().display(),
                "poststop hook failed: {}",
                super::error_chain(&e)
            );
        }
    }
}
