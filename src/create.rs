//! `h5i box create`: resolve the policy, then assemble the box in a staging directory and rename
//! it into place, so a failure at any step leaves nothing behind.
//!
//! Order matters and is the invariant `the_policy_is_stored_before_any_other_state`: the policy
//! is resolved (pure, in memory), then written and digested as the first files of the staging
//! directory, and only then is any code fetched or checked out.
//!
//! Must never: read an external repository's `.h5i/env.toml` (the code under review does not
//! choose its own policy: this clone's file does), keep an origin remote in a detached box, or
//! leave a staging directory or a pin ref behind after a refusal.

use std::fs;
use std::path::{Path, PathBuf};

use h5i_policy::{HostTiers, ResolveRequest, ResolvedPolicy};

use crate::error::BoxError;
use crate::events::{self, Event};
use crate::git::{plain_rev, Git};
use crate::store::{
    now_ms, validate_name, write_atomic, write_manifest, BoxPaths, BoxSource, BoxState, BoxStore,
    Manifest, StoredBox, MANIFEST_VERSION,
};

/// Where the code of a new box should come from, as the user asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceRequest {
    /// This repository at `from` (default `HEAD`).
    ThisRepo {
        /// The revision.
        from: Option<String>,
    },
    /// A pull request: `N`, `#N`, or a `.../pull/N` URL.
    PullRequest(String),
    /// An external repository.
    Clone(String),
    /// An empty repository.
    New,
}

/// Everything `create` needs from the caller.
#[derive(Debug, Clone)]
pub struct CreateRequest {
    /// The name, or None to derive one from the source.
    pub name: Option<String>,
    /// Where the code comes from.
    pub source: SourceRequest,
    /// The policy request (profile, tier, env values).
    pub policy: ResolveRequest,
}

/// The environment variable values policy resolution reads, captured at the binary edge.
pub fn policy_file_text(store: &BoxStore) -> Result<Option<(PathBuf, String)>, BoxError> {
    let path = store.repo_root.join(".h5i").join("env.toml");
    match fs::read_to_string(&path) {
        Ok(t) => Ok(Some((path, t))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(BoxError::io(&path, e)),
    }
}

/// Resolve the policy for a request against this clone's `.h5i/env.toml`.
pub fn resolve_policy(
    store: &BoxStore,
    req: &ResolveRequest,
    host: &HostTiers,
) -> Result<ResolvedPolicy, BoxError> {
    let env_file = match policy_file_text(store)? {
        Some((path, text)) => Some(h5i_policy::parse_env_file(&path, &text)?),
        None => None,
    };
    Ok(h5i_policy::resolve(env_file.as_ref(), req, host)?)
}

/// Create a box. On any refusal nothing is left on disk.
pub fn create(
    store: &BoxStore,
    req: &CreateRequest,
    host: &HostTiers,
) -> Result<StoredBox, BoxError> {
    let source = parse_source(&req.source)?;
    let policy = resolve_policy(store, &req.policy, host)?;
    // An image tier fails closed on an image the engine does not hold, before any state.
    let mut image_pin = match crate::microvm::image_for_create(&policy)? {
        Some(pin) => Some(pin),
        None => crate::container::image_for_create(&policy)?,
    };
    // A Codex box's image must have the bash its tee shim is bound over.
    if let Some(pin) = &mut image_pin {
        crate::container::check_shim_image(&policy, pin)?;
    }
    // An agent box at a kernel tier fails closed on an agent the box could not run.
    crate::agent::check_installed(&policy)?;
    // Who the box is on the host, before any state: a root caller without `h5i-box`'s range
    // is refused here. The workspace tier runs on the host as the caller and has no box
    // identity.
    let ids = if policy.tier == h5i_policy::Tier::Workspace {
        None
    } else {
        Some(crate::identity::Mapping::for_caller()?)
    };
    let agent = policy
        .agent
        .map(|a| a.as_str().to_string())
        .unwrap_or_else(|| "none".to_string());
    let name = match &req.name {
        Some(n) => {
            validate_name(n)?;
            n.clone()
        }
        None => derive_name(store, &source),
    };
    // The claim on the name: the staging directory, locked before it appears under its name,
    // held until the box is in place (a killed create's is reclaimed by the next).
    let claim = store
        .claim_name(&agent, &name)?
        .ok_or_else(|| BoxError::BoxExists { name: name.clone() })?;
    let staging = store.staging_dir(&agent, &name);
    let final_dir = store.box_dir(&agent, &name);
    let mut cleanup = Cleanup {
        staging: Some(staging.clone()),
        pin: None,
        claim: Some(claim),
    };
    if store.name_taken_beside(&name, &agent) {
        return Err(BoxError::BoxExists { name });
    }
    let paths = BoxPaths { dir: staging };
    let digest = policy.digest().to_string();
    write_atomic(&paths.policy(), policy.to_canonical_toml().as_bytes())?;
    write_atomic(&paths.digest(), format!("{digest}\n").as_bytes())?;
    for d in [paths.spool(), paths.payloads(), paths.scratch()] {
        fs::create_dir(&d).map_err(|e| BoxError::io(&d, e))?;
    }
    if crate::browser::is_browser_box(&policy) {
        crate::browser::viewer::mint(&paths)?;
    }
    let host_home = std::env::var_os("HOME").map(PathBuf::from);
    let home_seed = crate::box_home::create(&paths, &policy, host_home.as_deref())?;
    if let Some(pin) = &image_pin {
        crate::container::image::write_pin(&paths.dir, pin)?;
    }

    let pin_ref = format!("refs/h5i/boxes/{name}/base");
    let (store_dir, base, source) = match source {
        ParsedSource::ThisRepo { from } => {
            let base = Git::at(&store.common_dir)
                .args(["rev-parse", "--verify", "--quiet", "--end-of-options"])
                .args([format!("{from}^{{commit}}")])
                .text()
                .map_err(|_| BoxError::BadRequest {
                    what: format!("`{from}` is not a commit in this repository"),
                    mend: "pass --from a branch, tag or commit that `git rev-parse` knows".into(),
                })?;
            let parent_branch = parent_branch_of(store, &from);
            // Under the claim, with no box of the name: a pin already there is an orphan.
            crate::pin::BoxPin::new(&store.common_dir, &name).set(&base)?;
            cleanup.pin = Some((store.common_dir.clone(), name.clone()));
            (
                store.common_dir.clone(),
                base,
                BoxSource::Worktree {
                    from,
                    parent_branch,
                },
            )
        }
        ParsedSource::PullRequest { number, remote } => {
            let remote = if remote == "origin" {
                Git::at(&store.common_dir)
                    .args(["config", "--get", "remote.origin.url"])
                    .text()
                    .map_err(|_| BoxError::BadRequest {
                        what: format!("pull request {number} names no repository and this clone has no `origin` remote"),
                        mend: "pass the pull request's URL (https://host/owner/repo/pull/N), or add an origin remote".into(),
                    })?
            } else {
                remote
            };
            let bare = paths.base_git();
            init_bare(&bare)?;
            Git::fetching(Some(&bare))
                .args(["fetch", "--quiet", "--no-tags", "--end-of-options", &remote])
                .args([format!("+refs/pull/{number}/head:{pin_ref}")])
                .output()
                .map_err(|e| BoxError::BadRequest {
                    what: format!("could not fetch pull request {number} from {remote}: {e}"),
                    mend: "check the number, and that the remote serves refs/pull/N/head".into(),
                })?;
            let base = rev_parse(&bare, &pin_ref)?;
            (bare, base, BoxSource::PullRequest { number, remote })
        }
        ParsedSource::Clone { url } => {
            let bare = paths.base_git();
            Git::fetching(None)
                .args([
                    "clone",
                    "--quiet",
                    "--bare",
                    "--no-hardlinks",
                    "--end-of-options",
                ])
                .args([url.as_str()])
                .args([&bare])
                .output()
                .map_err(|e| BoxError::BadRequest {
                    what: format!("could not clone {url}: {e}"),
                    mend: "check the URL or path, and that it is a git repository".into(),
                })?;
            // The box must not hold a network handle nobody granted it.
            Git::at(&bare)
                .args(["remote", "remove", "origin"])
                .output()?;
            let base = rev_parse(&bare, "HEAD")?;
            Git::at(&bare)
                .args(["update-ref", &pin_ref, &base])
                .output()?;
            (bare, base, BoxSource::Clone { url })
        }
        ParsedSource::New => {
            let bare = paths.base_git();
            init_bare(&bare)?;
            let empty_tree = Git::at(&bare)
                .args(["hash-object", "-t", "tree", "-w", "--stdin"])
                .output_with_input(b"")?;
            let empty_tree = String::from_utf8_lossy(&empty_tree).trim().to_string();
            let base = Git::at(&bare)
                .env("GIT_AUTHOR_NAME", "h5i")
                .env("GIT_AUTHOR_EMAIL", "h5i@localhost")
                .env("GIT_COMMITTER_NAME", "h5i")
                .env("GIT_COMMITTER_EMAIL", "h5i@localhost")
                .args(["commit-tree", &empty_tree, "-m", "h5i: empty box"])
                .text()?;
            Git::at(&bare)
                .args(["update-ref", &pin_ref, &base])
                .output()?;
            (bare, base, BoxSource::New)
        }
    };

    let branch = format!("h5i/{name}");
    make_workspace(&paths.workspace(), &store_dir, &base, &branch)?;
    // A detached box's store moves with the box directory: point its alternates (and the
    // manifest) at where it will live once renamed into place.
    let store_dir = if source.is_detached() {
        let final_store = final_dir.join("base.git");
        write_alternates(&paths.workspace(), &final_store)?;
        final_store
    } else {
        store_dir
    };
    // What the box may write is the box's on disk: a root caller's box is `h5i-box`'s range,
    // which must own its workspace, HOME and spool (and nothing else of the host).
    if let Some(ids) = ids {
        ids.own(
            &[paths.workspace(), paths.home(), paths.spool()]
                .into_iter()
                .filter(|p| p.exists())
                .collect::<Vec<_>>(),
        )?;
    }

    let manifest = Manifest {
        v: MANIFEST_VERSION,
        name: name.clone(),
        agent: agent.clone(),
        created_ms: now_ms(),
        source,
        base,
        base_ref: pin_ref,
        store: store_dir,
        branch,
        state: BoxState::Active,
        tier: policy.tier.as_str().to_string(),
        policy_digest: digest,
    };
    write_manifest(&paths, &manifest)?;
    events::append(
        &paths,
        &Event::new(
            "created",
            format!(
                "from {} at {}, tier {}, policy {}",
                manifest.source.label(),
                manifest.base,
                manifest.tier,
                manifest.policy_digest
            ),
        ),
    )?;
    if let Some(made) = &home_seed {
        events::append(&paths, &Event::new("home", made.describe()))?;
    }
    fs::rename(&paths.dir, &final_dir).map_err(|e| BoxError::io(&final_dir, e))?;
    cleanup.disarm();
    Ok(StoredBox {
        paths: BoxPaths { dir: final_dir },
        manifest,
    })
}

/// The box's own repository: a `.git` of its own (so nothing it does to refs reaches the parent)
/// whose objects come from the store through `alternates`.
fn make_workspace(ws: &Path, store: &Path, base: &str, branch: &str) -> Result<(), BoxError> {
    fs::create_dir(ws).map_err(|e| BoxError::io(ws, e))?;
    let git_dir = ws.join(".git");
    Git::detached()
        .args(["init", "--quiet", "-b", branch])
        .args([ws])
        .output()?;
    write_alternates(ws, store)?;
    Git::at(&git_dir)
        .work_tree(ws)
        .args(["update-ref", &format!("refs/heads/{branch}"), base])
        .output()?;
    Git::at(&git_dir)
        .work_tree(ws)
        .current_dir(ws)
        .args(["read-tree", "-u", "--reset", base])
        .output()?;
    Ok(())
}

fn write_alternates(ws: &Path, store: &Path) -> Result<(), BoxError> {
    let alternates = ws
        .join(".git")
        .join("objects")
        .join("info")
        .join("alternates");
    fs::write(
        &alternates,
        format!("{}\n", store.join("objects").display()),
    )
    .map_err(|e| BoxError::io(&alternates, e))
}

fn init_bare(dir: &Path) -> Result<(), BoxError> {
    Git::detached()
        .args(["init", "--quiet", "--bare"])
        .args([dir])
        .output()?;
    Ok(())
}

fn rev_parse(git_dir: &Path, rev: &str) -> Result<String, BoxError> {
    Ok(Git::at(git_dir)
        .args(["rev-parse", "--verify", "--end-of-options"])
        .args([format!("{rev}^{{commit}}")])
        .text()?)
}

/// The branch `apply` and `rebase` target: the one `from` names, or the one HEAD is on.
fn parent_branch_of(store: &BoxStore, from: &str) -> Option<String> {
    let git = || Git::at(&store.common_dir);
    if from == "HEAD" {
        let full = git().args(["symbolic-ref", "-q", "HEAD"]).text().ok()?;
        return full.strip_prefix("refs/heads/").map(str::to_string);
    }
    let full = format!("refs/heads/{from}");
    git()
        .args(["show-ref", "--verify", "--quiet", &full])
        .succeeds()
        .ok()?
        .then(|| from.to_string())
}

enum ParsedSource {
    ThisRepo { from: String },
    PullRequest { number: u64, remote: String },
    Clone { url: String },
    New,
}

fn parse_source(req: &SourceRequest) -> Result<ParsedSource, BoxError> {
    match req {
        SourceRequest::ThisRepo { from } => {
            let from = from.clone().unwrap_or_else(|| "HEAD".to_string());
            if !plain_rev(&from) {
                return Err(BoxError::BadRequest {
                    what: format!("`{from}` is not a revision"),
                    mend: "pass --from a branch, tag or commit name".into(),
                });
            }
            Ok(ParsedSource::ThisRepo { from })
        }
        SourceRequest::PullRequest(spec) => {
            let (remote, number) = parse_pr(spec)?;
            Ok(ParsedSource::PullRequest { number, remote })
        }
        SourceRequest::Clone(url) => {
            if url.is_empty() || url.starts_with('-') || url.chars().any(char::is_control) {
                return Err(BoxError::BadRequest {
                    what: format!("`{url}` is not a repository URL or path"),
                    mend:
                        "pass --clone a URL (https://..., file://...) or a path to a git repository"
                            .into(),
                });
            }
            if url.starts_with("ext::") || url.starts_with("fd::") {
                return Err(BoxError::BadRequest {
                    what: format!("`{url}` uses a transport that runs commands"),
                    mend: "clone over https://, ssh:// or file:// instead".into(),
                });
            }
            Ok(ParsedSource::Clone { url: url.clone() })
        }
        SourceRequest::New => Ok(ParsedSource::New),
    }
}

/// `N`, `#N`, or `<repo URL>/pull/N` -> (remote, N). A bare number fetches from `origin`.
fn parse_pr(spec: &str) -> Result<(String, u64), BoxError> {
    let bad = || {
        BoxError::BadRequest {
        what: format!("`{spec}` is not a pull request"),
        mend: "pass --pr a number (1234 or #1234) or a pull request URL (https://host/owner/repo/pull/1234)".into(),
    }
    };
    let digits = spec.strip_prefix('#').unwrap_or(spec);
    if let Ok(n) = digits.parse::<u64>() {
        return Ok(("origin".to_string(), n));
    }
    let trimmed = spec.trim_end_matches('/');
    let (repo, tail) = trimmed.rsplit_once("/pull/").ok_or_else(bad)?;
    let n: u64 = tail
        .split(['/', '#', '?'])
        .next()
        .and_then(|t| t.parse().ok())
        .ok_or_else(bad)?;
    if repo.is_empty() || repo.starts_with('-') {
        return Err(bad());
    }
    Ok((repo.to_string(), n))
}

fn derive_name(store: &BoxStore, source: &ParsedSource) -> String {
    let stem = match source {
        ParsedSource::ThisRepo { .. } => store
            .repo_root
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "box".into()),
        ParsedSource::PullRequest { number, .. } => format!("pr-{number}"),
        ParsedSource::Clone { url } => url
            .trim_end_matches('/')
            .rsplit(['/', ':'])
            .next()
            .unwrap_or("clone")
            .trim_end_matches(".git")
            .to_string(),
        ParsedSource::New => "new".into(),
    };
    let mut slug: String = stem
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    slug = slug.trim_matches('-').chars().take(50).collect();
    if slug.is_empty() {
        slug = "box".into();
    }
    (1..)
        .map(|n| format!("{slug}-{n}"))
        .find(|n| !store.name_taken(n))
        .unwrap_or(slug)
}

/// Removes a half-made box unless disarmed.
struct Cleanup {
    staging: Option<PathBuf>,
    pin: Option<(PathBuf, String)>,
    /// The claim on the name: released (its lock file removed) before the directories the
    /// create made are, so a refused create leaves none.
    claim: Option<crate::store::NameClaim>,
}

impl Cleanup {
    fn disarm(&mut self) {
        self.staging = None;
        self.pin = None;
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Some((git_dir, name)) = self.pin.take() {
            let _ = crate::pin::BoxPin::new(&git_dir, &name).remove();
        }
        if let Some(dir) = self.staging.take() {
            let _ = fs::remove_dir_all(&dir);
            drop(self.claim.take());
            // The agent, env and .h5i directories go too when this create made them and they
            // are empty: a refused create leaves nothing on disk.
            let mut up = dir.parent();
            for _ in 0..3 {
                match up {
                    Some(d) if fs::remove_dir(d).is_ok() => up = d.parent(),
                    _ => break,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pull_request_specs_parse() {
        assert_eq!(parse_pr("1234").unwrap(), ("origin".into(), 1234));
        assert_eq!(parse_pr("#7").unwrap(), ("origin".into(), 7));
        assert_eq!(
            parse_pr("https://github.com/o/r/pull/42/files").unwrap(),
            ("https://github.com/o/r".into(), 42)
        );
        for bad in ["", "#", "abc", "https://github.com/o/r/pull/", "-x/pull/3"] {
            assert!(parse_pr(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn command_running_transports_are_refused() {
        for url in ["ext::sh -c touch% /tmp/pwned", "fd::3", "--upload-pack=x"] {
            assert!(
                parse_source(&SourceRequest::Clone(url.into())).is_err(),
                "{url}"
            );
        }
    }
}
