//! Test hosts in a network namespace of the test's own (HOST.md network rules): a veth pair whose
//! host end is 198.19.S.1/24 and whose far end carries two test hosts, 198.19.S.2 ("first") and
//! 198.19.S.3 ("second"), each serving a tiny TCP greeter on the given ports and logging every
//! UDP datagram. Nothing else is ever dialled; the veth name `h5isS` is the claim on subnet S.

use std::io::{BufRead, BufReader, Read};
use std::net::{Ipv4Addr, TcpListener};
use std::process::{Child, Command, Stdio};

use crate::netns::{Subnets, VethNet};
use crate::require_root;

pub use crate::netns::ip;

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

/// Two test hosts on a named namespace's veth pair, serving the greeter above.
pub struct TestHosts {
    net: VethNet,
    server: Option<Child>,
    pub first: Ipv4Addr,
    pub second: Ipv4Addr,
    pub gateway: Ipv4Addr,
}

/// 198.19.S.0/24 for S in 10..250, veth `h5isS`, namespace `h5i-sS`.
const SUBNETS: Subnets = Subnets {
    base: [198, 19],
    first: 10,
    count: 240,
    veth_prefix: "h5is",
    netns_prefix: Some("h5i-s"),
};

impl TestHosts {
    /// Bring the test hosts up, or `None` (after printing `skipped: <reason>`) when this test
    /// process cannot make network namespaces (not root).
    pub fn up(test: &str, tcp_ports: &[u16], udp_ports: &[u16]) -> Option<TestHosts> {
        if !require_root(test, "making test hosts: network namespaces + veth") {
            return None;
        }
        let net = VethNet::up(&SUBNETS, &[2, 3]);
        let (first, second, gateway) = (net.addr(2), net.addr(3), net.addr(1));
        let join = |v: &[u16]| v.iter().map(u16::to_string).collect::<Vec<_>>().join(",");
        let mut child = Command::new("ip")
            .args([
                "netns",
                "exec",
                net.ns.name().unwrap(),
                "python3",
                "-u",
                "-c",
            ])
            .arg(SERVER)
            .arg(format!("{first},{second}"))
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
        Some(TestHosts {
            net,
            server: Some(child),
            first,
            second,
            gateway,
        })
    }

    /// The network namespace holding the test hosts (to start another server there).
    pub fn ns(&self) -> &str {
        self.net.ns.name().unwrap()
    }

    /// A TCP listener on `addr:port` inside the test hosts' network namespace, for a server of
    /// the test's own (a scripted model service, say). The socket is made by a thread that
    /// joins the namespace and then ends, so this process stays in its own namespace; the
    /// socket keeps the one it was made in.
    pub fn listen(&self, addr: Ipv4Addr, port: u16) -> TcpListener {
        self.net
            .ns
            .run_in(|| TcpListener::bind((addr, port)).unwrap())
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
    /// The server goes first; `net` then removes the veth pair and the namespace.
    fn drop(&mut self) {
        if let Some(mut c) = self.server.take() {
            drop(c.stdin.take());
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
