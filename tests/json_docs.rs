//! `--json` outputs against the shapes written in `docs/json.md`: every verb's document is
//! checked field by field (type, presence, and no field the page does not list), and the page
//! and the build agree on the set of schemas.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::collections::BTreeMap;

use common::{stdout, Repo};
use serde_json::Value;

/// `schema -> (path -> (types, optional))`, read from the page's ```shape blocks.
type Shapes = BTreeMap<String, BTreeMap<String, (Vec<String>, bool)>>;

fn documented() -> Shapes {
    let page =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/json.md")).unwrap();
    let mut shapes = Shapes::new();
    let mut current: Option<String> = None;
    let mut in_block = false;
    for line in page.lines() {
        if let Some(h) = line.strip_prefix("## ") {
            current = Some(h.trim().to_string());
        } else if line.trim() == "```shape" {
            in_block = true;
        } else if line.trim() == "```" {
            in_block = false;
        } else if in_block {
            let text = line.split('#').next().unwrap().trim();
            let (path, ty) = text.split_once(':').expect(text);
            let ty = ty.trim();
            let (ty, optional) = match ty.strip_suffix('?') {
                Some(t) => (t, true),
                None => (ty, false),
            };
            shapes
                .entry(current.clone().expect("a shape outside a section"))
                .or_default()
                .insert(
                    path.trim().to_string(),
                    (ty.split('|').map(str::to_string).collect(), optional),
                );
        }
    }
    shapes
}

fn type_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Check `doc` against its documented shape; every problem is returned.
fn check(doc: &Value, shapes: &Shapes) -> Vec<String> {
    let schema = doc["schema"].as_str().expect("no schema field");
    let Some(shape) = shapes.get(schema) else {
        return vec![format!("{schema} is not documented")];
    };
    let mut problems = Vec::new();
    walk(doc, "", shape, &mut problems);
    problems
}

fn has_children(shape: &BTreeMap<String, (Vec<String>, bool)>, path: &str) -> bool {
    shape
        .keys()
        .any(|k| k.starts_with(&format!("{path}.")) || k.starts_with(&format!("{path}[].")))
}

fn walk(
    v: &Value,
    prefix: &str,
    shape: &BTreeMap<String, (Vec<String>, bool)>,
    problems: &mut Vec<String>,
) {
    let Value::Object(map) = v else {
        return;
    };
    let join = |k: &str| {
        if prefix.is_empty() {
            k.to_string()
        } else {
            format!("{prefix}.{k}")
        }
    };
    for (path, (_, optional)) in shape {
        let Some(rest) = (if prefix.is_empty() {
            Some(path.as_str())
        } else {
            path.strip_prefix(&format!("{prefix}."))
        }) else {
            continue;
        };
        if !rest.contains('.') && !rest.contains("[]") && !map.contains_key(rest) && !optional {
            problems.push(format!("{path}: documented, missing"));
        }
    }
    for (k, val) in map {
        let path = join(k);
        let Some((types, _)) = shape.get(&path) else {
            problems.push(format!("{path}: printed, not documented"));
            continue;
        };
        if !types.iter().any(|t| t == type_of(val)) {
            problems.push(format!(
                "{path}: {} is not {}",
                type_of(val),
                types.join("|")
            ));
            continue;
        }
        match val {
            Value::Object(_) if has_children(shape, &path) => walk(val, &path, shape, problems),
            Value::Array(items) => {
                for item in items {
                    if item.is_object() {
                        walk(item, &format!("{path}[]"), shape, problems);
                    }
                }
            }
            _ => {}
        }
    }
}

fn json_of(r: &Repo, args: &[&str], code: i32) -> Value {
    let out = r.h5i(args);
    assert_eq!(
        out.status.code(),
        Some(code),
        "{args:?}: {}",
        common::stderr(&out)
    );
    serde_json::from_str(&stdout(&out)).unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

#[test]
fn the_page_and_the_build_list_the_same_schemas() {
    let page: Vec<String> = documented().into_keys().collect();
    let mut built: Vec<String> = h5i::json_doc::ALL.iter().map(|s| s.to_string()).collect();
    built.sort();
    assert_eq!(page, built);
}

#[test]
fn every_json_output_matches_its_documented_shape() {
    let shapes = documented();
    let r = Repo::new();
    std::fs::write(r.path().join("package-lock.json"), "{}").unwrap();
    r.write_policy(
        "[service.web]\ncommand = \"sleep 1\"\nport = 3000\n\n[profile.s]\nisolation = \"workspace\"\nsecrets = [\"H5I_JSON_DOC_TOKEN\"]\n\n[profile.b]\nisolation = \"workspace\"\n[profile.b.fs]\nwrite = [\"~/.agent-browser\"]\n[profile.b.net]\nunix = true\n",
    );
    r.git(&["add", "-A"]);
    r.git(&["commit", "-q", "-m", "policy"]);
    r.ok(&["box", "create", "j", "--profile", "s"]);
    r.ok(&["box", "create", "k", "--profile", "s"]);
    r.ok(&["box", "create", "w", "--profile", "b"]);
    // A receipt for `inspect` and `log` (the grant resolves for this one run only).
    let run = r.h5i_env(
        &[
            "box",
            "run",
            "j",
            "--",
            "sh",
            "-c",
            "echo hi > new.txt; exit 3",
        ],
        &[("H5I_SECRET_H5I_JSON_DOC_TOKEN", "json-doc-value")],
    );
    assert_eq!(run.status.code(), Some(3), "{}", common::stderr(&run));

    // A cache under the key the lockfile makes, so `cache ls` and `cache mounts` have rows.
    let missing = json_of(&r, &["box", "cache", "mounts", "--json"], 0);
    assert_eq!(missing["offers"][0]["state"], "missing", "{missing}");
    let key = missing["offers"][0]["want"].as_str().unwrap().to_string();
    let entry = r.h5i_dir().join("cache/npm").join(&key);
    std::fs::create_dir_all(entry.join("data")).unwrap();
    std::fs::write(
        entry.join("refresh.json"),
        format!(
            r#"{{"v":1,"eco":"npm","key":"{key}","at_ms":1,"argv":["npm","ci"],"wall_ms":5,"policy_digest":"sha256:0","egress":{{"allowed":{{"registry.test:8080":3}},"denied":{{}}}},"bytes":0}}"#
        ),
    )
    .unwrap();

    let docs = [
        json_of(&r, &["box", "ls", "--json"], 0),
        json_of(&r, &["box", "status", "j", "--json"], 0),
        json_of(&r, &["box", "capabilities", "j", "--json"], 0),
        json_of(&r, &["box", "doctor", "j", "--json"], 0),
        json_of(&r, &["box", "probe", "--json"], 0),
        json_of(&r, &["box", "secrets", "j", "--json"], 1),
        json_of(&r, &["box", "ports", "j", "--json"], 0),
        json_of(&r, &["box", "service", "status", "j", "--json"], 0),
        json_of(&r, &["box", "cache", "ls", "--json"], 0),
        json_of(&r, &["box", "cache", "mounts", "--json"], 0),
        json_of(&r, &["box", "cache", "mounts", "j", "--json"], 0),
        json_of(&r, &["box", "inspect", "j", "--capture", "1", "--json"], 0),
        json_of(&r, &["box", "log", "j", "--json"], 0),
        json_of(&r, &["box", "compare", "j", "k", "--json"], 0),
        json_of(&r, &["browser", "status", "w", "--json"], 0),
    ];
    let mut seen = std::collections::BTreeSet::new();
    for doc in &docs {
        let problems = check(doc, &shapes);
        assert!(problems.is_empty(), "{problems:#?}\n{doc:#}");
        seen.insert(doc["schema"].as_str().unwrap().to_string());
    }
    assert_eq!(
        seen.len(),
        h5i::json_doc::ALL.len(),
        "a schema went untested: {seen:?}"
    );
    // The rows the shapes describe are really there (an empty array checks nothing).
    assert_eq!(docs[0]["boxes"][0]["name"], "j");
    assert_eq!(docs[5]["secrets"][0]["resolves"], false);
    assert_eq!(docs[7]["services"][0]["service"], "web");
    assert_eq!(docs[8]["caches"][0]["stale"], false);
    assert_eq!(docs[9]["offers"][0]["state"], "mounted");
    // The box runs at the workspace tier, which gets no cache.
    assert_eq!(docs[10]["tier_mounts_caches"], false);
    assert_eq!(docs[11]["record"]["exit"]["code"], 3, "{}", docs[11]);
    assert_eq!(docs[12]["receipts"][0]["exit"], 3);
    assert_eq!(docs[12]["events"][0]["event"], "created");
    let added = docs[13]["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["key"] == "files added")
        .unwrap();
    assert_eq!(
        (&added["a"], &added["b"], &added["same"]),
        (&"1".into(), &"0".into(), &false.into())
    );
}

#[test]
fn the_checker_catches_an_undocumented_field_and_a_wrong_type() {
    let shapes = documented();
    let doc = serde_json::json!({"schema": "h5i.box.probe/1", "facts": [{"what": "x", "answer": 3}], "extra": 1});
    let problems = check(&doc, &shapes);
    assert!(
        problems.iter().any(|p| p.starts_with("extra: printed")),
        "{problems:?}"
    );
    assert!(
        problems
            .iter()
            .any(|p| p.starts_with("facts[].answer: number")),
        "{problems:?}"
    );
    let doc = serde_json::json!({"schema": "h5i.box.probe/1"});
    assert_eq!(check(&doc, &shapes), ["facts: documented, missing"]);
}
