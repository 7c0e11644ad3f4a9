//! Egress proxy figures, loopback only: `cargo bench -p h5i-broker --bench proxy`.
//!
//! - throughput: a 100 MB transfer through a CONNECT tunnel vs the same transfer direct, both
//!   directions (target: tunnel >= 0.9x direct), unpaced and with the sender paced to a 10 Gbit/s
//!   link;
//! - latency: 1,000 small HTTP requests, p50 and p99, direct vs through the proxy, on a
//!   kept-alive connection (plain-HTTP absolute form, and inside one CONNECT tunnel) and with a
//!   new connection per request (target: <= 0.5 ms added at p50).
//!
//! Every loop is bounded in count, every socket has a timeout, and nothing leaves 127.0.0.1:
//! names are pinned through the in-process resolver map. `BENCH_MB`, `BENCH_REQS` and
//! `BENCH_ROUNDS` scale it.
//!
//! On a small shared host the wall-clock ratio swings with whatever else runs, so each round
//! times a direct and a tunnelled transfer back to back and the ratio is taken per pair: the
//! report gives the median pair ratio with the spread of all pairs, and the CPU the whole bench
//! process spent per transfer (the proxy's cost, which load moves much less).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use h5i_broker::egress::{EgressOptions, EgressPlan, EgressProxy};
use h5i_broker::pin::{AddressRules, MapResolver};

const TIMEOUT: Duration = Duration::from_secs(30);
/// Interleaved direct/tunnel pairs per direction (`BENCH_ROUNDS`).
const ROUNDS: usize = 11;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn dial(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect_timeout(&addr, TIMEOUT).unwrap();
    s.set_read_timeout(Some(TIMEOUT)).unwrap();
    s.set_write_timeout(Some(TIMEOUT)).unwrap();
    s.set_nodelay(true).unwrap();
    s
}

/// Accept up to `max` connections, each handled by `f` on its own thread.
fn server(max: usize, f: fn(TcpStream)) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in l.incoming().take(max) {
            let Ok(s) = s else { continue };
            s.set_read_timeout(Some(TIMEOUT)).unwrap();
            s.set_nodelay(true).unwrap();
            std::thread::spawn(move || f(s));
        }
    });
    addr
}

/// Bulk peer: the first byte says the direction. `u`: read until EOF, answer the count.
/// `d` + 8-byte length + 8-byte pacing rate (bytes/s, 0 for none): send that many bytes,
/// then close.
fn bulk(mut s: TcpStream) {
    let mut op = [0u8; 1];
    if s.read_exact(&mut op).is_err() {
        return;
    }
    let mut buf = vec![0u8; 256 * 1024];
    if op[0] == b'u' {
        let mut total: u64 = 0;
        loop {
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => total += n as u64,
                Err(_) => return,
            }
        }
        let _ = s.write_all(&total.to_be_bytes());
    } else {
        let (mut len, mut rate) = ([0u8; 8], [0u8; 8]);
        if s.read_exact(&mut len).is_err() || s.read_exact(&mut rate).is_err() {
            return;
        }
        pace(&s, u64::from_be_bytes(rate));
        let mut left = u64::from_be_bytes(len);
        while left > 0 {
            let n = buf.len().min(left as usize);
            if s.write_all(&buf[..n]).is_err() {
                return;
            }
            left -= n as u64;
        }
    }
}

/// Tiny keep-alive HTTP origin: every request gets `200 ok`.
fn origin(s: TcpStream) {
    let mut w = s.try_clone().unwrap();
    let mut r = BufReader::new(s);
    let mut line = String::new();
    for _ in 0..100_000 {
        // Head: lines up to the blank one.
        let mut got_any = false;
        loop {
            line.clear();
            match r.read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            if line == "\r\n" && got_any {
                break;
            }
            got_any = true;
        }
        if w.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            .is_err()
        {
            return;
        }
    }
}

/// Open a CONNECT tunnel to `target` through `proxy`.
fn tunnel(proxy: SocketAddr, target: &str) -> TcpStream {
    let mut s = dial(proxy);
    write!(s, "CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").unwrap();
    // Read the 39-byte "HTTP/1.1 200 Connection established\r\n\r\n" exactly (no buffering past it).
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut b).unwrap();
        head.push(b[0]);
        assert!(head.len() < 1024);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    s
}

/// Cap what `s` sends at `rate` bytes/s (TCP's own pacing; 0 leaves it unpaced): a link of
/// that speed at the sending end, for the figure at a real uplink's rate.
fn pace(s: &TcpStream, rate: u64) {
    if rate == 0 {
        return;
    }
    let rate = rate as libc::c_ulong;
    // SAFETY: SO_MAX_PACING_RATE takes an unsigned long; `rate` lives across the call and the
    // length given is its size; the descriptor is an open TCP socket.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_MAX_PACING_RATE,
            (&rate as *const libc::c_ulong).cast(),
            std::mem::size_of::<libc::c_ulong>() as libc::socklen_t,
        )
    };
    assert_eq!(
        r,
        0,
        "SO_MAX_PACING_RATE: {}",
        std::io::Error::last_os_error()
    );
}

fn upload(mut s: TcpStream, bytes: u64, rate: u64) -> f64 {
    let buf = vec![7u8; 256 * 1024];
    pace(&s, rate);
    let t = Instant::now();
    s.write_all(b"u").unwrap();
    let mut left = bytes;
    while left > 0 {
        let n = buf.len().min(left as usize);
        s.write_all(&buf[..n]).unwrap();
        left -= n as u64;
    }
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut total = [0u8; 8];
    s.read_exact(&mut total).unwrap();
    assert_eq!(u64::from_be_bytes(total), bytes);
    t.elapsed().as_secs_f64()
}

fn download(mut s: TcpStream, bytes: u64, rate: u64) -> f64 {
    let mut buf = vec![0u8; 256 * 1024];
    let t = Instant::now();
    s.write_all(b"d").unwrap();
    s.write_all(&bytes.to_be_bytes()).unwrap();
    s.write_all(&rate.to_be_bytes()).unwrap();
    let mut got = 0u64;
    loop {
        match s.read(&mut buf).unwrap() {
            0 => break,
            n => got += n as u64,
        }
    }
    assert_eq!(got, bytes);
    t.elapsed().as_secs_f64()
}

/// CPU seconds (user + system) this process has used so far.
fn cpu_secs() -> f64 {
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: `ru` is a valid, zeroed rusage for getrusage to fill; RUSAGE_SELF is always valid.
    let ru = unsafe {
        libc::getrusage(libc::RUSAGE_SELF, ru.as_mut_ptr());
        ru.assume_init()
    };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

/// Time `n` request/response round trips on `s`, writing `req` each time; microseconds.
fn round_trips(s: &mut TcpStream, req: &[u8], n: usize) -> Vec<f64> {
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut out = Vec::with_capacity(n);
    let mut line = String::new();
    for _ in 0..n {
        let t = Instant::now();
        s.write_all(req).unwrap();
        read_ok(&mut r, &mut line);
        out.push(t.elapsed().as_secs_f64() * 1e6);
    }
    out
}

/// Read one `200 ok` response with a 2-byte body.
fn read_ok(r: &mut BufReader<TcpStream>, line: &mut String) {
    line.clear();
    r.read_line(line).unwrap();
    assert!(line.starts_with("HTTP/1.1 200"), "{line}");
    loop {
        line.clear();
        r.read_line(line).unwrap();
        if line == "\r\n" {
            break;
        }
    }
    let mut body = [0u8; 2];
    r.read_exact(&mut body).unwrap();
}

fn report(name: &str, direct: &[f64], proxied: &[f64]) {
    let mut d = direct.to_vec();
    let mut p = proxied.to_vec();
    d.sort_by(|a, b| a.total_cmp(b));
    p.sort_by(|a, b| a.total_cmp(b));
    let (d50, d99, p50, p99) = (pct(&d, 0.5), pct(&d, 0.99), pct(&p, 0.5), pct(&p, 0.99));
    println!(
        "latency {name:<28} direct p50 {d50:7.1} us p99 {d99:7.1} us | proxy p50 {p50:7.1} us p99 {p99:7.1} us | added p50 {:6.3} ms p99 {:6.3} ms",
        (p50 - d50) / 1000.0,
        (p99 - d99) / 1000.0
    );
}

fn main() {
    let mb = env_usize("BENCH_MB", 100) as u64;
    let reqs = env_usize("BENCH_REQS", 1000);
    let bytes = mb * 1_000_000;
    let rounds = env_usize("BENCH_ROUNDS", ROUNDS).max(1);

    let bulk_addr = server(8 * rounds + 16, bulk);
    let origin_addr = server(2 * reqs + 64, origin);
    let m = MapResolver::new();
    m.insert("bulk.test", 443, vec![bulk_addr]);
    m.insert("web.test", 80, vec![origin_addr]);
    m.insert("web.test", 443, vec![origin_addr]);
    let plan = EgressPlan::build(
        &[
            "bulk.test:443".parse().unwrap(),
            "web.test:80".parse().unwrap(),
            "web.test:443".parse().unwrap(),
        ],
        &m,
        // Loopback stand-ins, so loopback is allowed here; production rules refuse it.
        &AddressRules::allowing_loopback(),
    );
    let proxy = EgressProxy::serve(
        TcpListener::bind("127.0.0.1:0").unwrap(),
        plan,
        EgressOptions::default(),
    )
    .unwrap();
    let p = proxy.local_addr();

    // Throughput, interleaved so drift hits both sides alike: unpaced (loopback at full speed,
    // where both ends and the proxy compete for the CPUs), then with the sender paced to a
    // 10 Gbit/s link (`BENCH_PACE_MBPS`), the fastest uplink a box is likely to have.
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let pace_mbps = env_usize("BENCH_PACE_MBPS", 1250) as u64;
    for rate in [0, pace_mbps * 1_000_000] {
        for (dir, f) in [
            ("upload", upload as fn(TcpStream, u64, u64) -> f64),
            ("download", download),
        ] {
            let (mut d, mut t) = (Vec::new(), Vec::new());
            let (mut dc, mut tc) = (Vec::new(), Vec::new());
            f(dial(bulk_addr), bytes / 10, rate); // warm-up
            f(tunnel(p, "bulk.test:443"), bytes / 10, rate);
            for _ in 0..rounds {
                let c = cpu_secs();
                d.push(f(dial(bulk_addr), bytes, rate));
                dc.push(cpu_secs() - c);
                let c = cpu_secs();
                t.push(f(tunnel(p, "bulk.test:443"), bytes, rate));
                tc.push(cpu_secs() - c);
            }
            let mut ratios: Vec<f64> = d.iter().zip(&t).map(|(d, t)| d / t).collect();
            ratios.sort_by(|a, b| a.total_cmp(b));
            let (dcpu, tcpu) = (median(dc), median(tc));
            let (dm, tm) = (median(d), median(t));
            let mbps = |s: f64| bytes as f64 / s / 1e6;
            let label = if rate == 0 {
                format!("{dir:<8} {mb} MB")
            } else {
                format!("{dir:<8} {mb} MB, sender paced to {pace_mbps} MB/s")
            };
            println!(
                "throughput {label}: direct {:8.0} MB/s ({:6.1} ms) | CONNECT tunnel {:8.0} MB/s ({:6.1} ms) | ratio {:.2}x, {rounds} pairs {:.2}..{:.2}x (target >= 0.90x)",
                mbps(dm),
                dm * 1e3,
                mbps(tm),
                tm * 1e3,
                median(ratios.clone()),
                ratios[0],
                ratios[ratios.len() - 1],
            );
            println!(
                "           CPU (user+sys, whole bench process) per transfer: direct {:5.1} ms, tunnel {:5.1} ms: the proxy adds {:5.1} ms per {mb} MB",
                dcpu * 1e3,
                tcpu * 1e3,
                (tcpu - dcpu) * 1e3,
            );
            if rate == 0 {
                // Sender, receiver and proxy all run on this host's CPUs: the tunnel's CPU per
                // transfer bounds its wall time from below, whatever the proxy's design.
                println!(
                    "           CPU-bound ceiling on {cpus} CPUs: {:.2}x with every CPU busy for the whole transfer, {:.2}x at the direct transfer's own parallelism",
                    (dm * cpus as f64 / tcpu).min(1.0),
                    (dcpu / tcpu).min(1.0),
                );
            }
        }
    }

    // Latency on one kept-alive connection.
    let get_direct = b"GET /x HTTP/1.1\r\nHost: web.test\r\n\r\n";
    let get_proxy = b"GET http://web.test/x HTTP/1.1\r\nHost: web.test\r\n\r\n";
    let mut direct = dial(origin_addr);
    let mut via = dial(p);
    let mut tun = tunnel(p, "web.test:443");
    round_trips(&mut direct, get_direct, 50);
    round_trips(&mut via, get_proxy, 50);
    round_trips(&mut tun, get_direct, 50);
    let d = round_trips(&mut direct, get_direct, reqs);
    let v = round_trips(&mut via, get_proxy, reqs);
    let t = round_trips(&mut tun, get_direct, reqs);
    report("keep-alive, plain HTTP", &d, &v);
    report("keep-alive, in one tunnel", &d, &t);

    // A new connection per request (the proxy also dials a new upstream each time).
    let mut line = String::new();
    let (mut d, mut v) = (Vec::with_capacity(reqs), Vec::with_capacity(reqs));
    let mut est = Vec::new();
    for _ in 0..reqs {
        let t0 = Instant::now();
        let mut s = dial(origin_addr);
        s.write_all(b"GET /x HTTP/1.1\r\nHost: web.test\r\nConnection: close\r\n\r\n")
            .unwrap();
        read_ok(&mut BufReader::new(s), &mut line);
        d.push(t0.elapsed().as_secs_f64() * 1e6);
        let t0 = Instant::now();
        let mut s = tunnel(p, "web.test:443");
        est.push(t0.elapsed().as_secs_f64() * 1e6);
        s.write_all(b"GET /x HTTP/1.1\r\nHost: web.test\r\nConnection: close\r\n\r\n")
            .unwrap();
        read_ok(&mut BufReader::new(s), &mut line);
        v.push(t0.elapsed().as_secs_f64() * 1e6);
    }
    report("new connection + CONNECT", &d, &v);
    report("  of which CONNECT setup", &d, &est);

    let r = proxy.shutdown();
    println!(
        "proxy tally: {} allowed destinations, {} denied attempts, {} lingering threads",
        r.tally.allowed.len(),
        r.denied_total,
        r.lingering
    );
}
