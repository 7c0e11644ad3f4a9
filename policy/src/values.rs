//! The shape of single policy values: hosts, `host:port` destinations, ports, variable names,
//! profile and service names, filesystem paths.
//!
//! Owns every "is this one value well formed" rule, so the env file and the stored policy accept
//! exactly the same values. Must never: resolve a name, look at the filesystem, or expand a
//! path against the real machine (`$WORK` and `$HOME` stay symbolic so a digest does not depend
//! on where a box lives).
//!
//! Guarded by the tests below.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A problem with one value: what is wrong, and how to mend it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValueProblem {
    /// What is wrong.
    pub what: String,
    /// How to mend it.
    pub mend: String,
}

fn problem(what: impl Into<String>, mend: impl Into<String>) -> ValueProblem {
    ValueProblem {
        what: what.into(),
        mend: mend.into(),
    }
}

/// The port an egress entry without one gets.
pub const DEFAULT_EGRESS_PORT: u16 = 443;

/// One allowed egress destination.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HostPort {
    /// Lowercase DNS name (or dotted IPv4 address).
    pub host: String,
    /// TCP port.
    pub port: u16,
}

impl fmt::Display for HostPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

impl FromStr for HostPort {
    type Err = ValueProblem;

    /// Parse `host` or `host:port` (default port 443). Refuses schemes, paths, user info,
    /// wildcards, spaces, IPv6 literals and bad ports, each with its own mend.
    fn from_str(entry: &str) -> Result<Self, Self::Err> {
        const SHAPE: &str = "write the bare host, optionally with a port: \"api.github.com\" or \"api.github.com:443\"";
        if entry.is_empty() {
            return Err(problem("an egress entry is empty", SHAPE));
        }
        if entry.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(problem(
                format!("egress entry {entry:?} contains whitespace"),
                SHAPE,
            ));
        }
        if entry.contains("://") {
            return Err(problem(
                format!("egress entry `{entry}` has a URL scheme; egress names a destination, not a URL"),
                SHAPE,
            ));
        }
        if entry.contains('/') {
            return Err(problem(
                format!("egress entry `{entry}` has a path; egress is granted per host and port, not per path"),
                SHAPE,
            ));
        }
        if entry.contains('@') {
            return Err(problem(
                format!("egress entry `{entry}` has user info"),
                SHAPE,
            ));
        }
        if entry.contains('*') {
            return Err(problem(
                format!("egress entry `{entry}` is a wildcard; each host is granted by name"),
                "list every host the box needs by its full name",
            ));
        }
        if entry.contains('[') || entry.matches(':').count() > 1 {
            return Err(problem(
                format!(
                    "egress entry `{entry}` looks like an IPv6 literal, which is not supported"
                ),
                "name the host by DNS name or IPv4 address",
            ));
        }
        let (host, port) = match entry.split_once(':') {
            Some((h, p)) => (
                h,
                parse_port_text(p)
                    .map_err(|what| problem(format!("egress entry `{entry}`: {what}"), SHAPE))?,
            ),
            None => (entry, DEFAULT_EGRESS_PORT),
        };
        let host = normalize_host(host)
            .map_err(|what| problem(format!("egress entry `{entry}`: {what}"), SHAPE))?;
        Ok(HostPort { host, port })
    }
}

impl Serialize for HostPort {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for HostPort {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse()
            .map_err(|p: ValueProblem| serde::de::Error::custom(p.what))
    }
}

fn parse_port_text(p: &str) -> Result<u16, String> {
    if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("port `{p}` is not a number"));
    }
    match p.parse::<u32>() {
        Ok(n) if (1..=65535).contains(&n) => Ok(n as u16),
        _ => Err(format!("port `{p}` is outside 1-65535")),
    }
}

/// Validate a TCP port given as a TOML integer.
pub fn port_from_int(n: i64) -> Result<u16, ValueProblem> {
    u16::try_from(n).ok().filter(|p| *p != 0).ok_or_else(|| {
        problem(
            format!("port {n} is outside 1-65535"),
            "give a port from 1 to 65535",
        )
    })
}

/// Check a DNS host name (or dotted IPv4) and lowercase it. No port, no trailing dot.
pub fn normalize_host(host: &str) -> Result<String, String> {
    if host.is_empty() {
        return Err("the host is empty".to_owned());
    }
    if host.len() > 253 {
        return Err("the host is longer than 253 characters".to_owned());
    }
    let lower = host.to_ascii_lowercase();
    for label in lower.split('.') {
        if label.is_empty() {
            return Err(format!(
                "host `{host}` has an empty label (a leading, trailing or doubled dot)"
            ));
        }
        if label.len() > 63 {
            return Err(format!(
                "host `{host}` has a label longer than 63 characters"
            ));
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        {
            return Err(format!(
                "host `{host}` has a character outside a-z, 0-9, '-' and '.'"
            ));
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(format!(
                "host `{host}` has a label starting or ending with '-'"
            ));
        }
    }
    Ok(lower)
}

/// Check an image reference: non-empty, no whitespace or control characters. (Whether it is
/// pulled is the runtime's business; runs never pull.)
pub fn check_image(image: &str) -> Result<(), ValueProblem> {
    if image.is_empty() || image.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(problem(
            format!("image {image:?} is empty or contains whitespace"),
            "name a pre-pulled image, like \"localhost/h5i-base:latest\"",
        ));
    }
    Ok(())
}

/// Whether `name` is an environment variable name h5i accepts: `[A-Z_][A-Z0-9_]*`.
pub fn is_env_var_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    matches!(bytes.next(), Some(b'A'..=b'Z' | b'_'))
        && bytes.all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
}

/// Mend text for a bad variable name.
pub const ENV_VAR_MEND: &str = "use an upper-case variable name matching [A-Z_][A-Z0-9_]*";

/// Whether `name` is a profile name: `[a-z0-9][a-z0-9_-]*`, at most 63 characters.
pub fn is_profile_name(name: &str) -> bool {
    is_lower_name(name, 63)
}

/// Whether `name` is a service name: `[a-z0-9][a-z0-9_-]{0,62}`.
pub fn is_service_name(name: &str) -> bool {
    is_lower_name(name, 63)
}

fn is_lower_name(name: &str, max: usize) -> bool {
    let mut bytes = name.bytes();
    name.len() <= max
        && matches!(bytes.next(), Some(b'a'..=b'z' | b'0'..=b'9'))
        && bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

/// The symbolic root for the box's workspace.
pub const WORK: &str = "$WORK";
/// The symbolic root for the box's own HOME (`~` is written as this).
pub const HOME: &str = "$HOME";

/// Normalize a filesystem grant: absolute, or rooted at `$WORK`, `$HOME` or `~` (which becomes
/// `$HOME`). Collapses `//` and `.`, drops a trailing `/`, refuses `..`, other variables and
/// relative paths.
pub fn normalize_fs_path(path: &str) -> Result<String, ValueProblem> {
    const MEND: &str = "write an absolute path, or one rooted at $WORK or ~ (for example \"$WORK/build\" or \"~/.cache\")";
    if path.is_empty() {
        return Err(problem("a path is empty", MEND));
    }
    if path.chars().any(|c| c.is_control()) {
        return Err(problem(
            format!("path {path:?} contains a control character"),
            MEND,
        ));
    }
    let (root, rest) = if let Some(rest) = path.strip_prefix('/') {
        ("", rest)
    } else if let Some(rest) = strip_root(path, WORK) {
        (WORK, rest)
    } else if let Some(rest) = strip_root(path, HOME) {
        (HOME, rest)
    } else if let Some(rest) = strip_root(path, "~") {
        (HOME, rest)
    } else if path.starts_with('$') {
        return Err(problem(
            format!("path `{path}` uses a variable other than $WORK or $HOME"),
            MEND,
        ));
    } else if path.starts_with('~') {
        return Err(problem(
            format!("path `{path}` names another user's home; only the box's own ~ exists"),
            MEND,
        ));
    } else {
        return Err(problem(
            format!("path `{path}` is relative, and not rooted at $WORK"),
            MEND,
        ));
    };
    let mut parts = Vec::new();
    for part in rest.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                return Err(problem(
                    format!("path `{path}` contains `..`"),
                    "write the path without `..` components",
                ))
            }
            p => parts.push(p),
        }
    }
    let joined = parts.join("/");
    Ok(match (root, joined.is_empty()) {
        ("", _) => format!("/{joined}"),
        (r, true) => r.to_owned(),
        (r, false) => format!("{r}/{joined}"),
    })
}

/// `path` with `root` removed, when `path` is exactly `root` or `root/...`.
fn strip_root<'a>(path: &'a str, root: &str) -> Option<&'a str> {
    let rest = path.strip_prefix(root)?;
    (rest.is_empty() || rest.starts_with('/')).then_some(rest)
}

/// Whether normalized `inner` is `outer` or lies beneath it. Paths under different symbolic
/// roots are never related.
pub fn path_within(inner: &str, outer: &str) -> bool {
    if inner == outer || outer == "/" && inner.starts_with('/') {
        return true;
    }
    inner
        .strip_prefix(outer)
        .is_some_and(|rest| rest.starts_with('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn egress_entries_default_to_443_and_lowercase() {
        let hp: HostPort = "API.GitHub.com".parse().unwrap();
        assert_eq!(
            hp,
            HostPort {
                host: "api.github.com".into(),
                port: 443
            }
        );
        let hp: HostPort = "registry.npmjs.org:8443".parse().unwrap();
        assert_eq!(hp.port, 8443);
        assert_eq!(hp.to_string(), "registry.npmjs.org:8443");
        let ip: HostPort = "198.18.0.1:80".parse().unwrap();
        assert_eq!(ip.host, "198.18.0.1");
    }

    #[test]
    fn malformed_egress_entries_are_refused() {
        for bad in [
            "",
            " api.github.com",
            "api github.com",
            "https://api.github.com",
            "api.github.com/x",
            "api.github.com:",
            "api.github.com:0",
            "api.github.com:65536",
            "api.github.com:http",
            "*.github.com",
            "user@host",
            "[::1]:443",
            "::1",
            "api..github.com",
            "api.github.com.",
            "-api.github.com",
            "api_x.com",
        ] {
            assert!(bad.parse::<HostPort>().is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn names_follow_their_patterns() {
        assert!(is_env_var_name("GH_TOKEN"));
        assert!(is_env_var_name("_X1"));
        assert!(!is_env_var_name("gh_token"));
        assert!(!is_env_var_name("1X"));
        assert!(!is_env_var_name(""));
        assert!(!is_env_var_name("A-B"));
        assert!(is_profile_name("review"));
        assert!(is_profile_name("0x_a-b"));
        assert!(!is_profile_name("-x"));
        assert!(!is_profile_name("Review"));
        assert!(!is_profile_name(""));
        assert!(is_service_name("web"));
        assert!(!is_service_name(&"a".repeat(64)));
        assert!(is_service_name(&"a".repeat(63)));
    }

    #[test]
    fn paths_are_normalized_and_kept_symbolic() {
        assert_eq!(normalize_fs_path("/usr/").unwrap(), "/usr");
        assert_eq!(normalize_fs_path("//usr/./lib").unwrap(), "/usr/lib");
        assert_eq!(normalize_fs_path("/").unwrap(), "/");
        assert_eq!(normalize_fs_path("$WORK").unwrap(), "$WORK");
        assert_eq!(normalize_fs_path("$WORK/build/").unwrap(), "$WORK/build");
        assert_eq!(normalize_fs_path("~").unwrap(), "$HOME");
        assert_eq!(normalize_fs_path("~/.claude").unwrap(), "$HOME/.claude");
        assert_eq!(normalize_fs_path("$HOME/.codex").unwrap(), "$HOME/.codex");
    }

    #[test]
    fn relative_escaping_and_foreign_paths_are_refused() {
        for bad in [
            "",
            "src",
            "./src",
            "$WORKX",
            "$TMP/x",
            "~root/x",
            "/usr/../etc",
            "$WORK/..",
            "/a\nb",
        ] {
            assert!(normalize_fs_path(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn path_within_respects_component_boundaries() {
        assert!(path_within("/usr/lib", "/usr"));
        assert!(path_within("/usr", "/usr"));
        assert!(!path_within("/usrx", "/usr"));
        assert!(path_within("/etc", "/"));
        assert!(path_within("$WORK/.env", "$WORK"));
        assert!(!path_within("$WORK/x", "/"));
        assert!(!path_within("$HOME/.ssh", "$WORK"));
    }
}
