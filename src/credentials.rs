//! The credential proxy wired into a process-tier box: one [`CredentialProxy`] per auth grant,
//! served from the host on a listener that lives on the box's own loopback.
//!
//! Owns, for one run: resolving the policy's grants (fail closed: an unset credential or an
//! unpinnable host refuses the run before anything starts), the box's variables (the grant's
//! `base_url_var` pointing at `http://127.0.0.1:PORT` and its `token_var` holding the per-run
//! dummy), the `h5i-hook listen --inside` createContainer hook that binds `127.0.0.1:PORT` in
//! the box's network namespace and sends the fd back over an AF_UNIX socket in h5i's private
//! runtime directory, serving the proxy on that fd for the life of the run, and the values the
//! receipt must never hold (the real credential and the dummy). A box on the host's network
//! (`net.mode = "host"`) gets a listener h5i binds itself on the host's loopback. A run in the
//! box's sandbox, whose network namespace outlives the run, gets its listeners made for that
//! run in that namespace by h5i itself ([`ForRun::serve_in_sandbox`]: a forked child enters it,
//! binds and hands the socket back), its own dummy, and its own tally; the listeners close when
//! the run ends, so no run's proxy serves the next.
//!
//! With `credential_proxy = false` (`H5I_CREDENTIAL_PROXY=0`) no proxy runs and the real
//! credential is passed into the box under the grant's `token_var` (documented behaviour; the
//! base-URL variable stays unset).
//!
//! Test seams, compiled only with the `test-seams` cargo feature (the test build; a release
//! build without it never reads them), read from h5i's own environment, never set by h5i:
//! - `H5I_TEST_HOSTS=name=ip:port[,name=ip:port...]` replaces the system resolver with exactly
//!   this map and allows loopback upstreams;
//! - `H5I_TEST_CA_FILE=/abs/path/ca.der` adds one DER CA certificate to the upstream roots.
//!
//! Either one set makes both required and valid (an absolute path to a readable DER file; every
//! entry `name=ip:port`), else the run is refused: a half-set seam never quietly weakens a real
//! run.
//!
//! Must never: put the real credential in the box's environment while the proxy is on, leave a
//! run's listener or socket behind, or start a box whose grant cannot be served.
//!
//! [`ForRun`] is the one entry every process-tier verb uses (`box run`, `box shell`, and a
//! service's supervisor, whose proxies live as long as the service does).
//!
//! Guarded by `tests/credentials.rs`.

use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener};
use std::os::fd::OwnedFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;

use h5i_broker::credential::{
    routes_for_policy, CredentialError, CredentialOptions, CredentialProxy, CredentialReport,
    CredentialRoute, UpstreamTls, UPSTREAM_PORT,
};
use h5i_broker::pin::{AddressRules, MapResolver, Resolver, SystemResolver};
use h5i_broker::redact::SecretValue;
use h5i_policy::receipt::EgressTally;
use h5i_policy::ResolvedPolicy;
use h5i_runtime::bundle::BundlePlan;
use h5i_sys::fd_passing::Wait;

use crate::error::BoxError;

/// Test seam: `name=ip:port,...` resolves upstream names through this map only, loopback allowed.
pub const TEST_HOSTS_VAR: &str = "H5I_TEST_HOSTS";
/// Test seam: an absolute path to one DER CA certificate added to the upstream roots.
pub const TEST_CA_VAR: &str = "H5I_TEST_CA_FILE";

/// A policy's grants, resolved for one run and not yet attached to a box.
#[derive(Debug)]
pub struct Prepared {
    routes: Vec<CredentialRoute>,
    tls: Option<UpstreamTls>,
    /// `credential_proxy = false`: the real credentials, by `token_var`.
    passthrough: Vec<(String, String)>,
}

fn refused(e: CredentialError) -> BoxError {
    let text = e.to_string();
    let text = text.strip_prefix("refusing: ").unwrap_or(&text);
    let (what, mend) = text
        .split_once("; to fix: ")
        .unwrap_or((text, "check the profile's [[auth]] grants"));
    BoxError::BadRequest {
        what: what.to_owned(),
        mend: mend.to_owned(),
    }
}

fn seam_error(what: String) -> BoxError {
    BoxError::BadRequest {
        what,
        mend: format!(
            "{TEST_HOSTS_VAR} and {TEST_CA_VAR} are test seams: set both (`name=ip:port,...` and an absolute path to a DER CA file) or neither"
        ),
    }
}

/// A test seam's value: read only in a build with the `test-seams` feature.
fn seam_var(name: &str) -> Option<std::ffi::OsString> {
    #[cfg(feature = "test-seams")]
    {
        std::env::var_os(name)
    }
    #[cfg(not(feature = "test-seams"))]
    {
        let _ = name;
        None
    }
}

/// The test seams, when set: the resolver map and the extra root. `None` when neither is set.
fn test_seams() -> Result<Option<(MapResolver, Vec<u8>)>, BoxError> {
    let hosts = seam_var(TEST_HOSTS_VAR);
    let ca = seam_var(TEST_CA_VAR);
    let (hosts, ca) = match (hosts, ca) {
        (None, None) => return Ok(None),
        (Some(h), Some(c)) => (h, c),
        _ => {
            return Err(seam_error(
                "only one of the credential test seams is set".into(),
            ))
        }
    };
    let map = MapResolver::new();
    for (name, addr) in parse_test_hosts(hosts)? {
        map.insert(&name, UPSTREAM_PORT, vec![addr]);
    }
    let ca = PathBuf::from(ca);
    if !ca.is_absolute() {
        return Err(seam_error(format!(
            "{TEST_CA_VAR}={} is not an absolute path",
            ca.display()
        )));
    }
    let der = std::fs::read(&ca).map_err(|e| BoxError::io(&ca, e))?;
    Ok(Some((map, der)))
}

/// The `H5I_TEST_HOSTS` map, `name=ip:port,...`, as (normalized name, address) pairs.
pub(crate) fn parse_test_hosts(
    hosts: std::ffi::OsString,
) -> Result<Vec<(String, SocketAddr)>, BoxError> {
    let hosts = hosts
        .into_string()
        .map_err(|_| seam_error(format!("{TEST_HOSTS_VAR} is not UTF-8")))?;
    let mut out = Vec::new();
    for entry in hosts.split(',').filter(|e| !e.is_empty()) {
        let (name, addr) = entry
            .split_once('=')
            .ok_or_else(|| seam_error(format!("{TEST_HOSTS_VAR} entry `{entry}` has no `=`")))?;
        let name = h5i_policy::values::normalize_host(name)
            .map_err(|why| seam_error(format!("{TEST_HOSTS_VAR}: {why}")))?;
        let addr: SocketAddr = addr.parse().map_err(|_| {
            seam_error(format!(
                "{TEST_HOSTS_VAR} entry `{entry}` is not name=ip:port"
            ))
        })?;
        out.push((name, addr));
    }
    Ok(out)
}

/// The `H5I_TEST_HOSTS` seam as a resolver for `egress` (each name at the destination's own
/// port), or `None` when the seam is unset and the system resolver applies.
pub(crate) fn test_hosts_resolver(
    egress: &[h5i_policy::values::HostPort],
) -> Result<Option<MapResolver>, BoxError> {
    let Some(v) = seam_var(TEST_HOSTS_VAR) else {
        return Ok(None);
    };
    let entries = parse_test_hosts(v)?;
    let map = MapResolver::new();
    for hp in egress {
        let addrs: Vec<SocketAddr> = entries
            .iter()
            .filter(|(n, _)| *n == hp.host)
            .map(|(_, a)| SocketAddr::new(a.ip(), hp.port))
            .collect();
        map.insert(&hp.host, hp.port, addrs);
    }
    Ok(Some(map))
}

/// Resolve the policy's grants for one run, or refuse before anything starts.
pub fn prepare(policy: &ResolvedPolicy) -> Result<Prepared, BoxError> {
    let lookup = |var: &str| std::env::var(var).ok();
    if policy.auth_grants().is_empty() {
        return Ok(Prepared {
            routes: Vec::new(),
            tls: None,
            passthrough: Vec::new(),
        });
    }
    if !policy.credential_proxy {
        let mut passthrough = Vec::new();
        for g in policy.auth_grants() {
            let (chosen, value) = g.choose(lookup).ok_or_else(|| {
                refused(CredentialError::Unresolved {
                    host: g.host.clone(),
                    grant: Box::new(g.clone()),
                })
            })?;
            passthrough.push((chosen.token_var, value));
        }
        return Ok(Prepared {
            routes: Vec::new(),
            tls: None,
            passthrough,
        });
    }
    let (routes, tls) = match test_seams()? {
        Some((map, der)) => {
            let routes =
                routes_for_policy(policy, lookup, &map, &AddressRules::allowing_loopback())
                    .map_err(refused)?;
            let tls = UpstreamTls::webpki_with_extra_root(&der).map_err(refused)?;
            (routes, tls)
        }
        None => {
            let rules = AddressRules::production().map_err(|e| BoxError::BadRequest {
                what: format!("cannot list this host's addresses for the credential proxy: {e}"),
                mend: "check `ip addr` works on the host".into(),
            })?;
            let resolver: &dyn Resolver = &SystemResolver;
            let routes = routes_for_policy(policy, lookup, resolver, &rules).map_err(refused)?;
            (routes, UpstreamTls::webpki().map_err(refused)?)
        }
    };
    Ok(Prepared {
        routes,
        tls: Some(tls),
        passthrough: Vec::new(),
    })
}

impl Prepared {
    /// Every value the run's records must never hold: each real credential and each dummy.
    pub fn redactions(&self) -> Vec<SecretValue> {
        let mut v = Vec::new();
        for r in &self.routes {
            v.push(r.redaction());
            v.push(SecretValue::new(
                format!("credential-dummy:{}", r.grant().token_var),
                r.dummy_token(),
            ));
        }
        v
    }

    /// Hand the box its variables and start serving: with the proxy on, each grant's base URL
    /// and dummy go into `plan`'s environment and its listener is set up (a createContainer
    /// hook in the box's network namespace, or a host-loopback bind for a host-network box);
    /// with it off, the real credentials go in under their `token_var`.
    pub fn attach(self, plan: &mut BundlePlan) -> Result<Serving, BoxError> {
        let needs_hook = !plan.host_network && self.tls.is_some() && !self.routes.is_empty();
        let hook = match crate::tier_host::hook_binary() {
            Some(h) => h,
            None if needs_hook => return Err(BoxError::BadRequest {
                what: "h5i-hook (which sets up the credential proxy's listener in the box) is not beside h5i or on PATH".into(),
                mend: "install h5i with `cargo install --path .`, which puts h5i-hook beside h5i (or put it on PATH)".into(),
            }),
            None => PathBuf::new(),
        };
        let place = HandoffPlace::for_plan(plan.uid, plan.gid, hook)?;
        self.attach_parts(
            &mut plan.env,
            &mut plan.create_container_hooks,
            plan.host_network,
            &place,
        )
    }

    /// [`Prepared::attach`] for a box whose environment and createContainer hooks are not a
    /// [`BundlePlan`] (the container tier): the hook's socket goes into `place`.
    pub fn attach_parts(
        self,
        env: &mut Vec<String>,
        hooks: &mut Vec<Vec<String>>,
        host_network: bool,
        place: &HandoffPlace,
    ) -> Result<Serving, BoxError> {
        for (var, value) in &self.passthrough {
            env.push(format!("{var}={value}"));
        }
        let mut serving = Serving {
            waiters: Vec::new(),
        };
        let Some(tls) = self.tls else {
            return Ok(serving);
        };
        let base = port_base();
        for (i, route) in self.routes.into_iter().enumerate() {
            if host_network {
                serve_on(host_loopback_listener()?, route, &tls, env, &mut serving)?;
                continue;
            }
            let port = base + i as u16;
            let addr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port));
            let sock = place.dir.join(format!(
                "cred-{}-{}-{i}.sock",
                std::process::id(),
                crate::store::now_ms() % 1_000_000
            ));
            let unix = place.bind(&sock)?;
            add_env(env, &route, addr);
            hooks.push(vec![
                place.hook.display().to_string(),
                "listen".into(),
                "--inside".into(),
                "--port".into(),
                port.to_string(),
                "--send".into(),
                sock.display().to_string(),
            ]);
            let tls = tls.clone();
            let handle = std::thread::spawn(move || receive_and_serve(unix, addr, route, tls));
            serving.waiters.push(Waiter::Pending { sock, handle });
        }
        Ok(serving)
    }
}

impl Prepared {
    /// Whether a proxy serves the grants (else there are none, or they pass through).
    fn has_proxies(&self) -> bool {
        self.tls.is_some() && !self.routes.is_empty()
    }

    /// [`Prepared::attach`] for a run in the box's sandbox, whose network namespace outlives
    /// the run: each grant's listener is made now, for this run, inside the network namespace
    /// of the sandbox's init `init_pid` (a forked child enters it: `h5i_sys::ns_socket`), or
    /// on the host's loopback when `init_pid` is `None` (a box on the host's network); the
    /// run's environment gets each grant's base URL and this run's dummy. The listeners close
    /// when [`Serving::finish`] stops the proxies, so no run's port outlives it.
    fn attach_in_sandbox(
        self,
        env: &mut Vec<String>,
        init_pid: Option<i32>,
    ) -> Result<Serving, BoxError> {
        for (var, value) in &self.passthrough {
            env.push(format!("{var}={value}"));
        }
        let mut serving = Serving {
            waiters: Vec::new(),
        };
        let Some(tls) = self.tls else {
            return Ok(serving);
        };
        let namespaces = init_pid.map(sandbox_namespaces).transpose()?;
        let base = port_base();
        for (i, route) in self.routes.into_iter().enumerate() {
            let listener = match &namespaces {
                None => host_loopback_listener()?,
                Some(ns) => listener_in(ns, base + i as u16)?,
            };
            serve_on(listener, route, &tls, env, &mut serving)?;
        }
        Ok(serving)
    }
}

/// A listener on the host's loopback, on a port the kernel picks.
fn host_loopback_listener() -> Result<TcpListener, BoxError> {
    TcpListener::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0))
        .map_err(|e| BoxError::io(Path::new("127.0.0.1:0"), e))
}

/// Serve `route` on `listener` until [`Serving::finish`]: the run's environment gets the
/// listener's address, and `serving` the running proxy.
fn serve_on(
    listener: TcpListener,
    route: CredentialRoute,
    tls: &UpstreamTls,
    env: &mut Vec<String>,
    serving: &mut Serving,
) -> Result<(), BoxError> {
    let addr = listener
        .local_addr()
        .map_err(|e| BoxError::io(Path::new("credential listener"), e))?;
    add_env(env, &route, addr);
    let proxy = CredentialProxy::serve(listener, route, tls.clone(), CredentialOptions::default())
        .map_err(|e| BoxError::io(Path::new("credential proxy"), e))?;
    serving.waiters.push(Waiter::Running(proxy));
    Ok(())
}

/// How long the child entering the sandbox's namespaces may take to hand a listener back.
const LISTENER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// The network namespace of the sandbox init `init_pid` (and its user namespace, when entering
/// the network namespace needs it: not for real root), checked to be a namespace of the box's
/// own, never the host's.
fn sandbox_namespaces(init_pid: i32) -> Result<h5i_hook::netns::BoxNamespaces, BoxError> {
    let open = |ns: &str| {
        let path = PathBuf::from(format!("/proc/{init_pid}/ns/{ns}"));
        crate::denied_egress::open_after_exec(&path)
            .map(OwnedFd::from)
            .map_err(|e| BoxError::io(&path, e))
    };
    h5i_hook::netns::BoxNamespaces::new(open("net")?, open("user")?).map_err(|e| {
        BoxError::BadRequest {
            what: format!("cannot serve the credential grants in the box's sandbox: {e}"),
            mend: "run again with H5I_SANDBOX=off to use a container per run, and report this"
                .into(),
        }
    })
}

/// A TCP listener on `127.0.0.1:port` made inside the sandbox's network namespace `ns`, where
/// the box's runs reach it on their own loopback.
fn listener_in(ns: &h5i_hook::netns::BoxNamespaces, port: u16) -> Result<TcpListener, BoxError> {
    use std::os::fd::AsFd;
    let addr = SocketAddrV4::new(Ipv4Addr::LOCALHOST, port);
    let fd = h5i_sys::tcp_in_ns::listener_in(
        ns.net().as_fd(),
        ns.user().map(AsFd::as_fd),
        addr,
        LISTENER_TIMEOUT,
    )
    .map_err(|e| BoxError::BadRequest {
        what: format!("cannot listen on {addr} in the box's sandbox for its credential proxy: {e}"),
        mend: "run again (another port is picked), or with H5I_SANDBOX=off for a container per run"
            .into(),
    })?;
    Ok(TcpListener::from(fd))
}

/// Where a listener hook's AF_UNIX socket goes, and who runs the hook.
#[derive(Debug, Clone)]
pub struct HandoffPlace {
    /// A directory the hook can reach and nothing else on the host can write.
    pub dir: PathBuf,
    /// The socket's owner when the hook runs as another user (a rootless engine's): it is
    /// chowned to them, mode 0600.
    pub owner: Option<(u32, u32)>,
    /// `h5i-hook`, as the runtime will find it.
    pub hook: PathBuf,
}

impl HandoffPlace {
    /// Where a kernel-tier box's createContainer hook, running as the box's root `uid:gid`,
    /// can reach h5i: the private runtime directory when the box's root is the caller, else
    /// (a root caller's box root is h5i-box's range) the handoff directory of that uid.
    pub fn for_plan(uid: u32, gid: u32, hook: PathBuf) -> Result<HandoffPlace, BoxError> {
        if uid == h5i_sys::ids::euid() {
            Ok(HandoffPlace {
                dir: crate::tier_host::runtime_dir()?,
                owner: None,
                hook,
            })
        } else {
            Ok(HandoffPlace {
                dir: crate::identity::handoff_dir(uid, gid)?,
                owner: Some((uid, gid)),
                hook,
            })
        }
    }

    /// Bind the socket at `sock` (replacing a stale one) and give it to the owner.
    pub fn bind(&self, sock: &Path) -> Result<UnixListener, BoxError> {
        let _ = std::fs::remove_file(sock);
        let unix = UnixListener::bind(sock).map_err(|e| BoxError::io(sock, e))?;
        if let Some((uid, gid)) = self.owner {
            use std::os::unix::fs::PermissionsExt;
            std::os::unix::fs::chown(sock, Some(uid), Some(gid))
                .and_then(|()| {
                    std::fs::set_permissions(sock, std::fs::Permissions::from_mode(0o600))
                })
                .map_err(|e| BoxError::io(sock, e))?;
        }
        Ok(unix)
    }
}

fn add_env(env: &mut Vec<String>, route: &CredentialRoute, addr: SocketAddr) {
    for (k, v) in route.box_env(addr) {
        env.retain(|e| !e.starts_with(&format!("{k}=")));
        env.push(format!("{k}={v}"));
    }
}

/// A port on the box's loopback for the first grant (the next grants take the ports after it):
/// fixed before the box exists, since its environment names it; varied per run so a run that
/// joins a live service's network namespace does not meet a port an earlier run still holds.
fn port_base() -> u16 {
    let seed = u64::from(std::process::id()) ^ crate::store::now_ms();
    40_000 + (seed % 20_000) as u16
}

/// Wait for the hook's one message, take the listener it carries, and serve `route` on it.
fn receive_and_serve(
    unix: UnixListener,
    want: SocketAddr,
    route: CredentialRoute,
    tls: UpstreamTls,
) -> Result<CredentialProxy, String> {
    let (conn, _) = unix.accept().map_err(|e| e.to_string())?;
    let fd = receive_fd(&conn).map_err(|e| e.to_string())?;
    let listener = TcpListener::from(fd);
    match listener.local_addr() {
        Ok(a) if a == want => {}
        other => return Err(format!("the hook sent a listener on {other:?}, not {want}")),
    }
    CredentialProxy::serve(listener, route, tls, CredentialOptions::default())
        .map_err(|e| e.to_string())
}

/// Receive the one listener the hook sends over `sock` (close-on-exec); a message with more
/// descriptors, or none, is refused.
pub(crate) fn receive_fd(sock: &UnixStream) -> io::Result<OwnedFd> {
    let mut byte = [0u8; 1];
    let got = h5i_sys::fd_passing::recv_with_fds(sock, &mut byte, 1, Wait::Block)?;
    got.fds
        .into_iter()
        .next()
        .ok_or_else(|| io::Error::other("no listener fd arrived"))
}

enum Waiter {
    Pending {
        sock: PathBuf,
        handle: JoinHandle<Result<CredentialProxy, String>>,
    },
    Running(CredentialProxy),
}

/// The run's credential proxies, serving until [`Serving::finish`].
pub struct Serving {
    waiters: Vec<Waiter>,
}

impl std::fmt::Debug for Serving {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Serving")
            .field("proxies", &self.waiters.len())
            .finish()
    }
}

impl Serving {
    /// After the run: stop every proxy (as [`Serving::finish`]) and give their counts as the
    /// run's egress tally, or `None` when no proxy ran.
    pub fn tally(self) -> Option<EgressTally> {
        tally(&self.finish())
    }

    /// After the run: stop every proxy and remove its socket. Returns each proxy's report (a
    /// proxy that never got its listener, because the box never started, reports nothing).
    pub fn finish(self) -> Vec<CredentialReport> {
        let mut reports = Vec::new();
        for w in self.waiters {
            let proxy = match w {
                Waiter::Running(p) => Some(p),
                Waiter::Pending { sock, handle } => {
                    if !handle.is_finished() {
                        // Wake the accept: the hook never ran, so nothing else will.
                        let _ = UnixStream::connect(&sock);
                    }
                    let _ = std::fs::remove_file(&sock);
                    handle.join().ok().and_then(Result::ok)
                }
            };
            if let Some(p) = proxy {
                reports.push(p.shutdown());
            }
        }
        reports
    }
}

/// The credential proxies of one process-tier run (`box run`, `box shell`, a service's
/// supervisor), from before its plan exists until it has ended.
#[derive(Debug)]
pub struct ForRun {
    prepared: Option<Prepared>,
    scrub: Vec<SecretValue>,
}

impl ForRun {
    /// Resolve the policy's grants when the run is at a kernel tier whose box has a network of
    /// its own to serve them on (process, supervised); refuse before anything starts when a
    /// grant cannot be served.
    pub fn prepare(policy: &ResolvedPolicy) -> Result<ForRun, BoxError> {
        let prepared = match policy.tier {
            h5i_policy::Tier::Process
            | h5i_policy::Tier::Supervised
            | h5i_policy::Tier::Container => Some(prepare(policy)?),
            _ => None,
        };
        let scrub = prepared
            .as_ref()
            .map(Prepared::redactions)
            .unwrap_or_default();
        Ok(ForRun { prepared, scrub })
    }

    /// No grants: a run of h5i's own (the box sandbox's making for its browser), not the
    /// box's.
    pub fn none() -> ForRun {
        ForRun {
            prepared: None,
            scrub: Vec::new(),
        }
    }

    /// Every value the run's records must never hold.
    pub fn redactions(&self) -> Vec<SecretValue> {
        self.scrub.clone()
    }

    /// The resolved grants, for a tier that attaches them itself (the container tier hands
    /// them to its engine's hooks).
    pub fn into_prepared(self) -> Option<Prepared> {
        self.prepared
    }

    /// Whether the run's grants are served by proxies (each needs a listener in the box's
    /// network), rather than none or passed through.
    pub fn has_proxies(&self) -> bool {
        self.prepared.as_ref().is_some_and(Prepared::has_proxies)
    }

    /// Serve the grants for one run in the box's sandbox ([`Prepared::attach_in_sandbox`]):
    /// the listeners in the network namespace of the sandbox's init `init_pid` (the host's
    /// loopback when `None`), the variables in `env`. Takes the grants: `None` when there were
    /// none (or they were taken already). The caller stops the proxies once the run ended.
    pub fn serve_in_sandbox(
        &mut self,
        init_pid: Option<i32>,
        env: &mut Vec<String>,
    ) -> Result<Option<Serving>, BoxError> {
        match self.prepared.take() {
            Some(prepared) => prepared.attach_in_sandbox(env, init_pid).map(Some),
            None => Ok(None),
        }
    }

    /// Attach the proxies to `plan`, run it with `run`, and stop them once `run` returns: they
    /// serve exactly as long as the box runs. Returns `run`'s result and the proxies' tally.
    pub fn serve_during<T>(
        self,
        mut plan: BundlePlan,
        run: impl FnOnce(BundlePlan) -> T,
    ) -> Result<(T, Option<EgressTally>), BoxError> {
        let Some(prepared) = self.prepared else {
            return Ok((run(plan), None));
        };
        let serving = prepared.attach(&mut plan)?;
        let out = run(plan);
        Ok((out, tally(&serving.finish())))
    }
}

/// The proxies' counts as the run record's egress tally (`host:443` -> forwarded requests;
/// refused requests under `denied`), or `None` when no proxy ran.
pub fn tally(reports: &[CredentialReport]) -> Option<EgressTally> {
    if reports.is_empty() {
        return None;
    }
    let mut t = EgressTally::default();
    for r in reports {
        let key = format!("{}:{UPSTREAM_PORT}", r.host);
        *t.allowed.entry(key.clone()).or_default() += r.forwarded;
        let refused: u64 = r.refused.values().sum();
        if refused > 0 {
            *t.denied.entry(key).or_default() += refused;
        }
    }
    Some(t)
}
