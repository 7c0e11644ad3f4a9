//! The per-box HOME: `<box>/home`, made at `box create` for every tier that confines the box,
//! seeded once from the host agent's config directory, and the box's `HOME` at every run.
//!
//! Owns where the box's HOME lives, what it is seeded from (runtime-scoped: a Claude box gets a
//! copy of `~/.claude`, a Codex box of `~/.codex`, any other box an empty HOME), and which token
//! policy the seed follows (the runtime's own token file kept only when the box's credential
//! proxy is off, `H5I_CREDENTIAL_PROXY=0`, since then the runtime has nothing else to work
//! from; with the proxy on it works from the per-run dummy). The copy itself, and the table of
//! credential shapes stripped at any depth, is `h5i_broker::home::seed`.
//!
//! Must never: write to the host's config directory (the seed reads it once, and nothing of
//! the box's HOME is ever copied back), seed another runtime's directory, or reseed a HOME
//! that exists (a box's HOME state is its own after create). Nothing on the host reads the
//! box's HOME after the seed, so what a box plants there (a symlink to a sibling file, say) is
//! never followed by h5i; `box rm` removes it without following links.
//!
//! Guarded by `tests/box_home.rs`.

use std::path::{Path, PathBuf};

use h5i_broker::home::{seed, HomeError, SeedReport, TokenPolicy};
use h5i_policy::{AgentRuntime, ResolvedPolicy, Tier};

use crate::error::BoxError;
use crate::store::{BoxPaths, StoredBox};

/// The host directory a runtime's config is seeded from: `.claude` or `.codex` under the HOME
/// of the user running `box create` (`host_home`, from `$HOME`; `None` or a relative path
/// seeds nothing).
pub fn host_config_dir(host_home: Option<&Path>, runtime: AgentRuntime) -> Option<PathBuf> {
    let home = host_home.filter(|h| h.is_absolute())?;
    Some(home.join(config_dir_name(runtime)))
}

/// The config directory's name under HOME, in the box as on the host.
pub fn config_dir_name(runtime: AgentRuntime) -> &'static str {
    match runtime {
        AgentRuntime::Claude => ".claude",
        AgentRuntime::Codex => ".codex",
    }
}

fn refused(e: HomeError) -> BoxError {
    let text = e.to_string();
    let text = text.strip_prefix("refusing: ").unwrap_or(&text);
    let (what, mend) = text
        .split_once("; to fix: ")
        .unwrap_or((text, "check the agent's config directory"));
    BoxError::BadRequest {
        what: what.to_owned(),
        mend: mend.to_owned(),
    }
}

fn make_private_dir(dir: &Path) -> Result<(), BoxError> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(dir)
        .map_err(|e| BoxError::io(dir, e))
}

/// How a box's HOME was made at create.
#[derive(Debug)]
pub enum HomeMade {
    /// Empty: the box is not scoped to an agent runtime, so it gets no agent state.
    NotScoped,
    /// Empty: the creating user has no config directory for the box's runtime.
    NoHostConfig(AgentRuntime),
    /// Seeded from the runtime's config directory.
    Seeded(AgentRuntime, SeedReport),
}

impl HomeMade {
    /// One line for the box's event log: counts, never names or contents.
    pub fn describe(&self) -> String {
        match self {
            HomeMade::NotScoped => {
                "HOME made empty (the box is not scoped to an agent runtime)".into()
            }
            HomeMade::NoHostConfig(rt) => format!(
                "HOME made with an empty ~/{} (the host has none to seed from)",
                config_dir_name(*rt)
            ),
            HomeMade::Seeded(rt, r) => {
                let mut s = format!(
                    "HOME seeded from the host's ~/{}: {} files, {} bytes; {} credential-shaped entries stripped, {} others skipped",
                    config_dir_name(*rt),
                    r.files,
                    r.bytes,
                    r.stripped.len(),
                    r.skipped.len()
                );
                if r.kept_token {
                    s.push_str("; the runtime's own token kept (credential proxy off)");
                }
                s
            }
        }
    }
}

/// At `box create` (into the box's staging directory): make the box's HOME and seed it from
/// the runtime's config directory under `host_home` (the creating user's `$HOME`). A
/// workspace-tier box runs on the host as the user, HOME and all, so it gets none (`None`).
pub fn create(
    paths: &BoxPaths,
    policy: &ResolvedPolicy,
    host_home: Option<&Path>,
) -> Result<Option<HomeMade>, BoxError> {
    if policy.tier == Tier::Workspace {
        return Ok(None);
    }
    let home = paths.home();
    make_private_dir(&home)?;
    let Some(runtime) = policy.agent else {
        return Ok(Some(HomeMade::NotScoped));
    };
    let token = if policy.credential_proxy {
        TokenPolicy::Strip
    } else {
        TokenPolicy::KeepRuntimeToken
    };
    let dst = home.join(config_dir_name(runtime));
    let Some(src) = host_config_dir(host_home, runtime) else {
        make_private_dir(&dst)?;
        return Ok(Some(HomeMade::NoHostConfig(runtime)));
    };
    let report = seed(&src, &dst, runtime, token).map_err(refused)?;
    Ok(Some(if report.source_found {
        HomeMade::Seeded(runtime, report)
    } else {
        HomeMade::NoHostConfig(runtime)
    }))
}

/// The box's HOME for a run: the host directory to grant read-write (at
/// [`h5i_policy::inbox::HOME`] in the box) and the `HOME=` entry of the box's environment,
/// which names the in-box path. A box made before per-box HOMEs existed gets an empty one now
/// (never a seed: seeding happens at create only).
pub fn for_run(sb: &StoredBox) -> Result<(PathBuf, String), BoxError> {
    let home = sb.paths.home();
    match std::fs::symlink_metadata(&home) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err(BoxError::BadRequest {
                what: format!("{} is not a directory", home.display()),
                mend: format!("`h5i box rm {}` and create the box again", sb.manifest.name),
            })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => make_private_dir(&home)?,
        Err(e) => return Err(BoxError::io(&home, e)),
    }
    let env = format!("HOME={}", h5i_policy::inbox::HOME);
    Ok((home, env))
}
