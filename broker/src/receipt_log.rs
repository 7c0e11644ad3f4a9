//! The append-only receipt log: one JSON record per line in `<box>/receipts.jsonl`.
//!
//! Owns appending (under an exclusive `flock`, `O_APPEND`, `fdatasync` before returning; the
//! next `seq` read from the log's end, so an append costs the same however long the box's
//! history is) and reading back with every damaged line reported by number. Must never: rewrite or truncate a
//! line already written, follow a symlink planted where the log should be, or drop a torn line
//! silently. A torn tail (a crash mid-append) is terminated with a newline so later records stay
//! whole, and the reader reports it as damaged at its line.
//!
//! Guarded by the unit tests below.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use h5i_policy::receipt::{ReceiptRecord, RECEIPT_SCHEMA_VERSION};

/// A receipt log could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum ReceiptLogError {
    /// Opening, locking, writing or syncing failed.
    #[error("refusing: receipt log {path}: {source}; to fix: check the box directory is intact and writable by you (`h5i box doctor`)")]
    Io {
        /// The log's path.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// A record could not be serialized.
    #[error("refusing: a receipt record could not be serialized: {0}; to fix: report this as an h5i bug")]
    Encode(#[from] serde_json::Error),
}

/// A line of the log that is not a valid record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DamagedLine {
    /// 1-based line number.
    pub line: usize,
    /// What is wrong with it.
    pub problem: String,
}

/// Everything in a log, and everything wrong with it.
#[derive(Debug, Clone, Default)]
pub struct ReceiptReadout {
    /// The valid records, in log order.
    pub records: Vec<ReceiptRecord>,
    /// Lines that are torn or invalid; never silently skipped.
    pub damaged: Vec<DamagedLine>,
}

/// One box's receipt log.
#[derive(Debug, Clone)]
pub struct ReceiptLog {
    path: PathBuf,
}

impl ReceiptLog {
    /// The log at `path` (created on first append).
    pub fn at(path: impl Into<PathBuf>) -> Self {
        ReceiptLog { path: path.into() }
    }

    /// Where the log lives.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Append one record. `seq` and `v` are assigned here, under the lock, so concurrent runs in
    /// one box never write the same sequence number.
    pub fn append(&self, mut record: ReceiptRecord) -> Result<ReceiptRecord, ReceiptLogError> {
        let io_err = |source| ReceiptLogError::Io {
            path: self.path.clone(),
            source,
        };
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&self.path)
            .map_err(io_err)?;
        let _lock = Flock::exclusive(&file).map_err(io_err)?;
        let tail = last_record(&file).map_err(io_err)?;
        record.v = RECEIPT_SCHEMA_VERSION;
        record.seq = tail.seq + 1;
        let mut line = Vec::with_capacity(512);
        if tail.torn {
            line.push(b'\n');
        }
        serde_json::to_writer(&mut line, &record)?;
        line.push(b'\n');
        file.write_all(&line).map_err(io_err)?;
        file.sync_data().map_err(io_err)?;
        Ok(record)
    }

    /// Read every record back, reporting damaged lines by number. A missing log is empty.
    pub fn read(&self) -> Result<ReceiptReadout, ReceiptLogError> {
        let mut buf = Vec::new();
        match OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&self.path)
        {
            Ok(mut f) => {
                f.read_to_end(&mut buf)
                    .map_err(|source| ReceiptLogError::Io {
                        path: self.path.clone(),
                        source,
                    })?;
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(ReceiptLogError::Io {
                    path: self.path.clone(),
                    source,
                })
            }
        }
        Ok(parse(&buf))
    }
}

/// How much of the log's end one read takes when looking for its last record: a few records'
/// worth, so an append reads one block however long the box's history is.
const TAIL_READ: u64 = 16 * 1024;

/// What an append needs from the log it extends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Tail {
    /// The last valid record's sequence number (0: none).
    seq: u64,
    /// The log is not empty and does not end with a newline (a crash mid-append).
    torn: bool,
}

/// The log's last valid record and whether its end is torn, read backwards from the end a
/// [`TAIL_READ`] block at a time until a line parses as a record (or the start is reached).
/// The same answer [`parse`] of the whole log gives (its last record's `seq`; the last piece
/// counts even without a newline), without reading every run's receipt on each append: the
/// append is on every run's path, and a box keeps its whole history.
fn last_record(file: &File) -> io::Result<Tail> {
    let len = file.metadata()?.len();
    if len == 0 {
        return Ok(Tail {
            seq: 0,
            torn: false,
        });
    }
    let mut last = [0u8];
    file.read_exact_at(&mut last, len - 1)?;
    let torn = last[0] != b'\n';
    // `unread`: where the bytes not yet looked at begin; `pending`: those bytes from `unread`
    // up to the last line not yet tried (a final newline left out). While `unread > 0`, the
    // first piece of `pending` may be the end of a line that begins before it, so it waits for
    // the next block.
    let mut unread = if torn { len } else { len - 1 };
    let mut pending: Vec<u8> = Vec::new();
    loop {
        let from = unread.saturating_sub(TAIL_READ);
        let mut block = vec![0u8; usize::try_from(unread - from).unwrap_or(0)];
        file.read_exact_at(&mut block, from)?;
        block.extend_from_slice(&pending);
        pending = block;
        unread = from;
        let mut tried = 0usize;
        let mut pieces = pending.rsplit(|b| *b == b'\n').peekable();
        while let Some(piece) = pieces.next() {
            if pieces.peek().is_none() && unread > 0 {
                break;
            }
            if let Ok(record) = serde_json::from_slice::<ReceiptRecord>(piece) {
                return Ok(Tail {
                    seq: record.seq,
                    torn,
                });
            }
            tried += piece.len() + 1;
        }
        if unread == 0 {
            return Ok(Tail { seq: 0, torn });
        }
        pending.truncate(pending.len().saturating_sub(tried));
    }
}

fn parse(bytes: &[u8]) -> ReceiptReadout {
    let mut out = ReceiptReadout::default();
    let complete = bytes.ends_with(b"\n");
    let lines: Vec<&[u8]> = bytes.split(|b| *b == b'\n').collect();
    // split leaves one trailing empty piece after a final newline.
    let count = if complete {
        lines.len() - 1
    } else {
        lines.len()
    };
    for (i, raw) in lines.iter().take(count).enumerate() {
        let line = i + 1;
        if raw.is_empty() && i + 1 == count && !complete {
            continue;
        }
        match serde_json::from_slice::<ReceiptRecord>(raw) {
            Ok(r) => out.records.push(r),
            Err(e) => {
                let torn = !complete && i + 1 == count;
                out.damaged.push(DamagedLine {
                    line,
                    problem: if torn {
                        "torn: the log ends mid-record (a crash during append)".to_string()
                    } else if serde_json::from_slice::<serde_json::Value>(raw).is_err() {
                        format!("not a complete JSON record ({e})")
                    } else {
                        format!("not a receipt record ({e})")
                    },
                });
            }
        }
    }
    out
}

/// Held while appending; the lock is released on drop (and by the kernel when the file closes).
/// It holds a duplicate of the file's descriptor: a `flock` belongs to the open file, which
/// the duplicate shares, so the file itself stays free to read and append through.
struct Flock(std::os::fd::OwnedFd);

impl Flock {
    fn exclusive(file: &File) -> io::Result<Self> {
        let held = file.as_fd().try_clone_to_owned()?;
        h5i_sys::fs::lock_exclusive(&held)?;
        Ok(Flock(held))
    }
}

impl Drop for Flock {
    fn drop(&mut self) {
        let _ = h5i_sys::fs::unlock(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use h5i_policy::receipt::{ExitOutcome, ReceiptLane, RecordBody};

    fn record() -> ReceiptRecord {
        ReceiptRecord {
            v: 0,
            seq: 0,
            lane: ReceiptLane::HostEnvRun,
            at_ms: 1,
            policy_digest: "sha256:ab".into(),
            redactions: vec![],
            payload: None,
            body: RecordBody::Run {
                argv: vec!["true".into()],
                tier: "workspace".into(),
                exit: ExitOutcome {
                    code: Some(0),
                    signal: None,
                    timed_out: false,
                    oom_killed: false,
                },
                rusage: None,
                cgroup_usage: None,
                wall_ms: 1,
                oom: None,
                egress: None,
                socket_gate: None,
            },
        }
    }

    #[test]
    fn appends_number_records_from_one_without_gaps() {
        let dir = tempfile::tempdir().unwrap();
        let log = ReceiptLog::at(dir.path().join("receipts.jsonl"));
        for want in 1..=3 {
            assert_eq!(log.append(record()).unwrap().seq, want);
        }
        let back = log.read().unwrap();
        assert_eq!(back.records.len(), 3);
        assert!(back.damaged.is_empty());
    }

    #[test]
    fn a_torn_tail_is_reported_and_later_records_stay_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("receipts.jsonl");
        let log = ReceiptLog::at(&path);
        log.append(record()).unwrap();
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(b"{\"v\":1,\"seq\":2,\"la").unwrap();
        drop(f);
        let torn = log.read().unwrap();
        assert_eq!(torn.records.len(), 1);
        assert_eq!(torn.damaged.len(), 1);
        assert_eq!(torn.damaged[0].line, 2);
        assert!(torn.damaged[0].problem.starts_with("torn"));

        let next = log.append(record()).unwrap();
        assert_eq!(next.seq, 2);
        let after = log.read().unwrap();
        assert_eq!(after.records.len(), 2);
        assert_eq!(after.damaged.len(), 1, "the torn line is still reported");
        assert_eq!(after.damaged[0].line, 2);
        assert!(after.damaged[0].problem.contains("JSON"));
    }

    fn line_of(seq: u64, argv: &str) -> Vec<u8> {
        let mut r = record();
        r.seq = seq;
        if let RecordBody::Run { argv: a, .. } = &mut r.body {
            *a = vec![argv.to_string()];
        }
        let mut line = serde_json::to_vec(&r).unwrap();
        line.push(b'\n');
        line
    }

    /// What an append reads from its end must be what reading the whole log says: the last
    /// valid record's seq, the log torn or not; logs many tail blocks long, with damaged lines
    /// and records longer than a block at the end, at a block's edge and at the start.
    #[test]
    fn the_tail_an_append_reads_agrees_with_the_whole_log() {
        let long = "x".repeat(3 * TAIL_READ as usize);
        let mut cases: Vec<Vec<u8>> = vec![
            b"".to_vec(),
            b"\n".to_vec(),
            b"not a record\n".to_vec(),
            b"{\"v\":1,\"seq\":7,\"la".to_vec(),
        ];
        let mut many = Vec::new();
        for seq in 1..=2000 {
            many.extend(line_of(seq, "true"));
        }
        cases.push(many.clone());
        let mut damaged_after = many.clone();
        for _ in 0..200 {
            damaged_after.extend(b"{\"v\":1,\"seq\":9999,\"not\":\"a receipt\"}\n");
        }
        damaged_after.extend(b"{\"v\":1,\"seq\":2001,\"la");
        cases.push(damaged_after);
        let mut long_last = many.clone();
        long_last.extend(line_of(2001, &long));
        cases.push(long_last.clone());
        long_last.extend(b"\n\n");
        cases.push(long_last);
        let mut long_first = line_of(1, &long);
        long_first.extend(b"garbage\n".repeat(5000));
        cases.push(long_first);
        let mut complete_unterminated = many;
        complete_unterminated.extend(line_of(2001, "true"));
        complete_unterminated.pop();
        cases.push(complete_unterminated);
        // Lines that end exactly at a block's edge from the end.
        for pad in [0usize, 1, 2] {
            let mut edge = line_of(1, "true");
            let tail = line_of(2, "true");
            let filler = TAIL_READ as usize - tail.len() - 1 + pad;
            edge.extend(vec![b'#'; filler]);
            edge.push(b'\n');
            edge.extend(tail);
            cases.push(edge);
        }

        let dir = tempfile::tempdir().unwrap();
        for (i, bytes) in cases.iter().enumerate() {
            let path = dir.path().join(format!("case-{i}.jsonl"));
            std::fs::write(&path, bytes).unwrap();
            let whole = parse(bytes);
            let want = Tail {
                seq: whole.records.last().map_or(0, |r| r.seq),
                torn: !bytes.is_empty() && !bytes.ends_with(b"\n"),
            };
            let got = last_record(&File::open(&path).unwrap()).unwrap();
            assert_eq!(got, want, "case {i}");
        }
    }

    #[test]
    fn an_append_after_a_long_history_and_damaged_tail_continues_the_sequence() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("receipts.jsonl");
        let mut bytes = Vec::new();
        for seq in 1..=500 {
            bytes.extend(line_of(seq, "true"));
        }
        bytes.extend(b"not a record\n".repeat(2000));
        bytes.extend(b"{\"v\":1,\"seq\":501,\"la");
        std::fs::write(&path, &bytes).unwrap();
        let log = ReceiptLog::at(&path);
        assert_eq!(log.append(record()).unwrap().seq, 501);
        assert_eq!(log.append(record()).unwrap().seq, 502);
        let back = log.read().unwrap();
        assert_eq!(back.records.len(), 502);
        assert_eq!(
            back.damaged.len(),
            2001,
            "every damaged line is still reported"
        );
    }

    #[test]
    fn a_symlink_in_place_of_the_log_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("elsewhere");
        std::fs::write(&target, b"").unwrap();
        let path = dir.path().join("receipts.jsonl");
        std::os::unix::fs::symlink(&target, &path).unwrap();
        let err = ReceiptLog::at(&path).append(record()).unwrap_err();
        assert!(err.to_string().contains("to fix:"));
        assert_eq!(std::fs::read(&target).unwrap(), b"");
    }
}
