//! The viewer's sessions as the receipt log tells them: every `opened` record gets its ending,
//! `closed` by the viewer, or `killed` by the next h5i verb that finds the viewer gone.
//!
//! Owns `<box>/browser/viewers/`: one claim file per live session (`<session>.json`: the
//! session's id, the viewer process by pid and start time, who runs it, and its counts so far,
//! rewritten whole through a temporary file and a rename as they change) and `.lock`, held
//! while a session opens, while it closes, and while [`close_orphans`] looks. A session writes
//! its claim before its `opened` record and removes it after its `closed` one, both under the
//! lock, so whatever instant the viewer dies at, [`close_orphans`] (run by `h5i box view`,
//! `h5i box doctor` and `h5i box export`) finds the claim of a dead process and either writes
//! the `killed` record the `opened` one lacks or, when no `opened` record was written, drops
//! the claim alone. Running it twice writes nothing twice: it reads the log for the session's
//! ending first.
//!
//! Must never: close a session whose viewer is alive, write a second ending for a session, or
//! leave an `opened` record without an ending once its viewer is gone and a sweep has run.
//!
//! Guarded by `tests/browser.rs` (a viewer SIGKILLed mid-session, then `h5i box export`).

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use h5i_policy::receipt::RecordBody;
use serde::{Deserialize, Serialize};

use super::control;
use crate::error::BoxError;
use crate::file_lock::{FileLock, LockKind};
use crate::service_state::ProcId;
use crate::store::StoredBox;

/// One session's counts.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tally {
    /// Whether a human took control from this session.
    pub took_control: bool,
    /// Input events passed to the browser.
    pub input_sent: u64,
    /// Input events dropped (the viewing user did not hold the lock).
    pub input_dropped: u64,
}

/// A claim file: what a live session has said so far.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Claim {
    session: String,
    owner: ProcId,
    via: String,
    by: String,
    tally: Tally,
}

/// A session whose `opened` record is written; [`Session::close`] writes its ending.
#[derive(Debug)]
pub struct Session {
    sb: StoredBox,
    dir: PathBuf,
    claim: Claim,
}

fn dir(sb: &StoredBox) -> PathBuf {
    control::dir(&sb.paths).join("viewers")
}

fn lock(dir: &Path) -> Result<FileLock, BoxError> {
    match fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
    {
        Ok(()) => {}
        Err(e) => return Err(BoxError::io(dir, e)),
    }
    let path = dir.join(".lock");
    FileLock::wait(&path, LockKind::Exclusive).map_err(|e| BoxError::io(&path, e))
}

fn claim_path(dir: &Path, session: &str) -> PathBuf {
    dir.join(format!("{session}.json"))
}

fn tmp_path(dir: &Path, session: &str) -> PathBuf {
    dir.join(format!(".{session}.tmp"))
}

/// Write `claim` whole (a temporary file renamed over it; no fsync: a kill, not a power cut,
/// is what this survives, and the counts are rewritten on every change).
fn save(dir: &Path, claim: &Claim) -> Result<(), BoxError> {
    let (tmp, path) = (
        tmp_path(dir, &claim.session),
        claim_path(dir, &claim.session),
    );
    let bytes = serde_json::to_vec(claim).map_err(|e| BoxError::Corrupt {
        path: path.clone(),
        what: e.to_string(),
    })?;
    fs::File::create(&tmp)
        .and_then(|mut f| f.write_all(&bytes))
        .and_then(|()| fs::rename(&tmp, &path))
        .map_err(|e| BoxError::io(&path, e))
}

fn body(claim: &Claim, event: &str) -> RecordBody {
    RecordBody::ViewerSession {
        event: event.to_string(),
        session: claim.session.clone(),
        via: claim.via.clone(),
        by: claim.by.clone(),
        took_control: claim.tally.took_control,
        input_sent: claim.tally.input_sent,
        input_dropped: claim.tally.input_dropped,
    }
}

/// Open a session of `via` run by `by` on box `sb`: its claim, then its `opened` record.
pub fn open(sb: &StoredBox, via: &str, by: &str) -> Result<Session, BoxError> {
    let dir = dir(sb);
    let me = ProcId::of(std::process::id() as i32).ok_or_else(|| {
        BoxError::io(
            Path::new("/proc/self/stat"),
            io::Error::other("cannot read this process's start time"),
        )
    })?;
    let claim = Claim {
        session: crate::random::hex_for_box(8)?,
        owner: me,
        via: via.to_string(),
        by: by.to_string(),
        tally: Tally::default(),
    };
    let _held = lock(&dir)?;
    save(&dir, &claim)?;
    control::record_viewer(sb, body(&claim, "opened"))?;
    Ok(Session {
        sb: sb.clone(),
        dir,
        claim,
    })
}

impl Session {
    /// Save the session's counts when they changed (what a `killed` record will say).
    pub fn update(&mut self, tally: Tally) -> Result<(), BoxError> {
        if tally == self.claim.tally {
            return Ok(());
        }
        self.claim.tally = tally;
        save(&self.dir, &self.claim)
    }

    /// Write the session's `closed` record and drop its claim.
    pub fn close(mut self, tally: Tally) -> Result<(), BoxError> {
        self.claim.tally = tally;
        let _held = lock(&self.dir)?;
        close_with(&self.sb, &self.dir, &self.claim, "closed")
    }
}

/// Append `claim`'s ending `event` to box `sb`'s log, then remove the claim from `dir`.
fn close_with(sb: &StoredBox, dir: &Path, claim: &Claim, event: &str) -> Result<(), BoxError> {
    control::record_viewer(sb, body(claim, event))?;
    let path = claim_path(dir, &claim.session);
    fs::remove_file(&path).map_err(|e| BoxError::io(&path, e))
}

/// Under the lock: end every session of box `sb` whose viewer is gone (`killed`, with the counts
/// it last saved, unless the log already has its ending or never had its opening) and drop its
/// claim; a temporary file no live save owns goes too. How many `killed` records were written.
pub fn close_orphans(sb: &StoredBox) -> Result<usize, BoxError> {
    let dir = dir(sb);
    if !dir.exists() {
        return Ok(0);
    }
    let _held = lock(&dir)?;
    let entries = fs::read_dir(&dir).map_err(|e| BoxError::io(&dir, e))?;
    let mut claims = Vec::new();
    let mut tmps = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(session) = name.strip_prefix('.').and_then(|n| n.strip_suffix(".tmp")) {
            tmps.push((session.to_string(), path));
        } else if name.ends_with(".json") {
            let claim = fs::read(&path)
                .ok()
                .and_then(|b| serde_json::from_slice::<Claim>(&b).ok());
            claims.push((path, claim));
        }
    }
    let log = h5i_broker::receipt_log::ReceiptLog::at(sb.paths.receipts())
        .read()
        .map_err(|e| BoxError::BadRequest {
            what: format!("cannot read the receipt log: {e}"),
            mend: format!("check {}", sb.paths.receipts().display()),
        })?;
    let events = |session: &str| -> Vec<String> {
        log.records
            .iter()
            .filter_map(|r| match &r.body {
                RecordBody::ViewerSession {
                    event, session: s, ..
                } if s == session => Some(event.clone()),
                _ => None,
            })
            .collect()
    };
    let mut killed = 0;
    let mut live = Vec::new();
    for (path, claim) in claims {
        let Some(claim) = claim else {
            // Not a claim h5i wrote whole (saves are renamed into place): nothing to end.
            let _ = fs::remove_file(&path);
            continue;
        };
        if claim.owner.alive() {
            live.push(claim.session);
            continue;
        }
        let seen = events(&claim.session);
        let ended = seen.iter().any(|e| e != "opened");
        if seen.iter().any(|e| e == "opened") && !ended {
            close_with(sb, &dir, &claim, "killed")?;
            killed += 1;
        } else {
            fs::remove_file(&path).map_err(|e| BoxError::io(&path, e))?;
        }
    }
    for (session, path) in tmps {
        if !live.contains(&session) {
            let _ = fs::remove_file(path);
        }
    }
    Ok(killed)
}
