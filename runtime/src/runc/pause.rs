//! `pause`: freeze every process of a running container (cgroup freezer).

use super::{Context, RuncError};

/// Pause container `id`.
pub fn pause(ctx: &Context, id: &str) -> Result<(), RuncError> {
    let mut container = ctx.load(id)?;
    container.pause().map_err(RuncError::container(id))
}
