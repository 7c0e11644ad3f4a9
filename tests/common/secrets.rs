//! The encoded copies of a granted secret the export gate must catch (issue 13, finding 5),
//! shared by the workspace-tier test (tests/secrets.rs) and the kernel-tier rows
//! (tests/export_tiers.rs).

use std::path::Path;

/// A value with characters URL-encoding changes, so every encoding differs from the literal.
pub const ODD_VALUE: &str = "h5i+test/secret=7c1f?9a2e&55 ok";

/// Each encoding of `ODD_VALUE` the exporter must catch, as python3's standard library writes
/// it (an implementation independent of h5i's), one file per encoding: `<file> <expected rule>`.
const ENCODER: &str = r#"import base64, binascii, re, sys, urllib.parse
v = sys.argv[1].encode()
def emb(k, enc):
    return enc(b"xyz"[:k] + v + b"-tail").decode()
files = {
  "b64_0.txt": emb(0, base64.b64encode), "b64_1.txt": emb(1, base64.b64encode),
  "b64_2.txt": emb(2, base64.b64encode),
  "b64url_0.txt": emb(0, base64.urlsafe_b64encode), "b64url_1.txt": emb(1, base64.urlsafe_b64encode),
  "b64url_2.txt": emb(2, base64.urlsafe_b64encode),
  "hex.txt": binascii.hexlify(v).decode(), "HEX.txt": binascii.hexlify(v).decode().upper(),
  "url.txt": urllib.parse.quote(v, safe=""),
  "url_lower.txt": re.sub("%[0-9A-F]{2}", lambda m: m.group(0).lower(), urllib.parse.quote(v, safe="")),
  "reversed.txt": v[::-1].decode(),
}
for name, text in files.items():
    open(name, "w").write("data: " + text + "\n")
"#;

/// The files [`ENCODER`] writes, as `(name, bytes)`: made by python3 in a scratch directory.
pub fn encoded_copies() -> Vec<(String, Vec<u8>)> {
    let dir = tempfile::tempdir().unwrap();
    let made = std::process::Command::new("python3")
        .args(["-c", ENCODER, ODD_VALUE])
        .current_dir(dir.path())
        .status()
        .unwrap();
    assert!(made.success());
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect();
    files.sort();
    files
}

/// Every encoded copy was excluded with the rule that fired named in what export `printed`, and
/// none of the encoded values is anywhere in the bundle at `review`.
pub fn assert_each_encoding_excluded(printed: &str, review: &Path) {
    let expect = [
        ("b64_0.txt", &["base64@0"][..]),
        ("b64_1.txt", &["base64@1"][..]),
        ("b64_2.txt", &["base64@2"][..]),
        // Where the URL-safe alphabet changes no character, the form is base64's own.
        ("b64url_0.txt", &["base64url@0", "base64@0"][..]),
        ("b64url_1.txt", &["base64url@1", "base64@1"][..]),
        ("b64url_2.txt", &["base64url@2", "base64@2"][..]),
        ("hex.txt", &["hex"][..]),
        ("HEX.txt", &["HEX"][..]),
        ("url.txt", &["url"][..]),
        ("url_lower.txt", &["url-lower"][..]),
        ("reversed.txt", &["reversed"][..]),
    ];
    let copies = encoded_copies();
    for (file, rules) in expect {
        let line = printed
            .lines()
            .find(|l| l.contains("excluded") && l.contains(file))
            .unwrap_or_else(|| panic!("{file} was not excluded:\n{printed}"));
        assert!(
            rules
                .iter()
                .any(|r| line.contains(&format!("secret:DEPLOY_KEY/{r}"))),
            "{file}: expected rule {rules:?} in `{line}`"
        );
        let (_, encoded) = copies.iter().find(|(n, _)| n == file).unwrap();
        let encoded = &encoded[6..encoded.len() - 1];
        assert!(
            super::files_containing(review, encoded).is_empty(),
            "{file}'s encoded secret is in the bundle"
        );
    }
}
