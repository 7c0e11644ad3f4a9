//! Secret resolution: a policy's declared grants turned into values for exactly one run.
//!
//! Owns reading each grant's source on the host (through a lookup the caller passes, so tests
//! need no process environment), failing closed when any grant cannot be resolved, and the
//! fingerprint shown instead of a value: an HMAC-SHA-256 keyed by a per-box key that never
//! enters the box, so a fingerprint cannot be checked against guesses by anyone without it.
//!
//! Must never: put a value in an error, a `Debug` output, a fingerprint's clear text, or any
//! file; the value lives in a [`ResolvedSecret`] for the length of one run.

use h5i_policy::{SecretGrant, SecretInject, SecretSource};
use sha2::{Digest, Sha256};

/// A grant that cannot be resolved. The run never starts.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// The source variable is unset or empty.
    #[error("refusing: secret `{name}` cannot be resolved: its source {source_desc} is not set on the host; to fix: export {var}=... in the shell that runs h5i (the value is injected for one run and never stored)")]
    Unresolved {
        /// The grant.
        name: String,
        /// `env:VAR`.
        source_desc: String,
        /// The variable to set.
        var: String,
    },
}

/// One secret, resolved for one run.
pub struct ResolvedSecret {
    /// The grant's name (also the variable the box sees for `inject = "env"`).
    pub name: String,
    /// How it reaches the box.
    pub inject: SecretInject,
    /// Where it came from (`env:VAR`), for display.
    pub source: String,
    value: String,
}

impl ResolvedSecret {
    /// The value, for injection only.
    pub fn value(&self) -> &str {
        &self.value
    }
}

impl std::fmt::Debug for ResolvedSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ResolvedSecret({}, {}, <redacted>)",
            self.name, self.source
        )
    }
}

/// How one grant resolves right now, for `h5i box secrets` (never the value).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretCheck {
    /// The grant's name.
    pub name: String,
    /// `env:VAR`.
    pub source: String,
    /// `env` or `file`.
    pub inject: &'static str,
    /// The fingerprint, when the source is set.
    pub fingerprint: Option<String>,
}

/// Resolve every grant, or refuse naming the first that cannot be.
pub fn resolve(
    grants: &[SecretGrant],
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<Vec<ResolvedSecret>, SecretError> {
    grants
        .iter()
        .map(|g| {
            let SecretSource::Env(var) = &g.source;
            match lookup(var).filter(|v| !v.is_empty()) {
                Some(value) => Ok(ResolvedSecret {
                    name: g.name.clone(),
                    inject: g.inject,
                    source: g.source.to_string(),
                    value,
                }),
                None => Err(SecretError::Unresolved {
                    name: g.name.clone(),
                    source_desc: g.source.to_string(),
                    var: var.clone(),
                }),
            }
        })
        .collect()
}

/// Dry-run every grant: what would resolve, and its fingerprint.
pub fn check(
    grants: &[SecretGrant],
    lookup: impl Fn(&str) -> Option<String>,
    box_key: &[u8],
) -> Vec<SecretCheck> {
    grants
        .iter()
        .map(|g| {
            let SecretSource::Env(var) = &g.source;
            SecretCheck {
                name: g.name.clone(),
                source: g.source.to_string(),
                inject: g.inject.as_str(),
                fingerprint: lookup(var)
                    .filter(|v| !v.is_empty())
                    .map(|v| fingerprint(box_key, &v)),
            }
        })
        .collect()
}

/// `hmac-sha256:<first 16 hex>` of `value` under `key`.
pub fn fingerprint(key: &[u8], value: &str) -> String {
    const BLOCK: usize = 64;
    let mut k = [0u8; BLOCK];
    if key.len() > BLOCK {
        k[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        k[..key.len()].copy_from_slice(key);
    }
    let mut inner = Sha256::new();
    inner.update(k.map(|b| b ^ 0x36));
    inner.update(value.as_bytes());
    let mut outer = Sha256::new();
    outer.update(k.map(|b| b ^ 0x5c));
    outer.update(inner.finalize());
    let mac = outer.finalize();
    let hex: String = mac.iter().take(8).map(|b| format!("{b:02x}")).collect();
    format!("hmac-sha256:{hex}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(name: &str) -> SecretGrant {
        SecretGrant {
            name: name.into(),
            source: SecretSource::default_for(name),
            inject: SecretInject::Env,
        }
    }

    #[test]
    fn every_grant_resolves_or_the_run_is_refused() {
        let grants = [grant("A"), grant("B")];
        let env = |k: &str| (k == "H5I_SECRET_A").then(|| "va".to_string());
        let err = resolve(&grants, env).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("`B`") && msg.contains("H5I_SECRET_B") && msg.contains("to fix:"));
        let all = |k: &str| Some(format!("value-of-{k}"));
        let ok = resolve(&grants, all).unwrap();
        assert_eq!(ok[1].value(), "value-of-H5I_SECRET_B");
        assert!(!format!("{:?}", ok[1]).contains("value-of"));
    }

    #[test]
    fn an_empty_value_does_not_count_as_resolved() {
        assert!(resolve(&[grant("E")], |_| Some(String::new())).is_err());
    }

    #[test]
    fn fingerprints_are_keyed_and_never_show_the_value() {
        let a = fingerprint(b"key-one", "s3cret-value");
        assert!(a.starts_with("hmac-sha256:") && a.len() == "hmac-sha256:".len() + 16);
        assert!(!a.contains("s3cret"));
        assert_eq!(a, fingerprint(b"key-one", "s3cret-value"));
        assert_ne!(a, fingerprint(b"key-two", "s3cret-value"));
        assert_ne!(a, fingerprint(b"key-one", "s3cret-valuf"));
    }

    #[test]
    fn hmac_matches_the_rfc_4231_vector() {
        // RFC 4231 test case 2: key "Jefe", data "what do ya want for nothing?".
        assert_eq!(
            fingerprint(b"Jefe", "what do ya want for nothing?"),
            "hmac-sha256:5bdcc146bf60754e"
        );
    }

    #[test]
    fn check_reports_fingerprints_and_gaps() {
        let grants = [grant("SET"), grant("UNSET")];
        let env = |k: &str| (k == "H5I_SECRET_SET").then(|| "x".to_string());
        let c = check(&grants, env, b"k");
        assert!(c[0].fingerprint.is_some());
        assert!(c[1].fingerprint.is_none());
    }
}
