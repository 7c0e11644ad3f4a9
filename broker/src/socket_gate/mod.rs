//! The socket() gate: the host side of a box's seccomp user-notification filter on `socket` and
//! `socketpair`.
//!
//! The box's OCI spec routes every `socket`/`socketpair` call to `SCMP_ACT_NOTIFY`, and the
//! runtime hands the filter's notification descriptor to `linux.seccomp.listenerPath` (a
//! `ContainerProcessState` JSON with `"fds": ["seccompFd"]` and the descriptor as
//! `SCM_RIGHTS`). [`serve`] accepts that hand-off on the caller's listener and answers each call
//! by [`decide`]: allowed calls continue in the kernel unchanged
//! (`SECCOMP_USER_NOTIF_FLAG_CONTINUE`, safe here because socket()'s arguments are values, not
//! pointers a racing thread could rewrite), refused ones fail with `EPERM`; every decision is
//! counted in a [`SocketGateTally`] for the receipt.
//!
//! Rules ([`decide`]):
//! - `socket(AF_INET|AF_INET6, SOCK_STREAM, 0|IPPROTO_TCP)` and `(SOCK_DGRAM, 0|IPPROTO_UDP)`,
//!   any `SOCK_NONBLOCK|SOCK_CLOEXEC` flags: allowed (nftables decides where they may go);
//!   `SOCK_RAW` and `SOCK_PACKET` there: `inet-raw`/`inet6-raw`, refused; any other type or
//!   protocol there (SCTP, MPTCP, ICMP "ping" sockets, `SOCK_SEQPACKET`, DCCP):
//!   `inet-other`/`inet6-other`, refused.
//! - `socket(AF_UNIX)`: allowed only with [`GateRules::unix`] (`net.unix = true`).
//! - a family the policy grants by `net.families` ([`GateRules::granted`]; only families
//!   `h5i_policy::families` lists as grantable): allowed.
//! - `AF_NETLINK` (allowed at the process tier; here the box's netns is the sentry's and
//!   nothing in a build needs its routing table), `AF_PACKET`, `AF_VSOCK` and every other
//!   family: refused.
//! - `socketpair(AF_UNIX)`: always allowed (a private pair reaches nothing), counted as
//!   `unix-pair`; `socketpair` of any other family: refused, counted as `<family>-pair`.
//! - A notification for any other syscall, or from a foreign architecture (x32 numbers, i386):
//!   refused and logged, not counted (it is not a socket call this gate understands).
//!
//! Arguments are read as the kernel reads them: `socket(int, int, int)`, so only the low 32
//! bits of each count. Family names are bounded (`family-<n>` below 64, else
//! `family-invalid`), so a box cannot grow the tally without limit.
//!
//! Fail closed: a refused hand-off (bad JSON, no descriptor, several, a descriptor that is not a
//! seccomp listener, a message over [`MAX_MESSAGE_BYTES`], a peer of another uid, a sender that
//! stalls past [`HANDOFF_TIMEOUT`]) is logged to stderr and its descriptors closed; the box's
//! filter then has no listener and the kernel fails its `socket()` calls with `ENOSYS`. The same
//! happens when the gate stops or dies.
//!
//! One thread serves everything: the listener, hand-offs in progress, and every notification
//! descriptor (the box's init, plus one per process h5i-runc `exec`s into it). A notification
//! is received only after `poll` reported it; should its caller die in between, the receive
//! returns at once on kernels that still count it, else at the next notification or when the
//! filter's last process is gone (the kernel wakes receivers then), so `stop` is bounded by
//! the box's life, never by a timer.
//!
//! Kernel calls live in `kernel.rs`. Must never: answer CONTINUE for a call `decide` refused,
//! panic on anything a peer sends, keep a refused descriptor open, or sleep-poll (the thread
//! waits in `poll(2)` on the listener, the hand-offs, the notification descriptors and a wake
//! socket). Guarded by the unit tests here and by `runtime/tests/socket_gate.rs` (real boxes).

mod kernel;

use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use h5i_sys::fd_passing::{self, FdPassError, Wait};

pub use h5i_policy::families::FamilySet;
pub use h5i_policy::receipt::SocketGateTally;

/// What the policy lets through the gate beyond plain TCP/UDP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GateRules {
    /// `socket(AF_UNIX)` allowed (`net.unix = true`).
    pub unix: bool,
    /// Families the policy grants by `net.families` (`h5i_policy::families`), allowed as-is.
    /// Families outside the table's allowlist and not granted here are refused, as by
    /// h5i-runc's seccomp list at the process tier.
    pub granted: FamilySet,
}

impl GateRules {
    /// The rules for a policy's `net.unix` and `net.families` (names that cannot be granted
    /// are left out: the policy refused them when it was parsed).
    pub fn for_policy(unix: bool, families: &[String]) -> Self {
        // Only the grants: the table's always-allowed families keep the gate's narrower rules
        // (plain TCP/UDP on inet; netlink refused in the supervised netns).
        let granted = FamilySet::granted_only(families);
        GateRules { unix, granted }
    }
}

/// The two syscalls the gate sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateSyscall {
    /// `socket(family, type, protocol)`.
    Socket,
    /// `socketpair(family, type, protocol, sv)`.
    Socketpair,
}

/// One answer of the gate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GateDecision {
    /// Let the call run (`true`) or fail it with `EPERM`.
    pub allow: bool,
    /// The tally key (see the module doc for the names).
    pub family: String,
}

/// Largest hand-off message accepted, bytes (the state JSON carries the spec's annotations).
pub const MAX_MESSAGE_BYTES: usize = 256 * 1024;
/// A connection that has not finished its hand-off by then is dropped.
pub const HANDOFF_TIMEOUT: Duration = Duration::from_secs(5);
/// Hand-offs read at once; connections beyond are refused.
const MAX_PENDING: usize = 8;
/// Descriptors one hand-off message may bring (the runtime sends one; a message with up to this
/// many is read whole and refused by name in `validate_handoff`, one with more is refused as is).
const HANDOFF_MAX_FDS: usize = 4;
/// Notification descriptors served at once (the init's, plus one per `exec`).
const MAX_LISTENERS: usize = 64;
/// Family numbers at or above this are outside every kernel's table.
const FAMILY_NAME_LIMIT: u32 = 64;
/// `SOCK_TYPE_MASK`: the low nibble of socket()'s type is the type; the rest are flags.
const SOCK_TYPE_MASK: i32 = 0xf;
/// `SOCK_PACKET` (obsolete packet sockets on an inet family).
const SOCK_PACKET: i32 = 10;
/// The descriptor name the OCI runtime spec gives the seccomp listener fd.
const SECCOMP_FD_NAME: &str = "seccompFd";

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH_NATIVE: u32 = 0xC000_003E; // AUDIT_ARCH_X86_64
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH_NATIVE: u32 = 0xC000_00B7; // AUDIT_ARCH_AARCH64

/// The tally name of address family `family` (kernel's `int`, as unsigned).
pub fn family_name(family: u32) -> String {
    match family as i32 {
        libc::AF_UNIX => "unix".into(),
        libc::AF_INET => "inet".into(),
        libc::AF_INET6 => "inet6".into(),
        libc::AF_NETLINK => "netlink".into(),
        libc::AF_PACKET => "packet".into(),
        libc::AF_VSOCK => "vsock".into(),
        _ if family < FAMILY_NAME_LIMIT => format!("family-{family}"),
        _ => "family-invalid".into(),
    }
}

/// The gate's answer for one call. Pure; see the module doc for the rules.
pub fn decide(
    syscall: GateSyscall,
    family: u64,
    ty: u64,
    protocol: u64,
    rules: &GateRules,
) -> GateDecision {
    // The kernel's prototypes take `int`s: the high halves never reach it, so they must not
    // change the answer either.
    let family = family as u32;
    let ty = ty as u32 as i32;
    let protocol = protocol as u32 as i32;
    let name = family_name(family);
    let allow = |family: String| GateDecision {
        allow: true,
        family,
    };
    let deny = |family: String| GateDecision {
        allow: false,
        family,
    };
    match syscall {
        GateSyscall::Socketpair if family as i32 == libc::AF_UNIX => allow("unix-pair".into()),
        GateSyscall::Socketpair => deny(format!("{name}-pair")),
        GateSyscall::Socket => match family as i32 {
            libc::AF_INET | libc::AF_INET6 => match (ty & SOCK_TYPE_MASK, protocol) {
                (libc::SOCK_STREAM, 0 | libc::IPPROTO_TCP)
                | (libc::SOCK_DGRAM, 0 | libc::IPPROTO_UDP) => allow(name),
                (libc::SOCK_RAW | SOCK_PACKET, _) => deny(format!("{name}-raw")),
                _ => deny(format!("{name}-other")),
            },
            libc::AF_UNIX if rules.unix => allow(name),
            _ if rules.granted.contains(family) => allow(name),
            _ => deny(name),
        },
    }
}

/// What to do with one notification: a counted decision, or a refusal outside the tally.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Classified {
    /// A socket call of this architecture, decided by [`decide`].
    Decided(GateDecision),
    /// Not a call the gate understands: refused, logged, not counted.
    Foreign(String),
}

/// Map a notification's syscall number, architecture and arguments to an answer.
fn classify(nr: i32, arch: u32, args: &[u64; 6], rules: &GateRules) -> Classified {
    if arch != AUDIT_ARCH_NATIVE {
        return Classified::Foreign(format!("syscall {nr} of foreign architecture {arch:#x}"));
    }
    let syscall = match i64::from(nr) {
        libc::SYS_socket => GateSyscall::Socket,
        libc::SYS_socketpair => GateSyscall::Socketpair,
        _ => return Classified::Foreign(format!("syscall {nr} is not socket/socketpair")),
    };
    Classified::Decided(decide(syscall, args[0], args[1], args[2], rules))
}

/// The running gate. Dropping it stops it.
#[derive(Debug)]
pub struct GateHandle {
    tally: Arc<Mutex<SocketGateTally>>,
    wake: Option<UnixStream>,
    thread: Option<JoinHandle<()>>,
    /// Disconnects when the thread ends (it owns the sender).
    ended: mpsc::Receiver<()>,
}

impl GateHandle {
    /// The decisions so far.
    pub fn tally(&self) -> SocketGateTally {
        lock(&self.tally).clone()
    }

    /// The decisions so far, and the tally cleared: the next call counts from now.
    pub fn take_tally(&self) -> SocketGateTally {
        std::mem::take(&mut *lock(&self.tally))
    }

    /// Stop serving: the thread closes every notification descriptor (so the box's further
    /// socket calls fail with `ENOSYS`) and the listener, and ends. Idempotent.
    pub fn stop(&mut self) {
        if let Some(mut wake) = self.wake.take() {
            // A failed write means the thread already ended (its end of the pair is closed).
            let _ = wake.write_all(b"x");
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }

    /// Wait up to `timeout` for the gate to end by itself (every filter it served is gone);
    /// `true` once it has ended.
    pub fn wait_ended(&self, timeout: Duration) -> bool {
        matches!(
            self.ended.recv_timeout(timeout),
            Err(mpsc::RecvTimeoutError::Disconnected)
        )
    }
}

impl Drop for GateHandle {
    fn drop(&mut self) {
        self.stop();
    }
}

fn lock(tally: &Mutex<SocketGateTally>) -> std::sync::MutexGuard<'_, SocketGateTally> {
    // The tally is plain counters: a panic elsewhere cannot leave it half-updated.
    tally
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Serve the gate on `listener` (bound by the caller at `listenerPath`) on a thread of its own.
///
/// The thread ends on [`GateHandle::stop`], or by itself once it has served at least one
/// filter and every filter it served reports `POLLHUP` (no process holds it any more).
pub fn serve(listener: UnixListener, rules: GateRules) -> io::Result<GateHandle> {
    listener.set_nonblocking(true)?;
    let (wake, wake_rx) = UnixStream::pair()?;
    let tally = Arc::new(Mutex::new(SocketGateTally::default()));
    let mut gate = Gate {
        listener,
        wake: wake_rx,
        rules,
        tally: Arc::clone(&tally),
        pending: Vec::new(),
        listeners: Vec::new(),
        served_any: false,
    };
    let (ended_tx, ended) = mpsc::channel();
    let thread = std::thread::Builder::new()
        .name("h5i-socket-gate".into())
        .spawn(move || {
            gate.run();
            // Close every descriptor before telling anyone the gate has ended.
            drop(gate);
            drop(ended_tx);
        })?;
    Ok(GateHandle {
        tally,
        wake: Some(wake),
        thread: Some(thread),
        ended,
    })
}

/// A connection whose hand-off is still being read.
struct Handoff {
    stream: UnixStream,
    message: Vec<u8>,
    fds: Vec<OwnedFd>,
    deadline: Instant,
}

/// A seccomp listener descriptor being served.
struct Served {
    notify: OwnedFd,
    container: String,
}

struct Gate {
    listener: UnixListener,
    wake: UnixStream,
    rules: GateRules,
    tally: Arc<Mutex<SocketGateTally>>,
    pending: Vec<Handoff>,
    listeners: Vec<Served>,
    served_any: bool,
}

fn log(what: std::fmt::Arguments<'_>) {
    eprintln!("h5i socket gate: {what}");
}

fn pollfd(fd: &impl AsRawFd) -> libc::pollfd {
    libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    }
}

const GONE: libc::c_short = libc::POLLHUP | libc::POLLERR | libc::POLLNVAL;

impl Gate {
    fn run(&mut self) {
        loop {
            if self.served_any && self.listeners.is_empty() {
                return;
            }
            let mut fds = vec![pollfd(&self.wake), pollfd(&self.listener)];
            fds.extend(self.pending.iter().map(|h| pollfd(&h.stream)));
            fds.extend(self.listeners.iter().map(|s| pollfd(&s.notify)));
            let timeout = self.next_deadline_ms();
            if let Err(e) = kernel::poll(&mut fds, timeout) {
                log(format_args!(
                    "poll failed ({e}); closing every listener, the box's socket calls now fail"
                ));
                return;
            }
            if fds[0].revents != 0 {
                return;
            }
            let pending_at = 2;
            let listeners_at = pending_at + self.pending.len();
            // Notifications first: a blocked caller is waiting on each.
            let notify_events: Vec<libc::c_short> =
                fds[listeners_at..].iter().map(|p| p.revents).collect();
            self.serve_notifications(&notify_events);
            let handoff_events: Vec<libc::c_short> = fds[pending_at..listeners_at]
                .iter()
                .map(|p| p.revents)
                .collect();
            self.read_handoffs(&handoff_events);
            if fds[1].revents & GONE != 0 {
                log(format_args!(
                    "the listener socket failed; closing every listener"
                ));
                return;
            }
            if fds[1].revents != 0 && !self.accept() {
                log(format_args!(
                    "closing every listener, the box's socket calls now fail"
                ));
                return;
            }
        }
    }

    fn next_deadline_ms(&self) -> i32 {
        let Some(deadline) = self.pending.iter().map(|h| h.deadline).min() else {
            return -1;
        };
        let left = deadline.saturating_duration_since(Instant::now());
        // Round up, so the wake-up is never before the deadline.
        i32::try_from(left.as_millis() + 1).unwrap_or(i32::MAX)
    }

    fn serve_notifications(&mut self, events: &[libc::c_short]) {
        let mut keep = Vec::with_capacity(self.listeners.len());
        for (served, &revents) in std::mem::take(&mut self.listeners).into_iter().zip(events) {
            let alive = if revents & libc::POLLIN != 0 {
                match self.answer_one(&served) {
                    Ok(()) => true,
                    Err(e) => {
                        log(format_args!(
                            "container {}: listener failed ({e}); closing it, the box's socket calls now fail",
                            served.container
                        ));
                        false
                    }
                }
            } else {
                revents & GONE == 0
            };
            if alive {
                keep.push(served);
            }
        }
        self.listeners = keep;
    }

    fn answer_one(&self, served: &Served) -> io::Result<()> {
        let fd = served.notify.as_fd();
        let notif = match kernel::recv(fd) {
            Ok(n) => n,
            // The caller died before we read it, or a signal interrupted us: nothing to answer.
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::EINTR)) => return Ok(()),
            Err(e) => return Err(e),
        };
        let allow = match classify(
            notif.data.nr,
            notif.data.arch,
            &notif.data.args,
            &self.rules,
        ) {
            Classified::Decided(d) => {
                let mut tally = lock(&self.tally);
                let side = if d.allow {
                    &mut tally.allowed
                } else {
                    &mut tally.denied
                };
                *side.entry(d.family).or_insert(0) += 1;
                d.allow
            }
            Classified::Foreign(what) => {
                log(format_args!(
                    "container {}: refusing {what} (pid {})",
                    served.container, notif.pid
                ));
                false
            }
        };
        if !kernel::id_valid(fd, notif.id)? {
            return Ok(());
        }
        kernel::answer(fd, notif.id, (!allow).then_some(libc::EPERM))?;
        Ok(())
    }

    fn read_handoffs(&mut self, events: &[libc::c_short]) {
        let now = Instant::now();
        let mut keep = Vec::with_capacity(self.pending.len());
        for (mut handoff, &revents) in std::mem::take(&mut self.pending).into_iter().zip(events) {
            if revents == 0 {
                if now >= handoff.deadline {
                    log(format_args!(
                        "refusing a hand-off: not complete within {HANDOFF_TIMEOUT:?}"
                    ));
                } else {
                    keep.push(handoff);
                }
                continue;
            }
            let outcome = read_some(&mut handoff);
            if matches!(outcome, Ok(false)) && now >= handoff.deadline {
                log(format_args!(
                    "refusing a hand-off: not complete within {HANDOFF_TIMEOUT:?}"
                ));
                continue;
            }
            match outcome {
                Ok(false) => keep.push(handoff),
                Ok(true) => self.finish_handoff(handoff),
                Err(refusal) => log(format_args!("refusing a hand-off: {refusal}")),
            }
        }
        self.pending = keep;
    }

    fn finish_handoff(&mut self, handoff: Handoff) {
        match validate_handoff(&handoff.message, handoff.fds) {
            Ok((notify, container)) if self.listeners.len() < MAX_LISTENERS => {
                self.served_any = true;
                self.listeners.push(Served { notify, container });
            }
            Ok((_, container)) => log(format_args!(
                "refusing container {container}'s listener: already serving {MAX_LISTENERS}"
            )),
            Err(refusal) => log(format_args!("refusing a hand-off: {refusal}")),
        }
    }

    /// Accept every waiting connection; `false` when the listener itself failed.
    fn accept(&mut self) -> bool {
        loop {
            let stream = match self.listener.accept() {
                Ok((stream, _)) => stream,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.raw_os_error() == Some(libc::ECONNABORTED) => continue,
                Err(e) => {
                    // Out of descriptors or memory: the connection stays queued and poll would
                    // report it again at once. Ending is the bounded answer (and fails closed).
                    log(format_args!("accept failed: {e}"));
                    return false;
                }
            };
            let me = kernel::euid();
            match h5i_sys::fds::peer_uid(&stream) {
                Ok(uid) if uid == me => {}
                Ok(uid) => {
                    log(format_args!(
                        "refusing a hand-off from uid {uid}: only uid {me} may hand over a listener"
                    ));
                    continue;
                }
                Err(e) => {
                    log(format_args!(
                        "refusing a hand-off: no peer credentials ({e})"
                    ));
                    continue;
                }
            }
            if self.pending.len() >= MAX_PENDING {
                log(format_args!(
                    "refusing a hand-off: {MAX_PENDING} already in progress"
                ));
                continue;
            }
            if let Err(e) = stream.set_nonblocking(true) {
                log(format_args!("refusing a hand-off: {e}"));
                continue;
            }
            self.pending.push(Handoff {
                stream,
                message: Vec::new(),
                fds: Vec::new(),
                deadline: Instant::now() + HANDOFF_TIMEOUT,
            });
        }
    }
}

/// Read what is available; `Ok(true)` at end of stream (the sender closed: the message is
/// complete).
fn read_some(handoff: &mut Handoff) -> Result<bool, String> {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        // Room for a few descriptors: a message with more is refused (each one closed).
        let got = match fd_passing::recv_with_fds(
            &handoff.stream,
            &mut buf,
            HANDOFF_MAX_FDS,
            Wait::DontWait,
        ) {
            Ok(got) => got,
            Err(FdPassError::Io(e)) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
            Err(
                e @ (FdPassError::ControlTruncated { .. } | FdPassError::TooManyReceived { .. }),
            ) => return Err(format!("too many descriptors in one message ({e})")),
            Err(e) => return Err(format!("read failed: {e}")),
        };
        handoff.fds.extend(got.fds);
        if got.len == 0 {
            return Ok(true);
        }
        if handoff.message.len() + got.len > MAX_MESSAGE_BYTES {
            return Err(format!("message over {MAX_MESSAGE_BYTES} bytes"));
        }
        handoff.message.extend_from_slice(&buf[..got.len]);
    }
}

/// The part of the OCI `ContainerProcessState` the gate checks.
#[derive(serde::Deserialize)]
struct ProcessState {
    fds: Vec<String>,
    state: StateSummary,
}

#[derive(serde::Deserialize)]
struct StateSummary {
    id: String,
}

/// Check a complete hand-off: the JSON names exactly one descriptor, `seccompFd`, exactly one
/// came with it, and it is a seccomp listener. Every other descriptor is closed (dropped).
fn validate_handoff(message: &[u8], mut fds: Vec<OwnedFd>) -> Result<(OwnedFd, String), String> {
    let state: ProcessState = serde_json::from_slice(message)
        .map_err(|e| format!("not an OCI container process state ({e})"))?;
    if state.fds != [SECCOMP_FD_NAME] {
        return Err(format!(
            "container {}: descriptor names {:?}, expected [\"{SECCOMP_FD_NAME}\"]",
            state.state.id, state.fds
        ));
    }
    let notify = match (fds.pop(), fds.is_empty()) {
        (Some(fd), true) => fd,
        (None, _) => return Err(format!("container {}: no descriptor came", state.state.id)),
        (Some(_), false) => {
            return Err(format!(
                "container {}: {} descriptors came, expected one",
                state.state.id,
                fds.len() + 1
            ))
        }
    };
    if !kernel::is_seccomp_notify(notify.as_fd()) {
        return Err(format!(
            "container {}: the descriptor is not a seccomp listener",
            state.state.id
        ));
    }
    Ok((notify, state.state.id))
}

#[cfg(test)]
mod tests;
