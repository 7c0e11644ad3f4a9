//! `h5i box compare A B`: two boxes side by side — what each is, the policy each actually had
//! (every field of the stored resolved policy), what each changed against its pinned base, and
//! the evidence each holds.
//!
//! Owns the comparison rows. The policies compared are the stored, digest-verified ones (a box
//! whose policy no longer matches its digest is refused, as every verb refuses it); the diffstats
//! are read under export's hold ([`crate::diff::snapshot_held`]): a box with a live run or shell
//! is shown as not read, with why, never read while it changes.
//!
//! Must never: change either box, print a box-chosen string unescaped, or present a figure it
//! could not read as zero. Guarded by the unit tests below and `tests/box_inspect.rs`.

use std::collections::BTreeMap;

use h5i_broker::receipt_log::ReceiptLog;
use h5i_policy::receipt::RecordBody;
use serde::Serialize;

use crate::error::BoxError;
use crate::store::{load_policy, BoxStore, StoredBox};

/// `h5i box compare A B --json`.
#[derive(Debug, Serialize)]
pub struct Comparison {
    /// [`crate::json_doc::COMPARE`].
    pub schema: &'static str,
    /// The two boxes, in the order given.
    pub boxes: [String; 2],
    /// One row per compared figure, grouped by section (`box`, `policy`, `diff`, `evidence`).
    pub rows: Vec<CompareRow>,
}

/// One figure of both boxes.
#[derive(Debug, Serialize, PartialEq)]
pub struct CompareRow {
    /// `box`, `policy`, `diff` or `evidence`.
    pub section: &'static str,
    /// The figure (`tier`; for the policy, the field's dotted path, e.g. `net.egress`).
    pub key: String,
    /// Its value in the first box (`-` where the box has none).
    pub a: String,
    /// Its value in the second box.
    pub b: String,
    /// Whether the two are equal.
    pub same: bool,
}

/// Compare the boxes called `a` and `b`.
pub fn compare(store: &BoxStore, a: &str, b: &str) -> Result<Comparison, BoxError> {
    if a == b {
        return Err(BoxError::BadRequest {
            what: format!("`{a}` compared with itself"),
            mend: "name two different boxes: h5i box compare A B".into(),
        });
    }
    let (sa, sb) = (store.find(a)?, store.find(b)?);
    let figures = [figures_of(&sa)?, figures_of(&sb)?];
    let mut rows = Vec::new();
    for section in ["box", "policy", "diff", "evidence"] {
        let keys: std::collections::BTreeSet<&String> = figures[0]
            .get(section)
            .into_iter()
            .chain(figures[1].get(section))
            .flat_map(|m| m.keys())
            .collect();
        let ordered = ordered_keys(section, keys);
        for key in ordered {
            let val = |i: usize| {
                figures[i]
                    .get(section)
                    .and_then(|m| m.get(&key))
                    .cloned()
                    .unwrap_or_else(|| "-".into())
            };
            let (va, vb) = (val(0), val(1));
            rows.push(CompareRow {
                section,
                same: va == vb,
                key,
                a: va,
                b: vb,
            });
        }
    }
    Ok(Comparison {
        schema: crate::json_doc::COMPARE,
        boxes: [a.to_string(), b.to_string()],
        rows,
    })
}

/// The `box` section in a fixed reading order; every other section sorted by key.
fn ordered_keys(section: &str, keys: std::collections::BTreeSet<&String>) -> Vec<String> {
    const BOX_ORDER: &[&str] = &["state", "tier", "agent", "source", "base", "policy digest"];
    let mut out: Vec<String> = keys.into_iter().cloned().collect();
    if section == "box" {
        out.sort_by_key(|k| BOX_ORDER.iter().position(|o| o == k).unwrap_or(usize::MAX));
    }
    out
}

type Figures = BTreeMap<&'static str, BTreeMap<String, String>>;

fn figures_of(sb: &StoredBox) -> Result<Figures, BoxError> {
    let m = &sb.manifest;
    let policy = load_policy(sb)?;
    let mut out = Figures::new();
    out.insert(
        "box",
        BTreeMap::from([
            ("state".to_string(), m.state.as_str().to_string()),
            ("tier".to_string(), m.tier.clone()),
            ("agent".to_string(), m.agent.clone()),
            ("source".to_string(), m.source.label()),
            ("base".to_string(), m.base.clone()),
            ("policy digest".to_string(), m.policy_digest.clone()),
        ]),
    );
    let mut flat = BTreeMap::new();
    let value = serde_json::to_value(&policy).map_err(|e| BoxError::BadRequest {
        what: format!("box `{}`'s policy could not be read as data: {e}", m.name),
        mend: format!("`h5i box doctor {}` looks at its stored policy", m.name),
    })?;
    flatten("", &value, &mut flat);
    out.insert("policy", flat);
    out.insert("diff", diff_figures(sb));
    out.insert("evidence", evidence_figures(sb)?);
    Ok(out)
}

/// Every leaf of `v` under its dotted path; an array of scalars is one comma-joined value, an
/// array of tables is numbered (`auth.0.host`).
fn flatten(prefix: &str, v: &serde_json::Value, out: &mut BTreeMap<String, String>) {
    use serde_json::Value;
    let join = |k: &str| match prefix.is_empty() {
        true => k.to_string(),
        false => format!("{prefix}.{k}"),
    };
    match v {
        Value::Object(map) => {
            if map.is_empty() {
                out.insert(prefix.to_string(), "{}".into());
            }
            for (k, v) in map {
                flatten(&join(k), v, out);
            }
        }
        Value::Array(items) if items.iter().all(|i| !i.is_object() && !i.is_array()) => {
            let parts: Vec<String> = items.iter().map(scalar).collect();
            out.insert(prefix.to_string(), format!("[{}]", parts.join(", ")));
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                flatten(&join(&i.to_string()), v, out);
            }
        }
        other => {
            out.insert(prefix.to_string(), scalar(other));
        }
    }
}

fn scalar(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Null => "none".into(),
        other => other.to_string(),
    }
}

fn diff_figures(sb: &StoredBox) -> BTreeMap<String, String> {
    let not_read =
        |why: String| BTreeMap::from([("changes".to_string(), format!("not read: {why}"))]);
    if !sb.paths.workspace().exists() {
        return not_read("the workspace was reclaimed".into());
    }
    let snap = match crate::diff::snapshot_held(sb) {
        Ok((snap, _unread)) => snap,
        Err(BoxError::Busy { .. }) => {
            return not_read("a run or shell of the box is live; compare again when it ends".into())
        }
        Err(e) => return not_read(e.to_string()),
    };
    let changes = match snap.changes_against(&sb.manifest.base) {
        Ok(c) => c,
        Err(e) => return not_read(e.to_string()),
    };
    let mut counts = BTreeMap::from([
        ("files added".to_string(), 0u64),
        ("files modified".to_string(), 0),
        ("files deleted".to_string(), 0),
        ("files retyped".to_string(), 0),
    ]);
    for c in &changes {
        let key = match c.status {
            b'A' => "files added",
            b'D' => "files deleted",
            b'T' => "files retyped",
            _ => "files modified",
        };
        if let Some(n) = counts.get_mut(key) {
            *n += 1;
        }
    }
    let mut out: BTreeMap<String, String> = counts
        .into_iter()
        .map(|(k, n)| (k, n.to_string()))
        .collect();
    let (ins, del) = match snap.stat(&sb.manifest.base) {
        Ok(text) => stat_summary(&String::from_utf8_lossy(&text)),
        Err(_) => (None, None),
    };
    out.insert(
        "lines inserted".into(),
        ins.map_or("not read".into(), |n| n.to_string()),
    );
    out.insert(
        "lines deleted".into(),
        del.map_or("not read".into(), |n| n.to_string()),
    );
    out
}

/// Insertions and deletions from git's `--stat` summary line (`N files changed, I insertions(+),
/// D deletions(-)`); an empty diff has no summary line and counts zero of each.
fn stat_summary(text: &str) -> (Option<u64>, Option<u64>) {
    let Some(last) = text.lines().rev().find(|l| !l.trim().is_empty()) else {
        return (Some(0), Some(0));
    };
    if !last.contains("changed") {
        return (None, None);
    }
    let count = |word: &str| -> u64 {
        last.split(',')
            .find(|part| part.contains(word))
            .and_then(|part| part.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    (Some(count("insertion")), Some(count("deletion")))
}

fn evidence_figures(sb: &StoredBox) -> Result<BTreeMap<String, String>, BoxError> {
    let readout = ReceiptLog::at(sb.paths.receipts()).read()?;
    let (mut host, mut claimed, mut runs, mut failed, mut denied, mut oom) = (0, 0, 0, 0, 0, 0);
    let mut last_exit = None;
    for r in &readout.records {
        match r.lane.is_host_observed() {
            true => host += 1,
            false => claimed += 1,
        }
        if let RecordBody::Run {
            exit,
            egress,
            oom: o,
            ..
        } = &r.body
        {
            if !r.lane.is_host_observed() {
                continue;
            }
            runs += 1;
            let code = exit.passthrough_code();
            if code != 0 {
                failed += 1;
            }
            last_exit = Some(code);
            denied += egress
                .as_ref()
                .map_or(0, |t| t.denied.values().sum::<u64>());
            oom += o.as_ref().map_or(0, |o| o.kill_count);
        }
    }
    Ok(BTreeMap::from([
        ("receipts host-observed".to_string(), host.to_string()),
        ("receipts box-claimed".to_string(), claimed.to_string()),
        (
            "receipt lines damaged".to_string(),
            readout.damaged.len().to_string(),
        ),
        ("runs".to_string(), runs.to_string()),
        ("runs failed".to_string(), failed.to_string()),
        (
            "last exit".to_string(),
            last_exit.map_or("-".into(), |c: i32| c.to_string()),
        ),
        ("egress denied".to_string(), denied.to_string()),
        ("oom kills".to_string(), oom.to_string()),
    ]))
}

impl Comparison {
    /// A table: one escaped line per row, `*` marking the rows that differ.
    pub fn lines(&self) -> Vec<String> {
        let width = self
            .rows
            .iter()
            .map(|r| r.key.chars().count())
            .max()
            .unwrap_or(0)
            .max(8);
        let awidth = self
            .rows
            .iter()
            .map(|r| r.a.chars().count())
            .chain([self.boxes[0].chars().count()])
            .max()
            .unwrap_or(0)
            .min(48);
        let mut out = vec![format!(
            "  {:<width$}  {:<awidth$}  {}",
            "", self.boxes[0], self.boxes[1]
        )];
        let mut section = "";
        for r in &self.rows {
            if r.section != section {
                section = r.section;
                out.push(format!("[{section}]"));
            }
            out.push(format!(
                "{} {:<width$}  {:<awidth$}  {}",
                if r.same { ' ' } else { '*' },
                r.key,
                r.a,
                r.b
            ));
        }
        let differ = self.rows.iter().filter(|r| !r.same).count();
        out.push(format!(
            "{differ} of {} figures differ (*)",
            self.rows.len()
        ));
        out.into_iter()
            .map(|l| crate::escape::escape_controls(&l))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stat_summary_is_read_from_gits_last_line() {
        let text =
            " a.txt | 3 ++-\n b.txt | 1 -\n 2 files changed, 2 insertions(+), 2 deletions(-)\n";
        assert_eq!(stat_summary(text), (Some(2), Some(2)));
        assert_eq!(
            stat_summary(" 1 file changed, 1 insertion(+)\n"),
            (Some(1), Some(0))
        );
        assert_eq!(stat_summary(""), (Some(0), Some(0)));
        assert_eq!(stat_summary("garbage\n"), (None, None));
    }

    #[test]
    fn a_policy_flattens_to_dotted_leaves() {
        let v = serde_json::json!({
            "tier": "process",
            "net": {"egress": ["a.test:443", "b.test:443"], "unix": false},
            "auth": [{"host": "api.example.com"}],
            "services": {}
        });
        let mut out = BTreeMap::new();
        flatten("", &v, &mut out);
        assert_eq!(out["tier"], "process");
        assert_eq!(out["net.egress"], "[a.test:443, b.test:443]");
        assert_eq!(out["net.unix"], "false");
        assert_eq!(out["auth.0.host"], "api.example.com");
        assert_eq!(out["services"], "{}");
    }

    #[test]
    fn a_table_escapes_what_a_box_chose_and_marks_differences() {
        let c = Comparison {
            schema: crate::json_doc::COMPARE,
            boxes: ["a".into(), "b".into()],
            rows: vec![
                CompareRow {
                    section: "box",
                    key: "tier".into(),
                    a: "process".into(),
                    b: "process".into(),
                    same: true,
                },
                CompareRow {
                    section: "diff",
                    key: "changes".into(),
                    a: "not read: \u{1b}]0;pwned\u{7}".into(),
                    b: "-".into(),
                    same: false,
                },
            ],
        };
        let lines = c.lines();
        assert!(lines
            .iter()
            .all(|l| !l.chars().any(crate::escape::is_control)));
        assert!(lines.iter().any(|l| l.starts_with("* changes")));
        assert_eq!(
            lines.last().map(String::as_str),
            Some("1 of 2 figures differ (*)")
        );
    }
}
