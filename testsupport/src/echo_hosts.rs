//! Test hosts for the supervised-network tests, in an unnamed network namespace of their own
//! (HOST.md: veth pairs, 198.18.0.0/15 addresses, listeners the test made): greeters, a UDP echo
//! and a bulk stream, served by threads that a stop socket ends, plus greeters on the host's own
//! loopback and on the host's own address on the pair (which a box must not reach).

use std::io::Write;
use std::net::{SocketAddrV4, TcpListener, TcpStream, UdpSocket};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use crate::netns::{Subnets, VethNet};

/// A port the allowed test host streams [`EchoHosts::BULK_BYTES`] on.
pub const BULK_PORT: u16 = 7000;

/// Test hosts in a network namespace of their own, reached from the host over a veth pair:
/// host side `198.18.N.1`, test hosts `198.18.N.2` (the allowed one) and `198.18.N.3` (a
/// second host), each with TCP listeners on 8080 and 9090 that greet with
/// `host <addr>:<port>`, a UDP echo on 5353, and (on .2) [`BULK_PORT`] streaming
/// [`EchoHosts::BULK_BYTES`]. Plus listeners on the host's own loopback and on the host's side
/// of the pair, `198.18.N.1`. Everything is removed on drop.
pub struct EchoHosts {
    /// The third octet.
    pub net: u8,
    stop: UnixStream,
    threads: Vec<std::thread::JoinHandle<()>>,
    /// A listener on the host's 127.0.0.1 (the box must not reach it).
    pub host_loopback_port: u16,
    /// A listener on the host's own address `198.18.N.1` (the box must not reach it).
    pub host_address_port: u16,
    /// Dropped after the threads have ended: removes the veth pair; the namespace ends with its
    /// last socket.
    link: VethNet,
}

/// 198.18.N.0/24 for N in 100..250, veth `h5vN`, an unnamed namespace (`/run/netns` is shared
/// with Podman, which remounts it).
const SUBNETS: Subnets = Subnets {
    base: [198, 18],
    first: 100,
    count: 150,
    veth_prefix: "h5v",
    netns_prefix: None,
};

impl EchoHosts {
    /// Bytes the bulk port streams.
    pub const BULK_BYTES: u64 = 100 << 20;

    /// Make them on a `/24` of their own (see [`VethNet::up`]); the sockets are bound inside the
    /// namespace by a thread that then ends.
    pub fn new() -> EchoHosts {
        let link = VethNet::up(&SUBNETS, &[2, 3]);
        let (tcp, udp, bulk) = link.ns.run_in(|| {
            let mut tcp = Vec::new();
            let mut udp = Vec::new();
            for host in [2u8, 3] {
                let ip = link.addr(host);
                for port in [8080u16, 9090] {
                    tcp.push((
                        TcpListener::bind(SocketAddrV4::new(ip, port)).unwrap(),
                        port,
                    ));
                }
                udp.push(UdpSocket::bind(SocketAddrV4::new(ip, 5353)).unwrap());
            }
            let bulk = TcpListener::bind(SocketAddrV4::new(link.addr(2), BULK_PORT)).unwrap();
            (tcp, udp, bulk)
        });
        let (stop, stop_rx) = UnixStream::pair().unwrap();
        let stop_rx = std::sync::Arc::new(stop_rx);
        let host_lo = TcpListener::bind("127.0.0.1:0").unwrap();
        let host_loopback_port = host_lo.local_addr().unwrap().port();
        let host_addr = TcpListener::bind(SocketAddrV4::new(link.addr(1), 0)).unwrap();
        let host_address_port = host_addr.local_addr().unwrap().port();
        let mut threads = Vec::new();
        let mut listeners: Vec<(TcpListener, u16)> = tcp;
        listeners.push((host_lo, 0));
        listeners.push((host_addr, 0));
        for (l, _) in listeners {
            let stop = std::sync::Arc::clone(&stop_rx);
            threads.push(std::thread::spawn(move || {
                serve_tcp(&l, &stop, |c| {
                    let me = c.local_addr().unwrap();
                    let _ = writeln!(c, "host {me}");
                })
            }));
        }
        {
            let stop = std::sync::Arc::clone(&stop_rx);
            threads.push(std::thread::spawn(move || {
                serve_tcp(&bulk, &stop, |c| {
                    let chunk = vec![0x5au8; 1 << 16];
                    let mut left = EchoHosts::BULK_BYTES;
                    while left > 0 {
                        let n = left.min(chunk.len() as u64) as usize;
                        if c.write_all(&chunk[..n]).is_err() {
                            return;
                        }
                        left -= n as u64;
                    }
                })
            }));
        }
        for u in udp {
            let stop = std::sync::Arc::clone(&stop_rx);
            threads.push(std::thread::spawn(move || serve_udp(&u, &stop)));
        }
        EchoHosts {
            net: link.prefix[2],
            stop,
            threads,
            host_loopback_port,
            host_address_port,
            link,
        }
    }

    /// `198.18.N.<host>`.
    pub fn addr(&self, host: u8) -> String {
        self.link.addr(host).to_string()
    }
}

/// Wait for `fd` or the stop socket; true when `fd` is readable, false on stop.
fn wait_or_stop(fd: &impl AsFd, stop: &UnixStream) -> bool {
    let mut p = [
        libc::pollfd {
            fd: fd.as_fd().as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: stop.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    // SAFETY: two valid pollfds for the call's duration; no timeout (the stop socket ends it).
    let n = unsafe { libc::poll(p.as_mut_ptr(), 2, -1) };
    n > 0 && p[1].revents == 0
}

fn serve_tcp(l: &TcpListener, stop: &UnixStream, greet: impl Fn(&mut TcpStream)) {
    while wait_or_stop(l, stop) {
        if let Ok((mut c, _)) = l.accept() {
            let _ = c.set_write_timeout(Some(Duration::from_secs(30)));
            greet(&mut c);
        }
    }
}

fn serve_udp(u: &UdpSocket, stop: &UnixStream) {
    let mut buf = [0u8; 512];
    while wait_or_stop(u, stop) {
        if let Ok((_, from)) = u.recv_from(&mut buf) {
            let _ = u.send_to(b"udp-echo\n", from);
        }
    }
}

impl Drop for EchoHosts {
    fn drop(&mut self) {
        // Closing our end wakes every serving thread (POLLHUP on theirs).
        let _ = self.stop.shutdown(std::net::Shutdown::Both);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
