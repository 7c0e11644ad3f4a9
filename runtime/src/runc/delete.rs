//! `delete`: remove a stopped (or, with `--force`, any) container: its processes (force),
//! cgroup, poststop hooks (libcontainer), state directory and h5i's sidecar.

use super::{sidecar, Context, RuncError};

/// Delete container `id`.
pub fn delete(ctx: &Context, id: &str, force: bool) -> Result<(), RuncError> {
    let mut container = match ctx.load(id) {
        Ok(c) => c,
        Err(e @ RuncError::NotFound { .. }) => {
            // A sidecar without a container is debris from a create that died; clear it, but
            // still tell the caller the container does not exist.
            sidecar::cleanup(&ctx.root, id);
            return Err(e);
        }
        Err(e) => return Err(e),
    };
    container.delete(force).map_err(RuncError::container(id))?;
    sidecar::cleanup(&ctx.root, id);
    Ok(())
}
