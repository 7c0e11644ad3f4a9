//! The guest's root: the box's pinned OCI image, converted once into an ext4 disk image the
//! VM gets read-only (`/dev/vda`; the guest lays a tmpfs overlay over it).
//!
//! Owns `<box>/microvm-root-<image id>.ext4` (host-written, in the box directory no box grant
//! reaches). The conversion runs as the container engine's user inside `podman unshare`: the
//! image is mounted from that user's storage (`podman image mount`, never pulled) and copied
//! by `mke2fs -d`, which records the owners as the image has them (root's files stay root's in
//! the guest). Root copies the result out of the engine user's scratch directory through a
//! descriptor it checked (a regular file the engine user owns), never by following a path the
//! engine user could swap.
//!
//! Must never: unpack an image on the host's own filesystem as root, or hand the VM an image
//! other than the pinned one.

use h5i_log::Traced as _;
use std::io::{Read, Seek, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::container::engine::Engine;
use crate::container::image::PinnedImage;
use crate::error::BoxError;
use crate::store::StoredBox;

/// The script `podman unshare` runs: mount the image, size and make the ext4 image from it.
const MAKE_ROOT: &str = r#"set -eu
m=$(podman image mount "$1")
trap 'podman image unmount "$1" >/dev/null 2>&1 || true' EXIT
kib=$(du -sk "$m" | cut -f1)
files=$(find "$m" -xdev | wc -l)
mke2fs -q -t ext4 -O ^has_journal -N $((files + files / 4 + 1024)) -d "$m" -F "$2" "$((kib + kib / 4 + 16384))k"
"#;

/// The root image of `sb` for `image` (made when missing).
pub fn for_box(engine: &Engine, sb: &StoredBox, image: &PinnedImage) -> Result<PathBuf, BoxError> {
    let hex = image.id.trim_start_matches("sha256:");
    let short = &hex[..hex.len().min(16)];
    let out = sb.paths.dir.join(format!("microvm-root-{short}.ext4"));
    if out.is_file() {
        return Ok(out);
    }
    let scratch = engine.runtime_dir.join(format!(
        "h5i-microvm-root-{}-{}",
        std::process::id(),
        crate::store::now_ms()
    ));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&scratch)
        .map_err(|e| BoxError::io(&scratch, e))?;
    let made = (|| {
        if engine.switches_user {
            std::os::unix::fs::chown(&scratch, Some(engine.uid), Some(engine.gid))
                .map_err(|e| BoxError::io(&scratch, e))?;
        }
        let img = scratch.join("root.ext4");
        let run = engine
            .podman()
            .args(["unshare", "sh", "-c", MAKE_ROOT, "h5i-microvm-root", hex])
            .arg(&img)
            .stdin(std::process::Stdio::null())
            .traced()
            .output()
            .map_err(|e| refuse(format!("cannot run podman as `{}`: {e}", engine.user)))?;
        if !run.status.success() {
            return Err(refuse(format!(
                "making the guest root from image `{}` failed: {}",
                image.name,
                String::from_utf8_lossy(&run.stderr).trim()
            )));
        }
        copy_checked(&img, engine.uid, &out)
    })();
    let _ = std::fs::remove_file(scratch.join("root.ext4"));
    let _ = std::fs::remove_dir(&scratch);
    made.map(|()| out)
}

fn refuse(what: String) -> BoxError {
    BoxError::BadRequest {
        what,
        mend: "check that the image is in the engine user's Podman storage (`h5i box probe`) and that e2fsprogs is installed (`make setup`)".into(),
    }
}

/// Copy the regular file at `from` (owned by `owner`, opened without following a symlink) to
/// `to`, atomically: readable by every user (the VM's process reads it through a descriptor;
/// the box directory it lives in is 0700).
fn copy_checked(from: &Path, owner: u32, to: &Path) -> Result<(), BoxError> {
    let mut src = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(from)
        .map_err(|e| BoxError::io(from, e))?;
    let meta = src.metadata().map_err(|e| BoxError::io(from, e))?;
    if !meta.is_file() || meta.uid() != owner || meta.nlink() != 1 {
        return Err(refuse(format!(
            "{} is not a regular file of the engine user's own",
            from.display()
        )));
    }
    let tmp = to.with_extension("ext4.tmp");
    let mut dst = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o644)
        .open(&tmp)
        .map_err(|e| BoxError::io(&tmp, e))?;
    src.rewind().map_err(|e| BoxError::io(from, e))?;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = src.read(&mut buf).map_err(|e| BoxError::io(from, e))?;
        if n == 0 {
            break;
        }
        dst.write_all(&buf[..n])
            .map_err(|e| BoxError::io(&tmp, e))?;
    }
    dst.sync_all().map_err(|e| BoxError::io(&tmp, e))?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644))
        .and_then(|()| std::fs::rename(&tmp, to))
        .map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            BoxError::io(to, e)
        })
}
