//! `h5i box service start|status|logs|stop` and `h5i box ports`: a box's declared long-lived
//! processes (`[service.NAME]` in the policy) and the per-box port map.
//!
//! Owns the service supervisor: `service start` re-executes `h5i` as a detached background
//! process (its own session, stdio to `<box>/services/<svc>.log`, outside every grant) that runs
//! the service under the usual supervision, keeps `<box>/services/<svc>.json` (who supervises,
//! the service's pid, its host port, its exit), and records a host-observed receipt (event
//! `service`) when it ends. At the process tier the service is its own container and the
//! supervisor forwards `127.0.0.1:<host port>` on the host to `127.0.0.1:<port>` *inside* the
//! service's network namespace: as root, a forwarding thread enters that namespace by the
//! container init's pid, connects there, and splices both ways; an unprivileged caller (who
//! may enter a network namespace only from the user namespace owning it, which a threaded
//! process cannot join) gets a forwarder process instead (`box __service-forward`): handed the
//! bound host listener and the box's user and network namespaces as descriptors, it joins
//! both while single-threaded, gives up every capability it gained there, and serves the
//! listener from inside. Nothing of the box is ever published.
//! Later runs of the same box join that namespace (see [`live_network_pid`]); another box never
//! does. At the workspace tier a service is a plain supervised process on the host's network.
//! At the supervised tier the only service is a browser box's built-in `browser` sidecar
//! (`crate::browser::sidecar`), a container in the network of the box's sandbox.
//!
//! Must never: signal a pid it has not re-identified (pid + start time, through a pidfd), bind
//! anything but loopback, wait by sleeping (every wait is a pidfd, an inotify fd or a pipe under
//! `poll`), or claim a forward it could not make.
//!
//! The supervisor stands below the caches and the browser's verbs (both start services or open
//! run sessions of their own): what the box's caches grant the service and the start of a
//! browser sidecar's relay are handed to it by the verb that runs it ([`FromAbove`]). A
//! service's state file is `crate::service_state`'s.
//!
//! Guarded by `tests/box_services.rs`.

use std::ffi::OsString;
use std::fs;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use h5i_policy::{ResolvedPolicy, Tier};

use crate::error::BoxError;
use crate::process::CacheGrant;
use crate::service_state::{
    all_states, claim_state, read_state, services_dir, state_path, update_state, ProcId,
    ServiceState,
};
use crate::session::{Network, PidSource, Purpose, RunSession, Starting, Stdio as SessionStdio};
use crate::store::{load_policy, now_ms, require_active, BoxLock, BoxPaths, BoxStore, StoredBox};

/// How long `service start` waits for the supervisor to report the service started.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long `service stop` waits for the supervisor to record the exit, per attempt.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a container service's supervisor gets to see its container end by itself before
/// the container is removed through the engine.
const CONTAINER_EXIT_GRACE: Duration = Duration::from_secs(2);
/// The fd the supervisor's readiness pipe arrives on.
pub const READY_FD: RawFd = 3;
/// The first line the service wrapper prints, with its pid, once the box is set up.
const READY_MARKER: &str = "h5i-service-ready";
/// What a forward that cannot enter the box's network says, instead of pretending.
const FORWARD_REFUSED: &str = "the port is not forwarded";
/// Where the forwarder process finds the host listener, and the box's user and network
/// namespaces.
const FORWARD_FDS: [RawFd; 3] = [3, 4, 5];

/// Why a service verb refused.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// The box's policy declares no such service.
    #[error("refusing: box `{name}` declares no service `{service}` (declared: {declared}); to fix: add `[service.{service}]` with a `command` to .h5i/env.toml and create a new box")]
    NotDeclared {
        /// The box.
        name: String,
        /// The service asked for.
        service: String,
        /// What the policy declares.
        declared: String,
    },
    /// Services need a tier this build supports them at.
    #[error("refusing: box `{name}` is at the {tier} tier, where services are not supported in this build; to fix: create the box with --isolation process (or workspace), or run the server inside `h5i box shell {name}`")]
    TierUnsupported {
        /// The box.
        name: String,
        /// Its tier.
        tier: String,
    },
    /// The service is already alive.
    #[error("refusing: service `{service}` of box `{name}` is already running (pid {pid}); to fix: `h5i box service stop {name} {service}` first")]
    AlreadyRunning {
        /// The box.
        name: String,
        /// The service.
        service: String,
        /// Its pid.
        pid: i32,
    },
    /// The service is not alive.
    #[error("refusing: service `{service}` of box `{name}` is not running; to fix: `h5i box service start {name} {service}`")]
    NotRunning {
        /// The box.
        name: String,
        /// The service.
        service: String,
    },
    /// The supervisor reported a failed start.
    #[error("refusing: service `{service}` of box `{name}` did not start: {why}; to fix: read `h5i box service logs {name} {service}`")]
    StartFailed {
        /// The box.
        name: String,
        /// The service.
        service: String,
        /// What the supervisor said.
        why: String,
    },
    /// A box-level refusal.
    #[error(transparent)]
    Box(#[from] BoxError),
}

/// One declared service, for `service status`.
#[derive(Debug)]
pub struct ServiceStatus {
    /// Its name.
    pub service: String,
    /// Its declared command.
    pub command: String,
    /// Its declared port.
    pub port: Option<u16>,
    /// Whether it is running now.
    pub alive: bool,
    /// The last state its supervisor wrote, if it ever started.
    pub state: Option<ServiceState>,
}

/// One line of `box ports`.
#[derive(Debug)]
pub struct PortLine {
    /// The service.
    pub service: String,
    /// The port inside the box.
    pub box_port: u16,
    /// The host port on 127.0.0.1, when there is one.
    pub host_port: Option<u16>,
    /// How it is reached, or why it is not.
    pub note: String,
}

/// `<box>/services/<svc>.log`: the service's stdout and stderr, and its supervisor's notes.
pub fn log_path(paths: &BoxPaths, service: &str) -> PathBuf {
    services_dir(paths).join(format!("{service}.log"))
}

/// The declaration of `service`: the policy's, or the built-in browser sidecar of a browser
/// box (`crate::browser::sidecar`), which a policy's own `[service.browser]` overrides.
fn declared(
    policy: &ResolvedPolicy,
    name: &str,
    service: &str,
) -> Result<h5i_policy::resolved::Service, ServiceError> {
    if service == crate::browser_box::SERVICE
        && !policy.services.contains_key(service)
        && crate::browser_box::is_browser_box(policy)
    {
        return Ok(crate::browser_box::service_decl());
    }
    policy
        .services
        .get(service)
        .cloned()
        .ok_or_else(|| ServiceError::NotDeclared {
            name: name.to_string(),
            service: service.to_string(),
            declared: if policy.services.is_empty() {
                "none".into()
            } else {
                policy
                    .services
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            },
        })
}

fn require_service_tier(name: &str, tier: Tier) -> Result<(), ServiceError> {
    match tier {
        Tier::Workspace | Tier::Process => Ok(()),
        other => Err(ServiceError::TierUnsupported {
            name: name.to_string(),
            tier: other.as_str().to_string(),
        }),
    }
}

/// [`require_service_tier`], except for a box's box-lifetime browser sidecar, which also lives
/// at the supervised tier (in the network of the box's sandbox).
fn require_servable(
    name: &str,
    service: &str,
    policy: &ResolvedPolicy,
) -> Result<(), ServiceError> {
    if service == crate::browser_box::SERVICE && crate::browser_box::lives_for_the_box(policy) {
        return Ok(());
    }
    require_service_tier(name, policy.tier)
}

/// Start `service` of box `name` in the background; returns once its supervisor reports it
/// started (its pid known, its forward bound), with the state it wrote.
pub fn start(store: &BoxStore, name: &str, service: &str) -> Result<ServiceState, ServiceError> {
    let sb = store.find(name)?;
    let _lock = BoxLock::shared(&sb.paths, name)?;
    require_active(&sb, "service start")?;
    let policy = load_policy(&sb)?;
    declared(&policy, name, service)?;
    require_servable(name, service, &policy)?;
    if let Some(st) = read_state(&sb.paths, service).filter(ServiceState::alive) {
        return Err(ServiceError::AlreadyRunning {
            name: name.to_string(),
            service: service.to_string(),
            pid: st.pid.map(|p| p.pid).unwrap_or(st.supervisor.pid),
        });
    }
    let dir = services_dir(&sb.paths);
    {
        use std::os::unix::fs::DirBuilderExt;
        match fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(BoxError::io(&dir, e).into()),
        }
    }
    let _ = fs::remove_file(state_path(&sb.paths, service));
    let log = log_path(&sb.paths, service);
    // A new file, not the old one truncated: an earlier supervisor still winding down keeps
    // writing to its own.
    let _ = fs::remove_file(&log);
    let out = fs::File::create(&log).map_err(|e| BoxError::io(&log, e))?;
    let err = out.try_clone().map_err(|e| BoxError::io(&log, e))?;
    let exe = std::env::current_exe().map_err(|e| BoxError::io(Path::new("/proc/self/exe"), e))?;
    let (ready_r, ready_w) =
        h5i_sys::fds::pipe().map_err(|e| BoxError::io(Path::new("pipe"), e))?;
    let mut cmd = Command::new(exe);
    cmd.args(["box", "__service-supervise", name, service])
        .current_dir(&store.repo_root)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err);
    let w = ready_w.as_raw_fd();
    // SAFETY: the closure makes only system calls (setsid, fcntl, dup2: async-signal-safe, no
    // allocation) between fork and exec; `w` stays open in the parent until after spawn returns.
    unsafe {
        cmd.pre_exec(move || {
            h5i_sys::proc::new_session()?;
            h5i_sys::fds::place_for_exec(&[(w, READY_FD)])
        });
    }
    let mut child = cmd.spawn().map_err(|e| BoxError::io(Path::new("h5i"), e))?;
    h5i_log::spawned(&cmd, Some(child.id()));
    drop(ready_w);
    let said = read_ready(&ready_r, START_TIMEOUT);
    match said {
        Some(line) if line == "ok" => {
            // The supervisor runs on, detached; it is reparented when this command exits.
            drop(child);
            read_state(&sb.paths, service).ok_or_else(|| ServiceError::StartFailed {
                name: name.to_string(),
                service: service.to_string(),
                why: "the supervisor reported a start but wrote no state".into(),
            })
        }
        other => {
            let why = match other {
                Some(l) => l.strip_prefix("err ").unwrap_or(&l).to_string(),
                None => "the supervisor ended or stayed silent before the service started".into(),
            };
            if let Some(st) = read_state(&sb.paths, service) {
                let _ = signal_service(&st, libc::SIGKILL);
            }
            // Our own unreaped child: its pid cannot have been reused.
            let _ = child.kill();
            let _ = child.wait();
            Err(ServiceError::StartFailed {
                name: name.to_string(),
                service: service.to_string(),
                why,
            })
        }
    }
}

/// Read one line from the readiness pipe, waiting at most `timeout` in `poll`.
fn read_ready(fd: &OwnedFd, timeout: Duration) -> Option<String> {
    let deadline = Instant::now() + timeout;
    let mut buf = Vec::new();
    let mut file = fs::File::from(fd.try_clone().ok()?);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || !poll_readable(fd, left) {
            return None;
        }
        let mut chunk = [0u8; 256];
        match file.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                if buf.contains(&b'\n') {
                    break;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
    let text = String::from_utf8_lossy(&buf);
    text.lines().next().map(str::to_string)
}

/// Every declared service of the box, alive or dead.
pub fn status(store: &BoxStore, name: &str) -> Result<Vec<ServiceStatus>, ServiceError> {
    let sb = store.find(name)?;
    let policy = load_policy(&sb)?;
    Ok(policy
        .services
        .iter()
        .map(|(svc, decl)| {
            let state = read_state(&sb.paths, svc);
            ServiceStatus {
                service: svc.clone(),
                command: decl.command.clone(),
                port: decl.port,
                alive: state.as_ref().map(ServiceState::alive).unwrap_or(false),
                state,
            }
        })
        .collect())
}

/// The log of `service` (it must be declared).
pub fn logs(store: &BoxStore, name: &str, service: &str) -> Result<PathBuf, ServiceError> {
    let sb = store.find(name)?;
    let policy = load_policy(&sb)?;
    declared(&policy, name, service)?;
    Ok(log_path(&sb.paths, service))
}

/// The port map: each live service with a port.
pub fn ports(store: &BoxStore, name: &str) -> Result<Vec<PortLine>, ServiceError> {
    let sb = store.find(name)?;
    Ok(all_states(&sb.paths)
        .into_iter()
        .filter(ServiceState::alive)
        .filter_map(|st| {
            st.port.map(|p| PortLine {
                service: st.service.clone(),
                box_port: p,
                host_port: st.host_port,
                note: st.port_note.clone().unwrap_or_default(),
            })
        })
        .collect())
}

/// Stop `service` of box `name` and wait for its supervisor to record the exit.
pub fn stop(store: &BoxStore, name: &str, service: &str) -> Result<ServiceState, ServiceError> {
    let sb = store.find(name)?;
    let st = read_state(&sb.paths, service)
        .filter(ServiceState::alive)
        .ok_or_else(|| ServiceError::NotRunning {
            name: name.to_string(),
            service: service.to_string(),
        })?;
    stop_one(&sb.paths, &st)?;
    Ok(read_state(&sb.paths, service).unwrap_or(st))
}

/// Stop every live service of `sb` (`box abort`, `box rm`), waiting for each supervisor.
pub fn stop_all(sb: &StoredBox) -> Result<(), BoxError> {
    for st in all_states(&sb.paths) {
        if st.supervisor.alive() {
            stop_one(&sb.paths, &st)?;
        }
    }
    Ok(())
}

fn stop_one(paths: &BoxPaths, st: &ServiceState) -> Result<(), BoxError> {
    let sup = st.supervisor.pidfd();
    crate::freeze::release(st);
    let first = if in_container(st) {
        // The container init is pid 1 of its namespace and ignores what it has no handler
        // for; killing it ends the namespace, and h5i-runc then deletes the container.
        libc::SIGKILL
    } else {
        libc::SIGTERM
    };
    signal_service(st, first);
    let Some(sup) = sup else {
        return Ok(());
    };
    if let Some(name) = st.container.as_deref().filter(|_| in_container(st)) {
        // Podman's `run` may wait about 20 s past its container's end before it returns
        // (Podman 4.3, seen on this host when conmon's cleanup lost a race): removing the
        // ended container through the engine is what ends that wait, and the supervisor's.
        if poll_readable(&sup, CONTAINER_EXIT_GRACE) {
            return Ok(());
        }
        if let Ok(engine) = crate::container::engine::Engine::for_caller() {
            engine.podman_quiet(&["rm", "--force", "--time", "0", name]);
        }
    }
    if poll_readable(&sup, STOP_TIMEOUT) {
        return Ok(());
    }
    signal_service(st, libc::SIGKILL);
    if poll_readable(&sup, STOP_TIMEOUT) {
        return Ok(());
    }
    Err(BoxError::BadRequest {
        what: format!(
            "service `{}` did not stop within {} s (supervisor pid {}, log {})",
            st.service,
            2 * STOP_TIMEOUT.as_secs(),
            st.supervisor.pid,
            log_path(paths, &st.service).display()
        ),
        mend: format!("kill its supervisor: kill -KILL {}", st.supervisor.pid),
    })
}

/// Whether the service is a container of its own (process tier, and the supervised tier's
/// browser sidecar), whose recorded pid is the container init's.
fn in_container(st: &ServiceState) -> bool {
    st.tier != Tier::Workspace.as_str()
}

/// Signal the service: its container init (process tier), or its process group (workspace
/// tier: the service leads its own group, and its children are in it). Re-identified first.
fn signal_service(st: &ServiceState, sig: libc::c_int) -> bool {
    let Some(p) = st.pid else {
        return false;
    };
    let Some(fd) = p.pidfd() else {
        return false;
    };
    if in_container(st) {
        h5i_sys::pidfd::send_signal(&fd, sig).is_ok()
    } else {
        // The group the re-identified service leads; the pidfd held open keeps the pid (and so
        // the group id) from being recycled.
        h5i_sys::proc::signal_group(p.pid, sig).is_ok()
    }
}

/// The container init pid of a live process-tier service of `sb` whose network namespace is
/// still the one its supervisor recorded: a run of the same box joins it.
pub fn live_network_pid(sb: &StoredBox) -> Option<i32> {
    all_states(&sb.paths).into_iter().find_map(|st| {
        let p = st.pid?;
        let ino = st.netns_ino?;
        (st.tier == Tier::Process.as_str()
            && st.alive()
            && netns_ino(p.pid) == Some(ino)
            && netns_ino(std::process::id() as i32) != Some(ino))
        .then_some(p.pid)
    })
}

/// What a service's supervisor is handed by the verb that starts it (`box __service-supervise`):
/// work of the modules above the run path, which this one never names (`crate::cache` and
/// `crate::browser` open sessions and start services themselves; `tests/module_layers.rs`).
#[derive(Clone, Copy)]
pub struct FromAbove {
    /// What the box's caches grant the service's run (`crate::cache::run_grant::for_run`).
    pub caches: fn(&StoredBox, Tier) -> Result<CacheGrant, BoxError>,
    /// Serve the browser relay once the box's browser sidecar's pid is known
    /// (`crate::browser::sidecar::start_relay`).
    pub start_relay: fn(&BoxPaths, i32, Tier) -> Result<(), String>,
}

/// The hidden `box __service-supervise` verb: run `service` to its end, keeping its state
/// file, and record it. Never returns before the service has ended.
pub fn supervise(
    store: &BoxStore,
    name: &str,
    service: &str,
    above: FromAbove,
) -> Result<i32, ServiceError> {
    if !is_pipe(READY_FD) {
        return Err(BoxError::BadRequest {
            what: "`box __service-supervise` is h5i's internal supervisor and was started without its readiness pipe".into(),
            mend: format!("use `h5i box service start {name} {service}`"),
        }
        .into());
    }
    // SAFETY: READY_FD is an open pipe placed by `start` (dup2 before exec, checked above) and
    // nothing else in this process owns it; from here the OwnedFd is its only owner.
    let ready_fd = unsafe { OwnedFd::from_raw_fd(READY_FD) };
    set_cloexec(&ready_fd);
    let ready = Ready(Arc::new(Mutex::new(Some(fs::File::from(ready_fd)))));
    // Signals go to the supervising loop's signalfd, never to a forwarding thread.
    block_forwarded_signals();
    let result = supervise_inner(store, name, service, &ready, above);
    if let Err(e) = &result {
        eprintln!("h5i: {e}");
        ready.say(&format!("err {e}"));
    }
    result
}

/// The readiness pipe back to `service start`: said once, by whoever knows first.
#[derive(Clone)]
struct Ready(Arc<Mutex<Option<fs::File>>>);

impl Ready {
    fn say(&self, line: &str) {
        if let Ok(mut g) = self.0.lock() {
            if let Some(mut f) = g.take() {
                let _ = writeln!(f, "{line}");
            }
        }
    }
}

fn supervise_inner(
    store: &BoxStore,
    name: &str,
    service: &str,
    ready: &Ready,
    above: FromAbove,
) -> Result<i32, ServiceError> {
    let session = RunSession::open(store, name, Purpose::Service)?;
    let policy = session.policy();
    let paths = session.stored_box().paths.clone();
    let decl = declared(policy, name, service)?;
    require_servable(name, service, policy)?;
    let me = std::process::id() as i32;
    let supervisor = ProcId::of(me).ok_or_else(|| BoxError::BadRequest {
        what: "cannot read this process's own /proc entry".into(),
        mend: "mount /proc".into(),
    })?;
    let state = Arc::new(Mutex::new(ServiceState {
        service: service.to_string(),
        tier: policy.tier.as_str().to_string(),
        supervisor,
        pid: None,
        netns_ino: None,
        port: decl.port,
        host_port: None,
        port_note: None,
        started_ms: now_ms(),
        exit: None,
        ended_ms: None,
        receipt_seq: None,
        container: None,
    }));
    claim_state(&paths, &lock(&state))?;
    eprintln!(
        "h5i: service {service} of box {name}: starting `{}` at the {} tier",
        decl.command,
        policy.tier.as_str()
    );

    // The service's stdout comes through a pipe: its first line is the wrapper's readiness
    // marker (printed after the container is fully set up and before the command runs), the
    // rest is copied to the log. The session resolves its secrets and serves its credential
    // proxies in this supervisor, for as long as the service runs: every auth grant servable,
    // or the service does not start.
    let (out_r, out_w) = h5i_sys::fds::pipe().map_err(|e| BoxError::io(Path::new("pipe"), e))?;
    let log = io::stdout()
        .as_fd()
        .try_clone_to_owned()
        .map_err(|e| BoxError::io(Path::new("stdout"), e))?;
    let wrapped: Vec<OsString> = vec![
        "sh".into(),
        "-c".into(),
        format!("echo {READY_MARKER} $$ && exec sh -c \"$1\"").into(),
        "h5i-service".into(),
        decl.command.clone().into(),
    ];
    let mut drained = None;
    let mut out = Some((out_r, fs::File::from(log)));
    let mut starting = |how: Starting| {
        if let Some(out) = out.take() {
            drained = Some(spawn_starter(
                paths.clone(),
                Arc::clone(&state),
                ready.clone(),
                out,
                how,
                above.start_relay,
            ));
        }
    };
    let mut req = session.request(wrapped);
    req.caches = (above.caches)(session.stored_box(), policy.tier)?;
    req.recorded_argv = Some(vec!["sh".into(), "-c".into(), decl.command.clone().into()]);
    req.wall = None;
    req.stdio = SessionStdio::Service {
        stdout: out_w,
        starting: &mut starting,
    };
    if let Some(pid) = live_network_pid(session.stored_box()) {
        req.network = Network::JoinService(pid);
    }
    if service == crate::browser_box::SERVICE && crate::browser_box::lives_for_the_box(policy) {
        // At the container tier the group is the container's (`crate::container::BrowserPart`).
        if policy.tier != Tier::Container {
            req.edit_plan = Some(&crate::browser_box::own_group);
        }
        if policy.tier == Tier::Supervised {
            req.network = sandbox_network(session.stored_box())?;
        }
    }
    let outcome = session.run(req)?;
    // The last of its output reaches the log before the exit is recorded (bounded: a process
    // that escaped the box's end and still holds the pipe does not hold the record up).
    if let Some(drained) = drained {
        let _ = drained.recv_timeout(Duration::from_secs(5));
    }
    {
        let mut st = lock(&state);
        st.exit = Some(outcome.exit.clone());
        st.ended_ms = Some(now_ms());
        st.receipt_seq = Some(outcome.receipt_seq);
    }
    if !save(&paths, &state)? {
        eprintln!(
            "h5i: service {service} of box {name}: a later start runs the service now; this supervisor's end is in receipt {} only",
            outcome.receipt_seq
        );
    }
    eprintln!(
        "h5i: service {service} of box {name}: ended, exit {} (receipt {})",
        outcome.exit.passthrough_code(),
        outcome.receipt_seq
    );
    ready.say(&format!(
        "err it exited (exit {}) before it was running",
        outcome.exit.passthrough_code()
    ));
    Ok(0)
}

/// The network the supervised tier's sidecar of `sb` runs in: its live sandbox's.
fn sandbox_network(sb: &StoredBox) -> Result<Network, BoxError> {
    match crate::sandbox::live_init(sb) {
        Some((pid, _)) => Ok(Network::BoxSandbox(pid)),
        None => Err(BoxError::BadRequest {
            what: format!(
                "box `{}`'s browser joins the box's sandbox, and none is up",
                sb.manifest.name
            ),
            mend: format!("`h5i box run {} -- true` makes it", sb.manifest.name),
        }),
    }
}

fn lock(state: &Mutex<ServiceState>) -> std::sync::MutexGuard<'_, ServiceState> {
    state
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Write the supervisor's state while the service is still its own; false once a later start
/// took the service over (see `update_state`).
fn save(paths: &BoxPaths, state: &Mutex<ServiceState>) -> Result<bool, BoxError> {
    let st = lock(state).clone();
    update_state(paths, &st)
}

/// How the service's port reaches the host.
#[derive(Clone, Copy)]
enum Forward {
    /// It listens on the host's network already (workspace tier, `net.mode = "host"`).
    Host,
    /// It listens in its own network namespace: forward into it.
    Netns,
}

/// Read the service's stdout: wait for the readiness marker, then record the pid (the container
/// init's, from the file `h5i-runc` wrote before the marker, or the wrapper shell's own `$$`,
/// which becomes the service), make the forward, say ready, serve the forward on its own
/// thread, and copy the rest to the log.
fn spawn_starter(
    paths: BoxPaths,
    state: Arc<Mutex<ServiceState>>,
    ready: Ready,
    (out, mut log): (OwnedFd, fs::File),
    how: Starting,
    start_relay: fn(&BoxPaths, i32, Tier) -> Result<(), String>,
) -> std::sync::mpsc::Receiver<()> {
    let forward = match how.own_network {
        true => Forward::Netns,
        false => Forward::Host,
    };
    let (drained, rx) = std::sync::mpsc::channel();
    lock(&state).container = how.container.clone();
    std::thread::spawn(move || {
        let mut out = io::BufReader::new(fs::File::from(out));
        let mut first = String::new();
        let marker_pid = match io::BufRead::read_line(&mut out, &mut first) {
            Ok(n) if n > 0 => first
                .trim_end()
                .strip_prefix(READY_MARKER)
                .and_then(|rest| rest.trim().parse::<i32>().ok()),
            _ => None,
        };
        if marker_pid.is_none() {
            let _ = log.write_all(first.as_bytes());
            ready.say("err it ended before it was running");
            let _ = io::copy(&mut out, &mut log);
            let _ = drained.send(());
            return;
        }
        let pid = match how.pid {
            PidSource::Wrapper => marker_pid,
            PidSource::InitPidFile(f) => fs::read_to_string(f)
                .ok()
                .and_then(|t| t.trim().parse::<i32>().ok()),
        };
        // A forwarder process lives as long as this thread (its parent-death signal) and is
        // ended with the service's output.
        let mut forwarder = None;
        match pid.and_then(ProcId::of) {
            Some(proc_id) => {
                match start_forward(&paths, &state, proc_id, forward).and_then(|serve| {
                    let (service, tier) = {
                        let st = lock(&state);
                        (st.service.clone(), st.tier.clone())
                    };
                    if service == crate::browser_box::SERVICE {
                        let tier = tier.parse::<Tier>().unwrap_or(Tier::Process);
                        start_relay(&paths, proc_id.pid, tier).map_err(|e| {
                            BoxError::BadRequest {
                                what: e,
                                mend: "check the box's HOME (`h5i box doctor`)".into(),
                            }
                        })?;
                    }
                    Ok(serve)
                }) {
                    Ok(serve) => {
                        ready.say("ok");
                        match serve {
                            Some(Serve::Thread(l, ns, p)) => {
                                std::thread::spawn(move || serve_forward(l, Some(Arc::new(ns)), p));
                            }
                            Some(Serve::Process(child)) => forwarder = Some(child),
                            None => {}
                        }
                    }
                    Err(e) => ready.say(&format!("err {e}")),
                }
            }
            None => ready.say("err it ended before it could be observed"),
        }
        let _ = io::copy(&mut out, &mut log);
        if let Some(mut child) = forwarder {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = drained.send(());
    });
    rx
}

/// How a forward into the box's network namespace is served.
enum Serve {
    /// By threads of the supervisor (root: it may enter the namespace directly).
    Thread(TcpListener, OwnedFd, u16),
    /// By a forwarder process inside the box's user and network namespaces.
    Process(std::process::Child),
}

/// Record the service's pid and its port mapping; returns the forward to serve, if any.
fn start_forward(
    paths: &BoxPaths,
    state: &Mutex<ServiceState>,
    proc_id: ProcId,
    forward: Forward,
) -> Result<Option<Serve>, BoxError> {
    let mut serve = None;
    {
        let mut st = lock(state);
        st.pid = Some(proc_id);
        if matches!(forward, Forward::Netns) {
            st.netns_ino = netns_ino(proc_id.pid);
        }
        match (forward, st.port) {
            (_, None) => {}
            (Forward::Host, Some(p)) => {
                st.host_port = Some(p);
                st.port_note = Some(
                    "the host's own network: no isolation at this tier (or with net.mode = \"host\")"
                        .into(),
                );
            }
            (Forward::Netns, Some(p)) => match open_forward(proc_id.pid, p) {
                Ok((host_port, how)) => {
                    st.host_port = Some(host_port);
                    st.port_note = Some("forwarded into the box's own network namespace".into());
                    serve = Some(how);
                }
                Err(e) => st.port_note = Some(format!("{FORWARD_REFUSED}: {e}")),
            },
        }
    }
    if !save(paths, state)? {
        return Err(BoxError::BadRequest {
            what: "a later start of this service took it over before it was running".into(),
            mend: "read `h5i box service status` for the running one".into(),
        });
    }
    Ok(serve)
}

/// Bind the host side of the forward to `port` in the service's network namespace, and the
/// way to serve it: threads entering the namespace (root), else a forwarder process.
fn open_forward(pid: i32, port: u16) -> Result<(u16, Serve), String> {
    let open = |kind: &str| {
        let path = format!("/proc/{pid}/ns/{kind}");
        fs::File::open(&path)
            .map(OwnedFd::from)
            .map_err(|e| format!("cannot open {path}: {e}"))
    };
    let ns = open("net")?;
    let l = TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
        .map_err(|e| format!("cannot bind 127.0.0.1:0 on the host: {e}"))?;
    let host_port = l
        .local_addr()
        .map_err(|e| format!("the host listener has no address: {e}"))?
        .port();
    if h5i_sys::ids::euid() == 0 {
        let probe = ns
            .try_clone()
            .map_err(|e| format!("cannot duplicate the namespace fd: {e}"))?;
        std::thread::spawn(move || setns_net(&probe))
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("the probe thread panicked")))
            .map_err(|e| format!("entering the box's network namespace was refused: {e}"))?;
        return Ok((host_port, Serve::Thread(l, ns, port)));
    }
    let user = open("user")?;
    let child = spawn_forwarder([l.into(), user, ns], port)?;
    Ok((host_port, Serve::Process(child)))
}

/// Start `h5i box __service-forward PORT` with `fds` (the host listener, the box's user and
/// network namespaces) at [`FORWARD_FDS`], killed when the thread that started it ends; wait
/// for its word that it is inside (a line on its stdout).
fn spawn_forwarder(fds: [OwnedFd; 3], port: u16) -> Result<std::process::Child, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find h5i itself: {e}"))?;
    let raw = fds.each_ref().map(AsRawFd::as_raw_fd);
    let mut cmd = Command::new(exe);
    cmd.args(["box", "__service-forward", &port.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped());
    let parent = std::process::id();
    let pairs = [
        (raw[0], FORWARD_FDS[0]),
        (raw[1], FORWARD_FDS[1]),
        (raw[2], FORWARD_FDS[2]),
    ];
    // SAFETY: between fork and exec the closure makes only system calls (prctl, getppid,
    // fcntl, dup2: async-signal-safe, no allocation); `fds` stay open in the parent until
    // spawn returns.
    unsafe {
        cmd.pre_exec(move || {
            h5i_sys::proc::die_with_parent(parent)?;
            h5i_sys::fds::place_for_exec(&pairs)
        });
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot start the forwarder: {e}"))?;
    h5i_log::spawned(&cmd, Some(child.id()));
    drop(fds);
    let mut said = String::new();
    if let Some(out) = child.stdout.take() {
        let _ = io::BufRead::read_line(&mut io::BufReader::new(out), &mut said);
    }
    if said.trim_end() != "inside" {
        let _ = child.kill();
        let _ = child.wait();
        return Err(format!(
            "the forwarder could not enter the box's namespaces ({})",
            if said.is_empty() {
                "it ended"
            } else {
                said.trim_end()
            }
        ));
    }
    Ok(child)
}

/// The hidden `box __service-forward PORT` verb: join the user and network namespaces handed in
/// at [`FORWARD_FDS`] (before any thread exists: a threaded process cannot join a user
/// namespace), drop every capability that gave, say `inside`, then serve the host listener
/// into `127.0.0.1:PORT` there until killed.
pub fn forward_from_inside(port: u16) -> Result<i32, BoxError> {
    let refuse = |what: String| BoxError::BadRequest {
        what,
        mend: "use `h5i box service start BOX SERVICE`, which starts the forwarder".into(),
    };
    let [l, user, net] = FORWARD_FDS;
    if !is_listening_socket(l) {
        return Err(refuse(
            "`box __service-forward` is h5i's internal forwarder and was started without its listener".into(),
        ));
    }
    // SAFETY: the three descriptors were placed by the supervisor (dup2 before exec) and
    // nothing else in this process owns them; the listener was checked above.
    let (listener, user, net) = unsafe {
        (
            TcpListener::from_raw_fd(l),
            OwnedFd::from_raw_fd(user),
            OwnedFd::from_raw_fd(net),
        )
    };
    for fd in [listener.as_fd(), user.as_fd(), net.as_fd()] {
        let _ = rustix::io::fcntl_setfd(fd, rustix::io::FdFlags::CLOEXEC);
    }
    h5i_sys::ns::enter(user.as_fd(), h5i_sys::ns::Namespace::User)
        .and_then(|()| setns_net(&net))
        .and_then(|()| h5i_sys::caps::drop_all())
        .map_err(|e| refuse(format!("cannot join the box's namespaces: {e}")))?;
    drop((user, net));
    println!("inside");
    let _ = io::stdout().flush();
    serve_forward(listener, None, port);
    Ok(0)
}

/// Connect to `127.0.0.1:port` inside the network namespace of the live process-tier service
/// `service` of the box at `paths` (re-identified: its pid still the process the supervisor
/// recorded, the namespace opened still the inode it recorded): as root, from a thread of its
/// own that alone enters the namespace and ends after the connect; as an unprivileged caller,
/// from a forked child ([`connect_as_owner`]) whose socket is of `group` in the box's user
/// namespace (root's shows the kernel's overflow group there: it maps no id of root's).
pub fn connect_inside(
    paths: &BoxPaths,
    service: &str,
    port: u16,
    group: u32,
) -> io::Result<TcpStream> {
    let st = read_state(paths, service)
        .filter(ServiceState::alive)
        .ok_or_else(|| io::Error::other(format!("service {service} is not running")))?;
    let (Some(p), Some(ino)) = (st.pid, st.netns_ino) else {
        return Err(io::Error::other(format!(
            "service {service} has no network namespace of its own"
        )));
    };
    let ns = OwnedFd::from(fs::File::open(format!("/proc/{}/ns/net", p.pid))?);
    let opened = fs::File::from(ns.try_clone()?).metadata()?;
    use std::os::unix::fs::MetadataExt;
    if opened.ino() != ino || !p.alive() {
        return Err(io::Error::other(format!(
            "service {service} is no longer the process its supervisor recorded"
        )));
    }
    if h5i_sys::ids::euid() != 0 {
        return connect_as_owner(&ns, port, group);
    }
    std::thread::spawn(move || {
        setns_net(&ns)?;
        TcpStream::connect_timeout(
            &SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
            Duration::from_secs(10),
        )
    })
    .join()
    .unwrap_or_else(|_| Err(io::Error::other("the connecting thread panicked")))
}

/// Connect to `127.0.0.1:port` in the network namespace `net` as an unprivileged caller. The
/// kernel lets it in only from inside the namespace's owning user namespace (the caller's own
/// box's, where it holds every capability), which a threaded process cannot join: a forked
/// child joins that user namespace (asked of `net` itself, `NS_GET_USERNS`, never by pid), then
/// `net`, takes `group` (so the socket is of that group there), connects, and hands the
/// connected socket back (`h5i_sys::ns_socket::made_in`, which reaps it). Bounded: the
/// connect gives up after 10 s.
fn connect_as_owner(net: &OwnedFd, port: u16, group: u32) -> io::Result<TcpStream> {
    let user = h5i_sys::ns_socket::owning_user_namespace(net.as_fd())?;
    // The child's step makes system calls on stack values only: it allocates nothing.
    let sock = h5i_sys::ns_socket::made_in(
        net.as_fd(),
        Some(user.as_fd()),
        Duration::from_secs(15),
        || h5i_sys::ns_socket::connect_loopback_as(group, port, Duration::from_secs(10)),
    )?;
    Ok(TcpStream::from(sock))
}

/// Accept on the host side; for each connection, a thread connects to `127.0.0.1:port` in the
/// service's network namespace (entering it first when `netns` is given) and splices both ways.
fn serve_forward(listener: TcpListener, netns: Option<Arc<OwnedFd>>, port: u16) {
    for conn in listener.incoming() {
        let Ok(client) = conn else {
            continue;
        };
        let ns = netns.clone();
        std::thread::spawn(move || {
            // This thread alone enters the namespace; the socket it makes stays there.
            let entered = ns.as_deref().map_or(Ok(()), setns_net);
            let inside = entered.and_then(|()| {
                TcpStream::connect_timeout(
                    &SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
                    Duration::from_secs(10),
                )
            });
            match inside {
                Ok(inside) => splice(client, inside),
                Err(e) => {
                    eprintln!("h5i: forward to 127.0.0.1:{port} inside the box failed: {e}");
                }
            }
        });
    }
}

fn splice(a: TcpStream, b: TcpStream) {
    let (Ok(mut a2), Ok(mut b2)) = (a.try_clone(), b.try_clone()) else {
        return;
    };
    let up = std::thread::spawn(move || {
        let mut a = a;
        let mut b = b;
        let _ = io::copy(&mut a, &mut b);
        let _ = b.shutdown(std::net::Shutdown::Write);
    });
    let _ = io::copy(&mut b2, &mut a2);
    let _ = a2.shutdown(std::net::Shutdown::Write);
    let _ = up.join();
}

// ---- one small safe wrapper per kernel call ----

/// The inode of a process's network namespace.
fn netns_ino(pid: i32) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    fs::metadata(format!("/proc/{pid}/ns/net"))
        .ok()
        .map(|m| m.ino())
}

/// Whether `fd` became readable within `timeout` (a pidfd: the process ended).
fn poll_readable(fd: &OwnedFd, timeout: Duration) -> bool {
    matches!(h5i_sys::poll::readable(&[fd.as_fd()], Some(timeout)), Ok(r) if !r.is_empty())
}

/// Enter a network namespace on the calling thread only.
fn setns_net(ns: &OwnedFd) -> io::Result<()> {
    h5i_sys::ns::enter(ns.as_fd(), h5i_sys::ns::Namespace::Network)
}

/// Whether `fd` is a socket in the listening state.
fn is_listening_socket(fd: RawFd) -> bool {
    h5i_sys::fds::is_listening_socket(fd)
}

/// Whether `fd` is open and a pipe.
fn is_pipe(fd: RawFd) -> bool {
    h5i_sys::fds::is_pipe(fd)
}

fn set_cloexec(fd: &OwnedFd) {
    let _ = rustix::io::fcntl_setfd(fd, rustix::io::FdFlags::CLOEXEC);
}

/// Block the signals the supervising loop forwards, before any thread exists, so every thread
/// inherits the mask and they reach the loop's signalfd.
fn block_forwarded_signals() {
    // Standard signals only, so this cannot be refused.
    let _ = h5i_sys::signals::block_for_life(&[
        libc::SIGINT,
        libc::SIGTERM,
        libc::SIGHUP,
        libc::SIGQUIT,
    ]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_reidentified_by_its_start_time() {
        let me = ProcId::of(std::process::id() as i32).unwrap();
        assert!(me.alive());
        let other = ProcId {
            pid: me.pid,
            start: me.start + 1,
        };
        assert!(!other.alive());
    }

    #[test]
    fn only_workspace_and_process_run_services() {
        assert!(require_service_tier("b", Tier::Workspace).is_ok());
        assert!(require_service_tier("b", Tier::Process).is_ok());
        for tier in [Tier::Supervised, Tier::Container, Tier::Microvm] {
            let e = require_service_tier("b", tier).unwrap_err();
            assert!(matches!(e, ServiceError::TierUnsupported { .. }));
            assert!(e.to_string().contains(tier.as_str()) && e.to_string().contains("to fix:"));
        }
    }
}
