//! The egress proxy of one container-tier run: the broker's [`EgressProxy`] served from the
//! host on a listener bound on the box's own loopback.
//!
//! Owns, for one run: the allowlist (the profile's `net.egress` plus the user allowlist, merged
//! by the broker's rule: never into a deny-all profile), pinned once through the resolver
//! (the system's, or the `H5I_TEST_HOSTS` test seam) before anything starts; the
//! `h5i-hook listen --inside` createContainer hook that binds `127.0.0.1:PROXY_PORT` in the
//! box's network namespace and hands the fd over an AF_UNIX socket; the box's proxy
//! variables; and the report (the receipt's egress tally, the first denied attempts).
//!
//! The box has no network device but its own `lo` (`--network none`), so the proxy's listener
//! is the only way out, and it reaches exactly the pinned destinations. Must never: resolve a
//! name after the run starts, widen a deny-all profile, or start a box whose allowlist could
//! not be read.
//!
//! Guarded by `tests/container_tier.rs`.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::thread::JoinHandle;

use h5i_broker::egress::{
    merge_user_allowlist, EgressOptions, EgressPlan, EgressProxy, EgressReport,
};
use h5i_broker::pin::{AddressRules, SystemResolver};
use h5i_policy::{HostPort, ResolvedPolicy};

use crate::credentials::HandoffPlace;
use crate::error::BoxError;

/// The proxy's port on the box's loopback (the box's network namespace is new for every run,
/// so nothing else holds it; the credential proxies use 40000 and up).
pub const PROXY_PORT: u16 = 3128;

/// The run's allowlist, pinned; `None` when the box may reach nothing. With the
/// `H5I_TEST_HOSTS` seam set, names resolve through that map only (each listed name at the
/// port its egress entry names, as the supervised tier reads the seam); the address rules are
/// production's either way.
pub fn plan_for(policy: &ResolvedPolicy) -> Result<Option<EgressPlan>, BoxError> {
    let user = user_allowlist()?;
    let merged = merge_user_allowlist(&policy.net.egress, &user);
    if merged.is_empty() {
        return Ok(None);
    }
    let rules = AddressRules::production().map_err(|e| BoxError::BadRequest {
        what: format!("cannot list this host's addresses for the egress proxy: {e}"),
        mend: "check `ip addr` works on the host".into(),
    })?;
    let plan = match crate::credentials::test_hosts_resolver(&merged)? {
        Some(map) => EgressPlan::build(&merged, &map, &rules),
        None => EgressPlan::build(&merged, &SystemResolver, &rules),
    };
    Ok(Some(plan))
}

/// The user allowlist (`~/.config/h5i/allow.txt`), empty when there is none.
fn user_allowlist() -> Result<Vec<HostPort>, BoxError> {
    let env = |k: &str| std::env::var(k).ok();
    let Ok(path) = crate::allow::allowlist_path(env) else {
        return Ok(Vec::new());
    };
    crate::allow::list(&path).map_err(|e| BoxError::BadRequest {
        what: e.to_string().trim_start_matches("refusing: ").to_owned(),
        mend: format!("fix or remove {}", path.display()),
    })
}

/// The box's variables pointing proxy-respecting clients at the proxy (the loopback itself,
/// where the credential proxies listen, stays direct).
pub fn proxy_env() -> Vec<(String, String)> {
    let url = format!("http://127.0.0.1:{PROXY_PORT}");
    let no_proxy = "127.0.0.1,localhost,::1".to_string();
    vec![
        ("HTTP_PROXY".into(), url.clone()),
        ("HTTPS_PROXY".into(), url.clone()),
        ("http_proxy".into(), url.clone()),
        ("https_proxy".into(), url),
        ("NO_PROXY".into(), no_proxy.clone()),
        ("no_proxy".into(), no_proxy),
    ]
}

/// The proxy, waiting for its listener or serving.
pub struct EgressServing {
    sock: PathBuf,
    handle: Option<JoinHandle<Result<EgressProxy, String>>>,
}

impl std::fmt::Debug for EgressServing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EgressServing")
            .field("sock", &self.sock)
            .finish()
    }
}

/// Set up the handoff: the hook argv to declare (after `loopback`) and the waiting proxy.
pub fn attach(
    plan: EgressPlan,
    place: &HandoffPlace,
    run_id: &str,
) -> Result<(Vec<String>, EgressServing), BoxError> {
    let sock = place.dir.join(format!("egress-{run_id}.sock"));
    let unix = place.bind(&sock)?;
    let want = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, PROXY_PORT));
    let hook = vec![
        place.hook.display().to_string(),
        "listen".into(),
        "--inside".into(),
        "--port".into(),
        PROXY_PORT.to_string(),
        "--send".into(),
        sock.display().to_string(),
    ];
    let handle = std::thread::spawn(move || receive_and_serve(unix, want, plan));
    Ok((
        hook,
        EgressServing {
            sock,
            handle: Some(handle),
        },
    ))
}

fn receive_and_serve(
    unix: UnixListener,
    want: SocketAddr,
    plan: EgressPlan,
) -> Result<EgressProxy, String> {
    let (conn, _) = unix.accept().map_err(|e| e.to_string())?;
    let fd = crate::credentials::receive_fd(&conn).map_err(|e| e.to_string())?;
    let listener = TcpListener::from(fd);
    match listener.local_addr() {
        Ok(a) if a == want => {}
        other => return Err(format!("the hook sent a listener on {other:?}, not {want}")),
    }
    EgressProxy::serve(listener, plan, EgressOptions::default()).map_err(|e| e.to_string())
}

impl EgressServing {
    /// After the run: stop the proxy, remove its socket, and return what it saw (`None` when
    /// the box never started, so the hook never handed the listener over).
    pub fn finish(mut self) -> Option<EgressReport> {
        let handle = self.handle.take()?;
        if !handle.is_finished() {
            // Wake the accept: the hook never ran, so nothing else will.
            let _ = UnixStream::connect(&self.sock);
        }
        let _ = std::fs::remove_file(&self.sock);
        handle.join().ok()?.ok().map(EgressProxy::shutdown)
    }
}
