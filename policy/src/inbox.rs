//! Where h5i's own paths appear inside a box: the one table every tier with a mount namespace
//! (process, supervised, container) places its binds and names its variables by.
//!
//! Owns the in-box names only: `$WORK` in a policy means [`WORK`] inside the box and the
//! workspace outside; the box's spool, the object store its git borrows from and (at the
//! process and supervised tiers) its own HOME sit under [`H5I_DIR`]. None of them names the
//! host's layout, so nothing the box reads from `pwd`, its environment or its receipts tells it
//! where the parent repository lives. The workspace tier has no mount namespace and keeps host
//! paths. Must never: name a host path, or a place an ordinary policy grant would want
//! (`/usr`, `/etc`, `/opt`, `/home`, ...).

use crate::values::path_within;

/// The box's working tree, and the directory every run starts in.
pub const WORK: &str = "/work";
/// The directory h5i's own mounts sit under (spool, borrowed objects, HOME).
pub const H5I_DIR: &str = "/.h5i";
/// The spool, the box's staging window for receipt records (`H5I_ENV_CAPTURE_SPOOL`).
pub const SPOOL: &str = "/.h5i/spool";
/// The object store the workspace's git borrows from (read-only); the box's
/// `.git/objects/info/alternates` names this path.
pub const OBJECTS: &str = "/.h5i/objects";
/// The box's own HOME at the process and supervised tiers (`<box>/home` on the host).
pub const HOME: &str = "/.h5i/home";

/// The in-box path a policy grant `p` (already normalized) names, when it is rooted at
/// `$WORK`: `$WORK/sub` is `/work/sub`. Other grants are not rewritten here.
pub fn work_path(p: &str) -> Option<String> {
    let rest = p.strip_prefix(crate::values::WORK)?;
    if !rest.is_empty() && !rest.starts_with('/') {
        return None;
    }
    Some(format!("{WORK}{rest}"))
}

/// The in-box place an absolute grant `p` would cover or sit inside, if any: a host path
/// mounted at (or around) [`WORK`] or [`H5I_DIR`] would hide the workspace or h5i's own mounts,
/// or be hidden by them.
pub fn reserved_overlap(p: &str) -> Option<&'static str> {
    [WORK, H5I_DIR]
        .into_iter()
        .find(|r| path_within(p, r) || path_within(r, p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_grants_name_the_in_box_workspace() {
        assert_eq!(work_path("$WORK").as_deref(), Some("/work"));
        assert_eq!(work_path("$WORK/build").as_deref(), Some("/work/build"));
        assert_eq!(work_path("$WORKX"), None);
        assert_eq!(work_path("/usr"), None);
    }

    #[test]
    fn grants_at_around_or_under_the_reserved_places_are_named() {
        assert_eq!(reserved_overlap("/work"), Some(WORK));
        assert_eq!(reserved_overlap("/work/data"), Some(WORK));
        assert_eq!(reserved_overlap("/"), Some(WORK));
        assert_eq!(reserved_overlap("/.h5i/spool"), Some(H5I_DIR));
        assert_eq!(reserved_overlap("/workshop"), None);
        assert_eq!(reserved_overlap("/usr"), None);
        assert_eq!(reserved_overlap("/home"), None);
    }

    #[test]
    fn every_place_is_under_one_of_the_two_roots() {
        for p in [SPOOL, OBJECTS, HOME] {
            assert!(path_within(p, H5I_DIR), "{p}");
        }
    }
}
