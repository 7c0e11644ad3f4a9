//! The registry a refresh box fetches from, as the host's own configuration names it: pip's
//! `index-url` (its config files and `PIP_*` variables), uv's indexes (uv.toml and `UV_*`
//! variables, handed to the box as pip's, which downloads uv's locked set), Go's `GOPROXY` (the variable or Go's
//! env file). The refresh box gets the same settings, so it fills the cache from the mirror the
//! caller's own installs use, and the ready-to-paste profile names that mirror's hosts.
//!
//! Owns reading those settings (files capped at [`CONFIG_CAP`], never executing the tool).
//! Must never: invent a registry: when the host names none, the box gets no setting (the
//! package manager uses its own default) and only the profile text falls back to the hosts of
//! that documented default ([`super::Ecosystem::default_hosts`]).

use std::collections::BTreeMap;
use std::io::Read;
use std::path::PathBuf;

/// The largest config file read (a larger one is ignored, as if absent).
pub const CONFIG_CAP: u64 = 1 << 20;

/// A lookup of the caller's environment (`std::env::var` in h5i; a table in the unit tests).
pub type Lookup<'a> = &'a dyn Fn(&str) -> Option<String>;

/// What the host's configuration says for one ecosystem.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Mirror {
    /// `NAME=VALUE` for the refresh box, pointing the package manager at the mirror.
    pub env: Vec<String>,
    /// The mirror's `host:port`s, for the ready-to-paste profile.
    pub hosts: Vec<String>,
}

/// For an ecosystem whose mirror h5i does not read from the host (npm, pnpm, yarn, cargo): none.
pub fn none(_: Lookup) -> Mirror {
    Mirror::default()
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

fn read_capped(path: &PathBuf) -> Option<String> {
    let f = std::fs::File::open(path).ok()?;
    if !f.metadata().ok()?.is_file() || f.metadata().ok()?.len() > CONFIG_CAP {
        return None;
    }
    let mut text = String::new();
    f.take(CONFIG_CAP).read_to_string(&mut text).ok()?;
    Some(text)
}

fn config_home(var: Lookup) -> Option<PathBuf> {
    var("XDG_CONFIG_HOME")
        .filter(|d| d.starts_with('/'))
        .map(PathBuf::from)
        .or_else(|| var("HOME").map(|h| PathBuf::from(h).join(".config")))
}

/// pip's settings that choose the index, in its config files' spelling.
const PIP_KEYS: &[(&str, &str)] = &[
    ("index-url", "PIP_INDEX_URL"),
    ("extra-index-url", "PIP_EXTRA_INDEX_URL"),
    ("trusted-host", "PIP_TRUSTED_HOST"),
];

/// pip's config files, lowest precedence first (pip's own order: global, user, then
/// `PIP_CONFIG_FILE`; `PIP_CONFIG_FILE=/dev/null` means none at all).
fn pip_files(var: Lookup) -> Vec<PathBuf> {
    let env_file = var("PIP_CONFIG_FILE");
    if env_file.as_deref() == Some("/dev/null") {
        return Vec::new();
    }
    let mut files = vec![
        PathBuf::from("/etc/xdg/pip/pip.conf"),
        PathBuf::from("/etc/pip.conf"),
    ];
    if let Some(home) = var("HOME") {
        files.push(PathBuf::from(home).join(".pip/pip.conf"));
    }
    if let Some(dir) = config_home(var) {
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
pub fn pip(var: Lookup) -> Mirror {
    let mut settings = BTreeMap::new();
    for file in pip_files(var) {
        if let Some(text) = read_capped(&file) {
            pip_ini(&text, &mut settings);
        }
    }
    for (name, env) in PIP_KEYS {
        if let Some(v) = var(env).filter(|v| !v.trim().is_empty()) {
            settings.insert(name, v);
        }
    }
    let mut m = Mirror::default();
    for (name, env) in PIP_KEYS {
        if let Some(v) = settings.get(name) {
            m.env.push(format!("{env}={v}"));
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
fn uv_files(var: Lookup) -> Vec<PathBuf> {
    if var("UV_NO_CONFIG").is_some_and(|v| !v.is_empty() && v != "0" && v != "false") {
        return Vec::new();
    }
    if let Some(file) = var("UV_CONFIG_FILE").filter(|f| !f.is_empty()) {
        return vec![PathBuf::from(file)];
    }
    let mut files = vec![PathBuf::from("/etc/uv/uv.toml")];
    files.extend(config_home(var).map(|d| d.join("uv/uv.toml")));
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
pub fn uv(var: Lookup) -> Mirror {
    let (mut default, mut extra, mut insecure) = (None, Vec::new(), Vec::new());
    for file in uv_files(var) {
        if let Some(text) = read_capped(&file) {
            uv_toml(&text, &mut default, &mut extra, &mut insecure);
        }
    }
    let env = |k: &str| var(k).filter(|v| !v.trim().is_empty());
    if let Some(url) = env("UV_DEFAULT_INDEX").or_else(|| env("UV_INDEX_URL")) {
        default = Some(url);
    }
    for key in ["UV_INDEX", "UV_EXTRA_INDEX_URL"] {
        if let Some(list) = env(key) {
            // UV_INDEX entries may be named: `name=https://...`.
            extra.extend(
                list.split_whitespace()
                    .map(|e| e.split_once('=').map_or(e, |(_, url)| url).to_string()),
            );
        }
    }
    if let Some(list) = env("UV_INSECURE_HOST") {
        insecure.extend(list.split_whitespace().map(str::to_string));
    }
    let mut m = Mirror::default();
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
pub fn go(var: Lookup) -> Mirror {
    let mut settings = BTreeMap::new();
    let file = match var("GOENV") {
        Some(f) if f == "off" => None,
        Some(f) => Some(PathBuf::from(f)),
        None => config_home(var).map(|d| d.join("go/env")),
    };
    if let Some(text) = file.as_ref().and_then(read_capped) {
        for line in text.lines() {
            if let Some((k, v)) = line.split_once('=') {
                if let Some(key) = GO_KEYS.iter().find(|key| **key == k.trim()) {
                    settings.insert(*key, v.trim().to_string());
                }
            }
        }
    }
    for key in GO_KEYS {
        if let Some(v) = var(key).filter(|v| !v.trim().is_empty()) {
            settings.insert(*key, v);
        }
    }
    let mut m = Mirror::default();
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

    fn table(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: BTreeMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| map.get(k).cloned()
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
