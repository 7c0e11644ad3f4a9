//! `h5i box doctor NAME`: can the box still enforce its claim, and are its refs intact?
//!
//! Owns a read-only checkup: every check looks, none repairs (a tampered policy is refused, never
//! fixed; the mend is the user's). Must never: write to the box, its store or the parent.
//!
//! Guarded by `tests/box_lifecycle.rs` (`doctor_*`).

use h5i_broker::receipt_log::ReceiptLog;
use h5i_policy::{Tier, TierAvailability};

use crate::git::Git;
use crate::store::{load_policy, BoxSource, BoxStore};

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
            (t, TierAvailability::Available) => (true, format!("this host can still run {t}")),
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

    let pin = Git::at(&m.store)
        .args(["rev-parse", "--verify", "--quiet", &m.base_ref])
        .text()
        .unwrap_or_default();
    let pinned = pin == m.base;
    check(
        "pin",
        pinned,
        if pinned {
            format!("{} -> {}", m.base_ref, m.base)
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
    let alternates =
        std::fs::read_to_string(ws.join(".git/objects/info/alternates")).unwrap_or_default();
    let want = m.store.join("objects");
    let borrows = alternates
        .lines()
        .any(|l| std::path::Path::new(l.trim()) == want);
    check(
        "workspace",
        !ws.exists() || borrows,
        if !ws.exists() {
            "reclaimed (gc); manifest and receipts kept".to_string()
        } else if borrows {
            format!("its repository borrows {}", want.display())
        } else {
            format!("its .git/objects/info/alternates does not name {}; to fix: the box rewrote it — export, then recreate the box", want.display())
        },
    );

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
    Ok(checks)
}
