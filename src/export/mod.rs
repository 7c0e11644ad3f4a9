//! `h5i box export NAME --out DIR`: the only way out of a box.
//!
//! Owns the export, in this order: refuse an `--out` that cannot be written (before any work);
//! snapshot the workspace through the [`gate::ExportGate`] (every changed path validated,
//! everything that must not leave excluded and reported); render `report.md` and `receipt.json`
//! ([`report`]); write the three files as one bundle, atomically ([`bundle`]).
//!
//! Must never: write anything under `--out` unless the whole bundle is there; overwrite a
//! non-empty `--out` without `force`; let a value the redactor knows reach any of the three files;
//! read the box's own `.git` (all git runs against the host-controlled store).
//!
//! Guarded by the unit tests in each submodule and `tests/export_gate.rs`.

pub mod bundle;
pub mod gate;
pub mod policy_change;
pub mod report;

use std::io;
use std::path::{Path, PathBuf};

use h5i_broker::receipt_log::ReceiptReadout;
use h5i_broker::redact::Redactor;

use crate::snapshot::{digest, SnapshotError, SnapshotObjects};

pub use bundle::BundleError;
pub use gate::{Exclusion, ExclusionReason, ExportCaps, ExportGate, GatedPatch};

/// Why an export refused. Every message says what and how to mend it.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// The workspace could not be snapshotted.
    #[error(transparent)]
    Snapshot(#[from] SnapshotError),
    /// The bundle could not be written.
    #[error(transparent)]
    Bundle(#[from] BundleError),
    /// The workspace itself could not be read.
    #[error("refusing: could not read the workspace {path}: {source}; to fix: check that the box's workspace exists and is readable by you")]
    Workspace {
        /// The directory.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// The patch is over the cap.
    #[error("refusing: the patch is {size} bytes, over the {cap}-byte export cap; to fix: drop generated or vendored files from the box (or add them to its .gitignore), or export the work in smaller pieces")]
    PatchTooLarge {
        /// The patch's size.
        size: u64,
        /// The cap.
        cap: u64,
    },
    /// The patch still matches the redactor after every exclusion.
    #[error("refusing: the patch still matches redaction rule(s) {} after every exclusion (through lines of the base around a change, or a deleted file); to fix: remove the value from the box's files, and from the base's lines next to the box's edits, then export again", .rules.join(", "))]
    SecretInPatch {
        /// The rule ids (never the value).
        rules: Vec<String>,
    },
    /// The report is over its cap even without the proposal.
    #[error("refusing: report.md would be {size} bytes without the agent's proposal, over its {cap}-byte cap (the safety sections are never cut); to fix: raise the report cap, or start a new box (a receipt log this long is a finding in itself)")]
    ReportTooLarge {
        /// The size it would have.
        size: usize,
        /// The cap.
        cap: usize,
    },
    /// The receipt is over its cap.
    #[error("refusing: receipt.json would be {size} bytes, over its {cap}-byte cap; to fix: raise the receipt cap, or inspect the log with `h5i box log` (a receipt log this long is a finding in itself)")]
    ReceiptTooLarge {
        /// The size it would have.
        size: usize,
        /// The cap.
        cap: usize,
    },
    /// A rendered file still matches the redactor.
    #[error("refusing: {file} still matches redaction rule(s) {} after redaction; to fix: report this as an h5i bug (nothing was written)", .rules.join(", "))]
    SecretInBundle {
        /// Which file.
        file: &'static str,
        /// The rule ids.
        rules: Vec<String>,
    },
    /// The workspace holds set-id files.
    #[error("refusing: set-user-id or set-group-id file(s) in the workspace, which would run as their owner on the host: {}; to fix: `chmod ug-s` them in the box (or remove them), then retry", .paths.join(", "))]
    SetId {
        /// The paths, for display (redacted, control characters escaped).
        paths: Vec<String>,
    },
    /// A file git itself reads while listing the tree (`.gitignore`, `.gitattributes`,
    /// `.gitmodules`) is not a plain file within the cap: git would block on a fifo or read a
    /// giant whole, so the snapshot is never started.
    #[error("refusing: {what}, which git reads while listing the tree; to fix: replace it in the box with a plain file (or remove it), then retry")]
    GitWouldBlock {
        /// The path and what it is, escaped.
        what: String,
    },
    /// `receipt.json` could not be encoded.
    #[error("refusing: receipt.json could not be encoded: {0}; to fix: report this as an h5i bug")]
    Encode(serde_json::Error),
}

/// Everything an export needs, gathered by the caller.
#[derive(Debug)]
pub struct ExportRequest<'a> {
    /// The box's name.
    pub box_name: &'a str,
    /// The host-controlled git dir holding the base's objects.
    pub store_git_dir: &'a Path,
    /// The pinned base commit (full id).
    pub base_sha: &'a str,
    /// The box's workspace.
    pub workspace: &'a Path,
    /// Host-private scratch for the snapshot.
    pub scratch: &'a Path,
    /// Where the bundle goes.
    pub out: &'a Path,
    /// Replace a non-empty `out`.
    pub force: bool,
    /// Size limits.
    pub caps: ExportCaps,
    /// Scrubs everything written.
    pub redactor: &'a Redactor,
    /// The box's receipt log, as read.
    pub receipts: &'a ReceiptReadout,
    /// The tier the box's policy resolved to.
    pub tier: &'a str,
    /// The policy digest stored at creation.
    pub policy_digest: &'a str,
    /// The agent's proposal (box-claimed), when one was staged.
    pub proposal: Option<String>,
    /// The profile the box was resolved from (whose policy a `.h5i/` change is compared on).
    pub box_profile: &'a str,
    /// Whether h5i bound the tee shim into the box (`crate::capture::tee_shim_wired`).
    pub tee_shim: bool,
    /// Why the shim is not the shell the agent runs its commands through, when it is not
    /// (`crate::container::check_shim_image`).
    pub shim_not_agent_shell: Option<&'a str>,
    /// Granted secrets not scanned for (`--skip-secret-check`), `NAME (env:VAR)`.
    pub unchecked_secrets: &'a [String],
}

/// What an export wrote.
#[derive(Debug, Clone)]
pub struct ExportSummary {
    /// The bundle directory.
    pub out: PathBuf,
    /// Files in the patch.
    pub files_changed: usize,
    /// Lines added.
    pub insertions: usize,
    /// Lines removed.
    pub deletions: usize,
    /// Files carried as binary patches.
    pub binary_files: usize,
    /// Paths kept out of the patch.
    pub excluded: Vec<Exclusion>,
    /// Receipt records carried.
    pub records: usize,
    /// Damaged receipt lines reported.
    pub damaged_lines: usize,
    /// SHA-256 of `patch.diff`.
    pub patch_sha256: String,
    /// Whether the agent's proposal was cut to fit `report.md`'s cap.
    pub proposal_truncated: bool,
    /// What the patch changes in the clone's `.h5i/` policy, if anything.
    pub policy_change: Option<policy_change::PolicyChange>,
}

/// Export a box: gate, render, write atomically.
pub fn export(req: &ExportRequest<'_>) -> Result<ExportSummary, ExportError> {
    export_with_hook(req, &mut |_| Ok(()))
}

/// [`export`], calling `after_file` after each bundle file is written; an error from it abandons
/// the export. A test seam for a failure between files.
#[doc(hidden)]
pub fn export_with_hook(
    req: &ExportRequest<'_>,
    after_file: &mut dyn FnMut(&str) -> io::Result<()>,
) -> Result<ExportSummary, ExportError> {
    bundle::preflight(req.out, req.force)?;
    let gate = ExportGate::new(req.redactor, req.caps);
    let snap = gate.take(
        req.store_git_dir,
        req.workspace,
        req.scratch,
        req.base_sha,
        SnapshotObjects::Scratch,
    )?;
    let gated = gate.check(&snap, req.workspace, req.base_sha)?;
    let policy_change = policy_change::detect(&snap, req.base_sha, req.box_profile)?;
    drop(snap);
    let patch_sha256 = digest::sha256_hex(&gated.patch);
    let notices = notices(req.unchecked_secrets, policy_change.as_ref());
    let input = report::ReportInput {
        box_name: req.box_name,
        tier: req.tier,
        base: req.base_sha,
        policy_digest: req.policy_digest,
        exported_at_ms: now_ms(),
        receipts: req.receipts,
        proposal: req.proposal.as_deref(),
        gated: &gated,
        patch_sha256: &patch_sha256,
        notices: &notices,
        tee_shim: req.tee_shim,
        shim_not_agent_shell: req.shim_not_agent_shell,
    };
    let rendered = report::render_report(&input, req.redactor, req.caps.report)?;
    let receipt = report::render_receipt(&input, req.redactor, req.caps.receipt)?;
    bundle::write_bundle(
        req.out,
        req.force,
        &[
            ("patch.diff", &gated.patch),
            ("report.md", rendered.text.as_bytes()),
            ("receipt.json", &receipt),
        ],
        after_file,
    )?;
    Ok(ExportSummary {
        out: req.out.to_path_buf(),
        files_changed: gated.files_changed,
        insertions: gated.insertions,
        deletions: gated.deletions,
        binary_files: gated.binary_files,
        excluded: gated.excluded,
        records: req.receipts.records.len(),
        damaged_lines: req.receipts.damaged.len(),
        patch_sha256,
        proposal_truncated: rendered.proposal_truncated,
        policy_change,
    })
}

/// What report.md must say before anything else: a secret scan that was skipped, and a change
/// to the clone's policy. Box-written text in them is escaped when the report renders them.
fn notices(unchecked: &[String], change: Option<&policy_change::PolicyChange>) -> Vec<String> {
    let mut out = Vec::new();
    if !unchecked.is_empty() {
        out.push(format!(
            "SECRET CHECK SKIPPED (--skip-secret-check): granted secret(s) {} could not be resolved in the exporting shell, so the patch, report and receipt were NOT scanned for them",
            unchecked.join(", ")
        ));
    }
    if let Some(c) = change {
        out.extend(c.lines());
    }
    out
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
