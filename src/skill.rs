//! The agent skill this binary carries: `skills/h5i/` (SKILL.md and its reference pages),
//! embedded at build time, so the skill can only describe the binary it came with.
//!
//! Owns the embedded pages ([`FILES`], [`page`]), where `h5i skill install` writes
//! ([`default_target`]: `H5I_SKILL_DIR`, else `~/.claude/skills/h5i`, or `~/.codex/skills/h5i`
//! when `H5I_AGENT=codex`), the install itself ([`install`]), and the read-only copy an agent
//! box gets in its HOME ([`for_box`]: written from these bytes into the box directory, never
//! copied from a host skill directory).
//!
//! Must never: read a skill file at run time (every byte is compiled in), install from inside a
//! box (`H5I_ENV_ID` set), or write through a symlink (the target, a directory in it, or a file).
//!
//! Guarded by the unit tests below (every `h5i` command and flag the pages name exists: in
//! `src/cmd/skill/mod.rs`) and `tests/skill.rs` (the CLI, and the box's read-only copy).

use std::io;
use std::path::{Path, PathBuf};

use h5i_policy::AgentRuntime;
use sha2::{Digest, Sha256};

/// One embedded file of the skill, by its path under `skills/h5i/`.
#[derive(Debug, Clone, Copy)]
pub struct SkillFile {
    /// Path under the skill directory (`SKILL.md`, `reference/policy.md`).
    pub path: &'static str,
    /// Its text.
    pub text: &'static str,
}

/// One [`SkillFile`], its text compiled in from `skills/h5i/<path>`.
macro_rules! embedded {
    ($path:literal) => {
        SkillFile {
            path: $path,
            text: include_str!(concat!("../skills/h5i/", $path)),
        }
    };
}

/// Every file of the skill, SKILL.md first.
pub const FILES: &[SkillFile] = &[
    embedded!("SKILL.md"),
    embedded!("reference/in-a-box.md"),
    embedded!("reference/policy.md"),
    embedded!("reference/proposal.md"),
    embedded!("reference/browser.md"),
];

/// The reference pages' names, as `h5i skill show PAGE` takes them.
pub fn page_names() -> Vec<&'static str> {
    FILES
        .iter()
        .filter_map(|f| f.path.strip_prefix("reference/")?.strip_suffix(".md"))
        .collect()
}

/// Why a skill verb refused.
#[derive(Debug, thiserror::Error)]
pub enum SkillError {
    /// No such reference page.
    #[error("refusing: the skill has no page `{name}`; to fix: pick one of: {}", page_names().join(", "))]
    UnknownPage {
        /// The page asked for.
        name: String,
    },
    /// `install` inside a box.
    #[error("refusing: this process is inside box `{id}` (H5I_ENV_ID is set), where the skill is already in your HOME, read-only; to fix: run `h5i skill install` on the host")]
    InsideBox {
        /// The box's id.
        id: String,
    },
    /// No usable HOME for the default target.
    #[error("refusing: HOME is not set to an absolute path, so there is no default place to install the skill; to fix: pass --target DIR or set H5I_SKILL_DIR")]
    NoHome,
    /// `H5I_SKILL_DIR` is relative.
    #[error("refusing: H5I_SKILL_DIR is `{0}`, not an absolute path; to fix: set it to an absolute directory")]
    RelativeSkillDir(String),
    /// `H5I_AGENT` names no runtime.
    #[error("refusing: H5I_AGENT is `{0}`, which is not `claude` or `codex`; to fix: set H5I_AGENT=claude or H5I_AGENT=codex, or pass --target DIR")]
    UnknownAgent(String),
    /// A symlink where the install would write.
    #[error("refusing: {} is a symlink, and the skill is never written through one; to fix: remove it, or pass --target DIR naming a real directory", .0.display())]
    Symlink(PathBuf),
    /// Something there that is not a directory.
    #[error("refusing: {} exists and is not a directory; to fix: remove it, or pass --target DIR", .0.display())]
    NotADirectory(PathBuf),
    /// Reading or writing failed.
    #[error("refusing: cannot write the skill at {}: {source}; to fix: check the directory is yours and writable", path.display())]
    Io {
        /// Where.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
}

/// SKILL.md (`None`) or the reference page `name`.
pub fn page(name: Option<&str>) -> Result<&'static str, SkillError> {
    let path = match name {
        None => "SKILL.md".to_owned(),
        Some(n) => format!("reference/{n}.md"),
    };
    FILES
        .iter()
        .find(|f| f.path == path)
        .map(|f| f.text)
        .ok_or_else(|| SkillError::UnknownPage {
            name: name.unwrap_or_default().to_owned(),
        })
}

/// The skill's directory under a runtime's config directory (`.claude/skills/h5i`).
pub fn under_config_dir(runtime: AgentRuntime) -> PathBuf {
    Path::new(crate::box_home::config_dir_name(runtime)).join("skills/h5i")
}

/// Where `h5i skill install` writes without `--target`, read through `env`: `H5I_SKILL_DIR`
/// when set, else `$HOME/.codex/skills/h5i` when `H5I_AGENT=codex`, else
/// `$HOME/.claude/skills/h5i`.
pub fn default_target(env: impl Fn(&str) -> Option<String>) -> Result<PathBuf, SkillError> {
    if let Some(dir) = env("H5I_SKILL_DIR").filter(|d| !d.is_empty()) {
        let p = PathBuf::from(&dir);
        return if p.is_absolute() {
            Ok(p)
        } else {
            Err(SkillError::RelativeSkillDir(dir))
        };
    }
    let runtime = match env("H5I_AGENT").filter(|a| !a.is_empty()).as_deref() {
        None | Some("claude") => AgentRuntime::Claude,
        Some("codex") => AgentRuntime::Codex,
        Some(other) => return Err(SkillError::UnknownAgent(other.to_owned())),
    };
    let home = env("HOME")
        .map(PathBuf::from)
        .filter(|h| h.is_absolute())
        .ok_or(SkillError::NoHome)?;
    Ok(home.join(under_config_dir(runtime)))
}

/// Refuse when `env` says this process is inside a box.
pub fn refuse_inside_box(env: impl Fn(&str) -> Option<String>) -> Result<(), SkillError> {
    match env("H5I_ENV_ID").filter(|v| !v.is_empty()) {
        Some(id) => Err(SkillError::InsideBox { id }),
        None => Ok(()),
    }
}

/// A real directory at `dir` (made when missing, mode 0755), never a symlink.
fn real_dir(dir: &Path) -> Result<(), SkillError> {
    let io_err = |source| SkillError::Io {
        path: dir.to_path_buf(),
        source,
    };
    match std::fs::symlink_metadata(dir) {
        Ok(m) if m.file_type().is_symlink() => Err(SkillError::Symlink(dir.to_path_buf())),
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(SkillError::NotADirectory(dir.to_path_buf())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(dir)
                .map_err(io_err)?;
            real_dir(dir)
        }
        Err(e) => Err(io_err(e)),
    }
}

/// Write every file of the skill under `target`, replacing what an earlier install wrote.
/// Refused when `target`, a directory in it, or a file it would replace is a symlink; the
/// files are written through `beneath::write_file` (no symlink followed below `target`).
pub fn install(target: &Path) -> Result<Vec<PathBuf>, SkillError> {
    real_dir(target)?;
    let mut written = Vec::new();
    for f in FILES {
        let rel = Path::new(f.path);
        if let Some(parent) = rel.parent().filter(|p| !p.as_os_str().is_empty()) {
            real_dir(&target.join(parent))?;
        }
        let path = target.join(rel);
        if std::fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_symlink()) {
            return Err(SkillError::Symlink(path));
        }
        crate::beneath::write_file(target, rel, f.text.as_bytes()).map_err(|source| {
            SkillError::Io {
                path: path.clone(),
                source,
            }
        })?;
        written.push(path);
    }
    Ok(written)
}

impl From<SkillError> for crate::error::BoxError {
    fn from(e: SkillError) -> Self {
        if let SkillError::Io { path, source } = e {
            return crate::error::BoxError::io(&path, source);
        }
        let text = e.to_string();
        let text = text.strip_prefix("refusing: ").unwrap_or(&text);
        let (what, mend) = text.split_once("; to fix: ").unwrap_or((text, ""));
        crate::error::BoxError::BadRequest {
            what: what.to_owned(),
            mend: mend.to_owned(),
        }
    }
}

/// SHA-256 over every file's path and text: which skill a copy holds.
pub fn digest() -> String {
    let mut h = Sha256::new();
    for f in FILES {
        h.update(f.path.as_bytes());
        h.update([0]);
        h.update(f.text.as_bytes());
        h.update([0]);
    }
    h.finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<String>()
}

/// The read-only copy an agent box of `runtime` gets: `(host directory, in-box directory)`.
/// The host directory is `<box>/skill/<digest>` (outside every grant of the box), written from
/// the embedded bytes the first time a run of this binary needs it (into a temporary name,
/// then renamed into place, so a concurrent run never sees half of it); the in-box directory
/// is the skill's place in the box's HOME (`/.h5i/home/.claude/skills/h5i`).
pub fn for_box(
    box_skill_dir: &Path,
    runtime: AgentRuntime,
) -> Result<(PathBuf, PathBuf), SkillError> {
    let digest = digest();
    let dir = box_skill_dir.join(&digest[..16]);
    if !dir.is_dir() {
        real_dir(box_skill_dir)?;
        let tmp = box_skill_dir.join(format!(".tmp-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        install(&tmp)?;
        match std::fs::rename(&tmp, &dir) {
            Ok(()) => {}
            // Another run put the same copy in place first.
            Err(_) if dir.is_dir() => {
                let _ = std::fs::remove_dir_all(&tmp);
            }
            Err(source) => {
                let _ = std::fs::remove_dir_all(&tmp);
                return Err(SkillError::Io { path: dir, source });
            }
        }
    }
    let in_box = Path::new(h5i_policy::inbox::HOME).join(under_config_dir(runtime));
    Ok((dir, in_box))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn skill_md_opens_with_the_front_matter_skills_use() {
        let text = page(None).unwrap();
        let front = text
            .strip_prefix("---\n")
            .and_then(|t| t.split_once("\n---\n"))
            .map(|(f, _)| f)
            .expect("front matter");
        assert!(front.lines().any(|l| l == "name: h5i"), "{front}");
        assert!(
            front
                .lines()
                .any(|l| l.starts_with("description: ") && l.contains("H5I_ENV_ID")),
            "{front}"
        );
    }

    #[test]
    fn every_reference_page_is_named_on_skill_md_and_unknown_pages_are_refused() {
        let names = page_names();
        assert_eq!(names, ["in-a-box", "policy", "proposal", "browser"]);
        for n in &names {
            assert!(
                page(None).unwrap().contains(&format!("reference/{n}.md")),
                "{n}"
            );
            assert!(page(Some(n)).unwrap().starts_with("# "), "{n}");
        }
        let err = page(Some("../SKILL")).unwrap_err().to_string();
        assert!(
            err.contains("no page `../SKILL`")
                && err.contains("in-a-box, policy, proposal, browser"),
            "{err}"
        );
    }

    #[test]
    fn the_default_target_follows_the_manuals_order() {
        let t = |pairs: &[(&str, &str)]| default_target(env(pairs));
        assert_eq!(
            t(&[("HOME", "/h")]).unwrap(),
            Path::new("/h/.claude/skills/h5i")
        );
        assert_eq!(
            t(&[("HOME", "/h"), ("H5I_AGENT", "codex")]).unwrap(),
            Path::new("/h/.codex/skills/h5i")
        );
        assert_eq!(
            t(&[
                ("HOME", "/h"),
                ("H5I_AGENT", "codex"),
                ("H5I_SKILL_DIR", "/s")
            ])
            .unwrap(),
            Path::new("/s")
        );
        assert!(matches!(
            t(&[("HOME", "/h"), ("H5I_SKILL_DIR", "rel")]),
            Err(SkillError::RelativeSkillDir(_))
        ));
        assert!(matches!(
            t(&[("HOME", "/h"), ("H5I_AGENT", "gemini")]),
            Err(SkillError::UnknownAgent(_))
        ));
        assert!(matches!(t(&[("HOME", "rel")]), Err(SkillError::NoHome)));
        assert!(matches!(t(&[]), Err(SkillError::NoHome)));
    }

    #[test]
    fn inside_a_box_install_is_refused() {
        let err = refuse_inside_box(env(&[("H5I_ENV_ID", "b1")])).unwrap_err();
        assert!(err.to_string().contains("inside box `b1`"), "{err}");
        refuse_inside_box(env(&[("H5I_ENV_ID", "")])).unwrap();
        refuse_inside_box(env(&[])).unwrap();
    }

    #[test]
    fn install_writes_the_embedded_bytes_and_never_through_a_symlink() {
        let t = tempfile::tempdir().unwrap();
        let target = t.path().join("a/b/h5i");
        install(&target).unwrap();
        // Twice: an install replaces what an earlier one wrote.
        install(&target).unwrap();
        for f in FILES {
            assert_eq!(
                std::fs::read_to_string(target.join(f.path)).unwrap(),
                f.text
            );
        }
        let victim = t.path().join("victim");
        std::fs::create_dir(&victim).unwrap();
        std::fs::write(victim.join("SKILL.md"), "theirs").unwrap();
        // The target itself a symlink.
        let link = t.path().join("link");
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        assert!(matches!(install(&link), Err(SkillError::Symlink(_))));
        // A directory in it a symlink.
        let t2 = t.path().join("t2");
        std::fs::create_dir(&t2).unwrap();
        std::os::unix::fs::symlink(&victim, t2.join("reference")).unwrap();
        assert!(matches!(install(&t2), Err(SkillError::Symlink(_))));
        // A file it would replace a symlink.
        let t3 = t.path().join("t3");
        std::fs::create_dir(&t3).unwrap();
        std::os::unix::fs::symlink(victim.join("SKILL.md"), t3.join("SKILL.md")).unwrap();
        assert!(matches!(install(&t3), Err(SkillError::Symlink(_))));
        assert_eq!(
            std::fs::read_to_string(victim.join("SKILL.md")).unwrap(),
            "theirs"
        );
        assert_eq!(std::fs::read_dir(&victim).unwrap().count(), 1);
    }

    #[test]
    fn a_box_copy_is_made_once_per_skill_and_named_by_its_digest() {
        let t = tempfile::tempdir().unwrap();
        let (dir, in_box) = for_box(&t.path().join("skill"), AgentRuntime::Codex).unwrap();
        assert_eq!(in_box, Path::new("/.h5i/home/.codex/skills/h5i"));
        assert!(dir.ends_with(&digest()[..16]));
        assert_eq!(
            std::fs::read_to_string(dir.join("SKILL.md")).unwrap(),
            page(None).unwrap()
        );
        let (again, _) = for_box(&t.path().join("skill"), AgentRuntime::Claude).unwrap();
        assert_eq!(again, dir);
        assert_eq!(
            std::fs::read_dir(t.path().join("skill")).unwrap().count(),
            1
        );
    }
}
