//! `h5i box abort`, `rm` and `gc`: ending a box.
//!
//! Owns what is kept and what is reclaimed. `abort` keeps everything (forensics), `gc` reclaims
//! the workspaces of applied and aborted boxes but keeps their manifests, receipts and events,
//! `rm` removes a box whole, including its pin ref. Must never: remove a box with changes nobody
//! exported unless told `--force`, or touch any ref but the box's own pin.

use std::fs;
use std::time::{Duration, SystemTime};

use crate::error::BoxError;
use crate::events::{self, Event};
use crate::store::{require_active, write_manifest, BoxLock, BoxState, BoxStore, StoredBox};

/// Stop a box: no further runs; its manifest and workspace stay for forensics.
pub fn abort(store: &BoxStore, name: &str) -> Result<StoredBox, BoxError> {
    let mut sb = store.find(name)?;
    let _lock = BoxLock::take(&sb.paths, name)?;
    require_active(&sb, "abort")?;
    // Its services end first; each supervisor records the exit before this returns.
    crate::service::stop_all(&sb)?;
    crate::sandbox::teardown(&sb)?;
    crate::microvm::teardown(&sb)?;
    reap_if_container(&sb);
    sb.manifest.state = BoxState::Aborted;
    write_manifest(&sb.paths, &sb.manifest)?;
    events::append(
        &sb.paths,
        &Event::new("aborted", "stopped by the user".into()),
    )?;
    Ok(sb)
}

/// A container box's runs whose h5i was killed keep running under conmon until reaped: ending
/// the box reaps them (with any other box's orphans on this engine).
fn reap_if_container(sb: &StoredBox) {
    if sb.manifest.tier == h5i_policy::Tier::Container.as_str() {
        crate::container::reap_orphaned_runs();
    }
}

/// Why the box's tree cannot be removed without `--force`: empty when it matches its pinned
/// base and holds nothing h5i could not read. Reads the workspace through the bounded snapshot
/// ([`crate::diff::snapshot_bounded`]): a file over the cap, a fifo, a set-id file or a
/// `.gitignore` git would block on is named, never read, and counts as a change.
pub fn unexported(sb: &StoredBox) -> Result<Vec<String>, BoxError> {
    if !sb.paths.workspace().is_dir() {
        return Ok(Vec::new());
    }
    let (snap, unread) = match crate::diff::snapshot_bounded(sb) {
        Ok(s) => s,
        Err(BoxError::HostileWorkspace { what, .. }) => return Ok(vec![what]),
        Err(e) => return Err(e),
    };
    let mut why = unread.lines();
    let changed = snap.changes_against(&sb.manifest.base)?.len();
    if changed > 0 {
        why.insert(0, format!("{changed} changed path(s)"));
    }
    Ok(why)
}

/// Remove a box entirely. An active box with unexported changes needs `force`.
pub fn rm(store: &BoxStore, name: &str, force: bool) -> Result<(), BoxError> {
    let sb = store.find(name)?;
    let lock = BoxLock::take_mid_rebase(&sb.paths, name)?;
    // Held still while the has-changes check reads the tree; thawed before the services stop.
    let frozen = crate::freeze::hold(&sb)?;
    if !force && sb.manifest.state == BoxState::Active {
        let why = unexported(&sb)?;
        if !why.is_empty() {
            return Err(BoxError::Unexported {
                name: name.to_string(),
                detail: format!(" ({})", why.join("; ")),
            });
        }
    }
    drop(frozen);
    // The name's claim, held while the pin goes, so a create of the name cannot write it
    // meanwhile; a killed rm's claim is reclaimed by the next verb that wants the name.
    let claim = store
        .claim_name(&agent_of(&sb.paths), name)?
        .ok_or_else(|| BoxError::Busy {
            name: name.to_string(),
        })?;
    crate::service::stop_all(&sb)?;
    crate::sandbox::teardown(&sb)?;
    crate::microvm::teardown(&sb)?;
    reap_if_container(&sb);
    // The box directory is renamed out of the store first, so a crash mid-delete never leaves a
    // half-removed box that `ls` would show; its lock goes with it, held to the end, so `gc`
    // tells a removal in flight from one whose h5i was killed.
    let doomed = sb
        .paths
        .dir
        .with_file_name(format!("{REMOVING_PREFIX}{name}-{}", std::process::id()));
    fs::rename(&sb.paths.dir, &doomed).map_err(|e| BoxError::io(&sb.paths.dir, e))?;
    drop_pin(store, &sb.manifest)?;
    remove_tree(&doomed).map_err(|e| BoxError::io(&doomed, e))?;
    claim.release()?;
    drop(lock);
    Ok(())
}

/// Remove a box's tree, which a box may have left with directories its owner cannot write
/// (Go's module cache under HOME is 0555 by design; a non-root caller then cannot unlink their
/// entries) or even read (overlayfs leaves its `work/work` at mode 0 in an upper layer's work
/// directory). When the plain removal fails, every directory of the tree the caller owns gets
/// u+rwx, each opened `O_PATH | O_NOFOLLOW | O_DIRECTORY` and changed and listed through its
/// descriptor (a symlink is never followed, nothing outside `dir` is touched), and the removal
/// is tried once more.
pub fn remove_tree(dir: &std::path::Path) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    if fs::remove_dir_all(dir).is_ok() {
        return Ok(());
    }
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(f) = fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_NOFOLLOW | libc::O_DIRECTORY)
            .open(&d)
        else {
            continue;
        };
        // The directory itself, through its descriptor: a directory swapped for a symlink
        // since is neither changed nor read.
        let at = format!("/proc/self/fd/{}", f.as_raw_fd());
        if let Ok(meta) = f.metadata() {
            if meta.permissions().mode() & 0o700 != 0o700 {
                let _ = fs::set_permissions(
                    &at,
                    fs::Permissions::from_mode((meta.permissions().mode() | 0o700) & 0o7777),
                );
            }
        }
        let Ok(rd) = fs::read_dir(&at) else {
            continue;
        };
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(d.join(e.file_name()));
            }
        }
    }
    fs::remove_dir_all(dir)
}

/// What `rm` and `gc` name the directory of a box being removed.
const REMOVING_PREFIX: &str = ".removing-";

/// The agent directory a box lives in (`.git/.h5i/env/AGENT/NAME`).
fn agent_of(paths: &crate::store::BoxPaths) -> String {
    paths
        .dir
        .parent()
        .and_then(|a| a.file_name())
        .map(|a| a.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The pin of a box that is no longer in the store (the caller holds its name's claim). A
/// detached box's pin lives in its own `base.git` and goes with the directory.
fn drop_pin(store: &BoxStore, m: &crate::store::Manifest) -> Result<(), BoxError> {
    if m.source.is_detached() {
        return Ok(());
    }
    store.drop_orphan_pin(&m.name)
}

/// A `.removing-*` directory whose `rm` was killed (its lock is free): its pin, when the name's
/// claim can be had (a verb holding the name owns the pin now), and the rest.
fn reclaim_removal(store: &BoxStore, dir: &std::path::Path) -> Result<bool, BoxError> {
    let lock = dir.join("lock");
    let Ok(file) = fs::OpenOptions::new().write(true).open(&lock) else {
        return Ok(false);
    };
    if file.try_lock().is_err() {
        return Ok(false);
    }
    if let Ok(bytes) = fs::read(dir.join("manifest.json")) {
        if let Ok(m) = serde_json::from_slice::<crate::store::Manifest>(&bytes) {
            let removing = crate::store::BoxPaths {
                dir: dir.to_path_buf(),
            };
            if let Some(claim) = store.claim_unowned_name(&agent_of(&removing), &m.name)? {
                drop_pin(store, &m)?;
                claim.release()?;
            }
        }
    }
    remove_tree(dir).map_err(|e| BoxError::io(dir, e))?;
    Ok(true)
}

/// The agent directory `gc` claims a name in to drop its orphan pin (any agent's would do: a
/// claim is seen from every agent's directory).
const ORPHAN_CLAIM_AGENT: &str = "none";

/// Pins in the parent repository that no box owns (a verb killed between the ref and the
/// directory), each dropped under its name's claim. Returns how many went.
fn sweep_orphan_pins(store: &BoxStore) -> Result<usize, BoxError> {
    let mut dropped = 0;
    for name in store.pinned_names()? {
        if store.find(&name).is_ok() {
            continue;
        }
        if let Some(claim) = store.claim_unowned_name(ORPHAN_CLAIM_AGENT, &name)? {
            store.drop_orphan_pin(&name)?;
            claim.release()?;
            dropped += 1;
        }
    }
    Ok(dropped)
}

/// What `gc` reclaimed.
#[derive(Debug, Default)]
pub struct GcReport {
    /// Boxes whose workspace was removed.
    pub reclaimed: Vec<String>,
    /// Leftovers of interrupted creates or removals that were deleted.
    pub leftovers: usize,
}

/// Reclaim applied and aborted workspaces, and leftovers of interrupted verbs older than an hour.
pub fn gc(store: &BoxStore) -> Result<GcReport, BoxError> {
    let mut report = GcReport::default();
    for sb in store.list()? {
        if sb.manifest.state == BoxState::Active || !sb.paths.workspace().exists() {
            continue;
        }
        let Ok(_lock) = BoxLock::take(&sb.paths, &sb.manifest.name) else {
            continue;
        };
        for d in [sb.paths.workspace(), sb.paths.scratch()] {
            if d.exists() {
                remove_tree(&d).map_err(|e| BoxError::io(&d, e))?;
            }
        }
        events::append(
            &sb.paths,
            &Event::new(
                "gc",
                "workspace reclaimed; manifest and receipts kept".into(),
            ),
        )?;
        report.reclaimed.push(sb.manifest.name.clone());
    }
    // Leftovers of killed verbs: a removal whose lock is free, a create whose name claim is
    // free (`claim_name` reclaims it); anything else of theirs only once it is an hour old.
    let cutoff = SystemTime::now() - Duration::from_secs(3600);
    if let Ok(agents) = fs::read_dir(store.env_root()) {
        for agent in agents.flatten() {
            let Ok(entries) = fs::read_dir(agent.path()) else {
                continue;
            };
            for e in entries.flatten() {
                let n = e.file_name().to_string_lossy().into_owned();
                let path = e.path();
                if n.starts_with(REMOVING_PREFIX) {
                    if reclaim_removal(store, &path)? {
                        report.leftovers += 1;
                        continue;
                    }
                } else if let Some(name) = n.strip_prefix(".creating-") {
                    if path.is_dir()
                        && !name.ends_with(".tmp")
                        && crate::store::abandoned_staging(&path)
                    {
                        // Claiming the name reclaims the staging directory, and the pin the
                        // killed verb may have left once no box of the name exists.
                        let agent_name = agent.file_name().to_string_lossy().into_owned();
                        if let Some(claim) = store.claim_name(&agent_name, name)? {
                            claim.release()?;
                            report.leftovers += 1;
                        }
                        continue;
                    }
                }
                let stale = e
                    .metadata()
                    .and_then(|m| m.modified())
                    .map(|t| t < cutoff)
                    .unwrap_or(false);
                if (n.starts_with(".creating-") || n.starts_with(REMOVING_PREFIX))
                    && stale
                    && path.is_dir()
                {
                    remove_tree(&path).map_err(|err| BoxError::io(&path, err))?;
                    report.leftovers += 1;
                }
            }
        }
    }
    report.leftovers += sweep_orphan_pins(store)?;
    Ok(report)
}
