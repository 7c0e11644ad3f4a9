//! The box table's counters read over netlink by the sentry itself, and a run's tally as the
//! difference of two readings.
//!
//! Owns [`CounterReader`] (a `NETLINK_NETFILTER` socket made inside the box's network namespace
//! once, at attach: `h5i_sys::netlink`; or, at the process tier, made there by the box's hook
//! and handed to h5i: `denied_net`), the four dump requests one reading is (the inet
//! tables, for `h5i`'s handle; the rules of its output chain; the elements of `denied4` and of
//! `denied6`), the parse of their
//! answers into [`Counters`], and [`tally`]: what one run did, `after` minus `before`, per
//! pinned rule and per denied key, as `nft::render` laid the table out (allowed rules by their
//! `h5i-allow-N` comment, the final reject rule by `h5i-denied`, denied keys as the sets'
//! `daddr . l4proto . dport` concatenations).
//!
//! Every answer carries the ruleset's generation (nf_tables' `res_id`): a reading whose dumps
//! disagree, or whose dump the kernel marked interrupted, was taken while the ruleset changed
//! (any table of the namespace: the browser fence's too) and is retried once, then refused. A
//! reading names the table by its handle, which the kernel numbers anew for every table it
//! makes: a tally whose two readings are of different tables (the table was replaced during the
//! run), or whose counters went back, is refused rather than mixed.
//!
//! Must never: report a count the table did not hold, subtract across two different tables,
//! or wait on the kernel without a bound. Guarded by the unit tests below (answers as the
//! kernel lays them out) and `hooks/tests/supervised_net.rs`, `tests/supervised_sandbox.rs`.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsFd, OwnedFd};
use std::time::Duration;

use h5i_policy::receipt::{EgressTally, PinnedRule};

use crate::netns::BoxNamespaces;
use crate::nft::{ALLOW_COMMENT, DENIED_COMMENT, UNRECORDED_KEY};

/// How long one netlink answer may take.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);
/// The receive buffer: larger than any one datagram of a dump (the kernel fills at most 32 KiB).
const RECV_BUF: usize = 64 * 1024;
/// Most datagrams one dump may answer with (two full sets fit many times over).
const MAX_DATAGRAMS: usize = 4096;

const NLMSG_HDR: usize = 16;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_DUMP: u16 = 0x300;
const NLM_F_DUMP_INTR: u16 = 0x10;
const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFT_MSG_NEWTABLE: u16 = 0;
const NFT_MSG_GETTABLE: u16 = 1;
const NFT_MSG_NEWRULE: u16 = 6;
const NFT_MSG_GETRULE: u16 = 7;
const NFT_MSG_NEWSETELEM: u16 = 12;
const NFT_MSG_GETSETELEM: u16 = 13;
const NFPROTO_INET: u8 = 1;
const NLA_TYPE_MASK: u16 = 0x3fff;
const NFTA_TABLE_NAME: u16 = 1;
const NFTA_TABLE_HANDLE: u16 = 4;
const NFTA_RULE_TABLE: u16 = 1;
const NFTA_RULE_CHAIN: u16 = 2;
const NFTA_RULE_EXPRESSIONS: u16 = 4;
const NFTA_RULE_USERDATA: u16 = 7;
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_EXPR_NAME: u16 = 1;
const NFTA_EXPR_DATA: u16 = 2;
const NFTA_COUNTER_PACKETS: u16 = 2;
const NFTA_SET_ELEM_LIST_TABLE: u16 = 1;
const NFTA_SET_ELEM_LIST_SET: u16 = 2;
const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
const NFTA_SET_ELEM_KEY: u16 = 1;
const NFTA_SET_ELEM_EXPR: u16 = 7;
const NFTA_SET_ELEM_EXPRESSIONS: u16 = 10;
const NFTA_DATA_VALUE: u16 = 1;
/// libnftnl's user-data TLV type of a rule's comment.
const NFTNL_UDATA_RULE_COMMENT: u8 = 0;

/// Why the counters could not be read.
#[derive(Debug, thiserror::Error)]
pub enum CounterError {
    /// The socket could not be made or the exchange failed.
    #[error("refusing: cannot read the box table's counters over netlink: {0}; to fix: check nf_tables works here (`unshare -rn nft list ruleset`)")]
    Io(#[from] std::io::Error),
    /// The kernel's answer was not what the table should hold.
    #[error("refusing: the box table's counters are not as h5i made them: {0}; to fix: report this as an h5i bug")]
    Answer(String),
    /// The ruleset changed while it was read, or between a run's two readings.
    #[error("refusing: the box's nftables ruleset changed {0}; to fix: run `h5i box abort` on the box to rebuild its sandbox")]
    Changed(&'static str),
}

fn bad(what: impl Into<String>) -> CounterError {
    CounterError::Answer(what.into())
}

/// One reading of the table's counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counters {
    /// The table's handle: which table the reading is of.
    pub table: u64,
    /// Packets per allowed rule index (`h5i-allow-N`; the IPv4 and IPv6 rules of one summed).
    pub allowed: BTreeMap<usize, u64>,
    /// Packets of the final reject rule (every refused packet, keyed or not).
    pub denied_total: u64,
    /// Packets per denied key (`address:port/proto`, IPv6 addresses in brackets).
    pub denied: BTreeMap<String, u64>,
}

/// A netfilter netlink socket in the box's network namespace.
#[derive(Debug)]
pub struct CounterReader {
    sock: OwnedFd,
    seq: u32,
    protocols: ProtocolNames,
}

impl CounterReader {
    /// Make the socket inside `ns` (one forked child, no program run).
    pub fn open(
        ns: &BoxNamespaces,
        protocols: ProtocolNames,
    ) -> Result<CounterReader, CounterError> {
        let sock =
            h5i_sys::netlink::netfilter_socket_in(ns.net().as_fd(), ns.user().map(AsFd::as_fd))?;
        Ok(CounterReader {
            sock,
            seq: 0,
            protocols,
        })
    }

    /// Read through `sock`, a `NETLINK_NETFILTER` socket already made inside the box's network
    /// namespace (the process tier's hook makes it there and hands it to h5i: `denied_net`).
    pub fn from_socket(sock: OwnedFd, protocols: ProtocolNames) -> CounterReader {
        CounterReader {
            sock,
            seq: 0,
            protocols,
        }
    }

    /// Read the table's counters: one consistent reading (retried once when the ruleset
    /// changed under it).
    pub fn read(&mut self) -> Result<Counters, CounterError> {
        match self.read_once() {
            Err(CounterError::Changed(_)) => self.read_once(),
            other => other,
        }
    }

    fn read_once(&mut self) -> Result<Counters, CounterError> {
        let mut c = Counters::default();
        let tables = self.dump(NFT_MSG_GETTABLE, NFT_MSG_NEWTABLE, &[])?;
        c.table = tables
            .messages
            .iter()
            .find_map(|m| table_handle(m).transpose())
            .ok_or_else(|| bad("no table inet h5i"))??;
        let rules = self.dump(
            NFT_MSG_GETRULE,
            NFT_MSG_NEWRULE,
            &[
                (NFTA_RULE_TABLE, TABLE_NAME),
                (NFTA_RULE_CHAIN, b"output\0"),
            ],
        )?;
        let mut generations = vec![tables.generation, rules.generation];
        let mut denied_total = None;
        for msg in &rules.messages {
            rule_counter(msg, &mut c.allowed, &mut denied_total)?;
        }
        c.denied_total = denied_total.ok_or_else(|| bad("no counter on the final reject rule"))?;
        for (set, v6) in [(&b"denied4\0"[..], false), (&b"denied6\0"[..], true)] {
            let elems = self.dump(
                NFT_MSG_GETSETELEM,
                NFT_MSG_NEWSETELEM,
                &[
                    (NFTA_SET_ELEM_LIST_TABLE, TABLE_NAME),
                    (NFTA_SET_ELEM_LIST_SET, set),
                ],
            )?;
            generations.push(elems.generation);
            for msg in &elems.messages {
                set_elements(msg, v6, &self.protocols, &mut c.denied)?;
            }
        }
        if generations.windows(2).any(|w| w[0] != w[1]) {
            return Err(CounterError::Changed("while its counters were read"));
        }
        Ok(c)
    }

    /// One dump exchange: the `get` request, then every answer to its sequence number up to
    /// `NLMSG_DONE`; the answers' payloads (after the nfgenmsg), each of message type `reply`.
    fn dump(&mut self, get: u16, reply: u16, attrs: &[(u16, &[u8])]) -> Result<Dump, CounterError> {
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        h5i_sys::netlink::send(&self.sock, &request(get, seq, attrs))?;
        let reply = (NFNL_SUBSYS_NFTABLES << 8) | reply;
        let mut out = Dump::default();
        let mut buf = vec![0u8; RECV_BUF];
        for _ in 0..MAX_DATAGRAMS {
            let n = h5i_sys::netlink::recv(&self.sock, &mut buf, ANSWER_TIMEOUT)?;
            if let Some(done) = parse_datagram(&buf[..n], seq, reply, &mut out)? {
                return done.map(|()| out);
            }
        }
        Err(bad(format!("a dump longer than {MAX_DATAGRAMS} datagrams")))
    }
}

/// `h5i\0`, the table's name as netlink carries it.
const TABLE_NAME: &[u8] = b"h5i\0";

/// What one dump answered.
#[derive(Debug, Default)]
struct Dump {
    generation: u16,
    messages: Vec<Vec<u8>>,
}

/// A dump request: nlmsghdr, nfgenmsg (family inet), then `attrs` (strings NUL-terminated by
/// the caller).
fn request(msg: u16, seq: u32, attrs: &[(u16, &[u8])]) -> Vec<u8> {
    let mut body = vec![NFPROTO_INET, 0, 0, 0];
    for (ty, value) in attrs {
        let len = 4 + value.len();
        body.extend_from_slice(&(len as u16).to_ne_bytes());
        body.extend_from_slice(&ty.to_ne_bytes());
        body.extend_from_slice(value);
        body.resize(body.len().next_multiple_of(4), 0);
    }
    let mut out = Vec::with_capacity(NLMSG_HDR + body.len());
    out.extend_from_slice(&((NLMSG_HDR + body.len()) as u32).to_ne_bytes());
    out.extend_from_slice(&((NFNL_SUBSYS_NFTABLES << 8) | msg).to_ne_bytes());
    out.extend_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
    out.extend_from_slice(&seq.to_ne_bytes());
    out.extend_from_slice(&0u32.to_ne_bytes());
    out.extend_from_slice(&body);
    out
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// Walk one datagram's messages into `out`; `Some` once the dump ended (with its result).
fn parse_datagram(
    mut b: &[u8],
    seq: u32,
    reply: u16,
    out: &mut Dump,
) -> Result<Option<Result<(), CounterError>>, CounterError> {
    while b.len() >= NLMSG_HDR {
        let len = u32_at(b, 0).unwrap_or(0) as usize;
        if len < NLMSG_HDR || len > b.len() {
            return Err(bad(format!("a netlink message of length {len}")));
        }
        let (ty, flags, got_seq) = (
            u16_at(b, 4).unwrap_or(0),
            u16_at(b, 6).unwrap_or(0),
            u32_at(b, 8).unwrap_or(0),
        );
        let payload = &b[NLMSG_HDR..len];
        b = &b[len.next_multiple_of(4).min(b.len())..];
        if got_seq != seq {
            continue;
        }
        if flags & NLM_F_DUMP_INTR != 0 {
            return Ok(Some(Err(CounterError::Changed(
                "while its counters were read",
            ))));
        }
        match ty {
            NLMSG_ERROR | NLMSG_DONE => {
                let errno = u32_at(payload, 0).map_or(0, |e| e as i32);
                return Ok(Some(if errno < 0 {
                    Err(std::io::Error::from_raw_os_error(-errno).into())
                } else {
                    Ok(())
                }));
            }
            t if t == reply => {
                let generation = u16_at(payload, 2).map(u16::from_be);
                let generation = generation.ok_or_else(|| bad("an answer without nfgenmsg"))?;
                if out.messages.is_empty() {
                    out.generation = generation;
                } else if out.generation != generation {
                    return Ok(Some(Err(CounterError::Changed(
                        "while its counters were read",
                    ))));
                }
                out.messages.push(payload[4..].to_vec());
            }
            t => return Err(bad(format!("an answer of message type {t:#x}"))),
        }
    }
    Ok(None)
}

/// The handle of a `NEWTABLE` answer when it is `h5i`'s.
fn table_handle(msg: &[u8]) -> Result<Option<u64>, CounterError> {
    let a = attrs(msg)?;
    if attr(&a, NFTA_TABLE_NAME) != Some(TABLE_NAME) {
        return Ok(None);
    }
    let handle = attr(&a, NFTA_TABLE_HANDLE)
        .and_then(|v| <[u8; 8]>::try_from(v).ok())
        .ok_or_else(|| bad("table h5i without a handle"))?;
    Ok(Some(u64::from_be_bytes(handle)))
}

/// The attributes of `b`: `(type without flags, value)`.
fn attrs(mut b: &[u8]) -> Result<Vec<(u16, &[u8])>, CounterError> {
    let mut out = Vec::new();
    while b.len() >= 4 {
        let len = usize::from(u16_at(b, 0).unwrap_or(0));
        if len < 4 || len > b.len() {
            return Err(bad(format!("an attribute of length {len}")));
        }
        out.push((u16_at(b, 2).unwrap_or(0) & NLA_TYPE_MASK, &b[4..len]));
        b = &b[len.next_multiple_of(4).min(b.len())..];
    }
    Ok(out)
}

fn attr<'a>(list: &[(u16, &'a [u8])], ty: u16) -> Option<&'a [u8]> {
    list.iter().find(|(t, _)| *t == ty).map(|(_, v)| *v)
}

/// The packets of the counter among `exprs` (a list of `NFTA_LIST_ELEM` expressions, or one
/// expression's own attributes when `single`).
fn counter_packets(exprs: &[u8], single: bool) -> Result<Option<u64>, CounterError> {
    let elems: Vec<&[u8]> = if single {
        vec![exprs]
    } else {
        attrs(exprs)?
            .into_iter()
            .filter(|(t, _)| *t == NFTA_LIST_ELEM)
            .map(|(_, v)| v)
            .collect()
    };
    for elem in elems {
        let e = attrs(elem)?;
        if attr(&e, NFTA_EXPR_NAME) != Some(b"counter\0") {
            continue;
        }
        let data = attrs(attr(&e, NFTA_EXPR_DATA).ok_or_else(|| bad("a counter without data"))?)?;
        let packets = attr(&data, NFTA_COUNTER_PACKETS)
            .and_then(|v| <[u8; 8]>::try_from(v).ok())
            .ok_or_else(|| bad("a counter without packets"))?;
        return Ok(Some(u64::from_be_bytes(packets)));
    }
    Ok(None)
}

/// A rule's comment (libnftnl's user-data TLVs, type 0).
fn rule_comment(mut udata: &[u8]) -> Option<&str> {
    while udata.len() >= 2 {
        let (ty, len) = (udata[0], usize::from(udata[1]));
        let value = udata.get(2..2 + len)?;
        if ty == NFTNL_UDATA_RULE_COMMENT {
            return std::str::from_utf8(value.strip_suffix(b"\0").unwrap_or(value)).ok();
        }
        udata = &udata[2 + len..];
    }
    None
}

/// One rule's counter, into the allowed rule it belongs to or as the final reject's.
fn rule_counter(
    msg: &[u8],
    allowed: &mut BTreeMap<usize, u64>,
    denied_total: &mut Option<u64>,
) -> Result<(), CounterError> {
    let a = attrs(msg)?;
    let Some(comment) = attr(&a, NFTA_RULE_USERDATA).and_then(rule_comment) else {
        return Ok(());
    };
    let packets = match attr(&a, NFTA_RULE_EXPRESSIONS) {
        Some(exprs) => counter_packets(exprs, false)?,
        None => None,
    };
    if let Some(i) = comment.strip_prefix(ALLOW_COMMENT) {
        let i: usize = i
            .parse()
            .map_err(|_| bad(format!("rule comment {comment:?}")))?;
        *allowed.entry(i).or_default() += packets.unwrap_or(0);
    } else if comment == DENIED_COMMENT {
        *denied_total = Some(packets.ok_or_else(|| bad("the final reject rule has no counter"))?);
    }
    Ok(())
}

/// One `NEWSETELEM` answer's elements, keyed and counted.
fn set_elements(
    msg: &[u8],
    v6: bool,
    protocols: &ProtocolNames,
    denied: &mut BTreeMap<String, u64>,
) -> Result<(), CounterError> {
    let a = attrs(msg)?;
    let Some(elements) = attr(&a, NFTA_SET_ELEM_LIST_ELEMENTS) else {
        return Ok(());
    };
    for (_, elem) in attrs(elements)?
        .into_iter()
        .filter(|(t, _)| *t == NFTA_LIST_ELEM)
    {
        let e = attrs(elem)?;
        let key = attr(&e, NFTA_SET_ELEM_KEY).ok_or_else(|| bad("a set element without key"))?;
        let key = attr(&attrs(key)?, NFTA_DATA_VALUE)
            .ok_or_else(|| bad("a set element key without value"))?;
        let packets = match (
            attr(&e, NFTA_SET_ELEM_EXPR),
            attr(&e, NFTA_SET_ELEM_EXPRESSIONS),
        ) {
            (Some(one), _) => counter_packets(one, true)?,
            (None, Some(list)) => counter_packets(list, false)?,
            (None, None) => None,
        };
        let packets = packets.ok_or_else(|| bad("a denied set element without counter"))?;
        *denied.entry(denied_key(key, v6, protocols)?).or_default() += packets;
    }
    Ok(())
}

/// `address:port/proto` from a `daddr . l4proto . dport` key: each field starts a 4-byte
/// register (address 4 or 16 bytes, protocol 1, port 2 in network order).
fn denied_key(key: &[u8], v6: bool, protocols: &ProtocolNames) -> Result<String, CounterError> {
    let addr_len = if v6 { 16 } else { 4 };
    if key.len() != addr_len + 8 {
        return Err(bad(format!("a denied key of {} bytes", key.len())));
    }
    let addr = if v6 {
        let octets: [u8; 16] = key[..16].try_into().map_err(|_| bad("key"))?;
        format!("[{}]", Ipv6Addr::from(octets))
    } else {
        let octets: [u8; 4] = key[..4].try_into().map_err(|_| bad("key"))?;
        Ipv4Addr::from(octets).to_string()
    };
    let proto = protocols.name(key[addr_len]);
    let port = u16::from_be_bytes([key[addr_len + 4], key[addr_len + 5]]);
    Ok(format!("{addr}:{port}/{proto}"))
}

/// Protocol names by number, as nft prints them (the first name `/etc/protocols` gives a
/// number); `proto-N` for a number it does not name.
#[derive(Debug, Clone, Default)]
pub struct ProtocolNames(BTreeMap<u8, String>);

impl ProtocolNames {
    /// From the text of `/etc/protocols`.
    pub fn parse(text: &str) -> ProtocolNames {
        let mut names = BTreeMap::new();
        for line in text.lines() {
            let mut words = line.split('#').next().unwrap_or("").split_whitespace();
            if let (Some(name), Some(Ok(n))) = (words.next(), words.next().map(str::parse::<u8>)) {
                names.entry(n).or_insert_with(|| name.to_string());
            }
        }
        ProtocolNames(names)
    }

    /// This host's (`/etc/protocols`; none when it is missing).
    pub fn of_host() -> ProtocolNames {
        ProtocolNames::parse(&std::fs::read_to_string("/etc/protocols").unwrap_or_default())
    }

    fn name(&self, n: u8) -> String {
        self.0
            .get(&n)
            .cloned()
            .unwrap_or_else(|| format!("proto-{n}"))
    }
}

/// What one run did: `after` minus `before` (`None`: since the table was loaded, every counter
/// from zero), per pinned rule (each appears, with 0 when unused) and per denied key (only keys
/// it refused; refusals the sets had no room to key under [`UNRECORDED_KEY`]).
pub fn tally(
    before: Option<&Counters>,
    after: &Counters,
    rules: &[PinnedRule],
) -> Result<EgressTally, CounterError> {
    let zero = Counters {
        table: after.table,
        ..Counters::default()
    };
    let before = before.unwrap_or(&zero);
    if before.table != after.table {
        return Err(CounterError::Changed(
            "during the run (its table was replaced)",
        ));
    }
    let since = |now: u64, then: u64| {
        now.checked_sub(then).ok_or(CounterError::Changed(
            "during the run (a counter went back)",
        ))
    };
    let mut allowed: BTreeMap<String, u64> = rules
        .iter()
        .map(|r| (format!("{}:{}", r.host, r.port), 0))
        .collect();
    for (i, packets) in &after.allowed {
        let r = rules
            .get(*i)
            .ok_or_else(|| bad(format!("rule comment {ALLOW_COMMENT}{i}")))?;
        let then = before.allowed.get(i).copied().unwrap_or(0);
        *allowed.entry(format!("{}:{}", r.host, r.port)).or_default() += since(*packets, then)?;
    }
    let mut denied = BTreeMap::new();
    let mut keyed = 0;
    for (key, packets) in &after.denied {
        let d = since(*packets, before.denied.get(key).copied().unwrap_or(0))?;
        if d > 0 {
            keyed += d;
            denied.insert(key.clone(), d);
        }
    }
    let total = since(after.denied_total, before.denied_total)?;
    if total > keyed {
        denied.insert(UNRECORDED_KEY.to_string(), total - keyed);
    }
    Ok(EgressTally {
        allowed,
        denied,
        uncounted: None,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn nla(ty: u16, value: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&((4 + value.len()) as u16).to_ne_bytes());
        out.extend_from_slice(&ty.to_ne_bytes());
        out.extend_from_slice(value);
        out.resize(out.len().next_multiple_of(4), 0);
        out
    }

    fn nested(ty: u16, parts: &[Vec<u8>]) -> Vec<u8> {
        nla(ty | 0x8000, &parts.concat())
    }

    fn counter(packets: u64) -> Vec<Vec<u8>> {
        vec![
            nla(NFTA_EXPR_NAME, b"counter\0"),
            nested(
                NFTA_EXPR_DATA,
                &[
                    nla(1, &(packets * 60).to_be_bytes()),
                    nla(NFTA_COUNTER_PACKETS, &packets.to_be_bytes()),
                ],
            ),
        ]
    }

    fn rule(comment: &str, packets: Option<u64>) -> Vec<u8> {
        let mut exprs = vec![nested(
            NFTA_LIST_ELEM,
            &[
                nla(NFTA_EXPR_NAME, b"payload\0"),
                nested(NFTA_EXPR_DATA, &[]),
            ],
        )];
        if let Some(p) = packets {
            exprs.push(nested(NFTA_LIST_ELEM, &counter(p)));
        }
        let mut udata = vec![NFTNL_UDATA_RULE_COMMENT, (comment.len() + 1) as u8];
        udata.extend_from_slice(comment.as_bytes());
        udata.push(0);
        [
            nla(NFTA_RULE_TABLE, b"h5i\0"),
            nla(NFTA_RULE_CHAIN, b"output\0"),
            nested(NFTA_RULE_EXPRESSIONS, &exprs),
            nla(NFTA_RULE_USERDATA, &udata),
        ]
        .concat()
    }

    fn element(key: Vec<u8>, packets: u64, as_list: bool) -> Vec<u8> {
        let expr = if as_list {
            nested(
                NFTA_SET_ELEM_EXPRESSIONS,
                &[nested(NFTA_LIST_ELEM, &counter(packets))],
            )
        } else {
            nested(NFTA_SET_ELEM_EXPR, &counter(packets))
        };
        nested(
            NFTA_LIST_ELEM,
            &[
                nested(NFTA_SET_ELEM_KEY, &[nla(NFTA_DATA_VALUE, &key)]),
                expr,
            ],
        )
    }

    fn v4_key(addr: [u8; 4], proto: u8, port: u16) -> Vec<u8> {
        let p = port.to_be_bytes();
        [&addr[..], &[proto, 0, 0, 0], &[p[0], p[1], 0, 0]].concat()
    }

    fn message(ty: u16, seq: u32, flags: u16, generation: u16, attrs: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&((NLMSG_HDR + 4 + attrs.len()) as u32).to_ne_bytes());
        out.extend_from_slice(&ty.to_ne_bytes());
        out.extend_from_slice(&flags.to_ne_bytes());
        out.extend_from_slice(&seq.to_ne_bytes());
        out.extend_from_slice(&0u32.to_ne_bytes());
        out.extend_from_slice(&[NFPROTO_INET, 0]);
        out.extend_from_slice(&generation.to_be_bytes());
        out.extend_from_slice(attrs);
        out
    }

    fn done(seq: u32) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&20u32.to_ne_bytes());
        out.extend_from_slice(&NLMSG_DONE.to_ne_bytes());
        out.extend_from_slice(&2u16.to_ne_bytes());
        out.extend_from_slice(&seq.to_ne_bytes());
        out.extend_from_slice(&0u32.to_ne_bytes());
        out.extend_from_slice(&0i32.to_ne_bytes());
        out
    }

    const REPLY_RULE: u16 = (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWRULE;
    const REPLY_ELEM: u16 = (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWSETELEM;

    #[test]
    fn a_dump_request_is_laid_out_as_nfnetlink_expects() {
        let r = request(NFT_MSG_GETRULE, 7, &[(NFTA_RULE_TABLE, TABLE_NAME)]);
        assert_eq!(r.len(), 16 + 4 + 8);
        assert_eq!(u32_at(&r, 0), Some(28));
        assert_eq!(u16_at(&r, 4), Some(0x0a07));
        assert_eq!(u16_at(&r, 6), Some(0x301));
        assert_eq!(u32_at(&r, 8), Some(7));
        assert_eq!(&r[16..20], &[1, 0, 0, 0]);
        assert_eq!(&r[20..28], &[8, 0, 1, 0, b'h', b'5', b'i', 0]);
    }

    #[test]
    fn rule_answers_give_allowed_counts_by_comment_and_the_reject_total() {
        let mut dump = Dump::default();
        let datagram = [
            message(REPLY_RULE, 3, 2, 9, &rule("h5i-allow-0", Some(2))),
            message(REPLY_RULE, 3, 2, 9, &rule("h5i-allow-0", Some(1))),
            message(REPLY_RULE, 3, 2, 9, &rule("h5i-allow-1", Some(0))),
            message(REPLY_RULE, 3, 2, 9, &rule("h5i-denied", Some(7))),
            done(3),
        ]
        .concat();
        let end = parse_datagram(&datagram, 3, REPLY_RULE, &mut dump).unwrap();
        assert!(matches!(end, Some(Ok(()))));
        assert_eq!(dump.generation, 9);
        let (mut allowed, mut total) = (BTreeMap::new(), None);
        for m in &dump.messages {
            rule_counter(m, &mut allowed, &mut total).unwrap();
        }
        assert_eq!(allowed, BTreeMap::from([(0, 3), (1, 0)]));
        assert_eq!(total, Some(7));
    }

    #[test]
    fn set_element_answers_give_denied_keys_either_expression_layout() {
        let protocols = ProtocolNames::parse("tcp 6 TCP\nudp\t17 UDP # comment\nipv6-icmp 58\n");
        let v6 = [
            &[0x20, 0x01, 0x0d, 0xb8][..],
            &[0; 11],
            &[9],
            &[58, 0, 0, 0],
            &[0; 4],
        ]
        .concat();
        let attrs_v4 = nested(
            NFTA_SET_ELEM_LIST_ELEMENTS,
            &[
                element(v4_key([198, 18, 0, 2], 6, 9090), 1, false),
                element(v4_key([198, 18, 0, 2], 17, 53), 2, true),
                element(v4_key([198, 18, 0, 3], 99, 0), 1, false),
            ],
        );
        let mut denied = BTreeMap::new();
        set_elements(&attrs_v4, false, &protocols, &mut denied).unwrap();
        let attrs_v6 = nested(NFTA_SET_ELEM_LIST_ELEMENTS, &[element(v6, 2, false)]);
        set_elements(&attrs_v6, true, &protocols, &mut denied).unwrap();
        assert_eq!(
            denied,
            BTreeMap::from([
                ("198.18.0.2:9090/tcp".into(), 1),
                ("198.18.0.2:53/udp".into(), 2),
                ("198.18.0.3:0/proto-99".into(), 1),
                ("[2001:db8::9]:0/ipv6-icmp".into(), 2),
            ])
        );
    }

    #[test]
    fn an_interrupted_dump_or_mixed_generations_are_a_change_not_a_reading() {
        let mut dump = Dump::default();
        let intr = message(
            REPLY_RULE,
            1,
            2 | NLM_F_DUMP_INTR,
            4,
            &rule("h5i-denied", Some(1)),
        );
        let end = parse_datagram(&intr, 1, REPLY_RULE, &mut dump).unwrap();
        assert!(matches!(end, Some(Err(CounterError::Changed(_)))));
        let mut dump = Dump::default();
        let mixed = [
            message(REPLY_ELEM, 1, 2, 4, &[]),
            message(REPLY_ELEM, 1, 2, 5, &[]),
        ]
        .concat();
        let end = parse_datagram(&mixed, 1, REPLY_ELEM, &mut dump).unwrap();
        assert!(matches!(end, Some(Err(CounterError::Changed(_)))));
    }

    #[test]
    fn kernel_refusals_and_malformed_answers_are_errors() {
        let mut dump = Dump::default();
        let mut err = done(5);
        err[4..6].copy_from_slice(&NLMSG_ERROR.to_ne_bytes());
        err[16..20].copy_from_slice(&(-libc::ENOENT).to_ne_bytes());
        let end = parse_datagram(&err, 5, REPLY_RULE, &mut dump).unwrap();
        assert!(
            matches!(end, Some(Err(CounterError::Io(ref e))) if e.raw_os_error() == Some(libc::ENOENT))
        );
        let mut short = done(5);
        short[0..4].copy_from_slice(&64u32.to_ne_bytes());
        assert!(parse_datagram(&short, 5, REPLY_RULE, &mut dump).is_err());
        assert!(attrs(&[200, 0, 1, 0]).is_err());
        let (mut allowed, mut total) = (BTreeMap::new(), None);
        assert!(rule_counter(&rule("h5i-allow-x", Some(1)), &mut allowed, &mut total).is_err());
        assert!(rule_counter(&rule("h5i-denied", None), &mut allowed, &mut total).is_err());
        assert!(denied_key(&[0; 11], false, &ProtocolNames::default()).is_err());
    }

    #[test]
    fn answers_to_another_sequence_number_are_not_this_dumps() {
        let mut dump = Dump::default();
        let datagram = [
            message(REPLY_RULE, 8, 2, 1, &rule("h5i-denied", Some(5))),
            done(8),
        ]
        .concat();
        assert!(parse_datagram(&datagram, 9, REPLY_RULE, &mut dump)
            .unwrap()
            .is_none());
        assert!(dump.messages.is_empty());
    }

    fn reading(
        table: u64,
        allowed: &[(usize, u64)],
        total: u64,
        denied: &[(&str, u64)],
    ) -> Counters {
        Counters {
            table,
            allowed: allowed.iter().copied().collect(),
            denied_total: total,
            denied: denied.iter().map(|(k, v)| ((*k).to_string(), *v)).collect(),
        }
    }

    #[test]
    fn a_runs_tally_is_the_difference_of_its_two_readings() {
        let before = reading(3, &[(0, 4), (1, 0)], 5, &[("198.18.0.9:80/tcp", 3)]);
        let after = reading(
            3,
            &[(0, 6), (1, 1)],
            9,
            &[("198.18.0.9:80/tcp", 3), ("198.18.0.5:443/tcp", 1)],
        );
        let t = tally(Some(&before), &after, &crate::nft::tests::rules()).unwrap();
        assert_eq!(
            t.allowed,
            BTreeMap::from([("api.test:443".into(), 2), ("git.test:22".into(), 1)])
        );
        assert_eq!(
            t.denied,
            BTreeMap::from([("198.18.0.5:443/tcp".into(), 1), (UNRECORDED_KEY.into(), 3),]),
            "a key refused only before the run is not this run's"
        );
        let fresh = tally(None, &after, &crate::nft::tests::rules()).unwrap();
        assert_eq!(fresh.denied.get("198.18.0.9:80/tcp"), Some(&3));
    }

    #[test]
    fn a_table_answer_gives_h5is_handle_and_no_other_tables() {
        let browser = [
            nla(NFTA_TABLE_NAME, b"h5i_browser\0"),
            nla(NFTA_TABLE_HANDLE, &3u64.to_be_bytes()),
        ]
        .concat();
        assert_eq!(table_handle(&browser).unwrap(), None);
        let ours = [
            nla(NFTA_TABLE_NAME, b"h5i\0"),
            nla(NFTA_TABLE_HANDLE, &9u64.to_be_bytes()),
        ]
        .concat();
        assert_eq!(table_handle(&ours).unwrap(), Some(9));
        assert!(table_handle(&nla(NFTA_TABLE_NAME, b"h5i\0")).is_err());
    }

    #[test]
    fn two_readings_of_different_tables_are_refused() {
        let before = reading(3, &[(0, 4)], 5, &[]);
        let replaced = reading(4, &[(0, 6)], 5, &[]);
        assert!(matches!(
            tally(Some(&before), &replaced, &crate::nft::tests::rules()),
            Err(CounterError::Changed(_))
        ));
        let went_back = reading(3, &[(0, 1)], 5, &[]);
        assert!(matches!(
            tally(Some(&before), &went_back, &crate::nft::tests::rules()),
            Err(CounterError::Changed(_))
        ));
        let foreign = reading(3, &[(7, 1)], 5, &[]);
        assert!(tally(None, &foreign, &crate::nft::tests::rules()).is_err());
    }
}
