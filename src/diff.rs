//! `h5i box diff NAME`: what changed against the pinned base, as git would show it.
//!
//! Owns printing the same tree the export gate starts from (a snapshot of the workspace against
//! the pinned base, built in host-private scratch). Must never: read the box's own index or
//! config, or write objects into the parent repository.

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
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(&out)
        .and_then(|_| stdout.flush())
        .map_err(|e| BoxError::io(std::path::Path::new("<stdout>"), e))
}
