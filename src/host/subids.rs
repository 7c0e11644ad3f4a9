//! Subordinate id ranges (`/etc/subuid`, `/etc/subgid`): one `NAME:START:COUNT` line per user.
//!
//! Owns choosing a free range: the first `count` ids above every existing range and at least
//! [`FLOOR`], so a new range never overlaps another user's. Must never: change or remove a line
//! it did not write, or add a second line for a user that has one.

use std::path::Path;

use super::files::{write_if_differs, Owner};
use super::{Change, HostError};

/// Ranges start at or above this (below it sit the host's own system and login users).
pub const FLOOR: u64 = 200_000;
/// The size of each range h5i asks for: a full 16-bit id space for the box.
pub const COUNT: u64 = 65_536;

/// One parsed line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Range {
    /// The user (name or uid).
    pub owner: String,
    /// First id.
    pub start: u64,
    /// How many.
    pub count: u64,
}

/// Parse a subordinate id file's text (blank lines and `#` comments skipped).
pub fn parse(path: &Path, text: &str) -> Result<Vec<Range>, HostError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let t = line.trim();
        if t.is_empty() || t.starts_with('#') {
            continue;
        }
        let bad = || HostError::BadSubidLine {
            path: path.to_path_buf(),
            line: i + 1,
            text: t.to_string(),
        };
        let mut f = t.split(':');
        let (Some(owner), Some(start), Some(count), None) =
            (f.next(), f.next(), f.next(), f.next())
        else {
            return Err(bad());
        };
        out.push(Range {
            owner: owner.to_string(),
            start: start.parse().map_err(|_| bad())?,
            count: count.parse().map_err(|_| bad())?,
        });
    }
    Ok(out)
}

/// The start of the first free `count`-id range above every range in `ranges`.
pub fn next_free(ranges: &[Range], count: u64) -> Option<u64> {
    let start = ranges
        .iter()
        .map(|r| r.start.saturating_add(r.count))
        .fold(FLOOR, u64::max);
    (start.checked_add(count)? <= u64::from(u32::MAX)).then_some(start)
}

/// Give `names` (a user's name and uid; the first is written) a range in the file at `path`,
/// unless one of them already holds one.
pub fn ensure_range(
    path: &Path,
    names: &[&str],
    changes: &mut Vec<Change>,
) -> Result<(), HostError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(HostError::io("read", path)(e)),
    };
    let ranges = parse(path, &text)?;
    if ranges.iter().any(|r| names.contains(&r.owner.as_str())) {
        return Ok(());
    }
    let start = next_free(&ranges, COUNT).ok_or_else(|| HostError::SubidsExhausted {
        path: path.to_path_buf(),
        count: COUNT,
    })?;
    let mut new = text;
    if !new.is_empty() && !new.ends_with('\n') {
        new.push('\n');
    }
    let line = format!("{}:{start}:{COUNT}", names[0]);
    new.push_str(&line);
    new.push('\n');
    write_if_differs(path, new.as_bytes(), 0o644, Owner::ROOT)?;
    changes.push(Change(format!("added {line} to {}", path.display())));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_range_starts_above_every_other() {
        let p = Path::new("/etc/subuid");
        let r = parse(p, "a:100000:65536\n# c\nb:265536:65536\n").unwrap();
        assert_eq!(next_free(&r, COUNT), Some(331_072));
        assert_eq!(next_free(&[], COUNT), Some(FLOOR));
    }

    #[test]
    fn a_malformed_line_is_refused_with_its_number() {
        let e = parse(Path::new("/etc/subgid"), "a:1:2\nbroken\n").unwrap_err();
        assert!(e.to_string().contains("line 2"), "{e}");
    }

    #[test]
    fn ensure_range_is_idempotent_and_never_overlaps() {
        if unsafe_is_root() {
            let d = tempfile::tempdir().unwrap();
            let p = d.path().join("subuid");
            std::fs::write(&p, "h5i-test:200000:65536\n").unwrap();
            let mut ch = Vec::new();
            ensure_range(&p, &["h5i-box", "999"], &mut ch).unwrap();
            ensure_range(&p, &["h5i-box", "999"], &mut ch).unwrap();
            assert_eq!(ch.len(), 1);
            let r = parse(&p, &std::fs::read_to_string(&p).unwrap()).unwrap();
            assert_eq!(r[1].start, 265_536);
        }
    }

    fn unsafe_is_root() -> bool {
        let root = h5i_sys::ids::euid() == 0;
        if !root {
            h5i_testsupport::skipped!("ensure_range writes root-owned files: needs root");
        }
        root
    }
}
