//! `h5i box doctor NAME`: can the box still enforce its claim, and are its refs intact?
//!
//! Owns a read-only checkup: every check looks, none repairs (a tampered policy is refused, never
//! fixed; the mend is the user's). Workspace bytes are read only through `crate::bounded`
//! (the `alternates` file, a scan for set-id files). Must never: write to the box, its store or
//! the parent; follow a symlink or open a fifo the box planted.
//!
//! Guarded by `tests/box_lifecycle.rs` (`doctor_*`).

use h5i_broker::receipt_log::ReceiptLog;
use h5i_policy::{Tier, TierAvailability};

use crate::bounded::Finding;
use crate::export::ExportCaps;
use crate::git::Git;
use crate::store::{load_policy, BoxSource, BoxStore};

/// The largest `alternates` file doctor reads: a few paths, never more.
const ALTERNATES_CAP: u64 = 64 << 10;

/// One check and what it found.
#[derive(Debug, Clone)]
pub struct Check {
    /// What was checked.
    pub what: &'static str,
    /// Whether it holds.
    pub ok: bool,
    /// What was found, and the mend when it does not hold.
    pub detail: String,
}

/// Run every check on the box called `name` (an unknown box is the only refusal).
pub fn doctor(store: &BoxStore, name: &str) -> Result<Vec<Check>, crate::error::BoxError> {
    let sb = store.find(name)?;
    let m = &sb.manifest;
    let mut checks = Vec::new();
    let mut check = |what, ok, detail: String| checks.push(Check { what, ok, detail });

    let policy = load_policy(&sb);
    check(
        "policy",
        policy.is_ok(),
        match &policy {
            Ok(_) => format!("policy.resolved.toml matches {}", m.policy_digest),
            Err(e) => e.to_string(),
        },
    );

    if let Ok(p) = &policy {
        let tiers = crate::probe::host_tiers();
        let (ok, detail) = match (p.tier, tiers.availability(p.tier)) {
            (Tier::Workspace, _) => (true, "workspace: nothing to enforce".to_string()),
            (t, TierAvailability::Available | TierAvailability::OnRequest(_)) => {
                (true, format!("this host can still run {t}"))
            }
            (t, TierAvailability::Unavailable(why)) => (
                false,
                format!("this host can no longer run {t}: {why}; to fix: restore it (h5i box probe), or recreate the box at a tier the host can run"),
            ),
        };
        check("tier", ok, detail);
    }

    let base_here = Git::at(&m.store)
        .args(["cat-file", "-e", &format!("{}^{{commit}}", m.base)])
        .succeeds()
        .unwrap_or(false);
    check(
        "base",
        base_here,
        if base_here {
            format!("{} is in {}", m.base, m.store.display())
        } else {
            format!("{} is missing from {}; to fix: the store lost it (gc?): export what you can, then `h5i box rm --force {name}`", m.base, m.store.display())
        },
    );

    let rebase = crate::rebase::interrupted(&sb);
    check(
        "rebase",
        matches!(rebase, Ok(None)),
        match &rebase {
            Ok(None) => "no rebase interrupted".to_string(),
            Ok(Some(j)) => format!("a rebase from {} onto {} was interrupted, so the workspace is between the two; to fix: `h5i box rebase {name}` finishes it", j.from, j.to),
            Err(e) => e.to_string(),
        },
    );

    let pin = Git::at(&m.store)
        .args(["rev-parse", "--verify", "--quiet", &m.base_ref])
        .text()
        .unwrap_or_default();
    let pinned = pin == m.base;
    let rebased_to = rebase.ok().flatten().map(|j| j.to);
    check(
        "pin",
        pinned,
        if pinned {
            format!("{} -> {}", m.base_ref, m.base)
        } else if rebased_to.as_ref() == Some(&pin) {
            format!("{} is at {pin}, where the interrupted rebase moved it (manifest says {}); to fix: `h5i box rebase {name}` finishes it", m.base_ref, m.base)
        } else if pin.is_empty() {
            format!(
                "{} is gone; to fix: `git update-ref {} {}` in the store",
                m.base_ref, m.base_ref, m.base
            )
        } else {
            format!("{} moved to {pin} (manifest says {}); to fix: find who moved it, then `git update-ref {} {}`", m.base_ref, m.base, m.base_ref, m.base)
        },
    );

    let ws = sb.paths.workspace();
    let want = m.store.join("objects");
    let alternates = crate::bounded::read_beneath(
        &ws,
        std::path::Path::new(".git/objects/info/alternates"),
        ALTERNATES_CAP,
    );
    let (ok, detail) = match &alternates {
        _ if !ws.exists() => (true, "reclaimed (gc); manifest and receipts kept".to_string()),
        Ok(text) if String::from_utf8_lossy(text)
            .lines()
            .any(|l| std::path::Path::new(l.trim()) == want) =>
        {
            (true, format!("its repository borrows {}", want.display()))
        }
        Ok(_) => (false, format!("its .git/objects/info/alternates does not name {}; to fix: the box rewrote it — export, then recreate the box", want.display())),
        Err(skip) => (false, format!("its .git/objects/info/alternates is {skip}, so h5i did not read it; to fix: the box replaced it — export, then recreate the box")),
    };
    check("workspace", ok, detail);

    if ws.exists() {
        let (ok, detail) = match crate::bounded::scan_tree(&ws, ExportCaps::default().per_file) {
            Ok(scan) => {
                let setid: Vec<String> = scan
                    .setid()
                    .map(|f| format!("{} ({})", crate::escape::bytes(&f.path), f.what))
                    .collect();
                let mut rest: Vec<String> = scan
                    .found
                    .iter()
                    .filter(|f| !matches!(f.what, Finding::SetId { .. }))
                    .map(|f| format!("{}: {}", crate::escape::bytes(&f.path), f.what))
                    .collect();
                rest.extend(scan.stopped.iter().cloned());
                let rest = if rest.is_empty() {
                    String::new()
                } else {
                    format!("; also not read: {}", rest.join("; "))
                };
                if setid.is_empty() {
                    (
                        true,
                        format!("no set-id file among {} entries{rest}", scan.entries),
                    )
                } else {
                    (false, format!("set-id file(s) in the workspace: {}; anyone who can reach them runs them as their owner; to fix: `chmod ug-s` them (or `h5i box rm --force {name}`), and never run them{rest}", setid.join(", ")))
                }
            }
            Err(skip) => (
                false,
                format!("the workspace is {skip}; nothing in it was read"),
            ),
        };
        check("set-id", ok, detail);
    }

    if let BoxSource::Worktree {
        parent_branch: Some(b),
        ..
    } = &m.source
    {
        let tip = Git::at(&store.common_dir)
            .args([
                "rev-parse",
                "--verify",
                "--quiet",
                &format!("refs/heads/{b}"),
            ])
            .text()
            .unwrap_or_default();
        check(
            "parent",
            !tip.is_empty(),
            if tip.is_empty() {
                format!("the parent branch `{b}` is gone; apply and rebase will refuse; export still works")
            } else {
                format!("parent branch `{b}` at {tip}")
            },
        );
    }

    let readout = ReceiptLog::at(sb.paths.receipts()).read();
    let (ok, detail) = match readout {
        Ok(r) if r.damaged.is_empty() => (true, format!("{} record(s), no damaged line", r.records.len())),
        Ok(r) => (
            false,
            format!(
                "{} record(s); damaged line(s) {}: kept and reported, never dropped; export shows them under Evidence problems",
                r.records.len(),
                r.damaged.iter().map(|d| d.line.to_string()).collect::<Vec<_>>().join(", ")
            ),
        ),
        Err(e) => (false, e.to_string()),
    };
    check("receipts", ok, detail);

    // The rootful supervised uplink's host-side state outlives a killed sentry until swept.
    let stale = h5i_hook::veth::stale();
    if !stale.is_empty() {
        check(
            "host network",
            false,
            format!(
                "a killed supervised network left {}; the next supervised run or `h5i box abort` of any box clears it",
                stale.join(", ")
            ),
        );
    }
    Ok(checks)
}
