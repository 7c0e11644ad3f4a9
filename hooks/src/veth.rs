//! The rootful box's uplink: a veth pair and the host kernel's own forwarding, at the speed of
//! the kernel (pasta, the unprivileged uplink, copies every byte through a user-space TCP stack).
//!
//! Owns, for a sentry that is real root: one veth pair per box (`h5iuN` on the host, `h5i0` in
//! the box's network namespace), one point-to-point `/31` of [`RANGE`] for it (host side
//! `100.127.a.2k`, box side `.2k+1`, the box's default route via the host side), IPv4
//! forwarding on the host side only (`net.ipv4.conf.h5iuN.forwarding`; IPv6 is off on it), and
//! the host's one shared table [`HOST_TABLE`], which:
//! - masquerades what leaves a box for anywhere but another box;
//! - drops anything forwarded from one box to another, and anything that would open a
//!   connection into a box (only replies reach one);
//! - drops everything a box sends to the host's own addresses (`input`): the host's services,
//!   the other boxes' host sides and its own gateway address are all unreachable;
//! - drops what a reply device forwards anywhere but into a box (below).
//!
//! The box's own table (`nft.rs`, inside its namespace, which the box cannot change) stays the
//! only way out: the host table adds no destination, it only keeps the path to the host narrow.
//!
//! Reply devices: a reply to a box arrives on the device that routes to the pinned address
//! (`eth0`, or a test host's veth) and is turned back to the box's address by conntrack; the
//! kernel forwards it only if that input device has forwarding on. So for each pinned address
//! (at attach, and for each new one a later run pins) the device `ip route get` names gets
//! forwarding on, when it was off: its original value is kept in [`STATE_DIR`]`/fwd-DEV`, the
//! device joins the table's `reply_devs` set first, and the table drops every packet forwarded
//! from it except replies into a box, so the host routes nothing it did not route before.
//!
//! Lifetime: the host side goes with the sentry (`ip link del`); a veth pair also goes with the
//! box's network namespace, so a killed sentry leaves at most the records, the table and the
//! reply devices' forwarding. Every record names its host device; [`sweep`] (at each attach, and
//! from `h5i doctor` and a sandbox's teardown) removes the records whose device is gone, and when
//! none is left restores every reply device's forwarding, deletes the table and the `fwd-*`
//! files. All of it runs under `STATE_DIR/lock` (flock), so boxes starting and ending at once
//! never see half a change.
//!
//! Must never: change a host device's forwarding without its guard in place first, leave the
//! host a router for anything but a box's replies, add a host-side path the box's own table
//! does not allow, or touch an interface that is not `h5iu*` (besides the reply devices'
//! forwarding flag, restored).
//! Guarded by `tests/supervised_tier.rs` (rootful rows) and `tests/supervised_sandbox.rs`.

use std::collections::BTreeSet;
use std::fs::{self, File};
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use h5i_policy::receipt::PinnedRule;

use crate::netns::{self, BoxNamespaces, NetnsError};

/// The host's record of the rootful uplinks: `lock`, one file per box's host device, and the
/// reply devices' original forwarding values (`fwd-DEV`).
pub const STATE_DIR: &str = "/run/h5i-uplink";
/// The host's shared table, as `nft` names it.
pub const HOST_TABLE: &str = "ip h5i_uplink";
/// The host side's name prefix (`h5iuN`).
pub const HOST_PREFIX: &str = "h5iu";
/// The box side's name.
pub const BOX_DEVICE: &str = "h5i0";
/// The first two octets of the range the pairs' `/31`s are taken from (`100.127.0.0/16`, the
/// top of the shared address space, which a host's own networks rarely use).
pub const RANGE: [u8; 2] = [100, 127];
/// How many `/31`s the range holds.
const SLOTS: u32 = 1 << 15;
/// How many free-looking slots one attach tries before giving up.
const TRIES: u32 = 64;

/// Why the veth uplink could not be made.
#[derive(Debug, thiserror::Error)]
pub enum VethError {
    /// `ip` or `nft` failed.
    #[error(transparent)]
    Run(#[from] NetnsError),
    /// A state file or sysctl could not be read or written.
    #[error("refusing: {what} {path}: {source}; to fix: check {STATE_DIR} and /proc/sys are writable by root")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// No slot of the range was free.
    #[error("refusing: no free /31 in 100.127.0.0/16 for the box's uplink after {TRIES} tries ({0}); to fix: remove stale h5iu* interfaces (`h5i doctor`) or a host route that covers 100.127.0.0/16")]
    NoSlot(String),
}

fn io_err(what: &'static str, path: &Path) -> impl FnOnce(io::Error) -> VethError {
    let path = path.to_path_buf();
    move |source| VethError::Io { what, path, source }
}

/// The host table: replaced whole (one transaction) at each attach and by a sweep that keeps it.
fn host_table(reply_devs: &BTreeSet<String>) -> String {
    let mut s = format!(
        "table {HOST_TABLE} {{}}\ndelete table {HOST_TABLE}\ntable {HOST_TABLE} {{\n  set reply_devs {{\n    type ifname\n"
    );
    if !reply_devs.is_empty() {
        let list: Vec<String> = reply_devs.iter().map(|d| format!("\"{d}\"")).collect();
        s.push_str(&format!("    elements = {{ {} }}\n", list.join(", ")));
    }
    s.push_str(&format!(
        "  }}\n  chain forward {{\n    type filter hook forward priority filter - 10; policy accept;\n    iifname \"{HOST_PREFIX}*\" oifname \"{HOST_PREFIX}*\" drop\n    oifname \"{HOST_PREFIX}*\" ct state established,related accept\n    oifname \"{HOST_PREFIX}*\" drop\n    iifname @reply_devs drop\n  }}\n  chain input {{\n    type filter hook input priority filter - 10; policy accept;\n    iifname \"{HOST_PREFIX}*\" drop\n  }}\n  chain postrouting {{\n    type nat hook postrouting priority srcnat; policy accept;\n    iifname \"{HOST_PREFIX}*\" oifname != \"{HOST_PREFIX}*\" masquerade\n  }}\n}}\n"
    ));
    s
}

/// The host-side and box-side addresses of `slot`.
fn slot_addrs(slot: u32) -> (Ipv4Addr, Ipv4Addr) {
    let n = slot * 2;
    let host = Ipv4Addr::new(RANGE[0], RANGE[1], (n >> 8) as u8, (n & 0xff) as u8);
    let inner = Ipv4Addr::new(RANGE[0], RANGE[1], (n >> 8) as u8, ((n & 0xff) + 1) as u8);
    (host, inner)
}

fn device_exists(name: &str) -> bool {
    Path::new("/sys/class/net").join(name).exists()
}

fn forwarding_path(dev: &str) -> PathBuf {
    Path::new("/proc/sys/net/ipv4/conf")
        .join(dev)
        .join("forwarding")
}

/// The state directory's lock (flock), held while the returned file is open.
fn lock_state() -> Result<File, VethError> {
    let dir = Path::new(STATE_DIR);
    fs::create_dir_all(dir).map_err(io_err("cannot create", dir))?;
    let path = dir.join("lock");
    let f = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(io_err("cannot open", &path))?;
    f.lock().map_err(io_err("cannot lock", &path))?;
    Ok(f)
}

/// The host devices the records name (`h5iuN` files).
fn records() -> Vec<String> {
    let Ok(entries) = fs::read_dir(STATE_DIR) else {
        return Vec::new();
    };
    entries
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(HOST_PREFIX))
        .collect()
}

/// The reply devices whose forwarding h5i turned on (`fwd-DEV` files).
fn reply_devices() -> BTreeSet<String> {
    let Ok(entries) = fs::read_dir(STATE_DIR) else {
        return BTreeSet::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            e.file_name()
                .to_string_lossy()
                .strip_prefix("fwd-")
                .map(str::to_string)
        })
        .collect()
}

/// Remove the records of uplinks whose host device is gone; with none left, give every reply
/// device its forwarding back and delete the host table. The lock is held by the caller.
fn sweep_locked() -> Result<(), VethError> {
    let dir = Path::new(STATE_DIR);
    for name in records() {
        if !device_exists(&name) {
            let path = dir.join(&name);
            fs::remove_file(&path).map_err(io_err("cannot remove", &path))?;
        }
    }
    // A reply device that went (a test host's veth, say) has no flag left to restore.
    for dev in reply_devices() {
        if !device_exists(&dev) {
            let path = dir.join(format!("fwd-{dev}"));
            fs::remove_file(&path).map_err(io_err("cannot remove", &path))?;
        }
    }
    if !records().is_empty() {
        return Ok(());
    }
    for dev in reply_devices() {
        let path = dir.join(format!("fwd-{dev}"));
        let original = fs::read_to_string(&path).map_err(io_err("cannot read", &path))?;
        let flag = forwarding_path(&dev);
        fs::write(&flag, original.trim()).map_err(io_err("cannot restore", &flag))?;
        fs::remove_file(&path).map_err(io_err("cannot remove", &path))?;
    }
    // `delete table` of a missing table fails; the empty `table` first makes it exist.
    netns::host_nft(
        &["-f", "-"],
        format!("table {HOST_TABLE} {{}}\ndelete table {HOST_TABLE}\n").as_bytes(),
    )?;
    Ok(())
}

/// Clean what killed sentries left: records of gone uplinks, and with none left the host
/// table and the reply devices' forwarding. A no-op for anyone but real root, and when nothing
/// was ever made.
pub fn sweep() -> Result<(), VethError> {
    if !netns::real_root() || !Path::new(STATE_DIR).is_dir() {
        return Ok(());
    }
    let _lock = lock_state()?;
    sweep_locked()
}

/// What killed sentries left that [`sweep`] would clean: records of uplinks whose host device
/// is gone, and reply devices still forwarding with no uplink left (for `h5i box doctor`).
pub fn stale() -> Vec<String> {
    let records = records();
    let mut found: Vec<String> = records
        .iter()
        .filter(|n| !device_exists(n))
        .map(|n| format!("{STATE_DIR}/{n} (its device is gone)"))
        .collect();
    if records.iter().all(|n| !device_exists(n)) {
        found.extend(
            reply_devices()
                .into_iter()
                .map(|d| format!("forwarding left on for {d} ({STATE_DIR}/fwd-{d})")),
        );
    }
    found
}

/// How the host routes `addr`: the device, and whether through a gateway (`via`) rather than
/// on-link. `None` when it has no route (nothing to forward there: the box's connect fails as
/// the host's would).
fn route_of(addr: Ipv4Addr) -> Result<Option<(String, bool)>, VethError> {
    let out = match netns::host_ip(&["-4", "-o", "route", "get", &addr.to_string()], b"") {
        Ok(out) => out,
        Err(NetnsError::Failed { .. }) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let text = String::from_utf8_lossy(&out);
    let words: Vec<&str> = text.split_whitespace().collect();
    let via = words.contains(&"via");
    Ok(words
        .iter()
        .position(|w| *w == "dev")
        .and_then(|i| words.get(i + 1))
        .map(|dev| (dev.to_string(), via)))
}

/// A running veth uplink (the sentry holds it for the box's life).
#[derive(Debug)]
pub struct VethUplink {
    host_if: String,
    /// Pinned addresses whose reply device is already set up.
    routed: BTreeSet<Ipv4Addr>,
}

impl VethUplink {
    /// Make the pair for the box whose namespaces are `ns`, the host table and forwarding,
    /// and set up the reply devices of `rules`.
    pub fn start(ns: &BoxNamespaces, rules: &[PinnedRule]) -> Result<VethUplink, VethError> {
        let lock = lock_state()?;
        sweep_locked()?;
        netns::host_nft(&["-f", "-"], host_table(&reply_devices()).as_bytes())?;
        let netns_path = format!("/proc/{}/fd/{}", std::process::id(), ns.net().as_raw_fd());
        let first = std::process::id() % SLOTS;
        let mut last_error = String::from("every slot tried is in use");
        for k in 0..TRIES {
            let slot = (first + k) % SLOTS;
            let host_if = format!("{HOST_PREFIX}{slot}");
            let record = Path::new(STATE_DIR).join(&host_if);
            if device_exists(&host_if) || record.exists() {
                continue;
            }
            let (host, inner) = slot_addrs(slot);
            // A host route (not the default one) already covering the slot: someone's network.
            if let Some((dev, via)) = route_of(inner)? {
                if !via && !dev.starts_with(HOST_PREFIX) {
                    last_error = format!("{inner} is routed on-link through {dev}");
                    continue;
                }
            }
            fs::write(&record, format!("{}\n", std::process::id()))
                .map_err(io_err("cannot write", &record))?;
            let made = netns::host_ip(
                &[
                    "link",
                    "add",
                    &host_if,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    BOX_DEVICE,
                    "netns",
                    &netns_path,
                ],
                b"",
            );
            if let Err(e) = made {
                let _ = fs::remove_file(&record);
                last_error = e.to_string();
                continue;
            }
            let mut uplink = VethUplink {
                host_if,
                routed: BTreeSet::new(),
            };
            match uplink.configure(ns, host, inner) {
                Ok(()) => {}
                Err(e) => {
                    drop(lock);
                    uplink.stop();
                    return Err(e);
                }
            }
            drop(lock);
            if let Err(e) = uplink.route(rules) {
                uplink.stop();
                return Err(e);
            }
            return Ok(uplink);
        }
        Err(VethError::NoSlot(last_error))
    }

    /// Address both ends, bring them up, and turn forwarding on for the host end only.
    fn configure(
        &self,
        ns: &BoxNamespaces,
        host: Ipv4Addr,
        inner: Ipv4Addr,
    ) -> Result<(), VethError> {
        let dev = &self.host_if;
        let v6 = Path::new("/proc/sys/net/ipv6/conf")
            .join(dev)
            .join("disable_ipv6");
        fs::write(&v6, "1").map_err(io_err("cannot write", &v6))?;
        let flag = forwarding_path(dev);
        fs::write(&flag, "1").map_err(io_err("cannot write", &flag))?;
        netns::host_ip(
            &["-batch", "-"],
            format!("addr add {host}/31 dev {dev}\nlink set {dev} up\n").as_bytes(),
        )?;
        ns.ip(
            &["-batch", "-"],
            format!(
                "addr add {inner}/31 dev {BOX_DEVICE}\nlink set {BOX_DEVICE} up\nroute add default via {host} dev {BOX_DEVICE}\n"
            )
            .as_bytes(),
        )?;
        Ok(())
    }

    /// Give every pinned IPv4 address of `rules` not seen before a reply path: its route's
    /// device gets forwarding on (guarded by the table's `reply_devs` first) when it was off.
    /// Cheap for a run whose pins were all seen: nothing runs.
    pub fn route(&mut self, rules: &[PinnedRule]) -> Result<(), VethError> {
        let new: Vec<Ipv4Addr> = rules
            .iter()
            .flat_map(|r| &r.addrs)
            .filter_map(|a| a.parse::<Ipv4Addr>().ok())
            .filter(|a| !self.routed.contains(a))
            .collect();
        if new.is_empty() {
            return Ok(());
        }
        let _lock = lock_state()?;
        for addr in new {
            if let Some((dev, _)) = route_of(addr)? {
                if !dev.starts_with(HOST_PREFIX) {
                    enable_reply_device(&dev)?;
                }
            }
            self.routed.insert(addr);
        }
        Ok(())
    }

    /// Whether the host side still exists.
    pub fn alive(&self) -> bool {
        device_exists(&self.host_if)
    }

    /// Delete the pair and this uplink's record; the last one out restores the host.
    pub fn stop(&mut self) {
        if self.host_if.is_empty() {
            return;
        }
        let lock = lock_state();
        if device_exists(&self.host_if) {
            if let Err(e) = netns::host_ip(&["link", "del", &self.host_if], b"") {
                eprintln!("h5i sentry: cannot delete {}: {e}", self.host_if);
            }
        }
        let _ = fs::remove_file(Path::new(STATE_DIR).join(&self.host_if));
        if lock.is_ok() {
            if let Err(e) = sweep_locked() {
                eprintln!("h5i sentry: cannot restore the host after the uplink: {e}");
            }
        }
        self.host_if.clear();
    }
}

impl Drop for VethUplink {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Turn forwarding on for `dev` when it is off: record its original value, add it to the
/// table's guard set, then flip it. The lock is held by the caller.
fn enable_reply_device(dev: &str) -> Result<(), VethError> {
    let flag = forwarding_path(dev);
    let now = fs::read_to_string(&flag).map_err(io_err("cannot read", &flag))?;
    if now.trim() != "0" {
        return Ok(());
    }
    let record = Path::new(STATE_DIR).join(format!("fwd-{dev}"));
    if !record.exists() {
        fs::write(&record, "0\n").map_err(io_err("cannot write", &record))?;
    }
    netns::host_nft(
        &["-f", "-"],
        format!("add element {HOST_TABLE} reply_devs {{ \"{dev}\" }}\n").as_bytes(),
    )?;
    fs::write(&flag, "1").map_err(io_err("cannot write", &flag))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_distinct_point_to_point_pairs_inside_the_range() {
        assert_eq!(
            slot_addrs(0),
            (Ipv4Addr::new(100, 127, 0, 0), Ipv4Addr::new(100, 127, 0, 1))
        );
        assert_eq!(
            slot_addrs(200),
            (
                Ipv4Addr::new(100, 127, 1, 144),
                Ipv4Addr::new(100, 127, 1, 145)
            )
        );
        assert_eq!(
            slot_addrs(SLOTS - 1),
            (
                Ipv4Addr::new(100, 127, 255, 254),
                Ipv4Addr::new(100, 127, 255, 255)
            )
        );
    }

    #[test]
    fn the_host_table_guards_the_reply_devices_and_never_forwards_into_a_box() {
        let t = host_table(&BTreeSet::from(["eth0".to_string()]));
        assert!(t.contains("elements = { \"eth0\" }"), "{t}");
        assert!(
            t.contains("iifname \"h5iu*\" oifname \"h5iu*\" drop"),
            "{t}"
        );
        assert!(
            t.contains(
                "oifname \"h5iu*\" ct state established,related accept\n    oifname \"h5iu*\" drop"
            ),
            "{t}"
        );
        assert!(t.contains("iifname @reply_devs drop"), "{t}");
        assert!(
            t.contains("chain input {") && t.contains("iifname \"h5iu*\" drop"),
            "{t}"
        );
        assert!(!host_table(&BTreeSet::new()).contains("elements"));
    }
}
