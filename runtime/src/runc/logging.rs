//! Logging for `--log FILE`, `--log-format text|json` and `--debug`.
//!
//! Records go to the log file when one is given (appended), else to stderr. Both forms are
//! runc's: JSON (`{"level":"error","msg":"...","time":"..."}`, one object per line), which is
//! what Podman and conmon read back, and logrus text (`time="..." level=error msg="..."`), which
//! is what runc prints on stderr and what tools scanning a runtime's stderr look for `error` in.
//! Levels are logrus's names (`warning`, not `warn`).
//!
//! A spec may ask for the h5i-log relay (h5i_log's module doc): `h5i.log` names the filter
//! (h5i's container tier sets it to its own `H5I_LOG`, which neither Podman nor its conmon
//! passes the runtime) and `h5i.log.dir` the directory; `create` and `run` read both from the
//! bundle ([`relay_of`]) and write the filtered events, as h5i does on stderr, to a relay file
//! of their own there, which the container's init process (forked by `create`) keeps for the
//! payload's spawn event. `start`, `kill`, `delete` and `state` get no bundle: they read the
//! same annotations from the spec the container was created from, found through its saved
//! state ([`relay_of_saved`]), so their events are relayed too.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

use super::RuncError;

/// `--log-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// logrus text: `time="..." level=LEVEL msg="..." key=value`.
    #[default]
    Text,
    /// runc's JSON lines.
    Json,
}

impl LogFormat {
    /// Parse `--log-format`.
    pub fn parse(s: Option<&str>) -> Result<Self, String> {
        match s {
            None | Some("text") => Ok(Self::Text),
            Some("json") => Ok(Self::Json),
            Some(other) => Err(format!(
                "invalid --log-format {other:?}; to fix: use text or json"
            )),
        }
    }
}

/// The relay a spec asked for ([`relay_of`]): its filter and this process's relay file.
pub struct Relay {
    /// The `h5i.log` annotation's filter.
    pub filter: tracing_subscriber::filter::Targets,
    /// The relay file made in the `h5i.log.dir` annotation's directory.
    pub file: File,
}

/// The largest `config.json` read for the relay annotations (a larger one relays nothing;
/// libcontainer reads and judges the spec itself).
const SPEC_CAP: u64 = 16 << 20;

/// The relay `bundle/config.json` asks for: both annotations set, the filter parsing
/// (h5i_log::parse) and a relay file made in the directory (h5i_log::relay_file); else `None`.
pub fn relay_of(bundle: &Path) -> Option<Relay> {
    relay_of_spec(&bundle.join("config.json"))
}

/// The relay the spec container `id` was created from asks for (the spec `create` read, or
/// h5i-runc's shadow of it: `super::spec_path`), for the verbs handed no bundle; `None` when
/// the container does not exist or its spec asks for none.
pub fn relay_of_saved(ctx: &super::Context, id: &str) -> Option<Relay> {
    let container = ctx.load(id).ok()?;
    relay_of_spec(&super::spec_path(&container))
}

/// [`relay_of`] for the spec at `config`.
fn relay_of_spec(config: &Path) -> Option<Relay> {
    use h5i_policy::spec_names::annotation;
    use std::io::Read;
    let mut bytes = Vec::new();
    File::open(config)
        .ok()?
        .take(SPEC_CAP)
        .read_to_end(&mut bytes)
        .ok()?;
    let spec: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    let notes = spec.get("annotations")?;
    let filter = h5i_log::parse(notes.get(annotation::LOG)?.as_str()?).ok()?;
    let dir = Path::new(notes.get(annotation::LOG_DIR)?.as_str()?);
    let file = h5i_log::relay_file(dir, "h5i-runc")?;
    Some(Relay { filter, file })
}

/// Install the global subscriber. Without `--debug` and without an `H5I_LOG`/`RUST_LOG` filter
/// (h5i-log) or a relay's filter only h5i's own records pass (warnings of the runtime library,
/// the final error of the binary); libcontainer's internal error records
/// repeat what the final error already says. `--debug` passes everything at debug level. With
/// a `relay`, the records that pass are also written to its file, in h5i's plain format.
pub fn init(
    path: Option<&PathBuf>,
    format: LogFormat,
    debug: bool,
    relay: Option<Relay>,
) -> Result<(), RuncError> {
    use tracing_subscriber::filter::Targets;
    use tracing_subscriber::fmt::writer::BoxMakeWriter;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer as _;

    // `--debug` passes everything; else h5i's one filter (`H5I_LOG`, else `RUST_LOG`; a
    // malformed one was already named by the h5i that started this runtime) when set.
    let targets = if debug {
        Targets::new().with_default(Level::DEBUG)
    } else if let Ok(Some(filter)) = h5i_log::filter() {
        without_spec_dumps(filter)
    } else {
        Targets::new()
            .with_target("h5i_runtime", Level::WARN)
            .with_target("h5i_runc", Level::ERROR)
    };
    let writer = match path {
        Some(path) => {
            let file = OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|source| RuncError::Log {
                    path: path.clone(),
                    source,
                })?;
            BoxMakeWriter::new(Mutex::new(file))
        }
        None => BoxMakeWriter::new(std::io::stderr),
    };
    let layer = tracing_subscriber::fmt::layer()
        .event_format(RuncFormat(format))
        .with_writer(writer);
    // The relay has its own filter: what reaches stderr or `--log` stays as it was (where
    // Podman passes the caller's stderr through, the relayed events would show twice).
    let relay =
        relay.map(|r| h5i_log::relay_layer(r.file).with_filter(without_spec_dumps(r.filter)));
    // A second init (unit tests) keeps the first subscriber; that is fine.
    let _ = tracing_subscriber::registry()
        .with(layer.with_filter(targets))
        .with(relay)
        .try_init();
    Ok(())
}

/// `filter` with libcontainer held at `info`: its debug records print the whole spec (the
/// process's environment, which holds a run's secrets, with it), and h5i-log records no
/// environment. Only `--debug`, runc's own switch, passes them. Every directive naming
/// libcontainer or a module of it is held too: the most specific directive decides, so
/// `libcontainer::process=debug` would pass what `libcontainer=info` holds.
fn without_spec_dumps(
    filter: tracing_subscriber::filter::Targets,
) -> tracing_subscriber::filter::Targets {
    use tracing_subscriber::filter::{LevelFilter, Targets};
    let mut held = Targets::new();
    if let Some(level) = filter.default_level() {
        held = held.with_default(level);
    }
    for (target, level) in filter.iter() {
        let level = if target.starts_with("libcontainer") {
            level.min(LevelFilter::INFO)
        } else {
            level
        };
        held = held.with_target(target, level);
    }
    if held.would_enable("libcontainer", &Level::DEBUG) {
        held = held.with_target("libcontainer", LevelFilter::INFO);
    }
    held
}

struct RuncFormat(LogFormat);

#[derive(Default)]
struct Fields {
    msg: String,
    rest: Vec<(String, String)>,
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if field.name() == "message" {
            self.msg = format!("{value:?}");
        } else {
            self.rest
                .push((field.name().to_string(), format!("{value:?}")));
        }
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.msg = value.to_string();
        } else {
            self.rest
                .push((field.name().to_string(), value.to_string()));
        }
    }
}

impl<S, N> FormatEvent<S, N> for RuncFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _: &FmtContext<'_, S, N>,
        mut w: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut fields = Fields::default();
        event.record(&mut fields);
        let level = logrus_level(*event.metadata().level());
        let time = rfc3339_now();
        match self.0 {
            LogFormat::Json => {
                let mut obj = serde_json::Map::new();
                obj.insert("level".into(), level.into());
                obj.insert("msg".into(), fields.msg.into());
                obj.insert("time".into(), time.into());
                for (k, v) in fields.rest {
                    obj.insert(k, v.into());
                }
                writeln!(w, "{}", serde_json::Value::Object(obj))
            }
            LogFormat::Text => writeln!(w, "{}", text_record(level, &fields.msg, &fields.rest)),
        }
    }
}

/// logrus's name for a level.
fn logrus_level(level: Level) -> &'static str {
    match level {
        Level::ERROR => "error",
        Level::WARN => "warning",
        Level::INFO => "info",
        Level::DEBUG => "debug",
        Level::TRACE => "trace",
    }
}

/// One record in logrus's text form, as runc prints it on stderr: `time="..." level=LEVEL
/// msg="..."`, then the other fields; a value is quoted unless it is a plain word.
fn text_record(level: &str, msg: &str, rest: &[(String, String)]) -> String {
    let value = |v: &str| {
        let plain = !v.is_empty()
            && v.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-._/@^+".contains(c));
        if plain {
            v.to_string()
        } else {
            format!("{v:?}")
        }
    };
    let mut line = format!(
        "time={} level={level} msg={}",
        value(&rfc3339_now()),
        value(msg)
    );
    for (k, v) in rest {
        line.push_str(&format!(" {k}={}", value(v)));
    }
    line
}

/// The runtime's final error as runc prints it on stderr (`time="..." level=error msg="..."`).
pub fn error_line(msg: &str) -> String {
    text_record("error", msg, &[])
}

/// Current UTC time as RFC 3339 with seconds precision.
fn rfc3339_now() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    h5i_policy::receipt::rfc3339_utc(secs * 1000, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_relay_is_what_the_specs_annotations_ask_for() {
        use std::os::unix::fs::PermissionsExt;
        let bundle = tempfile::tempdir().unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        let spec = |notes: serde_json::Value| {
            std::fs::write(
                bundle.path().join("config.json"),
                serde_json::json!({"ociVersion": "1.0.2", "annotations": notes}).to_string(),
            )
            .unwrap();
        };
        let d = dir.path().display().to_string();
        spec(serde_json::json!({"h5i.log.dir": d}));
        assert!(relay_of(bundle.path()).is_none(), "no filter, no relay");
        spec(serde_json::json!({"h5i.log": "h5i=loud", "h5i.log.dir": d}));
        assert!(
            relay_of(bundle.path()).is_none(),
            "a malformed filter relays nothing"
        );
        spec(serde_json::json!({"h5i.log": "debug", "h5i.log.dir": d}));
        let relay = relay_of(bundle.path()).unwrap();
        assert!(relay
            .filter
            .would_enable("h5i::spawn", &tracing::Level::DEBUG));
        assert!(dir
            .path()
            .join(format!("h5i-runc.{}.log", std::process::id()))
            .is_file());
    }

    #[test]
    fn h5i_logs_filter_never_passes_libcontainers_spec_dumps() {
        for text in [
            "debug",
            "libcontainer=trace",
            "trace",
            "libcontainer::process=debug",
            "debug,libcontainer::container=trace",
            "info,libcontainer::process::init=trace",
        ] {
            let f = without_spec_dumps(h5i_log::parse(text).unwrap());
            for target in [
                "libcontainer",
                "libcontainer::user_ns",
                "libcontainer::process",
                "libcontainer::process::init",
                "libcontainer::container::builder",
            ] {
                assert!(!f.would_enable(target, &Level::DEBUG), "{text}: {target}");
            }
        }
        for text in ["debug", "libcontainer=trace", "trace"] {
            let f = without_spec_dumps(h5i_log::parse(text).unwrap());
            assert!(f.would_enable("libcontainer", &Level::INFO), "{text}");
        }
        let f = without_spec_dumps(h5i_log::parse("debug").unwrap());
        assert!(f.would_enable("h5i::spawn", &Level::DEBUG));
        let f = without_spec_dumps(h5i_log::parse("h5i::spawn=debug").unwrap());
        assert!(!f.would_enable("libcontainer", &Level::INFO));
    }

    #[test]
    fn log_format_parse() {
        assert_eq!(LogFormat::parse(None).unwrap(), LogFormat::Text);
        assert_eq!(LogFormat::parse(Some("json")).unwrap(), LogFormat::Json);
        assert!(LogFormat::parse(Some("xml")).is_err());
    }

    #[test]
    fn text_records_are_logrus_lines() {
        let line = text_record(
            "warning",
            "poststop hook failed: \"x\"",
            &[
                ("id".into(), "c1".into()),
                ("hook".into(), "/bin/false x".into()),
            ],
        );
        let (time, rest) = line.split_once(' ').unwrap();
        assert!(
            time.starts_with("time=\"") && time.ends_with("Z\""),
            "{line}"
        );
        assert_eq!(
            rest,
            r#"level=warning msg="poststop hook failed: \"x\"" id=c1 hook="/bin/false x""#
        );
        assert!(error_line("container c1 does not exist")
            .ends_with(r#" level=error msg="container c1 does not exist""#));
    }
}
