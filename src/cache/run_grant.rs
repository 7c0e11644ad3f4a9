//! What the box's warm caches grant one run, by tier, for the verbs that open a run session
//! (`run`, `shell`, a service's supervisor, `box bundle`) to hand down in the request: the
//! session and the tiers never name this module (it runs boxes of its own: `refresh`), so it
//! works the grant out above them ([`super::mounts`] decides what is granted).
//!
//! Must never: grant anything to a tier that does not mount caches (workspace), or a built
//! tree to a tier that brings its own node (container, microvm).
//!
//! Guarded by `tests/box_cache.rs`.

use h5i_policy::Tier;
use h5i_runtime::bundle::Bind;

use super::mounts;
use crate::error::BoxError;
use crate::process::CacheGrant;
use crate::store::StoredBox;

/// What `sb`'s caches grant a run at `tier`: at process and supervised [`mounts::grant`]'s
/// binds, variables and overlays; at the container and microvm tiers the download caches alone
/// ([`mounts::granted`] without the host's `/usr` trees: Podman mounts them, or the VM is
/// booted with each as a read-only 9p share, `crate::microvm`; microsandbox's backend takes
/// none); nothing at the workspace tier.
pub fn for_run(sb: &StoredBox, tier: Tier) -> Result<CacheGrant, BoxError> {
    let mut out = CacheGrant::default();
    match tier {
        Tier::Process | Tier::Supervised => {
            mounts::grant(sb, &mut out.binds, &mut out.env, &mut out.overlays)?;
        }
        Tier::Container | Tier::Microvm => {
            // Read once: what is mounted and the variables naming it come from the same answer.
            let granted = mounts::granted(sb, false);
            out.binds = granted
                .iter()
                .map(|g| Bind::ro(&g.data, &g.inside))
                .collect();
            out.env = mounts::env_of(&granted);
        }
        Tier::Workspace => {}
    }
    Ok(out)
}
