//! Redaction at the boundary: secret values are scrubbed from anything h5i writes (receipts,
//! payloads, the export bundle) and the scrub is recorded by rule id, never by value.
//!
//! Owns the rule registry ([`BUILTIN_RULES`], reviewed data with a reason per entry) and the
//! matching. Must never: keep a value in a rule id, log a value, or report a match by echoing it.
//!
//! Guarded by the unit tests below and the export hostile-tree tests (`tests/export_gate.rs`).

/// A built-in pattern rule: a marker that only ever appears in credential material.
pub struct PatternRule {
    /// The id recorded when it fires.
    pub id: &'static str,
    /// Literal prefix that opens the sensitive block.
    pub opens: &'static str,
    /// Literal that closes the marker line.
    pub closes: &'static str,
    /// Why it is on the list.
    pub why: &'static str,
}

/// Markers redacted whatever the policy declares.
pub const BUILTIN_RULES: &[PatternRule] = &[PatternRule {
    id: "builtin:pem-private-key",
    opens: "-----BEGIN ",
    closes: "PRIVATE KEY-----",
    why: "a PEM private key (RSA, EC, OpenSSH, PKCS#8) is a credential wherever it appears",
}];

/// A secret value the redactor scrubs, with the id it is recorded under.
#[derive(Clone)]
pub struct SecretValue {
    rule_id: String,
    value: String,
}

impl SecretValue {
    /// A value to scrub, recorded as `rule_id` (e.g. `secret:DEPLOY_KEY`). Empty values match
    /// nothing and are dropped by [`Redactor::new`].
    pub fn new(rule_id: impl Into<String>, value: impl Into<String>) -> Self {
        SecretValue {
            rule_id: rule_id.into(),
            value: value.into(),
        }
    }
}

impl std::fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SecretValue({}, <redacted>)", self.rule_id)
    }
}

/// Scrubs declared secret values and built-in credential markers.
#[derive(Debug, Clone, Default)]
pub struct Redactor {
    secrets: Vec<SecretValue>,
}

impl Redactor {
    /// A redactor for these values (longest first, so a value containing another is scrubbed
    /// whole).
    pub fn new(mut secrets: Vec<SecretValue>) -> Self {
        secrets.retain(|s| !s.value.is_empty());
        secrets.sort_by_key(|s| std::cmp::Reverse(s.value.len()));
        Redactor { secrets }
    }

    /// The rule ids that match anywhere in `bytes` (sorted, deduplicated).
    pub fn matches(&self, bytes: &[u8]) -> Vec<String> {
        let mut ids: Vec<String> = self
            .secrets
            .iter()
            .filter(|s| contains(bytes, s.value.as_bytes()))
            .map(|s| s.rule_id.clone())
            .collect();
        for rule in BUILTIN_RULES {
            if find_marker(bytes, rule).is_some() {
                ids.push(rule.id.to_string());
            }
        }
        ids.sort();
        ids.dedup();
        ids
    }

    /// `text` with every match replaced by `[REDACTED:<rule id>]`, and the rule ids that fired.
    pub fn redact(&self, text: &str) -> (String, Vec<String>) {
        let mut out = text.to_string();
        let mut ids = Vec::new();
        for s in &self.secrets {
            if out.contains(&s.value) {
                out = out.replace(&s.value, &format!("[REDACTED:{}]", s.rule_id));
                ids.push(s.rule_id.clone());
            }
        }
        for rule in BUILTIN_RULES {
            while let Some((start, end)) = find_marker(out.as_bytes(), rule) {
                out.replace_range(start..end, &format!("[REDACTED:{}]", rule.id));
                ids.push(rule.id.to_string());
            }
        }
        ids.sort();
        ids.dedup();
        (out, ids)
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && hay.windows(needle.len()).any(|w| w == needle)
}

/// Byte range of a marker line (`opens` ... `closes` on one line), if any.
fn find_marker(hay: &[u8], rule: &PatternRule) -> Option<(usize, usize)> {
    let opens = rule.opens.as_bytes();
    let closes = rule.closes.as_bytes();
    let mut from = 0;
    while from + opens.len() <= hay.len() {
        let at = from + hay[from..].windows(opens.len()).position(|w| w == opens)?;
        let line_end = hay[at..]
            .iter()
            .position(|b| *b == b'\n')
            .map_or(hay.len(), |p| at + p);
        let line = &hay[at..line_end];
        if let Some(p) = line.windows(closes.len()).position(|w| w == closes) {
            return Some((at, at + p + closes.len()));
        }
        from = at + 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_declared_value_is_replaced_by_its_rule_id() {
        let r = Redactor::new(vec![SecretValue::new("secret:DEPLOY_KEY", "hunter2-abc")]);
        let (out, ids) = r.redact("curl -H 'x: hunter2-abc' hunter2-abc");
        assert!(!out.contains("hunter2-abc"));
        assert_eq!(out.matches("[REDACTED:secret:DEPLOY_KEY]").count(), 2);
        assert_eq!(ids, vec!["secret:DEPLOY_KEY".to_string()]);
    }

    #[test]
    fn the_longer_value_wins_when_one_contains_another() {
        let r = Redactor::new(vec![
            SecretValue::new("secret:A", "abc"),
            SecretValue::new("secret:B", "xxabcxx"),
        ]);
        let (out, ids) = r.redact("-xxabcxx-abc-");
        assert_eq!(out, "-[REDACTED:secret:B]-[REDACTED:secret:A]-");
        assert_eq!(ids, vec!["secret:A".to_string(), "secret:B".to_string()]);
    }

    #[test]
    fn a_pem_private_key_marker_is_scrubbed_without_a_declaration() {
        let r = Redactor::default();
        let text = "x\n-----BEGIN OPENSSH PRIVATE KEY-----\nAAAA\n";
        assert_eq!(r.matches(text.as_bytes()), vec!["builtin:pem-private-key"]);
        let (out, _) = r.redact(text);
        assert!(!out.contains("BEGIN OPENSSH PRIVATE KEY"));
        assert!(r.matches(b"-----BEGIN CERTIFICATE-----").is_empty());
    }

    #[test]
    fn debug_output_never_shows_a_value() {
        let s = SecretValue::new("secret:X", "topsecretvalue");
        assert!(!format!("{s:?}").contains("topsecretvalue"));
    }

    #[test]
    fn empty_values_match_nothing() {
        let r = Redactor::new(vec![SecretValue::new("secret:E", "")]);
        assert!(r.matches(b"anything").is_empty());
    }
}
