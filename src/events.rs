//! The box's event log (`events.jsonl`, printed by `h5i box log`): lifecycle verbs as the host
//! performed them. Not evidence of what ran (that is the receipt log); a diary of what h5i did.
//!
//! Must never: be written from inside a box (it sits beside the receipt log, outside the spool).

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;

use serde::{Deserialize, Serialize};

use crate::error::BoxError;
use crate::store::{now_ms, BoxPaths};

/// One lifecycle event.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Event {
    /// When, ms since the epoch.
    pub at_ms: u64,
    /// The verb (`created`, `run`, `exported`, ...).
    pub event: String,
    /// A one-line description.
    pub detail: String,
}

impl Event {
    /// An event happening now.
    pub fn new(event: &str, detail: String) -> Self {
        Event {
            at_ms: now_ms(),
            event: event.to_string(),
            detail,
        }
    }
}

/// Append one event.
pub fn append(paths: &BoxPaths, ev: &Event) -> Result<(), BoxError> {
    let p = paths.events();
    let mut line = serde_json::to_vec(ev).map_err(|e| BoxError::Corrupt {
        path: p.clone(),
        what: e.to_string(),
    })?;
    line.push(b'\n');
    let mut f = OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&p)
        .map_err(|e| BoxError::io(&p, e))?;
    f.write_all(&line).map_err(|e| BoxError::io(&p, e))
}

/// The largest event log `read` takes (through the bounded reader).
const EVENTS_CAP: u64 = 64 << 20;

/// Every event, in order; lines that do not parse are returned as text so nothing is hidden.
pub fn read(paths: &BoxPaths) -> Result<Vec<Result<Event, String>>, BoxError> {
    let text = match crate::bounded::read_beneath(
        &paths.dir,
        std::path::Path::new("events.jsonl"),
        EVENTS_CAP,
    ) {
        Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
        Err(crate::bounded::Skip::Missing) => String::new(),
        Err(skip) => {
            return Err(BoxError::Corrupt {
                path: paths.events(),
                what: format!("it is {skip}"),
            })
        }
    };
    Ok(text
        .lines()
        .map(|l| serde_json::from_str(l).map_err(|_| l.to_string()))
        .collect())
}
