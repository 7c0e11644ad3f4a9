//! The resolved policy: what one box is allowed to do, as plain data, its canonical TOML form
//! (`policy.resolved.toml`) and its SHA-256 digest.
//!
//! Owns [`ResolvedPolicy`] and its parts, [`ResolvedPolicy::to_canonical_toml`],
//! [`PolicyDigest`] and [`ResolvedPolicy::load_verified`]. The canonical form is deterministic:
//! fixed field order, sorted and deduplicated lists, maps keyed in order, no comments, `$WORK`
//! and `$HOME` symbolic, so the same policy gives the same bytes on every machine. Must never:
//! hold a secret value (only names and sources), repair a stored policy that does not match
//! its digest, or accept a stored policy that is not exactly canonical.
//!
//! Guarded by `digest_is_stable_*`, `tampered_*` and `every_builtin_round_trips*` tests here and
//! in `resolve.rs`.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest as _, Sha256};

use crate::error::PolicyError;
use crate::tier::{Tier, TierChoice};
use crate::values::{is_env_var_name, HostPort};

/// Version of the `policy.resolved.toml` schema written by this build.
pub const RESOLVED_SCHEMA_VERSION: u32 = 1;

/// Which agent runtime a box is scoped to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AgentRuntime {
    /// Claude Code.
    Claude,
    /// Codex.
    Codex,
}

impl AgentRuntime {
    /// The name `H5I_AGENT` uses.
    pub fn as_str(self) -> &'static str {
        match self {
            AgentRuntime::Claude => "claude",
            AgentRuntime::Codex => "codex",
        }
    }

    /// The folder in the box where this runtime reads what h5i binds over it (a box reading the
    /// host's `/etc` needs it as a mount point): Claude Code's managed settings on Linux, and
    /// Codex's system configuration, hooks and skills.
    pub fn system_dir(self) -> &'static str {
        match self {
            AgentRuntime::Claude => "/etc/claude-code",
            AgentRuntime::Codex => "/etc/codex",
        }
    }
}

impl fmt::Display for AgentRuntime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for AgentRuntime {
    type Err = ();

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "claude" => Ok(AgentRuntime::Claude),
            "codex" => Ok(AgentRuntime::Codex),
            _ => Err(()),
        }
    }
}

/// The OCI runtime rootless Podman runs a container box with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ContainerRuntime {
    /// `h5i-runc`: Podman's spec plus h5i's Landlock, seccomp deny-list and socket gate (the
    /// default).
    H5iRunc,
    /// The host's default runtime (Podman's `runc` or `crun`): none of h5i-runc's layers.
    HostDefault,
}

impl ContainerRuntime {
    /// The name as written in env.toml.
    pub fn as_str(self) -> &'static str {
        match self {
            ContainerRuntime::H5iRunc => "h5i-runc",
            ContainerRuntime::HostDefault => "host-default",
        }
    }
}

impl FromStr for ContainerRuntime {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "h5i-runc" => Ok(ContainerRuntime::H5iRunc),
            "host-default" => Ok(ContainerRuntime::HostDefault),
            other => Err(format!(
                "`{other}` is not a container runtime (h5i-runc or host-default)"
            )),
        }
    }
}

/// Filesystem grants. Paths are normalized, sorted and deduplicated; `$WORK` and `$HOME` stay
/// symbolic.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FsPolicy {
    /// Read-only grants.
    pub read: Vec<String>,
    /// Read-write grants.
    pub write: Vec<String>,
    /// Explicit denials (never inside a grant: that is refused as a contradiction).
    pub deny: Vec<String>,
}

/// `net.mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NetMode {
    /// No network except the listed `egress` destinations.
    Deny,
    /// The host's network, unscoped. Cannot be combined with `egress`.
    Host,
}

impl NetMode {
    /// The mode's name as written in env.toml.
    pub fn as_str(self) -> &'static str {
        match self {
            NetMode::Deny => "deny",
            NetMode::Host => "host",
        }
    }
}

/// Network grants.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetPolicy {
    /// Deny (with allowlisted egress) or host.
    pub mode: NetMode,
    /// Allowed destinations, sorted, deduplicated, written `host:port`.
    pub egress: Vec<HostPort>,
    /// Whether `socket(AF_UNIX)` is allowed.
    pub unix: bool,
    /// Loopback ports the box may reach (macOS; sorted, deduplicated).
    pub loopback: Vec<u16>,
    /// Address families granted beyond the always-allowed ones (`net.families`; names from
    /// [`crate::families::ADDRESS_FAMILIES`], sorted, deduplicated). Left out of the canonical
    /// text when empty, so policies that grant none keep the digest they had before the key.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub families: Vec<String>,
}

impl Default for NetPolicy {
    fn default() -> Self {
        NetPolicy {
            mode: NetMode::Deny,
            egress: Vec::new(),
            unix: false,
            loopback: Vec::new(),
            families: Vec::new(),
        }
    }
}

/// Resource ceilings; `None` means no limit was asked for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Resources {
    /// Memory ceiling, bytes.
    pub mem_bytes: Option<u64>,
    /// Process-count ceiling.
    pub procs: Option<u64>,
    /// Wall-clock limit per run, seconds.
    pub wall_secs: Option<u64>,
}

impl Resources {
    /// `asked`, with each limit it leaves unset taken from `self` (the protective defaults).
    pub fn under(self, asked: Resources) -> Resources {
        Resources {
            mem_bytes: asked.mem_bytes.or(self.mem_bytes),
            procs: asked.procs.or(self.procs),
            wall_secs: asked.wall_secs.or(self.wall_secs),
        }
    }
}

/// Where a secret's value comes from on the host. Never the value itself.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SecretSource {
    /// The host environment variable of this name (`env:NAME`).
    Env(String),
}

impl SecretSource {
    /// The default source for a bare secret name: `env:H5I_SECRET_<NAME>`.
    pub fn default_for(name: &str) -> Self {
        SecretSource::Env(format!("H5I_SECRET_{name}"))
    }
}

impl fmt::Display for SecretSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SecretSource::Env(var) => write!(f, "env:{var}"),
        }
    }
}

impl FromStr for SecretSource {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.split_once(':') {
            Some(("env", var)) if is_env_var_name(var) => Ok(SecretSource::Env(var.to_owned())),
            Some(("env", var)) => Err(format!(
                "secret source `{s}` names `{var}`, which is not a variable name"
            )),
            _ => Err(format!(
                "secret source `{s}` is not `env:VAR` (the only source kind in v1)"
            )),
        }
    }
}

impl Serialize for SecretSource {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for SecretSource {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

/// How a secret reaches the box.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SecretInject {
    /// As an environment variable named after the secret, for one run.
    Env,
    /// As a file. Workspace tier only in v1.
    File,
}

impl SecretInject {
    /// The name as written in env.toml.
    pub fn as_str(self) -> &'static str {
        match self {
            SecretInject::Env => "env",
            SecretInject::File => "file",
        }
    }
}

/// A declared secret: a name, where its value comes from, how it is injected. Never the value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecretGrant {
    /// The secret's name (`[A-Z_][A-Z0-9_]*`).
    pub name: String,
    /// Where the host reads its value.
    pub source: SecretSource,
    /// How the box gets it.
    pub inject: SecretInject,
}

/// An authenticated-egress grant served by the host's credential proxy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthGrant {
    /// The upstream host the proxy forwards to.
    pub host: String,
    /// Host environment variable holding the real credential (read on the host, never in the box).
    pub credential_env: String,
    /// Box variable set to the proxy's base URL.
    pub base_url_var: String,
    /// Box variable set to the per-run dummy token.
    pub token_var: String,
    /// Other credentials for the same upstream, tried in order when `credential_env` is unset
    /// on the host (Claude Code's subscription token beside its API key). The box gets the
    /// dummy under the `token_var` of the one found, and only that one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fallbacks: Vec<CredentialFallback>,
}

/// A credential a grant falls back to ([`AuthGrant::fallbacks`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CredentialFallback {
    /// Host environment variable holding the credential.
    pub credential_env: String,
    /// Box variable set to the per-run dummy when this credential is the one used.
    pub token_var: String,
}

impl AuthGrant {
    /// Every `(credential_env, token_var)` the grant may use, in the order they are tried.
    pub fn credential_choices(&self) -> impl Iterator<Item = (&str, &str)> {
        std::iter::once((self.credential_env.as_str(), self.token_var.as_str())).chain(
            self.fallbacks
                .iter()
                .map(|f| (f.credential_env.as_str(), f.token_var.as_str())),
        )
    }

    /// The first credential set (and non-empty) under `lookup`, with the grant narrowed to it:
    /// its `credential_env` and `token_var` are that one's, and it has no fallbacks left.
    pub fn choose(&self, lookup: impl Fn(&str) -> Option<String>) -> Option<(AuthGrant, String)> {
        self.credential_choices().find_map(|(env, token_var)| {
            let value = lookup(env).filter(|v| !v.is_empty())?;
            let chosen = AuthGrant {
                credential_env: env.to_owned(),
                token_var: token_var.to_owned(),
                fallbacks: Vec::new(),
                ..self.clone()
            };
            Some((chosen, value))
        })
    }

    /// The credential variables, for a message: `A` or `A (or B, C)`.
    pub fn credential_vars(&self) -> String {
        if self.fallbacks.is_empty() {
            return self.credential_env.clone();
        }
        let rest: Vec<&str> = self
            .fallbacks
            .iter()
            .map(|f| f.credential_env.as_str())
            .collect();
        format!("{} (or {})", self.credential_env, rest.join(", "))
    }
}

/// A declared long-lived process (`[service.NAME]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Service {
    /// The command line, run by the box's shell.
    pub command: String,
    /// The port it listens on, when declared.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
}

/// What one box is allowed to do, decided once at creation and digested.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResolvedPolicy {
    /// Schema version ([`RESOLVED_SCHEMA_VERSION`]).
    pub version: u32,
    /// The profile it was resolved from (`agent` is recorded as the runtime-pinned profile).
    pub profile: String,
    /// The agent runtime the box is scoped to, for agent profiles.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<AgentRuntime>,
    /// The isolation tier.
    pub tier: Tier,
    /// The image, for `container` and `microvm` (absent at the other tiers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// The container tier's OCI runtime when the profile asks for the host's default (absent:
    /// h5i-runc, and at every other tier).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_runtime: Option<ContainerRuntime>,
    /// Whether the credential proxy serves the auth grants (`H5I_CREDENTIAL_PROXY=0` turns it off).
    pub credential_proxy: bool,
    /// How the tier was chosen.
    pub tier_choice: TierChoice,
    /// Filesystem grants.
    pub fs: FsPolicy,
    /// Network grants.
    pub net: NetPolicy,
    /// Resource ceilings.
    pub resources: Resources,
    /// Declared secrets, sorted by name.
    pub secrets: Vec<SecretGrant>,
    /// Authenticated-egress grants, sorted by host.
    pub auth: Vec<AuthGrant>,
    /// Declared services, by name.
    pub services: BTreeMap<String, Service>,
}

/// A policy digest: SHA-256 of the canonical TOML, shown as `sha256:<64 lowercase hex>`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PolicyDigest(String);

impl PolicyDigest {
    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        let hash = Sha256::digest(bytes);
        let mut s = String::with_capacity(7 + 64);
        s.push_str("sha256:");
        for b in hash.iter() {
            s.push(char::from(HEX[usize::from(b >> 4)]));
            s.push(char::from(HEX[usize::from(b & 0xf)]));
        }
        PolicyDigest(s)
    }

    /// The `sha256:<hex>` form.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

impl fmt::Display for PolicyDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for PolicyDigest {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.strip_prefix("sha256:") {
            Some(hex)
                if hex.len() == 64
                    && hex
                        .bytes()
                        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) =>
            {
                Ok(PolicyDigest(s.to_owned()))
            }
            _ => Err(format!("`{s}` is not a `sha256:<64 lowercase hex>` digest")),
        }
    }
}

impl ResolvedPolicy {
    /// The canonical TOML text, stored as `policy.resolved.toml`. Deterministic: the same policy
    /// always gives the same bytes.
    pub fn to_canonical_toml(&self) -> String {
        let mut normalized = self.clone();
        normalized.normalize();
        // Serializing plain structs, strings, integers, booleans and string-keyed maps to TOML
        // cannot fail; should it ever, an empty document digests differently from every real
        // policy and fails `load_verified` rather than passing silently.
        toml::to_string(&normalized).unwrap_or_default()
    }

    /// SHA-256 of [`Self::to_canonical_toml`].
    pub fn digest(&self) -> PolicyDigest {
        PolicyDigest::of(self.to_canonical_toml().as_bytes())
    }

    /// Re-read a stored `policy.resolved.toml` and check it against the digest stored beside it.
    ///
    /// Refused (never repaired) unless the raw text digests to `stored_digest` and re-canonicalizing
    /// the parsed policy gives that same digest, i.e. the text is exactly what was written.
    pub fn load_verified(text: &str, stored_digest: &str) -> Result<ResolvedPolicy, PolicyError> {
        let stored: PolicyDigest = stored_digest
            .trim()
            .parse()
            .map_err(|what| PolicyError::Tampered { what })?;
        let raw = PolicyDigest::of(text.as_bytes());
        if raw != stored {
            return Err(PolicyError::Tampered {
                what: format!(
                    "policy.resolved.toml digests to {raw}, the stored digest is {stored}"
                ),
            });
        }
        let policy: ResolvedPolicy = toml::from_str(text).map_err(|e| PolicyError::Tampered {
            what: format!("policy.resolved.toml does not parse: {}", e.message()),
        })?;
        if policy.version != RESOLVED_SCHEMA_VERSION {
            return Err(PolicyError::Tampered {
                what: format!(
                    "policy.resolved.toml has schema version {}, this build reads {RESOLVED_SCHEMA_VERSION}",
                    policy.version
                ),
            });
        }
        let again = policy.digest();
        if again != stored {
            return Err(PolicyError::Tampered {
                what: format!(
                    "policy.resolved.toml is not in canonical form (it re-canonicalizes to {again})"
                ),
            });
        }
        Ok(policy)
    }

    /// The declared secrets (names and sources, never values).
    pub fn secret_grants(&self) -> &[SecretGrant] {
        &self.secrets
    }

    /// The authenticated-egress grants.
    pub fn auth_grants(&self) -> &[AuthGrant] {
        &self.auth
    }

    /// Sort and deduplicate every list, so equal policies are equal values.
    pub(crate) fn normalize(&mut self) {
        for v in [&mut self.fs.read, &mut self.fs.write, &mut self.fs.deny] {
            v.sort();
            v.dedup();
        }
        self.net.egress.sort();
        self.net.egress.dedup();
        self.net.loopback.sort_unstable();
        self.net.loopback.dedup();
        self.net.families.sort();
        self.net.families.dedup();
        self.secrets.sort_by(|a, b| a.name.cmp(&b.name));
        self.auth.sort_by(|a, b| a.host.cmp(&b.host));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tier::TierSource;

    pub(crate) fn sample() -> ResolvedPolicy {
        ResolvedPolicy {
            version: RESOLVED_SCHEMA_VERSION,
            profile: "review".into(),
            agent: None,
            tier: Tier::Supervised,
            image: None,
            container_runtime: None,
            credential_proxy: true,
            tier_choice: TierChoice {
                source: TierSource::Profile,
                auto: false,
            },
            fs: FsPolicy {
                read: vec!["/usr".into(), "/etc".into()],
                write: vec!["$WORK".into()],
                deny: vec![],
            },
            net: NetPolicy {
                mode: NetMode::Deny,
                egress: vec!["api.github.com".parse().unwrap()],
                unix: false,
                loopback: vec![3000],
                families: Vec::new(),
            },
            resources: Resources {
                mem_bytes: Some(4 << 30),
                procs: Some(256),
                wall_secs: Some(1800),
            },
            secrets: vec![SecretGrant {
                name: "DEPLOY_KEY".into(),
                source: SecretSource::default_for("DEPLOY_KEY"),
                inject: SecretInject::Env,
            }],
            auth: vec![AuthGrant {
                fallbacks: Vec::new(),
                host: "api.github.com".into(),
                credential_env: "GITHUB_TOKEN".into(),
                base_url_var: "GH_HOST".into(),
                token_var: "GH_TOKEN".into(),
            }],
            services: [(
                "web".to_owned(),
                Service {
                    command: "npm run dev".into(),
                    port: Some(3000),
                },
            )]
            .into(),
        }
    }

    #[test]
    fn digest_is_displayed_as_sha256_hex() {
        let d = sample().digest();
        let s = d.to_string();
        assert!(s.starts_with("sha256:"));
        assert_eq!(s.len(), 7 + 64);
        assert_eq!(s.parse::<PolicyDigest>(), Ok(d));
        // A known vector, so the hex encoding itself is checked.
        assert_eq!(
            PolicyDigest::of(b"abc").as_str(),
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn canonical_form_sorts_lists_and_round_trips() {
        let p = sample();
        let text = p.to_canonical_toml();
        assert!(text.contains("read = [\"/etc\", \"/usr\"]"), "{text}");
        assert!(text.contains("\"api.github.com:443\""), "{text}");
        assert!(
            text.contains("source = \"env:H5I_SECRET_DEPLOY_KEY\""),
            "{text}"
        );
        let back = ResolvedPolicy::load_verified(&text, p.digest().as_str()).unwrap();
        let mut normalized = p.clone();
        normalized.normalize();
        assert_eq!(back, normalized);
        assert_eq!(back.digest(), p.digest());
    }

    #[test]
    fn a_one_value_change_changes_the_digest() {
        let p = sample();
        let mut q = p.clone();
        q.net.unix = true;
        assert_ne!(p.digest(), q.digest());
        let mut r = p.clone();
        r.resources.procs = Some(257);
        assert_ne!(p.digest(), r.digest());
    }

    #[test]
    fn tampered_text_is_refused_not_repaired() {
        let p = sample();
        let text = p.to_canonical_toml();
        let digest = p.digest();
        let cases = [
            text.replace("unix = false", "unix = true"),
            format!("{text}\n"),
            format!("# note\n{text}"),
            text.replace("procs = 256", "procs  = 256"),
        ];
        for bad in cases {
            let err = ResolvedPolicy::load_verified(&bad, digest.as_str()).unwrap_err();
            assert!(matches!(err, PolicyError::Tampered { .. }), "{err:?}");
            let m = err.to_string();
            assert!(m.contains("refused, never repaired"), "{m}");
            assert!(m.contains("to fix: `h5i box rm"), "{m}");
        }
    }

    #[test]
    fn tampered_text_with_a_matching_raw_digest_but_non_canonical_form_is_refused() {
        // A hand-written policy whose raw digest is stored but that is not canonical.
        let p = sample();
        let text = p
            .to_canonical_toml()
            .replace("procs = 256", "procs = 0x100");
        let raw_digest = PolicyDigest::of(text.as_bytes());
        let err = ResolvedPolicy::load_verified(&text, raw_digest.as_str()).unwrap_err();
        assert!(matches!(err, PolicyError::Tampered { .. }), "{err:?}");
        assert!(err.to_string().contains("not in canonical form"), "{err}");
    }

    #[test]
    fn a_malformed_stored_digest_is_refused() {
        let text = sample().to_canonical_toml();
        for bad in ["", "sha256:abc", "md5:00", &"sha256:".repeat(2)] {
            let err = ResolvedPolicy::load_verified(&text, bad).unwrap_err();
            assert!(matches!(err, PolicyError::Tampered { .. }));
        }
    }

    #[test]
    fn unknown_keys_in_a_stored_policy_are_refused() {
        let text = format!("{}extra = 1\n", sample().to_canonical_toml());
        let d = PolicyDigest::of(text.as_bytes());
        let err = ResolvedPolicy::load_verified(&text, d.as_str()).unwrap_err();
        assert!(err.to_string().contains("does not parse"), "{err}");
    }
}
