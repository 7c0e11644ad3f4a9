//! What a Codex box's image holds for the tee shim (`h5i_hook::tee_shim`): its own bash, bound
//! read-only at the shim's private path, and its own `/etc/passwd`, which decides the box
//! user's login shell (the shell Codex runs every command through) when it has an entry for
//! the box's uid. Copied out once per image id, so boxes of one image share one copy.
//!
//! Owns `<runs dir>/image-shell/<image id hex>/` (`super::runs_dir`: root's `/run/h5i-engine`
//! when root drives another user's engine, else the caller's runtime directory): `bash` and
//! `passwd` when the image has them, and `done`, written last in a temporary directory that is
//! renamed into place whole, so a killed h5i leaves no entry or a complete one. As root the
//! files are root's (the engine user reads and runs them, never writes them); the bytes are
//! read from what `podman cp` wrote without following a link.
//!
//! Must never: run anything of the image (`podman create`, `cp`, `rm` only), name a path out
//! of the cache from the image id (it must be hex), or copy a file the engine user planted in
//! place of the image's (an open that would follow a link, or of anything but a regular file,
//! is refused).

use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use h5i_hook::tee_shim::SHIM_AT;

use super::engine::Engine;
use super::{private_dir, refuse, runs_dir, RunDir};
use crate::error::BoxError;

/// The largest bash h5i copies (a real one is about 1.3 MiB).
const BASH_CAP: u64 = 64 << 20;
/// The largest `/etc/passwd` h5i reads.
const PASSWD_CAP: u64 = 1 << 20;

/// What one image holds for the shim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageShell {
    /// The image's own bash (the first of [`SHIM_AT`] it has), in the cache.
    pub bash: Option<PathBuf>,
    /// The image's `/etc/passwd`, when it has one.
    passwd: Option<String>,
}

impl ImageShell {
    /// The login shell the image's own `/etc/passwd` gives `uid`, when it has an entry for it
    /// (Podman's keep-id then adds none, so `--passwd-entry` does not apply).
    pub fn own_entry_shell(&self, uid: u32) -> Option<String> {
        own_entry_shell(self.passwd.as_deref()?, uid)
    }

    /// Why the shim cannot be the shell the agent of a box of uid `uid` runs its commands
    /// through, when it cannot: the image has its own passwd entry for that uid naming a shell
    /// the shim is not bound over.
    pub fn not_agent_shell(&self, uid: u32) -> Option<String> {
        let shell = self.own_entry_shell(uid)?;
        (!SHIM_AT.contains(&shell.as_str())).then(|| {
            format!(
                "the image's own /etc/passwd gives the box user (uid {uid}) the login shell `{}`, which Codex runs its commands through, and h5i's shell shim is bound over bash only",
                // The image's text in a code span it cannot close.
                shell.escape_debug().to_string().replace('`', "\\u{60}")
            )
        })
    }
}

/// The login shell of `uid`'s entry in the passwd text `passwd` (the first entry for it).
fn own_entry_shell(passwd: &str, uid: u32) -> Option<String> {
    passwd.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(':').collect();
        (fields.len() == 7 && fields[2].parse::<u32>() == Ok(uid)).then(|| fields[6].to_owned())
    })
}

/// What `image_id` (`sha256:` hex, as pinned) holds for the shim: from the cache, else copied
/// out of the image through the engine and cached.
pub fn of_image(engine: &Engine, image_id: &str) -> Result<ImageShell, BoxError> {
    let hex = image_id.strip_prefix("sha256:").unwrap_or(image_id);
    if hex.len() < 12 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(refuse(
            format!("the image id `{}` is not hex", image_id.escape_debug()),
            "recreate the box (h5i pins the image's id at create)",
        ));
    }
    let (mode, owner) = if engine.switches_user {
        (0o711, 0)
    } else {
        (0o700, engine.uid)
    };
    let cache = runs_dir(engine)?.join("image-shell");
    private_dir(&cache, mode, owner)?;
    let entry = cache.join(hex);
    if !entry.join("done").is_file() {
        fill(engine, image_id, &cache, &entry)?;
    }
    let bash = entry.join("bash");
    let passwd = entry.join("passwd");
    Ok(ImageShell {
        bash: bash.is_file().then_some(bash),
        passwd: match std::fs::read(&passwd) {
            Ok(bytes) => Some(String::from_utf8_lossy(&bytes).into_owned()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(BoxError::io(&passwd, e)),
        },
    })
}

/// Copy the image's bash and passwd out (into a run directory the engine may write), then
/// write them as this process's own files in a temporary directory renamed to `entry`.
fn fill(engine: &Engine, image_id: &str, cache: &Path, entry: &Path) -> Result<(), BoxError> {
    let token = crate::random::hex_for_box(8)?;
    let mut run_dir = RunDir::create(engine, &format!("shell-{token}"))?;
    let made = engine
        .podman()
        .args([
            "create",
            "--pull=never",
            "--network",
            "none",
            image_id,
            "true",
        ])
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
        .map_err(|e| BoxError::io(Path::new("podman"), e))?;
    let id = String::from_utf8_lossy(&made.stdout).trim().to_owned();
    if !made.status.success() || id.is_empty() {
        return Err(refuse(
            format!("Podman could not create a container of the box's image {image_id} to copy its bash out for the tee shim"),
            "check the image is still there (`podman images`) and run it again",
        ));
    }
    let copy = |from: &str, name: &str| {
        let dest = run_dir.out.join(name);
        engine
            .podman_quiet(&["cp", &format!("{id}:{from}"), &dest.to_string_lossy()])
            .then_some(dest)
    };
    // Podman resolves links inside the image's root.
    let bash = SHIM_AT.iter().find_map(|at| copy(at, "bash"));
    let passwd = copy("/etc/passwd", "passwd");
    engine.podman_quiet(&["rm", "--force", &id]);
    run_dir.files.extend(bash.iter().chain(&passwd).cloned());
    let tmp = cache.join(format!("tmp-{token}"));
    let dir_mode = if engine.switches_user { 0o755 } else { 0o700 };
    std::fs::DirBuilder::new()
        .mode(dir_mode)
        .create(&tmp)
        .map_err(|e| BoxError::io(&tmp, e))?;
    let written = (|| {
        for (from, name, cap, mode) in [
            (&bash, "bash", BASH_CAP, 0o755),
            (&passwd, "passwd", PASSWD_CAP, 0o644),
        ] {
            if let Some(from) = from {
                let bytes = crate::bounded::read_beneath(&run_dir.out, Path::new(name), cap)
                    .map_err(|why| {
                        refuse(
                            format!(
                                "{} is not a regular file of at most {cap} bytes ({why})",
                                from.display()
                            ),
                            "run it again (the copy is made anew)",
                        )
                    })?;
                write_new(&tmp.join(name), &bytes, mode)?;
            }
        }
        write_new(&tmp.join("done"), b"", 0o644)?;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(dir_mode))
            .map_err(|e| BoxError::io(&tmp, e))
    })();
    let placed = written.and_then(|()| match std::fs::rename(&tmp, entry) {
        Ok(()) => Ok(true),
        // Another run placed the same image's entry first: it is as good as this one.
        Err(_) if entry.join("done").is_file() => Ok(false),
        Err(e) => Err(BoxError::io(entry, e)),
    });
    if !matches!(placed, Ok(true)) {
        for name in ["bash", "passwd", "done"] {
            let _ = std::fs::remove_file(tmp.join(name));
        }
        let _ = std::fs::remove_dir(&tmp);
    }
    placed.map(|_| ())
}

/// Write `bytes` to the new file `path` with `mode`.
fn write_new(path: &Path, bytes: &[u8], mode: u32) -> Result<(), BoxError> {
    use std::io::Write as _;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(|e| BoxError::io(path, e))?;
    f.write_all(bytes)
        .and_then(|()| f.set_permissions(std::fs::Permissions::from_mode(mode)))
        .and_then(|()| f.sync_all())
        .map_err(|e| BoxError::io(path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_box_users_own_entry_names_its_shell_and_only_bash_keeps_the_shim() {
        let passwd = "root:x:0:0:root:/root:/bin/bash\nbox:x:1001:1001::/tmp:/bin/sh\nodd:line\n";
        assert_eq!(own_entry_shell(passwd, 1001).as_deref(), Some("/bin/sh"));
        assert_eq!(own_entry_shell(passwd, 1002), None);
        let shell = |passwd: &str| ImageShell {
            bash: None,
            passwd: Some(passwd.to_owned()),
        };
        let why = shell(passwd).not_agent_shell(1001).unwrap();
        assert!(
            why.contains("uid 1001") && why.contains("`/bin/sh`"),
            "{why}"
        );
        assert_eq!(shell(passwd).not_agent_shell(0), None);
        // A shell name cannot close the code span it is shown in.
        let odd = shell("x:x:5:5::/:/bin/`sh\n").not_agent_shell(5).unwrap();
        assert!(odd.contains("`/bin/\\u{60}sh`"), "{odd}");
        assert_eq!(shell(passwd).not_agent_shell(4242), None);
        let bash_entry = "box:x:1001:1001::/tmp:/usr/bin/bash\n";
        assert_eq!(shell(bash_entry).not_agent_shell(1001), None);
        let none = ImageShell {
            bash: None,
            passwd: None,
        };
        assert_eq!(none.not_agent_shell(1001), None);
    }
}
