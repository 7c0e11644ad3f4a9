//! The locked set of a uv or Poetry project (`uv.lock`, `poetry.lock`) as a hashed pip
//! requirements list: one `name==version --hash=...` line per package the lockfile pins from a
//! registry, every hash it records for that package.
//!
//! Owns reading those two lockfiles (TOML, read through the one bounded reader, never following
//! a symlink) and the strict shape of each line: a name, a version and hashes that can only be
//! what PEP 503/440 and the lockfiles allow, so no lockfile can smuggle a pip option (an
//! `--index-url`, a `-r`, a URL) into the list the refresh box downloads.
//!
//! Must never: emit a package the lockfile does not pin with at least one hash (pip's
//! `--require-hashes` would refuse it, but the refusal belongs here, with the package named),
//! or silently leave out a package the project needs (a git, URL or path source is refused:
//! the cache would hold less than the lockfile, and a box would find out offline).
//!
//! Guarded by the unit tests below and `tests/box_cache.rs` (a tampered hash and an injected
//! option, refused).

use std::io::Read;
use std::path::Path;

use super::{CacheError, LOCKFILE_CAP};

/// The file the derived list is written to, in the cache's data directory: what the refresh
/// box downloads, and what a box installs from (`pip install -r`, `uv pip install -r`).
pub const REQUIREMENTS: &str = "h5i-requirements.txt";

/// Which lockfile format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockFormat {
    /// `uv.lock`: `[[package]]` with `source = { registry = URL }`, `wheels`/`sdist` hashes.
    Uv,
    /// `poetry.lock`: `[[package]]` with `files = [{ file, hash }]`, an optional
    /// `[package.source]` (legacy index, or git/url/file/directory).
    Poetry,
}

impl LockFormat {
    /// The lockfile at the project root.
    pub fn file(self) -> &'static str {
        match self {
            LockFormat::Uv => "uv.lock",
            LockFormat::Poetry => "poetry.lock",
        }
    }
}

/// The requirements list of the project rooted at `root`.
pub fn requirements_of(root: &Path, format: LockFormat) -> Result<String, CacheError> {
    let name = format.file();
    let bad = |why: String| CacheError::BadLockfile {
        path: root.join(name),
        why,
    };
    let (mut f, size) = crate::bounded::open_regular(root, Path::new(name), LOCKFILE_CAP)
        .map_err(|skip| bad(skip.to_string()))?;
    let mut text = String::with_capacity(size as usize);
    f.read_to_string(&mut text)
        .map_err(|e| bad(format!("unreadable ({e})")))?;
    requirements(&text, format).map_err(|why| CacheError::UnlockedPackage { file: name, why })
}

/// The requirements list of lockfile `text`; the refusal says which package and why.
pub fn requirements(text: &str, format: LockFormat) -> Result<String, String> {
    let doc: toml::Table = text.parse().map_err(|e| format!("not TOML ({e})"))?;
    let packages = match doc.get("package") {
        None => return Ok(String::new()),
        Some(toml::Value::Array(p)) => p,
        Some(_) => return Err("its `package` is not an array of tables".into()),
    };
    let mut out = String::new();
    for p in packages {
        let p = p
            .as_table()
            .ok_or("a `package` entry is not a table".to_string())?;
        let name = field(p, "name")?;
        let version = field(p, "version")?;
        if !is_name(name) || !is_version(version) {
            return Err(format!(
                "package {:?} {:?} is not a plain name and version",
                name.escape_debug().to_string(),
                version.escape_debug().to_string()
            ));
        }
        let hashes = match format {
            LockFormat::Uv => match uv_source(p, name)? {
                Fetched::Registry => uv_hashes(p),
                Fetched::Local => continue,
            },
            LockFormat::Poetry => {
                poetry_source(p, name)?;
                poetry_hashes(p)
            }
        };
        if hashes.is_empty() {
            return Err(format!("package {name} {version} is pinned with no hash"));
        }
        out.push_str(&format!("{name}=={version}"));
        for h in hashes {
            if !is_hash(h) {
                return Err(format!(
                    "package {name} {version} has a malformed hash {:?}",
                    h.escape_debug().to_string()
                ));
            }
            out.push_str(" --hash=");
            out.push_str(h);
        }
        out.push('\n');
    }
    Ok(out)
}

fn field<'a>(p: &'a toml::Table, key: &str) -> Result<&'a str, String> {
    p.get(key)
        .and_then(toml::Value::as_str)
        .ok_or_else(|| format!("a package has no string `{key}`"))
}

/// Where a uv package comes from, as far as the cache is concerned.
enum Fetched {
    /// A registry: downloaded into the cache.
    Registry,
    /// The project itself or a workspace member (virtual, editable, directory): already in the
    /// workspace, nothing to fetch.
    Local,
}

fn uv_source(p: &toml::Table, name: &str) -> Result<Fetched, String> {
    let source = p
        .get("source")
        .and_then(toml::Value::as_table)
        .ok_or_else(|| format!("package {name} has no source"))?;
    let kind = source.keys().next().map(String::as_str).unwrap_or("");
    match kind {
        "registry" => Ok(Fetched::Registry),
        "virtual" | "editable" | "directory" => Ok(Fetched::Local),
        other => Err(format!(
            "package {name} comes from a `{}` source, which the cache cannot hold offline",
            other.escape_debug()
        )),
    }
}

fn uv_hashes(p: &toml::Table) -> Vec<&str> {
    let wheels = p
        .get("wheels")
        .and_then(toml::Value::as_array)
        .into_iter()
        .flatten();
    let sdist = p.get("sdist").into_iter();
    wheels
        .chain(sdist)
        .filter_map(|w| w.get("hash").and_then(toml::Value::as_str))
        .collect()
}

fn poetry_source(p: &toml::Table, name: &str) -> Result<(), String> {
    let Some(source) = p.get("source").and_then(toml::Value::as_table) else {
        return Ok(());
    };
    match source.get("type").and_then(toml::Value::as_str) {
        Some("legacy") | None => Ok(()),
        Some(other) => Err(format!(
            "package {name} comes from a `{}` source, which the cache cannot hold offline",
            other.escape_debug()
        )),
    }
}

fn poetry_hashes(p: &toml::Table) -> Vec<&str> {
    p.get("files")
        .and_then(toml::Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|f| f.get("hash").and_then(toml::Value::as_str))
        .collect()
}

/// A PEP 503 project name as the lockfiles write it: letters, digits, `.`, `_`, `-`, starting
/// and ending with a letter or digit.
fn is_name(s: &str) -> bool {
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    s.len() <= 200
        && edge(s.chars().next())
        && edge(s.chars().last())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

/// A PEP 440 version's characters (epoch `!`, local `+`), starting with a digit.
fn is_version(s: &str) -> bool {
    s.len() <= 100
        && s.starts_with(|c: char| c.is_ascii_digit())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '!' | '+' | '_' | '-'))
}

/// `sha256:`/`sha384:`/`sha512:` and that many lowercase hex digits.
fn is_hash(s: &str) -> bool {
    let Some((algo, hex)) = s.split_once(':') else {
        return false;
    };
    let len = match algo {
        "sha256" => 64,
        "sha384" => 96,
        "sha512" => 128,
        _ => return false,
    };
    hex.len() == len
        && hex
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    const H0: &str = "sha256:d02bba3a4bb2d4c608cb0519e7ff5a0d50dd001d99c439d6bd3431f3f12c077a";
    const H1: &str = "sha256:2bbf96d6cce0f15bff75d3b1786cff428defab546d714684a8b433cc97f81192";

    fn uv_lock(name: &str, hash: &str) -> String {
        format!(
            "version = 1\n\n[[package]]\nname = \"app\"\nversion = \"0.1.0\"\nsource = {{ virtual = \".\" }}\n\n\
             [[package]]\nname = \"{name}\"\nversion = \"1.0.0\"\nsource = {{ registry = \"http://registry.test/simple\" }}\n\
             sdist = {{ url = \"http://registry.test/a.tar.gz\", hash = \"{H1}\" }}\n\
             wheels = [{{ url = \"http://registry.test/a.whl\", hash = \"{hash}\" }}]\n"
        )
    }

    #[test]
    fn a_uv_lock_becomes_one_hashed_line_per_registry_package() {
        assert_eq!(
            requirements(&uv_lock("h5i-fixture-000", H0), LockFormat::Uv).unwrap(),
            format!("h5i-fixture-000==1.0.0 --hash={H0} --hash={H1}\n")
        );
    }

    #[test]
    fn a_poetry_lock_becomes_one_hashed_line_per_package() {
        let text = format!(
            "[[package]]\nname = \"h5i-fixture-000\"\nversion = \"1.0.0\"\n\
             files = [\n    {{file = \"a.whl\", hash = \"{H0}\"}},\n]\n\n\
             [package.source]\ntype = \"legacy\"\nurl = \"http://registry.test/simple\"\nreference = \"x\"\n\n\
             [metadata]\nlock-version = \"2.0\"\n"
        );
        assert_eq!(
            requirements(&text, LockFormat::Poetry).unwrap(),
            format!("h5i-fixture-000==1.0.0 --hash={H0}\n")
        );
    }

    #[test]
    fn an_option_smuggled_into_a_name_or_hash_is_refused() {
        for (name, hash) in [
            ("x --index-url http://evil.test/simple", H0),
            ("x\\n-r /etc/passwd", H0),
            ("h5i-fixture-000", "sha256:00 --index-url=http://evil.test"),
            ("h5i-fixture-000", "md5:d41d8cd98f00b204e9800998ecf8427e"),
        ] {
            let err = requirements(&uv_lock(name, hash), LockFormat::Uv).unwrap_err();
            assert!(
                err.contains("not a plain name") || err.contains("malformed hash"),
                "{err}"
            );
        }
    }

    #[test]
    fn a_git_or_url_source_or_a_missing_hash_is_refused() {
        let git = "[[package]]\nname = \"x\"\nversion = \"1.0\"\nsource = { git = \"http://evil.test/x.git\" }\n";
        assert!(requirements(git, LockFormat::Uv)
            .unwrap_err()
            .contains("`git` source"));
        let git = "[[package]]\nname = \"x\"\nversion = \"1.0\"\nfiles = []\n[package.source]\ntype = \"git\"\nurl = \"http://evil.test/x.git\"\n";
        assert!(requirements(git, LockFormat::Poetry)
            .unwrap_err()
            .contains("`git` source"));
        let bare = "[[package]]\nname = \"x\"\nversion = \"1.0\"\nfiles = []\n";
        assert!(requirements(bare, LockFormat::Poetry)
            .unwrap_err()
            .contains("no hash"));
    }
}
