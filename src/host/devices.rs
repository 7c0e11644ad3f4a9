//! Device nodes unprivileged boxes need: `/dev/net/tun` (the supervised tier's pasta
//! uplink, rootless Podman's network) and `/dev/fuse` (fuse-overlayfs). Hosts without udev bring
//! them up 0600.
//!
//! Must never: change a node that is not a character device, or make any other node wider.

use std::os::unix::fs::{FileTypeExt, PermissionsExt};

use super::{Change, HostError, HostRoot};

/// The nodes, made 0666 (what udev's default rules give them).
pub const NODES: [&str; 2] = ["/dev/net/tun", "/dev/fuse"];

/// Open each present node in [`NODES`] to every user.
pub fn open_to_users(root: &HostRoot, changes: &mut Vec<Change>) -> Result<(), HostError> {
    for node in NODES {
        let p = root.path(node);
        let Ok(meta) = std::fs::metadata(&p) else {
            continue;
        };
        if !meta.file_type().is_char_device() || meta.permissions().mode() & 0o666 == 0o666 {
            continue;
        }
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o666))
            .map_err(HostError::io("chmod", &p))?;
        changes.push(Change(format!("chmod 0666 {node}")));
    }
    Ok(())
}
