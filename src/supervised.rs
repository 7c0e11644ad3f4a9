//! The supervised tier from the box's side: the process tier's bundle, plus a network namespace
//! whose only way out is an nftables table pinned to the addresses `net.egress` resolved to when
//! the run started, names answered by a generated hosts file (no resolver), and the socket()
//! gate.
//!
//! Owns, for one run (a container of its own, or a run in the box's supervised sandbox, whose
//! sentry `begin`s and `end`s each run: `crate::sandbox`): pinning `net.egress` on the host (through the broker's address rules, so a
//! name that resolves to loopback, link-local or one of the host's own addresses is refused, and
//! a name that re-resolves later never widens anything: the box only ever gets these addresses),
//! the run's private net directory (`net.sock`, `gate.sock`, `tally.json` of the `h5i-hook`
//! sentry), the box's `/etc/hosts` and `/etc/resolv.conf`, the `h5i.net.*` annotations and the
//! three hooks (`net-up` createRuntime, `net-inside` createContainer, `net-down` poststop), and
//! reading the sentry's tally back for the receipt and `status`.
//!
//! Must never: start a box whose egress could not be pinned, give the box a resolver, or report
//! a table other than the one the sentry says it loaded.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use h5i_hook::net_spec::{NET_SOCK, SENTRY_LOG, TALLY};

use h5i_broker::pin::{pin, AddressRules, Pinned, Resolver, SystemResolver};
use h5i_policy::receipt::{EgressTally, LoadedEgressTable, NetTally, PinnedRule, SocketGateTally};
use h5i_policy::ResolvedPolicy;
use h5i_runtime::bundle::BundlePlan;

use crate::error::BoxError;
use crate::store::StoredBox;

pub use h5i_policy::spec_names::annotation::{
    NET as NET_ANNOTATION, NET_DIR as NET_DIR_ANNOTATION, NET_EGRESS as NET_EGRESS_ANNOTATION,
};

/// Pin every `net.egress` destination for one run, or refuse naming the one that cannot be.
///
/// With the `H5I_TEST_HOSTS` seam set, names resolve through that map only (tests never ask
/// the system resolver). A loopback answer there is a credential stand-in on the host's
/// loopback, which the box reaches only through the credential proxy: such a destination is
/// left out of the table (the sentry refuses loopback rules, and the box's `127.0.0.1` is its
/// own anyway), never widened to the host.
pub fn pin_egress(policy: &ResolvedPolicy) -> Result<Vec<PinnedRule>, BoxError> {
    if policy.net.egress.is_empty() {
        return Ok(Vec::new());
    }
    let seam = crate::credentials::test_hosts_resolver(&policy.net.egress)?;
    let rules = match seam {
        Some(_) => AddressRules::allowing_loopback(),
        None => AddressRules::production().map_err(|e| BoxError::BadRequest {
            what: format!("cannot list this host's addresses to pin net.egress: {e}"),
            mend: "check `ip addr` works on the host".into(),
        })?,
    };
    let seamed = seam.is_some();
    let resolver: &dyn Resolver = match &seam {
        Some(map) => map,
        None => &SystemResolver,
    };
    let mut pinned = pin_with(&policy.net.egress, resolver, &rules)?;
    if seamed {
        for r in &mut pinned {
            r.addrs.retain(|a| {
                a.parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| !ip.is_loopback())
            });
        }
        pinned.retain(|r| !r.addrs.is_empty());
    }
    Ok(pinned)
}

fn pin_with(
    egress: &[h5i_policy::values::HostPort],
    resolver: &dyn Resolver,
    rules: &AddressRules,
) -> Result<Vec<PinnedRule>, BoxError> {
    let mut out: Vec<PinnedRule> = Vec::new();
    for hp in egress {
        match pin(&hp.host, hp.port, resolver, rules) {
            Pinned::Addrs(addrs) => {
                let mut texts: Vec<String> = addrs.iter().map(|a| a.ip().to_string()).collect();
                texts.sort();
                texts.dedup();
                out.push(PinnedRule {
                    host: hp.host.clone(),
                    port: hp.port,
                    addrs: texts,
                });
            }
            Pinned::Unusable(why) => {
                return Err(BoxError::BadRequest {
                    what: format!("net.egress `{hp}` cannot be pinned for this run: {why}"),
                    mend: format!(
                        "make `{}` resolve on the host to a routable address, or remove it from the profile's net.egress",
                        hp.host
                    ),
                })
            }
        }
    }
    out.sort_by(|a, b| (&a.host, a.port).cmp(&(&b.host, b.port)));
    Ok(out)
}

/// The box's `/etc/hosts`: localhost, its own hostname, and each pinned name.
pub fn hosts_file(hostname: &str, rules: &[PinnedRule]) -> String {
    let mut out = String::from(
        "# h5i supervised box: names are pinned here when the run starts; there is no resolver\n",
    );
    out.push_str(&format!(
        "127.0.0.1\tlocalhost {hostname}\n::1\tlocalhost ip6-localhost\n"
    ));
    let mut by_addr: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for r in rules {
        if r.host.parse::<std::net::IpAddr>().is_ok() {
            continue;
        }
        for a in &r.addrs {
            let names = by_addr.entry(a.as_str()).or_default();
            if !names.contains(&r.host.as_str()) {
                names.push(&r.host);
            }
        }
    }
    for (addr, names) in by_addr {
        out.push_str(&format!("{addr}\t{}\n", names.join(" ")));
    }
    out
}

/// A supervised run's network, planned and attached to its bundle.
#[derive(Debug)]
pub struct SupervisedNet {
    dir: PathBuf,
    /// What was asked of the sentry.
    pub rules: Vec<PinnedRule>,
}

fn write_private(path: &Path, text: &str) -> Result<(), BoxError> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(path)
        .map_err(|e| BoxError::io(path, e))?;
    f.write_all(text.as_bytes())
        .map_err(|e| BoxError::io(path, e))
}

/// The hook binary that wires the supervised network.
fn hook_binary() -> Result<PathBuf, BoxError> {
    crate::tier_host::hook_binary().ok_or_else(|| BoxError::BadRequest {
        what: "h5i-hook (which wires the supervised tier's network) is not beside h5i or on PATH"
            .into(),
        mend: "install h5i with `cargo install --path .`, which puts h5i-hook beside h5i (or put it on PATH)".into(),
    })
}

/// Make the private net directory `dir` (0700) with the box's name files for `rules`: the
/// hosts file and a resolv.conf naming no resolver.
pub fn make_dir(dir: &Path, hostname: &str, rules: &[PinnedRule]) -> Result<(), BoxError> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(dir)
        .map_err(|e| BoxError::io(dir, e))?;
    write_private(&dir.join("hosts"), &hosts_file(hostname, rules))?;
    write_private(
        &dir.join("resolv.conf"),
        "# h5i supervised box: no resolver; allowed names are in /etc/hosts\n",
    )
}

/// Rewrite the hosts file of a live net directory in place (the box's `/etc/hosts` is a bind
/// of that very file) for the next run's pins.
pub fn refresh_hosts(dir: &Path, hostname: &str, rules: &[PinnedRule]) -> Result<(), BoxError> {
    let path = dir.join("hosts");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&path)
        .map_err(|e| BoxError::io(&path, e))?;
    f.write_all(hosts_file(hostname, rules).as_bytes())
        .map_err(|e| BoxError::io(&path, e))
}

/// The `h5i.net.egress` annotation for `rules`.
fn egress_annotation(rules: &[PinnedRule]) -> String {
    let egress: Vec<serde_json::Value> = rules
        .iter()
        .map(|r| serde_json::json!({"host": r.host, "port": r.port, "addrs": r.addrs}))
        .collect();
    serde_json::Value::Array(egress).to_string()
}

/// The request the sandbox was made for, without the addresses one run pinned: what a
/// sandbox's identity covers (a name that re-resolves is refreshed per run, not rebuilt).
pub fn requested_annotation(rules: &[PinnedRule]) -> String {
    let egress: Vec<serde_json::Value> = rules
        .iter()
        .map(|r| serde_json::json!({"host": r.host, "port": r.port}))
        .collect();
    serde_json::Value::Array(egress).to_string()
}

/// Turn `plan` (the process tier's) into a supervised one whose network is wired through the
/// net directory `dir` (made by [`make_dir`]): its own network namespace wired by the
/// sentry's hooks, the hosts file, no resolver, the socket gate.
pub fn wire(plan: &mut BundlePlan, dir: &Path, rules: &[PinnedRule]) -> Result<(), BoxError> {
    let hook = hook_binary()?;
    plan.file_binds
        .push((dir.join("hosts"), PathBuf::from("/etc/hosts")));
    plan.file_binds
        .push((dir.join("resolv.conf"), PathBuf::from("/etc/resolv.conf")));
    plan.extra_annotations
        .insert(NET_ANNOTATION.into(), "supervised".into());
    plan.extra_annotations
        .insert(NET_DIR_ANNOTATION.into(), dir.display().to_string());
    plan.extra_annotations
        .insert(NET_EGRESS_ANNOTATION.into(), egress_annotation(rules));
    plan.socket_gate = Some(dir.join(h5i_policy::spec_names::net_dir::GATE_SOCK));
    let hook = hook.display().to_string();
    // net-inside brings up lo itself: the loopback hook would be redundant.
    plan.create_container_hooks
        .retain(|argv| argv.get(1).map(String::as_str) != Some("loopback"));
    if plan.uid == h5i_sys::ids::euid() {
        plan.create_container_hooks
            .insert(0, vec![hook.clone(), "net-inside".into()]);
        plan.create_runtime_hooks
            .push(vec![hook.clone(), "net-up".into()]);
    } else {
        // A root caller's box root is h5i-box's range, which cannot reach the root-only net
        // directory from inside: net-up does net-inside's work from the host.
        plan.create_runtime_hooks
            .push(vec![hook.clone(), "net-up".into(), "--attach".into()]);
    }
    plan.poststop_hooks.push(vec![hook, "net-down".into()]);
    Ok(())
}

/// Pin the policy's egress and turn `plan` (the process tier's) into a supervised one for one
/// run, with a net directory of the run's own.
pub fn attach(plan: &mut BundlePlan, rules: Vec<PinnedRule>) -> Result<SupervisedNet, BoxError> {
    hook_binary()?;
    // Short: unix socket paths hold at most 107 bytes.
    let dir = crate::tier_host::runtime_dir()?.join(format!(
        "n-{}",
        plan.id.chars().rev().take(24).collect::<String>()
    ));
    make_dir(&dir, &format!("h5i-{}", plan.id), &rules)?;
    wire(plan, &dir, &rules)?;
    Ok(SupervisedNet { dir, rules })
}

impl SupervisedNet {
    /// The run's net directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Read the sentry's tally once the runtime has exited, and remove the net directory.
    /// `None` (with the reason) when the sentry left none: the box never started, or the
    /// sentry died.
    pub fn finish(self) -> Result<NetTally, String> {
        let path = self.dir.join(TALLY);
        let got = std::fs::read(&path)
            .map_err(|e| format!("{}: {e}", path.display()))
            .and_then(|b| {
                serde_json::from_slice::<NetTally>(&b)
                    .map_err(|e| format!("{}: not a tally: {e}", path.display()))
            });
        let _ = std::fs::remove_dir_all(&self.dir);
        got
    }
}

/// How long the sentry of a box-lifetime sandbox may take to swap the table or read the
/// counters (each nft it runs is bounded at 10 s).
const SENTRY_TIMEOUT: Duration = Duration::from_secs(15);
/// The largest tally the sentry answers `end` with.
const MAX_TALLY: u64 = 8 << 20;

/// A request sent to the sentry serving a net directory, its answer not yet read.
struct SentryRequest {
    conn: UnixStream,
    sock: PathBuf,
}

impl SentryRequest {
    /// Send `request` (whole, then the write side shut) to the sentry serving `dir`.
    fn send(dir: &Path, request: &[u8]) -> Result<SentryRequest, String> {
        let sock = dir.join(NET_SOCK);
        let mut conn =
            UnixStream::connect(&sock).map_err(|e| format!("{}: {e}", sock.display()))?;
        let sent = conn
            .set_read_timeout(Some(SENTRY_TIMEOUT))
            .and_then(|()| conn.write_all(request))
            .and_then(|()| conn.shutdown(std::net::Shutdown::Write));
        sent.map_err(|e| format!("{}: {e}", sock.display()))?;
        Ok(SentryRequest { conn, sock })
    }

    /// The whole answer (bounded in size and, per read, in time).
    fn answer(mut self) -> Result<String, String> {
        let mut answer = String::new();
        (&mut self.conn)
            .take(MAX_TALLY)
            .read_to_string(&mut answer)
            .map_err(|e| format!("{}: no answer: {e}", self.sock.display()))?;
        Ok(answer.trim_end().to_string())
    }
}

/// A run in the box-lifetime sandbox starts: the sentry of `dir` is asked to put `rules` in
/// force (the table swapped in one transaction when its pins differ), read the counters the
/// run's tally will be counted from, and clear its socket-gate tally. The caller may do other
/// work while it does; the run must not start unless [`BeginRequest::answer`] is `Ok`.
pub fn begin(dir: &Path, rules: &[PinnedRule]) -> Result<BeginRequest, BoxError> {
    let mut request = b"begin\n".to_vec();
    request.extend_from_slice(egress_annotation(rules).as_bytes());
    SentryRequest::send(dir, &request)
        .map(|sent| BeginRequest {
            sent,
            dir: dir.to_path_buf(),
        })
        .map_err(|line| begin_refused(dir, line))
}

/// A `begin` sent to the sentry, its answer not yet read.
pub struct BeginRequest {
    sent: SentryRequest,
    dir: PathBuf,
}

impl BeginRequest {
    /// Whether the sentry put the run's pins in force: `Ok` only on its `ok`.
    pub fn answer(self) -> Result<(), BoxError> {
        match self.sent.answer() {
            Ok(line) if line == "ok" => Ok(()),
            Ok(line) | Err(line) => Err(begin_refused(&self.dir, line)),
        }
    }
}

fn begin_refused(dir: &Path, line: String) -> BoxError {
    BoxError::BadRequest {
        what: format!("the box sandbox's network did not take this run's egress pins: {line}"),
        mend: format!(
            "run `h5i box abort` on the box to rebuild its sandbox (sentry log: {})",
            dir.join(SENTRY_LOG).display()
        ),
    }
}

/// A run in the box-lifetime sandbox ended: the sentry's counters and socket-gate decisions
/// since its [`begin`].
pub fn end(dir: &Path) -> Result<NetTally, String> {
    let answer = SentryRequest::send(dir, b"end\n")?.answer()?;
    serde_json::from_str::<NetTally>(&answer).map_err(|_| answer)
}

/// What a kernel-tier run's receipt says about its network: the egress counts (the sentry's
/// table merged with the credential proxy's) and the socket gate's decisions. For a supervised
/// run (`net` given) the loaded table is also kept for `status`; a sentry that left no tally is
/// said on stderr, and the receipt then carries only what the credential proxy counted.
pub fn settle(
    sb: &StoredBox,
    net: Option<SupervisedNet>,
    credential_tally: Option<EgressTally>,
) -> Result<(Option<EgressTally>, Option<Box<SocketGateTally>>), BoxError> {
    match net {
        Some(net) => settle_tally(sb, net.finish(), credential_tally),
        None => Ok((credential_tally, None)),
    }
}

/// [`settle`] for a tally already read (or the reason there is none).
pub fn settle_tally(
    sb: &StoredBox,
    tally: Result<NetTally, String>,
    credential_tally: Option<EgressTally>,
) -> Result<(Option<EgressTally>, Option<Box<SocketGateTally>>), BoxError> {
    match tally {
        Ok(t) => {
            remember_table(sb, &t.table)?;
            let egress = t.egress.merged(credential_tally);
            Ok((Some(egress), Some(Box::new(t.socket_gate))))
        }
        Err(why) => {
            eprintln!(
                "h5i: warning: the supervised network left no tally ({why}); this run's receipt carries no egress or socket-gate counts"
            );
            Ok((credential_tally, None))
        }
    }
}

/// Keep the table a run actually loaded beside the box (host-written, outside every grant),
/// for `status` and `capabilities`.
pub fn remember_table(sb: &StoredBox, table: &LoadedEgressTable) -> Result<(), BoxError> {
    let path = sb.paths.net_table();
    let tmp = path.with_extension("json.tmp");
    let bytes = serde_json::to_vec_pretty(table).map_err(|e| BoxError::BadRequest {
        what: format!("cannot encode the loaded egress table: {e}"),
        mend: "report this as an h5i bug".into(),
    })?;
    std::fs::write(&tmp, bytes).map_err(|e| BoxError::io(&tmp, e))?;
    std::fs::rename(&tmp, &path).map_err(|e| BoxError::io(&path, e))
}

/// The table the box's last supervised run loaded, if any.
pub fn last_table(sb: &StoredBox) -> Option<LoadedEgressTable> {
    let bytes = std::fs::read(sb.paths.net_table()).ok()?;
    serde_json::from_slice(&bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use h5i_broker::pin::MapResolver;
    use h5i_policy::values::HostPort;
    use std::net::SocketAddr;

    fn hp(h: &str, p: u16) -> HostPort {
        HostPort {
            host: h.into(),
            port: p,
        }
    }

    #[test]
    fn names_pin_to_the_resolvers_answer_and_an_unpinnable_one_refuses_the_run() {
        let map = MapResolver::new();
        let a: SocketAddr = "198.18.7.2:443".parse().unwrap();
        map.insert("api.test", 443, vec![a]);
        let rules = AddressRules::allowing_loopback();
        let got = pin_with(&[hp("api.test", 443)], &map, &rules).unwrap();
        assert_eq!(
            got,
            vec![PinnedRule {
                host: "api.test".into(),
                port: 443,
                addrs: vec!["198.18.7.2".into()]
            }]
        );
        let e = pin_with(&[hp("api.test", 443), hp("gone.test", 80)], &map, &rules)
            .unwrap_err()
            .to_string();
        assert!(e.contains("gone.test:80") && e.contains("to fix:"), "{e}");
    }

    #[test]
    fn a_name_resolving_to_link_local_is_refused() {
        let map = MapResolver::new();
        map.insert("meta.test", 80, vec!["169.254.169.254:80".parse().unwrap()]);
        let e = pin_with(
            &[hp("meta.test", 80)],
            &map,
            &AddressRules::allowing_loopback(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("meta.test"), "{e}");
    }

    #[test]
    fn the_hosts_file_maps_each_pinned_name_and_nothing_else() {
        let rules = vec![
            PinnedRule {
                host: "a.test".into(),
                port: 443,
                addrs: vec!["198.18.7.2".into()],
            },
            PinnedRule {
                host: "a.test".into(),
                port: 80,
                addrs: vec!["198.18.7.2".into()],
            },
            PinnedRule {
                host: "198.18.9.9".into(),
                port: 80,
                addrs: vec!["198.18.9.9".into()],
            },
        ];
        let h = hosts_file("h5i-x", &rules);
        assert!(h.contains("127.0.0.1\tlocalhost h5i-x\n"));
        assert!(h.contains("198.18.7.2\ta.test\n"));
        assert_eq!(h.matches("a.test").count(), 1);
        assert!(!h.contains("198.18.9.9"));
    }
}
