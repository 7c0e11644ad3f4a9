//! Test hosts in a network namespace of the test's own (HOST.md network rules): a veth pair whose
//! host end is 198.19.S.1/24 and whose far end carries two test hosts, 198.19.S.2 ("first") and
//! 198.19.S.3 ("second"), each serving a tiny TCP greeter on the given ports and logging every
//! UDP datagram. Nothing else is ever dialled; the netns name doubles as the lock on subnet S.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, TcpListener};
use std::os::fd::AsRawFd;
use std::process::{Child, Command, Stdio};

const SERVER: &str = r#"
import socket, sys, threading
out_lock = threading.Lock()
def say(line):
    with out_lock:
        sys.stdout.write(line + "\n"); sys.stdout.flush()
def tcp(addr, port):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, port)); s.listen(64)
    while True:
        c, peer = s.accept()
        say("tcp %s:%d" % (addr, port))
        try:
            c.sendall(("hello %s:%d\n" % (addr, port)).encode())
        finally:
            c.close()
def udp(addr, port):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind((addr, port))
    while True:
        data, peer = s.recvfrom(2048)
        say("udp %s:%d" % (addr, port))
addrs = sys.argv[1].split(","); tcps = [int(p) for p in sys.argv[2].split(",") if p]
udps = [int(p) for p in sys.argv[3].split(",") if p]
for a in addrs:
    for p in tcps: threading.Thread(target=tcp, args=(a, p), daemon=True).start()
    for p in udps: threading.Thread(target=udp, args=(a, p), daemon=True).start()
say("ready")
sys.stdin.read()
"#;

pub struct TestHosts {
    ns: String,
    veth: String,
    server: Option<Child>,
    pub first: Ipv4Addr,
    pub second: Ipv4Addr,
    pub gateway: Ipv4Addr,
}

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

impl TestHosts {
    /// Bring the test hosts up, or `None` (after printing `skipped: <reason>`) when this test
    /// process cannot make network namespaces (not root).
    pub fn up(test: &str, tcp_ports: &[u16], udp_ports: &[u16]) -> Option<TestHosts> {
        if !super::require_root(test, "making test hosts: network namespaces + veth") {
            return None;
        }
        let start = (std::process::id() as usize * 7) % 240;
        for k in 0..240 {
            let s = 10 + (start + k) % 240;
            let ns = format!("h5i-s{s}");
            if ip(&["netns", "add", &ns]).is_err() {
                continue;
            }
            let veth = format!("h5is{s}");
            let peer = format!("h5is{s}p");
            let mut hosts = TestHosts {
                ns: ns.clone(),
                veth: veth.clone(),
                server: None,
                first: Ipv4Addr::new(198, 19, s as u8, 2),
                second: Ipv4Addr::new(198, 19, s as u8, 3),
                gateway: Ipv4Addr::new(198, 19, s as u8, 1),
            };
            let _ = ip(&["link", "del", &veth]);
            let setup = [
                vec!["link", "add", &veth, "type", "veth", "peer", "name", &peer],
                vec!["link", "set", &peer, "netns", &ns],
            ];
            for a in &setup {
                ip(a).unwrap();
            }
            let gw = format!("{}/24", hosts.gateway);
            let first = format!("{}/24", hosts.first);
            let second = format!("{}/24", hosts.second);
            for a in [
                vec!["addr", "add", gw.as_str(), "dev", &veth],
                vec!["link", "set", &veth, "up"],
                vec!["-n", &ns, "addr", "add", first.as_str(), "dev", &peer],
                vec!["-n", &ns, "addr", "add", second.as_str(), "dev", &peer],
                vec!["-n", &ns, "link", "set", &peer, "up"],
                vec!["-n", &ns, "link", "set", "lo", "up"],
            ] {
                ip(&a).unwrap();
            }
            let join = |v: &[u16]| v.iter().map(u16::to_string).collect::<Vec<_>>().join(",");
            let mut child = Command::new("ip")
                .args(["netns", "exec", &ns, "python3", "-u", "-c", SERVER])
                .arg(format!("{},{}", hosts.first, hosts.second))
                .arg(join(tcp_ports))
                .arg(join(udp_ports))
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap();
            let mut line = String::new();
            BufReader::new(child.stdout.as_mut().unwrap())
                .read_line(&mut line)
                .unwrap();
            assert_eq!(line.trim(), "ready", "test host server did not start");
            hosts.server = Some(child);
            return Some(hosts);
        }
        panic!("no free 198.19.S.0/24 test subnet (every h5i-sS netns exists)");
    }

    /// The network namespace holding the test hosts (to start another server there).
    pub fn ns(&self) -> &str {
        &self.ns
    }

    /// A TCP listener on `addr:port` inside the test hosts' network namespace, for a server of
    /// the test's own (a scripted model service, say). The socket is made by a thread that
    /// joins the namespace and then ends, so this process stays in its own namespace; the
    /// socket keeps the one it was made in.
    pub fn listen(&self, addr: Ipv4Addr, port: u16) -> TcpListener {
        let ns = format!("/run/netns/{}", self.ns);
        std::thread::scope(|s| {
            s.spawn(|| {
                let f = std::fs::File::open(&ns).unwrap();
                // SAFETY: setns(2) moves only the calling thread (a network namespace is per
                // thread), and `f` is an open namespace file for the whole call.
                let rc = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
                assert_eq!(rc, 0, "setns {ns}: {}", std::io::Error::last_os_error());
                TcpListener::bind((addr, port)).unwrap()
            })
            .join()
            .unwrap()
        })
    }

    /// Stop the servers and return everything they logged (`tcp ADDR:PORT`, `udp ADDR:PORT`).
    pub fn log(&mut self) -> Vec<String> {
        let Some(mut child) = self.server.take() else {
            return Vec::new();
        };
        drop(child.stdin.take());
        let _ = child.kill();
        let mut text = String::new();
        let _ = child.stdout.take().unwrap().read_to_string(&mut text);
        let _ = child.wait();
        text.lines()
            .filter(|l| *l != "ready")
            .map(str::to_string)
            .collect()
    }

    /// `H5I_TEST_HOSTS` pinning `name` to the first host (the port part is ignored for egress).
    pub fn pin(&self, pairs: &[(&str, Ipv4Addr)]) -> String {
        pairs
            .iter()
            .map(|(n, a)| format!("{n}={a}:443"))
            .collect::<Vec<_>>()
            .join(",")
    }
}

impl Drop for TestHosts {
    fn drop(&mut self) {
        if let Some(mut c) = self.server.take() {
            if let Some(mut i) = c.stdin.take() {
                let _ = i.write_all(b"");
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = ip(&["link", "del", &self.veth]);
        let _ = ip(&["netns", "del", &self.ns]);
    }
}
