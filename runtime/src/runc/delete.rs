//! `delete`: remove a stopped (or, with `--force`, any) container: its processes (force),
//! cgroup, poststop hooks (libcontainer), state directory and h5i's sidecar. A supervised
//! network's directory is left to the poststop hook `net-down` (Podman runs it after
//! `delete`), except the debris of a container that does not exist (`net_dir`).

use super::{net_dir, sidecar, Context, RuncError};

/// Delete container `id`.
pub fn delete(ctx: &Context, id: &str, force: bool) -> Result<(), RuncError> {
    let mut container = match ctx.load(id) {
        Ok(c) => c,
        Err(e @ RuncError::NotFound { .. }) => {
            // A sidecar or network directory without a container is debris from a create
            // that failed or died; clear it, but still tell the caller the container does not
            // exist.
            sidecar::cleanup(&ctx.root, id);
            net_dir::remove_debris(id);
            return Err(e);
        }
        Err(e) => return Err(e),
    };
    container.delete(force).map_err(RuncError::container(id))?;
    sidecar::cleanup(&ctx.root, id);
    Ok(())
}
