//! Policy edits are loud: a box that changes the clone's `.h5i/` is changing what every later
//! box of the clone may do, so that change is named before anything else.
//!
//! Owns [`PolicyChange`]: which `.h5i/` paths a snapshot changes against its base, and for the
//! clone's `.h5i/env.toml`, every profile resolved from the file before and after (through
//! `h5i-policy`'s own parser and resolver, so the comparison is of what boxes would get, not of
//! text), with each policy's digest and the grants it widens: isolation tier, network mode,
//! egress, unix sockets, loopback ports, filesystem read/write/deny, resource ceilings, secret
//! and auth grants, images, services.
//!
//! Must never: call a change harmless because it does not parse (a file that no longer resolves
//! is reported as such), read the file from the workspace (both versions come from git objects
//! the snapshot already holds), or print a box-written string unescaped (callers render
//! [`PolicyChange::lines`] through the report's escaper).
//!
//! Guarded by the unit tests below and `tests/export_gate.rs` (`a_box_widening_its_policy_*`).

use std::collections::BTreeSet;
use std::path::Path;

use h5i_policy::{HostTiers, ResolveRequest, ResolvedPolicy, Tier};

use crate::snapshot::{Snapshot, SnapshotError};

/// The clone's policy file, relative to the repository root.
pub const ENV_FILE: &[u8] = b".h5i/env.toml";

/// What a snapshot changes under `.h5i/`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyChange {
    /// Every changed path under `.h5i/` (lossy UTF-8, not yet escaped).
    pub paths: Vec<String>,
    /// Per profile, what `.h5i/env.toml` resolves to before and after (only profiles whose
    /// policy differs).
    pub profiles: Vec<ProfileChange>,
}

/// One profile's policy before and after the change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProfileChange {
    /// The profile's name.
    pub profile: String,
    /// The digest before, or why it did not resolve.
    pub before: Result<String, String>,
    /// The digest after, or why it does not resolve.
    pub after: Result<String, String>,
    /// What the change widens, one item per grant.
    pub widens: Vec<String>,
}

impl PolicyChange {
    /// Whether the change widens anything (or leaves a profile that no longer resolves).
    pub fn widens(&self) -> bool {
        self.profiles
            .iter()
            .any(|p| !p.widens.is_empty() || p.after.is_err())
    }

    /// One line for a refusal: every widening, or that nothing resolves wider.
    pub fn summary(&self) -> String {
        let items: Vec<String> = self
            .profiles
            .iter()
            .flat_map(|p| {
                let broken = p
                    .after
                    .as_ref()
                    .err()
                    .map(|_| format!("profile `{}` no longer resolves", p.profile));
                p.widens
                    .iter()
                    .map(move |w| format!("profile `{}`: {w}", p.profile))
                    .chain(broken)
            })
            .collect();
        if items.is_empty() {
            "no profile resolves wider than before".into()
        } else {
            format!("it widens {}", items.join("; "))
        }
    }

    /// The change as report lines (box-written text inside them is not yet escaped).
    pub fn lines(&self) -> Vec<String> {
        let mut out = vec![format!(
            "POLICY CHANGE: the patch touches the clone's policy ({}); `h5i box apply` refuses it without --allow-policy-change",
            self.paths.join(", ")
        )];
        for p in &self.profiles {
            let show = |r: &Result<String, String>| match r {
                Ok(d) => d.clone(),
                Err(e) => format!("does not resolve ({e})"),
            };
            out.push(format!(
                "profile `{}`: policy digest before {}, after {}",
                p.profile,
                show(&p.before),
                show(&p.after)
            ));
            for w in &p.widens {
                out.push(format!("profile `{}` widens: {w}", p.profile));
            }
        }
        out
    }
}

/// What `snap` changes under `.h5i/` against `base`, or `None` when it changes nothing there.
pub fn detect(
    snap: &Snapshot,
    base: &str,
    box_profile: &str,
) -> Result<Option<PolicyChange>, SnapshotError> {
    let changes = snap.changes_against(base)?;
    let touched: Vec<_> = changes
        .iter()
        .filter(|c| c.path.starts_with(b".h5i/"))
        .collect();
    if touched.is_empty() {
        return Ok(None);
    }
    let paths = touched
        .iter()
        .map(|c| String::from_utf8_lossy(&c.path).into_owned())
        .collect();
    let mut profiles = Vec::new();
    if let Some(c) = touched.iter().find(|c| c.path == ENV_FILE) {
        let mut ids = Vec::new();
        if c.old_mode != 0 {
            ids.push(c.old_sha.clone());
        }
        if c.is_present() {
            ids.push(c.new_sha.clone());
        }
        let blobs = snap.read_blobs(&ids)?;
        let text = |present: bool, sha: &str| {
            present.then(|| {
                blobs
                    .iter()
                    .find(|(s, _)| s == sha)
                    .map(|(_, b)| String::from_utf8_lossy(b).into_owned())
                    .unwrap_or_default()
            })
        };
        let before = text(c.old_mode != 0, &c.old_sha);
        let after = text(c.is_present(), &c.new_sha);
        profiles = compare(before.as_deref(), after.as_deref(), box_profile);
    }
    Ok(Some(PolicyChange { paths, profiles }))
}

/// Resolve every profile either file names (and `default` and the box's own) from both texts,
/// and list those whose policy differs.
pub fn compare(before: Option<&str>, after: Option<&str>, box_profile: &str) -> Vec<ProfileChange> {
    let path = Path::new(".h5i/env.toml");
    let parse = |t: Option<&str>| match t {
        None => Ok(None),
        Some(t) => h5i_policy::parse_env_file(path, t)
            .map(Some)
            .map_err(|e| e.to_string()),
    };
    let (b, a) = (parse(before), parse(after));
    let mut names: BTreeSet<String> = ["default".to_string(), box_profile.to_string()].into();
    for f in [&b, &a].into_iter().flatten().flatten() {
        names.extend(f.profile_names().map(str::to_string));
    }
    // Every tier available: the comparison is of what the file asks for, not of this host.
    let host = HostTiers::all_available();
    let resolve = |f: &Result<Option<h5i_policy::EnvFile>, String>, name: &str| {
        let f = f.as_ref().map_err(Clone::clone)?;
        let req = ResolveRequest {
            profile: Some(name.to_string()),
            ..ResolveRequest::default()
        };
        h5i_policy::resolve(f.as_ref(), &req, &host).map_err(|e| e.to_string())
    };
    let default_before = resolve(&b, "default");
    let mut out = Vec::new();
    for name in names {
        let pb = resolve(&b, &name);
        let pa = resolve(&a, &name);
        if let (Ok(x), Ok(y)) = (&pb, &pa) {
            if x.digest() == y.digest() {
                continue;
            }
        }
        if let (Err(x), Err(y)) = (&pb, &pa) {
            if x == y {
                continue;
            }
        }
        // A profile the file did not have before widens what `default` gave; one it had that
        // did not resolve gave nothing to compare against (no box could run under it).
        let had_before = matches!(&b, Ok(Some(f)) if f.profile_names().any(|n| n == name));
        let baseline = match &pb {
            Ok(p) => Some(p),
            Err(_) if had_before => None,
            Err(_) => default_before.as_ref().ok(),
        };
        let widens = match (baseline, &pa) {
            (Some(x), Ok(y)) => widening(x, y),
            (None, Ok(_)) => vec!["a profile that did not resolve before now does".into()],
            (_, Err(_)) => Vec::new(),
        };
        out.push(ProfileChange {
            profile: name,
            before: pb.map(|p| p.digest().as_str().to_string()),
            after: pa.map(|p| p.digest().as_str().to_string()),
            widens,
        });
    }
    out
}

/// Strength order of the tiers (higher confines more).
fn strength(t: Tier) -> usize {
    Tier::ALL_STRONGEST_FIRST.len()
        - Tier::ALL_STRONGEST_FIRST
            .iter()
            .position(|x| *x == t)
            .unwrap_or(Tier::ALL_STRONGEST_FIRST.len())
}

fn added<T: Ord + std::fmt::Display>(before: &[T], after: &[T]) -> Vec<String> {
    let b: BTreeSet<&T> = before.iter().collect();
    after
        .iter()
        .filter(|x| !b.contains(x))
        .map(ToString::to_string)
        .collect()
}

/// Each grant `after` holds beyond `before`.
pub fn widening(before: &ResolvedPolicy, after: &ResolvedPolicy) -> Vec<String> {
    let mut w = Vec::new();
    if strength(after.tier) < strength(before.tier) {
        w.push(format!("isolation {} -> {}", before.tier, after.tier));
    }
    if after.net.mode != before.net.mode {
        w.push(format!(
            "network {} -> {}",
            before.net.mode.as_str(),
            after.net.mode.as_str()
        ));
    }
    for e in added(&before.net.egress, &after.net.egress) {
        w.push(format!("network egress + {e}"));
    }
    if after.net.unix && !before.net.unix {
        w.push("net.unix false -> true (AF_UNIX sockets)".into());
    }
    for p in added(&before.net.loopback, &after.net.loopback) {
        w.push(format!("loopback port + {p}"));
    }
    for p in added(&before.fs.read, &after.fs.read) {
        w.push(format!("fs.read + {p}"));
    }
    for p in added(&before.fs.write, &after.fs.write) {
        w.push(format!("fs.write + {p}"));
    }
    for p in added(&after.fs.deny, &before.fs.deny) {
        w.push(format!("fs.deny - {p}"));
    }
    let limits = [
        ("mem", before.resources.mem_bytes, after.resources.mem_bytes),
        ("procs", before.resources.procs, after.resources.procs),
        (
            "wall",
            before.resources.wall_secs,
            after.resources.wall_secs,
        ),
    ];
    for (what, b, a) in limits {
        match (b, a) {
            (Some(b), None) => w.push(format!("resources.{what} {b} -> no limit")),
            (Some(b), Some(a)) if a > b => w.push(format!("resources.{what} {b} -> {a}")),
            _ => {}
        }
    }
    let names = |p: &ResolvedPolicy| -> Vec<String> {
        p.secrets
            .iter()
            .map(|s| format!("{} ({})", s.name, s.source))
            .collect()
    };
    for s in added(&names(before), &names(after)) {
        w.push(format!("secret grant + {s}"));
    }
    let auths = |p: &ResolvedPolicy| -> Vec<String> {
        p.auth
            .iter()
            .map(|a| format!("{} ({})", a.host, a.credential_vars()))
            .collect()
    };
    for a in added(&auths(before), &auths(after)) {
        w.push(format!("auth grant + {a}"));
    }
    if after.image != before.image {
        w.push(format!(
            "image {} -> {}",
            before.image.as_deref().unwrap_or("none"),
            after.image.as_deref().unwrap_or("none")
        ));
    }
    for (name, s) in &after.services {
        if before.services.get(name) != Some(s) {
            w.push(format!("service `{name}` runs `{}`", s.command));
        }
    }
    w
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_widened_env_file_names_every_grant_it_widens() {
        let before = "[profile.dev]\nisolation = \"process\"\n";
        let after = "[profile.dev]\nisolation = \"workspace\"\n[profile.dev.net]\nmode = \"host\"\n[profile.dev.fs]\nwrite = [\"/\"]\n";
        let ch = compare(Some(before), Some(after), "default");
        let dev = ch.iter().find(|p| p.profile == "dev").unwrap();
        assert!(dev.before.as_ref().unwrap().starts_with("sha256:"));
        assert_ne!(dev.before, dev.after);
        let all = dev.widens.join("\n");
        assert!(all.contains("isolation process -> workspace"), "{all}");
        assert!(all.contains("network deny -> host"), "{all}");
        assert!(all.contains("fs.write + /"), "{all}");
    }

    #[test]
    fn a_file_that_no_longer_parses_is_reported_not_ignored() {
        let ch = compare(Some("[profile.dev]\n"), Some("[profile.dev\n"), "dev");
        assert!(ch.iter().any(|p| p.after.is_err()));
        let pc = PolicyChange {
            paths: vec![".h5i/env.toml".into()],
            profiles: ch,
        };
        assert!(pc.widens());
    }

    #[test]
    fn a_profile_that_did_not_resolve_before_is_not_compared_with_default() {
        // Parses, but a container profile without an image does not resolve.
        let before = "[profile.dev]\nisolation = \"container\"\n";
        let after = "[profile.dev]\nisolation = \"process\"\n";
        let ch = compare(Some(before), Some(after), "dev");
        let dev = ch.iter().find(|p| p.profile == "dev").unwrap();
        assert!(dev.before.is_err(), "{:?}", dev.before);
        assert_eq!(
            dev.widens,
            ["a profile that did not resolve before now does"],
            "{:?}",
            dev.widens
        );
        // A profile new in the file is still measured against what `default` gave.
        let added = compare(
            Some(""),
            Some("[profile.new]\nisolation = \"workspace\"\n"),
            "new",
        );
        let new = added.iter().find(|p| p.profile == "new").unwrap();
        assert!(
            new.widens
                .iter()
                .any(|w| w.starts_with("isolation ") && w.ends_with(" -> workspace")),
            "{:?}",
            new.widens
        );
    }

    #[test]
    fn an_unchanged_resolution_is_not_listed() {
        let t = "[profile.dev]\nisolation = \"process\"\n";
        let t2 = "# a comment\n[profile.dev]\nisolation = \"process\"\n";
        assert!(compare(Some(t), Some(t2), "default").is_empty());
    }
}
