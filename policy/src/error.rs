//! Policy errors: every way a request or an `.h5i/env.toml` is refused.
//!
//! Owns [`PolicyError`] and [`Location`]. Every message has the form
//! `refusing: <what>; to fix: <mend>`, and names the file, the 1-based line and the key path
//! whenever the refusal comes from a file. Must never: carry a secret value, or suggest a mend
//! that weakens a tier silently (the mends name the explicit flag or key to change).
//!
//! Guarded by the `*_is_refused*` tests in `envfile.rs`, `resolve.rs` and `resolved.rs`, which
//! check the variant and that the message names the file, line, key and mend.

use std::fmt;

use crate::tier::Tier;

/// Where in a policy source something was written.
///
/// `source` is the file path as the caller named it (for example `.h5i/env.toml`), or a label
/// such as ``built-in profile `agent-claude` `` for built-in data that has no file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    /// The file (or built-in label) the value came from.
    pub source: String,
    /// 1-based line, when the source is a file.
    pub line: Option<usize>,
    /// Dotted key path, e.g. `profile.review.net.mode`; `None` for a pure syntax error.
    pub key: Option<String>,
}

impl Location {
    /// A position in a file.
    pub fn in_file(source: &str, line: usize, key: impl Into<String>) -> Self {
        Location {
            source: source.to_owned(),
            line: Some(line),
            key: Some(key.into()),
        }
    }

    /// A key of a built-in profile (no file, no line).
    pub fn builtin(profile: &str, key: impl Into<String>) -> Self {
        Location {
            source: format!("built-in profile `{profile}`"),
            line: None,
            key: Some(key.into()),
        }
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        if let Some(key) = &self.key {
            write!(f, ": `{key}`")?;
        }
        Ok(())
    }
}

/// Everything resolution can refuse. Each message says what was refused and how to mend it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// The file is not valid TOML.
    #[error(
        "refusing: {at}: not valid TOML: {detail}; to fix: correct the TOML syntax on that line"
    )]
    Syntax {
        /// Where the parser stopped.
        at: Location,
        /// The parser's own description.
        detail: String,
    },

    /// A key the schema does not have, a value of the wrong type, or a required key missing.
    #[error("refusing: {at}: {detail}; to fix: {mend}")]
    Schema {
        /// The offending key.
        at: Location,
        /// What the schema check found.
        detail: String,
        /// How to mend it.
        mend: String,
    },

    /// A value of the right type that is malformed (a bad host, path, size, duration, name).
    #[error("refusing: {at}: {what}; to fix: {mend}")]
    InvalidValue {
        /// The offending key.
        at: Location,
        /// What is wrong with the value.
        what: String,
        /// How to mend it.
        mend: String,
    },

    /// Two well-formed values that cannot both hold.
    #[error("refusing: {at}: {what}; to fix: {mend}")]
    Contradiction {
        /// The key that cannot hold given the other.
        at: Location,
        /// The contradiction, naming both sides.
        what: String,
        /// How to mend it.
        mend: String,
    },

    /// The requested profile is neither built in nor declared in the env file.
    #[error("refusing: no profile named `{name}` (known: {known}); to fix: {mend}")]
    UnknownProfile {
        /// The name asked for.
        name: String,
        /// The profiles that do exist, comma-separated.
        known: String,
        /// How to mend it.
        mend: String,
    },

    /// A profile scoped to `$H5I_AGENT`'s runtime was asked for without a usable `H5I_AGENT`.
    #[error(
        "refusing: profile `{profile}` is scoped to the runtime named by H5I_AGENT, which is {value}; \
         to fix: set H5I_AGENT=claude or H5I_AGENT=codex, or pick --profile agent-claude / agent-codex"
    )]
    AgentRuntime {
        /// The profile asked for.
        profile: String,
        /// `unset`, or the unusable value quoted.
        value: String,
    },

    /// A flag or environment variable value that is not one of the accepted values.
    #[error("refusing: {input}: {what}; to fix: {mend}")]
    BadRequest {
        /// The flag or variable, e.g. `--isolation` or `H5I_DEFAULT_ISOLATION`.
        input: String,
        /// What is wrong with its value.
        what: String,
        /// How to mend it.
        mend: String,
    },

    /// An explicitly requested tier that this host cannot run. Never degraded.
    #[error(
        "refusing: isolation `{tier}` (asked for by {requested_by}) cannot run on this host: {reason}; \
         to fix: make the host able to run it (see `h5i box probe`), or ask for another tier \
         explicitly with --isolation (h5i never degrades silently)"
    )]
    TierUnavailable {
        /// The tier asked for.
        tier: Tier,
        /// Who asked: `--isolation`, `H5I_DEFAULT_ISOLATION`, or the profile key's location.
        requested_by: String,
        /// The host probe's reason.
        reason: String,
    },

    /// An explicitly requested tier that cannot hold what the policy asks for.
    #[error("refusing: {at}: {what}, but isolation `{tier}` was asked for by {requested_by}; to fix: {mend}")]
    TierCannotHoldPolicy {
        /// The tier asked for.
        tier: Tier,
        /// Who asked.
        requested_by: String,
        /// The policy key the tier cannot hold (boxed: this variant carries the most).
        at: Box<Location>,
        /// What the policy asks for.
        what: String,
        /// How to mend it.
        mend: String,
    },

    /// `auto` found no tier that both runs here and holds the policy.
    #[error(
        "refusing: no isolation tier on this host can hold profile `{profile}` ({tried}); \
         to fix: mend one of the reasons above, or pass --isolation workspace to run unconfined on purpose"
    )]
    NoTierAvailable {
        /// The profile being resolved.
        profile: String,
        /// Each tier and why it was passed over, `; `-separated.
        tried: String,
    },

    /// `container` / `microvm` chosen explicitly with no image from any source.
    #[error(
        "refusing: isolation `{tier}` (asked for by {requested_by}) runs an image, and none was given; \
         to fix: pass --image <img>, or set `profile.{profile}.container.image` or `[container] image` \
         in .h5i/env.toml (pre-pulled; runs never pull)"
    )]
    ImageRequired {
        /// The tier asked for.
        tier: Tier,
        /// Who asked.
        requested_by: String,
        /// The profile being resolved.
        profile: String,
    },

    /// A stored `policy.resolved.toml` that does not match its digest, or does not parse.
    #[error(
        "refusing: the stored policy was tampered with or damaged ({what}); it is refused, never repaired; \
         to fix: `h5i box rm <name>` and create the box again"
    )]
    Tampered {
        /// What did not match.
        what: String,
    },
}

impl PolicyError {
    /// The location the error points at, when it comes from a file or built-in profile key.
    pub fn location(&self) -> Option<&Location> {
        match self {
            PolicyError::Syntax { at, .. }
            | PolicyError::Schema { at, .. }
            | PolicyError::InvalidValue { at, .. }
            | PolicyError::Contradiction { at, .. } => Some(at),
            PolicyError::TierCannotHoldPolicy { at, .. } => Some(at),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn location_names_file_line_and_key() {
        let l = Location::in_file(".h5i/env.toml", 7, "profile.review.net.mode");
        assert_eq!(l.to_string(), ".h5i/env.toml:7: `profile.review.net.mode`");
        let b = Location::builtin("agent-claude", "net.egress");
        assert_eq!(
            b.to_string(),
            "built-in profile `agent-claude`: `net.egress`"
        );
    }

    #[test]
    fn every_message_has_the_refusing_and_to_fix_form() {
        let e = PolicyError::Tampered { what: "x".into() };
        let m = e.to_string();
        assert!(m.starts_with("refusing: "), "{m}");
        assert!(m.contains("; to fix: "), "{m}");
    }
}
