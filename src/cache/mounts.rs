//! `h5i box cache mounts [NAME]`: exactly what a box would get, and the one place the run path
//! asks for it ([`grant`]).
//!
//! Owns the decision per ecosystem: the cache whose key matches the lockfiles of the project
//! the box installs from, and that [`CacheRoot::verify`] accepts, is mounted read-only at its
//! own path, and the package manager's variables point at it; a cache under any other key is
//! stale and never handed out. A node package manager's built tree (npm, pnpm, Yarn 1:
//! [`super::KeptTree`]) is mounted beside it only at the tiers that run the host's `/usr`
//! (process, supervised), and only when the node binary there is the one that built it
//! ([`super::TreeRecord`]). There it is also the box's `node_modules`, without a copy: an overlay
//! ([`h5i_runtime::bundle::Overlay`]) of the read-only tree beneath an upper layer of the box's
//! own (`<box dir>/<eco>-tree/<key>/upper`, kept while the box lives), unless the workspace
//! already has a `node_modules` of its own, which is left as it is. One tree per box: a project
//! locked for two of them gets the first of the table's order overlaid, or the one its
//! `node_modules` is already built on.
//!
//! From its first run with the overlay, the box's `node_modules` is the box's own, not the
//! cache's ([`BoxTree`]): later runs overlay the same tree (the key it started from) beneath the
//! same upper layer whatever the lockfiles say now, so a box that changes its lockfile (`npm
//! install foo` writes both) keeps the `node_modules` it made. The stale rule is about the
//! cache: the download cache and the tree's own read-only view follow the lockfiles' key and
//! are handed out only when it is current; the box's base layer gives it nothing it did not
//! already have. When that tree is gone (`box cache rm`, or a refresh for other lockfiles
//! replaced it) the box's changes stay in its upper layer, named by `mounts`, until `box rm`.
//!
//! The container and microvm tiers get no built tree, and so no kept `node_modules` built on
//! one ([`TreeOffer::OtherTier`], and [`box_tree`] is None there): `refresh` builds the tree in
//! a supervised box on the host's `/usr`, with the host's node, and a tree is right only for
//! the node that built it (native addons are compiled for one node ABI; npm leaves out the
//! optional packages of other platforms and libcs). Those tiers run their image's node, a
//! binary h5i never built a tree with and cannot identify from the host as the one that did,
//! so handing them the tree would be the silent wrong answer a stale key is. Such a box
//! installs its own `node_modules` into its workspace from the read-only download cache,
//! offline (`npm ci --offline`), and that tree is the box's own like any file it writes.
//!
//! Must never: grant a cache read-write, grant one whose key does not match, grant one to the
//! workspace tier (which has no mount namespace to make it read-only in), or share an upper
//! layer between boxes. The tiers mount what [`granted`] lists: `process.rs` (process,
//! supervised), `container` (Podman) and `microvm` (a read-only 9p share per cache, the VM
//! booted again when a key changes).

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::{CacheError, CacheRoot, ECOSYSTEMS};
use crate::error::BoxError;
use crate::store::StoredBox;
use h5i_runtime::bundle::{Bind, Overlay};

/// Where a built tree is overlaid in a box: the workspace's `node_modules`.
pub const TREE_OVERLAY: &str = "/work/node_modules";

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
        /// npm, pnpm, Yarn: the built `node_modules` stored with it, and whether this box gets it.
        #[serde(skip_serializing_if = "Option::is_none")]
        tree: Option<TreeOffer>,
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

/// A built tree, for one box.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "state", rename_all = "kebab-case")]
pub enum TreeOffer {
    /// Mounted read-only at `inside`, named by `var`.
    Mounted {
        /// What it was built for.
        platform: String,
        /// The directory on the host.
        data: PathBuf,
        /// Where the box sees it.
        inside: &'static str,
        /// `NAME=VALUE` naming it in the box.
        env: String,
        /// Whether it is also the workspace's `node_modules`.
        overlay: TreeOverlay,
        /// The install that finds it up to date.
        warm_install: &'static str,
    },
    /// Built by another node binary than the one this box would run (another platform or ABI,
    /// or node changed since): not mounted.
    OtherNode {
        /// What it was built for.
        platform: String,
        /// The node binary that built it.
        built_by: PathBuf,
    },
    /// The box's tier brings its own node and libc (the container and microvm tiers' image):
    /// not mounted, and no `node_modules` is kept on it (the module doc says why).
    OtherTier {
        /// What it was built for.
        platform: String,
    },
}

/// Whether a built tree is the box's `node_modules`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "kebab-case")]
pub enum TreeOverlay {
    /// Overlaid at `inside`: the tree read-only beneath, the box's changes in an upper layer
    /// of its own.
    Overlaid {
        /// Where the box sees it.
        inside: &'static str,
    },
    /// Not this key's tree: the box's `node_modules` stays the one it has, the tree of `eco`'s
    /// cache `key` it started from beneath its own upper layer ([`BoxTree`]).
    Kept {
        /// The ecosystem whose tree is beneath the box's `node_modules`.
        eco: &'static str,
        /// The key of the tree beneath the box's `node_modules`.
        key: String,
    },
    /// The workspace has a `node_modules` of its own (anything but an empty directory): left
    /// as it is.
    OwnTree,
    /// The project is locked for another node package manager too, whose tree (first in the
    /// table's order) is the one overlaid.
    OtherTree {
        /// That ecosystem.
        eco: &'static str,
    },
}

/// A box's own `node_modules` once it has had a built tree overlaid: the tree of the ecosystem
/// and key it started from (its upper layer's directory and name), whatever the lockfiles make
/// now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "kebab-case")]
pub enum BoxTree {
    /// Overlaid at `inside`: `lower` read-only beneath `upper`.
    Overlaid {
        /// The ecosystem whose tree is beneath.
        eco: &'static str,
        /// The key of the tree beneath.
        key: String,
        /// Whether the lockfiles make that key now (false: the box changed them since).
        current: bool,
        /// The tree on the host.
        lower: PathBuf,
        /// The box's upper layer (`upper/` and `work/` inside) on the host.
        upper: PathBuf,
        /// Where the box sees it.
        inside: &'static str,
    },
    /// Not overlaid: the box's changes stay in `upper` until `h5i box rm`.
    Unavailable {
        /// The ecosystem whose tree it was.
        eco: &'static str,
        /// The key of the tree it was.
        key: String,
        /// The box's upper layer on the host.
        upper: PathBuf,
        /// Why it cannot be overlaid now.
        why: String,
    },
}

/// The key of the tree a box's `node_modules` is built on: the name of an upper layer it has
/// under `uppers`, `current`'s when it has one for that key (a box made before the layer was
/// kept across a lockfile change may have several), else the newest.
fn base_key(uppers: &Path, current: Option<&str>) -> Option<String> {
    let mut have: Vec<(std::time::SystemTime, String)> = std::fs::read_dir(uppers)
        .ok()?
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_str()?.to_owned();
            let meta = e.path().symlink_metadata().ok()?;
            (super::is_key(&name) && meta.is_dir()).then_some((meta.modified().ok()?, name))
        })
        .collect();
    if let Some(c) = current.filter(|c| have.iter().any(|(_, k)| k == c)) {
        return Some(c.to_owned());
    }
    have.sort();
    have.pop().map(|(_, k)| k)
}

/// Box `sb`'s own `node_modules`, when it has had a built tree overlaid (`host_usr`: as
/// [`offers`]; the container tier never has one). None: it never had, or the workspace has a
/// `node_modules` of its own.
pub fn box_tree(sb: &StoredBox, root: &CacheRoot, host_usr: bool) -> Option<BoxTree> {
    let ws = sb.paths.workspace();
    let (eco, current, key) = ECOSYSTEMS
        .iter()
        .filter(|e| e.tree.is_some())
        .find_map(|eco| {
            let current = eco.key_of(&ws).ok().flatten();
            let key = base_key(&upper_root(sb, eco.name), current.as_deref())?;
            Some((eco, current, key))
        })?;
    let upper = upper_root(sb, eco.name).join(&key);
    if !host_usr || overlay_for(&ws) == TreeOverlay::OwnTree {
        return None;
    }
    let why = match root.verify(eco, &key) {
        Err(why) => why,
        Ok(record) => match record.tree {
            None => "that cache keeps no built node_modules".to_owned(),
            Some(t) if super::NodeBinary::on_box_path().as_ref() != Some(&t.node) => format!(
                "it was built by {}, which is not the node this box runs now",
                t.node.path.display()
            ),
            Some(_) => {
                return Some(BoxTree::Overlaid {
                    eco: eco.name,
                    current: current.as_deref() == Some(key.as_str()),
                    lower: root.tree(eco, &key),
                    key,
                    upper,
                    inside: TREE_OVERLAY,
                })
            }
        },
    };
    Some(BoxTree::Unavailable {
        why: format!("the {} cache {key} cannot be overlaid ({why})", eco.name),
        eco: eco.name,
        key,
        upper,
    })
}

/// `offers` as box `sb` gets them: no tree overlaid but the one the box's own `node_modules`
/// is built on (`base`), and not even that one's current tree where the box's is built on
/// another key's.
pub fn keep_base(offers: &mut [Offer], base: Option<&BoxTree>) {
    let (base_eco, base_key, current) = match base {
        None => return,
        Some(BoxTree::Overlaid {
            eco, key, current, ..
        }) => (*eco, key, *current),
        Some(BoxTree::Unavailable { eco, key, .. }) => (*eco, key, true),
    };
    for o in offers {
        if let Offer::Mounted {
            eco,
            tree: Some(TreeOffer::Mounted { overlay, .. }),
            ..
        } = o
        {
            if *overlay == TreeOverlay::OwnTree {
                continue;
            }
            *overlay = if *eco == base_eco && current {
                TreeOverlay::Overlaid {
                    inside: TREE_OVERLAY,
                }
            } else {
                TreeOverlay::Kept {
                    eco: base_eco,
                    key: base_key.clone(),
                }
            };
        }
    }
}

/// Whether the workspace `ws` leaves room for the overlay: no `node_modules`, or an empty
/// directory (what an earlier overlay's mount point leaves). A symlink, a file or a directory
/// with entries is the box's own.
fn overlay_for(ws: &Path) -> TreeOverlay {
    let at = ws.join("node_modules");
    let free = match std::fs::symlink_metadata(&at) {
        Err(e) => e.kind() == std::io::ErrorKind::NotFound,
        Ok(m) => m.is_dir() && std::fs::read_dir(&at).is_ok_and(|mut d| d.next().is_none()),
    };
    if free {
        TreeOverlay::Overlaid {
            inside: TREE_OVERLAY,
        }
    } else {
        TreeOverlay::OwnTree
    }
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
/// uses (an ecosystem without a lockfile is left out). `host_usr`: the box runs the host's
/// `/usr` (the process and supervised tiers), the only place a built tree may be mounted.
/// `workspace`: `project` is a box's workspace, whose own `node_modules` an overlay would
/// hide (else `project` is the working tree a new box would clone, without one).
pub fn offers(
    root: &CacheRoot,
    project: &Path,
    host_usr: bool,
    workspace: bool,
) -> Result<Vec<Offer>, CacheError> {
    let mut out = Vec::new();
    // The ecosystem whose tree is overlaid as node_modules: one per box.
    let mut overlaid_by = None;
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
            let record = match root.verify(eco, &want) {
                Ok(r) => r,
                Err(why) => {
                    out.push(Offer::Refused {
                        eco: eco.name,
                        why: format!(
                            "refusing: the {e} cache {want} is not one `h5i box cache refresh` left ({why}); to fix: `h5i box cache rm {e}`, then `h5i box cache refresh {e}`",
                            e = eco.name
                        ),
                    });
                    continue;
                }
            };
            let data = root.data(eco, &want);
            let inside = h5i_policy::inbox::cache_dir(eco.name);
            let kept = eco.tree.as_ref();
            let tree = record.tree.zip(kept).map(|(t, kept)| {
                if !host_usr {
                    TreeOffer::OtherTier {
                        platform: t.platform,
                    }
                } else if super::NodeBinary::on_box_path().as_ref() != Some(&t.node) {
                    TreeOffer::OtherNode {
                        platform: t.platform,
                        built_by: t.node.path,
                    }
                } else {
                    TreeOffer::Mounted {
                        platform: t.platform,
                        data: root.tree(eco, &want),
                        inside: kept.inside,
                        env: format!("{}={}", kept.var, kept.inside),
                        overlay: match overlaid_by {
                            Some(first) => TreeOverlay::OtherTree { eco: first },
                            None if workspace => overlay_for(project),
                            None => TreeOverlay::Overlaid {
                                inside: TREE_OVERLAY,
                            },
                        },
                        warm_install: kept.warm_install,
                    }
                }
            });
            if let Some(TreeOffer::Mounted {
                overlay: TreeOverlay::Overlaid { .. },
                ..
            }) = &tree
            {
                overlaid_by = Some(eco.name);
            }
            Offer::Mounted {
                eco: eco.name,
                env: eco.env_for(Path::new(&inside)),
                key: want,
                data,
                inside,
                tree,
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
    /// The ecosystem.
    pub eco: &'static str,
    /// The cache's key.
    pub key: String,
    /// The cache's data directory on the host.
    pub data: PathBuf,
    /// Where the box sees it.
    pub inside: String,
    /// The package manager's variables.
    pub env: Vec<String>,
    /// Its built tree, when this box gets it.
    pub tree: Option<GrantedTree>,
}

/// A built tree as one box gets it.
#[derive(Debug, Clone)]
pub struct GrantedTree {
    /// The tree on the host.
    pub data: PathBuf,
    /// Where the box sees it read-only.
    pub inside: &'static str,
    /// `NAME=VALUE` naming it.
    pub var: String,
    /// Whether it is overlaid as the workspace's `node_modules`.
    pub overlay: TreeOverlay,
}

/// Every cache of `sb`'s clone whose key matches the lockfiles in the box's own workspace
/// (`host_usr`: as [`offers`]). A cache that cannot be offered is simply not granted: every
/// package manager falls back to fetching what it cannot find.
pub fn granted(sb: &StoredBox, host_usr: bool) -> Vec<Granted> {
    let Some(root) = CacheRoot::of_box(sb) else {
        return Vec::new();
    };
    let Ok(mut all) = offers(&root, &sb.paths.workspace(), host_usr, true) else {
        return Vec::new();
    };
    keep_base(&mut all, box_tree(sb, &root, host_usr).as_ref());
    all.into_iter()
        .filter_map(|o| match o {
            Offer::Mounted {
                eco,
                key,
                data,
                inside,
                env,
                tree,
            } => Some(Granted {
                eco,
                key,
                data,
                inside,
                env,
                tree: match tree {
                    Some(TreeOffer::Mounted {
                        data,
                        inside,
                        env,
                        overlay,
                        ..
                    }) => Some(GrantedTree {
                        data,
                        inside,
                        var: env,
                        overlay,
                    }),
                    _ => None,
                },
            }),
            _ => None,
        })
        .collect()
}

/// For the run path of the process and supervised tiers: each [`granted`] cache (and its built
/// tree) as a read-only bind in `binds`, its variables in `env`, and one built tree as the
/// workspace's `node_modules` in `overlays`: the tree the box's own `node_modules` is built on
/// ([`box_tree`]), else the current key's over a new upper layer made here. (The container tier
/// mounts the download caches alone through Podman: `container::box_binds`.)
pub fn grant(
    sb: &StoredBox,
    binds: &mut Vec<Bind>,
    env: &mut Vec<String>,
    overlays: &mut Vec<Overlay>,
) -> Result<(), BoxError> {
    let granted = granted(sb, true);
    if let Some(BoxTree::Overlaid {
        lower,
        upper,
        inside,
        current: false,
        ..
    }) = CacheRoot::of_box(sb).and_then(|root| box_tree(sb, &root, true))
    {
        overlays.push(Overlay {
            lower,
            state: upper,
            dest: PathBuf::from(inside),
        });
    }
    for g in &granted {
        binds.push(Bind::ro(&g.data, &g.inside));
        if let Some(t) = &g.tree {
            binds.push(Bind::ro(&t.data, t.inside));
            env.push(t.var.clone());
            if let TreeOverlay::Overlaid { inside } = t.overlay {
                overlays.push(Overlay {
                    lower: t.data.clone(),
                    state: upper_state(sb, g.eco, &g.key)?,
                    dest: PathBuf::from(inside),
                });
            }
        }
    }
    env.extend(env_of(&granted));
    Ok(())
}

/// The box's own directory of upper layers for `eco`'s tree: `<box dir>/<eco>-tree` (outside
/// every grant: the box reaches an upper layer only through its overlay).
pub fn upper_root(sb: &StoredBox, eco: &str) -> PathBuf {
    sb.paths.dir.join(format!("{eco}-tree"))
}

/// The box's upper layer for the tree of `eco`'s cache key `key`: `<box dir>/<eco>-tree/<key>` holding
/// `upper/` and `work/`, owned by the box's identity. Made whole or not at all (both made
/// under a temporary name, handed to the box, then renamed into place), so a killed run
/// leaves no half of one.
fn upper_state(sb: &StoredBox, eco: &str, key: &str) -> Result<PathBuf, BoxError> {
    let root = upper_root(sb, eco);
    let state = root.join(key);
    if state.is_dir() {
        return Ok(state);
    }
    let fresh = root.join(format!(".new-{}", std::process::id()));
    let _ = crate::lifecycle::remove_tree(&fresh);
    for d in [fresh.join("upper"), fresh.join("work")] {
        std::fs::create_dir_all(&d).map_err(|e| BoxError::io(&d, e))?;
    }
    crate::identity::Mapping::for_caller()?.own(std::slice::from_ref(&fresh))?;
    if let Err(e) = std::fs::rename(&fresh, &state) {
        let _ = crate::lifecycle::remove_tree(&fresh);
        // Another run of this box made it first.
        if !state.is_dir() {
            return Err(BoxError::io(&state, e));
        }
    }
    Ok(state)
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
    !matches!(tier, h5i_policy::Tier::Workspace)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn granted(env: &[&str]) -> Granted {
        Granted {
            eco: "npm",
            key: String::new(),
            data: PathBuf::from("/unused"),
            inside: String::new(),
            env: env.iter().map(|s| (*s).to_owned()).collect(),
            tree: None,
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
