//! `h5i box export NAME --out DIR`: the verb around the export gate.
//!
//! Owns gathering a box's export request from its store, in this order: take the box's lock
//! exclusively, load its verified policy, check every granted secret can be scanned for (or
//! that the human said to skip), hold the box's services still, read the receipt log and the
//! agent's staged proposal, run [`crate::export::export`], and append the `exported` event.
//! The gate itself ([`crate::export`]) knows nothing of stores, locks or boxes' errors: its
//! [`ExportError`](crate::export::ExportError) is wrapped by [`BoxError`], never the reverse.
//!
//! Must never: read the tree while a service of the box runs, or follow a symlink the box
//! staged as its proposal.
//!
//! Guarded by `tests/export_gate.rs` and `tests/export_race.rs`.

use std::io;
use std::path::Path;

use h5i_broker::receipt_log::ReceiptLog;

use crate::error::BoxError;
use crate::export::{export, ExportCaps, ExportRequest, ExportSummary};

/// Largest proposal the box may stage, bytes.
pub const MAX_PROPOSAL_BYTES: u64 = 1 << 20;

/// The agent's proposal, as the box staged it at `<spool>/proposal.md` (box-claimed; a regular
/// file only, never through a symlink, capped). The report escapes and redacts it.
fn read_proposal(spool: &Path) -> Result<Option<String>, BoxError> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let path = spool.join(h5i_hook::spool::PROPOSAL_FILE);
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(&path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Ok(Some(
                "(the box staged proposal.md as a symlink; h5i did not follow it)".into(),
            ))
        }
        Err(e) => return Err(BoxError::io(&path, e)),
    };
    let meta = file.metadata().map_err(|e| BoxError::io(&path, e))?;
    if !meta.is_file() {
        return Ok(Some(
            "(the box staged proposal.md as something other than a file)".into(),
        ));
    }
    let mut bytes = Vec::new();
    file.take(MAX_PROPOSAL_BYTES)
        .read_to_end(&mut bytes)
        .map_err(|e| BoxError::io(&path, e))?;
    let mut text = String::from_utf8_lossy(&bytes).into_owned();
    if meta.len() > MAX_PROPOSAL_BYTES {
        text.push_str(&format!(
            "\n\n(truncated by h5i at {MAX_PROPOSAL_BYTES} bytes of {})",
            meta.len()
        ));
    }
    Ok(Some(text))
}

/// What a human asked `box export` for beyond the default.
#[derive(Debug, Clone, Copy, Default)]
pub struct ExportOptions {
    /// Replace a non-empty `--out`.
    pub force: bool,
    /// Export although a granted secret cannot be resolved in this shell (`--skip-secret-check`);
    /// report.md says so in its first lines.
    pub skip_secret_check: bool,
}

/// `h5i box export NAME --out DIR`: gather the box's request from its store and export it.
pub fn export_box(
    store: &crate::store::BoxStore,
    name: &str,
    out: &Path,
    opts: ExportOptions,
) -> Result<ExportSummary, BoxError> {
    let sb = store.find(name)?;
    let _lock = crate::store::BoxLock::take(&sb.paths, name)?;
    let policy = crate::store::load_policy(&sb)?;
    let scan = crate::secrets::redactor_for_export(&policy, opts.skip_secret_check, "export")?;
    // The box's services are held still while the tree is read; thawed when this returns.
    let _frozen = crate::freeze::hold(&sb)?;
    // A viewer killed mid-session gets its ending before the log is read.
    crate::browser::view_sessions::close_orphans(&sb)?;
    let receipts = ReceiptLog::at(sb.paths.receipts()).read()?;
    let workspace = sb.paths.workspace();
    let scratch = sb.paths.scratch();
    let shim_not_agent_shell =
        crate::container::image::read_pin(&sb.paths.dir.join(crate::container::image::PIN_FILE))?
            .and_then(|pin| pin.shim_not_agent_shell);
    let summary = export(&ExportRequest {
        box_name: name,
        store_git_dir: &sb.manifest.store,
        base_sha: &sb.manifest.base,
        workspace: &workspace,
        scratch: &scratch,
        out,
        force: opts.force,
        caps: ExportCaps::default(),
        redactor: &scan.redactor,
        receipts: &receipts,
        tier: &sb.manifest.tier,
        policy_digest: &sb.manifest.policy_digest,
        proposal: read_proposal(&sb.paths.spool())?,
        box_profile: &policy.profile,
        tee_shim: crate::capture::tee_shim_wired(&policy),
        shim_not_agent_shell: shim_not_agent_shell.as_deref(),
        unchecked_secrets: &scan.unchecked,
    })?;
    crate::events::append(
        &sb.paths,
        &crate::events::Event::new(
            "exported",
            format!(
                "{} file(s), {} excluded, patch sha256 {}",
                summary.files_changed,
                summary.excluded.len(),
                summary.patch_sha256
            ),
        ),
    )?;
    Ok(summary)
}
