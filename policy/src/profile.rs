//! A profile's policy before a tier is chosen: built-in or custom, merged over `default`, with
//! the place each constraining value was written, so a refusal can point at it.
//!
//! Owns [`ProfilePolicy`], its internal-contradiction check, and the one rule table of what each
//! tier cannot hold ([`ProfilePolicy::tier_conflict`]), used alike for a profile's own
//! `isolation`, an explicit `--isolation`, and `auto`. Must never: pick a tier or look at the
//! host (that is `resolve.rs`).
//!
//! Guarded by the contradiction tests in `envfile.rs` and the tier tests in `resolve.rs`.

use crate::error::{Location, PolicyError};
use crate::resolved::{AgentRuntime, AuthGrant, NetMode, Resources, SecretGrant, SecretInject};
use crate::tier::Tier;
use crate::values::{path_within, HostPort};

/// A value and where it was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Located<T> {
    pub value: T,
    pub at: Location,
}

impl<T> Located<T> {
    pub fn new(value: T, at: Location) -> Self {
        Located { value, at }
    }
}

/// What a profile's `isolation` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IsolationRequest {
    Auto,
    Tier(Tier),
}

/// Why a tier cannot hold a policy: the key, what it asks for, and the mend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TierConflict {
    pub at: Location,
    pub what: String,
    pub mend: String,
}

/// A profile's policy, tier-independent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ProfilePolicy {
    pub name: String,
    pub agent: Option<AgentRuntime>,
    pub isolation: Option<Located<IsolationRequest>>,
    pub fs_read: Vec<Located<String>>,
    pub fs_write: Vec<Located<String>>,
    pub fs_deny: Vec<Located<String>>,
    pub net_mode: Located<NetMode>,
    pub egress: Located<Vec<HostPort>>,
    pub unix: bool,
    pub loopback: Vec<u16>,
    /// `net.families`: grantable address-family names, checked against the table.
    pub families: Vec<String>,
    pub resources: Resources,
    pub secrets: Vec<Located<SecretGrant>>,
    pub auth: Located<Vec<AuthGrant>>,
    pub image: Option<String>,
    pub container_runtime: Option<crate::resolved::ContainerRuntime>,
}

impl ProfilePolicy {
    /// The first reason `tier` cannot hold this policy, if any.
    ///
    /// The rules, all from the manual: `process` scopes the network as deny or host only, so it
    /// cannot enforce an egress allowlist; `container` has no host network to give (its way out
    /// is the egress proxy); `file`-injected secrets are workspace-only in v1;
    /// a microVM guest cannot dial the host's credential proxy, so `[[auth]]` grants are refused
    /// there.
    pub fn tier_conflict(&self, tier: Tier) -> Option<TierConflict> {
        if tier == Tier::Container && self.net_mode.value == NetMode::Host {
            return Some(TierConflict {
                at: self.net_mode.at.clone(),
                what: format!(
                    "profile `{}` asks for net.mode = \"host\", and isolation `container` gives a \
                     box no network of its own: its only way out is the egress proxy",
                    self.name
                ),
                mend: "use net.mode = \"deny\" with net.egress for the hosts it needs, or \
                       isolation process for the host's network"
                    .to_owned(),
            });
        }
        if tier == Tier::Process && !self.egress.value.is_empty() {
            return Some(TierConflict {
                at: self.egress.at.clone(),
                what: format!(
                    "profile `{}` allows egress to {}, and isolation `process` scopes the network \
                     as deny or host only",
                    self.name,
                    list(&self.egress.value)
                ),
                mend: "use isolation supervised, container or microvm (they enforce an egress \
                       allowlist), or drop net.egress"
                    .to_owned(),
            });
        }
        if tier != Tier::Workspace {
            if let Some(s) = self
                .secrets
                .iter()
                .find(|s| s.value.inject == SecretInject::File)
            {
                return Some(TierConflict {
                    at: s.at.clone(),
                    what: format!(
                        "secret `{}` is injected as a file, which is workspace-tier only in v1, and \
                         the tier is `{tier}`",
                        s.value.name
                    ),
                    mend: "set inject = \"env\", or use isolation workspace".to_owned(),
                });
            }
        }
        if tier == Tier::Microvm && !self.auth.value.is_empty() {
            return Some(TierConflict {
                at: self.auth.at.clone(),
                what: format!(
                    "profile `{}` declares authenticated-egress grants ({}), and a microVM guest \
                     cannot dial the host's credential proxy",
                    self.name,
                    self.auth
                        .value
                        .iter()
                        .map(|a| a.host.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                mend: "use isolation supervised or container for this profile, or remove its \
                       [[auth]] grants"
                    .to_owned(),
            });
        }
        None
    }

    /// Refuse contradictions inside the profile itself.
    pub fn check(&self) -> Result<(), PolicyError> {
        if self.net_mode.value == NetMode::Host && !self.egress.value.is_empty() {
            return Err(PolicyError::Contradiction {
                at: self.egress.at.clone(),
                what: format!(
                    "egress lists {}, but net.mode = \"host\" ({}) already grants the whole host \
                     network, so the allowlist would mean nothing",
                    list(&self.egress.value),
                    self.net_mode.at
                ),
                mend: "set net.mode = \"deny\" to keep the allowlist, or drop egress for an \
                       unscoped network"
                    .to_owned(),
            });
        }
        for deny in &self.fs_deny {
            for (grant, kind) in self
                .fs_read
                .iter()
                .map(|g| (g, "read"))
                .chain(self.fs_write.iter().map(|g| (g, "write")))
            {
                if path_within(&deny.value, &grant.value) {
                    return Err(PolicyError::Contradiction {
                        at: deny.at.clone(),
                        what: format!(
                            "`{}` is denied inside `{}`, which fs.{kind} grants ({}); a denied path \
                             inside a granted parent is refused as a policy",
                            deny.value, grant.value, grant.at
                        ),
                        mend: format!(
                            "narrow fs.{kind} so it no longer covers `{}` (grant the siblings you \
                             need), or drop the deny entry",
                            deny.value
                        ),
                    });
                }
                if path_within(&grant.value, &deny.value) {
                    return Err(PolicyError::Contradiction {
                        at: grant.at.clone(),
                        what: format!(
                            "fs.{kind} grants `{}`, inside `{}`, which fs.deny denies ({})",
                            grant.value, deny.value, deny.at
                        ),
                        mend: "drop one of the two entries".to_owned(),
                    });
                }
            }
        }
        if let Some(Located {
            value: IsolationRequest::Tier(tier),
            at,
        }) = &self.isolation
        {
            if let Some(c) = self.tier_conflict(*tier) {
                return Err(PolicyError::Contradiction {
                    at: c.at,
                    what: format!("{}, as `isolation` asks ({at})", c.what),
                    mend: c.mend,
                });
            }
        }
        Ok(())
    }
}

fn list(hosts: &[HostPort]) -> String {
    hosts
        .iter()
        .map(|h| format!("`{h}`"))
        .collect::<Vec<_>>()
        .join(", ")
}
