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
