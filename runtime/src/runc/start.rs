//! `start`: let a `created` container's init exec its payload.

use super::{Context, RuncError};

/// Start container `id`.
pub fn start(ctx: &Context, id: &str) -> Result<(), RuncError> {
    let mut container = ctx.load(id)?;
    container.start().map_err(RuncError::container(id))
}
