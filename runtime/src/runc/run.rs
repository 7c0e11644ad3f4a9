//! `run`: `create` + `start`, then (unless `-d`) stay attached: forward signals, pass the
//! payload's exit status through (128 + signal when killed) and delete the container.

use super::create::{create, CreateOptions};
use super::{delete, foreground, Context, RuncError};

/// Run a container; returns the exit code to exit with.
pub fn run(ctx: &Context, opts: &CreateOptions, keep: bool) -> Result<i32, RuncError> {
    let mut container = create(ctx, opts)?;
    let id = opts.id.clone();
    if !opts.detach {
        foreground::block_signals().map_err(|source| RuncError::Wait {
            id: id.clone(),
            source,
        })?;
    }
    if let Err(e) = container.start() {
        let _ = delete::remove(ctx, &mut container, true);
        return Err(RuncError::Container { id, source: e });
    }
    if opts.detach {
        return Ok(0);
    }
    let Some(pid) = container.pid() else {
        return Err(RuncError::Wait {
            id,
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "no init pid recorded"),
        });
    };
    let code = foreground::wait_forwarding(pid.as_raw());
    if !keep {
        // A cleanup failure must not replace the payload's exit status; log it.
        if let Err(e) = delete::remove(ctx, &mut container, true) {
            tracing::error!(id, error = %e, "failed to delete container after run");
        }
    }
    code.map_err(|source| RuncError::Wait { id, source })
}
