//! Isolation tiers, what the host says it can run, and how a box's tier was chosen.
//!
//! Owns [`Tier`] (the five tiers, strongest first), [`HostTiers`] (filled by the caller from a
//! host probe; this crate never probes), [`TierSource`] and [`TierChoice`]. Must never: probe
//! the host, or treat a tier the caller did not report as available (an unreported tier is
//! unavailable: fail closed).
//!
//! Guarded by the tests below and the tier-selection tests in `resolve.rs`.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// An isolation tier (manual: "Isolation tiers").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    /// No confinement; just a separate worktree.
    Workspace,
    /// Landlock + seccomp + namespaces, a supervisor and a private pid namespace. Network: deny
    /// or host only.
    Process,
    /// `process` plus a private netns with an nftables egress allowlist (L3/L4).
    Supervised,
    /// Rootless Podman with a CONNECT-proxy egress allowlist (L7). Runs an image.
    Container,
    /// A hardware-isolated guest (microsandbox). Runs an image. No credential-proxy grants.
    Microvm,
}

impl Tier {
    /// Every tier, strongest first: the order `auto` tries them in.
    pub const ALL_STRONGEST_FIRST: [Tier; 5] = [
        Tier::Microvm,
        Tier::Supervised,
        Tier::Container,
        Tier::Process,
        Tier::Workspace,
    ];

    /// The tier's name as written in flags, env.toml and `policy.resolved.toml`.
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Workspace => "workspace",
            Tier::Process => "process",
            Tier::Supervised => "supervised",
            Tier::Container => "container",
            Tier::Microvm => "microvm",
        }
    }

    /// Whether the tier runs an OCI image (and so needs one named).
    pub fn runs_image(self) -> bool {
        matches!(self, Tier::Container | Tier::Microvm)
    }

    /// Whether the tier can enforce a `net.egress` allowlist. `process` scopes the network as
    /// deny or host only; `workspace` does not scope it at all.
    pub fn enforces_egress_allowlist(self) -> bool {
        matches!(self, Tier::Supervised | Tier::Container | Tier::Microvm)
    }

    /// Whether declared `[service.*]` processes can be started at this tier (manual: workspace
    /// and process in v1; at supervised and container the netns belongs to one session).
    pub fn supports_services(self) -> bool {
        matches!(self, Tier::Workspace | Tier::Process)
    }
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The value given is not a tier name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not an isolation tier (workspace, process, supervised, container, microvm)")]
pub struct UnknownTier(pub String);

impl FromStr for Tier {
    type Err = UnknownTier;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Tier::ALL_STRONGEST_FIRST
            .into_iter()
            .find(|t| t.as_str() == s)
            .ok_or_else(|| UnknownTier(s.to_owned()))
    }
}

/// Whether the host can run a tier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TierAvailability {
    /// The host probe says it runs.
    Available,
    /// It does not; the probe's reason, shown to the user verbatim.
    Unavailable(String),
    /// It runs when asked for by name, but `auto` passes over it; the probe's reason (as a
    /// backend that would refuse what most policies ask, or would run them far slower).
    OnRequest(String),
}

/// What the host can run, tier by tier, as the caller's probe found it.
///
/// A tier never reported is unavailable, with a reason saying the probe did not report it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostTiers {
    tiers: BTreeMap<Tier, TierAvailability>,
    /// The host's physical memory in bytes (`MemTotal`), when the caller read it: the
    /// protective default ceilings are sized from it (`crate::builtin::protective_ceilings`).
    memory_bytes: Option<u64>,
}

impl HostTiers {
    /// Nothing known yet: every tier unavailable until reported.
    pub fn new() -> Self {
        HostTiers::default()
    }

    /// Every tier available (for callers' tests and for hosts proven to run everything).
    pub fn all_available() -> Self {
        let mut h = HostTiers::new();
        for t in Tier::ALL_STRONGEST_FIRST {
            h.set_available(t);
        }
        h
    }

    /// Record that the host runs `tier`.
    pub fn set_available(&mut self, tier: Tier) -> &mut Self {
        self.tiers.insert(tier, TierAvailability::Available);
        self
    }

    /// Record that the host cannot run `tier`, and why.
    pub fn set_unavailable(&mut self, tier: Tier, reason: impl Into<String>) -> &mut Self {
        self.tiers
            .insert(tier, TierAvailability::Unavailable(reason.into()));
        self
    }

    /// Record that the host runs `tier` only when asked for by name, and why `auto` passes
    /// over it.
    pub fn set_on_request(&mut self, tier: Tier, reason: impl Into<String>) -> &mut Self {
        self.tiers
            .insert(tier, TierAvailability::OnRequest(reason.into()));
        self
    }

    /// Record the host's physical memory, bytes.
    pub fn set_memory_bytes(&mut self, bytes: u64) -> &mut Self {
        self.memory_bytes = Some(bytes);
        self
    }

    /// The host's physical memory, bytes, if the caller recorded it.
    pub fn memory_bytes(&self) -> Option<u64> {
        self.memory_bytes
    }

    /// Whether the host runs `tier`.
    pub fn availability(&self, tier: Tier) -> TierAvailability {
        self.tiers.get(&tier).cloned().unwrap_or_else(|| {
            TierAvailability::Unavailable("the host probe did not report this tier".to_owned())
        })
    }
}

/// Who decided the tier request (before `auto` ran, if it did).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TierSource {
    /// The `--isolation` flag.
    Flag,
    /// The profile's `isolation` key.
    Profile,
    /// `H5I_DEFAULT_ISOLATION`.
    EnvDefault,
    /// Nothing asked: the default, `auto`.
    Default,
}

impl TierSource {
    /// How the source is named in messages.
    pub fn as_str(self) -> &'static str {
        match self {
            TierSource::Flag => "--isolation",
            TierSource::Profile => "the profile's `isolation`",
            TierSource::EnvDefault => "H5I_DEFAULT_ISOLATION",
            TierSource::Default => "the default (auto)",
        }
    }
}

/// How a resolved policy's tier was chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TierChoice {
    /// Who asked.
    pub source: TierSource,
    /// Whether what was asked for was `auto` (so the tier is the strongest the host could run
    /// that holds the policy) rather than a named tier.
    pub auto: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiers_round_trip_through_their_names() {
        for t in Tier::ALL_STRONGEST_FIRST {
            assert_eq!(t.as_str().parse::<Tier>(), Ok(t));
            assert_eq!(t.to_string(), t.as_str());
        }
        assert!("auto".parse::<Tier>().is_err());
        assert!("Process".parse::<Tier>().is_err());
    }

    #[test]
    fn strongest_first_order_is_the_manuals() {
        let names: Vec<_> = Tier::ALL_STRONGEST_FIRST
            .iter()
            .map(|t| t.as_str())
            .collect();
        assert_eq!(
            names,
            ["microvm", "supervised", "container", "process", "workspace"]
        );
    }

    #[test]
    fn an_unreported_tier_is_unavailable() {
        let mut h = HostTiers::new();
        h.set_available(Tier::Process);
        assert_eq!(h.availability(Tier::Process), TierAvailability::Available);
        assert!(matches!(
            h.availability(Tier::Supervised),
            TierAvailability::Unavailable(_)
        ));
    }
}
