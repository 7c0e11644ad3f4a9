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

/// The encodings a declared value is also looked for in, besides its literal bytes: the ones an
/// agent reaches for first to carry a value past a literal match. Reviewed data: a match under
/// one is recorded as `<rule id>/<name>` (never the value). A value transformed any other way
/// (split, compressed, encrypted, encoded twice, base64 wrapped across lines) is not detected.
pub const ENCODINGS: &[Encoding] = &[
    Encoding {
        name: "base64@0",
        encode: |v| base64_core(v, 0, B64),
        why: "base64 of bytes where the value starts at an offset that is 0 mod 3 (`base64 file`)",
    },
    Encoding {
        name: "base64@1",
        encode: |v| base64_core(v, 1, B64),
        why: "base64 of bytes where the value starts 1 mod 3 in: its characters differ entirely",
    },
    Encoding {
        name: "base64@2",
        encode: |v| base64_core(v, 2, B64),
        why: "base64 of bytes where the value starts 2 mod 3 in",
    },
    Encoding {
        name: "base64url@0",
        encode: |v| base64_core(v, 0, B64URL),
        why: "the URL- and filename-safe alphabet (`-_` for `+/`), each alignment",
    },
    Encoding {
        name: "base64url@1",
        encode: |v| base64_core(v, 1, B64URL),
        why: "as base64url@0, value 1 mod 3 in",
    },
    Encoding {
        name: "base64url@2",
        encode: |v| base64_core(v, 2, B64URL),
        why: "as base64url@0, value 2 mod 3 in",
    },
    Encoding {
        name: "hex",
        encode: |v| hex(v, LOWER),
        why: "lower-case hex of the bytes (`xxd -p`, `od`, most languages' hex())",
    },
    Encoding {
        name: "HEX",
        encode: |v| hex(v, UPPER),
        why: "upper-case hex of the bytes",
    },
    Encoding {
        name: "url",
        encode: |v| percent(v, UPPER),
        why: "percent-encoding of every byte outside RFC 3986's unreserved set, upper-case hex",
    },
    Encoding {
        name: "url-lower",
        encode: |v| percent(v, LOWER),
        why: "the same with lower-case hex, which decoders accept too",
    },
    Encoding {
        name: "reversed",
        encode: |v| v.iter().rev().copied().collect(),
        why: "the value's bytes in reverse order (`rev`)",
    },
];

/// One entry of [`ENCODINGS`].
pub struct Encoding {
    /// The suffix recorded after the value's rule id.
    pub name: &'static str,
    /// The form of a value it looks for.
    pub encode: fn(&[u8]) -> Vec<u8>,
    /// Why it is on the list.
    pub why: &'static str,
}

/// Encoded forms shorter than this are not looked for: they would match ordinary text.
const MIN_ENCODED_LEN: usize = 6;

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
const B64URL: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
const LOWER: &[u8; 16] = b"0123456789abcdef";
const UPPER: &[u8; 16] = b"0123456789ABCDEF";

/// The base64 characters that depend only on `value` when it sits `offset` (0, 1 or 2) bytes
/// into a 3-byte group: the characters covering earlier or later bytes are dropped, so the
/// result is found wherever the value was embedded in a stream at that alignment.
fn base64_core(value: &[u8], offset: usize, alphabet: &[u8; 64]) -> Vec<u8> {
    let mut bytes = vec![0u8; offset];
    bytes.extend_from_slice(value);
    let bits = bytes.len() * 8;
    let mut chars = Vec::with_capacity(bits / 6 + 1);
    for i in 0..bits / 6 {
        let mut v = 0u8;
        for b in 0..6 {
            let bit = i * 6 + b;
            let set = bytes[bit / 8] >> (7 - bit % 8) & 1;
            v = v << 1 | set;
        }
        chars.push(alphabet[usize::from(v)]);
    }
    let start = (offset * 8).div_ceil(6);
    chars.get(start..).map(<[u8]>::to_vec).unwrap_or_default()
}

fn hex(value: &[u8], digits: &[u8; 16]) -> Vec<u8> {
    let mut out = Vec::with_capacity(value.len() * 2);
    for b in value {
        out.push(digits[usize::from(b >> 4)]);
        out.push(digits[usize::from(b & 0xf)]);
    }
    out
}

fn percent(value: &[u8], digits: &[u8; 16]) -> Vec<u8> {
    let mut out = Vec::with_capacity(value.len() * 3);
    for b in value {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(*b);
        } else {
            out.push(b'%');
            out.push(digits[usize::from(b >> 4)]);
            out.push(digits[usize::from(b & 0xf)]);
        }
    }
    out
}

/// Every form of `value` the redactor looks for: the literal (suffix `None`), then each
/// [`ENCODINGS`] entry that differs from every form before it and is long enough to be telling
/// (the reversed form is as telling as the literal, whatever its length).
fn forms(value: &[u8]) -> Vec<(Option<&'static str>, Vec<u8>)> {
    let mut out: Vec<(Option<&'static str>, Vec<u8>)> = vec![(None, value.to_vec())];
    for enc in ENCODINGS {
        let form = (enc.encode)(value);
        let telling = form.len() >= MIN_ENCODED_LEN || enc.name == "reversed";
        if form.is_empty() || !telling || out.iter().any(|(_, f)| *f == form) {
            continue;
        }
        out.push((Some(enc.name), form));
    }
    out
}

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

/// One form of a declared value: what is looked for, and the rule id recorded when it is found.
#[derive(Clone)]
struct Needle {
    rule_id: String,
    bytes: Vec<u8>,
}

/// Scrubs declared secret values (and their [`ENCODINGS`]) and built-in credential markers.
#[derive(Clone, Default)]
pub struct Redactor {
    needles: Vec<Needle>,
}

impl std::fmt::Debug for Redactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ids: Vec<&str> = self.needles.iter().map(|n| n.rule_id.as_str()).collect();
        write!(f, "Redactor({ids:?})")
    }
}

impl Redactor {
    /// A redactor for these values and their encoded forms (longest first, so a value
    /// containing another is scrubbed whole). The literal is recorded under the value's rule
    /// id, an encoded form under `<rule id>/<encoding>`.
    pub fn new(secrets: Vec<SecretValue>) -> Self {
        let mut needles = Vec::new();
        for s in secrets.iter().filter(|s| !s.value.is_empty()) {
            for (enc, bytes) in forms(s.value.as_bytes()) {
                let rule_id = match enc {
                    None => s.rule_id.clone(),
                    Some(e) => format!("{}/{e}", s.rule_id),
                };
                needles.push(Needle { rule_id, bytes });
            }
        }
        needles.sort_by_key(|n| std::cmp::Reverse(n.bytes.len()));
        Redactor { needles }
    }

    /// The rule ids that match anywhere in `bytes` (sorted, deduplicated).
    pub fn matches(&self, bytes: &[u8]) -> Vec<String> {
        let mut ids: Vec<String> = self
            .needles
            .iter()
            .filter(|n| contains(bytes, &n.bytes))
            .map(|n| n.rule_id.clone())
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
        for n in &self.needles {
            // A form that is not UTF-8 (a reversed multi-byte value) cannot be in a `str`.
            let Ok(form) = std::str::from_utf8(&n.bytes) else {
                continue;
            };
            if out.contains(form) {
                out = out.replace(form, &format!("[REDACTED:{}]", n.rule_id));
                ids.push(n.rule_id.clone());
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

/// The shortest start of a value [`Redactor::redact_cut`] scrubs at the end of a cut text: a
/// shorter one says next to nothing of the value, and would match ordinary text.
pub const CUT_TAIL_MIN: usize = 4;

/// The longest a part of a value must be for [`Redactor::redact_parts`] to scrub it wherever it
/// stands (a value shorter than twice this needs half its length).
pub const PART_MIN: usize = 16;

/// The shortest part of a value of `len` bytes [`Redactor::redact_parts`] scrubs: half of it,
/// at least [`CUT_TAIL_MIN`] and at most [`PART_MIN`] bytes.
fn part_min(len: usize) -> usize {
    (len / 2).clamp(CUT_TAIL_MIN, PART_MIN)
}

/// Where in `hay` a proper start of `needle` stands, at least `min` bytes of it (each the
/// longest at its place; the ranges do not overlap).
fn starts_of(hay: &[u8], needle: &[u8], min: usize) -> Vec<(usize, usize)> {
    let mut found = Vec::new();
    let mut i = 0;
    while i < hay.len() {
        let n = hay[i..]
            .iter()
            .zip(needle)
            .take_while(|(a, b)| a == b)
            .count();
        if n >= min && n < needle.len() {
            found.push((i, i + n));
            i += n;
        } else {
            i += 1;
        }
    }
    found
}

impl Redactor {
    /// [`Redactor::redact`] for text an agent or its tools may have cut anywhere (a tool's
    /// output shown only up to a limit, a preview of a longer one): whole values are scrubbed
    /// first, then every part of a value that is its start or its end, at least half of it and
    /// at least [`CUT_TAIL_MIN`] bytes (never more than [`PART_MIN`] needed), recorded as
    /// `<rule id>/part`. A part from the middle of a value, or a shorter one, is not found.
    pub fn redact_parts(&self, text: &str) -> (String, Vec<String>) {
        let (mut out, mut ids) = self.redact(text);
        // Candidates from every form, longest first; each kept unless it overlaps one kept.
        let mut parts: Vec<(usize, usize, &str)> = Vec::new();
        for n in &self.needles {
            let min = part_min(n.bytes.len());
            let hay = out.as_bytes();
            parts.extend(
                starts_of(hay, &n.bytes, min)
                    .into_iter()
                    .map(|(a, b)| (a, b, n.rule_id.as_str())),
            );
            let rev_hay: Vec<u8> = hay.iter().rev().copied().collect();
            let rev_needle: Vec<u8> = n.bytes.iter().rev().copied().collect();
            parts.extend(
                starts_of(&rev_hay, &rev_needle, min)
                    .into_iter()
                    .map(|(a, b)| (hay.len() - b, hay.len() - a, n.rule_id.as_str())),
            );
        }
        parts.sort_by_key(|(a, b, _)| (std::cmp::Reverse(b - a), *a));
        let mut kept: Vec<(usize, usize, &str)> = Vec::new();
        for p in parts {
            let free = kept.iter().all(|k| p.1 <= k.0 || p.0 >= k.1);
            if free && out.is_char_boundary(p.0) && out.is_char_boundary(p.1) {
                kept.push(p);
            }
        }
        kept.sort_by_key(|k| std::cmp::Reverse(k.0));
        let mut fired = Vec::new();
        for (a, b, id) in &kept {
            fired.push(format!("{id}/part"));
            out.replace_range(*a..*b, &format!("[REDACTED:{id}/part]"));
        }
        ids.extend(fired);
        ids.sort();
        ids.dedup();
        (out, ids)
    }

    /// [`Redactor::redact_parts`] for a text that was cut short at its end (a capture's bounded
    /// head): a cut through a value leaves its start, so a tail that is the start of a value (at
    /// least [`CUT_TAIL_MIN`] bytes of it, the longest such tail) is scrubbed too, recorded as
    /// `<rule id>/cut`.
    pub fn redact_cut(&self, text: &str) -> (String, Vec<String>) {
        let (mut out, mut ids) = self.redact_parts(text);
        let mut longest: Option<(usize, &Needle)> = None;
        for n in &self.needles {
            let most = n.bytes.len().saturating_sub(1).min(out.len());
            let found = (CUT_TAIL_MIN..=most)
                .rev()
                .find(|k| out.as_bytes()[out.len() - k..] == n.bytes[..*k]);
            if let Some(k) = found {
                if longest.is_none_or(|(l, _)| k > l) && out.is_char_boundary(out.len() - k) {
                    longest = Some((k, n));
                }
            }
        }
        if let Some((k, n)) = longest {
            let from = out.len() - k;
            out.replace_range(from.., &format!("[REDACTED:{}/cut]", n.rule_id));
            ids.push(format!("{}/cut", n.rule_id));
            ids.sort();
            ids.dedup();
        }
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

    /// `secret` embedded at each offset of a stream, base64-encoded whole.
    fn embedded_b64(secret: &[u8], offset: usize, alphabet: &[u8; 64]) -> Vec<u8> {
        let mut stream = b"xyz".to_vec();
        stream.truncate(offset);
        stream.extend_from_slice(secret);
        stream.extend_from_slice(b"-trailing-bytes");
        let mut out = Vec::new();
        for chunk in stream.chunks(3) {
            let mut b = [0u8; 3];
            b[..chunk.len()].copy_from_slice(chunk);
            let n = u32::from(b[0]) << 16 | u32::from(b[1]) << 8 | u32::from(b[2]);
            for i in 0..=chunk.len() {
                out.push(alphabet[((n >> (18 - 6 * i)) & 63) as usize]);
            }
        }
        out
    }

    #[test]
    fn each_encoding_is_caught_and_named() {
        let secret = "s3cr3t+/value?&=with spaces";
        let r = Redactor::new(vec![SecretValue::new("secret:K", secret)]);
        let mut cases: Vec<(String, Vec<u8>)> = Vec::new();
        for off in 0..3 {
            cases.push((
                format!("secret:K/base64@{off}"),
                embedded_b64(secret.as_bytes(), off, B64),
            ));
            cases.push((
                format!("secret:K/base64url@{off}"),
                embedded_b64(secret.as_bytes(), off, B64URL),
            ));
        }
        cases.push(("secret:K/hex".into(), hex(secret.as_bytes(), LOWER)));
        cases.push(("secret:K/HEX".into(), hex(secret.as_bytes(), UPPER)));
        cases.push(("secret:K/url".into(), percent(secret.as_bytes(), UPPER)));
        cases.push((
            "secret:K/url-lower".into(),
            percent(secret.as_bytes(), LOWER),
        ));
        cases.push(("secret:K/reversed".into(), secret.bytes().rev().collect()));
        for (rule, encoded) in cases {
            let mut hay = b"prefix ".to_vec();
            hay.extend_from_slice(&encoded);
            hay.extend_from_slice(b" suffix\n");
            let ids = r.matches(&hay);
            // Where the URL-safe alphabet changes no character, the form is base64's own.
            let rule = if ids.contains(&rule) {
                rule
            } else {
                rule.replace("base64url", "base64")
            };
            assert!(ids.contains(&rule), "{rule} not in {ids:?}");
            assert!(!ids.contains(&"secret:K".to_string()), "{rule}: literal?");
            let (out, fired) = r.redact(&String::from_utf8(hay).unwrap());
            assert!(fired.contains(&rule), "{rule} did not redact: {out}");
            assert!(r.matches(out.as_bytes()).is_empty(), "{rule} left: {out}");
        }
    }

    #[test]
    fn a_text_cut_through_a_value_loses_the_values_start_too() {
        let secret = "h5i-dummy-0123456789abcdef";
        let r = Redactor::new(vec![SecretValue::new("credential-dummy:K", secret)]);
        // (A longer start, half the value or more, is a part wherever it stands: `/part`.)
        for cut in [CUT_TAIL_MIN, part_min(secret.len()) - 1] {
            let text = format!("{secret} and then {}", &secret[..cut]);
            let (out, ids) = r.redact_cut(&text);
            assert_eq!(
                out, "[REDACTED:credential-dummy:K] and then [REDACTED:credential-dummy:K/cut]",
                "{cut}"
            );
            assert_eq!(ids, ["credential-dummy:K", "credential-dummy:K/cut"]);
            // `redact` alone leaves the start behind: that is what the cut variant is for.
            assert!(r.redact(&text).0.ends_with(&secret[..cut]));
        }
        // The start of an encoded form is scrubbed the same way.
        let hex = hex(secret.as_bytes(), LOWER);
        let (out, ids) = r.redact_cut(&format!("x {}", std::str::from_utf8(&hex[..10]).unwrap()));
        assert_eq!(out, "x [REDACTED:credential-dummy:K/hex/cut]");
        assert_eq!(ids, ["credential-dummy:K/hex/cut"]);
        // Fewer bytes than the minimum, or a text not ending in a value's start, is left alone.
        let short = &secret[..CUT_TAIL_MIN - 1];
        assert_eq!(r.redact_cut(&format!("x {short}")).0, format!("x {short}"));
        assert_eq!(r.redact_cut("nothing secret").0, "nothing secret");
    }

    #[test]
    fn a_values_start_or_end_standing_alone_is_scrubbed_and_a_short_one_is_not() {
        let secret = "h5i-dummy-0123456789abcdef0123456789abcdef";
        let r = Redactor::new(vec![SecretValue::new("credential-dummy:K", secret)]);
        // A tool's preview that stops 30 bytes into a value, inside JSON; a middle-cut output
        // whose second part starts 20 bytes before a value's end.
        let text = format!(
            "{{\"stdout\":\"{secret}{}\",\"more\":\"...{}\"}}",
            &secret[..30],
            &secret[secret.len() - 20..]
        );
        let (out, ids) = r.redact_parts(&text);
        assert_eq!(
            out,
            "{\"stdout\":\"[REDACTED:credential-dummy:K][REDACTED:credential-dummy:K/part]\",\"more\":\"...[REDACTED:credential-dummy:K/part]\"}"
        );
        assert_eq!(ids, ["credential-dummy:K", "credential-dummy:K/part"]);
        // Fewer than PART_MIN bytes of a long value's start, or text that is none of it, stay.
        let short = format!("x {} y", &secret[..PART_MIN - 1]);
        assert_eq!(r.redact_parts(&short).0, short);
        assert_eq!(r.redact_parts("plain text").0, "plain text");
    }

    #[test]
    fn short_encoded_forms_that_would_match_ordinary_text_are_not_looked_for() {
        let r = Redactor::new(vec![SecretValue::new("secret:S", "ab")]);
        assert!(r.matches(b"plain words, no secret").is_empty());
        assert_eq!(r.matches(b"xx ba xx"), vec!["secret:S/reversed"]);
    }
}
