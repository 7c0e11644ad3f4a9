//! `h5i box cache mounts [NAME]`: exactly what a box would get, and the one place the run path
//! asks for it ([`grant`]).
//!
//! Owns the decision per ecosystem: the cache whose key matches the lockfiles of the project
//! the box installs from is mounted read-only at its own path, and the package manager's
//! variables point at it; a cache under any other key is stale and never handed out.
//!
//! Must never: grant a cache read-write, grant one whose key does not match, or grant one to
//! the workspace tier (which has no mount namespace to make it read-only in). The kernel tiers
//! mount what [`granted`] lists: `process.rs` (process, supervised) and `container` (Podman).

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::{CacheError, CacheRoot, ECOSYSTEMS};
use crate::store::StoredBox;
use h5i_runtime::bundle::Bind;

/// One ecosystem's answer for one project.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "state", rename_all = "kebab-case")]
pub enum Offer {
    /// The cache `data` is mounted read-only at `inside`, with `env` set.
    Mounted {
        /// The ecosystem.
        eco: &'static str,
        /// The key it matched.
        key: String,
        /// The directory on the host.
        data: PathBuf,
        /// Where the box sees it (never the host path, which names the parent repository).
        inside: String,
        /// The variables set for the package manager.
        env: Vec<String>,
    },
    /// Caches exist, but none under the key the lockfiles make now: nothing is mounted.
    Stale {
        /// The ecosystem.
        eco: &'static str,
        /// The key of the lockfiles now.
        want: String,
        /// The keys stored.
        have: Vec<String>,
    },
    /// The project uses the ecosystem and no cache exists: nothing is mounted.
    Missing {
        /// The ecosystem.
        eco: &'static str,
        /// The key of the lockfiles now.
        want: String,
    },
    /// A lockfile could not be read safely: nothing is mounted.
    Refused {
        /// The ecosystem.
        eco: &'static str,
        /// Why.
        why: String,
    },
}

impl Offer {
    /// The ecosystem this answer is about.
    pub fn eco(&self) -> &'static str {
        match self {
            Offer::Mounted { eco, .. }
            | Offer::Stale { eco, .. }
            | Offer::Missing { eco, .. }
            | Offer::Refused { eco, .. } => eco,
        }
    }
}

/// What a box installing from `project` gets from `root`: one answer per ecosystem the project
/// uses (an ecosystem without a lockfile is left out).
pub fn offers(root: &CacheRoot, project: &Path) -> Result<Vec<Offer>, CacheError> {
    let mut out = Vec::new();
    for eco in ECOSYSTEMS {
        let want = match eco.key_of(project) {
            Ok(Some(k)) => k,
            Ok(None) => continue,
            Err(e) => {
                out.push(Offer::Refused {
                    eco: eco.name,
                    why: e.to_string(),
                });
                continue;
            }
        };
        let have = root.keys(eco)?;
        out.push(if have.contains(&want) {
            let data = root.data(eco, &want);
            let inside = h5i_policy::inbox::cache_dir(eco.name);
            Offer::Mounted {
                eco: eco.name,
                env: eco.env_for(Path::new(&inside)),
                key: want,
                data,
                inside,
            }
        } else if have.is_empty() {
            Offer::Missing {
                eco: eco.name,
                want,
            }
        } else {
            Offer::Stale {
                eco: eco.name,
                want,
                have,
            }
        });
    }
    Ok(out)
}

/// One cache a run gets: the host directory, where the box sees it (read-only), and the
/// variables (`NAME=VALUE`) pointing the package manager at it.
#[derive(Debug, Clone)]
pub struct Granted {
    /// The cache's data directory on the host.
    pub data: PathBuf,
    /// Where the box sees it.
    pub inside: String,
    /// The package manager's variables.
    pub env: Vec<String>,
}

/// Every cache of `sb`'s clone whose key matches the lockfiles in the box's own workspace. A
/// cache that cannot be offered is simply not granted: every package manager falls back to
/// fetching what it cannot find.
pub fn granted(sb: &StoredBox) -> Vec<Granted> {
    let Some(root) = CacheRoot::of_box(sb) else {
        return Vec::new();
    };
    let Ok(all) = offers(&root, &sb.paths.workspace()) else {
        return Vec::new();
    };
    all.into_iter()
        .filter_map(|o| match o {
            Offer::Mounted {
                data, inside, env, ..
            } => Some(Granted { data, inside, env }),
            _ => None,
        })
        .collect()
}

/// For the run path of the process and supervised tiers: each [`granted`] cache as a read-only
/// bind in `binds` and its variables in `env`. (The container tier mounts the same list through
/// Podman: `container::box_binds`.)
pub fn grant(sb: &StoredBox, binds: &mut Vec<Bind>, env: &mut Vec<String>) {
    let granted = granted(sb);
    for g in &granted {
        binds.push(Bind::ro(&g.data, &g.inside));
    }
    env.extend(env_of(&granted));
}

/// Variables a package manager reads as a space-separated list: two caches naming the same one
/// (pip's wheelhouse and Poetry's, in a project with both lockfiles) are joined. (uv's own
/// `UV_FIND_LINKS` is comma-separated, and only the uv cache sets it.)
const LIST_VARS: &[&str] = &["PIP_FIND_LINKS"];

/// The variables of every granted cache (`NAME=VALUE`), each name once: a list variable's
/// values joined, any other repeated name kept at its first value (they agree: `PIP_NO_INDEX=1`).
pub fn env_of(granted: &[Granted]) -> Vec<String> {
    let mut out: Vec<(String, String)> = Vec::new();
    for kv in granted.iter().flat_map(|g| &g.env) {
        let Some((k, v)) = kv.split_once('=') else {
            continue;
        };
        match out.iter_mut().find(|(name, _)| name == k) {
            Some((_, have)) if LIST_VARS.contains(&k) && !have.split(' ').any(|h| h == v) => {
                have.push(' ');
                have.push_str(v);
            }
            Some(_) => {}
            None => out.push((k.to_owned(), v.to_owned())),
        }
    }
    out.into_iter().map(|(k, v)| format!("{k}={v}")).collect()
}

/// The tier `tier` gets caches at all (the workspace tier runs on the host as the caller, with
/// nothing to make a mount read-only in).
pub fn tier_mounts_caches(tier: h5i_policy::Tier) -> bool {
    matches!(
        tier,
        h5i_policy::Tier::Process | h5i_policy::Tier::Supervised | h5i_policy::Tier::Container
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn granted(env: &[&str]) -> Granted {
        Granted {
            data: PathBuf::from("/unused"),
            inside: String::new(),
            env: env.iter().map(|s| (*s).to_owned()).collect(),
        }
    }

    #[test]
    fn two_wheelhouses_share_one_find_links_and_nothing_repeats() {
        let pip = granted(&["PIP_FIND_LINKS=/.h5i/cache/pip", "PIP_NO_INDEX=1"]);
        let poetry = granted(&["PIP_FIND_LINKS=/.h5i/cache/poetry", "PIP_NO_INDEX=1"]);
        let npm = granted(&["npm_config_cache=/.h5i/cache/npm"]);
        assert_eq!(
            env_of(&[pip.clone(), npm, poetry, pip]),
            [
                "PIP_FIND_LINKS=/.h5i/cache/pip /.h5i/cache/poetry",
                "PIP_NO_INDEX=1",
                "npm_config_cache=/.h5i/cache/npm",
            ]
        );
    }
}
