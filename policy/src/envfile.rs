//! `.h5i/env.toml`, validated: stage two of parsing, after the raw serde shape in `schema.rs`.
//!
//! Owns [`parse_env_file`] and [`EnvFile`]: every value checked, every custom profile merged
//! over `default` (keys given replace default's values) and checked for contradictions, each
//! refusal naming the file, line and key path. The whole file is checked, not only the profile
//! in use: a broken env.toml refuses everything, so a mistake cannot wait for the one box that
//! uses it. Must never: read the file itself (the caller hands in its text), or let a custom
//! profile shadow a built-in.
//!
//! Decisions written down here:
//! - A `[profile.X.secret.NAME]` table must be listed in `secrets`; an unlisted table, and a
//!   name listed twice, are refused (a typo in either place would otherwise silently drop or
//!   add a grant).
//! - A secret injected as `env` is injected under its own name, so it may not share a name with
//!   an `[[auth]]` grant's `base_url_var` or `token_var`.
//!
//! Guarded by the `*_is_refused` tests below.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::path::Path;

use toml::Spanned;

use crate::builtin::{builtin_policy, is_builtin};
use crate::error::{Location, PolicyError};
use crate::profile::{IsolationRequest, Located, ProfilePolicy};
use crate::resolved::{AuthGrant, NetMode, SecretGrant, SecretInject, SecretSource, Service};
use crate::schema::{
    line_of, schema_error, RawAuth, RawEnvFile, RawFs, RawInject, RawIsolation, RawMem, RawNet,
    RawNetMode, RawProfile, RawResources, RawService,
};
use crate::tier::Tier;
/// The mend for a `net.families` entry that cannot be granted.
const FAMILIES_MEND: &str = "name only refused families such as \"vsock\" or \"alg\" (the table is in h5i box capabilities --json); AF_UNIX is net.unix";

use crate::units::{mem_from_int, parse_mem, parse_wall, MAX_LIMIT, MEM_MEND, WALL_MEND};
use crate::values::{
    check_image, is_env_var_name, is_profile_name, is_service_name, normalize_fs_path,
    normalize_host, port_from_int, HostPort, ValueProblem, ENV_VAR_MEND,
};

/// A parsed and fully validated `.h5i/env.toml`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvFile {
    source: String,
    image: Option<String>,
    container_runtime: Option<crate::resolved::ContainerRuntime>,
    services: BTreeMap<String, Service>,
    profiles: BTreeMap<String, ProfilePolicy>,
}

impl EnvFile {
    /// The path the file was named by, as used in messages.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The repo-level `[container] image`.
    pub fn container_image(&self) -> Option<&str> {
        self.image.as_deref()
    }

    /// The repo-level `[container] runtime`.
    pub fn container_runtime(&self) -> Option<crate::resolved::ContainerRuntime> {
        self.container_runtime
    }

    /// The declared `[service.NAME]` entries.
    pub fn services(&self) -> &BTreeMap<String, Service> {
        &self.services
    }

    /// The custom profile names, sorted.
    pub fn profile_names(&self) -> impl Iterator<Item = &str> {
        self.profiles.keys().map(String::as_str)
    }

    pub(crate) fn profile(&self, name: &str) -> Option<&ProfilePolicy> {
        self.profiles.get(name)
    }
}

/// Parse and validate the text of an `.h5i/env.toml`. `path_for_messages` is only used to name
/// the file in refusals; nothing is read from it.
pub fn parse_env_file(path_for_messages: &Path, text: &str) -> Result<EnvFile, PolicyError> {
    let file = path_for_messages.display().to_string();
    let raw: RawEnvFile = toml::from_str(text).map_err(|e| schema_error(&file, text, &e))?;
    let cx = Cx { file: &file, text };

    let image = match &raw.container {
        Some(c) => {
            let img = c.get_ref().image.get_ref();
            check_image(img)
                .map_err(|p| cx.invalid(c.get_ref().image.span(), "container.image", p))?;
            Some(img.clone())
        }
        None => None,
    };
    let container_runtime = match raw
        .container
        .as_ref()
        .and_then(|c| c.get_ref().runtime.as_ref())
    {
        Some(rt) => Some(rt.get_ref().parse().map_err(|what| {
            PolicyError::InvalidValue {
                at: cx.at(rt.span(), "container.runtime".to_owned()),
                what,
                mend: "write runtime = \"h5i-runc\" (the default) or runtime = \"host-default\""
                    .to_owned(),
            }
        })?),
        None => None,
    };

    let mut services = BTreeMap::new();
    let mut ports: BTreeMap<u16, String> = BTreeMap::new();
    for (name, svc) in &raw.service {
        let key = format!("service.{}", name.get_ref());
        if !is_service_name(name.get_ref()) {
            return Err(PolicyError::InvalidValue {
                at: cx.at(name.span(), key),
                what: format!("`{}` is not a service name", name.get_ref()),
                mend: "name it [a-z0-9][a-z0-9_-]{0,62}".to_owned(),
            });
        }
        let (name, svc) = (name.get_ref(), svc.get_ref());
        let service = cx.service(&key, svc)?;
        if let Some(port) = service.port {
            if let Some(other) = ports.insert(port, name.clone()) {
                return Err(PolicyError::Contradiction {
                    at: cx.at(
                        svc.port.as_ref().map_or(0..0, Spanned::span),
                        format!("{key}.port"),
                    ),
                    what: format!("services `{other}` and `{name}` both declare port {port}"),
                    mend: "give each service its own port".to_owned(),
                });
            }
        }
        services.insert(name.clone(), service);
    }

    let mut profiles = BTreeMap::new();
    for (name, raw_profile) in &raw.profile {
        let key = format!("profile.{}", name.get_ref());
        let name_at = cx.at(name.span(), key.clone());
        let name = name.get_ref();
        if !is_profile_name(name) {
            return Err(PolicyError::InvalidValue {
                at: name_at,
                what: format!("`{name}` is not a profile name"),
                mend: "name it with lower-case letters, digits, '_' and '-', starting with a letter or digit".to_owned(),
            });
        }
        if is_builtin(name) {
            return Err(PolicyError::Contradiction {
                at: name_at,
                what: format!(
                    "custom profile `{name}` would shadow the built-in profile of that name"
                ),
                mend: format!(
                    "rename it (for example `{name}-custom`); built-ins cannot be redefined"
                ),
            });
        }
        let policy = cx.profile(name, &key, raw_profile.get_ref())?;
        policy.check()?;
        profiles.insert(name.clone(), policy);
    }

    Ok(EnvFile {
        source: file,
        image,
        container_runtime,
        services,
        profiles,
    })
}

/// What every check needs to name a location.
struct Cx<'a> {
    file: &'a str,
    text: &'a str,
}

impl Cx<'_> {
    fn at(&self, span: Range<usize>, key: impl Into<String>) -> Location {
        Location::in_file(self.file, line_of(self.text, span.start), key)
    }

    fn invalid(&self, span: Range<usize>, key: impl Into<String>, p: ValueProblem) -> PolicyError {
        PolicyError::InvalidValue {
            at: self.at(span, key),
            what: p.what,
            mend: p.mend,
        }
    }

    fn invalid_msg(
        &self,
        span: Range<usize>,
        key: impl Into<String>,
        what: String,
        mend: &str,
    ) -> PolicyError {
        PolicyError::InvalidValue {
            at: self.at(span, key),
            what,
            mend: mend.to_owned(),
        }
    }

    fn service(&self, key: &str, svc: &RawService) -> Result<Service, PolicyError> {
        let command = svc.command.get_ref();
        if command.trim().is_empty() {
            return Err(self.invalid_msg(
                svc.command.span(),
                format!("{key}.command"),
                "the service command is empty".to_owned(),
                "give the command that starts it, like \"npm run dev\"",
            ));
        }
        let port = match &svc.port {
            Some(p) => Some(
                port_from_int(*p.get_ref())
                    .map_err(|e| self.invalid(p.span(), format!("{key}.port"), e))?,
            ),
            None => None,
        };
        Ok(Service {
            command: command.clone(),
            port,
        })
    }

    fn profile(
        &self,
        name: &str,
        key: &str,
        raw: &RawProfile,
    ) -> Result<ProfilePolicy, PolicyError> {
        // Start from default's values; every key given replaces the value it names.
        let mut p = builtin_policy("default", None)?.ok_or_else(|| PolicyError::InvalidValue {
            at: Location::builtin("default", "(table)"),
            what: "the built-in default profile is missing".to_owned(),
            mend: "report this: the built-in profile table is inconsistent".to_owned(),
        })?;
        p.name = name.to_owned();

        if let Some(iso) = &raw.isolation {
            let req = match iso.get_ref() {
                RawIsolation::Auto => IsolationRequest::Auto,
                RawIsolation::Workspace => IsolationRequest::Tier(Tier::Workspace),
                RawIsolation::Process => IsolationRequest::Tier(Tier::Process),
                RawIsolation::Supervised => IsolationRequest::Tier(Tier::Supervised),
                RawIsolation::Container => IsolationRequest::Tier(Tier::Container),
                RawIsolation::Microvm => IsolationRequest::Tier(Tier::Microvm),
            };
            p.isolation = Some(Located::new(
                req,
                self.at(iso.span(), format!("{key}.isolation")),
            ));
        }
        if let Some(fs) = &raw.fs {
            self.fs(&mut p, key, fs.get_ref())?;
        }
        if let Some(net) = &raw.net {
            self.net(&mut p, key, net.get_ref())?;
        }
        if let Some(res) = &raw.resources {
            self.resources(&mut p, key, res.get_ref())?;
        }
        self.secrets(&mut p, key, raw)?;
        if let Some(auth) = &raw.auth {
            self.auth(&mut p, key, auth)?;
        }
        if let Some(c) = &raw.container {
            let img = c.get_ref().image.get_ref();
            check_image(img).map_err(|e| {
                self.invalid(
                    c.get_ref().image.span(),
                    format!("{key}.container.image"),
                    e,
                )
            })?;
            p.image = Some(img.clone());
            if let Some(rt) = &c.get_ref().runtime {
                p.container_runtime = Some(rt.get_ref().parse().map_err(|what| {
                    PolicyError::InvalidValue {
                        at: self.at(rt.span(), format!("{key}.container.runtime")),
                        what,
                        mend: "write runtime = \"h5i-runc\" (the default) or runtime = \"host-default\"".to_owned(),
                    }
                })?);
            }
        }
        Ok(p)
    }

    fn paths(
        &self,
        key: &str,
        list: &Spanned<Vec<Spanned<String>>>,
    ) -> Result<Vec<Located<String>>, PolicyError> {
        list.get_ref()
            .iter()
            .map(|entry| {
                normalize_fs_path(entry.get_ref())
                    .map(|p| Located::new(p, self.at(entry.span(), key.to_owned())))
                    .map_err(|e| self.invalid(entry.span(), key.to_owned(), e))
            })
            .collect()
    }

    fn fs(&self, p: &mut ProfilePolicy, key: &str, fs: &RawFs) -> Result<(), PolicyError> {
        if let Some(read) = &fs.read {
            p.fs_read = self.paths(&format!("{key}.fs.read"), read)?;
        }
        if let Some(write) = &fs.write {
            p.fs_write = self.paths(&format!("{key}.fs.write"), write)?;
        }
        if let Some(deny) = &fs.deny {
            p.fs_deny = self.paths(&format!("{key}.fs.deny"), deny)?;
        }
        Ok(())
    }

    fn net(&self, p: &mut ProfilePolicy, key: &str, net: &RawNet) -> Result<(), PolicyError> {
        if let Some(mode) = &net.mode {
            let m = match mode.get_ref() {
                RawNetMode::Deny => NetMode::Deny,
                RawNetMode::Host => NetMode::Host,
            };
            p.net_mode = Located::new(m, self.at(mode.span(), format!("{key}.net.mode")));
        }
        if let Some(egress) = &net.egress {
            let k = format!("{key}.net.egress");
            let hosts = egress
                .get_ref()
                .iter()
                .map(|e| {
                    e.get_ref()
                        .parse::<HostPort>()
                        .map_err(|pr| self.invalid(e.span(), k.clone(), pr))
                })
                .collect::<Result<Vec<_>, _>>()?;
            p.egress = Located::new(hosts, self.at(egress.span(), k));
        }
        if let Some(unix) = &net.unix {
            p.unix = *unix.get_ref();
        }
        if let Some(lb) = &net.loopback {
            let k = format!("{key}.net.loopback");
            p.loopback = lb
                .get_ref()
                .iter()
                .map(|port| {
                    port_from_int(*port.get_ref())
                        .map_err(|e| self.invalid(port.span(), k.clone(), e))
                })
                .collect::<Result<_, _>>()?;
        }
        if let Some(families) = &net.families {
            let k = format!("{key}.net.families");
            p.families = families
                .get_ref()
                .iter()
                .map(|f| match crate::families::grant_problem(f.get_ref()) {
                    None => Ok(f.get_ref().clone()),
                    Some(what) => Err(self.invalid_msg(f.span(), k.clone(), what, FAMILIES_MEND)),
                })
                .collect::<Result<_, _>>()?;
        }
        Ok(())
    }

    fn resources(
        &self,
        p: &mut ProfilePolicy,
        key: &str,
        r: &RawResources,
    ) -> Result<(), PolicyError> {
        if let Some(mem) = &r.mem {
            let k = format!("{key}.resources.mem");
            let bytes = match mem.get_ref() {
                RawMem::Text(t) => parse_mem(t),
                RawMem::Bytes(n) => mem_from_int(*n),
            }
            .map_err(|what| self.invalid_msg(mem.span(), k, what, MEM_MEND))?;
            p.resources.mem_bytes = Some(bytes);
        }
        if let Some(procs) = &r.procs {
            let n = *procs.get_ref();
            if n <= 0 {
                return Err(self.invalid_msg(
                    procs.span(),
                    format!("{key}.resources.procs"),
                    format!("procs = {n} would stop the box from running anything"),
                    "give a positive process count, or remove the key for no limit",
                ));
            }
            p.resources.procs = Some(n.unsigned_abs().min(MAX_LIMIT));
        }
        if let Some(wall) = &r.wall {
            let secs = parse_wall(wall.get_ref()).map_err(|what| {
                self.invalid_msg(
                    wall.span(),
                    format!("{key}.resources.wall"),
                    what,
                    WALL_MEND,
                )
            })?;
            p.resources.wall_secs = Some(secs);
        }
        Ok(())
    }

    fn secrets(
        &self,
        p: &mut ProfilePolicy,
        key: &str,
        raw: &RawProfile,
    ) -> Result<(), PolicyError> {
        let listed: &[Spanned<String>] = raw.secrets.as_ref().map_or(&[], |s| s.get_ref());
        let tables: BTreeMap<&str, &Spanned<crate::schema::RawSecret>> = raw
            .secret
            .iter()
            .map(|(k, v)| (k.get_ref().as_str(), v))
            .collect();
        for name in raw.secret.keys() {
            if !listed.iter().any(|l| l.get_ref() == name.get_ref()) {
                return Err(PolicyError::Contradiction {
                    at: self.at(name.span(), format!("{key}.secret.{}", name.get_ref())),
                    what: format!(
                        "secret table `{}` is not listed in `secrets`, so it grants nothing",
                        name.get_ref()
                    ),
                    mend: format!(
                        "add \"{}\" to {key}.secrets, or remove the table",
                        name.get_ref()
                    ),
                });
            }
        }
        if raw.secrets.is_none() {
            return Ok(());
        }
        let mut seen = BTreeSet::new();
        let mut grants = Vec::new();
        let list_key = format!("{key}.secrets");
        for entry in listed {
            let name = entry.get_ref();
            if !is_env_var_name(name) {
                return Err(self.invalid_msg(
                    entry.span(),
                    list_key.clone(),
                    format!(
                        "secret name `{name}` is not [A-Z_][A-Z0-9_]* (it becomes a variable name)"
                    ),
                    "name the secret in upper case, like \"DEPLOY_KEY\"",
                ));
            }
            if !seen.insert(name.as_str()) {
                return Err(PolicyError::Contradiction {
                    at: self.at(entry.span(), list_key.clone()),
                    what: format!("secret `{name}` is listed twice"),
                    mend: "list each secret once".to_owned(),
                });
            }
            let mut grant = SecretGrant {
                name: name.clone(),
                source: SecretSource::default_for(name),
                inject: SecretInject::Env,
            };
            let mut at = self.at(entry.span(), list_key.clone());
            if let Some(table) = tables.get(name.as_str()) {
                let t = table.get_ref();
                let tkey = format!("{key}.secret.{name}");
                if let Some(src) = &t.source {
                    grant.source = src.get_ref().parse().map_err(|what| {
                        self.invalid_msg(
                            src.span(),
                            format!("{tkey}.source"),
                            what,
                            "write source = \"env:VARIABLE\" (the default is env:H5I_SECRET_<NAME>)",
                        )
                    })?;
                }
                if let Some(inject) = &t.inject {
                    grant.inject = match inject.get_ref() {
                        RawInject::Env => SecretInject::Env,
                        RawInject::File => SecretInject::File,
                    };
                    at = self.at(inject.span(), format!("{tkey}.inject"));
                }
            }
            grants.push(Located::new(grant, at));
        }
        p.secrets = grants;
        Ok(())
    }

    fn auth(
        &self,
        p: &mut ProfilePolicy,
        key: &str,
        list: &Spanned<Vec<Spanned<RawAuth>>>,
    ) -> Result<(), PolicyError> {
        let mut grants: Vec<AuthGrant> = Vec::new();
        let mut vars: BTreeMap<String, String> = BTreeMap::new();
        for (i, entry) in list.get_ref().iter().enumerate() {
            let a = entry.get_ref();
            let ekey = format!("{key}.auth[{i}]");
            let host_text = a.host.get_ref();
            if host_text.contains(':') {
                return Err(self.invalid_msg(
                    a.host.span(),
                    format!("{ekey}.host"),
                    format!("auth host `{host_text}` has a port or scheme"),
                    "write the bare host, like \"api.github.com\" (the proxy speaks HTTPS to it)",
                ));
            }
            let host = normalize_host(host_text).map_err(|what| {
                self.invalid_msg(
                    a.host.span(),
                    format!("{ekey}.host"),
                    what,
                    "write the bare host, like \"api.github.com\"",
                )
            })?;
            for (field, value) in [
                ("credential_env", &a.credential_env),
                ("base_url_var", &a.base_url_var),
                ("token_var", &a.token_var),
            ] {
                if !is_env_var_name(value.get_ref()) {
                    return Err(self.invalid_msg(
                        value.span(),
                        format!("{ekey}.{field}"),
                        format!("`{}` is not a variable name", value.get_ref()),
                        ENV_VAR_MEND,
                    ));
                }
            }
            if let Some(prev) = grants.iter().position(|g| g.host == host) {
                return Err(PolicyError::Contradiction {
                    at: self.at(a.host.span(), format!("{ekey}.host")),
                    what: format!("`{host}` already has a grant ({key}.auth[{prev}])"),
                    mend: "declare one grant per host".to_owned(),
                });
            }
            for (field, value) in [
                ("base_url_var", &a.base_url_var),
                ("token_var", &a.token_var),
            ] {
                let v = value.get_ref();
                let here = format!("{ekey}.{field}");
                if let Some(other) = vars.insert(v.clone(), here.clone()) {
                    return Err(PolicyError::Contradiction {
                        at: self.at(value.span(), here),
                        what: format!("box variable `{v}` is already set by {other}"),
                        mend: "give each grant its own base_url_var and token_var".to_owned(),
                    });
                }
            }
            grants.push(AuthGrant {
                host,
                credential_env: a.credential_env.get_ref().clone(),
                base_url_var: a.base_url_var.get_ref().clone(),
                token_var: a.token_var.get_ref().clone(),
                fallbacks: Vec::new(),
            });
        }
        for s in &p.secrets {
            if s.value.inject == SecretInject::Env {
                if let Some(by) = vars.get(&s.value.name) {
                    return Err(PolicyError::Contradiction {
                        at: s.at.clone(),
                        what: format!(
                            "secret `{}` is injected as the variable of that name, which {by} also sets",
                            s.value.name
                        ),
                        mend: "rename the secret or the grant's variable".to_owned(),
                    });
                }
            }
        }
        p.auth = Located::new(grants, self.at(list.span(), format!("{key}.auth")));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = ".h5i/env.toml";

    fn parse(text: &str) -> Result<EnvFile, PolicyError> {
        parse_env_file(Path::new(FILE), text)
    }

    /// Parse `text`, expect a refusal, and check it names the file, `line`, `key` and a mend.
    fn refused(text: &str, line: usize, key: &str) -> PolicyError {
        let err = parse(text).expect_err("accepted");
        let m = err.to_string();
        assert!(m.starts_with("refusing: "), "{m}");
        assert!(
            m.contains(&format!("{FILE}:{line}:")),
            "want line {line}: {m}"
        );
        assert!(m.contains(&format!("`{key}`")), "want key {key}: {m}");
        assert!(m.contains("; to fix: "), "{m}");
        err
    }

    const MANUAL_EXAMPLE: &str = r#"
[container]
image = "localhost/h5i-base:latest"

[service.web]
command = "npm run dev"
port = 3000

[profile.review]
isolation = "supervised"
secrets = ["DEPLOY_KEY"]

[profile.review.fs]
read  = ["/usr", "/etc"]
write = ["$WORK"]

[profile.review.net]
mode     = "deny"
egress   = ["api.github.com"]
unix     = false          # AF_UNIX sockets; see below
loopback = [3000]         # macOS only; see below

[profile.review.resources]
mem   = "4G"
procs = 256
wall  = "30m"

[profile.review.secret.DEPLOY_KEY]
source = "env:H5I_SECRET_DEPLOY_KEY"   # the default for a bare name
inject = "env"                          # `file` is workspace-tier only in v1

[[profile.review.auth]]
host           = "api.github.com"
credential_env = "GITHUB_TOKEN"   # read on the host, never in the box
base_url_var   = "GH_HOST"        # what the client reads
token_var      = "GH_TOKEN"       # where the box gets its per-run dummy

[profile.review.container]
image = "localhost/review:1"
"#;

    #[test]
    fn the_manuals_example_parses() {
        let f = parse(MANUAL_EXAMPLE).unwrap();
        assert_eq!(f.container_image(), Some("localhost/h5i-base:latest"));
        assert_eq!(f.services()["web"].port, Some(3000));
        assert_eq!(f.profile_names().collect::<Vec<_>>(), ["review"]);
        let p = f.profile("review").unwrap();
        assert_eq!(p.resources.mem_bytes, Some(4 << 30));
        assert_eq!(p.resources.procs, Some(256));
        assert_eq!(p.resources.wall_secs, Some(1800));
        assert_eq!(p.egress.value[0].to_string(), "api.github.com:443");
        assert_eq!(
            p.secrets[0].value.source.to_string(),
            "env:H5I_SECRET_DEPLOY_KEY"
        );
        assert_eq!(p.auth.value[0].token_var, "GH_TOKEN");
        assert_eq!(p.image.as_deref(), Some("localhost/review:1"));
    }

    #[test]
    fn an_empty_file_is_fine() {
        let f = parse("").unwrap();
        assert!(f.profile_names().next().is_none());
    }

    #[test]
    fn a_custom_profile_starts_from_default_and_given_keys_replace() {
        let f = parse("[profile.r.net]\nunix = true\n").unwrap();
        let p = f.profile("r").unwrap();
        assert!(p.unix);
        assert!(p.fs_read.iter().any(|l| l.value == "/usr"));
        assert!(p.fs_write.iter().any(|l| l.value == "$WORK"));
        let f = parse("[profile.r.fs]\nread = [\"/opt\"]\n").unwrap();
        let reads: Vec<_> = f
            .profile("r")
            .unwrap()
            .fs_read
            .iter()
            .map(|l| l.value.clone())
            .collect();
        assert_eq!(reads, ["/opt"]);
    }

    #[test]
    fn a_bare_secret_name_gets_the_default_source() {
        let f = parse("[profile.r]\nsecrets = [\"NPM_TOKEN\"]\n").unwrap();
        let s = &f.profile("r").unwrap().secrets[0].value;
        assert_eq!(s.source, SecretSource::Env("H5I_SECRET_NPM_TOKEN".into()));
        assert_eq!(s.inject, SecretInject::Env);
    }

    #[test]
    fn syntax_errors_are_refused_with_the_line() {
        let err = parse("[profile.r]\nisolation = \"process\n").unwrap_err();
        assert!(matches!(err, PolicyError::Syntax { .. }), "{err:?}");
        let m = err.to_string();
        assert!(
            m.contains(&format!("{FILE}:2")) && m.contains("to fix:"),
            "{m}"
        );
    }

    #[test]
    fn unknown_keys_are_refused() {
        let e = refused(
            "[profile.r]\nisolation = \"process\"\nisolaton = \"x\"\n",
            3,
            "profile.r.isolaton",
        );
        assert!(matches!(e, PolicyError::Schema { .. }));
        refused(
            "[profile.r.net]\nmode = \"deny\"\nallow = []\n",
            3,
            "profile.r.net.allow",
        );
        refused("\n[contianer]\nimage = \"x\"\n", 2, "contianer");
        refused(
            "[service.web]\ncommand = \"x\"\nenv = {}\n",
            3,
            "service.web.env",
        );
        refused(
            "[profile.r.secret.X]\nsource = \"env:Y\"\nvalue = \"leak\"\n",
            3,
            "profile.r.secret.X.value",
        );
        refused(
            "[[profile.r.auth]]\nhost = \"a.b\"\ncredential_env = \"A\"\nbase_url_var = \"B\"\ntoken_var = \"C\"\nscope = \"x\"\n",
            6,
            "profile.r.auth[0].scope",
        );
    }

    #[test]
    fn wrong_types_are_refused() {
        let e = refused("[profile.r]\nisolation = 5\n", 2, "profile.r.isolation");
        assert!(matches!(e, PolicyError::Schema { .. }));
        refused("[profile.r.net]\nunix = \"yes\"\n", 2, "profile.r.net.unix");
        refused(
            "[profile.r.net]\negress = [\"a.com\", 3]\n",
            2,
            "profile.r.net.egress",
        );
        refused(
            "[profile.r.resources]\nprocs = \"256\"\n",
            2,
            "profile.r.resources.procs",
        );
        refused(
            "[profile.r.resources]\nwall = 1800\n",
            2,
            "profile.r.resources.wall",
        );
        refused(
            "[profile.r.net]\nmode = \"open\"\n",
            2,
            "profile.r.net.mode",
        );
        refused(
            "[profile.r]\nisolation = \"vm\"\n",
            2,
            "profile.r.isolation",
        );
        refused(
            "[profile.r.secret.X]\ninject = \"stdin\"\n",
            2,
            "profile.r.secret.X.inject",
        );
    }

    #[test]
    fn missing_required_keys_are_refused() {
        let e = refused(
            "[[profile.r.auth]]\nhost = \"api.github.com\"\ncredential_env = \"GITHUB_TOKEN\"\nbase_url_var = \"GH_HOST\"\n",
            1,
            "profile.r.auth[0].token_var",
        );
        assert!(matches!(e, PolicyError::Schema { .. }));
        refused("[service.web]\nport = 3000\n", 1, "service.web.command");
    }

    #[test]
    fn host_mode_with_egress_is_refused() {
        let e = refused(
            "[profile.r.net]\nmode = \"host\"\negress = [\"api.github.com\"]\n",
            3,
            "profile.r.net.egress",
        );
        assert!(matches!(e, PolicyError::Contradiction { .. }), "{e:?}");
        // Host mode alone is fine.
        parse("[profile.r.net]\nmode = \"host\"\n").unwrap();
    }

    #[test]
    fn malformed_egress_entries_are_refused() {
        for bad in [
            "https://api.github.com",
            "api.github.com/path",
            "api github.com",
            "",
            "a.com:0",
            "a.com:99999",
            "*.a.com",
        ] {
            let text = format!("[profile.r.net]\negress = [\n  \"ok.com\",\n  \"{bad}\",\n]\n");
            let e = refused(&text, 4, "profile.r.net.egress");
            assert!(matches!(e, PolicyError::InvalidValue { .. }), "{e:?}");
        }
    }

    #[test]
    fn a_secret_listed_twice_is_refused() {
        let e = refused(
            "[profile.r]\nsecrets = [\"A\",\n  \"A\"]\n",
            3,
            "profile.r.secrets",
        );
        assert!(matches!(e, PolicyError::Contradiction { .. }));
    }

    #[test]
    fn a_secret_table_not_listed_in_secrets_is_refused() {
        let e = refused(
            "[profile.r]\nsecrets = [\"A\"]\n\n[profile.r.secret.B]\ninject = \"env\"\n",
            4,
            "profile.r.secret.B",
        );
        assert!(matches!(e, PolicyError::Contradiction { .. }));
        refused(
            "[profile.r.secret.B]\ninject = \"env\"\n",
            1,
            "profile.r.secret.B",
        );
    }

    #[test]
    fn a_bad_secret_name_or_source_is_refused() {
        refused(
            "[profile.r]\nsecrets = [\"deploy-key\"]\n",
            2,
            "profile.r.secrets",
        );
        let e = refused(
            "[profile.r]\nsecrets = [\"A\"]\n[profile.r.secret.A]\nsource = \"file:/etc/x\"\n",
            4,
            "profile.r.secret.A.source",
        );
        assert!(matches!(e, PolicyError::InvalidValue { .. }));
        refused(
            "[profile.r]\nsecrets = [\"A\"]\n[profile.r.secret.A]\nsource = \"env:lower\"\n",
            4,
            "profile.r.secret.A.source",
        );
    }

    #[test]
    fn file_injection_at_a_non_workspace_tier_is_refused() {
        let e = refused(
            "[profile.r]\nisolation = \"process\"\nsecrets = [\"A\"]\n[profile.r.secret.A]\ninject = \"file\"\n",
            5,
            "profile.r.secret.A.inject",
        );
        assert!(matches!(e, PolicyError::Contradiction { .. }));
        assert!(e.to_string().contains("workspace"), "{e}");
        // At workspace, or left to auto, it is fine.
        parse("[profile.r]\nisolation = \"workspace\"\nsecrets = [\"A\"]\n[profile.r.secret.A]\ninject = \"file\"\n").unwrap();
        parse("[profile.r]\nsecrets = [\"A\"]\n[profile.r.secret.A]\ninject = \"file\"\n").unwrap();
    }

    #[test]
    fn a_relative_fs_path_is_refused() {
        for (list, bad) in [
            ("read", "src"),
            ("write", "./out"),
            ("deny", "$TMP/x"),
            ("write", "$WORK/../up"),
        ] {
            let text = format!("[profile.r.fs]\n{list} = [\"{bad}\"]\n");
            let e = refused(&text, 2, &format!("profile.r.fs.{list}"));
            assert!(matches!(e, PolicyError::InvalidValue { .. }), "{e:?}");
        }
        let f = parse("[profile.r.fs]\nwrite = [\"$WORK/out\", \"~/.cache\"]\n").unwrap();
        let w: Vec<_> = f
            .profile("r")
            .unwrap()
            .fs_write
            .iter()
            .map(|l| l.value.clone())
            .collect();
        assert_eq!(w, ["$WORK/out", "$HOME/.cache"]);
    }

    #[test]
    fn a_denied_path_inside_a_granted_parent_is_refused() {
        let e = refused(
            "[profile.r.fs]\nwrite = [\"$WORK\"]\ndeny = [\"$WORK/.env\"]\n",
            3,
            "profile.r.fs.deny",
        );
        assert!(matches!(e, PolicyError::Contradiction { .. }));
        // Inherited grants count: default reads /etc.
        let e = refused(
            "[profile.r.fs]\ndeny = [\"/etc/shadow\"]\n",
            2,
            "profile.r.fs.deny",
        );
        assert!(e.to_string().contains("built-in profile `default`"), "{e}");
        // A grant inside a denied path is the same contradiction.
        refused(
            "[profile.r.fs]\ndeny = [\"/srv\"]\nread = [\"/srv/data\"]\n",
            3,
            "profile.r.fs.read",
        );
        // A deny outside every grant is fine.
        parse("[profile.r.fs]\ndeny = [\"/srv\"]\n").unwrap();
    }

    #[test]
    fn zero_or_unparsable_resources_are_refused() {
        for (k, v) in [
            ("mem", "\"0\""),
            ("mem", "0"),
            ("mem", "\"4X\""),
            ("mem", "\"\""),
            ("mem", "-1"),
            ("procs", "0"),
            ("procs", "-3"),
            ("wall", "\"0s\""),
            ("wall", "\"30\""),
            ("wall", "\"1d\""),
        ] {
            let text = format!("[profile.r.resources]\n{k} = {v}\n");
            let e = refused(&text, 2, &format!("profile.r.resources.{k}"));
            assert!(
                matches!(e, PolicyError::InvalidValue { .. }),
                "{k}={v}: {e:?}"
            );
        }
        let f = parse("[profile.r.resources]\nmem = 1048576\nwall = \"1h30m\"\n").unwrap();
        let r = f.profile("r").unwrap().resources;
        assert_eq!((r.mem_bytes, r.wall_secs), (Some(1 << 20), Some(5400)));
    }

    fn auth(host: &str, cred: &str, base: &str, token: &str) -> String {
        format!(
            "[[profile.r.auth]]\nhost = \"{host}\"\ncredential_env = \"{cred}\"\nbase_url_var = \"{base}\"\ntoken_var = \"{token}\"\n"
        )
    }

    #[test]
    fn a_malformed_auth_grant_is_refused() {
        for (text, line, key) in [
            (
                auth("https://api.github.com", "T", "B", "K"),
                2,
                "profile.r.auth[0].host",
            ),
            (
                auth("api.github.com:443", "T", "B", "K"),
                2,
                "profile.r.auth[0].host",
            ),
            (
                auth("api..github.com", "T", "B", "K"),
                2,
                "profile.r.auth[0].host",
            ),
            (
                auth("api.github.com", "github-token", "B", "K"),
                3,
                "profile.r.auth[0].credential_env",
            ),
            (
                auth("api.github.com", "T", "gh host", "K"),
                4,
                "profile.r.auth[0].base_url_var",
            ),
            (
                auth("api.github.com", "T", "B", "1TOKEN"),
                5,
                "profile.r.auth[0].token_var",
            ),
        ] {
            let e = refused(&text, line, key);
            assert!(matches!(e, PolicyError::InvalidValue { .. }), "{e:?}");
        }
    }

    #[test]
    fn conflicting_auth_grants_are_refused() {
        let two = format!(
            "{}{}",
            auth("a.com", "T", "B", "K"),
            auth("a.com", "T", "B2", "K2")
        );
        refused(&two, 7, "profile.r.auth[1].host");
        let two = format!(
            "{}{}",
            auth("a.com", "T", "B", "K"),
            auth("b.com", "T", "B2", "K")
        );
        refused(&two, 10, "profile.r.auth[1].token_var");
        let same = auth("a.com", "T", "V", "V");
        refused(&same, 5, "profile.r.auth[0].token_var");
        let clash = format!(
            "[profile.r]\nsecrets = [\"K\"]\n\n{}",
            auth("a.com", "T", "B", "K")
        );
        let e = refused(&clash, 2, "profile.r.secrets");
        assert!(matches!(e, PolicyError::Contradiction { .. }));
    }

    #[test]
    fn auth_grants_at_microvm_are_refused() {
        let text = format!(
            "[profile.r]\nisolation = \"microvm\"\n\n{}",
            auth("a.com", "T", "B", "K")
        );
        let e = refused(&text, 4, "profile.r.auth");
        assert!(matches!(e, PolicyError::Contradiction { .. }));
        assert!(e.to_string().contains("credential proxy"), "{e}");
    }

    #[test]
    fn egress_at_the_process_tier_is_refused() {
        let e = refused(
            "[profile.r]\nisolation = \"process\"\n[profile.r.net]\negress = [\"api.github.com\"]\n",
            4,
            "profile.r.net.egress",
        );
        assert!(matches!(e, PolicyError::Contradiction { .. }));
        let m = e.to_string();
        assert!(m.contains("supervised") && m.contains("container"), "{m}");
    }

    #[test]
    fn profile_names_are_checked_and_builtins_cannot_be_shadowed() {
        let e = refused(
            "[profile.default]\nisolation = \"process\"\n",
            1,
            "profile.default",
        );
        assert!(matches!(e, PolicyError::Contradiction { .. }));
        refused(
            "\n[profile.agent-claude.net]\nunix = true\n",
            2,
            "profile.agent-claude",
        );
        let e = refused("[profile.Review]\n", 1, "profile.Review");
        assert!(matches!(e, PolicyError::InvalidValue { .. }));
        refused("[profile._x]\n", 1, "profile._x");
    }

    #[test]
    fn bad_services_are_refused() {
        refused("[service.Web]\ncommand = \"x\"\n", 1, "service.Web");
        refused(
            "[service.web]\ncommand = \"  \"\n",
            2,
            "service.web.command",
        );
        refused(
            "[service.web]\ncommand = \"x\"\nport = 0\n",
            3,
            "service.web.port",
        );
        refused(
            "[service.web]\ncommand = \"x\"\nport = 70000\n",
            3,
            "service.web.port",
        );
        let e = refused(
            "[service.a]\ncommand = \"x\"\nport = 3000\n[service.b]\ncommand = \"y\"\nport = 3000\n",
            6,
            "service.b.port",
        );
        assert!(matches!(e, PolicyError::Contradiction { .. }));
    }

    #[test]
    fn bad_images_and_loopback_ports_are_refused() {
        refused("[container]\nimage = \"\"\n", 2, "container.image");
        refused(
            "[profile.r.container]\nimage = \"a b\"\n",
            2,
            "profile.r.container.image",
        );
        refused(
            "[profile.r.net]\nloopback = [3000, 0]\n",
            2,
            "profile.r.net.loopback",
        );
    }

    #[test]
    fn net_families_grants_a_refused_family_and_nothing_else() {
        let f = parse("[profile.r.net]\nfamilies = [\"vsock\", \"alg\"]\n").unwrap();
        assert_eq!(f.profile("r").unwrap().families, ["vsock", "alg"]);
        for bad in ["unix", "inet", "packet", "wifi"] {
            let text = format!("[profile.r.net]\nfamilies = [\"{bad}\"]\n");
            let e = refused(&text, 2, "profile.r.net.families");
            assert!(e.to_string().contains(bad), "{e}");
        }
    }
}
