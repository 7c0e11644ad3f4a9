//! The box's warm caches in the guest: which read-only 9p shares the host booted the VM with,
//! and where the guest mounts them.
//!
//! Owns the names both sides agree on: a cache of ecosystem `eco` is the 9p share tagged
//! `cache-<eco>` ([`tag`]), mounted read-only at `/.h5i/cache/<eco>` ([`inside`]), and the
//! kernel command line's `h5i.caches=<eco>,<eco>` ([`CMDLINE_KEY`]) lists them. The host shares
//! only the current key's data directory of each cache, read-only on its side (QEMU's
//! `readonly=on`), so a key made stale by a lockfile change is never reachable from the guest:
//! the host boots the VM again without it.
//!
//! Must never: accept a name that is not a plain ecosystem name (lowercase ASCII letters and
//! digits, at most [`NAME_MAX`] bytes), so no mount point is ever made from a path the command
//! line spells.
//!
//! Guarded by the unit tests below and by `tests/microvm.rs` (a real guest under QEMU).

/// Where the guest mounts the caches (`h5i_policy::inbox::CACHE` on the host).
pub const ROOT: &str = "/.h5i/cache";

/// The kernel command line's key listing the caches.
pub const CMDLINE_KEY: &str = "h5i.caches";

/// The longest ecosystem name (a 9p mount tag is at most 31 bytes in the guest's kernel).
pub const NAME_MAX: usize = 16;

/// The most caches one VM gets (the microvm machine's virtio-mmio transports are shared with
/// the root disk, the workspace, the spool and the serial ports).
pub const MAX: usize = 12;

/// Whether `name` may name a cache.
pub fn is_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= NAME_MAX
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

/// The 9p mount tag of `eco`'s cache.
pub fn tag(eco: &str) -> String {
    format!("cache-{eco}")
}

/// Where the guest mounts `eco`'s cache.
pub fn inside(eco: &str) -> String {
    format!("{ROOT}/{eco}")
}

/// The kernel command line word listing `ecos` (None when there are none).
pub fn cmdline_word(ecos: &[&str]) -> Option<String> {
    (!ecos.is_empty()).then(|| format!("{CMDLINE_KEY}={}", ecos.join(",")))
}

/// The caches the kernel command line `cmdline` lists, or why it cannot be taken (a malformed
/// name, a repeated one, too many).
pub fn from_cmdline(cmdline: &str) -> Result<Vec<String>, String> {
    let prefix = format!("{CMDLINE_KEY}=");
    let Some(list) = cmdline
        .split_whitespace()
        .find_map(|w| w.strip_prefix(&prefix))
    else {
        return Ok(Vec::new());
    };
    let mut out: Vec<String> = Vec::new();
    for name in list.split(',') {
        if !is_name(name) {
            return Err(format!("{CMDLINE_KEY} names {name:?}, not an ecosystem"));
        }
        if out.iter().any(|n| n == name) {
            return Err(format!("{CMDLINE_KEY} names {name} twice"));
        }
        out.push(name.to_owned());
    }
    if out.len() > MAX {
        return Err(format!("{CMDLINE_KEY} names more than {MAX} caches"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_round_trips_and_refuses_paths() {
        let word = cmdline_word(&["npm", "cargo"]).unwrap();
        assert_eq!(word, "h5i.caches=npm,cargo");
        assert_eq!(
            from_cmdline(&format!("console=ttyS0 {word} h5i.idle=600")).unwrap(),
            ["npm", "cargo"]
        );
        assert_eq!(from_cmdline("console=ttyS0").unwrap(), Vec::<String>::new());
        assert!(cmdline_word(&[]).is_none());
        for bad in [
            "h5i.caches=../etc",
            "h5i.caches=npm/x",
            "h5i.caches=",
            "h5i.caches=npm,,cargo",
            "h5i.caches=NPM",
            "h5i.caches=npm,npm",
            "h5i.caches=abcdefghijklmnopq",
        ] {
            assert!(from_cmdline(bad).is_err(), "{bad}");
        }
        assert_eq!(tag("npm"), "cache-npm");
        assert_eq!(inside("npm"), "/.h5i/cache/npm");
    }
}
