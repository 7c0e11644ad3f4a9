//! `h5i box cache refresh <eco>`: the only writer of a cache.
//!
//! The steps, in order: find the project-declared profile `cache-<eco>` and check it (egress
//! the registry hosts, no host network, no secrets, no credential grants) or refuse with the
//! profile written out ready to paste, before any box exists; create a dedicated box from this
//! repository at HEAD at the supervised tier, with no agent; key the cache by the lockfiles in
//! that box's workspace (and, for uv and Poetry, derive the hashed requirements list from the
//! lockfile there: [`super::lockfile`]); run the ecosystem's install step alone there with a fresh staging
//! directory as the only cache it can write and the registry settings the host's own
//! configuration names ([`super::mirror`]); on exit 0, take the staging directory back from
//! the box's identity, store it under its key (replacing this ecosystem's other caches: one
//! per project and ecosystem) and remove the box.
//!
//! Must never: write a cache a box could have chosen the path of, keep a cache from a failed
//! install, run an install whose egress was not narrowed, or run with an agent in the box.

use std::ffi::OsString;
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

/// Check the project-declared profile for `eco`, before any box exists.
fn registry_policy(
    store: &BoxStore,
    eco: &Ecosystem,
    mirror: &Mirror,
    req: &ResolveRequest,
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
    let policy = crate::create::resolve_policy(store, req, &crate::probe::host_tiers())?;
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
    Ok(policy)
}

/// Refresh the cache of ecosystem `name`, calling `progress` once as the install starts (at
/// 0 s) and about once a second while it runs.
pub fn refresh(
    store: &BoxStore,
    name: &str,
    progress: &(dyn Fn(Progress) + Sync),
) -> Result<Refreshed, CacheError> {
    let eco = super::ecosystem(name)?;
    let root = CacheRoot::of(store);
    let _lock = EcoLock::take(&root, eco)?;
    let req = ResolveRequest {
        profile: Some(eco.profile_name()),
        isolation: Some(Tier::Supervised.as_str().to_string()),
        ..ResolveRequest::default()
    };
    let mirror = (eco.mirror)(&|k| std::env::var(k).ok());
    registry_policy(store, eco, &mirror, &req)?;

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
        &crate::probe::host_tiers(),
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
    crate::identity::Mapping::for_caller()
        .and_then(|ids| ids.own(std::slice::from_ref(&data)))
        .map_err(BoxError::from)?;

    let inside = h5i_policy::inbox::cache_dir(eco.name);
    let argv = eco.install_for(Path::new(&inside));
    let tree = eco.keeps_tree.then(|| scratch.staging.join("tree"));
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
    let run = install(store, &box_name, &fill, &argv, Some(progress))?;
    if run.exit.passthrough_code() != 0 {
        return Err(CacheError::InstallFailed {
            eco: eco.name,
            code: run.exit.passthrough_code(),
            receipt: run.receipt_seq,
            egress: egress_line(run.egress.as_ref()),
        });
    }
    let tree = match &tree {
        Some(dir) => Some(keep_tree(store, &box_name, &fill, dir)?),
        None => None,
    };

    // The box wrote it as its own identity: take it back, readable by every box, writable by
    // none of them.
    // SAFETY: geteuid/getegid have no preconditions.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    crate::identity::own_tree(&scratch.staging, uid, gid).map_err(BoxError::from)?;
    normalize_modes(&scratch.staging)?;
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
    /// npm: the staging directory the built tree is copied into, writable at
    /// [`super::NPM_TREE_INSIDE`].
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
    dir: &Path,
) -> Result<super::TreeRecord, CacheError> {
    let argv = ["sh", "-c", KEEP_TREE, "sh", super::NPM_TREE_INSIDE].map(String::from);
    let run = install(store, box_name, fill, &argv, None)?;
    let failed = |why: String| CacheError::TreeNotKept {
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

/// Run `argv` in the refresh box at the supervised tier, `data` (and npm's tree directory) its
/// only writable cache and the host's mirror settings its only registry settings, with a
/// progress line while it runs when `progress` is given.
fn install(
    store: &BoxStore,
    box_name: &str,
    fill: &Fill,
    argv: &[String],
    progress: Option<&(dyn Fn(Progress) + Sync)>,
) -> Result<RunOutcome, CacheError> {
    let session = RunSession::open(store, box_name, Purpose::CacheRefresh)?;
    // The run path offers every agent box the matching caches read-only; the refresh box gets
    // none of them, only its own staging directory, read-write.
    let own_cache = |plan: &mut h5i_runtime::bundle::BundlePlan| {
        plan.binds.retain(|b| !b.source.starts_with(&fill.root.dir));
        plan.env.retain(|e| {
            !super::ECOSYSTEMS
                .iter()
                .flat_map(Ecosystem::var_names)
                .chain([super::NPM_TREE_VAR])
                .any(|k| e.starts_with(&format!("{k}=")))
        });
        plan.binds
            .push(h5i_runtime::bundle::Bind::rw(fill.data, fill.inside));
        if let Some(tree) = fill.tree {
            plan.binds
                .push(h5i_runtime::bundle::Bind::rw(tree, super::NPM_TREE_INSIDE));
        }
        plan.env
            .extend(fill.eco.fill_env_for(Path::new(fill.inside)));
        plan.env.extend(fill.mirror.env.iter().cloned());
    };
    let data = fill.data;
    let mut req = session.request(argv.iter().map(OsString::from).collect());
    req.edit_plan = Some(&own_cache);
    let Some(progress) = progress else {
        return Ok(session.run(req)?);
    };
    let started = Instant::now();
    progress(Progress { bytes: 0, secs: 0 });
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let outcome = std::thread::scope(|s| {
        s.spawn(move || {
            while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                rx.recv_timeout(Duration::from_secs(1))
            {
                progress(Progress {
                    bytes: tree_bytes(data),
                    secs: started.elapsed().as_secs(),
                });
            }
        });
        let outcome = session.run(req);
        drop(tx);
        outcome
    })?;
    Ok(outcome)
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

/// Directories 0755 and files 0644 (executables 0755), set-id bits cleared: readable by every
/// box identity, writable by none. Symlinks are left as they are and never followed.
fn normalize_modes(root: &Path) -> Result<(), CacheError> {
    use std::os::unix::fs::PermissionsExt;
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| BoxError::io(&dir, e))?;
        for entry in std::fs::read_dir(&dir).map_err(|e| BoxError::io(&dir, e))? {
            let entry = entry.map_err(|e| BoxError::io(&dir, e))?;
            let path = entry.path();
            let meta = path
                .symlink_metadata()
                .map_err(|e| BoxError::io(&path, e))?;
            if meta.is_dir() {
                stack.push(path);
            } else if meta.is_file() {
                let mode = if meta.permissions().mode() & 0o100 != 0 {
                    0o755
                } else {
                    0o644
                };
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
                    .map_err(|e| BoxError::io(&path, e))?;
            }
        }
    }
    Ok(())
}
