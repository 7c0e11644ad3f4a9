//! The process tier's count of the connections its box's own kernel refused, per run.
//!
//! A process-tier box's network namespace is routed into the supervised tier's deny-all table
//! by its createContainer hook (`h5i-hook loopback --inside --deny-counted`:
//! `h5i_hook::denied_net`): every dial the box makes is refused at once by its own kernel and
//! counted by destination, and nothing routable leaves the namespace. This module owns the
//! hook's place in the plan ([`loopback_hook`]) and reading the counts back for the receipt,
//! with the supervised tier's reader and tally (`h5i_hook::nft_counters`), so a refused dial
//! reaches the receipt's `egress.denied` and report.md's "Denied egress attempts" the same way:
//! - a run in a container of its own: [`PerRunCounter`] binds an AF_UNIX socket the hook
//!   sends a netfilter socket made in the box's namespace to (`--send`); after the run, the
//!   table (made for this run, so counted from zero) is read through it, although the
//!   namespace's last process is gone (the socket keeps the namespace);
//! - a run in the box's sandbox (the table lives as long as the sandbox): [`SandboxCounter`]
//!   reads the table before and after the run through a socket made in the sandbox init's
//!   namespace, and the tally is the difference (the caller holds the sandbox's network for
//!   the run, so no other run's dials mix in).
//!
//! Must never: report a count the table did not hold, read a socket the hook did not send
//! (one message, one descriptor), or wait on the hook without a bound.
//!
//! Guarded by `tests/process_tier.rs` (a denied dial counted and listed, root and h5i-test).

use std::os::fd::OwnedFd;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::time::Duration;

use h5i_hook::nft_counters::{self, CounterReader, Counters, ProtocolNames};
use h5i_policy::receipt::{EgressTally, UncountedEgress};
use h5i_runtime::bundle::BundlePlan;

use crate::error::BoxError;

/// The hook flag that sets the counted refusal up.
pub const DENY_COUNTED: &str = "--deny-counted";
/// How long a received counter socket may take to arrive once the box ran (it was sent before
/// the box's command started, so it is normally there already).
const RECEIVE_TIMEOUT: Duration = Duration::from_secs(5);

/// The process tier's createContainer hook: `lo` up, and the counted refusal.
pub fn loopback_hook(hook: &Path) -> Vec<String> {
    vec![
        hook.display().to_string(),
        "loopback".to_string(),
        "--inside".to_string(),
        DENY_COUNTED.to_string(),
    ]
}

/// Whether `plan` sets the counted refusal up in its own namespace.
pub fn counts_denials(plan: &BundlePlan) -> bool {
    plan.create_container_hooks.iter().any(|argv| {
        argv.get(1).map(String::as_str) == Some("loopback")
            && argv.iter().any(|a| a == DENY_COUNTED)
    })
}

/// The counter socket of one run in a container of its own, on its way from the hook.
pub struct PerRunCounter {
    listener: UnixListener,
    sock: PathBuf,
}

impl PerRunCounter {
    /// Have `plan`'s hook send its counter socket to h5i; `None` when the plan sets no counted
    /// refusal up (host network, a service's network).
    pub fn attach(plan: &mut BundlePlan) -> Result<Option<PerRunCounter>, BoxError> {
        let Some(hook) = plan.create_container_hooks.iter_mut().find(|argv| {
            argv.get(1).map(String::as_str) == Some("loopback")
                && argv.iter().any(|a| a == DENY_COUNTED)
        }) else {
            return Ok(None);
        };
        let place = crate::credentials::HandoffPlace::for_plan(plan.uid, plan.gid, PathBuf::new())?;
        let sock = place.dir.join(format!(
            "deny-{}-{}.sock",
            std::process::id(),
            crate::store::now_ms() % 1_000_000
        ));
        let listener = place.bind(&sock)?;
        hook.push("--send".to_string());
        hook.push(sock.display().to_string());
        Ok(Some(PerRunCounter { listener, sock }))
    }

    /// The run ended: its tally, read through the socket the hook sent.
    pub fn finish(self) -> Result<EgressTally, String> {
        let got = self.receive().and_then(|fd| {
            let mut reader = CounterReader::from_socket(fd, ProtocolNames::of_host());
            let after = reader.read().map_err(|e| e.to_string())?;
            nft_counters::tally(None, &after, &[]).map_err(|e| e.to_string())
        });
        let _ = std::fs::remove_file(&self.sock);
        got
    }

    fn receive(&self) -> Result<OwnedFd, String> {
        self.listener
            .set_nonblocking(true)
            .map_err(|e| e.to_string())?;
        let conn = match self.listener.accept() {
            Ok((conn, _)) => conn,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                return Err("the box's hook sent no counter socket (the box did not start)".into())
            }
            Err(e) => return Err(e.to_string()),
        };
        conn.set_nonblocking(false)
            .and_then(|()| conn.set_read_timeout(Some(RECEIVE_TIMEOUT)))
            .map_err(|e| e.to_string())?;
        crate::credentials::receive_fd(&conn).map_err(|e| format!("the counter socket: {e}"))
    }
}

/// How long a sandbox's init just started may take to finish its `exec`.
const EXEC_SETTLE: std::time::Duration = std::time::Duration::from_secs(2);

/// Open `/proc/<init>/ns/<kind>` of a sandbox init that may still be finishing its `exec`.
/// Why a bounded retry: `runc run --detach` returns once the init is about to `exec`; until it
/// has, the init is non-dumpable with its memory still owned by the host's user namespace, so
/// an unprivileged caller's open is refused (`EACCES`), and after it (its memory owned by the
/// box's user namespace, which the caller owns) allowed. The kernel signals no `exec` to an
/// unprivileged watcher (the proc connector needs `CAP_NET_ADMIN`), so this retries that one
/// refusal, at most [`EXEC_SETTLE`]; any other error, or the refusal after it, is returned.
pub(crate) fn open_after_exec(path: &Path) -> std::io::Result<std::fs::File> {
    let until = std::time::Instant::now() + EXEC_SETTLE;
    loop {
        match std::fs::File::open(path) {
            Err(e)
                if e.kind() == std::io::ErrorKind::PermissionDenied
                    && std::time::Instant::now() < until =>
            {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            other => return other,
        }
    }
}

/// A run in the box's sandbox: the table's reading when it began.
pub struct SandboxCounter {
    reader: CounterReader,
    before: Counters,
}

impl SandboxCounter {
    /// Read the sandbox's table before a run, through a socket made in the network namespace
    /// of the sandbox's init `init_pid`.
    pub fn begin(init_pid: i32) -> Result<SandboxCounter, String> {
        let open = |ns: &str| {
            let path = format!("/proc/{init_pid}/ns/{ns}");
            open_after_exec(Path::new(&path))
                .map(OwnedFd::from)
                .map_err(|e| format!("{path}: {e}"))
        };
        let ns = h5i_hook::netns::BoxNamespaces::new(open("net")?, open("user")?)
            .map_err(|e| e.to_string())?;
        let mut reader =
            CounterReader::open(&ns, ProtocolNames::of_host()).map_err(|e| e.to_string())?;
        let before = reader.read().map_err(|e| e.to_string())?;
        Ok(SandboxCounter { reader, before })
    }

    /// The run ended: what the table counted since [`SandboxCounter::begin`].
    pub fn end(mut self) -> Result<EgressTally, String> {
        let after = self.reader.read().map_err(|e| e.to_string())?;
        nft_counters::tally(Some(&self.before), &after, &[]).map_err(|e| e.to_string())
    }
}

/// A process-tier run's egress tally: the table's counts (or, when they could not be read, a
/// warning and the note that they were not), with the credential proxies' counts added.
pub fn settle(
    counted: Result<EgressTally, String>,
    credential_tally: Option<EgressTally>,
) -> EgressTally {
    let table = counted.unwrap_or_else(|why| {
        eprintln!(
            "h5i: warning: the box's refused connections were counted but could not be read back ({why}); this run's receipt says so"
        );
        EgressTally {
            uncounted: Some(UncountedEgress::CountsUnread),
            ..EgressTally::default()
        }
    });
    table.merged(credential_tally)
}
