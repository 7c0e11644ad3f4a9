//! h5i-log: the one tracing subscriber every h5i binary installs (`h5i`, `h5i-hook` and the
//! sentry it starts, `h5i-runc`), and the debug events they all emit the same way.
//!
//! Owns:
//! - the filter: `H5I_LOG`, else `RUST_LOG`, parsed as `tracing_subscriber::filter::Targets`
//!   directives (`debug`, `h5i::spawn=debug`, `h5i_runtime=trace,warn`); unset or empty means
//!   no subscriber, so a command prints nothing it would not print anyway ([`filter`]);
//! - the subscriber: plain text on stderr ([`init`]); `h5i-runc` takes the same [`filter`] and
//!   keeps runc's record format, which Podman and conmon read back;
//! - the events: [`spawned`] for every process h5i starts (target `h5i::spawn`) and [`refused`]
//!   for every refusal a binary ends with (target `h5i::refusal`);
//! - what a hook needs to see the same filter ([`passed_env`]): a runtime runs hooks with only
//!   the variables their spec names.
//!
//! Must never: write anywhere but stderr, fail a command because its filter is malformed (the
//! variable is named on stderr once and ignored), or record a process's environment (argv
//! only: by h5i's invariant no secret is ever in an argv).
//!
//! Guarded by `tests/log.rs` (`H5I_LOG=debug h5i box run ...` shows the spawn events, unset
//! shows nothing extra) and the unit tests below.

use std::process::Command;
use std::str::FromStr;

use tracing_subscriber::filter::Targets;

/// The variable h5i reads its filter from.
pub const VAR: &str = "H5I_LOG";
/// The variable read when [`VAR`] is unset or empty.
pub const FALLBACK: &str = "RUST_LOG";

/// The filter's directives and the variable they came from, or `None` when neither is set.
pub fn directives() -> Option<(&'static str, String)> {
    [VAR, FALLBACK].into_iter().find_map(|var| {
        std::env::var(var)
            .ok()
            .filter(|v| !v.trim().is_empty())
            .map(|v| (var, v))
    })
}

/// Parse `text` as the filter's directives.
pub fn parse(text: &str) -> Result<Targets, String> {
    Targets::from_str(text.trim()).map_err(|e| e.to_string())
}

/// The filter in force: `Ok(None)` when neither variable is set; `Err` names the variable and
/// why its value is not a filter.
pub fn filter() -> Result<Option<Targets>, String> {
    let Some((var, text)) = directives() else {
        return Ok(None);
    };
    parse(&text)
        .map(Some)
        .map_err(|e| format!("ignoring {var}={text:?}: {e} (directives look like `debug` or `h5i::spawn=debug,warn`)"))
}

/// Install the subscriber for `binary` (its name leads a malformed filter's warning): plain
/// text on stderr, filtered by [`filter`]. Nothing is installed when no filter is set.
pub fn init(binary: &str) {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    match filter() {
        Ok(Some(targets)) => {
            let layer = tracing_subscriber::fmt::layer()
                .with_ansi(false)
                .with_writer(std::io::stderr);
            // A second init (a unit test) keeps the first subscriber.
            let _ = tracing_subscriber::registry()
                .with(layer)
                .with(targets)
                .try_init();
        }
        Ok(None) => {}
        Err(msg) => eprintln!("{binary}: {msg}"),
    }
}

/// The variables that carry the filter into a process started with a cleared environment (an
/// OCI hook): `H5I_LOG=...` when a filter is set and parses (a malformed one was named once by
/// the binary that read it), else nothing.
pub fn passed_env() -> Vec<String> {
    match (directives(), filter()) {
        (Some((_, text)), Ok(Some(_))) => vec![format!("{VAR}={text}")],
        _ => Vec::new(),
    }
}

/// The debug event for a process h5i starts: its program and arguments, and its pid when the
/// caller has one (a `status()`/`output()` call has none to give).
pub fn spawned(cmd: &Command, pid: Option<u32>) {
    if !tracing::enabled!(target: "h5i::spawn", tracing::Level::DEBUG) {
        return;
    }
    let args: Vec<String> = cmd
        .get_args()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    event(&cmd.get_program().to_string_lossy(), &args, pid, "host");
}

/// The debug event for a box's command started by something other than a `Command` of h5i's:
/// the box's warm sandbox (its init forks it; h5i learns the pid from the init's answer),
/// h5i-runc's executor, just before it execs the payload, or a microvm's guest agent, which h5i
/// hands the command to (no host pid: `pid` is None). `by` says which.
pub fn spawned_argv(argv: &[String], pid: Option<u32>, by: &'static str) {
    let (program, args) = argv
        .split_first()
        .map_or(("", &[][..]), |(p, a)| (p.as_str(), a));
    event(program, args, pid, by);
}

/// The one spawn event: `place` says who started it (h5i on the host, the box's sandbox, or
/// h5i-runc).
fn event(program: &str, args: &[String], pid: Option<u32>, place: &'static str) {
    tracing::debug!(target: "h5i::spawn", program, ?args, pid, by = place, "spawned");
}

/// [`spawned`] in a builder chain: `cmd.args(..).traced().output()`.
pub trait Traced {
    /// Emit the spawn event for this command (no pid: the call that starts it comes next).
    fn traced(&mut self) -> &mut Self;
}

impl Traced for Command {
    fn traced(&mut self) -> &mut Command {
        spawned(self, None);
        self
    }
}

/// The debug event for a refusal a binary ends with: its message and its typed form.
pub fn refused(err: &(dyn std::error::Error + 'static)) {
    let mut chain = Vec::new();
    let mut source = err.source();
    while let Some(s) = source {
        chain.push(s.to_string());
        source = s.source();
    }
    tracing::debug!(target: "h5i::refusal", error = %err, detail = ?err, ?chain, "refused");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directives_parse_as_targets_and_garbage_is_refused() {
        for good in [
            "debug",
            "h5i::spawn=debug",
            "h5i_runtime=trace,warn",
            " info ",
        ] {
            assert!(parse(good).is_ok(), "{good}");
        }
        for bad in ["h5i=loud", "debug=verbose"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_spawn_target_is_enabled_by_a_bare_level_and_by_its_own_name() {
        use tracing::Level;
        for (text, on) in [
            ("debug", true),
            ("h5i::spawn=debug", true),
            ("h5i=debug", true),
            ("info", false),
            ("h5i_runtime=debug", false),
        ] {
            assert_eq!(
                parse(text)
                    .unwrap()
                    .would_enable("h5i::spawn", &Level::DEBUG),
                on,
                "{text}"
            );
        }
    }
}
