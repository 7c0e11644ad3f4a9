//! `kill`: send a signal to a container's init (or, with `--all`, to every process in its
//! cgroup).

use libcontainer::signal::Signal;

use super::{Context, RuncError};

/// Parse a signal the way runc accepts it: `TERM`, `SIGTERM` or `15`.
pub fn parse_signal(s: &str) -> Result<Signal, RuncError> {
    Signal::try_from(s).map_err(|_| RuncError::Signal(s.to_string()))
}

/// Signal container `id`.
pub fn kill(ctx: &Context, id: &str, signal: &str, all: bool) -> Result<(), RuncError> {
    let signal = parse_signal(signal)?;
    let mut container = ctx.load(id)?;
    container
        .kill(signal, all)
        .map_err(RuncError::container(id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signal_spellings() {
        for ok in ["TERM", "SIGTERM", "15", "kill", "9", "SIGUSR1"] {
            assert!(parse_signal(ok).is_ok(), "{ok}");
        }
        for bad in ["", "SIGFOO", "0", "99"] {
            assert!(
                matches!(parse_signal(bad), Err(RuncError::Signal(_))),
                "{bad}"
            );
        }
    }
}
