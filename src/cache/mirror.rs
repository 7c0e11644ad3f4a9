//! The registry a refresh box fetches from, as the host's own configuration names it: pip's
//! `index-url` (its config files and `PIP_*` variables), uv's indexes (uv.toml and `UV_*`
//! variables, handed to the box as pip's, which downloads uv's locked set), Go's `GOPROXY` (the
//! variable or Go's env file), npm's and pnpm's `registry` and `@scope:registry` (`npm config
//! get registry`: the `npm_config_*` variables, the user's and the global `npmrc`, npm's
//! builtin one; pnpm's own `rc` below npm's), Yarn 1's (npm's settings first, then its
//! `.yarnrc` files and `YARN_*` variables) and cargo's (`$CARGO_HOME/config.toml`: crates.io's
//! source replacement and `[registries]`, and the `CARGO_REGISTRIES_<NAME>_INDEX` variables).
//! The refresh box gets the same settings, so it fills the cache from the mirror the caller's
//! own installs use; the mirror's hosts are the only egress its `cache-<eco>` profile may
//! grant, and the ready-to-paste profile names them.
//!
//! Which files are trusted: only the caller's own configuration outside the project (the files
//! in the caller's home, `$CARGO_HOME`, `$XDG_CONFIG_HOME`, the global ones under the node
//! prefix and `/etc`; a file that lies under the project's work tree or git dir is the
//! project's, whichever of the caller's variables points there, and is not read) and the
//! caller's environment, and of those files only a regular file
//! owned by root or the caller that others may not write (a group-writable one is taken: on a
//! user-private-group system its group is the owner's own). Never the project's own `.npmrc`,
//! `.yarnrc`, `.cargo/config.toml`, `pip.conf` or `uv.toml`, though the package manager run in
//! the repository on the host would read them: the project is the box's workspace, written by
//! whoever (whatever agent) wrote the repository, and a registry named there would widen what
//! the refresh box may reach at the word of the very content the narrowing guards against. In the
//! refresh box the host's settings are passed as variables, which every one of these package
//! managers puts above the project's files, so a hostile project file cannot point the
//! install elsewhere either (it could only make it fail: the egress is narrowed).
//!
//! Owns reading those settings (files capped at [`CONFIG_CAP`], never executing the tool).
//! Must never: invent a registry: when the host names none, the box gets no setting (the
//! package manager uses its own default) and the hosts are those of that documented default
//! ([`super::Ecosystem::default_hosts`]); read a credential setting (npm's `_authToken` and
//! `_auth`, cargo's tokens): only registry URLs are read, and passed as they are written (a
//! URL's own `user:pass@` with it, as pip's index URL is passed).

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

/// The largest config file read (a larger one is ignored, as if absent).
pub const CONFIG_CAP: u64 = 1 << 20;

/// The caller's environment, as the package managers read it (the process's in h5i; a table in
/// the unit tests). Variables whose name or value is not UTF-8 are left out.
#[derive(Debug, Clone, Default)]
pub struct Env {
    vars: Vec<(String, String)>,
    /// The project's directories (its work tree, its git dir): a config file under one is the
    /// project's, whichever variable of the caller's names it, and is never read.
    project: Vec<PathBuf>,
}

impl Env {
    /// This process's environment, for a refresh of the project whose directories are
    /// `project`.
    pub fn of_process(project: &[&Path]) -> Env {
        Env {
            vars: std::env::vars_os()
                .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
                .collect(),
            project: project.iter().map(|p| canonical(p)).collect(),
        }
    }

    /// An environment of exactly `pairs`, for a project at `project`.
    pub fn from_pairs(pairs: &[(&str, &str)], project: &[&Path]) -> Env {
        Env {
            vars: pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            project: project.iter().map(|p| canonical(p)).collect(),
        }
    }

    /// The config file at `path` when it is the caller's own and trusted ([`read_capped`]);
    /// absent when it lies in the project (a `CARGO_HOME=./.cargo-home` or a `node` on `PATH`
    /// under `node_modules/.bin` points a caller's setting at the project's own files).
    fn read_config(&self, path: &Path) -> Option<String> {
        let at = canonical(path);
        if self.project.iter().any(|p| at.starts_with(p)) {
            return None;
        }
        read_capped(path)
    }

    /// The value of `name` (exact name).
    pub fn var(&self, name: &str) -> Option<String> {
        self.vars
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    }

    /// Every non-empty variable whose name starts with `prefix`, compared ignoring ASCII case
    /// (as npm and Yarn compare `npm_config_`), as (the rest of the name, value).
    fn prefixed<'a>(&'a self, prefix: &'a str) -> impl Iterator<Item = (&'a str, &'a str)> {
        self.vars.iter().filter_map(move |(k, v)| {
            let head = k.get(..prefix.len())?;
            (head.eq_ignore_ascii_case(prefix) && !v.is_empty())
                .then(|| (&k[prefix.len()..], v.as_str()))
        })
    }
}

/// What the host's configuration says for one ecosystem.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Mirror {
    /// `NAME=VALUE` for the refresh box, pointing the package manager at the mirror.
    pub env: Vec<String>,
    /// The mirror's `host:port`s.
    pub hosts: Vec<String>,
    /// Whether the configuration replaces the package manager's default registry (rather than
    /// only adding others: an extra index, a scoped registry, an alternative cargo registry).
    pub replaces_default: bool,
    /// Files the refresh step writes into the cache's data directory before the install, as
    /// (name, content): cargo's `config.toml` holding the source replacement, which cargo
    /// takes from no variable (the box's `CARGO_HOME` is that directory).
    pub data_files: Vec<(&'static str, String)>,
}

/// `host:port` of an http(s) URL (`user:pass@` dropped, the scheme's port when none is given);
/// `None` for anything else (`file://`, a bare path, `direct`).
pub fn host_port(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    let port = match scheme.to_ascii_lowercase().as_str() {
        "https" => 443,
        "http" => 80,
        _ => return None,
    };
    let authority = rest.split(['/', '?', '#']).next()?;
    let authority = authority.rsplit('@').next()?;
    if authority.is_empty() {
        return None;
    }
    let has_port = match authority.rfind(':') {
        Some(i) => !authority[i..].contains(']'),
        None => false,
    };
    Some(if has_port {
        authority.to_ascii_lowercase()
    } else {
        format!("{}:{port}", authority.to_ascii_lowercase())
    })
}

/// `hosts` with each one's later repeats removed.
fn dedup(hosts: &mut Vec<String>) {
    let mut seen = std::collections::BTreeSet::new();
    hosts.retain(|h| seen.insert(h.clone()));
}

/// A config file the caller's own configuration names, read when it is trusted (module doc): a
/// regular file (a symlink is followed, as the package manager follows it) owned by root or
/// this process's user, not writable by others, at most [`CONFIG_CAP`] bytes. Anything else
/// reads as absent.
fn read_capped(path: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let f = std::fs::File::open(path).ok()?;
    let meta = f.metadata().ok()?;
    let euid = h5i_sys::ids::euid();
    let trusted = meta.is_file()
        && (meta.uid() == 0 || meta.uid() == euid)
        && meta.mode() & 0o002 == 0
        && meta.len() <= CONFIG_CAP;
    if !trusted {
        return None;
    }
    let mut text = String::new();
    f.take(CONFIG_CAP).read_to_string(&mut text).ok()?;
    Some(text)
}

/// `path` with its symlinks resolved as far as it exists, the rest appended as written (so a
/// file's place is judged where it really is, present or not).
fn canonical(path: &Path) -> PathBuf {
    let mut rest = Vec::new();
    let mut at = path;
    loop {
        if let Ok(real) = at.canonicalize() {
            return rest.iter().rev().fold(real, |p: PathBuf, c| p.join(c));
        }
        match (at.parent(), at.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name.to_owned());
                at = parent;
            }
            _ => return path.to_path_buf(),
        }
    }
}

fn config_home(env: &Env) -> Option<PathBuf> {
    env.var("XDG_CONFIG_HOME")
        .filter(|d| d.starts_with('/'))
        .map(PathBuf::from)
        .or_else(|| env.var("HOME").map(|h| PathBuf::from(h).join(".config")))
}

/// pip's settings that choose the index, in its config files' spelling.
const PIP_KEYS: &[(&str, &str)] = &[
    ("index-url", "PIP_INDEX_URL"),
    ("extra-index-url", "PIP_EXTRA_INDEX_URL"),
    ("trusted-host", "PIP_TRUSTED_HOST"),
];

/// pip's config files, lowest precedence first (pip's own order: global, user, then
/// `PIP_CONFIG_FILE`; `PIP_CONFIG_FILE=/dev/null` means none at all).
fn pip_files(env: &Env) -> Vec<PathBuf> {
    let env_file = env.var("PIP_CONFIG_FILE");
    if env_file.as_deref() == Some("/dev/null") {
        return Vec::new();
    }
    let mut files = vec![
        PathBuf::from("/etc/xdg/pip/pip.conf"),
        PathBuf::from("/etc/pip.conf"),
    ];
    if let Some(home) = env.var("HOME") {
        files.push(PathBuf::from(home).join(".pip/pip.conf"));
    }
    if let Some(dir) = config_home(env) {
        files.push(dir.join("pip/pip.conf"));
    }
    files.extend(env_file.map(PathBuf::from));
    files
}

/// The `[global]` then `[download]` (which pip's download command prefers) settings of one
/// pip.conf, for the keys in [`PIP_KEYS`]. Continuation lines (indented) extend the last value.
fn pip_ini(text: &str, into: &mut BTreeMap<&'static str, String>) {
    for section in ["global", "download"] {
        let mut current = "";
        let mut last: Option<&'static str> = None;
        for line in text.lines() {
            let trimmed = line.trim();
            if trimmed.starts_with('[') && trimmed.ends_with(']') {
                current = &trimmed[1..trimmed.len() - 1];
                last = None;
                continue;
            }
            if current != section || trimmed.is_empty() || trimmed.starts_with(['#', ';']) {
                continue;
            }
            if line.starts_with([' ', '\t']) {
                if let Some(k) = last {
                    let v = into.entry(k).or_default();
                    v.push(' ');
                    v.push_str(trimmed);
                }
                continue;
            }
            last = None;
            let Some((k, v)) = trimmed.split_once(['=', ':']) else {
                continue;
            };
            let k = k.trim().replace('_', "-");
            if let Some((name, _)) = PIP_KEYS.iter().find(|(name, _)| *name == k) {
                into.insert(name, v.trim().to_string());
                last = Some(name);
            }
        }
    }
}

/// pip: `index-url`, `extra-index-url` and `trusted-host` from pip's config files, then the
/// `PIP_*` variables over them (pip's precedence).
pub fn pip(env: &Env) -> Mirror {
    let mut settings = BTreeMap::new();
    for file in pip_files(env) {
        if let Some(text) = env.read_config(&file) {
            pip_ini(&text, &mut settings);
        }
    }
    for (name, var) in PIP_KEYS {
        if let Some(v) = env.var(var).filter(|v| !v.trim().is_empty()) {
            settings.insert(name, v);
        }
    }
    let mut m = Mirror {
        replaces_default: settings.contains_key("index-url"),
        ..Mirror::default()
    };
    for (name, var) in PIP_KEYS {
        if let Some(v) = settings.get(name) {
            m.env.push(format!("{var}={v}"));
            if *name != "trusted-host" {
                m.hosts.extend(v.split_whitespace().filter_map(host_port));
            }
        }
    }
    m.hosts.dedup();
    m
}

/// uv's config files, lowest precedence first: the system's, then the user's (uv's own
/// discovery); `UV_CONFIG_FILE` alone when set, none with `UV_NO_CONFIG`.
fn uv_files(env: &Env) -> Vec<PathBuf> {
    if env
        .var("UV_NO_CONFIG")
        .is_some_and(|v| !v.is_empty() && v != "0" && v != "false")
    {
        return Vec::new();
    }
    if let Some(file) = env.var("UV_CONFIG_FILE").filter(|f| !f.is_empty()) {
        return vec![PathBuf::from(file)];
    }
    let mut files = vec![PathBuf::from("/etc/uv/uv.toml")];
    files.extend(config_home(env).map(|d| d.join("uv/uv.toml")));
    files
}

/// The index settings of one uv.toml: the default index (`index-url`, or an `[[index]]` with
/// `default = true`), the others (`extra-index-url`, the other `[[index]]` entries) and
/// `allow-insecure-host`.
fn uv_toml(
    text: &str,
    default: &mut Option<String>,
    extra: &mut Vec<String>,
    insecure: &mut Vec<String>,
) {
    let Ok(doc) = text.parse::<toml::Table>() else {
        return;
    };
    let strings = |v: Option<&toml::Value>| -> Vec<String> {
        v.and_then(toml::Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|s| s.as_str().map(str::to_string))
            .collect()
    };
    if let Some(url) = doc.get("index-url").and_then(toml::Value::as_str) {
        *default = Some(url.to_string());
    }
    extra.extend(strings(doc.get("extra-index-url")));
    for index in doc
        .get("index")
        .and_then(toml::Value::as_array)
        .into_iter()
        .flatten()
    {
        let Some(url) = index.get("url").and_then(toml::Value::as_str) else {
            continue;
        };
        if index.get("default").and_then(toml::Value::as_bool) == Some(true) {
            *default = Some(url.to_string());
        } else {
            extra.push(url.to_string());
        }
    }
    insecure.extend(strings(doc.get("allow-insecure-host")));
}

/// uv: its indexes from uv.toml, then `UV_DEFAULT_INDEX`/`UV_INDEX_URL`, `UV_INDEX`/
/// `UV_EXTRA_INDEX_URL` and `UV_INSECURE_HOST` over them (uv's precedence), as pip's settings:
/// the refresh box downloads uv's locked set with pip ([`super::lockfile`]). An `http://`
/// index is a trusted host for pip, as it is plainly usable for uv.
pub fn uv(env: &Env) -> Mirror {
    let (mut default, mut extra, mut insecure) = (None, Vec::new(), Vec::new());
    for file in uv_files(env) {
        if let Some(text) = env.read_config(&file) {
            uv_toml(&text, &mut default, &mut extra, &mut insecure);
        }
    }
    let set = |k: &str| env.var(k).filter(|v| !v.trim().is_empty());
    if let Some(url) = set("UV_DEFAULT_INDEX").or_else(|| set("UV_INDEX_URL")) {
        default = Some(url);
    }
    for key in ["UV_INDEX", "UV_EXTRA_INDEX_URL"] {
        if let Some(list) = set(key) {
            // UV_INDEX entries may be named: `name=https://...`.
            extra.extend(
                list.split_whitespace()
                    .map(|e| e.split_once('=').map_or(e, |(_, url)| url).to_string()),
            );
        }
    }
    if let Some(list) = set("UV_INSECURE_HOST") {
        insecure.extend(list.split_whitespace().map(str::to_string));
    }
    let mut m = Mirror {
        replaces_default: default.is_some(),
        ..Mirror::default()
    };
    let urls = default.iter().chain(&extra);
    m.hosts = urls.clone().filter_map(|u| host_port(u)).collect();
    m.hosts.dedup();
    insecure.extend(
        urls.filter(|u| u.to_ascii_lowercase().starts_with("http://"))
            .filter_map(|u| host_port(u)),
    );
    if let Some(url) = default {
        m.env.push(format!("PIP_INDEX_URL={url}"));
    }
    if !extra.is_empty() {
        m.env
            .push(format!("PIP_EXTRA_INDEX_URL={}", extra.join(" ")));
    }
    if !insecure.is_empty() {
        insecure.dedup();
        m.env
            .push(format!("PIP_TRUSTED_HOST={}", insecure.join(" ")));
    }
    m
}

/// Go's settings that choose where modules and checksums come from.
const GO_KEYS: &[&str] = &[
    "GOPROXY",
    "GOSUMDB",
    "GONOSUMDB",
    "GOPRIVATE",
    "GONOPROXY",
    "GOINSECURE",
];

/// Go: the [`GO_KEYS`] from Go's env file (`$GOENV`, else `<config dir>/go/env`, as `go env -w`
/// writes it), then the variables over them (Go's precedence). The hosts are GOPROXY's
/// http(s) entries (`direct` and `off` name none; checksums go through the proxy too).
pub fn go(env: &Env) -> Mirror {
    let mut settings = BTreeMap::new();
    let file = match env.var("GOENV") {
        Some(f) if f == "off" => None,
        Some(f) => Some(PathBuf::from(f)),
        None => config_home(env).map(|d| d.join("go/env")),
    };
    if let Some(text) = file.as_deref().and_then(|p| env.read_config(p)) {
        for line in text.lines() {
            if let Some((k, v)) = line.split_once('=') {
                if let Some(key) = GO_KEYS.iter().find(|key| **key == k.trim()) {
                    settings.insert(*key, v.trim().to_string());
                }
            }
        }
    }
    for key in GO_KEYS {
        if let Some(v) = env.var(key).filter(|v| !v.trim().is_empty()) {
            settings.insert(*key, v);
        }
    }
    let mut m = Mirror {
        replaces_default: settings.contains_key("GOPROXY"),
        ..Mirror::default()
    };
    for key in GO_KEYS {
        if let Some(v) = settings.get(key) {
            m.env.push(format!("{key}={v}"));
        }
    }
    if let Some(proxy) = settings.get("GOPROXY") {
        m.hosts = proxy.split([',', '|']).filter_map(host_port).collect();
        m.hosts.dedup();
    }
    m
}

/// One `npmrc`, read as npm's `ini` reads it: top-level `key = value` lines only (a key under a
/// `[section]` is not a top-level setting), `;` and `#` starting a comment, a value in quotes
/// taken as it stands, an unquoted one ending at an inline `;` or `#`, and `${VAR}` (`${VAR?}`:
/// empty when unset) expanded from `env` in keys and values, as npm's config does.
fn npmrc(text: &str, env: &Env) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut in_section = false;
    for line in text.lines() {
        let t = line.trim();
        if t.is_empty() || t.starts_with([';', '#']) {
            continue;
        }
        if t.starts_with('[') && t.ends_with(']') {
            in_section = true;
            continue;
        }
        if in_section {
            continue;
        }
        let Some((k, v)) = t.split_once('=') else {
            continue;
        };
        let v = v.trim();
        let quoted = v.len() >= 2
            && ((v.starts_with('"') && v.ends_with('"'))
                || (v.starts_with('\'') && v.ends_with('\'')));
        let v = if quoted {
            &v[1..v.len() - 1]
        } else {
            v.split([';', '#']).next().unwrap_or("").trim()
        };
        out.insert(expand(k.trim(), env), expand(v, env));
    }
    out
}

/// npm's `${VAR}` expansion (`${VAR?}`: empty when unset; an unset `${VAR}` stays as written).
fn expand(s: &str, env: &Env) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find("${") {
        out.push_str(&rest[..i]);
        let after = &rest[i + 2..];
        let Some(end) = after.find('}') else {
            out.push_str(&rest[i..]);
            return out;
        };
        let name = &after[..end];
        let (name, optional) = match name.strip_suffix('?') {
            Some(n) => (n, true),
            None => (name, false),
        };
        match env.var(name) {
            Some(v) => out.push_str(&v),
            None if optional => {}
            None => out.push_str(&rest[i..i + 2 + end + 1]),
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    out
}

/// npm's settings from its `npm_config_*` variables (the name's case ignored, `_` read as `-`
/// but a leading one, lower-cased; a `//host/:key` name as it is).
fn npm_env(env: &Env) -> BTreeMap<String, String> {
    env.prefixed("npm_config_")
        .map(|(k, v)| {
            let key = if k.starts_with("//") {
                k.to_string()
            } else {
                let mut key = String::with_capacity(k.len());
                for (i, c) in k.char_indices() {
                    key.push(if c == '_' && i > 0 {
                        '-'
                    } else {
                        c.to_ascii_lowercase()
                    });
                }
                key
            };
            (key, v.to_string())
        })
        .collect()
}

/// `p` with a leading `~/` made the caller's home, as npm reads a path setting.
fn home_path(p: &str, env: &Env) -> PathBuf {
    match (p.strip_prefix("~/"), env.var("HOME")) {
        (Some(rest), Some(home)) => PathBuf::from(home).join(rest),
        _ => PathBuf::from(p),
    }
}

/// The first `name` on the caller's `PATH` that is a file, resolved.
fn on_path(name: &str, env: &Env) -> Option<PathBuf> {
    env.var("PATH")?
        .split(':')
        .filter(|d| d.starts_with('/'))
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
        .and_then(|p| std::fs::canonicalize(p).ok())
}

/// The prefix npm and Yarn take when nothing sets one: `$PREFIX`, else the directory above the
/// node binary's (`/usr/bin/node` -> `/usr`), under `$DESTDIR` when that is set.
fn node_prefix(env: &Env) -> Option<PathBuf> {
    if let Some(p) = env.var("PREFIX").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    let node = on_path("node", env)?;
    let prefix = node.parent()?.parent()?.to_path_buf();
    Some(match env.var("DESTDIR").filter(|d| !d.is_empty()) {
        Some(d) => PathBuf::from(d).join(prefix.strip_prefix("/").unwrap_or(&prefix)),
        None => prefix,
    })
}

/// The registries one layered configuration names: the default one and the scoped ones.
#[derive(Debug, Default)]
struct NodeRegistries {
    default: Option<String>,
    scoped: BTreeMap<String, String>,
}

impl NodeRegistries {
    /// Take `layer`'s registry settings that no higher layer set.
    fn under(&mut self, layer: &BTreeMap<String, String>) {
        for (k, v) in layer {
            if v.trim().is_empty() {
                continue;
            }
            if k == "registry" {
                self.default.get_or_insert_with(|| v.trim().to_string());
            } else if let Some(scope) = k
                .strip_suffix(":registry")
                .filter(|s| s.starts_with('@') && s.len() > 1 && !s.contains(['=', '\n']))
            {
                self.scoped
                    .entry(scope.to_string())
                    .or_insert_with(|| v.trim().to_string());
            }
        }
    }

    /// The mirror: hosts of every registry, the settings as `npm_config_*` variables (which npm,
    /// pnpm and Yarn 1 all put above the project's files), the default registry as `default_var`.
    fn mirror(&self, default_var: &str) -> Mirror {
        let mut m = Mirror {
            replaces_default: self.default.is_some(),
            ..Mirror::default()
        };
        if let Some(url) = &self.default {
            m.env.push(format!("{default_var}={url}"));
            m.hosts.extend(host_port(url));
        }
        for (scope, url) in &self.scoped {
            m.env.push(format!("npm_config_{scope}:registry={url}"));
            m.hosts.extend(host_port(url));
        }
        dedup(&mut m.hosts);
        m
    }
}

/// npm's layers above its defaults, highest first, the project's `.npmrc` left out (module
/// doc): the variables, the user's file (`userconfig`, else `~/.npmrc`), the global file
/// (`globalconfig`, else `<prefix>/etc/npmrc`), and with `builtin` npm's own `npmrc` beside
/// its install.
fn npm_layers(env: &Env, builtin: bool) -> Vec<BTreeMap<String, String>> {
    let vars = npm_env(env);
    let user_path = vars
        .get("userconfig")
        .map(|p| home_path(p, env))
        .or_else(|| env.var("HOME").map(|h| PathBuf::from(h).join(".npmrc")));
    let user = user_path
        .as_deref()
        .and_then(|p| env.read_config(p))
        .map(|t| npmrc(&t, env))
        .unwrap_or_default();
    let setting = |k: &str| {
        vars.get(k)
            .or_else(|| user.get(k))
            .map(|p| home_path(p, env))
    };
    let global_path = setting("globalconfig").or_else(|| {
        setting("prefix")
            .or_else(|| node_prefix(env))
            .map(|p| p.join("etc/npmrc"))
    });
    let global = global_path
        .as_deref()
        .and_then(|p| env.read_config(p))
        .map(|t| npmrc(&t, env))
        .unwrap_or_default();
    let mut layers = vec![vars, user, global];
    if builtin {
        // `/usr/bin/npm` -> `.../node_modules/npm/bin/npm-cli.js`: npm's directory is two up.
        let own = on_path("npm", env)
            .filter(|p| p.ends_with("bin/npm-cli.js"))
            .and_then(|p| Some(p.parent()?.parent()?.join("npmrc")));
        layers.extend(
            own.as_deref()
                .and_then(|p| env.read_config(p))
                .map(|t| npmrc(&t, env)),
        );
    }
    layers
}

/// npm: `registry` and `@scope:registry` as `npm config get` resolves them, without the
/// project's `.npmrc`.
pub fn npm(env: &Env) -> Mirror {
    let mut r = NodeRegistries::default();
    for layer in npm_layers(env, true) {
        r.under(&layer);
    }
    r.mirror("npm_config_registry")
}

/// pnpm: npm's layers (pnpm reads npm's variables and files), then pnpm's own global `rc`
/// (`$XDG_CONFIG_HOME/pnpm/rc`, else `~/.config/pnpm/rc`), which pnpm ranks below them.
pub fn pnpm(env: &Env) -> Mirror {
    let mut r = NodeRegistries::default();
    for layer in npm_layers(env, false) {
        r.under(&layer);
    }
    let rc = config_home(env).map(|d| d.join("pnpm/rc"));
    if let Some(text) = rc.as_deref().and_then(|p| env.read_config(p)) {
        r.under(&npmrc(&text, env));
    }
    r.mirror("npm_config_registry")
}

/// One `.yarnrc` (Yarn 1's lockfile syntax): `key value` lines, either part in double quotes,
/// `#` comments; top-level lines only.
fn yarnrc(text: &str) -> BTreeMap<String, String> {
    let unquote = |s: &str| {
        let s = s.trim();
        s.strip_prefix('"')
            .and_then(|s| s.strip_suffix('"'))
            .unwrap_or(s)
            .to_string()
    };
    let mut out = BTreeMap::new();
    for line in text.lines() {
        if line.starts_with([' ', '\t']) || line.trim_start().starts_with('#') {
            continue;
        }
        let t = line.trim();
        let split = if let Some(rest) = t.strip_prefix('"') {
            rest.find('"').map(|i| i + 2)
        } else {
            t.find(char::is_whitespace)
        };
        if let Some(i) = split.filter(|i| *i < t.len()) {
            out.insert(unquote(&t[..i]), unquote(&t[i..]));
        }
    }
    out
}

/// Yarn 1's files named `name` (`npmrc` or `yarnrc`), in its order: the user's (for root,
/// Yarn's home is `/usr/local/share`), the global one under the node prefix, then for root the
/// real home's. `userconfig` is npm's setting (the `.npmrc` files only).
fn yarn_files(env: &Env, name: &str, userconfig: Option<&String>) -> Vec<PathBuf> {
    let root = h5i_sys::ids::euid() == 0;
    let home = env.var("HOME").map(PathBuf::from);
    let yarn_home = if root {
        Some(PathBuf::from("/usr/local/share"))
    } else {
        home.clone()
    };
    let mut files: Vec<PathBuf> = userconfig
        .map(|p| home_path(p, env))
        .or_else(|| yarn_home.as_ref().map(|h| h.join(format!(".{name}"))))
        .into_iter()
        .collect();
    files.extend(node_prefix(env).map(|p| p.join("etc").join(name)));
    if root {
        files.extend(home.map(|h| h.join(format!(".{name}"))));
    }
    files
}

/// Yarn 1: npm's `registry` first (its `npm_config_*` variables, then the `.npmrc` files Yarn
/// reads), else Yarn's own (`YARN_REGISTRY` and the other `yarn_*` variables, then the
/// `.yarnrc` files), else Yarn's default; the project's files left out (module doc).
pub fn yarn(env: &Env) -> Mirror {
    let npm_vars = npm_env(env);
    let mut npm_side = NodeRegistries::default();
    npm_side.under(&npm_vars);
    for file in yarn_files(env, "npmrc", npm_vars.get("userconfig")) {
        if let Some(text) = env.read_config(&file) {
            npm_side.under(&npmrc(&text, env));
        }
    }
    let mut yarn_side = NodeRegistries::default();
    let yarn_vars: BTreeMap<String, String> = env
        .prefixed("yarn_")
        .map(|(k, v)| {
            (
                k.to_ascii_lowercase().replace("__", ".").replace('_', "-"),
                v.to_string(),
            )
        })
        .collect();
    yarn_side.under(&yarn_vars);
    for file in yarn_files(env, "yarnrc", None) {
        if let Some(text) = env.read_config(&file) {
            yarn_side.under(&yarnrc(&text));
        }
    }
    let mut m = npm_side.mirror("npm_config_registry");
    if npm_side.default.is_none() {
        if let Some(url) = &yarn_side.default {
            m.replaces_default = true;
            m.env.push(format!("YARN_REGISTRY={url}"));
            m.hosts.extend(host_port(url));
        }
    }
    for (scope, url) in &yarn_side.scoped {
        if !npm_side.scoped.contains_key(scope) {
            m.env.push(format!("npm_config_{scope}:registry={url}"));
            m.hosts.extend(host_port(url));
        }
    }
    dedup(&mut m.hosts);
    m
}

/// `host:port` of a cargo index or source URL (`sparse+https://...`, `registry+...`,
/// `git+https://...` or plain http(s)).
fn cargo_host(url: &str) -> Option<String> {
    let url = ["sparse+", "registry+", "git+"]
        .iter()
        .find_map(|p| url.strip_prefix(p))
        .unwrap_or(url);
    host_port(url)
}

/// The variable cargo reads `registries.<name>.index` from.
fn cargo_index_var(name: &str) -> String {
    format!(
        "CARGO_REGISTRIES_{}_INDEX",
        name.to_ascii_uppercase().replace('-', "_")
    )
}

/// The longest chain of `replace-with` followed.
const REPLACE_HOPS: usize = 8;

/// cargo: from `$CARGO_HOME/config.toml` (cargo's `config` when that exists instead; the home
/// `$CARGO_HOME`, else `~/.cargo`), crates.io's source replacement (the `replace-with` chain
/// to a `registry` or `git` source) and the `[registries]` indexes, then every
/// `CARGO_REGISTRIES_<NAME>_INDEX` variable (cargo's precedence: the variable over the file).
/// With no replacement, crates.io's own hosts stay the default. The box gets the registries as
/// those variables, and the replacement as a `config.toml` in its `CARGO_HOME` (cargo reads a
/// `[source]` table from no variable).
pub fn cargo(env: &Env) -> Mirror {
    let home = env
        .var("CARGO_HOME")
        .filter(|h| h.starts_with('/'))
        .map(PathBuf::from)
        .or_else(|| env.var("HOME").map(|h| PathBuf::from(h).join(".cargo")));
    let doc = home
        .and_then(|h| {
            let legacy = h.join("config");
            let file = if legacy.is_file() {
                legacy
            } else {
                h.join("config.toml")
            };
            env.read_config(&file)
        })
        .and_then(|t| t.parse::<toml::Table>().ok())
        .unwrap_or_default();
    let mut m = Mirror::default();
    let mut indexes: BTreeMap<String, String> = BTreeMap::new();
    if let Some(regs) = doc.get("registries").and_then(toml::Value::as_table) {
        for (name, reg) in regs {
            if let Some(url) = reg.get("index").and_then(toml::Value::as_str) {
                indexes.insert(cargo_index_var(name), url.to_string());
            }
        }
    }
    for (rest, url) in env.prefixed("CARGO_REGISTRIES_") {
        if rest.ends_with("_INDEX") && rest.len() > "_INDEX".len() {
            indexes.insert(format!("CARGO_REGISTRIES_{rest}"), url.to_string());
        }
    }
    let sources = doc.get("source").and_then(toml::Value::as_table);
    let mut chain = toml::Table::new();
    let mut name = "crates-io".to_string();
    for _ in 0..REPLACE_HOPS {
        let Some(src) = sources
            .and_then(|s| s.get(&name))
            .and_then(toml::Value::as_table)
        else {
            break;
        };
        chain.insert(name.clone(), toml::Value::Table(src.clone()));
        match src.get("replace-with").and_then(toml::Value::as_str) {
            Some(next) => name = next.to_string(),
            None => {
                let url = ["registry", "git"]
                    .iter()
                    .find_map(|k| src.get(*k).and_then(toml::Value::as_str));
                if let Some(host) = url.and_then(cargo_host) {
                    m.replaces_default = true;
                    m.hosts.push(host);
                    let mut config = toml::Table::new();
                    config.insert("source".into(), toml::Value::Table(chain));
                    m.data_files.push(("config.toml", config.to_string()));
                }
                break;
            }
        }
    }
    for (var, url) in indexes {
        m.hosts.extend(cargo_host(&url));
        m.env.push(format!("{var}={url}"));
    }
    dedup(&mut m.hosts);
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A config file holding `text` (kept while the directory lives) and its path.
    fn config_file(text: &str) -> (tempfile::TempDir, String) {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("config");
        std::fs::write(&path, text).unwrap();
        let path = path.display().to_string();
        (d, path)
    }

    fn table(pairs: &[(&str, &str)]) -> Env {
        Env::from_pairs(pairs, &[])
    }

    /// A directory holding `files` (relative path, text), kept while it lives.
    fn tree(files: &[(&str, &str)]) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        for (rel, text) in files {
            let p = d.path().join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        d
    }

    fn at(d: &tempfile::TempDir, rel: &str) -> String {
        d.path().join(rel).display().to_string()
    }

    #[test]
    fn npm_reads_its_variables_and_the_users_and_global_files_never_a_credential() {
        let d = tree(&[
            (
                "user.npmrc",
                "; the user's
registry = \"https://mirror.test/npm/\"
\
                 @corp:registry=https://corp.test:8443/ ; inline comment
\
                 //mirror.test/:_authToken=${TOKEN}
[section]
registry=https://ignored.test/
",
            ),
            (
                "global.npmrc",
                "registry=https://global.test/
@other:registry=${OTHER_REG}
",
            ),
        ]);
        let (user, global) = (at(&d, "user.npmrc"), at(&d, "global.npmrc"));
        let env = table(&[
            ("npm_config_userconfig", &user),
            ("NPM_CONFIG_GLOBALCONFIG", &global),
            ("OTHER_REG", "http://other.test:8080/"),
            ("TOKEN", "secret-token"),
        ]);
        let m = npm(&env);
        assert_eq!(
            m.hosts,
            ["mirror.test:443", "corp.test:8443", "other.test:8080"]
        );
        assert!(m.replaces_default);
        assert_eq!(
            m.env,
            [
                "npm_config_registry=https://mirror.test/npm/",
                "npm_config_@corp:registry=https://corp.test:8443/",
                "npm_config_@other:registry=http://other.test:8080/",
            ]
        );
        assert!(!m.env.iter().any(|e| e.contains("secret")), "{m:?}");
        // The variable is above the files, whatever the case of its name.
        let env = table(&[
            ("npm_config_userconfig", &user),
            ("Npm_Config_Registry", "http://registry.test:8080/"),
        ]);
        assert_eq!(npm(&env).hosts, ["registry.test:8080", "corp.test:8443"]);
        // Nothing set: nothing for the box, and the default stays.
        assert_eq!(npm(&table(&[("HOME", "/nonexistent")])), Mirror::default());
    }

    #[test]
    fn a_config_file_others_may_write_is_not_trusted() {
        use std::os::unix::fs::PermissionsExt;
        let d = tree(&[("user.npmrc", "registry=https://planted.test/\n")]);
        let user = at(&d, "user.npmrc");
        let env = table(&[("npm_config_userconfig", &user)]);
        assert_eq!(npm(&env).hosts, ["planted.test:443"]);
        std::fs::set_permissions(&user, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert_eq!(npm(&env), Mirror::default());
    }

    #[test]
    fn a_config_file_in_the_project_is_never_read_whichever_variable_names_it() {
        let d = tree(&[
            ("repo/.cargo-home/config.toml", "[source.crates-io]\nreplace-with = \"m\"\n[source.m]\nregistry = \"sparse+https://evil.test/index/\"\n"),
            ("repo/.npmrc", "registry=https://evil.test/\n"),
            ("repo/node_modules/.bin/node", ""),
            ("repo/node_modules/etc/npmrc", "registry=https://evil.test/\n"),
            ("home/.npmrc", "registry=https://mirror.test/\n"),
        ]);
        let repo = d.path().join("repo");
        let in_project = |pairs: &[(&str, &str)]| Env::from_pairs(pairs, &[&repo]);
        let cargo_home = at(&d, "repo/.cargo-home");
        assert!(cargo(&table(&[("CARGO_HOME", &cargo_home)]))
            .hosts
            .contains(&"evil.test:443".to_string()));
        assert_eq!(
            cargo(&in_project(&[("CARGO_HOME", &cargo_home)])),
            Mirror::default()
        );
        let npmrc = at(&d, "repo/.npmrc");
        assert_eq!(
            npm(&in_project(&[
                ("npm_config_userconfig", &npmrc),
                ("HOME", "/nonexistent")
            ])),
            Mirror::default()
        );
        // A `node` on PATH inside the project names a global npmrc there: not read either; the
        // user's own still is.
        let bin = at(&d, "repo/node_modules/.bin");
        let home = at(&d, "home");
        let m = npm(&in_project(&[("PATH", &bin), ("HOME", &home)]));
        assert_eq!(m.hosts, ["mirror.test:443"]);
        // Through a symlink into the project too.
        let link = d.path().join("link");
        std::os::unix::fs::symlink(&repo, &link).unwrap();
        let via = format!("{}/.cargo-home", link.display());
        assert_eq!(
            cargo(&in_project(&[("CARGO_HOME", &via)])),
            Mirror::default()
        );
    }

    #[test]
    fn pnpm_reads_npms_settings_then_its_own_rc() {
        let d = tree(&[("cfg/pnpm/rc", "registry=https://pnpm-mirror.test/\n")]);
        let cfg = at(&d, "cfg");
        let env = table(&[("XDG_CONFIG_HOME", &cfg), ("HOME", "/nonexistent")]);
        assert_eq!(pnpm(&env).hosts, ["pnpm-mirror.test:443"]);
        let env = table(&[
            ("XDG_CONFIG_HOME", &cfg),
            ("npm_config_registry", "http://registry.test:8080/"),
        ]);
        let m = pnpm(&env);
        assert_eq!(m.hosts, ["registry.test:8080"]);
        assert_eq!(m.env, ["npm_config_registry=http://registry.test:8080/"]);
    }

    #[test]
    fn yarn_takes_npms_registry_first_then_its_own() {
        let d = tree(&[
            (
                "home/.yarnrc",
                "# yarn\nregistry \"https://yarn-mirror.test/\"\n\"@corp:registry\" \"https://corp.test/\"\n",
            ),
            ("home/.npmrc", "registry=https://npm-mirror.test/\n"),
        ]);
        let home = at(&d, "home");
        let m = yarn(&table(&[("HOME", &home)]));
        assert_eq!(m.hosts, ["npm-mirror.test:443", "corp.test:443"]);
        std::fs::remove_file(d.path().join("home/.npmrc")).unwrap();
        let m = yarn(&table(&[("HOME", &home)]));
        assert_eq!(m.hosts, ["yarn-mirror.test:443", "corp.test:443"]);
        assert!(m.replaces_default);
        assert!(m
            .env
            .contains(&"YARN_REGISTRY=https://yarn-mirror.test/".to_string()));
        let m = yarn(&table(&[
            ("HOME", &home),
            ("YARN_REGISTRY", "http://registry.test:8080"),
        ]));
        assert_eq!(m.hosts[0], "registry.test:8080");
    }

    #[test]
    fn cargo_reads_the_source_replacement_and_the_registries() {
        let d = tree(&[(
            "cargo/config.toml",
            "[source.crates-io]\nreplace-with = \"corp\"\n\
             [source.corp]\nreplace-with = \"mirror\"\n\
             [source.mirror]\nregistry = \"sparse+https://mirror.test/index/\"\n\
             [registries.my-reg]\nindex = \"https://git.test/index.git\"\n\
             [registries.my-reg.credential]\ntoken = \"secret\"\n",
        )]);
        let home = at(&d, "cargo");
        let m = cargo(&table(&[
            ("CARGO_HOME", &home),
            (
                "CARGO_REGISTRIES_OTHER_INDEX",
                "http://registry.test:8080/index.git",
            ),
        ]));
        assert_eq!(
            m.hosts,
            ["mirror.test:443", "git.test:443", "registry.test:8080"]
        );
        assert!(m.replaces_default);
        assert_eq!(
            m.env,
            [
                "CARGO_REGISTRIES_MY_REG_INDEX=https://git.test/index.git",
                "CARGO_REGISTRIES_OTHER_INDEX=http://registry.test:8080/index.git",
            ]
        );
        let (name, config) = &m.data_files[0];
        assert_eq!(*name, "config.toml");
        let config: toml::Table = config.parse().unwrap();
        assert_eq!(
            config["source"]["crates-io"]["replace-with"].as_str(),
            Some("corp")
        );
        assert_eq!(
            config["source"]["mirror"]["registry"].as_str(),
            Some("sparse+https://mirror.test/index/")
        );
        assert!(!m.data_files[0].1.contains("secret"));
        // No configuration: crates.io's own hosts stay the default.
        assert_eq!(
            cargo(&table(&[("HOME", "/nonexistent")])),
            Mirror::default()
        );
    }

    #[test]
    fn npm_expands_variables_as_npm_does() {
        let env = table(&[("A", "x")]);
        assert_eq!(expand("${A}/${B}/${B?}/$A", &env), "x/${B}//$A");
    }

    #[test]
    fn host_port_takes_the_authority_and_the_schemes_port() {
        assert_eq!(
            host_port("https://u:p@Mirror.Example.com/simple").as_deref(),
            Some("mirror.example.com:443")
        );
        assert_eq!(
            host_port("http://registry.test:8080/simple").as_deref(),
            Some("registry.test:8080")
        );
        assert_eq!(host_port("direct"), None);
        assert_eq!(host_port("file:///srv/goproxy"), None);
        assert_eq!(host_port("https:///x"), None);
    }

    #[test]
    fn pip_reads_the_config_file_and_the_variables_win() {
        let (_dir, conf) = config_file(
            "[global]\nindex_url = https://global.example.com/simple\ntimeout = 60\n\
             [download]\nindex-url = https://mirror.example.com/pypi/simple\n\
             extra-index-url =\n  https://extra.example.com/simple\n  http://other.test:8080/simple\n\
             [install]\nindex-url = https://ignored.example.com/simple\n",
        );
        let m = pip(&table(&[("PIP_CONFIG_FILE", &conf)]));
        assert_eq!(
            m.hosts,
            [
                "mirror.example.com:443",
                "extra.example.com:443",
                "other.test:8080"
            ]
        );
        assert!(m
            .env
            .contains(&"PIP_INDEX_URL=https://mirror.example.com/pypi/simple".to_string()));
        let m = pip(&table(&[
            ("PIP_CONFIG_FILE", &conf),
            ("PIP_INDEX_URL", "http://registry.test:8080/simple"),
            ("PIP_TRUSTED_HOST", "registry.test"),
        ]));
        assert_eq!(m.hosts[0], "registry.test:8080");
        assert!(m
            .env
            .contains(&"PIP_TRUSTED_HOST=registry.test".to_string()));
        assert_eq!(
            pip(&table(&[("PIP_CONFIG_FILE", "/dev/null")])),
            Mirror::default()
        );
    }

    #[test]
    fn uv_reads_uv_toml_and_the_variables_win_as_pips_settings() {
        let (_dir, conf) = config_file(
            "extra-index-url = [\"https://extra.example.com/simple\"]\n\
             [[index]]\nname = \"corp\"\nurl = \"https://mirror.example.com/simple\"\ndefault = true\n",
        );
        let m = uv(&table(&[("UV_CONFIG_FILE", &conf)]));
        assert_eq!(m.hosts, ["mirror.example.com:443", "extra.example.com:443"]);
        assert_eq!(
            m.env,
            [
                "PIP_INDEX_URL=https://mirror.example.com/simple",
                "PIP_EXTRA_INDEX_URL=https://extra.example.com/simple"
            ]
        );
        let m = uv(&table(&[
            ("UV_CONFIG_FILE", &conf),
            ("UV_DEFAULT_INDEX", "http://registry.test:8080/simple"),
            ("UV_INDEX", "other=https://other.example.com/simple"),
        ]));
        assert_eq!(
            (m.hosts, m.env),
            (
                vec![
                    "registry.test:8080".to_string(),
                    "extra.example.com:443".into(),
                    "other.example.com:443".into(),
                ],
                vec![
                    "PIP_INDEX_URL=http://registry.test:8080/simple".to_string(),
                    "PIP_EXTRA_INDEX_URL=https://extra.example.com/simple https://other.example.com/simple".into(),
                    "PIP_TRUSTED_HOST=registry.test:8080".into(),
                ]
            )
        );
        assert_eq!(
            uv(&table(&[("UV_CONFIG_FILE", &conf), ("UV_NO_CONFIG", "1")])),
            Mirror::default()
        );
    }

    #[test]
    fn go_reads_the_env_file_and_the_variable_wins() {
        let (_dir, env) = config_file(
            "GOPROXY=https://goproxy.example.com|https://backup.example.com,direct\nGOFLAGS=-x\n",
        );
        let m = go(&table(&[("GOENV", &env)]));
        assert_eq!(
            m.hosts,
            ["goproxy.example.com:443", "backup.example.com:443"]
        );
        assert_eq!(
            m.env,
            ["GOPROXY=https://goproxy.example.com|https://backup.example.com,direct"]
        );
        let m = go(&table(&[
            ("GOENV", &env),
            ("GOPROXY", "http://registry.test:8080"),
            ("GOSUMDB", "off"),
        ]));
        assert_eq!(m.hosts, ["registry.test:8080"]);
        assert_eq!(m.env, ["GOPROXY=http://registry.test:8080", "GOSUMDB=off"]);
        assert_eq!(go(&table(&[("GOENV", "off")])), Mirror::default());
    }
}
