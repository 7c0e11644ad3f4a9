//! `resume`: thaw a paused container.

use super::{Context, RuncError};

/// Resume container `id`.
pub fn resume(ctx: &Context, id: &str) -> Result<(), RuncError> {
    let mut container = ctx.load(id)?;
    container.resume().map_err(RuncError::container(id))
}
