//! Resolution: a request (profile, flags, environment values) plus what the host can run,
//! decided into one [`ResolvedPolicy`].
//!
//! Owns [`ResolveRequest`] and [`resolve`]. The steps, in order:
//! 1. Read the request's values: `--isolation`, `H5I_DEFAULT_ISOLATION`, `H5I_CREDENTIAL_PROXY`,
//!    `--image` (each refused by name when malformed).
//! 2. Find the profile: built-in (scoped by `H5I_AGENT` where it needs it), else custom from the
//!    env file, else refuse.
//! 3. Pick the tier request: `--isolation` > the profile's `isolation` > `H5I_DEFAULT_ISOLATION`
//!    > `auto`. (`--isolation auto` therefore re-probes past the environment default.)
//! 4. A named tier must hold the policy, have an image if it runs one, and run on this host, or
//!    the request is refused: never degraded. `auto` takes the strongest tier that passes all
//!    three, and never lands on `workspace` (which confines nothing) unless the policy itself
//!    needs it (file-injected secrets).
//! 5. Assemble the policy with every list sorted and deduplicated.
//!
//! Must never: probe the host, read the environment, or choose a tier weaker than one asked for.
//!
//! Guarded by the tests below (tier selection, built-in walk, digest stability, refusals).

use crate::builtin::{builtin_policy, is_builtin, protective_ceilings, BUILTIN_PROFILES};
use crate::envfile::EnvFile;
use crate::error::PolicyError;
use crate::profile::{IsolationRequest, Located, ProfilePolicy};
use crate::resolved::{
    ContainerRuntime, FsPolicy, NetPolicy, ResolvedPolicy, SecretInject, RESOLVED_SCHEMA_VERSION,
};
use crate::tier::{HostTiers, Tier, TierAvailability, TierChoice, TierSource};
use crate::values::check_image;

/// What was asked for. Environment values are passed in by the caller, never read here.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResolveRequest {
    /// `--profile`; `None` means `default`.
    pub profile: Option<String>,
    /// `--isolation` (a tier name or `auto`).
    pub isolation: Option<String>,
    /// `--image`.
    pub image: Option<String>,
    /// The value of `H5I_AGENT` (`claude` or `codex`), if set.
    pub h5i_agent: Option<String>,
    /// The value of `H5I_DEFAULT_ISOLATION`, if set.
    pub default_isolation: Option<String>,
    /// The value of `H5I_CREDENTIAL_PROXY`, if set (`0` turns the proxy off).
    pub credential_proxy: Option<String>,
}

/// Resolve `req` against the env file (if the repository has one) and what the host can run.
pub fn resolve(
    env_file: Option<&EnvFile>,
    req: &ResolveRequest,
    host: &HostTiers,
) -> Result<ResolvedPolicy, PolicyError> {
    // 1. The request's own values.
    let flag_isolation = match &req.isolation {
        Some(v) => Some(parse_isolation(v, "--isolation")?),
        None => None,
    };
    let env_isolation = match req.default_isolation.as_deref() {
        None | Some("") => None,
        Some(v) => Some(parse_isolation(v, "H5I_DEFAULT_ISOLATION")?),
    };
    let credential_proxy = match req.credential_proxy.as_deref() {
        None | Some("") | Some("1") => true,
        Some("0") => false,
        Some(other) => {
            return Err(PolicyError::BadRequest {
                input: "H5I_CREDENTIAL_PROXY".to_owned(),
                what: format!("`{other}` is neither 0 nor 1"),
                mend: "set H5I_CREDENTIAL_PROXY=0 to turn the credential proxy off, or unset it"
                    .to_owned(),
            })
        }
    };
    if let Some(img) = &req.image {
        check_image(img).map_err(|p| PolicyError::BadRequest {
            input: "--image".to_owned(),
            what: p.what,
            mend: p.mend,
        })?;
    }

    // 2. The profile.
    let name = req.profile.as_deref().unwrap_or("default");
    let mut profile = find_profile(env_file, name, req.h5i_agent.as_deref())?;

    // 3. The tier request and who made it.
    let (request, source, requested_by) = if let Some(r) = flag_isolation {
        (r, TierSource::Flag, "--isolation".to_owned())
    } else if let Some(Located { value, at }) = &profile.isolation {
        (*value, TierSource::Profile, at.to_string())
    } else if let Some(r) = env_isolation {
        (
            r,
            TierSource::EnvDefault,
            "H5I_DEFAULT_ISOLATION".to_owned(),
        )
    } else {
        (
            IsolationRequest::Auto,
            TierSource::Default,
            "the default (auto)".to_owned(),
        )
    };
    if credential_proxy && is_builtin(name) && request == IsolationRequest::Tier(Tier::Process) {
        // The process tier cannot scope egress, and a built-in agent profile reaches its model
        // API through the credential proxy (a listener on the box's own loopback) anyway: its
        // direct egress to that API is dropped there, so the agent runs at process with no
        // network but the proxy. The tiers that scope egress keep the entry (their egress
        // evidence and the user allowlist apply to agent boxes as before).
        let served: Vec<String> = profile.auth.value.iter().map(|g| g.host.clone()).collect();
        profile.egress.value.retain(|hp| !served.contains(&hp.host));
    }
    let image = req
        .image
        .clone()
        .or_else(|| profile.image.clone())
        .or_else(|| env_file.and_then(|f| f.container_image().map(str::to_owned)));

    // 4. The tier.
    let tier = match request {
        IsolationRequest::Tier(tier) => {
            explicit_tier(&profile, tier, &requested_by, image.as_deref(), req, host)?
        }
        IsolationRequest::Auto => auto_tier(&profile, image.as_deref(), req, host)?,
    };

    // 5. The policy.
    let paths = |v: &[Located<String>]| v.iter().map(|l| l.value.clone()).collect();
    let mut policy = ResolvedPolicy {
        version: RESOLVED_SCHEMA_VERSION,
        profile: name.to_owned(),
        agent: profile.agent,
        tier,
        image: if tier.runs_image() { image } else { None },
        container_runtime: (tier == Tier::Container)
            .then(|| {
                profile
                    .container_runtime
                    .or_else(|| env_file.and_then(EnvFile::container_runtime))
            })
            .flatten()
            .filter(|r| *r != ContainerRuntime::H5iRunc),
        credential_proxy,
        tier_choice: TierChoice {
            source,
            auto: request == IsolationRequest::Auto,
        },
        fs: FsPolicy {
            read: paths(&profile.fs_read),
            write: paths(&profile.fs_write),
            deny: paths(&profile.fs_deny),
        },
        net: NetPolicy {
            mode: profile.net_mode.value,
            egress: profile.egress.value.clone(),
            unix: profile.unix,
            loopback: profile.loopback.clone(),
            families: profile.families.clone(),
        },
        resources: protective_ceilings(host.memory_bytes()).under(profile.resources),
        secrets: profile.secrets.iter().map(|s| s.value.clone()).collect(),
        auth: profile.auth.value.clone(),
        services: env_file.map(|f| f.services().clone()).unwrap_or_default(),
    };
    policy.normalize();
    Ok(policy)
}

fn parse_isolation(value: &str, input: &str) -> Result<IsolationRequest, PolicyError> {
    if value == "auto" {
        return Ok(IsolationRequest::Auto);
    }
    value
        .parse::<Tier>()
        .map(IsolationRequest::Tier)
        .map_err(|e| PolicyError::BadRequest {
            input: input.to_owned(),
            what: e.to_string(),
            mend: "use one of workspace, process, supervised, container, microvm or auto"
                .to_owned(),
        })
}

fn find_profile(
    env_file: Option<&EnvFile>,
    name: &str,
    h5i_agent: Option<&str>,
) -> Result<ProfilePolicy, PolicyError> {
    if let Some(p) = builtin_policy(name, h5i_agent)? {
        return Ok(p);
    }
    if let Some(p) = env_file.and_then(|f| f.profile(name)) {
        return Ok(p.clone());
    }
    let mut known: Vec<String> = BUILTIN_PROFILES.iter().map(|p| p.name.to_owned()).collect();
    known.extend(
        env_file
            .into_iter()
            .flat_map(|f| f.profile_names().map(str::to_owned)),
    );
    let mend = match env_file {
        Some(f) => format!(
            "pick one of those, or declare [profile.{name}] in {}",
            f.source()
        ),
        None => format!("pick one of those, or declare [profile.{name}] in .h5i/env.toml"),
    };
    Err(PolicyError::UnknownProfile {
        name: name.to_owned(),
        known: known.join(", "),
        mend,
    })
}

/// Why `tier` cannot hold this request, for both explicit and automatic choice. Host
/// availability is checked separately (its refusal has its own variant).
fn request_conflict(
    profile: &ProfilePolicy,
    tier: Tier,
    image: Option<&str>,
    req: &ResolveRequest,
) -> Option<Refusal> {
    if let Some(c) = profile.tier_conflict(tier) {
        return Some(Refusal::Policy(c));
    }
    if tier.runs_image() && image.is_none() {
        return Some(Refusal::NoImage);
    }
    if !tier.runs_image() && req.image.is_some() {
        return Some(Refusal::ImageUnused);
    }
    None
}

enum Refusal {
    Policy(crate::profile::TierConflict),
    NoImage,
    ImageUnused,
}

fn explicit_tier(
    profile: &ProfilePolicy,
    tier: Tier,
    requested_by: &str,
    image: Option<&str>,
    req: &ResolveRequest,
    host: &HostTiers,
) -> Result<Tier, PolicyError> {
    match request_conflict(profile, tier, image, req) {
        Some(Refusal::Policy(c)) => {
            return Err(PolicyError::TierCannotHoldPolicy {
                tier,
                requested_by: requested_by.to_owned(),
                at: Box::new(c.at),
                what: c.what,
                mend: c.mend,
            })
        }
        Some(Refusal::NoImage) => {
            return Err(PolicyError::ImageRequired {
                tier,
                requested_by: requested_by.to_owned(),
                profile: profile.name.clone(),
            })
        }
        Some(Refusal::ImageUnused) => {
            return Err(PolicyError::BadRequest {
                input: "--image".to_owned(),
                what: format!(
                    "isolation `{tier}` (asked for by {requested_by}) runs no image, so --image would be ignored"
                ),
                mend: "drop --image, or pass --isolation container or --isolation microvm".to_owned(),
            })
        }
        None => {}
    }
    match host.availability(tier) {
        TierAvailability::Available | TierAvailability::OnRequest(_) => Ok(tier),
        TierAvailability::Unavailable(reason) => Err(PolicyError::TierUnavailable {
            tier,
            requested_by: requested_by.to_owned(),
            reason,
        }),
    }
}

fn auto_tier(
    profile: &ProfilePolicy,
    image: Option<&str>,
    req: &ResolveRequest,
    host: &HostTiers,
) -> Result<Tier, PolicyError> {
    let needs_workspace = profile
        .secrets
        .iter()
        .any(|s| s.value.inject == SecretInject::File);
    let mut tried = Vec::new();
    for tier in Tier::ALL_STRONGEST_FIRST {
        let reason = if tier == Tier::Workspace && !needs_workspace {
            Some("workspace confines nothing, so auto never picks it".to_owned())
        } else {
            match request_conflict(profile, tier, image, req) {
                Some(Refusal::Policy(c)) => Some(format!("{} ({})", c.what, c.at)),
                Some(Refusal::NoImage) => Some(
                    "no image (pass --image, or set container.image in the profile or [container] image)"
                        .to_owned(),
                ),
                Some(Refusal::ImageUnused) => Some("it runs no image, and --image was given".to_owned()),
                None => match host.availability(tier) {
                    TierAvailability::Available => None,
                    TierAvailability::Unavailable(r) => Some(format!("this host cannot run it: {r}")),
                    TierAvailability::OnRequest(r) => {
                        Some(format!("it runs only when asked for by name: {r}"))
                    }
                },
            }
        };
        match reason {
            None => return Ok(tier),
            Some(r) => tried.push(format!("{tier}: {r}")),
        }
    }
    Err(PolicyError::NoTierAvailable {
        profile: profile.name.clone(),
        tried: tried.join("; "),
    })
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::envfile::parse_env_file;
    use crate::resolved::{AgentRuntime, NetMode};

    const FILE: &str = ".h5i/env.toml";

    fn env(text: &str) -> EnvFile {
        parse_env_file(Path::new(FILE), text).unwrap()
    }

    fn req(profile: &str) -> ResolveRequest {
        ResolveRequest {
            profile: Some(profile.to_owned()),
            ..ResolveRequest::default()
        }
    }

    fn host_with(avail: &[Tier]) -> HostTiers {
        let mut h = HostTiers::new();
        for t in Tier::ALL_STRONGEST_FIRST {
            if avail.contains(&t) {
                h.set_available(t);
            } else {
                h.set_unavailable(t, format!("{t} missing: test host"));
            }
        }
        h
    }

    #[test]
    fn every_builtin_profile_resolves_and_round_trips() {
        let host = HostTiers::all_available();
        for entry in BUILTIN_PROFILES {
            for agent in [None, Some("claude"), Some("codex")] {
                for tier in Tier::ALL_STRONGEST_FIRST {
                    let r = ResolveRequest {
                        profile: Some(entry.name.to_owned()),
                        isolation: Some(tier.as_str().to_owned()),
                        image: tier.runs_image().then(|| "localhost/h5i-base:1".to_owned()),
                        h5i_agent: agent.map(str::to_owned),
                        ..ResolveRequest::default()
                    };
                    let p = match resolve(None, &r, &host) {
                        Ok(p) => p,
                        // Scoped profiles need H5I_AGENT; the credential proxy cannot reach a
                        // microVM. Both refusals are checked by their own tests.
                        Err(PolicyError::AgentRuntime { .. }) if agent.is_none() => continue,
                        Err(PolicyError::TierCannotHoldPolicy { .. })
                            if matches!(tier, Tier::Microvm | Tier::Process)
                                && entry.name != "default" =>
                        {
                            continue
                        }
                        Err(e) => panic!("{} ({agent:?}, {tier}): {e}", entry.name),
                    };
                    assert_eq!(p.tier, tier);
                    assert_eq!(p.profile, entry.name);
                    let text = p.to_canonical_toml();
                    let back = ResolvedPolicy::load_verified(&text, p.digest().as_str()).unwrap();
                    assert_eq!(back, p, "{}", entry.name);
                    let tampered = text.replacen("unix = ", "unix =  ", 1);
                    assert!(matches!(
                        ResolvedPolicy::load_verified(&tampered, p.digest().as_str()),
                        Err(PolicyError::Tampered { .. })
                    ));
                }
            }
            // And with auto, which must always find a tier on a host that runs everything.
            let r = ResolveRequest {
                profile: Some(entry.name.to_owned()),
                h5i_agent: Some("claude".to_owned()),
                ..ResolveRequest::default()
            };
            let p = resolve(None, &r, &host).unwrap();
            assert!(p.tier_choice.auto);
        }
    }

    #[test]
    fn default_is_what_an_empty_request_gets() {
        let p = resolve(
            None,
            &ResolveRequest::default(),
            &HostTiers::all_available(),
        )
        .unwrap();
        assert_eq!(p.profile, "default");
        assert_eq!(p.net.mode, NetMode::Deny);
        assert!(p.net.egress.is_empty() && !p.net.unix);
        assert_eq!(p.fs.write, ["$WORK"]);
        assert!(p.fs.read.contains(&"/usr".to_owned()));
        assert_eq!(p.agent, None);
        assert!(p.credential_proxy);
    }

    #[test]
    fn runtime_scoping_gives_a_claude_box_nothing_of_codex() {
        let host = HostTiers::all_available();
        for (agent, mine, theirs) in [
            ("claude", "api.anthropic.com", "openai"),
            ("codex", "api.openai.com", "anthropic"),
        ] {
            for profile in ["agent", "browser", &format!("agent-{agent}")] {
                let r = ResolveRequest {
                    h5i_agent: Some(agent.to_owned()),
                    ..req(profile)
                };
                let p = resolve(None, &r, &host).unwrap();
                assert_eq!(p.agent.map(AgentRuntime::as_str), Some(agent));
                let text = p.to_canonical_toml().to_lowercase();
                assert!(text.contains(mine), "{profile}: {text}");
                assert!(!text.contains(theirs), "{profile} leaks {theirs}: {text}");
            }
        }
        // A pinned profile ignores H5I_AGENT.
        let r = ResolveRequest {
            h5i_agent: Some("codex".to_owned()),
            ..req("agent-claude")
        };
        let p = resolve(None, &r, &host).unwrap();
        assert_eq!(p.agent, Some(AgentRuntime::Claude));
    }

    #[test]
    fn the_builtin_agent_grants_are_the_ones_the_manual_names() {
        let r = ResolveRequest {
            h5i_agent: Some("claude".to_owned()),
            ..req("agent")
        };
        let p = resolve(None, &r, &HostTiers::all_available()).unwrap();
        assert_eq!(p.net.egress[0].to_string(), "api.anthropic.com:443");
        let a = &p.auth_grants()[0];
        assert_eq!(
            (
                a.base_url_var.as_str(),
                a.token_var.as_str(),
                a.credential_env.as_str()
            ),
            (
                "ANTHROPIC_BASE_URL",
                "ANTHROPIC_API_KEY",
                "ANTHROPIC_API_KEY"
            )
        );
        assert_eq!(
            a.credential_choices().collect::<Vec<_>>(),
            [
                ("ANTHROPIC_API_KEY", "ANTHROPIC_API_KEY"),
                ("CLAUDE_CODE_OAUTH_TOKEN", "CLAUDE_CODE_OAUTH_TOKEN")
            ]
        );
        assert!(p.fs.write.contains(&"$HOME/.claude".to_owned()));
    }

    #[test]
    fn an_explicit_tier_the_host_cannot_run_is_refused_with_the_hosts_reason() {
        let host = host_with(&[Tier::Process, Tier::Workspace]);
        let r = ResolveRequest {
            isolation: Some("supervised".to_owned()),
            ..ResolveRequest::default()
        };
        let err = resolve(None, &r, &host).unwrap_err();
        assert!(
            matches!(err, PolicyError::TierUnavailable { .. }),
            "{err:?}"
        );
        let m = err.to_string();
        assert!(m.contains("supervised missing: test host"), "{m}");
        assert!(m.contains("--isolation") && m.contains("to fix:"), "{m}");
    }

    #[test]
    fn a_profile_tier_the_host_cannot_run_names_the_profile_key() {
        let f = env("[profile.r]\nisolation = \"supervised\"\n");
        let err = resolve(Some(&f), &req("r"), &host_with(&[Tier::Process])).unwrap_err();
        assert!(matches!(err, PolicyError::TierUnavailable { .. }));
        let m = err.to_string();
        assert!(
            m.contains(".h5i/env.toml:2") && m.contains("profile.r.isolation"),
            "{m}"
        );
    }

    #[test]
    fn a_tier_on_request_runs_when_named_and_auto_passes_over_it() {
        let mut host = HostTiers::all_available();
        host.set_on_request(Tier::Microvm, "emulated here");
        let with_image = ResolveRequest {
            image: Some("localhost/img:1".to_owned()),
            ..ResolveRequest::default()
        };
        assert_eq!(
            resolve(None, &with_image, &host).unwrap().tier,
            Tier::Container
        );
        let named = ResolveRequest {
            isolation: Some("microvm".to_owned()),
            ..with_image.clone()
        };
        assert_eq!(resolve(None, &named, &host).unwrap().tier, Tier::Microvm);
        let mut only = host_with(&[]);
        only.set_on_request(Tier::Microvm, "emulated here");
        let err = resolve(None, &with_image, &only).unwrap_err().to_string();
        assert!(
            err.contains("microvm: it runs only when asked for by name: emulated here"),
            "{err}"
        );
    }

    #[test]
    fn auto_picks_the_strongest_tier_the_host_runs() {
        let all = HostTiers::all_available();
        let with_image = ResolveRequest {
            image: Some("localhost/img:1".to_owned()),
            ..ResolveRequest::default()
        };
        assert_eq!(
            resolve(None, &with_image, &all).unwrap().tier,
            Tier::Microvm
        );
        // Without an image, container and microvm cannot hold it.
        let p = resolve(None, &ResolveRequest::default(), &all).unwrap();
        assert_eq!(p.tier, Tier::Supervised);
        assert_eq!(
            p.tier_choice,
            TierChoice {
                source: TierSource::Default,
                auto: true
            }
        );
        let host = host_with(&[Tier::Container, Tier::Process, Tier::Workspace]);
        assert_eq!(
            resolve(None, &with_image, &host).unwrap().tier,
            Tier::Container
        );
        assert_eq!(
            resolve(None, &ResolveRequest::default(), &host)
                .unwrap()
                .tier,
            Tier::Process
        );
    }

    #[test]
    fn auto_uses_the_repo_image_for_the_image_tiers() {
        let f = env("[container]\nimage = \"localhost/repo:1\"\n");
        let host = host_with(&[Tier::Container, Tier::Process]);
        let p = resolve(Some(&f), &ResolveRequest::default(), &host).unwrap();
        assert_eq!(p.tier, Tier::Container);
        assert_eq!(p.image.as_deref(), Some("localhost/repo:1"));
    }

    #[test]
    fn image_precedence_is_flag_then_profile_then_repo() {
        let f = env(
            "[container]\nimage = \"repo:1\"\n[profile.r.container]\nimage = \"prof:1\"\n[profile.s]\n",
        );
        let host = HostTiers::all_available();
        let mut r = ResolveRequest {
            isolation: Some("container".to_owned()),
            ..req("r")
        };
        assert_eq!(
            resolve(Some(&f), &r, &host).unwrap().image.as_deref(),
            Some("prof:1")
        );
        r.image = Some("flag:1".to_owned());
        assert_eq!(
            resolve(Some(&f), &r, &host).unwrap().image.as_deref(),
            Some("flag:1")
        );
        r.image = None;
        r.profile = Some("s".to_owned());
        assert_eq!(
            resolve(Some(&f), &r, &host).unwrap().image.as_deref(),
            Some("repo:1")
        );
        // A tier that runs no image records none, whatever the file says.
        r.isolation = Some("process".to_owned());
        assert_eq!(resolve(Some(&f), &r, &host).unwrap().image, None);
    }

    #[test]
    fn the_host_default_container_runtime_only_when_a_profile_asks() {
        let f = env("[container]\nimage = \"repo:1\"\n\
             [profile.plain]\n\
             [profile.runc.container]\nimage = \"i:1\"\nruntime = \"host-default\"\n\
             [profile.ours.container]\nimage = \"i:1\"\nruntime = \"h5i-runc\"\n");
        let host = HostTiers::all_available();
        let at = |profile: &str, tier: &str| {
            resolve(
                Some(&f),
                &ResolveRequest {
                    isolation: Some(tier.to_owned()),
                    ..req(profile)
                },
                &host,
            )
            .unwrap()
        };
        assert_eq!(at("plain", "container").container_runtime, None);
        assert_eq!(
            at("runc", "container").container_runtime,
            Some(ContainerRuntime::HostDefault)
        );
        // The default is recorded as nothing, so the digest of an h5i-runc box never changes.
        assert_eq!(at("ours", "container").container_runtime, None);
        assert_eq!(at("ours", "container").digest(), {
            let mut p = at("ours", "container");
            p.container_runtime = None;
            p.digest()
        });
        // Other tiers run no container runtime.
        assert_eq!(at("runc", "process").container_runtime, None);
    }

    #[test]
    fn an_unknown_container_runtime_is_refused_where_written() {
        let err = parse_env_file(
            Path::new(".h5i/env.toml"),
            "[profile.r.container]\nimage = \"i:1\"\nruntime = \"crun\"\n",
        )
        .unwrap_err();
        let m = err.to_string();
        assert!(
            m.contains("profile.r.container.runtime") && m.contains("host-default"),
            "{m}"
        );
    }

    #[test]
    fn a_host_network_profile_cannot_be_a_container_box() {
        let f = env("[profile.h.net]\nmode = \"host\"\n");
        let r = ResolveRequest {
            isolation: Some("container".to_owned()),
            image: Some("i:1".to_owned()),
            ..req("h")
        };
        let m = resolve(Some(&f), &r, &HostTiers::all_available())
            .unwrap_err()
            .to_string();
        assert!(m.contains("net.mode") && m.contains("egress proxy"), "{m}");
    }

    #[test]
    fn an_image_tier_without_an_image_is_refused() {
        for tier in ["container", "microvm"] {
            let r = ResolveRequest {
                isolation: Some(tier.to_owned()),
                ..ResolveRequest::default()
            };
            let err = resolve(None, &r, &HostTiers::all_available()).unwrap_err();
            assert!(matches!(err, PolicyError::ImageRequired { .. }), "{err:?}");
            let m = err.to_string();
            assert!(
                m.contains("--image") && m.contains("[container] image"),
                "{m}"
            );
        }
    }

    #[test]
    fn an_image_flag_at_a_tier_that_runs_none_is_refused() {
        let r = ResolveRequest {
            isolation: Some("supervised".to_owned()),
            image: Some("x:1".to_owned()),
            ..ResolveRequest::default()
        };
        let err = resolve(None, &r, &HostTiers::all_available()).unwrap_err();
        assert!(matches!(err, PolicyError::BadRequest { .. }), "{err:?}");
        assert!(err.to_string().contains("--image"));
    }

    #[test]
    fn the_env_default_is_honoured_and_the_flag_beats_it() {
        let host = HostTiers::all_available();
        let r = ResolveRequest {
            default_isolation: Some("process".to_owned()),
            ..ResolveRequest::default()
        };
        let p = resolve(None, &r, &host).unwrap();
        assert_eq!(p.tier, Tier::Process);
        assert_eq!(
            p.tier_choice,
            TierChoice {
                source: TierSource::EnvDefault,
                auto: false
            }
        );
        let flagged = ResolveRequest {
            isolation: Some("workspace".to_owned()),
            ..r.clone()
        };
        assert_eq!(
            resolve(None, &flagged, &host).unwrap().tier,
            Tier::Workspace
        );
        // An empty variable is unset.
        let empty = ResolveRequest {
            default_isolation: Some(String::new()),
            ..ResolveRequest::default()
        };
        assert!(resolve(None, &empty, &host).unwrap().tier_choice.auto);
    }

    #[test]
    fn isolation_auto_re_probes_past_the_env_default() {
        let host = host_with(&[Tier::Supervised, Tier::Process]);
        let r = ResolveRequest {
            isolation: Some("auto".to_owned()),
            default_isolation: Some("process".to_owned()),
            ..ResolveRequest::default()
        };
        let p = resolve(None, &r, &host).unwrap();
        assert_eq!(p.tier, Tier::Supervised);
        assert_eq!(
            p.tier_choice,
            TierChoice {
                source: TierSource::Flag,
                auto: true
            }
        );
    }

    #[test]
    fn the_profile_tier_beats_the_env_default_and_the_flag_beats_the_profile() {
        let f = env("[profile.r]\nisolation = \"process\"\n");
        let host = HostTiers::all_available();
        let r = ResolveRequest {
            default_isolation: Some("supervised".to_owned()),
            ..req("r")
        };
        let p = resolve(Some(&f), &r, &host).unwrap();
        assert_eq!(
            (p.tier, p.tier_choice.source),
            (Tier::Process, TierSource::Profile)
        );
        let r = ResolveRequest {
            isolation: Some("supervised".to_owned()),
            ..r
        };
        assert_eq!(resolve(Some(&f), &r, &host).unwrap().tier, Tier::Supervised);
    }

    #[test]
    fn egress_forces_auto_past_the_process_tier() {
        let f = env("[profile.r.net]\negress = [\"api.github.com\"]\n");
        let host = host_with(&[Tier::Process, Tier::Workspace]);
        let err = resolve(Some(&f), &req("r"), &host).unwrap_err();
        assert!(
            matches!(err, PolicyError::NoTierAvailable { .. }),
            "{err:?}"
        );
        let m = err.to_string();
        assert!(m.contains("process: profile `r` allows egress"), "{m}");
        assert!(m.contains("supervised: this host cannot run it"), "{m}");
        let host = host_with(&[Tier::Supervised, Tier::Process]);
        assert_eq!(
            resolve(Some(&f), &req("r"), &host).unwrap().tier,
            Tier::Supervised
        );
    }

    #[test]
    fn an_explicit_process_tier_with_egress_is_refused_naming_the_key() {
        let f = env("[profile.r]\n\n[profile.r.net]\negress = [\"api.github.com\"]\n");
        let r = ResolveRequest {
            isolation: Some("process".to_owned()),
            ..req("r")
        };
        let err = resolve(Some(&f), &r, &HostTiers::all_available()).unwrap_err();
        assert!(
            matches!(err, PolicyError::TierCannotHoldPolicy { .. }),
            "{err:?}"
        );
        let m = err.to_string();
        assert!(m.contains(".h5i/env.toml:4: `profile.r.net.egress`"), "{m}");
        assert!(
            m.contains("supervised, container or microvm") && m.contains("to fix:"),
            "{m}"
        );
        // The built-in agent profiles carry egress too when the credential proxy is off; with
        // it on (the default) they reach their API through the proxy and run at process.
        let r = ResolveRequest {
            isolation: Some("process".to_owned()),
            h5i_agent: Some("claude".to_owned()),
            credential_proxy: Some("0".to_owned()),
            ..req("agent")
        };
        let m = resolve(None, &r, &HostTiers::all_available())
            .unwrap_err()
            .to_string();
        assert!(
            m.contains("built-in profile `agent-claude`: `net.egress`"),
            "{m}"
        );
        let on = ResolveRequest {
            credential_proxy: None,
            ..r
        };
        let p = resolve(None, &on, &HostTiers::all_available()).unwrap();
        assert_eq!(p.tier, Tier::Process);
        assert!(p.net.egress.is_empty());
        // A tier that scopes egress keeps the entry.
        let sup = ResolveRequest {
            isolation: Some("supervised".to_owned()),
            ..on
        };
        let p = resolve(None, &sup, &HostTiers::all_available()).unwrap();
        assert_eq!(p.net.egress[0].to_string(), "api.anthropic.com:443");
    }

    #[test]
    fn auth_grants_at_microvm_are_refused_and_auto_passes_over_it() {
        let r = ResolveRequest {
            isolation: Some("microvm".to_owned()),
            image: Some("img:1".to_owned()),
            h5i_agent: Some("codex".to_owned()),
            ..req("agent")
        };
        let err = resolve(None, &r, &HostTiers::all_available()).unwrap_err();
        assert!(
            matches!(err, PolicyError::TierCannotHoldPolicy { .. }),
            "{err:?}"
        );
        assert!(err.to_string().contains("credential proxy"), "{err}");
        // auto passes over microvm; with --image given it also passes over the tiers that run
        // no image, so it lands on container.
        let auto = ResolveRequest {
            isolation: None,
            ..r
        };
        let host = HostTiers::all_available();
        assert_eq!(resolve(None, &auto, &host).unwrap().tier, Tier::Container);
        let auto = ResolveRequest {
            image: None,
            ..auto
        };
        assert_eq!(resolve(None, &auto, &host).unwrap().tier, Tier::Supervised);
    }

    #[test]
    fn file_injected_secrets_take_auto_to_workspace_and_refuse_other_tiers() {
        let f = env("[profile.r]\nsecrets = [\"A\"]\n[profile.r.secret.A]\ninject = \"file\"\n");
        let host = HostTiers::all_available();
        assert_eq!(
            resolve(Some(&f), &req("r"), &host).unwrap().tier,
            Tier::Workspace
        );
        let r = ResolveRequest {
            isolation: Some("supervised".to_owned()),
            ..req("r")
        };
        let err = resolve(Some(&f), &r, &host).unwrap_err();
        assert!(
            matches!(err, PolicyError::TierCannotHoldPolicy { .. }),
            "{err:?}"
        );
        assert!(
            err.to_string()
                .contains(".h5i/env.toml:4: `profile.r.secret.A.inject`"),
            "{err}"
        );
    }

    #[test]
    fn auto_never_lands_on_workspace_for_a_confinable_policy() {
        let host = host_with(&[Tier::Workspace]);
        let err = resolve(None, &ResolveRequest::default(), &host).unwrap_err();
        assert!(
            matches!(err, PolicyError::NoTierAvailable { .. }),
            "{err:?}"
        );
        assert!(err.to_string().contains("--isolation workspace"), "{err}");
        let r = ResolveRequest {
            isolation: Some("workspace".to_owned()),
            ..ResolveRequest::default()
        };
        assert_eq!(resolve(None, &r, &host).unwrap().tier, Tier::Workspace);
    }

    #[test]
    fn bad_request_values_are_refused_by_name() {
        let host = HostTiers::all_available();
        for (r, input) in [
            (
                ResolveRequest {
                    isolation: Some("vm".to_owned()),
                    ..ResolveRequest::default()
                },
                "--isolation",
            ),
            (
                ResolveRequest {
                    default_isolation: Some("strong".to_owned()),
                    ..ResolveRequest::default()
                },
                "H5I_DEFAULT_ISOLATION",
            ),
            (
                ResolveRequest {
                    credential_proxy: Some("off".to_owned()),
                    ..ResolveRequest::default()
                },
                "H5I_CREDENTIAL_PROXY",
            ),
            (
                ResolveRequest {
                    image: Some(String::new()),
                    ..ResolveRequest::default()
                },
                "--image",
            ),
        ] {
            let err = resolve(None, &r, &host).unwrap_err();
            assert!(matches!(err, PolicyError::BadRequest { .. }), "{err:?}");
            let m = err.to_string();
            assert!(
                m.starts_with(&format!("refusing: {input}:")) && m.contains("to fix:"),
                "{m}"
            );
        }
    }

    #[test]
    fn the_credential_proxy_is_on_unless_h5i_credential_proxy_is_zero() {
        let host = HostTiers::all_available();
        for (v, on) in [
            (None, true),
            (Some("1"), true),
            (Some(""), true),
            (Some("0"), false),
        ] {
            let r = ResolveRequest {
                credential_proxy: v.map(str::to_owned),
                ..ResolveRequest::default()
            };
            assert_eq!(
                resolve(None, &r, &host).unwrap().credential_proxy,
                on,
                "{v:?}"
            );
        }
    }

    #[test]
    fn an_unknown_profile_is_refused_listing_the_known_ones() {
        let f = env("[profile.review]\n");
        let err = resolve(Some(&f), &req("reveiw"), &HostTiers::all_available()).unwrap_err();
        assert!(matches!(err, PolicyError::UnknownProfile { .. }), "{err:?}");
        let m = err.to_string();
        assert!(
            m.contains("review") && m.contains("default") && m.contains(".h5i/env.toml"),
            "{m}"
        );
    }

    #[test]
    fn services_are_carried_into_the_policy() {
        let f = env("[service.web]\ncommand = \"npm run dev\"\nport = 3000\n");
        let p = resolve(
            Some(&f),
            &ResolveRequest::default(),
            &HostTiers::all_available(),
        )
        .unwrap();
        assert_eq!(p.services["web"].command, "npm run dev");
        assert!(p.to_canonical_toml().contains("[services.web]"));
    }

    const REVIEW_A: &str = r#"
[profile.review]
isolation = "supervised"
secrets = ["DEPLOY_KEY", "NPM_TOKEN"]

[profile.review.fs]
read  = ["/usr", "/etc"]
write = ["$WORK"]

[profile.review.net]
mode     = "deny"
egress   = ["api.github.com", "registry.npmjs.org:443"]
unix     = false
loopback = [3000, 8080]

[profile.review.resources]
mem   = "4G"
procs = 256
wall  = "30m"

[profile.review.secret.DEPLOY_KEY]
source = "env:H5I_SECRET_DEPLOY_KEY"
inject = "env"

[[profile.review.auth]]
host           = "api.github.com"
credential_env = "GITHUB_TOKEN"
base_url_var   = "GH_HOST"
token_var      = "GH_TOKEN"

[service.web]
command = "npm run dev"
port = 3000
"#;

    /// The same policy: other key order, whitespace, comments, inline and dotted tables,
    /// other list order, defaults written out, equivalent spellings.
    const REVIEW_B: &str = r#"
# the review profile, written differently
service.web = { port = 3000, command = "npm run dev" }

[profile.review]
resources = { wall = "0h30m", procs = 256, mem = 4294967296 }
net.loopback = [8080, 3000, 3000]
net.egress = ["registry.npmjs.org", "API.github.com:443"]
net.mode = "deny"
fs.write = ["$WORK/"]
fs.read = ["/etc", "/usr", "//usr"]
secrets = ["NPM_TOKEN", "DEPLOY_KEY"]   # order does not matter
auth = [ { token_var = "GH_TOKEN", base_url_var = "GH_HOST", credential_env = "GITHUB_TOKEN", host = "api.github.com" } ]
isolation     =     "supervised"
secret.DEPLOY_KEY = {}
"#;

    #[test]
    fn digest_is_stable_across_key_order_whitespace_comments_and_table_style() {
        let host = HostTiers::all_available();
        let a = resolve(Some(&env(REVIEW_A)), &req("review"), &host).unwrap();
        let b = resolve(Some(&env(REVIEW_B)), &req("review"), &host).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.to_canonical_toml(), b.to_canonical_toml());
        assert_eq!(a.digest(), b.digest());
    }

    #[test]
    fn digest_changes_with_any_one_value() {
        let host = HostTiers::all_available();
        let base = resolve(Some(&env(REVIEW_A)), &req("review"), &host)
            .unwrap()
            .digest();
        for (from, to) in [
            ("procs = 256", "procs = 257"),
            ("wall  = \"30m\"", "wall  = \"31m\""),
            ("unix     = false", "unix     = true"),
            ("\"registry.npmjs.org:443\"", "\"registry.npmjs.org:8443\""),
            ("loopback = [3000, 8080]", "loopback = [3000]"),
            (
                "read  = [\"/usr\", \"/etc\"]",
                "read  = [\"/usr\", \"/etc\", \"/opt\"]",
            ),
            (
                "source = \"env:H5I_SECRET_DEPLOY_KEY\"",
                "source = \"env:OTHER\"",
            ),
            (
                "token_var      = \"GH_TOKEN\"",
                "token_var      = \"GITHUB_TOKEN_DUMMY\"",
            ),
            ("command = \"npm run dev\"", "command = \"npm start\""),
        ] {
            let text = REVIEW_A.replace(from, to);
            assert_ne!(text, REVIEW_A, "{from} not found");
            let d = resolve(Some(&env(&text)), &req("review"), &host)
                .unwrap()
                .digest();
            assert_ne!(d, base, "{from} -> {to} kept the digest");
        }
        let r = ResolveRequest {
            credential_proxy: Some("0".to_owned()),
            ..req("review")
        };
        assert_ne!(
            resolve(Some(&env(REVIEW_A)), &r, &host).unwrap().digest(),
            base
        );
    }

    #[test]
    fn the_digest_does_not_depend_on_unused_images() {
        let host = HostTiers::all_available();
        let a = resolve(Some(&env(REVIEW_A)), &req("review"), &host).unwrap();
        let with_image = format!("[container]\nimage = \"x:1\"\n{REVIEW_A}");
        let b = resolve(Some(&env(&with_image)), &req("review"), &host).unwrap();
        assert_eq!(a.digest(), b.digest());
    }

    #[test]
    fn every_profile_gets_protective_ceilings_sized_from_the_host_unless_it_sets_its_own() {
        let mut host = HostTiers::all_available();
        host.set_memory_bytes(24 << 30);
        for name in ["default", "agent-claude", "agent-codex", "agent", "browser"] {
            let mut r = req(name);
            r.h5i_agent = Some("claude".to_owned());
            let p = resolve(None, &r, &host).unwrap();
            assert_eq!(p.resources.mem_bytes, Some(12 << 30), "{name}");
            assert_eq!(p.resources.procs, Some(4096), "{name}");
            assert_eq!(p.resources.wall_secs, Some(24 * 3600), "{name}");
        }
        // A small host keeps at least 1 GiB; an unknown one gets 4 GiB.
        let mut small = HostTiers::all_available();
        small.set_memory_bytes(1 << 30);
        let p = resolve(None, &req("default"), &small).unwrap();
        assert_eq!(p.resources.mem_bytes, Some(1 << 30));
        let p = resolve(None, &req("default"), &HostTiers::all_available()).unwrap();
        assert_eq!(p.resources.mem_bytes, Some(4 << 30));
        // env.toml overrides each one, and the others keep their defaults.
        let f = env("[profile.big.resources]\nmem = \"30G\"\nwall = \"48h\"\n");
        let p = resolve(Some(&f), &req("big"), &host).unwrap();
        assert_eq!(p.resources.mem_bytes, Some(30 << 30));
        assert_eq!(p.resources.wall_secs, Some(48 * 3600));
        assert_eq!(p.resources.procs, Some(4096));
    }

    #[test]
    fn net_families_reaches_the_policy_and_leaves_other_digests_alone() {
        let host = HostTiers::all_available();
        let plain = resolve(Some(&env(REVIEW_A)), &req("review"), &host).unwrap();
        assert!(plain.net.families.is_empty());
        assert!(!plain.to_canonical_toml().contains("families"));
        let granted = REVIEW_A.replace(
            "loopback = [3000, 8080]\n",
            "loopback = [3000, 8080]\nfamilies = [\"vsock\", \"vsock\"]\n",
        );
        let p = resolve(Some(&env(&granted)), &req("review"), &host).unwrap();
        assert_eq!(p.net.families, ["vsock"]);
        assert_ne!(p.digest(), plain.digest());
    }
}
