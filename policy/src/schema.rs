//! The raw shape of `.h5i/env.toml`, exactly as the manual writes it, as serde structs.
//!
//! Owns stage one of two-stage parsing: types and key names, with every table
//! `deny_unknown_fields` and every value [`Spanned`] so later checks can name the line. Also
//! turns a `toml` error into a [`PolicyError`] that names the file, line and key path. Must
//! never: judge values (that is `envfile.rs`), or accept a key the manual does not define.
//!
//! Guarded by the schema tests in `envfile.rs`.

use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;

use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;
use toml::de::{DeTable, DeValue};
use toml::Spanned;

use crate::error::{Location, PolicyError};

/// The whole file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawEnvFile {
    /// `[container] image = "..."`: the repo-level image.
    pub container: Option<Spanned<RawContainer>>,
    /// `[service.NAME]`.
    #[serde(default)]
    pub service: BTreeMap<Spanned<String>, Spanned<RawService>>,
    /// `[profile.NAME]`.
    #[serde(default)]
    pub profile: BTreeMap<Spanned<String>, Spanned<RawProfile>>,
}

/// `[container]` and `[profile.NAME.container]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawContainer {
    pub image: Spanned<String>,
    /// `"h5i-runc"` (the default) or `"host-default"`: the OCI runtime Podman runs.
    pub runtime: Option<Spanned<String>>,
}

/// `[service.NAME]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawService {
    pub command: Spanned<String>,
    pub port: Option<Spanned<i64>>,
}

/// `isolation = "..."`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum RawIsolation {
    Workspace,
    Process,
    Supervised,
    Container,
    Microvm,
    Auto,
}

/// `[profile.NAME]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawProfile {
    pub isolation: Option<Spanned<RawIsolation>>,
    pub secrets: Option<Spanned<Vec<Spanned<String>>>>,
    #[serde(default)]
    pub secret: BTreeMap<Spanned<String>, Spanned<RawSecret>>,
    pub fs: Option<Spanned<RawFs>>,
    pub net: Option<Spanned<RawNet>>,
    pub resources: Option<Spanned<RawResources>>,
    pub auth: Option<Spanned<Vec<Spanned<RawAuth>>>>,
    pub container: Option<Spanned<RawContainer>>,
}

/// `[profile.NAME.fs]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawFs {
    pub read: Option<Spanned<Vec<Spanned<String>>>>,
    pub write: Option<Spanned<Vec<Spanned<String>>>>,
    pub deny: Option<Spanned<Vec<Spanned<String>>>>,
}

/// `mode = "deny" | "host"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum RawNetMode {
    Deny,
    Host,
}

/// `[profile.NAME.net]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawNet {
    pub mode: Option<Spanned<RawNetMode>>,
    pub egress: Option<Spanned<Vec<Spanned<String>>>>,
    pub unix: Option<Spanned<bool>>,
    pub loopback: Option<Spanned<Vec<Spanned<i64>>>>,
    pub families: Option<Spanned<Vec<Spanned<String>>>>,
}

/// `mem = "4G"` or `mem = 4294967296`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RawMem {
    Text(String),
    Bytes(i64),
}

impl<'de> Deserialize<'de> for RawMem {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct MemVisitor;
        impl Visitor<'_> for MemVisitor {
            type Value = RawMem;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a size string like \"4G\" or an integer byte count")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<RawMem, E> {
                Ok(RawMem::Text(v.to_owned()))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<RawMem, E> {
                Ok(RawMem::Bytes(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<RawMem, E> {
                i64::try_from(v)
                    .map(RawMem::Bytes)
                    .map_err(|_| E::custom("memory size too large"))
            }
        }
        d.deserialize_any(MemVisitor)
    }
}

/// `[profile.NAME.resources]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawResources {
    pub mem: Option<Spanned<RawMem>>,
    pub procs: Option<Spanned<i64>>,
    pub wall: Option<Spanned<String>>,
}

/// `inject = "env" | "file"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum RawInject {
    Env,
    File,
}

/// `[profile.NAME.secret.SECRET]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSecret {
    pub source: Option<Spanned<String>>,
    pub inject: Option<Spanned<RawInject>>,
}

/// `[[profile.NAME.auth]]`: all four keys required (manual: `token_var` is required).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawAuth {
    pub host: Spanned<String>,
    pub credential_env: Spanned<String>,
    pub base_url_var: Spanned<String>,
    pub token_var: Spanned<String>,
}

/// 1-based line of byte offset `at` in `text`.
pub(crate) fn line_of(text: &str, at: usize) -> usize {
    let at = at.min(text.len());
    text.as_bytes()[..at]
        .iter()
        .filter(|b| **b == b'\n')
        .count()
        + 1
}

/// Turn a `toml` deserialization error into a refusal naming file, line and key path.
pub(crate) fn schema_error(file: &str, text: &str, err: &toml::de::Error) -> PolicyError {
    let span = err.span().unwrap_or(0..0);
    let line = line_of(text, span.start);
    let message = err.message().trim().to_owned();
    let Ok(doc) = DeTable::parse(text) else {
        return PolicyError::Syntax {
            at: Location {
                source: file.to_owned(),
                line: Some(line),
                key: None,
            },
            detail: message,
        };
    };
    let mut best: Option<(usize, usize, String)> = None;
    visit_table(doc.get_ref(), "", &span, &mut best);
    let mut key = best.map(|(_, _, p)| p).unwrap_or_default();
    let mend = if let Some(field) = backticked_after(&message, "missing field ") {
        key = join_key(&key, &field);
        format!("add `{field}` (the manual's schema requires it)")
    } else if message.starts_with("unknown field") {
        "remove the key or correct its spelling (the schema is the manual's, and nothing else)"
            .to_owned()
    } else if message.starts_with("unknown variant") {
        "use one of the values listed".to_owned()
    } else if message.starts_with("invalid type") {
        "write the value as the type named above".to_owned()
    } else {
        "correct the value to the shape the manual gives".to_owned()
    };
    let key = if key.is_empty() {
        "(top level)".to_owned()
    } else {
        key
    };
    PolicyError::Schema {
        at: Location::in_file(file, line, key),
        detail: message,
        mend,
    }
}

fn backticked_after(message: &str, prefix: &str) -> Option<String> {
    let rest = message.strip_prefix(prefix)?.strip_prefix('`')?;
    rest.split_once('`').map(|(f, _)| f.to_owned())
}

fn join_key(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_owned()
    } else {
        format!("{prefix}.{key}")
    }
}

/// Record `path` as the best match for `target` if `span` contains the target's start and is
/// the narrowest (deepest on ties) seen so far.
fn consider(
    span: Range<usize>,
    path: &str,
    target: &Range<usize>,
    best: &mut Option<(usize, usize, String)>,
) {
    let contains = span.start <= target.start
        && (target.start < span.end || (span.is_empty() && span.start == target.start));
    if !contains {
        return;
    }
    let width = span.end - span.start;
    let depth = path.len();
    let better = match best {
        None => true,
        Some((w, d, _)) => width < *w || (width == *w && depth > *d),
    };
    if better {
        *best = Some((width, depth, path.to_owned()));
    }
}

fn visit_table(
    table: &DeTable<'_>,
    prefix: &str,
    target: &Range<usize>,
    best: &mut Option<(usize, usize, String)>,
) {
    for (k, v) in table.iter() {
        let path = join_key(prefix, k.get_ref());
        consider(k.span(), &path, target, best);
        consider(v.span(), &path, target, best);
        visit_value(v.get_ref(), &path, target, best);
    }
}

fn visit_value(
    value: &DeValue<'_>,
    path: &str,
    target: &Range<usize>,
    best: &mut Option<(usize, usize, String)>,
) {
    match value {
        DeValue::Table(t) => visit_table(t, path, target, best),
        DeValue::Array(a) => {
            for (i, e) in a.iter().enumerate() {
                // Tables in an array are named by index; scalars by the array's key.
                let elem_path = if e.get_ref().is_table() {
                    format!("{path}[{i}]")
                } else {
                    path.to_owned()
                };
                consider(e.span(), &elem_path, target, best);
                visit_value(e.get_ref(), &elem_path, target, best);
            }
        }
        _ => {}
    }
}
