//! The one escaper: every string h5i prints that a box could have chosen (names, paths, manifest
//! fields, event and log lines, service output, git's complaints, error messages carrying any of
//! these) passes through here on its way to a terminal or a report.
//!
//! Owns the rule: C0 and C1 control characters, DEL, and the Unicode marks that reorder or hide
//! text (bidi embeddings, overrides and isolates, zero-width joiners, line and paragraph
//! separators, the BOM, interlinear annotations) are rendered visibly (`\x1b`, `\u{202e}`,
//! `\n`), never written raw, so an escape sequence (OSC 0 titles, OSC 52 clipboard writes,
//! `CSI 2J`, cursor moves) arrives as text. Bytes that are not UTF-8 become U+FFFD. A backslash
//! is left alone: what is printed is for a person, never parsed back.
//!
//! Must never: pass a byte below 0x20, 0x7f, or a C1 control through; depend on where the text
//! came from (one rule for every caller). Guarded by the unit tests below and
//! `tests/hostile_output.rs` (every printing verb).

use std::path::Path;

/// Whether `c` must not reach a terminal raw: a control character (C0, DEL, C1) or a mark that
/// reorders or hides the text around it.
pub fn is_control(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061c}'
                | '\u{200b}'..='\u{200f}'
                | '\u{2028}'..='\u{202e}'
                | '\u{2060}'..='\u{2069}'
                | '\u{feff}'
                | '\u{fff9}'..='\u{fffb}'
        )
}

/// `s` with every [`is_control`] character rendered visibly.
pub fn escape_controls(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    push_escaped(&mut out, s);
    out
}

/// Box bytes for display: lossy UTF-8, then [`escape_controls`].
pub fn bytes(b: &[u8]) -> String {
    escape_controls(&String::from_utf8_lossy(b))
}

/// A path for display, escaped.
pub fn path(p: &Path) -> String {
    bytes(std::os::unix::ffi::OsStrExt::as_bytes(p.as_os_str()))
}

/// JSON text (as serde_json writes it) with every [`is_control`] character left inside a string
/// written as a `\uXXXX` escape: still the same JSON, never raw on a terminal. serde_json
/// already escapes C0 controls; this catches C1 controls and the reordering marks. The newlines
/// between lines of pretty-printed JSON are structure and stay.
pub fn json(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if is_control(c) && c != '\n' {
            let mut units = [0u16; 2];
            for u in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{:04x}", u));
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn push_escaped(out: &mut String, s: &str) {
    for c in s.chars() {
        if !is_control(c) {
            out.push(c);
            continue;
        }
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x80 => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
        }
    }
}

/// Escapes a stream of box bytes line by line (service logs): each line is escaped and ends with
/// a real newline; a line longer than `max_line` is cut there and continued on the next line, so
/// memory stays bounded whatever the box wrote. Bytes split across reads stay whole.
pub fn stream<R: std::io::Read, W: std::io::Write>(
    mut from: R,
    to: &mut W,
    max_line: usize,
) -> std::io::Result<u64> {
    let mut buf = vec![0u8; 64 << 10];
    let mut line: Vec<u8> = Vec::new();
    let mut lines = 0u64;
    let flush = |line: &mut Vec<u8>, to: &mut W| -> std::io::Result<()> {
        let mut shown = bytes(line);
        shown.push('\n');
        line.clear();
        to.write_all(shown.as_bytes())
    };
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        for &b in &buf[..n] {
            if b == b'\n' {
                flush(&mut line, to)?;
                lines += 1;
            } else {
                line.push(b);
                if line.len() >= max_line {
                    flush(&mut line, to)?;
                    lines += 1;
                }
            }
        }
    }
    if !line.is_empty() {
        flush(&mut line, to)?;
        lines += 1;
    }
    Ok(lines)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_hostile_sequence_is_rendered_visibly() {
        let table: &[(&str, &str)] = &[
            ("\u{1b}]0;title\u{7}", "\\x1b]0;title\\x07"),
            ("\u{1b}]52;c;aGk=\u{1b}\\", "\\x1b]52;c;aGk=\\x1b\\"),
            ("\u{1b}[2J\u{1b}[H", "\\x1b[2J\\x1b[H"),
            ("\u{9b}31m", "\\u{9b}31m"),
            ("\u{9d}0;t\u{9c}", "\\u{9d}0;t\\u{9c}"),
            ("a\u{202e}b\u{2066}c", "a\\u{202e}b\\u{2066}c"),
            ("z\u{200b}w\u{feff}", "z\\u{200b}w\\u{feff}"),
            ("l1\nl2\r\t\u{7f}", "l1\\nl2\\r\\t\\x7f"),
            ("plain ascii and ünïcode", "plain ascii and ünïcode"),
        ];
        for (raw, shown) in table {
            assert_eq!(escape_controls(raw), *shown, "{}", raw.escape_debug());
        }
        assert_eq!(bytes(b"\xff\x1b"), "\u{fffd}\\x1b");
    }

    #[test]
    fn json_stays_json_without_raw_controls() {
        let v = serde_json::json!({"url": "x\u{9b}y\u{202e}z\u{1b}"});
        let text = json(&serde_json::to_string_pretty(&v).unwrap());
        assert!(!text.chars().any(|c| is_control(c) && c != '\n'), "{text}");
        let back: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(back, v);
    }

    #[test]
    fn a_stream_is_escaped_line_by_line_and_long_lines_are_cut() {
        let mut out = Vec::new();
        let input = b"one\x1b[2J\ntwo\x07".as_slice();
        assert_eq!(stream(input, &mut out, 1024).unwrap(), 2);
        assert_eq!(out, b"one\\x1b[2J\ntwo\\x07\n");
        let mut out = Vec::new();
        stream(&[b'a'; 10][..], &mut out, 4).unwrap();
        assert_eq!(out, b"aaaa\naaaa\naa\n");
    }
}
