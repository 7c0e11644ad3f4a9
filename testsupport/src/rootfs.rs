//! Image trees for test boxes: a busybox root filesystem with the applets a test names, and the
//! tar of a tree that `podman import` takes.

use std::path::Path;
use std::process::Command;

/// Make `dirs` under `rootfs`, copy the host's static `/bin/busybox` into `rootfs/bin` and link
/// each of `applets` to it there.
pub fn busybox(rootfs: &Path, dirs: &[&str], applets: &[&str]) {
    std::fs::create_dir_all(rootfs.join("bin")).unwrap();
    for d in dirs {
        std::fs::create_dir_all(rootfs.join(d)).unwrap();
    }
    std::fs::copy("/bin/busybox", rootfs.join("bin/busybox")).unwrap();
    for a in applets {
        std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(a)).unwrap();
    }
}

/// Write the tree at `rootfs` as the tar file `out` (its entries relative to the tree's root).
pub fn tar(rootfs: &Path, out: &Path) {
    let st = Command::new("tar")
        .arg("-C")
        .arg(rootfs)
        .arg("-cf")
        .arg(out)
        .arg(".")
        .status()
        .unwrap();
    assert!(st.success(), "tar of {} failed: {st}", rootfs.display());
}
