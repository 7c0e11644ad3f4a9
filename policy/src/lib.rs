//! h5i-policy: what a box is allowed to do, as data.
//!
//! Owns the `.h5i/env.toml` schema, the built-in profiles, resolution of a request into a
//! [`ResolvedPolicy`], its canonical serialization (`policy.resolved.toml`) and SHA-256 digest,
//! and the receipt record types every other crate writes and reads.
//!
//! Must never: spawn a process, touch the network, read the process environment or any file it
//! was not handed, or hold global state. Callers pass in what the host looks like; this crate
//! only decides.
//!
//! The flow, one module per step:
//! - `schema` (private): the raw serde shape of `.h5i/env.toml`, `deny_unknown_fields`
//!   everywhere, spans kept.
//! - [`envfile`]: [`parse_env_file`] validates it into an [`EnvFile`] (values, contradictions,
//!   custom profiles merged over `default`), refusing with file, line, key path and mend.
//! - [`builtin`]: the reviewed table of built-in profiles.
//! - [`resolve`](mod@resolve): [`resolve()`] turns a [`ResolveRequest`] plus the host's [`HostTiers`] into a
//!   [`ResolvedPolicy`], choosing the tier (never degrading an explicit one).
//! - [`resolved`]: the [`ResolvedPolicy`] data, its canonical TOML, [`PolicyDigest`], and
//!   [`ResolvedPolicy::load_verified`], which refuses (never repairs) a stored policy that does
//!   not match its digest.
//! - [`tier`], [`units`], [`values`]: tiers, resource units, single-value shapes.
//! - [`spec_names`]: the `h5i.*` annotation and network-directory names h5i, h5i-runc and
//!   h5i-hook agree on.
//! - [`error`]: [`PolicyError`], every refusal in the form `refusing: <what>; to fix: <mend>`.

pub mod builtin;
pub mod envfile;
pub mod error;
pub mod families;
pub mod inbox;
mod profile;
pub mod receipt;
pub mod resolve;
pub mod resolved;
mod schema;
pub mod spec_names;
pub mod tier;
pub mod units;
pub mod values;

pub use envfile::{parse_env_file, EnvFile};
pub use error::{Location, PolicyError};
pub use resolve::{resolve, ResolveRequest};
pub use resolved::{
    AgentRuntime, AuthGrant, ContainerRuntime, CredentialFallback, FsPolicy, NetMode, NetPolicy,
    PolicyDigest, ResolvedPolicy, Resources, SecretGrant, SecretInject, SecretSource, Service,
};
pub use tier::{HostTiers, Tier, TierAvailability, TierChoice, TierSource};
pub use values::HostPort;
