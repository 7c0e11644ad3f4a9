//! `h5i box diff NAME`: what changed against the pinned base, as git would show it.
//!
//! Owns printing the same tree the export gate starts from (a snapshot of the workspace against
//! the pinned base, built in host-private scratch). The box wrote those bytes, and they go to
//! the user's terminal: every line is redacted and its control characters escaped, so a file in
//! the box cannot send an escape sequence to the terminal. Must never: read the box's own index
//! or config, write objects into the parent repository, or print a raw box byte below 0x20.

use std::io::Write;

use crate::error::BoxError;
use crate::snapshot::{Snapshot, SnapshotObjects};
use crate::store::BoxStore;

/// Print the box's diff (or its stat) to stdout.
pub fn print_diff(store: &BoxStore, name: &str, stat: bool) -> Result<(), BoxError> {
    let sb = store.find(name)?;
    let snap = Snapshot::take(
        &sb.manifest.store,
        &sb.paths.workspace(),
        &sb.paths.scratch(),
        &sb.manifest.base,
        SnapshotObjects::Scratch,
    )?;
    let out = if stat {
        snap.stat(&sb.manifest.base)?
    } else {
        snap.patch(&sb.manifest.base)?
    };
    let policy = crate::store::load_policy(&sb)?;
    let redactor = crate::secrets::redactor_for(&policy);
    let mut stdout = std::io::stdout().lock();
    let mut write = || -> std::io::Result<()> {
        for line in out.split_inclusive(|b| *b == b'\n') {
            let body = line.strip_suffix(b"\n").unwrap_or(line);
            stdout.write_all(crate::export::gate::display_text(&redactor, body).as_bytes())?;
            if body.len() < line.len() {
                stdout.write_all(b"\n")?;
            }
        }
        stdout.flush()
    };
    write().map_err(|e| BoxError::io(std::path::Path::new("<stdout>"), e))
}
