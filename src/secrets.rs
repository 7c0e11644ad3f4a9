//! The host-side values a box's policy makes secret, gathered for redaction.
//!
//! Owns turning a policy's declared secret grants and credential grants into a
//! [`Redactor`](h5i_broker::redact::Redactor) loaded with the values as the host holds them now.
//! Must never: return or print a value; only the redactor holds them.

use h5i_broker::redact::{Redactor, SecretValue};
use h5i_policy::ResolvedPolicy;

/// A redactor for everything this policy treats as secret, with values read from the host's
/// environment (a grant whose source is unset has nothing to scrub).
pub fn redactor_for(policy: &ResolvedPolicy) -> Redactor {
    let mut values = Vec::new();
    for grant in &policy.secrets {
        let h5i_policy::SecretSource::Env(var) = &grant.source;
        if let Ok(v) = std::env::var(var) {
            values.push(SecretValue::new(format!("secret:{}", grant.name), v));
        }
    }
    for auth in &policy.auth {
        if let Ok(v) = std::env::var(&auth.credential_env) {
            values.push(SecretValue::new(
                format!("credential:{}", auth.credential_env),
                v,
            ));
        }
    }
    Redactor::new(values)
}
