//! The guest kernel: a Debian kernel package's image and the few modules the guest loads.
//!
//! Owns finding a kernel under `/boot` whose module tree has everything the guest needs
//! ([`GUEST_MODULES`] and their dependencies, from `modules.dep`), and the uncompressed
//! `vmlinux` extracted from its `vmlinuz` (software emulation spends seconds decompressing a
//! bzImage at every boot; the ELF boots straight through PVH), cached by the image's identity.
//! Must never: pick a kernel without the modules (the guest would hang at boot), or trust a
//! cached `vmlinux` whose source changed.

use std::collections::HashMap;
use std::io::Write as _;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The modules the guest loads (their dependencies come along): the virtio-mmio transport,
/// the serial ports, the root disk, 9p for `/work` and the spool, ext4 and overlay for the root.
pub const GUEST_MODULES: &[&str] = &[
    "virtio_mmio",
    "virtio_console",
    "virtio_blk",
    "9pnet_virtio",
    "9p",
    "crc32c_generic",
    "ext4",
    "overlay",
];

/// A usable guest kernel.
#[derive(Debug, Clone)]
pub struct GuestKernel {
    /// Its release (`6.1.0-57-amd64`).
    pub release: String,
    /// The compressed image from the package.
    pub vmlinuz: PathBuf,
    /// The module files to load, dependencies first.
    pub modules: Vec<PathBuf>,
}

/// Find the newest kernel under `boot` whose modules (under `modules_root/<release>`) hold
/// every guest module.
pub fn find(boot: &Path, modules_root: &Path) -> Result<GuestKernel, String> {
    let mut releases: Vec<String> = std::fs::read_dir(boot)
        .map_err(|e| format!("cannot list {}: {e}", boot.display()))?
        .flatten()
        .filter_map(|e| {
            e.file_name()
                .to_str()?
                .strip_prefix("vmlinuz-")
                .map(str::to_owned)
        })
        .collect();
    releases.sort_by_key(|r| std::cmp::Reverse(version_key(r)));
    let mut why = Vec::new();
    for release in releases {
        let dir = modules_root.join(&release);
        match modules_for(&dir) {
            Ok(modules) => {
                return Ok(GuestKernel {
                    vmlinuz: boot.join(format!("vmlinuz-{release}")),
                    release,
                    modules,
                })
            }
            Err(e) => why.push(format!("{release}: {e}")),
        }
    }
    Err(match why.is_empty() {
        true => format!("no kernel image (vmlinuz-*) under {}", boot.display()),
        false => format!(
            "no kernel under {} has the guest's modules ({})",
            boot.display(),
            why.join("; ")
        ),
    })
}

/// Numeric parts of a release, for newest-first ordering.
fn version_key(release: &str) -> Vec<u64> {
    release
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// The guest modules of the tree at `dir`, dependencies first, each once.
fn modules_for(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let dep = std::fs::read_to_string(dir.join("modules.dep"))
        .map_err(|e| format!("no modules.dep ({e})"))?;
    let graph: HashMap<String, (String, Vec<String>)> = dep
        .lines()
        .filter_map(|l| {
            let (path, deps) = l.split_once(':')?;
            let name = module_name(path);
            let deps = deps.split_whitespace().map(module_name).collect();
            Some((name, (path.to_owned(), deps)))
        })
        .collect();
    let mut order: Vec<String> = Vec::new();
    fn visit(
        name: &str,
        graph: &HashMap<String, (String, Vec<String>)>,
        order: &mut Vec<String>,
        depth: usize,
    ) -> Result<(), String> {
        if order.iter().any(|o| o == name) {
            return Ok(());
        }
        let (_, deps) = graph
            .get(name)
            .ok_or_else(|| format!("module {name} is missing"))?;
        if depth > 32 {
            return Err("modules.dep has a dependency cycle".into());
        }
        for d in deps {
            visit(d, graph, order, depth + 1)?;
        }
        order.push(name.to_owned());
        Ok(())
    }
    for m in GUEST_MODULES {
        visit(m, &graph, &mut order, 0)?;
    }
    Ok(order
        .iter()
        .filter_map(|n| graph.get(n).map(|(p, _)| dir.join(p)))
        .collect())
}

/// `kernel/fs/9p/9p.ko` -> `9p` (dashes and underscores are the same to the kernel).
fn module_name(path: &str) -> String {
    let file = path.rsplit('/').next().unwrap_or(path);
    let stem = file.split(".ko").next().unwrap_or(file);
    stem.replace('-', "_")
}

/// The uncompressed kernel for `k`, extracted into `cache` once per source image (keyed by its
/// device, inode, size and mtime). `Err` when this image is not an xz-compressed bzImage.
pub fn vmlinux(k: &GuestKernel, cache: &Path) -> Result<PathBuf, String> {
    let meta =
        std::fs::metadata(&k.vmlinuz).map_err(|e| format!("{}: {e}", k.vmlinuz.display()))?;
    let out = cache.join(format!(
        "vmlinux-{}-{:x}-{:x}-{:x}",
        k.release,
        meta.ino(),
        meta.size(),
        meta.mtime()
    ));
    if out.is_file() {
        return Ok(out);
    }
    let image = std::fs::read(&k.vmlinuz).map_err(|e| format!("{}: {e}", k.vmlinuz.display()))?;
    const XZ_MAGIC: &[u8] = b"\xfd7zXZ\x00";
    let at = image
        .windows(XZ_MAGIC.len())
        .position(|w| w == XZ_MAGIC)
        .ok_or("the kernel image holds no xz stream")?;
    let mut child = std::process::Command::new("xz")
        .args(["--decompress", "--stdout", "--single-stream", "--quiet"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot run xz ({e}); to fix: apt-get install xz-utils"))?;
    let mut stdin = child.stdin.take().ok_or("xz has no stdin")?;
    let payload = image[at..].to_vec();
    let feeder = std::thread::spawn(move || {
        let _ = stdin.write_all(&payload);
    });
    let output = child.wait_with_output().map_err(|e| e.to_string())?;
    let _ = feeder.join();
    if !output.stdout.starts_with(b"\x7fELF") {
        return Err("the kernel's xz stream is not an ELF image".into());
    }
    let tmp = cache.join(format!(".vmlinux-{}.tmp", std::process::id()));
    std::fs::write(&tmp, &output.stdout)
        .and_then(|()| std::fs::rename(&tmp, &out))
        .map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            format!("{}: {e}", out.display())
        })?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modules_come_dependencies_first_and_once() {
        let dir = tempfile::tempdir().unwrap();
        let dep = "kernel/a/virtio.ko: kernel/a/virtio_ring.ko\n\
                   kernel/a/virtio_ring.ko:\n\
                   kernel/a/virtio_mmio.ko: kernel/a/virtio.ko kernel/a/virtio_ring.ko\n\
                   kernel/a/virtio_console.ko: kernel/a/virtio.ko kernel/a/virtio_ring.ko\n\
                   kernel/a/virtio_blk.ko: kernel/a/virtio.ko kernel/a/virtio_ring.ko\n\
                   kernel/n/9pnet.ko:\n\
                   kernel/n/9pnet_virtio.ko: kernel/n/9pnet.ko kernel/a/virtio.ko\n\
                   kernel/f/9p.ko: kernel/n/9pnet.ko\n\
                   kernel/c/crc32c_generic.ko:\n\
                   kernel/f/ext4.ko: kernel/l/crc16.ko\n\
                   kernel/l/crc16.ko:\n\
                   kernel/f/overlay.ko:\n";
        std::fs::write(dir.path().join("modules.dep"), dep).unwrap();
        let got: Vec<String> = modules_for(dir.path())
            .unwrap()
            .iter()
            .map(|p| module_name(&p.to_string_lossy()))
            .collect();
        let pos = |n: &str| got.iter().position(|g| g == n).unwrap();
        assert!(pos("virtio_ring") < pos("virtio") && pos("virtio") < pos("virtio_mmio"));
        assert!(pos("9pnet") < pos("9p") && pos("crc16") < pos("ext4"));
        assert_eq!(got.len(), 12, "each once: {got:?}");
        std::fs::write(dir.path().join("modules.dep"), "kernel/f/ext4.ko:\n").unwrap();
        let e = modules_for(dir.path()).unwrap_err();
        assert!(e.contains("missing"), "{e}");
    }

    #[test]
    fn the_newest_release_sorts_first() {
        let mut r = ["6.1.0-9-amd64".to_string(), "6.1.0-57-amd64".to_string()];
        r.sort_by_key(|v| std::cmp::Reverse(version_key(v)));
        assert_eq!(r[0], "6.1.0-57-amd64");
    }
}
