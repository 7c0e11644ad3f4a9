//! `--json` outputs against the shapes written in `docs/json.md`: every verb's document is
//! checked field by field, down to every nested object's (type, presence, no field the page
//! does not list, no object whose fields it does not list), from a workspace box and from boxes
//! at the process, supervised, container and microvm tiers after a run at each (so the run
//! record, the loaded egress table and the socket gate's and cgroup's figures carry real
//! content); and the page and the build agree on the set of schemas.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::collections::BTreeMap;

use common::caller::Caller;
use common::testnet::TestHosts;
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
    match doc {
        Value::Object(map) => walk_object(map, "", shape, &mut problems),
        _ => problems.push("the document is not an object".into()),
    }
    problems
}

type Shape = BTreeMap<String, (Vec<String>, bool)>;

/// Whether the page lists fields of the object at `path`.
fn has_fields(shape: &Shape, path: &str) -> bool {
    shape.keys().any(|k| k.starts_with(&format!("{path}.")))
}

/// An object's fields: each documented one present unless optional, each present one
/// documented and of its type.
fn walk_object(
    map: &serde_json::Map<String, Value>,
    prefix: &str,
    shape: &Shape,
    problems: &mut Vec<String>,
) {
    let join = |k: &str| {
        if prefix.is_empty() {
            k.to_string()
        } else {
            format!("{prefix}.{k}")
        }
    };
    for (path, (_, optional)) in shape {
        let rest = if prefix.is_empty() {
            Some(path.as_str())
        } else {
            path.strip_prefix(&format!("{prefix}."))
        };
        let Some(rest) = rest else {
            continue;
        };
        let direct = !rest.contains(['.', '[', '{']);
        if direct && !optional && !map.contains_key(rest) {
            problems.push(format!("{path}: documented, missing"));
        }
    }
    for (k, val) in map {
        check_at(val, &join(k), shape, problems);
    }
}

/// The value at `path` (a field, `a[]` an array's element, `m{}` a map's value).
fn check_at(v: &Value, path: &str, shape: &Shape, problems: &mut Vec<String>) {
    let Some((types, _)) = shape.get(path) else {
        // An array's objects may be documented by their fields alone (`a[].b`).
        match v {
            Value::Object(map) if path.ends_with("[]") && has_fields(shape, path) => {
                walk_object(map, path, shape, problems)
            }
            _ => problems.push(format!("{path}: printed, not documented")),
        }
        return;
    };
    if types.iter().any(|t| t == "json") {
        return;
    }
    if !types.iter().any(|t| t == type_of(v)) {
        problems.push(format!("{path}: {} is not {}", type_of(v), types.join("|")));
        return;
    }
    match v {
        Value::Object(map) => {
            let values = format!("{path}{{}}");
            if shape.contains_key(&values) {
                for val in map.values() {
                    check_at(val, &values, shape, problems);
                }
            } else if has_fields(shape, path) {
                walk_object(map, path, shape, problems);
            } else {
                problems.push(format!("{path}: an object whose fields are not documented"));
            }
        }
        Value::Array(items) => {
            for item in items {
                check_at(item, &format!("{path}[]"), shape, problems);
            }
        }
        _ => {}
    }
}

/// `h5i args` as `c`, which must exit `code`; its stdout as JSON.
fn caller_json(c: &Caller, args: &[&str], code: i32) -> Value {
    let out = c.h5i(args);
    assert_eq!(
        out.status.code(),
        Some(code),
        "{args:?} as {}: {}",
        c.who(),
        common::stderr(&out)
    );
    serde_json::from_str(&stdout(&out)).unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

/// Every per-box verb's document of two boxes at `tier` after one run in the first (a file
/// written, exit 3; at the supervised tier a connection its table allows and one it refuses):
/// each validates against the page, and the content the run made is in them.
fn every_document_of_boxes_at(tier: &str) {
    let shapes = documented();
    let hosts = match tier {
        "supervised" => match TestHosts::up(&format!("json documents at {tier}"), &[8080], &[]) {
            Some(h) => Some(h),
            None => return,
        },
        _ => {
            let test = format!("json documents at {tier}");
            if !common::require_root(&test, "boxes at every tier")
                || (tier == "microvm" && !common::guest_agent_ready(&test))
            {
                return;
            }
            None
        }
    };
    let mut c = Caller::root();
    let net = match &hosts {
        Some(h) => {
            c = c.with_env("H5I_TEST_HOSTS", &h.pin(&[("allowed.test", h.first)]));
            "[profile.t.net]\negress = [\"allowed.test:8080\"]\n"
        }
        None => "",
    };
    c.write(
        ".h5i/env.toml",
        format!("[service.web]\ncommand = \"sleep 1\"\nport = 3000\n\n[profile.t]\nsecrets = [\"H5I_JSON_DOC_TOKEN\"]\n{net}"),
    );
    c.write("package-lock.json", "{}");
    c.commit_all("policy");
    c.create_at_with("j", tier, &["--profile", "t"]);
    c.create_at_with("k", tier, &["--profile", "t"]);
    let script = match &hosts {
        Some(h) => format!(
            "python3 -c \"import socket\nsocket.create_connection(('allowed.test', 8080), 5).close()\ntry:\n    socket.create_connection(('{}', 8080), 2)\nexcept OSError:\n    pass\" && echo hi > new.txt; exit 3",
            h.second
        ),
        None => "echo hi > new.txt; exit 3".to_string(),
    };
    let run = c.h5i_with(
        &["box", "run", "j", "--", "sh", "-c", &script],
        &[("H5I_SECRET_H5I_JSON_DOC_TOKEN", "json-doc-value")],
    );
    assert_eq!(run.status.code(), Some(3), "{}", common::stderr(&run));

    let log = caller_json(&c, &["box", "log", "j", "--json"], 0);
    let seq = log["receipts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["kind"] == "run")
        .unwrap_or_else(|| panic!("no run receipt: {log}"))["seq"]
        .to_string();
    let doctor = c.h5i(&["box", "doctor", "j", "--json"]);
    let doctor: Value = serde_json::from_str(&stdout(&doctor))
        .unwrap_or_else(|e| panic!("doctor at {tier}: {e}: {}", common::stderr(&doctor)));
    let docs = [
        caller_json(&c, &["box", "ls", "--json"], 0),
        caller_json(&c, &["box", "status", "j", "--json"], 0),
        caller_json(&c, &["box", "capabilities", "j", "--json"], 0),
        doctor,
        caller_json(&c, &["box", "secrets", "j", "--json"], 1),
        caller_json(&c, &["box", "ports", "j", "--json"], 0),
        caller_json(&c, &["box", "service", "status", "j", "--json"], 0),
        caller_json(&c, &["box", "cache", "mounts", "j", "--json"], 0),
        caller_json(&c, &["box", "inspect", "j", "--capture", &seq, "--json"], 0),
        log,
        caller_json(&c, &["box", "compare", "j", "k", "--json"], 0),
    ];
    for doc in &docs {
        let problems = check(doc, &shapes);
        assert!(problems.is_empty(), "at {tier}: {problems:#?}\n{doc:#}");
    }
    // What the run made is in them (an absent or empty part checks nothing).
    let (status, caps, inspect, log, compare) = (&docs[1], &docs[2], &docs[8], &docs[9], &docs[10]);
    assert_eq!(status["tier"], tier, "{status}");
    assert_eq!(status["last_run"]["exit"], 3, "{status}");
    assert_eq!(status["last_run"]["argv"][0], "sh", "{status}");
    assert!(
        !caps["net"]["families"]["allowed"]
            .as_array()
            .unwrap()
            .is_empty(),
        "{caps}"
    );
    assert!(
        !caps["net"]["families"]["refused"]
            .as_array()
            .unwrap()
            .is_empty(),
        "{caps}"
    );
    let record = &inspect["record"];
    assert_eq!(
        (&record["kind"], &record["tier"], &record["exit"]["code"]),
        (&"run".into(), &tier.into(), &3.into()),
        "{inspect}"
    );
    assert_eq!(log["receipts"][0]["exit"], 3, "{log}");
    let added = compare["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["key"] == "files added")
        .unwrap_or_else(|| panic!("{compare}"));
    assert_eq!(
        (&added["a"], &added["b"]),
        (&"1".into(), &"0".into()),
        "{compare}"
    );
    match tier {
        "container" => {
            assert!(record["rusage"].is_null(), "{inspect}");
            assert!(record["cgroup_usage"].is_object(), "{inspect}");
        }
        "microvm" => {}
        _ => assert!(
            record["rusage"]["maxrss_kb"].as_u64().unwrap() > 0,
            "{inspect}"
        ),
    }
    if let Some(h) = &hosts {
        let rules = &caps["egress_table"]["rules"];
        assert_eq!(rules[0]["host"], "allowed.test", "{caps}");
        assert_eq!(rules[0]["addrs"][0], h.first.to_string(), "{caps}");
        assert_eq!(
            record["egress"]["allowed"]["allowed.test:8080"], 1,
            "{inspect}"
        );
        assert_eq!(
            record["egress"]["denied"][format!("{}:8080/tcp", h.second)],
            1,
            "{inspect}"
        );
        assert!(
            record["socket_gate"]["allowed"]["inet"].as_u64().unwrap() >= 2,
            "{inspect}"
        );
    }
    // Their sandboxes, VMs and containers go with them.
    c.ok(&["box", "rm", "--force", "j"]);
    c.ok(&["box", "rm", "--force", "k"]);
}

#[test]
fn every_json_output_of_microvm_tier_boxes_matches_its_documented_shape() {
    every_document_of_boxes_at("microvm");
}

#[test]
fn every_json_output_of_process_tier_boxes_matches_its_documented_shape() {
    every_document_of_boxes_at("process");
}

#[test]
fn every_json_output_of_supervised_tier_boxes_matches_its_documented_shape() {
    every_document_of_boxes_at("supervised");
}

#[test]
fn every_json_output_of_container_tier_boxes_matches_its_documented_shape() {
    every_document_of_boxes_at("container");
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

    // Nested: an array element, a map's value and a field deep in a record are each checked.
    let doc = serde_json::json!({
        "schema": "h5i.box.inspect/1", "name": "j", "host_observed": true, "payload": null,
        "record": {
            "v": 1, "seq": 1, "lane": "host-env-run", "at_ms": 1, "policy_digest": "sha256:0",
            "kind": "run", "argv": ["sh", 3], "tier": "process",
            "exit": {"code": 3, "signal": null, "timed_out": false},
            "egress": {"allowed": {"a.test:443": "many"}, "denied": {}},
            "rusage": {"user_us": 1, "sys_us": 1, "maxrss_kb": 1, "minflt": 1, "majflt": 1,
                       "inblock": 1, "oublock": 1, "nvcsw": 1, "nivcsw": 1, "extra": 1}
        }
    });
    let mut problems = check(&doc, &shapes);
    problems.sort();
    assert_eq!(
        problems,
        [
            "record.argv[]: number is not string",
            "record.egress.allowed{}: string is not number",
            "record.exit.oom_killed: documented, missing",
            "record.rusage.extra: printed, not documented",
        ],
        "{doc:#}"
    );
    // A box-claimed record's own fields are the box's: any JSON passes there.
    let claimed = serde_json::json!({
        "schema": "h5i.box.inspect/1", "name": "j", "host_observed": false, "payload": null,
        "record": {
            "v": 1, "seq": 2, "lane": "inbox-capture", "at_ms": 1, "policy_digest": "sha256:0",
            "kind": "box-claimed", "claimed_kind": "note",
            "claim": {"kind": "note", "list": [1, {"a": null}], "n": 2}
        }
    });
    assert_eq!(check(&claimed, &shapes), Vec::<String>::new());

    // An object the page lists without its fields is refused, not passed through.
    let mut opaque = shapes.clone();
    let status = opaque.get_mut("h5i.box.status/1").unwrap();
    status.retain(|k, _| !k.starts_with("drift."));
    let doc = serde_json::json!({
        "schema": "h5i.box.status/1", "name": "j", "state": "active", "source": "s", "base": "b",
        "tier": "process", "tier_chosen_by": "auto", "policy_digest": "d", "profile": "p",
        "enforced": [], "unenforced_reason": null, "host_records": 0, "claimed_records": 0,
        "damaged_lines": 0, "last_run": null, "drift": {"branch": "main", "ahead": 1}
    });
    assert_eq!(check(&doc, &shapes), Vec::<String>::new());
    assert_eq!(
        check(&doc, &opaque),
        ["drift: an object whose fields are not documented"]
    );
}
