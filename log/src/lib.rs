//! h5i-log: the one tracing subscriber every h5i binary installs (`h5i`, `h5i-hook` and the
//! sentry it starts, `h5i-runc`), and the debug events they all emit the same way.
//!
//! Owns:
//! - the filter: `H5I_LOG`, else `RUST_LOG`, parsed as `tracing_subscriber::filter::Targets`
//!   directives (`debug`, `h5i::spawn=debug`, `h5i_runtime=trace,warn`); unset or empty means
//!   no subscriber, so a command prints nothing it would not print anyway ([`filter`]);
//! - the subscriber: plain text on stderr ([`init`]); `h5i-runc` takes the same [`filter`] and
//!   keeps runc's record format, which Podman and conmon read back;
//! - the events: [`spawned`] for every process h5i starts (target `h5i::spawn`) and [`refused`]
//!   for every refusal a binary ends with (target `h5i::refusal`);
//! - what a hook needs to see the same filter ([`passed_env`]): a runtime runs hooks with only
//!   the variables their spec names;
//! - the relay for processes whose stderr nobody reads (at the container tier Podman's conmon
//!   starts h5i-runc and h5i-runc the hooks, so their stderr is conmon's): a directory the
//!   caller names ([`DIR_VAR`] for a hook, the spec's `h5i.log.dir` annotation for h5i-runc),
//!   where each such process writes its events, as on stderr, to a file of its own made new
//!   ([`relay_file`]); the caller reads them back after the run ([`drain`]) and shows them on
//!   its own stderr, escaped.
//!
//! Must never: write anywhere but stderr and a relay file made new in a directory the
//! process's own user owns and nobody else may write (never an existing file, never through a
//! symlink), read back through a symlink, from a FIFO, from another user's file or past a
//! bound ([`drain`]), fail a command because its filter is malformed (the variable is named on stderr
//! once and ignored), or record a process's environment (argv only: by h5i's invariant no
//! secret is ever in an argv).
//!
//! Guarded by `tests/log.rs` (`H5I_LOG=debug h5i box run ...` shows the spawn events, the
//! container tier's from h5i-runc and the hooks too, unset shows nothing extra) and the unit
//! tests below.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::process::Command;
use std::str::FromStr;

use tracing_subscriber::filter::Targets;

/// The variable h5i reads its filter from.
pub const VAR: &str = "H5I_LOG";
/// The variable read when [`VAR`] is unset or empty.
pub const FALLBACK: &str = "RUST_LOG";

/// The filter's directives and the variable they came from, or `None` when neither is set.
pub fn directives() -> Option<(&'static str, String)> {
    [VAR, FALLBACK].into_iter().find_map(|var| {
        std::env::var(var)
            .ok()
            .filter(|v| !v.trim().is_empty())
            .map(|v| (var, v))
    })
}

/// Parse `text` as the filter's directives.
pub fn parse(text: &str) -> Result<Targets, String> {
    Targets::from_str(text.trim()).map_err(|e| e.to_string())
}

/// The filter in force: `Ok(None)` when neither variable is set; `Err` names the variable and
/// why its value is not a filter.
pub fn filter() -> Result<Option<Targets>, String> {
    let Some((var, text)) = directives() else {
        return Ok(None);
    };
    parse(&text)
        .map(Some)
        .map_err(|e| format!("ignoring {var}={text:?}: {e} (directives look like `debug` or `h5i::spawn=debug,warn`)"))
}

/// Install the subscriber for `binary` (its name leads a malformed filter's warning): plain
/// text on stderr, filtered by [`filter`]. Nothing is installed when no filter is set.
pub fn init(binary: &str) {
    init_relayed(binary, None);
}

/// [`init`], the events written to a [`relay_file`] of this process's own in `relay_dir`
/// instead of stderr when one is named and can be made (whoever named it shows them; a
/// directory that cannot take one leaves the events on stderr). Stderr as well would show
/// them twice where that stderr is the caller's too (a container run whose standard
/// descriptors Podman passes through).
pub fn init_relayed(binary: &str, relay_dir: Option<&Path>) {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    match filter() {
        Ok(Some(targets)) => {
            let relay = relay_dir.and_then(|d| relay_file(d, binary));
            let stderr = relay.is_none().then(|| {
                tracing_subscriber::fmt::layer()
                    .with_ansi(false)
                    .with_writer(std::io::stderr)
            });
            // A second init (a unit test) keeps the first subscriber.
            let _ = tracing_subscriber::registry()
                .with(stderr)
                .with(relay.map(relay_layer))
                .with(targets)
                .try_init();
        }
        Ok(None) => {}
        Err(msg) => eprintln!("{binary}: {msg}"),
    }
}

/// The variable naming a hook's relay directory (module doc), set in the hook's spec beside
/// `H5I_LOG` by whoever wants its events back.
pub const DIR_VAR: &str = "H5I_LOG_DIR";

/// The ending of every relay file's name (`<binary>.<pid>.log`).
pub const RELAY_SUFFIX: &str = ".log";

/// The most [`drain`] reads of all the relay files of one directory together.
pub const RELAY_CAP: u64 = 1 << 20;

/// The most [`drain`] reads of any one relay file (so one file cannot spend the whole
/// [`RELAY_CAP`]: a run's own files are a few KiB each).
pub const RELAY_FILE_CAP: u64 = 128 << 10;

/// The layer writing events to a relay file: the same plain text as on stderr.
pub fn relay_layer<S>(file: File) -> impl tracing_subscriber::Layer<S>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    tracing_subscriber::fmt::layer()
        .with_ansi(false)
        .with_writer(std::sync::Mutex::new(file))
}

/// A relay file of this process's own: `<dir>/<binary>.<pid>.log`, made new (`O_EXCL`,
/// `O_NOFOLLOW`, 0600, close-on-exec) and owned by the directory's owner, when `dir` is an
/// absolute path to a real directory nobody but its owner may write, owned by this process's
/// user or this process root in its user namespace (a createContainer hook runs as the
/// container's root, in the container's user namespace, where the directory's owner, the
/// engine user, is another id: the file is handed to that owner, who reads it back); `None`
/// otherwise. A relay directory is named by whoever started the process's runtime: never
/// written where that user could not already write, never an existing file.
pub fn relay_file(dir: &Path, binary: &str) -> Option<File> {
    if !dir.is_absolute() || binary.contains('/') {
        return None;
    }
    let meta = std::fs::symlink_metadata(dir).ok()?;
    let euid = h5i_sys::ids::euid();
    if !meta.is_dir() || (meta.uid() != euid && euid != 0) || meta.mode() & 0o022 != 0 {
        return None;
    }
    let path = dir.join(format!("{binary}.{}{RELAY_SUFFIX}", std::process::id()));
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&path)
        .ok()?;
    if meta.uid() != euid
        && std::os::unix::fs::fchown(&file, Some(meta.uid()), Some(meta.gid())).is_err()
    {
        let _ = std::fs::remove_file(&path);
        return None;
    }
    Some(file)
}

/// One line a relayed process wrote: who (`<binary>.<pid>`, from its file's name) and the line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relayed {
    /// `<binary>.<pid>`.
    pub from: String,
    /// The line as written (box-supplied bytes may be in it: escape before showing).
    pub line: String,
}

/// The most relay files [`drain`] looks at in one directory (a run makes one per h5i-runc
/// call and per hook: tens).
pub const RELAY_FILES_MAX: usize = 1024;

/// The longest line [`drain`] keeps, bytes; the rest is cut, and the line says how much.
pub const RELAY_LINE_MAX: usize = 4096;

/// Every line of the relay files in `dir`, which must be a real directory (not a symlink)
/// owned by `owner` that nobody else may write; ordered by the timestamp that leads each line
/// (a stable sort: a file's own order is kept), each file then removed. The directory is held
/// open and worked in by name ([`h5i_sys::dir_at`]), so swapping it or an entry for a symlink
/// reaches nothing else. Only entries named as [`relay_file`] names them are read or
/// removed, at most [`RELAY_FILES_MAX`]; of those, only regular files of `owner` with one link
/// are read (never a symlink's target, never a FIFO, which is opened without waiting and not
/// read, never another user's file or a hard link to one), smallest first, at most
/// [`RELAY_FILE_CAP`] bytes of each and [`RELAY_CAP`] of all together (so a huge file can
/// crowd out no smaller one), each line cut at [`RELAY_LINE_MAX`]; what a cap left unread is
/// said in a line of that file's own. Lines are returned as written: whoever shows them
/// escapes them.
pub fn drain(dir: &Path, owner: u32) -> Vec<Relayed> {
    use h5i_sys::dir_at;
    use std::os::fd::{AsFd, OwnedFd};
    let Ok(held) = dir_at::open_dir(dir) else {
        return Vec::new();
    };
    let trusted =
        dir_at::facts(&held).is_ok_and(|f| f.is_dir && f.uid == owner && f.mode & 0o022 == 0);
    if !trusted {
        return Vec::new();
    }
    let Ok(listed) = dir_at::names(held.as_fd(), RELAY_FILES_MAX) else {
        return Vec::new();
    };
    let open = |name: &str| -> Option<(OwnedFd, u64)> {
        let fd = dir_at::open_entry(held.as_fd(), name.as_ref()).ok()?;
        let f = dir_at::facts(&fd).ok()?;
        (f.is_file && f.uid == owner && f.nlink == 1).then_some((fd, f.size))
    };
    let mut names: Vec<(u64, String)> = listed
        .into_iter()
        .filter_map(|n| n.into_string().ok())
        .filter(|n| is_relay_name(n))
        .map(|n| (open(&n).map_or(0, |(_, size)| size), n))
        .collect();
    names.sort();
    let mut budget = RELAY_CAP;
    let mut lines = Vec::new();
    for (_, name) in names {
        if let Some((fd, size)) = open(&name) {
            let mut bytes = Vec::new();
            let _ = File::from(fd)
                .take(budget.min(RELAY_FILE_CAP))
                .read_to_end(&mut bytes);
            budget -= bytes.len() as u64;
            let from = name.trim_end_matches(RELAY_SUFFIX).to_string();
            lines.extend(String::from_utf8_lossy(&bytes).lines().map(|l| Relayed {
                from: from.clone(),
                line: cut(l),
            }));
            let unread = size.saturating_sub(bytes.len() as u64);
            if unread > 0 {
                lines.push(Relayed {
                    from,
                    line: format!("[relay: {unread} more bytes of this file not read]"),
                });
            }
        }
        let _ = dir_at::remove_entry(held.as_fd(), name.as_ref());
    }
    lines.sort_by(|a, b| stamp(&a.line).cmp(stamp(&b.line)));
    lines
}

/// Whether `name` is a relay file's (`<binary>.<pid>.log`).
fn is_relay_name(name: &str) -> bool {
    name.strip_suffix(RELAY_SUFFIX)
        .and_then(|stem| stem.rsplit_once('.'))
        .is_some_and(|(bin, pid)| {
            !bin.is_empty() && !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit())
        })
}

/// `line` cut at [`RELAY_LINE_MAX`] bytes (on a character boundary), saying how much was cut.
fn cut(line: &str) -> String {
    if line.len() <= RELAY_LINE_MAX {
        return line.to_string();
    }
    let mut end = RELAY_LINE_MAX;
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    format!("{} [{} bytes cut]", &line[..end], line.len() - end)
}

/// The timestamp leading a line of the plain format (RFC 3339, so text order is time order).
fn stamp(line: &str) -> &str {
    line.split_whitespace().next().unwrap_or("")
}

/// The variables that carry the filter into a process started with a cleared environment (an
/// OCI hook): `H5I_LOG=...` when a filter is set and parses (a malformed one was named once by
/// the binary that read it), else nothing.
pub fn passed_env() -> Vec<String> {
    match (directives(), filter()) {
        (Some((_, text)), Ok(Some(_))) => vec![format!("{VAR}={text}")],
        _ => Vec::new(),
    }
}

/// The debug event for a process h5i starts: its program and arguments, and its pid when the
/// caller has one (a `status()`/`output()` call has none to give).
pub fn spawned(cmd: &Command, pid: Option<u32>) {
    if !tracing::enabled!(target: "h5i::spawn", tracing::Level::DEBUG) {
        return;
    }
    let args: Vec<String> = cmd
        .get_args()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    event(&cmd.get_program().to_string_lossy(), &args, pid, "host");
}

/// The debug event for a box's command started by something other than a `Command` of h5i's:
/// the box's warm sandbox (its init forks it; h5i learns the pid from the init's answer),
/// h5i-runc's executor, just before it execs the payload, or a microvm's guest agent, which h5i
/// hands the command to (no host pid: `pid` is None). `by` says which.
pub fn spawned_argv(argv: &[String], pid: Option<u32>, by: &'static str) {
    let (program, args) = argv
        .split_first()
        .map_or(("", &[][..]), |(p, a)| (p.as_str(), a));
    event(program, args, pid, by);
}

/// The one spawn event: `place` says who started it (h5i on the host, the box's sandbox, or
/// h5i-runc).
fn event(program: &str, args: &[String], pid: Option<u32>, place: &'static str) {
    tracing::debug!(target: "h5i::spawn", program, ?args, pid, by = place, "spawned");
}

/// [`spawned`] in a builder chain: `cmd.args(..).traced().output()`.
pub trait Traced {
    /// Emit the spawn event for this command (no pid: the call that starts it comes next).
    fn traced(&mut self) -> &mut Self;
}

impl Traced for Command {
    fn traced(&mut self) -> &mut Command {
        spawned(self, None);
        self
    }
}

/// The debug event for a refusal a binary ends with: its message and its typed form.
pub fn refused(err: &(dyn std::error::Error + 'static)) {
    let mut chain = Vec::new();
    let mut source = err.source();
    while let Some(s) = source {
        chain.push(s.to_string());
        source = s.source();
    }
    tracing::debug!(target: "h5i::refusal", error = %err, detail = ?err, ?chain, "refused");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_relay_file_is_made_new_in_a_private_directory_and_drained_in_time_order() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let dir = d.path();
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        let mut f = relay_file(dir, "h5i-hook").unwrap();
        // Never the same file twice (made new), never a relative or shared directory.
        assert!(relay_file(dir, "h5i-hook").is_none());
        assert!(relay_file(Path::new("relative"), "h5i-hook").is_none());
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(relay_file(dir, "h5i-runc").is_none());
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        use std::io::Write;
        writeln!(
            f,
            "2026-01-01T00:00:02Z DEBUG second\n2026-01-01T00:00:03Z DEBUG third"
        )
        .unwrap();
        std::fs::write(
            dir.join("h5i-runc.7.log"),
            "2026-01-01T00:00:01Z DEBUG first\n",
        )
        .unwrap();
        std::fs::write(dir.join("other.txt"), "not a relay file\n").unwrap();
        std::os::unix::fs::symlink(dir.join("other.txt"), dir.join("h5i-hook.8.log")).unwrap();
        let lines = drain(dir, own_uid());
        let said: Vec<(&str, &str)> = lines
            .iter()
            .map(|r| (r.from.as_str(), r.line.rsplit(' ').next().unwrap()))
            .collect();
        let hook = format!("h5i-hook.{}", std::process::id());
        assert_eq!(
            said,
            [
                ("h5i-runc.7", "first"),
                (hook.as_str(), "second"),
                (hook.as_str(), "third")
            ]
        );
        // Drained: the relay files are gone (the symlink removed, not followed), the rest left.
        let left: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(left, ["other.txt"]);
    }

    fn own_uid() -> u32 {
        std::fs::metadata("/proc/self").unwrap().uid()
    }

    #[test]
    fn drain_reads_no_fifo_hard_link_or_symlinked_directory_and_cuts_long_lines() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("log");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        let fifo = dir.join("h5i-hook.1.log");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        std::fs::write(d.path().join("elsewhere"), "2026 DEBUG linked\n").unwrap();
        std::fs::hard_link(d.path().join("elsewhere"), dir.join("h5i-runc.2.log")).unwrap();
        let long = format!("2026 DEBUG {}", "é".repeat(RELAY_LINE_MAX));
        std::fs::write(dir.join("h5i-runc.3.log"), format!("{long}\n")).unwrap();
        // Not its owner's: nothing is read, nothing removed.
        assert!(drain(&dir, own_uid() + 1).is_empty());
        assert!(dir.join("h5i-runc.3.log").exists());
        // Through a symlink to it: the same.
        std::os::unix::fs::symlink(&dir, d.path().join("via")).unwrap();
        assert!(drain(&d.path().join("via"), own_uid()).is_empty());
        assert!(dir.join("h5i-runc.3.log").exists());
        let lines = drain(&dir, own_uid());
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(
            lines[0].line.len() <= RELAY_LINE_MAX + 32,
            "{}",
            lines[0].line.len()
        );
        assert!(
            lines[0].line.ends_with(" bytes cut]"),
            "{}",
            &lines[0].line[4090..]
        );
        // A huge file crowds out no smaller one, and says what it left unread.
        let sparse = std::fs::File::create(dir.join("h5i-runc.1.log")).unwrap();
        sparse.set_len(4 * RELAY_CAP).unwrap();
        std::fs::write(dir.join("h5i-runc.9.log"), "2026 DEBUG small\n").unwrap();
        let lines = drain(&dir, own_uid());
        let said: Vec<(&str, &str)> = lines
            .iter()
            .map(|r| (r.from.as_str(), r.line.rsplit(' ').next().unwrap()))
            .collect();
        assert!(said.contains(&("h5i-runc.9", "small")), "{said:?}");
        let note = format!(
            "{} more bytes of this file not read]",
            4 * RELAY_CAP - RELAY_FILE_CAP
        );
        assert!(
            lines
                .iter()
                .any(|r| r.from == "h5i-runc.1" && r.line.ends_with(&note)),
            "{lines:?}"
        );
        // Every relay-named entry is removed; the hard link's other name keeps its file.
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
        assert!(d.path().join("elsewhere").exists());
    }

    #[test]
    fn directives_parse_as_targets_and_garbage_is_refused() {
        for good in [
            "debug",
            "h5i::spawn=debug",
            "h5i_runtime=trace,warn",
            " info ",
        ] {
            assert!(parse(good).is_ok(), "{good}");
        }
        for bad in ["h5i=loud", "debug=verbose"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_spawn_target_is_enabled_by_a_bare_level_and_by_its_own_name() {
        use tracing::Level;
        for (text, on) in [
            ("debug", true),
            ("h5i::spawn=debug", true),
            ("h5i=debug", true),
            ("info", false),
            ("h5i_runtime=debug", false),
        ] {
            assert_eq!(
                parse(text)
                    .unwrap()
                    .would_enable("h5i::spawn", &Level::DEBUG),
                on,
                "{text}"
            );
        }
    }
}
