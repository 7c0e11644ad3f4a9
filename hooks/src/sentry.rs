//! `h5i-hook sentry`: the host-side process that owns one supervised box's network for the
//! length of a run.
//!
//! Started detached by `net-up` (its own session; stdin carries the [`SentryPlan`], stdout is
//! the ready pipe, stderr the log in the net directory). In order:
//! 1. close every inherited fd, read the plan, open a pidfd on the box's init;
//! 2. pin the egress request (names without addresses are resolved now, once) and render the
//!    table; bind `net.sock` and `gate.sock`, start the socket gate on the latter, write
//!    `sentry.pid`, and answer `ready` (or the refusal) on the ready pipe;
//! 3. serve `net.sock`: `attach` (from `net-inside`, with the box's network and user namespace
//!    fds) starts the table's load inside the box's network namespace and, while nft runs,
//!    starts the uplink; once the table is in force it makes a netfilter netlink socket inside
//!    the box's namespaces (`nft_counters::CounterReader`: one forked child, no program) and
//!    reads the table through it once; it answers `ok` only when all of that succeeded (if any
//!    part fails, the uplink is stopped and the attach refused). That overlap is safe because
//!    the box's init is held inside `net-inside` until the answer: no process of the box exists
//!    to send a packet before the table is in force. `stop` (from `net-down`) ends the run;
//! 4. when the init exits or `stop` arrives: read the counters over that socket, stop the
//!    uplink and the gate, write `tally.json` atomically (tmp + rename), answer every waiting
//!    `stop`, remove the sockets and the pid file, exit.
//!
//! Requests are one line each: `attach\n` (with exactly two fds: net, user) or `stop\n`; the
//! answer is one line, `ok` or the refusal. Only a peer of the sentry's own uid is served, and
//! only one `attach` per box.
//!
//! A box-lifetime sandbox (many runs, one box init) adds two requests around each run, and the
//! sentry then lives, with the table and the uplink, as long as the sandbox:
//! - `begin\n` followed by the run's egress request as JSON (the peer then shuts its write side):
//!   pinned like the plan's and rendered. When the table in force is not that script (other
//!   pins), or the table's handle is not the one the sentry last read it at (something else
//!   replaced it), the table is replaced in one nft transaction (`delete table` and the new
//!   table: the pins swap, every counter and denied set starts at zero together).
//!   Either way the counters are then read (the run's baseline) and the socket gate's tally is
//!   cleared; answer `ok` once that table is in force. A run whose pins match the table in
//!   force so starts without running nft at all.
//! - `end\n`: the counters read again, minus the baseline, and the gate's decisions since
//!   `begin`, answered as one [`NetTally`] JSON document (or the refusal, one line). That
//!   reading is then the baseline: an `end` with no `begin` since answers what was counted after
//!   the previous `end` (a box's browser's idle window between runs, `src/browser/idle.rs`,
//!   needs no round trip of its own to start). A tally
//!   whose two readings are of different tables (it was replaced during the run) is refused,
//!   never mixed. The caller runs one run at a time per sandbox, so the tally is
//!   exactly that run's: whatever was counted before `begin` (an earlier run, or anything
//!   between runs) is in the baseline. Once answered, if the run left keys in the denied sets,
//!   an `nft -f -` replaces the table with a fresh copy of the same script off the next run's
//!   path (the sets hold at most `nft::DENIED_SET_SIZE` keys); the next `begin` waits for it.
//!
//! Must never: let the box run (answer `ok`) before the table is loaded, answer `ok` to an attach
//! it did not complete, write a tally whose counters it could not read (it then writes none and
//! exits non-zero, so `net-down` fails rather than the receipt claiming zero), or outlive the
//! box.

use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use h5i_broker::pin::{AddressRules, SystemResolver};
use h5i_broker::socket_gate::{self, GateHandle, GateRules};
use h5i_policy::receipt::{EgressTally, LoadedEgressTable, NetTally, PinnedRule};
use serde::{Deserialize, Serialize};

use crate::egress::{self, EgressRequest};
use crate::net_spec::{GATE_SOCK, NET_SOCK, SENTRY_PID, TALLY};
use crate::netns::{BoxNamespaces, NsRun};
use crate::nft;
use crate::nft_counters::{self, CounterReader, Counters, ProtocolNames};
use crate::uplink::Uplink;
use h5i_sys::fd_passing::{self, Wait};
use h5i_sys::fds;
use h5i_sys::pidfd;
use h5i_sys::poll::readable as poll_readable;

/// Largest plan or request read.
const MAX_PLAN: u64 = 1 << 20;
/// How long a connected peer may take to send its request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// What `net-up` hands the sentry on stdin.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SentryPlan {
    /// The private net directory.
    pub dir: PathBuf,
    /// The box's init, in the sentry's pid namespace.
    pub init_pid: i32,
    /// The egress request.
    pub egress: Vec<EgressRequest>,
    /// `socket(AF_UNIX)` allowed.
    pub unix: bool,
    /// Address families the policy grants (`h5i.net.families`); absent in older plans.
    #[serde(default)]
    pub families: Vec<String>,
}

/// Why the sentry could not start or run.
#[derive(Debug, thiserror::Error)]
pub enum SentryError {
    /// The plan was not readable.
    #[error("refusing: the sentry's plan is not valid: {0}; to fix: start the sentry only through `h5i-hook net-up`")]
    Plan(String),
    /// The init is already gone.
    #[error("refusing: the box's init (pid {pid}) cannot be watched: {source}; to fix: run net-up as a createRuntime hook, while the init exists")]
    Init {
        /// The pid.
        pid: i32,
        /// The OS error.
        source: io::Error,
    },
    /// A socket could not be bound or a file written.
    #[error("refusing: {what} {path}: {source}; to fix: the net directory must be private to this run and writable")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// The egress request was refused.
    #[error(transparent)]
    Egress(#[from] egress::EgressError),
    /// The counters could not be read.
    #[error("refusing to write a tally: {0}")]
    Tally(String),
}

fn io_err(what: &'static str, path: &Path) -> impl FnOnce(io::Error) -> SentryError {
    let path = path.to_path_buf();
    move |source| SentryError::Io { what, path, source }
}

/// The sentry's state between start and finish.
struct Sentry {
    plan: SentryPlan,
    rules: Vec<PinnedRule>,
    script: String,
    address_rules: AddressRules,
    init: OwnedFd,
    net_listener: UnixListener,
    gate: GateHandle,
    log: std::fs::File,
    attached: Option<Attached>,
    attach_tried: bool,
}

/// The box's namespaces once the table is loaded and the uplink runs.
struct Attached {
    ns: BoxNamespaces,
    uplink: Uplink,
    /// The netlink socket in the box's network namespace the counters are read through.
    counters: CounterReader,
    /// The reading the next tally counts from (the last `begin`'s or `end`'s); `None`: the
    /// table in force was loaded fresh since (attach, or a refresh), so its counters started at
    /// zero.
    baseline: Option<Counters>,
    /// The handle the sentry last read its own table at; `None` right after a refresh, whose
    /// new table the next reading names.
    known_table: Option<u64>,
    /// The last `end` found keys in the denied sets: a fresh copy of the table is due.
    dirty: bool,
    /// The `nft -f -` loading that fresh copy, started after `end` answered.
    refresh: Option<NsRun>,
}

/// The process: `h5i-hook sentry`. Returns the exit code.
pub fn main() -> i32 {
    if let Err(e) = fds::close_inherited_fds() {
        eprintln!("h5i sentry: cannot close inherited fds: {e}");
        return 1;
    }
    let mut ready = std::io::stdout();
    let mut sentry = match start() {
        Ok(s) => s,
        Err(e) => {
            h5i_log::refused(&e);
            let _ = writeln!(ready, "{e}");
            eprintln!("h5i sentry: {e}");
            return 1;
        }
    };
    if writeln!(ready, "ready")
        .and_then(|()| ready.flush())
        .is_err()
    {
        eprintln!("h5i sentry: net-up went away before the sentry was ready");
        sentry.cleanup_files();
        return 1;
    }
    if let Err(e) = detach_stdio() {
        eprintln!("h5i sentry: cannot detach stdio: {e}");
    }
    let waiting = sentry.serve();
    match sentry.finish() {
        Ok(()) => {
            answer_all(waiting, "ok");
            sentry.cleanup_files();
            0
        }
        Err(e) => {
            eprintln!("h5i sentry: {e}");
            answer_all(waiting, &e.to_string());
            sentry.cleanup_files();
            1
        }
    }
}

fn answer_all(conns: Vec<UnixStream>, line: &str) {
    for mut c in conns {
        let _ = writeln!(c, "{line}");
    }
}

fn detach_stdio() -> io::Result<()> {
    let null = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")?;
    for fd in [0, 1] {
        h5i_sys::fds::point_std(fd, null.as_fd())?;
    }
    Ok(())
}

fn start() -> Result<Sentry, SentryError> {
    let mut text = String::new();
    std::io::stdin()
        .take(MAX_PLAN)
        .read_to_string(&mut text)
        .map_err(|e| SentryError::Plan(e.to_string()))?;
    let plan: SentryPlan =
        serde_json::from_str(&text).map_err(|e| SentryError::Plan(e.to_string()))?;
    crate::net_spec::check_dir(&plan.dir).map_err(|e| SentryError::Plan(e.to_string()))?;
    let mut created = Vec::new();
    let started = start_with(plan, &mut created);
    if started.is_err() {
        // Leave nothing half made: only what this process created goes.
        for path in created {
            let _ = std::fs::remove_file(path);
        }
    }
    started
}

fn start_with(plan: SentryPlan, created: &mut Vec<PathBuf>) -> Result<Sentry, SentryError> {
    std::env::set_current_dir("/").map_err(io_err("cannot chdir to", Path::new("/")))?;
    if plan.init_pid <= 1 {
        return Err(SentryError::Plan(format!("init pid {}", plan.init_pid)));
    }
    let init = pidfd::open(plan.init_pid).map_err(|source| SentryError::Init {
        pid: plan.init_pid,
        source,
    })?;
    let address_rules = AddressRules::production().map_err(|e| SentryError::Plan(e.to_string()))?;
    let rules = egress::pin(&plan.egress, &SystemResolver, &address_rules)?;
    let script = nft::render(&rules);

    let net_path = plan.dir.join(NET_SOCK);
    let gate_path = plan.dir.join(GATE_SOCK);
    let net_listener = bind(&net_path, created)?;
    let gate_listener = bind(&gate_path, created)?;
    let gate = socket_gate::serve(
        gate_listener,
        GateRules::for_policy(plan.unix, &plan.families),
    )
    .map_err(io_err("cannot serve the socket gate on", &gate_path))?;
    let pid_path = plan.dir.join(SENTRY_PID);
    created.push(pid_path.clone());
    write_atomic(&pid_path, format!("{}\n", std::process::id()).as_bytes())?;
    let log = std::io::stderr()
        .as_fd()
        .try_clone_to_owned()
        .map(std::fs::File::from)
        .map_err(io_err("cannot duplicate the log", &plan.dir))?;
    Ok(Sentry {
        plan,
        rules,
        script,
        address_rules,
        init,
        net_listener,
        gate,
        log,
        attached: None,
        attach_tried: false,
    })
}

fn bind(path: &Path, created: &mut Vec<PathBuf>) -> Result<UnixListener, SentryError> {
    let l = UnixListener::bind(path).map_err(io_err("cannot bind", path))?;
    created.push(path.to_path_buf());
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(io_err("cannot chmod", path))?;
    Ok(l)
}

/// Write `bytes` to `path` through a temporary file and a rename, mode 0600.
///
/// Atomic for readers (they see the old file or the whole new one), not durable: no fsync.
/// Both files live only as long as the run (`sentry.pid` until the sentry exits, `tally.json`
/// until h5i folds it into the receipt, which is the durable record), and a crash ends the run
/// anyway. An fsync of a new file on this host's ext4 `/run` waits for a journal commit
/// (measured 0.1-0.7 s under load), on the path every supervised run starts through.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), SentryError> {
    let tmp = path.with_extension("tmp");
    let write = || -> io::Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(bytes)?;
        std::fs::rename(&tmp, path)
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        SentryError::Io {
            what: "cannot write",
            path: path.to_path_buf(),
            source: e,
        }
    })
}

/// What one request asked.
enum Request {
    Attach(Vec<OwnedFd>),
    Stop,
    Begin(Vec<EgressRequest>),
    End,
}

fn read_request(conn: &UnixStream) -> Result<Request, String> {
    let euid = h5i_sys::ids::euid();
    match fds::peer_uid(conn) {
        Ok(uid) if uid == euid => {}
        Ok(uid) => return Err(format!("refusing: a peer of uid {uid} is not this run's")),
        Err(e) => return Err(format!("refusing: cannot identify the peer: {e}")),
    }
    let ready = poll_readable(&[conn.as_fd()], Some(REQUEST_TIMEOUT)).map_err(|e| e.to_string())?;
    if ready.is_empty() {
        return Err("refusing: no request within 5s".into());
    }
    let mut buf = [0u8; 64];
    // At most the two namespace descriptors of `attach`; a message with more is refused.
    let got = fd_passing::recv_with_fds(conn, &mut buf, 2, Wait::Block)
        .map_err(|e| format!("refusing: {e}"))?;
    let (n, fds) = (got.len, got.fds);
    match (&buf[..n], fds.len()) {
        (b"attach\n", 2) => Ok(Request::Attach(fds)),
        (b"stop\n", 0) => Ok(Request::Stop),
        (b"end\n", 0) => Ok(Request::End),
        (line, 0) if line.starts_with(BEGIN) => read_begin(conn, &line[BEGIN.len()..]),
        (line, k) => Err(format!(
            "refusing: unknown request {:?} with {k} fds",
            String::from_utf8_lossy(line)
        )),
    }
}

/// The verb line of a run's `begin` request.
const BEGIN: &[u8] = b"begin\n";

/// The rest of a `begin` request: its egress JSON, read to the peer's end of writing (bounded
/// in size and time).
fn read_begin(conn: &UnixStream, first: &[u8]) -> Result<Request, String> {
    let mut body = first.to_vec();
    conn.set_read_timeout(Some(REQUEST_TIMEOUT))
        .map_err(|e| format!("refusing: {e}"))?;
    conn.take(MAX_PLAN)
        .read_to_end(&mut body)
        .map_err(|e| format!("refusing: the begin request was not read whole: {e}"))?;
    let text = std::str::from_utf8(&body)
        .map_err(|_| "refusing: the begin request is not UTF-8".to_string())?;
    egress::parse(Some(text))
        .map(Request::Begin)
        .map_err(|e| e.to_string())
}

impl Sentry {
    /// Serve `net.sock` until the init exits or `stop` arrives; the connections waiting for
    /// the tally.
    fn serve(&mut self) -> Vec<UnixStream> {
        loop {
            let ready = match poll_readable(&[self.init.as_fd(), self.net_listener.as_fd()], None) {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("h5i sentry: poll failed: {e}; finishing");
                    return Vec::new();
                }
            };
            if ready.contains(&0) {
                return Vec::new();
            }
            let Ok((mut conn, _)) = self.net_listener.accept() else {
                continue;
            };
            match read_request(&conn) {
                Ok(Request::Stop) => return vec![conn],
                Ok(Request::Begin(reqs)) => {
                    let answer = self.begin(&reqs).map_or_else(
                        |e| {
                            eprintln!("h5i sentry: {e}");
                            e
                        },
                        |()| "ok".to_string(),
                    );
                    let _ = writeln!(conn, "{answer}");
                }
                Ok(Request::End) => {
                    let answer = self.end().and_then(|t| {
                        serde_json::to_string(&t).map_err(|e| SentryError::Tally(e.to_string()))
                    });
                    let line = answer.unwrap_or_else(|e| {
                        eprintln!("h5i sentry: {e}");
                        e.to_string()
                    });
                    let _ = writeln!(conn, "{line}");
                    drop(conn);
                    self.start_refresh();
                }
                Ok(Request::Attach(fds)) => {
                    let answer = match self.attach(fds) {
                        Ok(()) => "ok".to_string(),
                        Err(e) => {
                            eprintln!("h5i sentry: {e}");
                            e
                        }
                    };
                    let _ = writeln!(conn, "{answer}");
                }
                Err(e) => {
                    eprintln!("h5i sentry: {e}");
                    let _ = writeln!(conn, "{e}");
                }
            }
        }
    }

    fn attach(&mut self, fds: Vec<OwnedFd>) -> Result<(), String> {
        if self.attach_tried {
            return Err("refusing: this run's box is already attached".into());
        }
        self.attach_tried = true;
        let mut fds = fds.into_iter();
        let (Some(net), Some(user)) = (fds.next(), fds.next()) else {
            return Err("refusing: attach needs two fds".into());
        };
        let ns = BoxNamespaces::new(net, user).map_err(|e| e.to_string())?;
        // The load and the uplink's start overlap (the box is held until this returns); a load
        // dropped unwaited is killed, and nft applies a script as one transaction or not at all.
        let load = ns
            .spawn_nft(&["-f", "-"], self.script.as_bytes().to_vec())
            .map_err(|e| e.to_string())?;
        let mut uplink = Uplink::start(&ns, &self.rules, &self.log).map_err(|e| e.to_string())?;
        let counted = load.wait().map_err(|e| e.to_string()).and_then(|_| {
            let mut counters =
                CounterReader::open(&ns, ProtocolNames::of_host()).map_err(|e| e.to_string())?;
            let first = counters.read().map_err(|e| e.to_string())?;
            Ok((counters, first.table))
        });
        let (counters, table) = match counted {
            Ok(c) => c,
            Err(e) => {
                uplink.stop();
                return Err(e);
            }
        };
        self.attached = Some(Attached {
            ns,
            uplink,
            counters,
            baseline: None,
            known_table: Some(table),
            dirty: false,
            refresh: None,
        });
        Ok(())
    }

    /// A run starts: pin its egress request; unless the table in force is already its script,
    /// replace the table in one transaction (new pins, every counter and denied set at zero);
    /// read the counters as the run's baseline and clear the gate's tally.
    fn begin(&mut self, reqs: &[EgressRequest]) -> Result<(), String> {
        let Some(a) = self.attached.as_mut() else {
            return Err("refusing: a run cannot begin before the box is attached".into());
        };
        let rules =
            egress::pin(reqs, &SystemResolver, &self.address_rules).map_err(|e| e.to_string())?;
        let script = nft::render(&rules);
        a.uplink.route(&rules).map_err(|e| e.to_string())?;
        a.settle_refresh();
        let reading = a.counters.read().map_err(|e| e.to_string())?;
        let in_force = script == self.script && a.known_table.is_none_or(|t| t == reading.table);
        let baseline = if in_force {
            reading
        } else {
            a.ns.nft(&["-f", "-"], nft::replace(&script).as_bytes())
                .map_err(|e| e.to_string())?;
            a.counters.read().map_err(|e| e.to_string())?
        };
        if !a.uplink.alive() {
            eprintln!("h5i sentry: the uplink has exited; this run has no way out");
        }
        a.known_table = Some(baseline.table);
        a.baseline = Some(baseline);
        self.rules = rules;
        self.script = script;
        self.gate.take_tally();
        Ok(())
    }

    /// A run (or an idle window) ended: its counters and socket-gate decisions since the later
    /// of [`Self::begin`] and the previous `end`.
    fn end(&mut self) -> Result<NetTally, SentryError> {
        let Some(a) = self.attached.as_mut() else {
            return Err(SentryError::Tally(
                "no table was loaded: the box was never attached".into(),
            ));
        };
        a.settle_refresh();
        let egress = a.tally(&self.rules)?;
        Ok(NetTally {
            table: LoadedEgressTable {
                digest: nft::digest(&self.script),
                rules: self.rules.clone(),
            },
            egress,
            socket_gate: self.gate.take_tally(),
        })
    }

    /// After a sandbox's `end` answered: when the run left keys in the denied sets, start
    /// replacing the table with a fresh copy of the same script (the next `begin` waits for
    /// it). Best effort: without one, the sets keep their keys and the baseline still makes
    /// each tally that run's alone.
    fn start_refresh(&mut self) {
        let Some(a) = self.attached.as_mut().filter(|a| a.dirty) else {
            return;
        };
        let script = nft::replace(&self.script).into_bytes();
        match a.ns.spawn_nft(&["-f", "-"], script) {
            Ok(run) => {
                a.refresh = Some(run);
                a.dirty = false;
            }
            Err(e) => eprintln!("h5i sentry: cannot start the table's refresh: {e}"),
        }
    }

    /// Read the counters, stop the uplink and the gate, write the tally.
    fn finish(&mut self) -> Result<(), SentryError> {
        let counters = self.attached.as_mut().map(|a| {
            a.settle_refresh();
            a.tally(&self.rules)
        });
        if let Some(a) = self.attached.as_mut() {
            if !a.uplink.alive() {
                eprintln!("h5i sentry: the uplink had ended before the run ended");
            }
            a.uplink.stop();
        }
        self.gate.stop();
        let (table, egress) = match counters {
            Some(c) => (
                LoadedEgressTable {
                    digest: nft::digest(&self.script),
                    rules: self.rules.clone(),
                },
                c?,
            ),
            // Never attached: no table was loaded and nothing left the box.
            None => (LoadedEgressTable::default(), Default::default()),
        };
        let tally = NetTally {
            table,
            egress,
            socket_gate: self.gate.tally(),
        };
        let json =
            serde_json::to_vec_pretty(&tally).map_err(|e| SentryError::Tally(e.to_string()))?;
        write_atomic(&self.plan.dir.join(TALLY), &json)
    }

    fn cleanup_files(&self) {
        for name in [NET_SOCK, GATE_SOCK, SENTRY_PID] {
            let _ = std::fs::remove_file(self.plan.dir.join(name));
        }
    }
}

impl Attached {
    /// Wait for a refresh started after the last run, if any. Once it loaded, the table's
    /// counters start from zero and the table the next reading names is the sentry's own; if
    /// it failed, the table in force is still the old one (nft applies a script whole or not
    /// at all).
    fn settle_refresh(&mut self) {
        let Some(refresh) = self.refresh.take() else {
            return;
        };
        match refresh.wait() {
            Ok(_) => {
                self.baseline = None;
                self.known_table = None;
            }
            Err(e) => {
                eprintln!("h5i sentry: the table's refresh failed ({e}); the table in force stays")
            }
        }
    }

    /// The counters read now, minus the baseline: what `rules`' table counted since. The
    /// reading is the next tally's baseline.
    fn tally(&mut self, rules: &[PinnedRule]) -> Result<EgressTally, SentryError> {
        let now = self
            .counters
            .read()
            .map_err(|e| SentryError::Tally(e.to_string()))?;
        let egress = nft_counters::tally(self.baseline.as_ref(), &now, rules)
            .map_err(|e| SentryError::Tally(e.to_string()))?;
        self.known_table = Some(now.table);
        self.dirty = !now.denied.is_empty();
        self.baseline = Some(now);
        Ok(egress)
    }
}
