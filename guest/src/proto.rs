//! The frames h5i and its guest agent exchange over one virtio-serial port.
//!
//! A frame is a 9-byte header — kind (`u8`), session (`u32` LE), payload length (`u32` LE) —
//! and the payload. The host opens a session with [`Kind::Hello`] carrying a session number of
//! its choosing; every frame of that session carries it. A `Hello` always resets the port: a
//! run still going from an earlier session (whose host end went away) is killed first, output
//! still queued for it is dropped, and the host reads nothing before its own session's
//! [`Kind::Ready`] ([`FrameBuffer::skip_to`]) and drops any frame whose session is not its
//! own, so bytes a killed run left in flight never reach the next run's output.
//!
//! Sessions are delimited by frames only, never by the port's connection state: the guest
//! kernel hears of a host connection's open and close apart from its bytes, and can hear of
//! the previous connection's close after the next one's first bytes.
//!
//! A run is either piped (the command's stdin, stdout and stderr are pipes of the agent's) or
//! on a terminal of the guest's own ([`RunSpec::pty`]): the agent opens a pty in the guest, the
//! command's stdio and controlling terminal are its slave, what the command writes arrives as
//! [`Kind::Stdout`] and the host's window changes as [`Kind::Resize`].
//!
//! The version ([`VERSION`]) changes with any change to the frames or messages; the host
//! refuses an agent that announces another one.
//!
//! Must never: accept a payload over [`MAX_PAYLOAD`], a string over [`MAX_FIELD`], more than
//! [`MAX_LIST`] list entries, a window of zero rows or columns, or trailing bytes after a
//! message.

use std::io::{self, Read, Write};

/// The protocol version the agent announces in [`Kind::Ready`].
pub const VERSION: &str = "h5i-guest/3";

/// The largest payload either side sends or accepts.
pub const MAX_PAYLOAD: usize = 1 << 20;
/// The largest string field (one argv word, one environment entry).
pub const MAX_FIELD: usize = 128 << 10;
/// The most entries in one list (argv, environment).
pub const MAX_LIST: usize = 4096;
/// The name prefix of the agent's ports (`h5i.0`, `h5i.1`, ...).
pub const PORT_PREFIX: &str = "h5i.";
/// How many ports a VM has: up to this many runs of one box at once.
pub const PORTS: usize = 4;
/// The guest loopback port of port 0's egress forward; port `i`'s is this plus `i`
/// ([`proxy_port`]).
pub const PROXY_PORT_BASE: u16 = 3128;
/// The most forwarded connections one run holds open at once (more are accepted and closed).
pub const MAX_CONNS: usize = 256;

/// The guest loopback port on which the run of port `port` reaches the host's egress proxy.
pub fn proxy_port(port: usize) -> u16 {
    PROXY_PORT_BASE + port as u16
}

/// Every kind of frame. Host-to-guest kinds are below 0x80, guest-to-host at or above.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Host: open a session (empty payload).
    Hello,
    /// Host: run a command ([`RunSpec`]).
    Run,
    /// Host: bytes for the command's stdin.
    Stdin,
    /// Host: the command's stdin is at its end.
    StdinEof,
    /// Host: kill everything of the run (the wall clock fired, or the caller was interrupted).
    Kill,
    /// Host: bytes from the egress proxy for a forwarded connection ([`NetData`]).
    NetToGuest,
    /// Host: the egress proxy ended its side of a forwarded connection ([`conn_id`]).
    NetCloseToGuest,
    /// Host: the terminal's window changed ([`WinSize`]; a run on a pty only).
    Resize,
    /// Guest: the session is open; payload is [`VERSION`].
    Ready,
    /// Guest: bytes the command wrote to stdout.
    Stdout,
    /// Guest: bytes the command wrote to stderr.
    Stderr,
    /// Guest: the command ended ([`ExitReport`]).
    Exit,
    /// Guest: the command could not be started (UTF-8 reason).
    Failed,
    /// Guest: a command connected to the run's forward ([`conn_id`]): the host opens a
    /// connection to its egress proxy for it.
    NetOpen,
    /// Guest: bytes a command sent on a forwarded connection ([`NetData`]).
    NetFromGuest,
    /// Guest: the command ended its side of a forwarded connection ([`conn_id`]).
    NetCloseFromGuest,
}

impl Kind {
    fn code(self) -> u8 {
        match self {
            Kind::Hello => 0x01,
            Kind::Run => 0x02,
            Kind::Stdin => 0x03,
            Kind::StdinEof => 0x04,
            Kind::Kill => 0x05,
            Kind::NetToGuest => 0x06,
            Kind::NetCloseToGuest => 0x07,
            Kind::Resize => 0x08,
            Kind::Ready => 0x81,
            Kind::Stdout => 0x82,
            Kind::Stderr => 0x83,
            Kind::Exit => 0x84,
            Kind::Failed => 0x85,
            Kind::NetOpen => 0x86,
            Kind::NetFromGuest => 0x87,
            Kind::NetCloseFromGuest => 0x88,
        }
    }

    fn from_code(c: u8) -> Option<Kind> {
        Some(match c {
            0x01 => Kind::Hello,
            0x02 => Kind::Run,
            0x03 => Kind::Stdin,
            0x04 => Kind::StdinEof,
            0x05 => Kind::Kill,
            0x06 => Kind::NetToGuest,
            0x07 => Kind::NetCloseToGuest,
            0x08 => Kind::Resize,
            0x81 => Kind::Ready,
            0x82 => Kind::Stdout,
            0x83 => Kind::Stderr,
            0x84 => Kind::Exit,
            0x85 => Kind::Failed,
            0x86 => Kind::NetOpen,
            0x87 => Kind::NetFromGuest,
            0x88 => Kind::NetCloseFromGuest,
            _ => return None,
        })
    }
}

/// One frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// What it is.
    pub kind: Kind,
    /// The session it belongs to.
    pub session: u32,
    /// Its payload.
    pub payload: Vec<u8>,
}

/// A frame that broke the protocol.
fn bad(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("h5i-guest protocol: {what}"),
    )
}

impl Frame {
    /// A frame of `kind` in `session`.
    pub fn new(kind: Kind, session: u32, payload: Vec<u8>) -> Frame {
        Frame {
            kind,
            session,
            payload,
        }
    }

    /// The frame's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(9 + self.payload.len());
        out.push(self.kind.code());
        out.extend_from_slice(&self.session.to_le_bytes());
        out.extend_from_slice(&(self.payload.len() as u32).to_le_bytes());
        out.extend_from_slice(&self.payload);
        out
    }

    /// Write it whole.
    pub fn write_to(&self, w: &mut impl Write) -> io::Result<()> {
        if self.payload.len() > MAX_PAYLOAD {
            return Err(bad("payload too large"));
        }
        w.write_all(&self.encode())
    }

    /// Read one frame; `Ok(None)` at a clean end of stream before a header.
    pub fn read_from(r: &mut impl Read) -> io::Result<Option<Frame>> {
        let mut header = [0u8; 9];
        let mut got = 0;
        while got < header.len() {
            match r.read(&mut header[got..]) {
                Ok(0) if got == 0 => return Ok(None),
                Ok(0) => return Err(bad("stream ended inside a frame header")),
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        let (kind, session, len) = parse_header(&header)?;
        let mut payload = vec![0u8; len];
        r.read_exact(&mut payload)?;
        Ok(Some(Frame {
            kind,
            session,
            payload,
        }))
    }
}

/// A header's kind, session and payload length (checked against [`MAX_PAYLOAD`]).
pub fn parse_header(h: &[u8; 9]) -> io::Result<(Kind, u32, usize)> {
    let kind = Kind::from_code(h[0]).ok_or_else(|| bad("unknown frame kind"))?;
    let session = u32::from_le_bytes([h[1], h[2], h[3], h[4]]);
    let len = u32::from_le_bytes([h[5], h[6], h[7], h[8]]) as usize;
    if len > MAX_PAYLOAD {
        return Err(bad("payload too large"));
    }
    Ok((kind, session, len))
}

/// Incremental frame parsing over a byte buffer (for a non-blocking reader).
#[derive(Debug, Default)]
pub struct FrameBuffer {
    buf: Vec<u8>,
}

impl FrameBuffer {
    /// Append bytes read from the stream.
    pub fn extend(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// Whether no byte is buffered.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Drop every byte before the first header of `kind` in `session`, keeping a tail that may
    /// be the start of one; true when the buffer now starts with such a header. The host's way
    /// into a port: what a new connection reads first may be the unwritten rest of an earlier
    /// session's output (cut anywhere, so not parseable), and nothing before its own session's
    /// first frame is of any use to it. A session number is random and the guest's commands
    /// never learn it, so no earlier output can pose as that header but by chance (2^-32).
    pub fn skip_to(&mut self, kind: Kind, session: u32) -> bool {
        let mut want = [0u8; 5];
        want[0] = kind.code();
        want[1..].copy_from_slice(&session.to_le_bytes());
        if let Some(at) = self.buf.windows(want.len()).position(|w| w == want) {
            self.buf.drain(..at);
            return true;
        }
        let keep = (1..want.len())
            .rev()
            .find(|&n| self.buf.ends_with(&want[..n]))
            .unwrap_or(0);
        let cut = self.buf.len() - keep;
        self.buf.drain(..cut);
        false
    }

    /// The next whole frame, if the buffer holds one.
    pub fn next_frame(&mut self) -> io::Result<Option<Frame>> {
        if self.buf.len() < 9 {
            return Ok(None);
        }
        let mut h = [0u8; 9];
        h.copy_from_slice(&self.buf[..9]);
        let (kind, session, len) = parse_header(&h)?;
        if self.buf.len() < 9 + len {
            return Ok(None);
        }
        let payload = self.buf[9..9 + len].to_vec();
        self.buf.drain(..9 + len);
        Ok(Some(Frame {
            kind,
            session,
            payload,
        }))
    }
}

/// What to run: the payload of [`Kind::Run`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RunSpec {
    /// The command and its arguments (at least one word).
    pub argv: Vec<Vec<u8>>,
    /// The whole environment, `KEY=VALUE` (nothing is inherited from the agent).
    pub env: Vec<Vec<u8>>,
    /// The working directory.
    pub cwd: Vec<u8>,
    /// The run's memory ceiling in bytes (0: the VM's size is the only one).
    pub mem_bytes: u64,
    /// The run's process-count ceiling (0: none beyond the VM's).
    pub procs: u64,
    /// Whether the run may reach the host's egress proxy through its port's forward
    /// ([`proxy_port`]); without it the forward accepts and closes every connection.
    pub egress: bool,
    /// Run on a pty of the guest's own, of this window size (`None`: on pipes).
    pub pty: Option<WinSize>,
}

/// A terminal's window: the payload of [`Kind::Resize`], and a run's first size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WinSize {
    /// Rows (at least 1).
    pub rows: u16,
    /// Columns (at least 1).
    pub cols: u16,
}

impl WinSize {
    /// The payload: rows then columns, `u16` LE each.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = self.rows.to_le_bytes().to_vec();
        out.extend_from_slice(&self.cols.to_le_bytes());
        out
    }

    /// Parse a payload strictly: 4 bytes, neither figure 0.
    pub fn decode(payload: &[u8]) -> io::Result<WinSize> {
        let b: [u8; 4] = payload
            .try_into()
            .map_err(|_| bad("a window size is 4 bytes"))?;
        WinSize::checked(
            u64::from(u16::from_le_bytes([b[0], b[1]])),
            u64::from(u16::from_le_bytes([b[2], b[3]])),
        )
    }

    fn checked(rows: u64, cols: u64) -> io::Result<WinSize> {
        match (u16::try_from(rows), u16::try_from(cols)) {
            (Ok(rows), Ok(cols)) if rows > 0 && cols > 0 => Ok(WinSize { rows, cols }),
            _ => Err(bad("a window size out of range")),
        }
    }
}

/// How the command ended: the payload of [`Kind::Exit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ExitReport {
    /// Its exit code, when it exited.
    pub code: Option<i32>,
    /// The signal that ended it, when one did.
    pub signal: Option<i32>,
    /// OOM kills in the run's cgroup (`memory.events` `oom_kill`).
    pub oom_kills: u64,
    /// The run's memory ceiling in force (0: none).
    pub mem_limit: u64,
    /// Peak memory of the run's cgroup (`memory.peak`), 0 when the kernel does not say.
    pub mem_peak: u64,
    /// CPU time of the run's cgroup, user and system, microseconds (`cpu.stat`).
    pub user_us: u64,
    /// System CPU time, microseconds.
    pub sys_us: u64,
}

struct Enc(Vec<u8>);

impl Enc {
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn bytes(&mut self, b: &[u8]) {
        self.0.extend_from_slice(&(b.len() as u32).to_le_bytes());
        self.0.extend_from_slice(b);
    }
    fn list(&mut self, l: &[Vec<u8>]) {
        self.0.extend_from_slice(&(l.len() as u32).to_le_bytes());
        for b in l {
            self.bytes(b);
        }
    }
}

struct Dec<'a>(&'a [u8]);

impl Dec<'_> {
    fn take(&mut self, n: usize) -> io::Result<&[u8]> {
        if self.0.len() < n {
            return Err(bad("message ends early"));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    fn u32(&mut self) -> io::Result<u32> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self) -> io::Result<u64> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }
    fn bytes(&mut self) -> io::Result<Vec<u8>> {
        let n = self.u32()? as usize;
        if n > MAX_FIELD {
            return Err(bad("field too long"));
        }
        Ok(self.take(n)?.to_vec())
    }
    fn list(&mut self) -> io::Result<Vec<Vec<u8>>> {
        let n = self.u32()? as usize;
        if n > MAX_LIST {
            return Err(bad("list too long"));
        }
        (0..n).map(|_| self.bytes()).collect()
    }
    fn end(self) -> io::Result<()> {
        match self.0.is_empty() {
            true => Ok(()),
            false => Err(bad("trailing bytes after a message")),
        }
    }
}

impl RunSpec {
    /// Its payload bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Enc(Vec::new());
        e.list(&self.argv);
        e.list(&self.env);
        e.bytes(&self.cwd);
        e.u64(self.mem_bytes);
        e.u64(self.procs);
        e.u64(u64::from(self.egress));
        match self.pty {
            None => [0, 0, 0].iter().for_each(|v| e.u64(*v)),
            Some(w) => [1, u64::from(w.rows), u64::from(w.cols)]
                .iter()
                .for_each(|v| e.u64(*v)),
        }
        e.0
    }

    /// Parse a payload strictly: no NUL inside a word, at least one argv word, every
    /// environment entry `KEY=VALUE`.
    pub fn decode(b: &[u8]) -> io::Result<RunSpec> {
        let mut d = Dec(b);
        let spec = RunSpec {
            argv: d.list()?,
            env: d.list()?,
            cwd: d.bytes()?,
            mem_bytes: d.u64()?,
            procs: d.u64()?,
            egress: match d.u64()? {
                0 => false,
                1 => true,
                _ => return Err(bad("egress is neither 0 nor 1")),
            },
            pty: match (d.u64()?, d.u64()?, d.u64()?) {
                (0, 0, 0) => None,
                (1, rows, cols) => Some(WinSize::checked(rows, cols)?),
                _ => return Err(bad("a pty flag that is neither 0 nor 1")),
            },
        };
        d.end()?;
        if spec.argv.is_empty() || spec.argv[0].is_empty() {
            return Err(bad("empty command"));
        }
        let words = spec.argv.iter().chain(&spec.env).chain([&spec.cwd]);
        if words.into_iter().any(|w| w.contains(&0)) {
            return Err(bad("NUL inside a word"));
        }
        if spec
            .env
            .iter()
            .any(|kv| kv.iter().position(|&c| c == b'=').is_none_or(|i| i == 0))
        {
            return Err(bad("environment entry without KEY="));
        }
        Ok(spec)
    }
}

impl ExitReport {
    /// Its payload bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Enc(Vec::new());
        e.u64(self.code.map_or(u64::MAX, |c| c as u32 as u64));
        e.u64(self.signal.map_or(u64::MAX, |s| s as u32 as u64));
        for v in [
            self.oom_kills,
            self.mem_limit,
            self.mem_peak,
            self.user_us,
            self.sys_us,
        ] {
            e.u64(v);
        }
        e.0
    }

    /// Parse a payload strictly (a code is 0..=255, a signal 1..=64).
    pub fn decode(b: &[u8]) -> io::Result<ExitReport> {
        let mut d = Dec(b);
        let code = match d.u64()? {
            u64::MAX => None,
            c if c <= 255 => Some(c as i32),
            _ => return Err(bad("exit code out of range")),
        };
        let signal = match d.u64()? {
            u64::MAX => None,
            s if (1..=64).contains(&s) => Some(s as i32),
            _ => return Err(bad("signal out of range")),
        };
        let r = ExitReport {
            code,
            signal,
            oom_kills: d.u64()?,
            mem_limit: d.u64()?,
            mem_peak: d.u64()?,
            user_us: d.u64()?,
            sys_us: d.u64()?,
        };
        d.end()?;
        if r.code.is_some() == r.signal.is_some() {
            return Err(bad("an exit names exactly one of a code and a signal"));
        }
        Ok(r)
    }
}

/// Write what a non-blocking `w` takes now from the front of `pending`. `Ok` when it is all
/// written or `w` would block; the error when `w` is broken (a forwarded connection's end).
pub fn write_pending(w: &mut impl Write, pending: &mut Vec<u8>) -> io::Result<()> {
    while !pending.is_empty() {
        match w.write(pending) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                pending.drain(..n);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The payload of a connection's close: its id.
pub fn conn_id(payload: &[u8]) -> io::Result<u32> {
    let b: [u8; 4] = payload
        .try_into()
        .map_err(|_| bad("a connection id is 4 bytes"))?;
    Ok(u32::from_le_bytes(b))
}

/// The payload of a forwarded connection's bytes: its id, then the bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetData<'a> {
    /// The connection.
    pub id: u32,
    /// Its bytes.
    pub bytes: &'a [u8],
}

impl<'a> NetData<'a> {
    /// The payload: id (`u32` LE) then the bytes.
    pub fn encode(id: u32, bytes: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(4 + bytes.len());
        out.extend_from_slice(&id.to_le_bytes());
        out.extend_from_slice(bytes);
        out
    }

    /// Parse a payload (at least the id).
    pub fn decode(payload: &'a [u8]) -> io::Result<NetData<'a>> {
        if payload.len() < 4 {
            return Err(bad("forwarded bytes without a connection id"));
        }
        let (id, bytes) = payload.split_at(4);
        Ok(NetData {
            id: conn_id(id)?,
            bytes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_spec_and_an_exit_round_trip() {
        let spec = RunSpec {
            argv: vec![b"sh".to_vec(), b"-c".to_vec(), b"echo \xff".to_vec()],
            env: vec![b"A=b=c".to_vec()],
            cwd: b"/work".to_vec(),
            mem_bytes: 64 << 20,
            procs: 32,
            egress: true,
            pty: Some(WinSize { rows: 24, cols: 80 }),
        };
        assert_eq!(RunSpec::decode(&spec.encode()).unwrap(), spec);
        let piped = RunSpec { pty: None, ..spec };
        assert_eq!(RunSpec::decode(&piped.encode()).unwrap(), piped);
        let w = WinSize {
            rows: 37,
            cols: 111,
        };
        assert_eq!(WinSize::decode(&w.encode()).unwrap(), w);
        let exit = ExitReport {
            signal: Some(9),
            oom_kills: 1,
            ..ExitReport::default()
        };
        assert_eq!(ExitReport::decode(&exit.encode()).unwrap(), exit);
    }

    #[test]
    fn hostile_messages_are_refused_not_trusted() {
        let ok = RunSpec {
            argv: vec![b"true".to_vec()],
            ..RunSpec::default()
        };
        let mut trailing = ok.encode();
        trailing.push(0);
        assert!(RunSpec::decode(&trailing).is_err());
        let nul = RunSpec {
            argv: vec![b"tr\0ue".to_vec()],
            ..RunSpec::default()
        };
        assert!(RunSpec::decode(&nul.encode()).is_err());
        let env = RunSpec {
            env: vec![b"=x".to_vec()],
            ..ok.clone()
        };
        assert!(RunSpec::decode(&env.encode()).is_err());
        // A list claiming more entries than allowed is refused before any allocation.
        let mut huge = Vec::new();
        huge.extend_from_slice(&(u32::MAX).to_le_bytes());
        assert!(RunSpec::decode(&huge).is_err());
        // An exit that claims both a code and a signal, or a code out of range.
        let both = ExitReport {
            code: Some(0),
            signal: Some(9),
            ..ExitReport::default()
        };
        assert!(ExitReport::decode(&both.encode()).is_err());
        let mut wide = ExitReport::default().encode();
        wide[..8].copy_from_slice(&300u64.to_le_bytes());
        assert!(ExitReport::decode(&wide).is_err());
        // The egress flag is 0 or 1, nothing else; forwarded bytes carry a whole id.
        let mut flag = ok.encode();
        let at = flag.len() - 32;
        flag[at..at + 8].copy_from_slice(&2u64.to_le_bytes());
        assert!(RunSpec::decode(&flag).is_err());
        // A pty flag is 0 (and no size) or 1 with a size of at least 1x1 that fits a u16.
        let pty_at = ok.encode().len() - 24;
        for (flag, rows, cols) in [
            (2, 24, 80),
            (0, 24, 80),
            (1, 0, 80),
            (1, 24, 0),
            (1, 70000, 80),
        ] {
            let mut b = ok.encode();
            for (i, v) in [flag, rows, cols].into_iter().enumerate() {
                let at = pty_at + 8 * i;
                b[at..at + 8].copy_from_slice(&(v as u64).to_le_bytes());
            }
            assert!(RunSpec::decode(&b).is_err(), "{flag} {rows} {cols}");
        }
        assert!(WinSize::decode(&[0, 0, 80, 0]).is_err());
        assert!(WinSize::decode(&[24, 0, 80]).is_err());
        assert!(NetData::decode(&[1, 0, 0]).is_err());
        assert!(conn_id(&[1, 0, 0, 0, 0]).is_err());
        let data = NetData::encode(7, b"GET");
        assert_eq!(
            NetData::decode(&data).unwrap(),
            NetData {
                id: 7,
                bytes: b"GET"
            }
        );
    }

    #[test]
    fn an_oversized_frame_header_is_refused_before_reading_the_payload() {
        let mut h = Frame::new(Kind::Stdout, 7, Vec::new()).encode();
        h[5..9].copy_from_slice(&((MAX_PAYLOAD as u32) + 1).to_le_bytes());
        let mut fb = FrameBuffer::default();
        fb.extend(&h);
        assert!(fb.next_frame().is_err());
        let mut fb = FrameBuffer::default();
        fb.extend(&[0x7f, 0, 0, 0, 0, 0, 0, 0, 0]);
        assert!(fb.next_frame().is_err(), "an unknown kind");
    }

    #[test]
    fn frames_split_anywhere_reassemble() {
        let frames = [
            Frame::new(Kind::Ready, 3, VERSION.as_bytes().to_vec()),
            Frame::new(Kind::Stdout, 3, b"hello".to_vec()),
        ];
        let bytes: Vec<u8> = frames.iter().flat_map(Frame::encode).collect();
        let mut fb = FrameBuffer::default();
        let mut got = Vec::new();
        for b in bytes {
            fb.extend(&[b]);
            while let Some(f) = fb.next_frame().unwrap() {
                got.push(f);
            }
        }
        assert_eq!(got, frames);
    }

    /// What a new connection may read first: the cut-off rest of an earlier session's output
    /// (a frame's tail, then whole frames of that session, one posing as a Ready of another
    /// session), then its own Ready. Fed a byte at a time, the host finds its Ready and every
    /// frame after it, and nothing before.
    #[test]
    fn a_host_finds_its_ready_behind_an_earlier_sessions_cut_off_output() {
        let earlier = Frame::new(Kind::Stdout, 41, vec![0x81; 300]).encode();
        let mut bytes = earlier[100..].to_vec();
        bytes.extend(Frame::new(Kind::Exit, 41, ExitReport::default().encode()).encode());
        bytes.extend(Frame::new(Kind::Ready, 40, VERSION.as_bytes().to_vec()).encode());
        let mine = [
            Frame::new(Kind::Ready, 42, VERSION.as_bytes().to_vec()),
            Frame::new(Kind::Stdout, 42, b"out".to_vec()),
        ];
        bytes.extend(mine.iter().flat_map(Frame::encode));
        let mut fb = FrameBuffer::default();
        let mut synced = false;
        let mut got = Vec::new();
        for b in bytes {
            fb.extend(&[b]);
            synced = synced || fb.skip_to(Kind::Ready, 42);
            if synced {
                while let Some(f) = fb.next_frame().unwrap() {
                    got.push(f);
                }
            }
        }
        assert_eq!(got, mine);
        let mut none = FrameBuffer::default();
        none.extend(&earlier);
        none.extend(&Frame::new(Kind::Exit, 41, ExitReport::default().encode()).encode());
        assert!(!none.skip_to(Kind::Ready, 42));
        assert!(
            none.is_empty(),
            "bytes that cannot start the header are dropped"
        );
    }
}
