//! What the box's browser sends between runs: at the supervised tier the box-lifetime browser
//! (`crate::browser::sidecar`) lives in the network of the box's sandbox, whose pinned table
//! counts per run (each run's `begin` takes a reading of the counters and its `end` puts what
//! they counted since into the run's receipt). A page the browser keeps open goes on dialling
//! while no run is active, and those dials would fall between two tallies.
//!
//! Called by the sandbox (`crate::sandbox`) around each run, so it stands beside the tiers, not
//! among the browser's verbs: it names `crate::supervised` and `crate::browser_box`, never
//! `crate::browser` (`tests/module_layers.rs`).
//!
//! Owns the idle window of a browser box's sandbox network: [`open`] right after a run's `end`
//! marks it (the sentry keeps that `end`'s reading as its baseline, so the window counts from
//! the run's last reading, with no request of its own; the table and its pins stay in force,
//! so the same destinations stay reachable), [`close`] just before the next run's `begin`, or
//! before the sandbox is torn down, asks the sentry for one more `end` (what the table counted
//! since the run's) and writes it into a host-observed `browser` record that follows the box's
//! last record. The window is marked by `idle.since` in the sandbox's net directory
//! (host-only, like the rest of it).
//!
//! Must never: open a window on a network no run has ended on (its counts are a run's), take a
//! window's counts into a run's receipt, or write a record for a window that counted nothing
//! (every window is read; only one with counts becomes a record).
//!
//! Guarded by `tests/browser.rs` (`the_browsers_traffic_between_runs_is_in_a_browser_record`).

use std::path::{Path, PathBuf};

use h5i_policy::receipt::{ReceiptLane, RecordBody};
use h5i_policy::ResolvedPolicy;

use crate::error::BoxError;
use crate::store::{now_ms, StoredBox};

fn marker(net: &Path) -> PathBuf {
    net.join("idle.since")
}

/// After a run of `policy`'s box ended on the sandbox network `net` (its tally read): when the
/// box's browser lives in that network, mark the window (the sentry counts it from that `end`'s
/// reading). A failure is said on stderr and leaves no window (the next run's `begin` takes its
/// own reading).
pub fn open(policy: &ResolvedPolicy, net: &Path) {
    if !crate::browser_box::lives_for_the_box(policy) {
        return;
    }
    let path = marker(net);
    let opened = std::fs::write(&path, now_ms().to_string()).map_err(|e| BoxError::io(&path, e));
    if let Err(e) = opened {
        eprintln!("h5i: warning: the browser's traffic until the next run is not counted: {e}");
    }
}

/// Before the next `begin` on the sandbox network `net` of `sb` (or its teardown): read the
/// open window, if any, and record what it counted.
pub fn close(sb: &StoredBox, net: &Path) -> Result<(), BoxError> {
    let path = marker(net);
    let Ok(since) = std::fs::read_to_string(&path) else {
        return Ok(());
    };
    std::fs::remove_file(&path).map_err(|e| BoxError::io(&path, e))?;
    let since_ms = since.trim().parse().unwrap_or(0);
    let tally = crate::supervised::end(net).map_err(|why| BoxError::BadRequest {
        what: format!(
            "the box's sandbox did not answer what its browser sent between runs ({why})"
        ),
        mend: format!("`h5i box abort {}` rebuilds the sandbox", sb.manifest.name),
    })?;
    let egress = tally.egress;
    if egress
        .allowed
        .values()
        .chain(egress.denied.values())
        .all(|n| *n == 0)
    {
        return Ok(());
    }
    let after_seq = h5i_broker::receipt_log::ReceiptLog::at(sb.paths.receipts())
        .read()
        .ok()
        .and_then(|r| r.records.last().map(|l| l.seq))
        .unwrap_or(0);
    crate::browser_box::append_record(
        sb,
        ReceiptLane::HostEnvRun,
        Vec::new(),
        RecordBody::Browser {
            after_seq,
            since_ms,
            egress,
        },
    )
}
