//! `h5i box cache refresh <eco>`: the only writer of a cache.
//!
//! The steps, in order: find the project-declared profile `cache-<eco>` and check it (egress
//! the registry hosts, no host network, no secrets, no credential grants, no agent, no host
//! paths beyond the default profile's, no AF_UNIX, loopback ports or extra address families,
//! and no egress entry but the registry hosts the host's own configuration makes the package
//! manager reach, [`super::mirror`]) or refuse with the profile written out ready to paste,
//! before any box exists; create a dedicated box from this
//! repository at HEAD at the supervised tier, with no agent; key the cache by the lockfiles in
//! that box's workspace (and, for uv and Poetry, derive the hashed requirements list from the
//! lockfile there: [`super::lockfile`]); run the ecosystem's install step alone there with a fresh staging
//! directory as the only cache it can write and the registry settings the host's own
//! configuration names ([`super::mirror`]: its variables, and cargo's source replacement as
//! the `config.toml` of the box's `CARGO_HOME`, the staging directory), its stdin /dev/null and its output captured
//! ([`Capture`]) and handed to the caller a line at a time, to be escaped ([`Report::Said`]);
//! on exit 0, for npm, pnpm and Yarn, copy the `node_modules` it built beside the cache and
//! stamp it with its platform ([`super::KeptTree`]), then take the staging directory back from
//! the box's identity (refused when a file in it is a hard link to one outside it; every mode
//! set beneath directory descriptors, no symlink followed: [`super::tree_walk`]), store it
//! under its key (replacing this ecosystem's other caches: one
//! per project and ecosystem) and remove the box.
//!
//! Must never: write a cache a box could have chosen the path of, keep a cache from a failed
//! install, run an install whose egress was not narrowed, run with an agent in the box, or let
//! the refresh box hold the caller's terminal or print to it but through the caller's escaping,
//! or change a host file outside the staging directory while taking it back.
//!
//! Guarded by `tests/box_cache.rs` (every ecosystem's refresh, the refusals of a missing or too
//! wide profile, the progress line and the escaped output against a slow registry stand-in).

use std::ffi::OsString;
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use h5i_policy::{NetMode, ResolveRequest, Tier};

use super::mirror::Mirror;
use super::{tree_bytes, CacheError, CacheRoot, Ecosystem, RefreshRecord};
use crate::error::BoxError;
use crate::file_lock::{FileLock, LockKind};
use crate::session::{Purpose, RunOutcome, RunSession};
use crate::store::{now_ms, BoxStore};

/// What a finished refresh stored.
#[derive(Debug, Clone)]
pub struct Refreshed {
    /// The record written beside the data.
    pub record: RefreshRecord,
    /// Keys of this ecosystem's caches that the new one replaced.
    pub replaced: Vec<String>,
    /// The receipt of the install run (in the refresh box, removed with it).
    pub receipt_seq: u64,
}

/// One tick of the progress line: bytes in the cache so far, seconds since the install began.
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    /// Bytes written into the staging cache.
    pub bytes: u64,
    /// Seconds since the install started.
    pub secs: u64,
}

/// An exclusive lock on one ecosystem's caches (refresh and rm), refused rather than waited for.
pub struct EcoLock {
    _held: FileLock,
}

impl EcoLock {
    /// Take it.
    pub fn take(root: &CacheRoot, eco: &Ecosystem) -> Result<EcoLock, CacheError> {
        let dir = root.eco_dir(eco);
        std::fs::create_dir_all(&dir).map_err(|e| BoxError::io(&dir, e))?;
        let p = dir.join(".lock");
        match FileLock::try_take(&p, LockKind::Exclusive) {
            Ok(Some(held)) => Ok(EcoLock { _held: held }),
            Ok(None) => Err(BoxError::BadRequest {
                what: format!("another refresh or rm of the {} cache is running", eco.name),
                mend: "wait for it to finish, then try again".into(),
            }
            .into()),
            Err(e) => Err(BoxError::io(&p, e).into()),
        }
    }
}

/// The refresh box and the staging directory, removed however the refresh ends.
struct Scratch<'a> {
    store: &'a BoxStore,
    name: Option<String>,
    staging: PathBuf,
}

impl Drop for Scratch<'_> {
    fn drop(&mut self) {
        if let Some(name) = self.name.take() {
            let _ = crate::lifecycle::rm(self.store, &name, true);
        }
        let _ = std::fs::remove_dir_all(&self.staging);
    }
}

/// Check the project-declared profile for `eco`, before any box exists (`tiers`: what this
/// host runs, resolved once for the whole refresh).
fn registry_policy(
    store: &BoxStore,
    eco: &Ecosystem,
    mirror: &Mirror,
    req: &ResolveRequest,
    tiers: &h5i_policy::HostTiers,
) -> Result<h5i_policy::ResolvedPolicy, CacheError> {
    let profile = eco.profile_name();
    let refuse = |why: String| CacheError::NoRegistryProfile {
        eco: eco.name,
        profile: profile.clone(),
        why,
        text: eco.profile_text(mirror),
    };
    let declared = match crate::create::policy_file_text(store)? {
        None => return Err(refuse("there is no .h5i/env.toml".into())),
        Some((path, text)) => h5i_policy::parse_env_file(&path, &text)
            .map_err(BoxError::from)?
            .profile_names()
            .any(|n| n == profile),
    };
    if !declared {
        return Err(refuse(format!("it declares no profile `{profile}`")));
    }
    let policy = crate::create::resolve_policy(store, req, tiers)?;
    if policy.net.mode == NetMode::Host {
        return Err(refuse("it shares the host's network".into()));
    }
    if policy.net.egress.is_empty() {
        return Err(refuse("its egress is empty, so no fetch could work".into()));
    }
    if !policy.secrets.is_empty() || !policy.auth.is_empty() {
        return Err(refuse(
            "it grants secrets or credentials, which a cache fill must not hold".into(),
        ));
    }
    if policy.tier != Tier::Supervised {
        return Err(refuse(format!(
            "it resolves to the {} tier; a refresh runs at the supervised tier",
            policy.tier
        )));
    }
    // What every box gets (the built-in default at the same tier): the yardstick for host paths.
    let base = crate::create::resolve_policy(
        store,
        &ResolveRequest {
            profile: Some("default".into()),
            isolation: req.isolation.clone(),
            ..ResolveRequest::default()
        },
        tiers,
    )?;
    if let Some(why) = beyond_the_registry(&policy, &base, &eco.registry_hosts(mirror)) {
        return Err(refuse(why));
    }
    Ok(policy)
}

/// What `policy` grants a refresh box beyond egress to the registry hosts, if anything: an
/// agent, host paths beyond those of `base` (the built-in default: system paths read-only, the
/// workspace read-write), AF_UNIX (host listeners), loopback ports, address families beyond the
/// always-allowed ones, or an egress entry that is not one of `registry` (the registry hosts
/// the host's configuration makes the package manager reach: [`Ecosystem::registry_hosts`]).
fn beyond_the_registry(
    policy: &h5i_policy::ResolvedPolicy,
    base: &h5i_policy::ResolvedPolicy,
    registry: &[String],
) -> Option<String> {
    if let Some(agent) = &policy.agent {
        return Some(format!(
            "it names the agent {}, and a refresh box has none",
            agent.as_str()
        ));
    }
    let extra_paths: Vec<&String> = (policy.fs.read.iter())
        .filter(|p| !base.fs.read.contains(p) && !base.fs.write.contains(p))
        .chain(
            policy
                .fs
                .write
                .iter()
                .filter(|p| !base.fs.write.contains(p)),
        )
        .collect();
    if !extra_paths.is_empty() {
        return Some(format!(
            "it grants host paths beyond the default profile's ({}), which a cache fill must not reach",
            extra_paths
                .iter()
                .map(|p| p.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    if policy.net.unix {
        return Some("it allows AF_UNIX sockets (net.unix), which reach host listeners".into());
    }
    if !policy.net.loopback.is_empty() {
        return Some("it grants host loopback ports (net.loopback)".into());
    }
    if !policy.net.families.is_empty() {
        return Some(format!(
            "it grants the address families {} (net.families)",
            policy.net.families.join(", ")
        ));
    }
    let extra: Vec<String> = policy
        .net
        .egress
        .iter()
        .map(ToString::to_string)
        .filter(|hp| !registry.contains(hp))
        .collect();
    if !extra.is_empty() {
        return Some(format!(
            "its egress names {}, which the host's registry configuration does not",
            extra.join(", ")
        ));
    }
    None
}

/// What a running refresh tells its caller, handed the caller's own stderr to write it to:
/// while a step runs in the refresh box, this process's standard descriptors point into the
/// capture ([`Capture`]), never at the caller's terminal.
pub enum Report<'a> {
    /// The install step starts.
    Started,
    /// About once a second while the install step runs.
    Progress(Progress),
    /// One line a step printed on its stdout or stderr, without its line end (a longer line
    /// comes in pieces of [`SAID_CAP`] bytes): box-supplied bytes, to be escaped before they are
    /// shown.
    Said(&'a [u8]),
}

/// The caller's side of [`Report`]: called from more than one thread, one call at a time.
pub type Reporter<'r> = &'r (dyn Fn(Report<'_>, &mut dyn Write) + Sync);

/// The longest piece of a line [`Report::Said`] carries.
pub const SAID_CAP: usize = 4096;

/// Refresh the cache of ecosystem `name`, telling `report` what happens while it runs.
pub fn refresh(
    store: &BoxStore,
    name: &str,
    report: Reporter<'_>,
) -> Result<Refreshed, CacheError> {
    let eco = super::ecosystem(name)?;
    let root = CacheRoot::of(store);
    let _lock = EcoLock::take(&root, eco)?;
    let req = ResolveRequest {
        profile: Some(eco.profile_name()),
        isolation: Some(Tier::Supervised.as_str().to_string()),
        ..ResolveRequest::default()
    };
    let mirror = (eco.mirror)(&super::mirror::Env::of_process(&[
        &store.repo_root,
        &store.common_dir,
    ]));
    // One probe sweep for the checks and the box.
    let tiers = crate::probe::host_tiers();
    registry_policy(store, eco, &mirror, &req, &tiers)?;

    let box_name = format!("cache-{}-refresh-{}", eco.name, std::process::id());
    let mut scratch = Scratch {
        store,
        name: None,
        staging: root
            .eco_dir(eco)
            .join(format!(".refresh-{}", std::process::id())),
    };
    let sb = crate::create::create(
        store,
        &crate::create::CreateRequest {
            name: Some(box_name.clone()),
            source: crate::create::SourceRequest::ThisRepo { from: None },
            policy: req,
        },
        &tiers,
    )?;
    scratch.name = Some(box_name.clone());
    let key = eco
        .key_of(&sb.paths.workspace())?
        .ok_or_else(|| CacheError::NoLockfile {
            eco: eco.name,
            hint: eco.lock_hint,
            files: eco.lockfiles.join(", "),
        })?;

    let data = scratch.staging.join("data");
    std::fs::create_dir_all(&data).map_err(|e| BoxError::io(&data, e))?;
    if let Some(format) = eco.derived {
        let list = super::lockfile::requirements_of(&sb.paths.workspace(), format)?;
        crate::store::write_atomic(&data.join(super::lockfile::REQUIREMENTS), list.as_bytes())?;
    }
    for (file, text) in &mirror.data_files {
        crate::store::write_atomic(&data.join(file), text.as_bytes())?;
    }
    crate::identity::Mapping::for_caller()
        .and_then(|ids| ids.own(std::slice::from_ref(&data)))
        .map_err(BoxError::from)?;

    let inside = h5i_policy::inbox::cache_dir(eco.name);
    let argv = eco.install_for(Path::new(&inside));
    let tree = eco.tree.as_ref().map(|_| scratch.staging.join("tree"));
    if let Some(tree) = &tree {
        std::fs::create_dir(tree).map_err(|e| BoxError::io(tree, e))?;
        crate::identity::Mapping::for_caller()
            .and_then(|ids| ids.own(std::slice::from_ref(tree)))
            .map_err(BoxError::from)?;
    }
    let fill = Fill {
        root: &root,
        eco,
        mirror: &mirror,
        data: &data,
        inside: &inside,
        tree: tree.as_deref(),
    };
    let run = install(store, &box_name, &fill, &argv, report, true)?;
    if run.exit.passthrough_code() != 0 {
        return Err(CacheError::InstallFailed {
            eco: eco.name,
            code: run.exit.passthrough_code(),
            receipt: run.receipt_seq,
            egress: egress_line(run.egress.as_ref()),
        });
    }
    let tree = match (&tree, &eco.tree) {
        (Some(dir), Some(kept)) => Some(keep_tree(store, &box_name, &fill, kept, dir, report)?),
        _ => None,
    };

    // The box wrote it as its own identity: take it back, readable by every box, writable by
    // none of them.
    let (uid, gid) = (h5i_sys::ids::euid(), h5i_sys::ids::egid());
    super::tree_walk::check_links(&scratch.staging)?;
    crate::identity::own_tree(&scratch.staging, uid, gid).map_err(BoxError::from)?;
    super::tree_walk::normalize_modes(&scratch.staging)?;
    let record = RefreshRecord {
        v: 1,
        eco: eco.name.to_string(),
        key: key.clone(),
        at_ms: now_ms(),
        argv,
        wall_ms: run.wall.as_millis() as u64,
        policy_digest: sb.manifest.policy_digest.clone(),
        egress: run.egress,
        bytes: tree_bytes(&data),
        tree,
    };
    let json = serde_json::to_vec_pretty(&record).map_err(|e| BoxError::BadRequest {
        what: format!("cannot encode refresh.json: {e}"),
        mend: "report this as an h5i bug".into(),
    })?;
    crate::store::write_atomic(&scratch.staging.join("refresh.json"), &json)?;

    let replaced = root
        .keys(eco)?
        .into_iter()
        .filter(|k| *k != key)
        .collect::<Vec<_>>();
    let dest = root.entry(eco, &key);
    let old = root
        .eco_dir(eco)
        .join(format!(".old-{}", std::process::id()));
    if dest.exists() {
        std::fs::rename(&dest, &old).map_err(|e| BoxError::io(&dest, e))?;
    }
    std::fs::rename(&scratch.staging, &dest).map_err(|e| BoxError::io(&dest, e))?;
    let _ = std::fs::remove_dir_all(&old);
    for k in &replaced {
        let dir = root.entry(eco, k);
        std::fs::remove_dir_all(&dir).map_err(|e| BoxError::io(&dir, e))?;
    }
    Ok(Refreshed {
        record,
        replaced,
        receipt_seq: run.receipt_seq,
    })
}

/// What one refresh box fills, and from where.
struct Fill<'a> {
    root: &'a CacheRoot,
    eco: &'a Ecosystem,
    mirror: &'a Mirror,
    /// The staging data directory on the host.
    data: &'a Path,
    /// Where the box sees it.
    inside: &'a str,
    /// npm, pnpm, Yarn: the staging directory the built tree is copied into, writable at its
    /// [`super::KeptTree::inside`].
    tree: Option<&'a Path>,
}

/// The copy of the built `node_modules` and its platform stamp, made in the refresh box after
/// the install (as the box's identity, in its own workspace: the host never walks a tree the
/// install wrote). `$1` is where the box sees the staging tree directory.
const KEEP_TREE: &str = r#"set -e
if [ -d node_modules ]; then cp -R --preserve=mode,timestamps,links node_modules "$1/node_modules"; else mkdir "$1/node_modules"; fi
node -e 'const h = process.report.getReport().header; console.log([process.platform, process.arch, h.glibcVersionRuntime ? "glibc" : "other", "abi" + process.versions.modules].join("-"))' > "$1/platform""#;

/// Keep the tree the install built: copied by [`KEEP_TREE`] in the refresh box into `dir`, and
/// stamped with what it was built for (the stamp checked, the node binary the host's `PATH`
/// resolves for a kernel-tier box recorded).
fn keep_tree(
    store: &BoxStore,
    box_name: &str,
    fill: &Fill,
    kept: &super::KeptTree,
    dir: &Path,
    report: Reporter<'_>,
) -> Result<super::TreeRecord, CacheError> {
    let argv = ["sh", "-c", KEEP_TREE, "sh", kept.inside].map(String::from);
    let run = install(store, box_name, fill, &argv, report, false)?;
    let failed = |why: String| CacheError::TreeNotKept {
        eco: fill.eco.name,
        receipt: run.receipt_seq,
        why,
    };
    if run.exit.passthrough_code() != 0 {
        return Err(failed(format!("exited {}", run.exit.passthrough_code())));
    }
    let (mut f, _) = crate::bounded::open_regular(dir, Path::new("platform"), 256)
        .map_err(|skip| failed(format!("its platform stamp is {skip}")))?;
    let mut platform = String::new();
    std::io::Read::read_to_string(&mut f, &mut platform)
        .map_err(|e| failed(format!("its platform stamp is unreadable ({e})")))?;
    let platform = platform.trim_end().to_string();
    if !super::is_platform(&platform) {
        return Err(failed(format!(
            "its platform stamp {:?} is malformed",
            platform.escape_debug().to_string()
        )));
    }
    let node = super::NodeBinary::on_box_path()
        .ok_or_else(|| failed("no node on a box's PATH on this host".into()))?;
    Ok(super::TreeRecord { platform, node })
}

/// Run `argv` in the refresh box at the supervised tier, `data` (and the tree directory) its
/// only writable cache and the host's mirror settings its only registry settings. Its stdin is
/// /dev/null and its stdout and stderr are captured ([`Capture`]): every line it prints reaches
/// `report` as [`Report::Said`], and with `ticks` the progress line's ticks too.
fn install(
    store: &BoxStore,
    box_name: &str,
    fill: &Fill,
    argv: &[String],
    report: Reporter<'_>,
    ticks: bool,
) -> Result<RunOutcome, CacheError> {
    let session = RunSession::open(store, box_name, Purpose::CacheRefresh)?;
    // The run path offers every agent box the matching caches read-only (and a built tree as
    // its node_modules); the refresh box gets none of them, only its own staging directory,
    // read-write, and builds its node_modules from nothing.
    let own_cache = |plan: &mut h5i_runtime::bundle::BundlePlan| {
        plan.binds.retain(|b| !b.source.starts_with(&fill.root.dir));
        plan.overlays
            .retain(|o| !o.lower.starts_with(&fill.root.dir));
        plan.env.retain(|e| {
            !super::ECOSYSTEMS
                .iter()
                .flat_map(Ecosystem::var_names)
                .any(|k| e.starts_with(&format!("{k}=")))
        });
        plan.binds
            .push(h5i_runtime::bundle::Bind::rw(fill.data, fill.inside));
        if let (Some(tree), Some(kept)) = (fill.tree, &fill.eco.tree) {
            plan.binds
                .push(h5i_runtime::bundle::Bind::rw(tree, kept.inside));
        }
        plan.env
            .extend(fill.eco.fill_env_for(Path::new(fill.inside)));
        plan.env.extend(fill.mirror.env.iter().cloned());
    };
    let data = fill.data;
    let mut req = session.request(argv.iter().map(OsString::from).collect());
    req.edit_plan = Some(&own_cache);
    let captured = |e: std::io::Error| BoxError::io(Path::new("the refresh box's output"), e);
    let (mut capture, out) = Capture::start().map_err(captured)?;
    let console = std::sync::Mutex::new(capture.console().map_err(captured)?);
    let say_to_console = |r: Report<'_>| {
        if let Ok(mut to) = console.lock() {
            report(r, &mut *to);
            let _ = to.flush();
        }
    };
    let say: &(dyn Fn(Report<'_>) + Sync) = &say_to_console;
    let started = Instant::now();
    if ticks {
        say(Report::Started);
    }
    let (stop_read, stop_write) = h5i_sys::fds::pipe().map_err(captured)?;
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let outcome = std::thread::scope(|s| {
        s.spawn(move || relay(&out, &stop_read, say));
        if ticks {
            s.spawn(move || {
                while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                    rx.recv_timeout(Duration::from_secs(1))
                {
                    say(Report::Progress(Progress {
                        bytes: tree_bytes(data),
                        secs: started.elapsed().as_secs(),
                    }));
                }
            });
        }
        let outcome = session.run(req);
        drop(tx);
        // This process's own descriptors back: it holds the capture's write end no more, and
        // the relay drains what the step left and ends.
        capture.restore();
        drop(stop_write);
        outcome
    })?;
    Ok(outcome)
}

/// This process's standard descriptors while a step runs in the refresh box: stdin /dev/null,
/// stdout and stderr the write end of a pipe whose read end [`Capture::start`] hands the relay.
/// The caller's own are kept aside (close-on-exec, so the box never inherits them) and put back
/// by [`Capture::restore`] or on drop. The refresh box then never holds the caller's terminal,
/// and nothing it prints reaches it but through [`Report::Said`].
struct Capture {
    saved: Option<[OwnedFd; 3]>,
}

impl Capture {
    /// Point the standard descriptors into the capture; the pipe's read end.
    fn start() -> std::io::Result<(Capture, OwnedFd)> {
        std::io::stdout().flush()?;
        std::io::stderr().flush()?;
        let floor = 3;
        let saved = [
            h5i_sys::fds::dup_at_least(std::io::stdin(), floor)?,
            h5i_sys::fds::dup_at_least(std::io::stdout(), floor)?,
            h5i_sys::fds::dup_at_least(std::io::stderr(), floor)?,
        ];
        let null = std::fs::File::open("/dev/null")?;
        let (out, write) = h5i_sys::fds::pipe()?;
        let capture = Capture { saved: Some(saved) };
        h5i_sys::fds::point_std(0, null.as_fd())?;
        h5i_sys::fds::point_std(1, write.as_fd())?;
        h5i_sys::fds::point_std(2, write.as_fd())?;
        Ok((capture, out))
    }

    /// The caller's own stderr (a close-on-exec copy).
    /// (The relay and the progress line write there while the standard ones point elsewhere.)
    fn console(&self) -> std::io::Result<std::fs::File> {
        let saved = self
            .saved
            .as_ref()
            .ok_or_else(|| std::io::Error::from_raw_os_error(libc::EBADF))?;
        Ok(h5i_sys::fds::dup_at_least(&saved[2], 3)?.into())
    }

    fn restore(&mut self) {
        if let Some(saved) = self.saved.take() {
            for (n, fd) in (0..).zip(saved.iter()) {
                let _ = h5i_sys::fds::point_std(n, fd.as_fd());
            }
        }
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        self.restore();
    }
}

/// The most the relay reads once told to stop: a process the step left behind that keeps
/// writing cannot hold the refresh.
const DRAIN_CAP: usize = 1 << 20;

/// Read the step's output from `out` and hand it to `say` a line at a time, until every writer
/// is gone, or `stop` hangs up and what is left has been read.
fn relay(out: &OwnedFd, stop: &OwnedFd, say: &(dyn Fn(Report<'_>) + Sync)) {
    let mut line: Vec<u8> = Vec::new();
    let mut buf = [0u8; 8192];
    let mut drained: Option<usize> = None;
    loop {
        let wait = drained.map(|_| Duration::ZERO);
        let Ok(ready) = h5i_sys::poll::readable(&[out.as_fd(), stop.as_fd()], wait) else {
            break;
        };
        if ready.contains(&1) && drained.is_none() {
            drained = Some(0);
            continue;
        }
        if !ready.contains(&0) {
            if drained.is_some() {
                break;
            }
            continue;
        }
        let n = match rustix::io::read(out, &mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if let Some(d) = drained.as_mut() {
            *d += n;
            if *d > DRAIN_CAP {
                break;
            }
        }
        for &b in &buf[..n] {
            if b == b'\n' {
                say_line(&line, say);
                line.clear();
            } else {
                line.push(b);
                if line.len() == SAID_CAP {
                    say(Report::Said(&line));
                    line.clear();
                }
            }
        }
    }
    if !line.is_empty() {
        say_line(&line, say);
    }
}

/// One line as the step printed it, a carriage return before its end dropped.
fn say_line(line: &[u8], say: &(dyn Fn(Report<'_>) + Sync)) {
    say(Report::Said(line.strip_suffix(b"\r").unwrap_or(line)));
}

/// One line for an egress tally.
pub fn egress_line(t: Option<&h5i_policy::receipt::EgressTally>) -> String {
    let Some(t) = t else {
        return "not counted".into();
    };
    let part = |m: &std::collections::BTreeMap<String, u64>| {
        if m.is_empty() {
            "none".to_string()
        } else {
            m.iter()
                .map(|(k, n)| format!("{k} x{n}"))
                .collect::<Vec<_>>()
                .join(", ")
        }
    };
    format!("allowed {}; denied {}", part(&t.allowed), part(&t.denied))
}
