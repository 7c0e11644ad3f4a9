//! Entry points for the fuzz targets in `fuzz/` (built only with the `fuzzing` feature): each
//! takes arbitrary bytes and drives one parser or decision the way hostile input reaches it,
//! asserting the properties the proxies rely on. A panic here is a finding.
//!
//! Must never: touch the network or the filesystem, or run without a bound (every loop ends
//! with the input).

use std::io::{BufReader, Read};

use crate::http1;

/// The HTTP/1 heads and bodies a client or upstream sends: requests read back to back (as a
/// keep-alive connection would), each one's framing decided and its body relayed; then the
/// same bytes read as a response. Whatever is relayed is re-framed canonically, so a head
/// written back out must read back as the same head.
pub fn http1_messages(data: &[u8]) {
    let mut from = BufReader::new(data);
    while let Ok(Some(req)) = http1::read_request(&mut from) {
        let Ok(framing) = req.body() else { break };
        let mut relayed = Vec::new();
        if http1::relay_body(framing, &mut from, &mut relayed).is_err() {
            break;
        }
        let again = http1::read_request(&mut BufReader::new(req.to_bytes().as_slice()));
        assert!(
            matches!(&again, Ok(Some(r)) if r.method == req.method && r.target == req.target && r.headers == req.headers),
            "a request head written out does not read back as itself"
        );
    }
    let mut from = BufReader::new(data);
    if let Ok(resp) = http1::read_response(&mut from) {
        if let Ok(framing) = resp.body("GET") {
            let _ = http1::relay_body(framing, &mut from, &mut std::io::sink());
        }
        let again = http1::read_response(&mut BufReader::new(resp.to_bytes().as_slice()));
        assert!(
            matches!(&again, Ok(r) if r.status == resp.status && r.headers == resp.headers),
            "a response head written out does not read back as itself"
        );
    }
    // Whatever is left is never read past: the reader holds no more than the input.
    let mut rest = Vec::new();
    let _ = from.read_to_end(&mut rest);
}

/// A CONNECT or absolute-form request target, as the egress proxy splits and names it.
pub fn egress_target(data: &[u8]) {
    let Ok(target) = std::str::from_utf8(data) else {
        return;
    };
    crate::egress::fuzz_target(target);
}

/// A socket-gate notification's arguments, as the supervisor reads them off the kernel: the
/// decision must not depend on the high halves the kernel drops, and must never allow a raw
/// or packet socket.
pub fn socket_gate(data: &[u8]) {
    use crate::socket_gate::{decide, GateRules, GateSyscall};
    let word = |i: usize| {
        let mut b = [0u8; 8];
        for (k, slot) in b.iter_mut().enumerate() {
            *slot = data.get(i * 8 + k).copied().unwrap_or(0);
        }
        u64::from_le_bytes(b)
    };
    let flags = data.first().copied().unwrap_or(0);
    let families: Vec<String> = ["netlink", "vsock", "packet", "bluetooth", "can"]
        .iter()
        .enumerate()
        .filter(|(i, _)| flags & (2 << i) != 0)
        .map(|(_, f)| (*f).to_owned())
        .collect();
    let rules = GateRules::for_policy(flags & 1 != 0, &families);
    let syscall = if word(1) & 1 == 0 {
        GateSyscall::Socket
    } else {
        GateSyscall::Socketpair
    };
    let (family, ty, protocol) = (word(2), word(3), word(4));
    let d = decide(syscall, family, ty, protocol, &rules);
    let low = |v: u64| v & 0xffff_ffff;
    assert_eq!(
        d,
        decide(syscall, low(family), low(ty), low(protocol), &rules),
        "the high halves changed the answer"
    );
    let raw = matches!((ty as u32 as i32) & 0xf, libc::SOCK_RAW | 10);
    let inet = matches!(family as u32 as i32, libc::AF_INET | libc::AF_INET6);
    if d.allow && syscall == GateSyscall::Socket && inet {
        assert!(!raw, "a raw inet socket was allowed: {d:?}");
    }
}
