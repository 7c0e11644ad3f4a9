//! A network namespace of the test's own, joined to the host by a veth pair on a `/24` the test
//! claimed in 198.18.0.0/15 (HOST.md's network rules): host end `.1`, the test hosts' addresses
//! on the far end. The claim is the veth's name (`<prefix><third octet>`): link names are unique
//! in the host's namespace, so two test processes never share a subnet.

use std::fs::File;
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// Run `ip ARGS`; its stderr when it fails.
pub fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// A network namespace held open by a descriptor; a named one (`ip netns add`) is also removed on
/// drop, an unnamed one ends with its last descriptor and socket.
pub struct NetNs {
    file: File,
    name: Option<String>,
}

impl NetNs {
    /// `ip netns add NAME`, or the reason it failed (the name exists: another process's, or a
    /// crashed run's).
    pub fn named(name: &str) -> Result<NetNs, String> {
        ip(&["netns", "add", name])?;
        match File::open(format!("/run/netns/{name}")) {
            Ok(file) => Ok(NetNs {
                file,
                name: Some(name.to_string()),
            }),
            Err(e) => {
                let _ = ip(&["netns", "del", name]);
                Err(format!("/run/netns/{name}: {e}"))
            }
        }
    }

    /// A new namespace with no name (nothing under `/run/netns`, which Podman remounts): a thread
    /// unshares it, opens it and ends.
    pub fn unnamed() -> NetNs {
        let file = std::thread::scope(|s| {
            s.spawn(|| {
                // SAFETY: unshare(2) of the network namespace moves only this thread, which ends
                // right after opening it.
                let rc = unsafe { libc::unshare(libc::CLONE_NEWNET) };
                assert_eq!(rc, 0, "unshare: {}", std::io::Error::last_os_error());
                File::open("/proc/thread-self/ns/net").unwrap()
            })
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p))
        });
        NetNs { file, name: None }
    }

    /// Its `ip netns` name, when it has one.
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// What `ip link set DEV netns X` takes for it: the name, or a path to the open descriptor.
    fn target(&self) -> String {
        match &self.name {
            Some(n) => n.clone(),
            None => format!("/proc/{}/fd/{}", std::process::id(), self.file.as_raw_fd()),
        }
    }

    /// Run `f` on a thread that joined this namespace and ends with `f`, so the caller stays in
    /// its own; sockets `f` makes and processes it spawns keep the namespace they were made in.
    pub fn run_in<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        std::thread::scope(|s| {
            s.spawn(|| {
                // SAFETY: setns(2) moves only the calling thread (a network namespace is per
                // thread), and `file` is an open namespace file for the whole call.
                let rc = unsafe { libc::setns(self.file.as_raw_fd(), libc::CLONE_NEWNET) };
                assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
                f()
            })
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p))
        })
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        if let Some(name) = &self.name {
            let _ = ip(&["netns", "del", name]);
        }
    }
}

/// Which family of subnets a [`VethNet`] claims from.
pub struct Subnets {
    /// The first two octets (198.18 or 198.19).
    pub base: [u8; 2],
    /// The third octets tried, `first .. first + count`.
    pub first: u8,
    pub count: u8,
    /// The host end's name is this plus the third octet (the peer's adds `p`): at most 10 bytes.
    pub veth_prefix: &'static str,
    /// A named namespace `<this><third octet>`, or an unnamed one when None.
    pub netns_prefix: Option<&'static str>,
}

/// A claimed `/24`: a namespace with the far end of a veth pair holding `hosts`, the host end
/// `.1`. Removed on drop.
pub struct VethNet {
    pub ns: NetNs,
    veth: String,
    /// The `/24`'s first three octets.
    pub prefix: [u8; 3],
}

static CLAIMS: AtomicU32 = AtomicU32::new(0);

impl VethNet {
    /// Claim the first free `/24` of `subnets` (starting from a point picked from the pid and a
    /// counter, so parallel tests start apart) and bring it up with `.1` on the host end and each
    /// of `hosts` (last octets) on the far end. Panics when all `count` are taken.
    pub fn up(subnets: &Subnets, hosts: &[u8]) -> VethNet {
        let start = std::process::id() * 7 + CLAIMS.fetch_add(1, Ordering::SeqCst) * 11;
        for k in 0..u32::from(subnets.count) {
            let octet = subnets.first + ((start + k) % u32::from(subnets.count)) as u8;
            if let Some(net) = VethNet::claim(subnets, octet) {
                net.configure(hosts);
                return net;
            }
        }
        panic!(
            "no free {}.{}.N.0/24 test subnet for N in {}..{}",
            subnets.base[0],
            subnets.base[1],
            subnets.first,
            u16::from(subnets.first) + u16::from(subnets.count)
        );
    }

    /// Claim subnet `octet` by creating its veth pair and namespace; None when it is taken (the
    /// veth or namespace exists, or something on the host routes it already).
    fn claim(subnets: &Subnets, octet: u8) -> Option<VethNet> {
        let [a, b] = subnets.base;
        let routed = Command::new("ip")
            .args(["-4", "route", "show", &format!("{a}.{b}.{octet}.0/24")])
            .output()
            .unwrap();
        if !routed.stdout.is_empty() {
            return None;
        }
        let veth = format!("{}{octet}", subnets.veth_prefix);
        let peer = format!("{veth}p");
        ip(&["link", "add", &veth, "type", "veth", "peer", "name", &peer]).ok()?;
        let ns = match subnets.netns_prefix {
            Some(p) => match NetNs::named(&format!("{p}{octet}")) {
                Ok(ns) => ns,
                Err(_) => {
                    let _ = ip(&["link", "del", &veth]);
                    return None;
                }
            },
            None => NetNs::unnamed(),
        };
        Some(VethNet {
            ns,
            veth,
            prefix: [a, b, octet],
        })
    }

    fn configure(&self, hosts: &[u8]) {
        let peer = format!("{}p", self.veth);
        let gateway = format!("{}/24", self.addr(1));
        for args in [
            vec!["link", "set", peer.as_str(), "netns", &self.ns.target()],
            vec!["addr", "add", &gateway, "dev", &self.veth],
            vec!["link", "set", &self.veth, "up"],
        ] {
            ip(&args).unwrap();
        }
        let far: Vec<String> = hosts
            .iter()
            .map(|h| format!("{}/24", self.addr(*h)))
            .collect();
        self.ns.run_in(|| {
            for a in &far {
                ip(&["addr", "add", a, "dev", &peer]).unwrap();
            }
            ip(&["link", "set", &peer, "up"]).unwrap();
            ip(&["link", "set", "lo", "up"]).unwrap();
        });
    }

    /// `A.B.N.<host>`.
    pub fn addr(&self, host: u8) -> Ipv4Addr {
        let [a, b, n] = self.prefix;
        Ipv4Addr::new(a, b, n, host)
    }
}

impl Drop for VethNet {
    fn drop(&mut self) {
        // Deleting our end deletes the pair; the namespace goes when `ns` drops after this.
        let _ = ip(&["link", "del", &self.veth]);
    }
}
