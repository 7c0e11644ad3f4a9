//! The library's layering, read from its sources: a module that the verbs stand on (the store,
//! the error type, the export gate) never reaches back up to a module that uses it, the run
//! entry point is no longer in a circle with the tiers it dispatches to, and the run path points
//! one way: the verbs -> the run session (`session`) -> the tier modules -> the leaves, so the
//! session and every tier are in no circle and a tier never names the session, the caches, the
//! browser's verbs or `create`. Each top-level module of `src/` is a node; each `crate::NAME` in
//! its code (comments skipped) an edge.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Top-level module → the top-level modules its code names through `crate::`.
fn module_graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files: BTreeMap<String, Vec<std::path::PathBuf>> = BTreeMap::new();
    for entry in std::fs::read_dir(&src).unwrap().flatten() {
        let path = entry.path();
        let name = path.file_stem().unwrap().to_string_lossy().to_string();
        // `main`, `bin/` and `cmd/` are the binary's: their `crate::` is another crate.
        if ["lib", "main", "bin", "cmd"].contains(&name.as_str()) {
            continue;
        }
        let mut stack = vec![path];
        while let Some(p) = stack.pop() {
            if p.is_dir() {
                stack.extend(std::fs::read_dir(&p).unwrap().flatten().map(|e| e.path()));
            } else if p.extension().is_some_and(|x| x == "rs") {
                files.entry(name.clone()).or_default().push(p);
            }
        }
    }
    let mut graph = BTreeMap::new();
    for (module, paths) in &files {
        let mut uses = BTreeSet::new();
        for p in paths {
            let text = std::fs::read_to_string(p).unwrap();
            for line in text.lines().filter(|l| !l.trim_start().starts_with("//")) {
                for (i, _) in line.match_indices("crate::") {
                    let name: String = line[i + "crate::".len()..]
                        .chars()
                        .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                        .collect();
                    if &name != module && files.contains_key(&name) {
                        uses.insert(name);
                    }
                }
            }
        }
        graph.insert(module.clone(), uses);
    }
    graph
}

/// A path of modules from `from` back to itself, if there is one.
fn cycle_through(graph: &BTreeMap<String, BTreeSet<String>>, from: &str) -> Option<Vec<String>> {
    let mut seen = BTreeSet::new();
    let mut stack = vec![vec![from.to_string()]];
    while let Some(path) = stack.pop() {
        let last = path.last().unwrap();
        for next in &graph[last] {
            if next == from {
                let mut found = path.clone();
                found.push(next.clone());
                return Some(found);
            }
            if seen.insert(next.clone()) {
                let mut longer = path.clone();
                longer.push(next.clone());
                stack.push(longer);
            }
        }
    }
    None
}

#[test]
fn the_store_the_error_type_the_export_gate_and_the_run_entry_are_in_no_import_circle() {
    let graph = module_graph();
    // The scan sees the edges it must: a reader that found none would pass anything.
    for (from, to) in [
        ("error", "export"),
        ("export", "snapshot"),
        ("run", "session"),
    ] {
        assert!(
            graph[from].contains(to),
            "the scan lost the edge {from} -> {to}: {:?}",
            graph[from]
        );
    }
    for module in ["error", "export", "store", "events", "snapshot", "run"] {
        if let Some(circle) = cycle_through(&graph, module) {
            panic!(
                "refusing: `{module}` is in an import circle: {}; to fix: move what the lower module borrows from the higher one down (into it, or into h5i_policy)",
                circle.join(" -> ")
            );
        }
    }
}

/// The modules that start a command in a box for the session, each at its tier.
const TIERS: [&str; 6] = [
    "process",
    "supervised",
    "sandbox",
    "container",
    "microvm",
    "service",
];

#[test]
fn the_run_session_and_the_tiers_are_in_no_import_circle() {
    let graph = module_graph();
    for (from, to) in [
        ("session", "process"),
        ("sandbox", "supervised"),
        ("microvm", "container"),
    ] {
        assert!(
            graph[from].contains(to),
            "the scan lost the edge {from} -> {to}: {:?}",
            graph[from]
        );
    }
    for module in std::iter::once("session").chain(TIERS) {
        if let Some(circle) = cycle_through(&graph, module) {
            panic!(
                "refusing: `{module}` is in an import circle: {}; to fix: pass what the lower module needs down to it (in its plan or request), or move the shared item into the lowest module that owns it",
                circle.join(" -> ")
            );
        }
    }
}

#[test]
fn a_tier_never_names_the_session_the_caches_the_browsers_verbs_or_create() {
    let graph = module_graph();
    // A tier is handed what it needs (the caches' binds, the browser's grant) in its plan:
    // `browser_box` is the browser's part below the tiers, `browser` its verbs above them.
    // The service tier is a verb of the session's too (its supervisor opens one).
    for tier in TIERS {
        let above: &[&str] = match tier {
            "service" => &["cache", "browser", "create"],
            _ => &["session", "cache", "browser", "create"],
        };
        let named: Vec<&str> = above
            .iter()
            .copied()
            .filter(|m| graph[tier].contains(*m))
            .collect();
        assert!(
            named.is_empty(),
            "refusing: the {tier} tier names {named:?}, which stand above it; to fix: hand the tier what it needs in its plan instead"
        );
    }
}

#[test]
fn the_circle_finder_finds_a_circle() {
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("a", &["b"][..]),
        ("b", &["c"]),
        ("c", &["a"]),
        ("d", &["a"]),
    ]
    .into_iter()
    .map(|(k, v)| (k.into(), v.iter().map(|s| s.to_string()).collect()))
    .collect();
    assert_eq!(
        cycle_through(&graph, "a").unwrap(),
        ["a", "b", "c", "a"].map(String::from)
    );
    assert_eq!(cycle_through(&graph, "d"), None);
}

#[test]
fn the_box_identity_and_the_agent_switches_are_in_no_import_circle() {
    let graph = module_graph();
    // The edges that stay (the higher module names the lower): the scan must see them.
    for (from, to) in [("host", "identity"), ("capture", "agent")] {
        assert!(
            graph[from].contains(to),
            "the scan lost the edge {from} -> {to}: {:?}",
            graph[from]
        );
    }
    // `host` sets up what `identity` reads (the password lookup is h5i_sys's); `capture` wires
    // what `agent` switches (the hook's path in the box is h5i_hook's).
    for module in ["identity", "host", "agent", "capture"] {
        if let Some(circle) = cycle_through(&graph, module) {
            panic!(
                "refusing: `{module}` is in an import circle: {}; to fix: move the shared item into the lower module or below (h5i_sys, h5i_hook, h5i_policy)",
                circle.join(" -> ")
            );
        }
    }
}

/// The production source trees a raw call is looked for in (tests, `runtime/patches` and the
/// fuzz targets are not among them; `sys/` is where raw calls belong).
const PRODUCTION_TREES: [&str; 7] = [
    "src",
    "runtime/src",
    "hooks/src",
    "broker/src",
    "policy/src",
    "log/src",
    "guest/src",
];

/// Where the raw calls that stay outside `sys/` are named, each with its reason.
const RAW_CALLS_ALLOWED: &str = "sys/raw-calls-allowed.txt";

/// `text` with every comment, string and character literal blanked out (newlines kept), so
/// neither a call in a doc comment nor a brace in a string counts.
fn code_only(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let blank = |out: &mut Vec<u8>, bytes: &[u8]| {
        out.extend(bytes.iter().map(|c| if *c == b'\n' { b'\n' } else { b' ' }));
    };
    let mut i = 0;
    while i < b.len() {
        let rest = &b[i..];
        let after_ident = i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_');
        // A raw string: `r"..."`, `r#"..."#`, `br"..."` (not the end of an identifier).
        let raw_prefix = [&b"br"[..], b"r"]
            .into_iter()
            .find(|p| rest.starts_with(p))
            .filter(|_| !after_ident);
        let raw_hashes = raw_prefix.and_then(|p| {
            let hashes = rest[p.len()..].iter().take_while(|c| **c == b'#').count();
            (rest.get(p.len() + hashes) == Some(&b'"')).then_some((p.len(), hashes))
        });
        let len = if rest.starts_with(b"//") {
            rest.iter().position(|c| *c == b'\n').unwrap_or(rest.len())
        } else if rest.starts_with(b"/*") {
            let mut depth = 0;
            let mut j = 0;
            while j < rest.len() {
                if rest[j..].starts_with(b"/*") {
                    depth += 1;
                    j += 2;
                } else if rest[j..].starts_with(b"*/") {
                    depth -= 1;
                    j += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    j += 1;
                }
            }
            j
        } else if let Some((prefix, hashes)) = raw_hashes {
            let close: Vec<u8> = std::iter::once(b'"')
                .chain(std::iter::repeat_n(b'#', hashes))
                .collect();
            let start = prefix + hashes + 1;
            rest[start..]
                .windows(close.len())
                .position(|w| w == close.as_slice())
                .map_or(rest.len(), |p| start + p + close.len())
        } else if rest[0] == b'"' {
            let mut j = 1;
            while j < rest.len() && rest[j] != b'"' {
                j += if rest[j] == b'\\' { 2 } else { 1 };
            }
            (j + 1).min(rest.len())
        } else if rest[0] == b'\'' {
            // A character literal ('x', '\n', '\u{..}'), not a lifetime ('a).
            if rest.get(1) == Some(&b'\\') {
                rest.iter()
                    .skip(2)
                    .position(|c| *c == b'\'')
                    .map_or(1, |p| p + 3)
            } else {
                text[i + 1..]
                    .chars()
                    .next()
                    .map(char::len_utf8)
                    .filter(|n| rest.get(1 + n) == Some(&b'\''))
                    .map_or(1, |n| n + 2)
            }
        } else {
            out.push(rest[0]);
            i += 1;
            continue;
        };
        blank(&mut out, &rest[..len]);
        i += len;
    }
    String::from_utf8(out).unwrap()
}

/// `code` (from [`code_only`]) without its `#[cfg(test)]` items: a `mod NAME;` declared that
/// way is returned by name (its file is test code too), a braced item is cut to its closing
/// brace, any other item to its `;`.
fn without_test_items(code: &str) -> (String, Vec<String>) {
    let mut out = String::with_capacity(code.len());
    let mut test_mods = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let item = &rest[at..];
        let body_start = item.find(['{', ';']).unwrap_or(item.len());
        let end = if item[body_start..].starts_with(';') {
            let decl = item["#[cfg(test)]".len()..body_start].trim();
            if let Some(name) = decl
                .rsplit_once("mod ")
                .map(|(_, n)| n.trim())
                .filter(|n| n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
            {
                test_mods.push(name.to_string());
            }
            body_start + 1
        } else {
            let mut depth = 0usize;
            let mut end = item.len();
            for (i, c) in item.char_indices().skip(body_start) {
                match c {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            end = i + 1;
                            break;
                        }
                    }
                    _ => {}
                }
            }
            end
        };
        // Keep the line count, so a finding's line number is the file's.
        out.extend(item[..end].chars().filter(|c| *c == '\n'));
        rest = &item[end..];
    }
    out.push_str(rest);
    (out, test_mods)
}

/// Each `libc::NAME(` call and each `nix::` use in `code`: (call, 1-based line).
fn raw_calls_in(code: &str) -> Vec<(String, usize)> {
    let mut found = Vec::new();
    for (n, line) in code.lines().enumerate() {
        for (i, _) in line.match_indices("libc::") {
            if line[..i].ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_') {
                continue;
            }
            let after = &line[i + "libc::".len()..];
            let name: String = after
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if after[name.len()..].trim_start().starts_with('(') && !name.is_empty() {
                found.push((format!("libc::{name}"), n + 1));
            }
        }
        for (i, _) in line.match_indices("nix::") {
            if !line[..i].ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_') {
                found.push(("nix::".to_string(), n + 1));
            }
        }
    }
    found
}

/// (file relative to the workspace, call) -> the lines it is on, over `sources` (each file's
/// relative path and text); a file a parent declares `#[cfg(test)] mod NAME;` is left out.
fn raw_calls(sources: &[(String, String)]) -> BTreeMap<(String, String), Vec<usize>> {
    let mut test_files = BTreeSet::new();
    let mut scanned = Vec::new();
    for (path, text) in sources {
        let (code, test_mods) = without_test_items(&code_only(text));
        let dir = match path.rsplit_once('/') {
            Some((dir, file)) if ["mod.rs", "lib.rs", "main.rs"].contains(&file) => dir.to_string(),
            _ => path.trim_end_matches(".rs").to_string(),
        };
        for m in test_mods {
            test_files.insert(format!("{dir}/{m}.rs"));
            test_files.insert(format!("{dir}/{m}/mod.rs"));
        }
        scanned.push((path, code));
    }
    let mut found: BTreeMap<(String, String), Vec<usize>> = BTreeMap::new();
    for (path, code) in scanned {
        if test_files.contains(path) {
            continue;
        }
        for (call, line) in raw_calls_in(&code) {
            found.entry((path.clone(), call)).or_default().push(line);
        }
    }
    found
}

/// The allowlist's entries: (file, call) -> reason. Blank lines and `#` comments are skipped.
fn allowlist(text: &str) -> Result<BTreeMap<(String, String), String>, String> {
    let mut entries = BTreeMap::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut words = line.splitn(3, char::is_whitespace);
        let (Some(file), Some(call), Some(reason)) = (words.next(), words.next(), words.next())
        else {
            return Err(format!(
                "line {}: `{line}` is not `FILE CALL REASON`",
                n + 1
            ));
        };
        let reason = reason.trim();
        if reason.len() < 20 || reason.contains("owned by another") {
            return Err(format!(
                "line {}: `{file} {call}` gives no reason why the call stays (say why, or `pending: WHAT REPLACES IT`)",
                n + 1
            ));
        }
        if entries
            .insert((file.to_string(), call.to_string()), reason.to_string())
            .is_some()
        {
            return Err(format!("line {}: `{file} {call}` is named twice", n + 1));
        }
    }
    Ok(entries)
}

/// What is wrong between the calls found and the allowlist: a call it does not name, and an
/// entry that names no call any more (so the list cannot rot).
fn raw_call_refusals(
    found: &BTreeMap<(String, String), Vec<usize>>,
    allowed: &BTreeMap<(String, String), String>,
) -> Vec<String> {
    let mut refusals = Vec::new();
    for ((file, call), lines) in found {
        if !allowed.contains_key(&(file.clone(), call.clone())) {
            refusals.push(format!(
                "refusing: {file}:{lines:?} makes the raw call `{call}` outside sys/; to fix: call (or add) an h5i_sys function, or name `{file} {call} REASON` in {RAW_CALLS_ALLOWED}"
            ));
        }
    }
    for (file, call) in allowed.keys() {
        if !found.contains_key(&(file.clone(), call.clone())) {
            refusals.push(format!(
                "refusing: {RAW_CALLS_ALLOWED} names `{file} {call}`, which no production code makes any more; to fix: remove the entry"
            ));
        }
    }
    refusals
}

fn production_sources() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut out = Vec::new();
    let mut stack: Vec<_> = PRODUCTION_TREES.iter().map(|d| root.join(d)).collect();
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let rel = p.strip_prefix(root).unwrap().to_string_lossy().to_string();
                out.push((rel, std::fs::read_to_string(&p).unwrap()));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn no_libc_call_or_nix_use_outside_sys_unless_the_allowlist_names_it_and_no_entry_is_stale() {
    let sources = production_sources();
    assert!(sources.len() > 100, "found only {} sources", sources.len());
    let found = raw_calls(&sources);
    // The scan sees calls it must: one the allowlist keeps (a libc call in production code).
    assert!(
        found.contains_key(&("guest/src/main.rs".into(), "libc::reboot".into())),
        "the scan lost guest/src/main.rs's reboot: {:?}",
        found.keys().collect::<Vec<_>>()
    );
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let allowed =
        allowlist(&std::fs::read_to_string(root.join(RAW_CALLS_ALLOWED)).unwrap()).unwrap();
    let refusals = raw_call_refusals(&found, &allowed);
    assert!(refusals.is_empty(), "{}", refusals.join("\n"));
}

#[test]
fn a_planted_libc_call_is_refused_and_an_entry_that_matches_nothing_too() {
    let file = |path: &str, text: &str| (path.to_string(), text.to_string());
    let sources = [
        file(
            "src/planted.rs",
            "//! Calls `libc::kill(pid, 0)` in its doc only.\nfn f() {\n    let s = \"libc::fork()\";\n    // SAFETY: none.\n    unsafe { libc::kill(1, 0) };\n    let _ = libc::EPERM;\n}\n#[cfg(test)]\nmod tests {\n    fn g() { unsafe { libc::fork() }; let _ = '{'; }\n}\nfn after() { unsafe { libc::getpid() }; }\n",
        ),
        file("src/other.rs", "use nix::unistd::Pid;\nfn h(x: std::os::unix::io::RawFd) {}\n#[cfg(test)]\nmod tests;\n"),
        file("src/other/tests.rs", "fn t() { unsafe { libc::fork() }; }\n"),
    ];
    let found = raw_calls(&sources);
    let key = |f: &str, c: &str| (f.to_string(), c.to_string());
    assert_eq!(
        found,
        BTreeMap::from([
            (key("src/planted.rs", "libc::getpid"), vec![12]),
            (key("src/planted.rs", "libc::kill"), vec![5]),
            (key("src/other.rs", "nix::"), vec![1]),
        ])
    );
    let allowed = allowlist(
        "# why each stays\nsrc/planted.rs libc::kill a probe with signal 0 of a pid read from a file\nsrc/other.rs nix:: pending: the Pid type of a library's API\nsrc/gone.rs libc::fork pending: nothing, the file is gone\n",
    )
    .unwrap();
    let refusals = raw_call_refusals(&found, &allowed);
    assert_eq!(refusals.len(), 2, "{refusals:#?}");
    assert!(refusals[0].contains("src/planted.rs:[12]") && refusals[0].contains("libc::getpid"));
    assert!(refusals[1].contains("`src/gone.rs libc::fork`"));
    assert!(allowlist("src/a.rs libc::kill owned by another change this session").is_err());
    assert!(allowlist("src/a.rs libc::kill").is_err());
}
