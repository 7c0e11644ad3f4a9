//! The export gate's path validator (`h5i::export::gate`) against a box-built tree.
//!
//! Input: NUL-separated fields. The first is a path the box changed, the second a symlink
//! target; each further field is a workspace entry built first: `path\x01target` a symlink,
//! `path/` a directory, anything else a file. The workspace also holds `.git/hooks`.
//!
//! Properties: a path `path_problem` accepts is relative, made only of plain components (no
//! `.`, `..`, empty or `.git`-like one, no control byte or backslash); a symlink target
//! `symlink_problem` accepts, once the link exists, resolves (by the kernel, every prefix that
//! resolves at all) inside the workspace and never into `.git`.
#![no_main]

use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path};

use h5i::export::gate::{path_problem, symlink_problem};
use h5i_broker::redact::Redactor;

/// Most workspace entries one input builds.
const MAX_ENTRIES: usize = 8;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let mut fields = data.split(|b| *b == 0);
    let (Some(link), Some(target)) = (fields.next(), fields.next()) else {
        return;
    };
    check_path_shape(link);
    let Ok(dir) = tempfile::tempdir() else { return };
    let Ok(ws) = std::fs::canonicalize(dir.path()) else {
        return;
    };
    if std::fs::create_dir_all(ws.join(".git/hooks")).is_err() {
        return;
    }
    for entry in fields.take(MAX_ENTRIES) {
        build_entry(&ws, entry);
    }
    let redactor = Redactor::default();
    if path_problem(link, true).is_some()
        || symlink_problem(&ws, link, target, &redactor).is_some()
        || !parents_are_directories(&ws, link)
    {
        return;
    }
    let at = ws.join(Path::new(std::ffi::OsStr::from_bytes(link)));
    if std::os::unix::fs::symlink(std::ffi::OsStr::from_bytes(target), &at).is_err() {
        return;
    }
    // The link itself, and (for a dangling one) each leading part of its target as the kernel
    // follows it from the link's directory: whatever of it resolves at all stays in the tree.
    let from = at.parent().unwrap_or(&ws).to_path_buf();
    let mut prefix = from.clone();
    let mut checked = vec![at.clone()];
    for part in target.split(|b| *b == b'/') {
        prefix.push(std::ffi::OsStr::from_bytes(part));
        checked.push(prefix.clone());
    }
    for p in checked {
        let Ok(real) = std::fs::canonicalize(&p) else {
            continue;
        };
        let inside = real.strip_prefix(&ws).unwrap_or_else(|_| {
            panic!(
                "accepted symlink {:?} -> {:?} resolves out of the workspace: {p:?} is {real:?}",
                String::from_utf8_lossy(link),
                String::from_utf8_lossy(target)
            )
        });
        assert!(
            !inside.components().any(|c| c.as_os_str() == ".git"),
            "accepted symlink {:?} -> {:?} resolves into .git: {p:?} is {real:?}",
            String::from_utf8_lossy(link),
            String::from_utf8_lossy(target)
        );
    }
});

/// A path the validator accepts has only plain, printable, non-`.git` components.
fn check_path_shape(path: &[u8]) {
    if path_problem(path, false).is_some() {
        return;
    }
    let shown = String::from_utf8_lossy(path);
    let p = Path::new(std::ffi::OsStr::from_bytes(path));
    assert!(p.is_relative(), "accepted {shown:?}");
    let parts: Vec<&[u8]> = path.split(|b| *b == b'/').collect();
    let normal = p
        .components()
        .filter(|c| matches!(c, Component::Normal(_)))
        .count();
    assert_eq!(
        normal,
        parts.len(),
        "accepted {shown:?} with a non-plain component"
    );
    assert!(
        !path.iter().any(|b| *b < 0x20 || *b == 0x7f || *b == b'\\'),
        "accepted {shown:?} with a control byte or backslash"
    );
    for part in parts {
        let lower = String::from_utf8_lossy(part).to_ascii_lowercase();
        assert_ne!(
            lower.trim_end_matches(['.', ' ']),
            ".git",
            "accepted {shown:?}"
        );
    }
}

/// Whether every ancestor of `rel` under `ws` is a real directory (no symlink), making the
/// missing ones; a link is only placed where git could place it.
fn parents_are_directories(ws: &Path, rel: &[u8]) -> bool {
    let mut at = ws.to_path_buf();
    let mut parts: Vec<&[u8]> = rel.split(|b| *b == b'/').collect();
    parts.pop();
    for part in parts {
        at.push(std::ffi::OsStr::from_bytes(part));
        match std::fs::symlink_metadata(&at) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => return false,
            Err(_) => {
                if std::fs::create_dir(&at).is_err() {
                    return false;
                }
            }
        }
    }
    true
}

/// Build one workspace entry from its field, when its path is one git could write.
fn build_entry(ws: &Path, entry: &[u8]) {
    let (path, link_target) = match entry.iter().position(|b| *b == 1) {
        Some(i) => (&entry[..i], Some(&entry[i + 1..])),
        None => (entry, None),
    };
    let (path, is_dir) = match path.strip_suffix(b"/") {
        Some(p) => (p, link_target.is_none()),
        None => (path, false),
    };
    if path_problem(path, link_target.is_some()).is_some() || !parents_are_directories(ws, path) {
        return;
    }
    let at = ws.join(Path::new(std::ffi::OsStr::from_bytes(path)));
    let _ = match (link_target, is_dir) {
        (Some(t), _) => std::os::unix::fs::symlink(std::ffi::OsStr::from_bytes(t), &at),
        (None, true) => std::fs::create_dir(&at),
        (None, false) => std::fs::write(&at, b"x"),
    };
}
