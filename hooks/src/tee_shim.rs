//! The tee shim: the in-box half of "what Codex ran", command by command. h5i binds `h5i-hook`
//! read-only over a Codex box's `bash` (Codex runs every command as `bash -lc CMD`, the shell
//! it reads from the user's passwd entry) and the real bash read-only at [`REAL_BASH`]; invoked
//! as `bash`, `h5i-hook` is this shim. A `-c` command runs under the real bash with its
//! standard output and error passed through unchanged and a bounded head of each kept; when it
//! ends, one `command` record of the `tee-shim` lane is staged in the box's spool: the command,
//! the working directory, how it ended, and the output heads. The host ingests it after the run
//! as box-claimed evidence and compares it with the tool calls Codex's hooks claim.
//!
//! Owns the staged record's shape: `{"kind": "command", "lane": "tee-shim", "command": CMD,
//! "cwd": DIR, "exit": CODE | null, "signal": SIG | null, "stdout": HEAD, "stderr": HEAD,
//! "output": "captured" | "terminal"}` (`command_cut`, `stdout_cut`, `stderr_cut`: true when
//! cut; control characters other than newline and tab written as `\xNN` text, so a command's
//! colours or escapes never make the host refuse the record). Must never: change what the
//! command sees (arguments, `$0`, stdin, exit status; a terminal stays a terminal, so its
//! output is then not kept), hold the agent back after the command ends (output still flowing
//! from a job the command left behind is passed through by a copy of the shim that outlives
//! it), record a shell that is not running a `-c` command (a script, an interactive shell), or
//! record the commands nested inside a recorded one (they run with [`NESTED_VAR`] set).
//!
//! Guarded by the unit tests below and `tests/agent_codex.rs`.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, Ordering};

use crate::spool::MAX_ENTRY_BYTES;

/// The staged record's `kind`.
pub const KIND: &str = "command";
/// The spool file name prefix of a staged command.
pub const PREFIX: &str = "command-";
/// Where the box's real bash is bound (read-only) beside the shim.
pub const REAL_BASH: &str = "/.h5i/shell/bash";
/// The box paths the shim is bound over (those the box's read grants cover).
pub const SHIM_AT: &[&str] = &["/usr/bin/bash", "/bin/bash"];
/// Set for the commands a recorded command runs, so only the outer one is recorded.
pub const NESTED_VAR: &str = "H5I_TEE_SHIM_NESTED";
/// How Codex's hooks run h5i's capture hook (through the shell): not recorded as a command.
pub const HOOK_COMMAND: &str = "/.h5i/bin/h5i-hook capture ";
/// Bytes of each output stream kept in the record.
pub const OUTPUT_HEAD: usize = 8 * 1024;
/// Bytes of the command kept in the record.
pub const COMMAND_HEAD: usize = 8 * 1024;

// The record's worst case (every kept byte a quote or backslash, doubled by JSON) fits the
// spool's cap with room for the fields around it.
const _: () = assert!(2 * (2 * OUTPUT_HEAD + COMMAND_HEAD) + 4096 < MAX_ENTRY_BYTES as usize);

/// Whether `argv0` names the shim (`h5i-hook` invoked as `bash`).
pub fn invoked_as_shell(argv0: &std::ffi::OsStr) -> bool {
    Path::new(argv0).file_name().is_some_and(|n| n == "bash")
}

/// The command string of a `bash [OPTIONS] -c CMD [ARGS]` invocation (`-c` alone or in an
/// option cluster such as `-lc`), or `None` for any other shell (a script, an interactive one).
pub fn command_of(args: &[String]) -> Option<&str> {
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--" || !(a.starts_with('-') || a.starts_with('+')) {
            return None;
        }
        if a.starts_with("--") {
            continue;
        }
        if matches!(a.as_str(), "-o" | "+o" | "-O" | "+O") {
            it.next();
            continue;
        }
        if a.starts_with('-') && a[1..].contains('c') {
            return it.next().map(String::as_str);
        }
    }
    None
}

/// `bytes` as record text: lossy UTF-8, cut to `cap` bytes on a character boundary, control
/// characters other than newline and tab written as `\xNN`. Returns the text and whether it
/// was cut.
pub fn record_text(bytes: &[u8], cap: usize) -> (String, bool) {
    let cut = bytes.len() > cap;
    let text = String::from_utf8_lossy(&bytes[..bytes.len().min(cap)]);
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() && c != '\n' && c != '\t' {
            out.push_str(&format!("\\x{:02x}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    (out, cut)
}

/// How the command ended and what it printed.
#[derive(Debug, Default)]
pub struct Ran {
    /// Exit code, when it exited.
    pub exit: Option<i32>,
    /// The signal that ended it, when one did.
    pub signal: Option<i32>,
    /// The heads of its standard output and error (`None`: a terminal, not kept).
    pub output: Option<(Vec<u8>, Vec<u8>)>,
    /// Whether each stream said more than its head.
    pub more: (bool, bool),
}

/// The record for `command` run in `cwd`.
pub fn record(command: &str, cwd: &Path, ran: &Ran) -> serde_json::Value {
    let (cmd, cmd_cut) = record_text(command.as_bytes(), COMMAND_HEAD);
    let (cwd, _) = record_text(cwd.as_os_str().as_encoded_bytes(), 1024);
    let mut r = serde_json::json!({
        "kind": KIND,
        "lane": "tee-shim",
        "command": cmd,
        "cwd": cwd,
        "exit": ran.exit,
        "signal": ran.signal,
    });
    match &ran.output {
        Some((out, err)) => {
            let (o, o_cut) = record_text(out, OUTPUT_HEAD);
            let (e, e_cut) = record_text(err, OUTPUT_HEAD);
            r["output"] = "captured".into();
            r["stdout"] = o.into();
            r["stderr"] = e.into();
            for (key, cut) in [
                ("stdout_cut", o_cut || ran.more.0),
                ("stderr_cut", e_cut || ran.more.1),
            ] {
                if cut {
                    r[key] = true.into();
                }
            }
        }
        None => r["output"] = "terminal".into(),
    }
    if cmd_cut {
        r["command_cut"] = true.into();
    }
    r
}

/// Stage `record` in `spool` under a name that sorts in staging order; the entry's path.
pub fn stage(spool: &Path, record: &serde_json::Value) -> io::Result<PathBuf> {
    crate::capture::write_entry(spool, PREFIX, record)
}

/// The signal the shim was sent while its command ran (forwarded to the command).
static PENDING_SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn note_signal(sig: libc::c_int) {
    PENDING_SIGNAL.store(sig, Ordering::SeqCst);
}

/// The signals a shell's caller ends it with, passed on to the command.
const FORWARDED: [libc::c_int; 4] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT];

/// Run as `bash ARGS`: exec the real bash for anything but an outer `-c` command; run that one
/// under the real bash, pass its output through, stage its record, and end as it ended.
pub fn main(argv0: std::ffi::OsString, args: Vec<std::ffi::OsString>) -> ! {
    let mut real = std::process::Command::new(REAL_BASH);
    real.arg0(&argv0).args(&args);
    let text: Vec<String> = args
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let command = command_of(&text).map(str::to_owned);
    let spool = std::env::var_os("H5I_ENV_CAPTURE_SPOOL");
    // h5i's own capture hook, which Codex runs through the shell, is not the agent's command.
    let command = command.filter(|c| !c.starts_with(HOOK_COMMAND));
    let (Some(command), Some(spool), None) = (command, spool, std::env::var_os(NESTED_VAR)) else {
        let e = real.exec();
        eprintln!("bash (h5i tee shim): cannot run {REAL_BASH}: {e}");
        std::process::exit(127);
    };
    real.env(NESTED_VAR, "1");
    let cwd = std::env::current_dir().unwrap_or_default();
    let terminal = h5i_sys::pty::is_terminal(1) || h5i_sys::pty::is_terminal(2);
    for sig in FORWARDED {
        // The handler only stores to an atomic, which is async-signal-safe. A standard signal
        // cannot be refused.
        let _ = h5i_sys::signals::handle_with(sig, note_signal);
    }
    let ran = if terminal {
        run_on_terminal(real)
    } else {
        run_teed(real)
    };
    let ran = match ran {
        Ok(r) => r,
        Err(e) => {
            eprintln!("bash (h5i tee shim): cannot run {REAL_BASH}: {e}");
            std::process::exit(127);
        }
    };
    if let Err(e) = stage(Path::new(&spool), &record(&command, &cwd, &ran)) {
        eprintln!("bash (h5i tee shim): command not recorded: {e}");
    }
    end_as(&ran)
}

/// End the shim the way its command ended: the same exit code, or the same signal.
fn end_as(ran: &Ran) -> ! {
    if let Some(sig) = ran.signal {
        let _ = h5i_sys::signals::reraise_with_default(sig);
        std::process::exit(128 + sig);
    }
    std::process::exit(ran.exit.unwrap_or(1))
}

fn ended(status: std::process::ExitStatus) -> (Option<i32>, Option<i32>) {
    (status.code(), status.signal())
}

/// Pass on a signal the shim was sent to the command.
fn forward_pending(child: &std::process::Child) {
    let sig = PENDING_SIGNAL.swap(0, Ordering::SeqCst);
    if sig != 0 {
        // The child is unreaped, so the pidfd opened now names it.
        if let Ok(fd) = h5i_sys::pidfd::open(child.id() as i32) {
            let _ = h5i_sys::pidfd::send_signal(&fd, sig);
        }
    }
}

/// A command on a terminal: its descriptors are the shim's own; its output is not kept.
fn run_on_terminal(mut real: std::process::Command) -> io::Result<Ran> {
    let mut child = real.spawn()?;
    let status = loop {
        match child.wait() {
            Ok(s) => break s,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => forward_pending(&child),
            Err(e) => return Err(e),
        }
    };
    let (exit, signal) = ended(status);
    Ok(Ran {
        exit,
        signal,
        output: None,
        more: (false, false),
    })
}

/// One output stream being passed through: the pipe from the command, where it goes, and the
/// head kept of it.
struct Stream {
    from: Option<std::fs::File>,
    to: RawFd,
    head: Vec<u8>,
    more: bool,
}

impl Stream {
    /// Read what is there and pass it on.
    fn pump(&mut self) -> Pumped {
        let Some(from) = self.from.as_mut() else {
            return Pumped::End;
        };
        let mut buf = [0u8; 16 * 1024];
        let n = match io::Read::read(from, &mut buf) {
            Ok(0) => {
                self.from = None;
                return Pumped::End;
            }
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return Pumped::Data,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Pumped::Empty,
            Err(_) => {
                self.from = None;
                return Pumped::End;
            }
        };
        let room = OUTPUT_HEAD.saturating_sub(self.head.len());
        self.head.extend_from_slice(&buf[..n.min(room)]);
        self.more |= n > room;
        write_all_fd(self.to, &buf[..n]);
        Pumped::Data
    }
}

/// What one read of a stream found.
#[derive(PartialEq)]
enum Pumped {
    /// Bytes, passed on.
    Data,
    /// Nothing now (a non-blocking pipe).
    Empty,
    /// The end: every writer closed it.
    End,
}

/// Write to a descriptor the shim does not own (its stdout or stderr); a reader that went away
/// ends the passing on, as it would end the command's own writes.
fn write_all_fd(fd: RawFd, mut buf: &[u8]) {
    while !buf.is_empty() {
        let n = h5i_sys::fds::write_raw(fd, buf);
        if let Ok(n @ 1..) = n {
            buf = &buf[n..];
        } else if n.is_err_and(|e| e.kind() == io::ErrorKind::Interrupted) {
            continue;
        } else {
            return;
        }
    }
}

/// Wait until one of `fds` is readable (or a signal arrives); which are.
fn poll_readable(fds: &[RawFd]) -> Vec<bool> {
    let mut pfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    // An interrupted wait answers "none ready": the caller's loop looks at its signals first.
    if !matches!(h5i_sys::poll::wait(&mut pfds, None), Ok(n) if n > 0) {
        return vec![false; fds.len()];
    }
    pfds.iter().map(|p| p.revents != 0).collect()
}

/// A command whose output is not a terminal: its stdout and stderr come through pipes, are
/// passed on as they come and their heads kept, until it ends (waited for on a pidfd). Output
/// a job it left running still writes is passed on by a fork of the shim until that job closes
/// the pipes, so the shim itself ends when the command does.
fn run_teed(mut real: std::process::Command) -> io::Result<Ran> {
    real.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = real.spawn()?;
    // The child is unreaped, so the pid is its own.
    let pidfd = h5i_sys::pidfd::open(child.id() as i32)?;
    let mut streams = [
        Stream {
            from: child
                .stdout
                .take()
                .map(|p| std::fs::File::from(std::os::fd::OwnedFd::from(p))),
            to: 1,
            head: Vec::new(),
            more: false,
        },
        Stream {
            from: child
                .stderr
                .take()
                .map(|p| std::fs::File::from(std::os::fd::OwnedFd::from(p))),
            to: 2,
            head: Vec::new(),
            more: false,
        },
    ];
    loop {
        forward_pending(&child);
        let mut fds: Vec<RawFd> = streams
            .iter()
            .filter_map(|s| s.from.as_ref().map(AsRawFd::as_raw_fd))
            .collect();
        fds.push(pidfd.as_raw_fd());
        let ready = poll_readable(&fds);
        if ready[fds.len() - 1] {
            break;
        }
        pump_ready(&mut streams, &ready);
    }
    let status = child.wait()?;
    drop(pidfd);
    // What is already in the pipes belongs to the command's output.
    for s in streams.iter_mut() {
        if let Some(f) = &s.from {
            let _ = h5i_sys::fds::set_nonblocking(f, true);
        }
        while s.pump() == Pumped::Data {}
    }
    let (exit, signal) = ended(status);
    let ran = Ran {
        exit,
        signal,
        output: Some((streams[0].head.clone(), streams[1].head.clone())),
        more: (streams[0].more, streams[1].more),
    };
    if streams.iter().any(|s| s.from.is_some()) {
        pass_on_after(streams);
    }
    Ok(ran)
}

/// Pump each open stream `ready` (in the order of the open streams) says is readable.
fn pump_ready(streams: &mut [Stream; 2], ready: &[bool]) {
    let open = streams.iter_mut().filter(|s| s.from.is_some());
    for (s, _) in open.zip(ready).filter(|(_, r)| **r) {
        s.pump();
    }
}

/// Fork a copy of the shim that passes on what is left of `streams` (blocking again) until
/// each ends; the shim itself goes on to record and exit.
fn pass_on_after(mut streams: [Stream; 2]) {
    // SAFETY: the shim is single-threaded, so the child may run ordinary code after fork.
    let forked = unsafe { h5i_sys::fork_exec::fork_single_threaded() };
    if !matches!(forked, Ok(h5i_sys::fork_exec::Forked::Child)) {
        return;
    }
    for s in streams.iter_mut() {
        if let Some(f) = &s.from {
            let _ = h5i_sys::fds::set_nonblocking(f, false);
        }
    }
    loop {
        let fds: Vec<RawFd> = streams
            .iter()
            .filter_map(|s| s.from.as_ref().map(AsRawFd::as_raw_fd))
            .collect();
        if fds.is_empty() {
            break;
        }
        let ready = poll_readable(&fds);
        pump_ready(&mut streams, &ready);
    }
    // Ending the forked copy without running the parent's exit handlers.
    h5i_sys::fork_exec::exit_now(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use h5i_policy::receipt::{ReceiptLane, RecordBody};

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|a| (*a).to_owned()).collect()
    }

    #[test]
    fn only_a_c_command_is_a_command() {
        assert_eq!(command_of(&s(&["-lc", "ls -l"])), Some("ls -l"));
        assert_eq!(command_of(&s(&["-c", "ls", "x"])), Some("ls"));
        assert_eq!(command_of(&s(&["--login", "-c", "ls"])), Some("ls"));
        assert_eq!(command_of(&s(&["-o", "c", "-c", "ls"])), Some("ls"));
        assert_eq!(command_of(&s(&["script.sh", "-c", "x"])), None);
        assert_eq!(command_of(&s(&["-l"])), None);
        assert_eq!(command_of(&s(&[])), None);
        assert_eq!(command_of(&s(&["--norc", "x"])), None);
        assert_eq!(command_of(&s(&["-c"])), None);
        assert!(invoked_as_shell("/usr/bin/bash".as_ref()));
        assert!(invoked_as_shell("bash".as_ref()));
        assert!(!invoked_as_shell("/.h5i/bin/h5i-hook".as_ref()));
    }

    #[test]
    fn escapes_and_huge_output_make_a_record_the_host_takes() {
        let d = tempfile::tempdir().unwrap();
        let ran = Ran {
            exit: Some(3),
            signal: None,
            output: Some((
                b"\x1b]52;c;aGk=\x07\x1b[2J ok\n".to_vec(),
                vec![b'"'; 10 * OUTPUT_HEAD],
            )),
            more: (false, true),
        };
        let cmd = "printf '\\033[31m'; ".to_owned() + &"\\".repeat(3 * COMMAND_HEAD);
        stage(d.path(), &record(&cmd, Path::new("/work\x1b[0m"), &ran)).unwrap();
        let got = crate::spool::ingest(d.path()).unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].lane, ReceiptLane::TeeShim);
        let RecordBody::BoxClaimed {
            claimed_kind,
            claim,
        } = &got[0].body
        else {
            panic!("{:?}", got[0].body);
        };
        assert_eq!(claimed_kind, KIND);
        assert_eq!(claim["exit"], 3);
        assert_eq!(claim["stdout"], "\\x1b]52;c;aGk=\\x07\\x1b[2J ok\n");
        assert_eq!(claim["cwd"], "/work\\x1b[0m");
        assert_eq!(claim["stderr_cut"], true);
        assert_eq!(claim["command_cut"], true);
        assert!(claim.get("stdout_cut").is_none());
    }

    #[test]
    fn a_terminal_command_says_its_output_was_not_kept() {
        let r = record("vi x", Path::new("/work"), &Ran::default());
        assert_eq!(r["output"], "terminal");
        assert!(r.get("stdout").is_none());
    }
}
