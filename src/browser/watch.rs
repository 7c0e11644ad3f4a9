//! What both of a human's windows onto a box's browser share (`h5i box view`, served to a
//! browser by `view.rs`, and `h5i box view --term`, drawn in the terminal by `term.rs`): one
//! frame source and one way to the control lock.
//!
//! Owns: whether a box can be watched ([`watchable`]: a box-lifetime browser that streams, its
//! orphaned viewer sessions closed first), connecting to the box's screencast stream from inside
//! the sidecar's network namespace ([`connect`]: `service::connect_inside`, the port never
//! published), what is taken from that stream ([`from_box`]: a frame whose data is checked
//! base64, and the page's URL cut to its origin by [`origin_of`]; everything else dropped),
//! judging a human's input event ([`input`]: passed only while a human holds the control lock
//! and that human is the user running the viewer, read per event; counted either way), taking
//! and handing back the lock ([`take_or_release`]: `h5i browser take|release`, the same code
//! and record), and the status every viewer shows (holder, egress policy, console errors).
//!
//! Must never: pass a box-supplied string to a viewer but checked base64 and an escaped origin,
//! pass input while the agent (or another user) holds the lock, or publish the stream's port.
//!
//! Guarded by `tests/browser.rs` (both viewers) and the unit tests below.

use std::time::Duration;

use h5i_policy::ResolvedPolicy;
use serde_json::{Map, Value};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;

use super::control::{self, ControlError, Holder};
use super::sidecar;
use super::view_sessions::{self, Tally};
use crate::error::BoxError;
use crate::store::{BoxStore, StoredBox};

/// Longest message taken from the box's stream (a frame of a large viewport as base64).
const MAX_BOX_MESSAGE: usize = 16 << 20;
/// Longest page origin shown; a longer one is cut from the left (its registrable end stays).
pub const ORIGIN_MAX: usize = 64;
/// How long connecting to the box's stream may take.
const CONNECT: Duration = Duration::from_secs(15);
/// Input message types a viewer may send, which pass only for the lock's human holder.
pub const INPUT: &[&str] = &["input_mouse", "input_keyboard", "input_touch"];

/// The box's stream, connected.
pub type BoxStream = tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>;

/// Box `name` checked to be watchable, with its policy: a browser box whose browser lives for
/// the box and streams. Sessions of viewers gone are closed first (`view_sessions`).
pub fn watchable(
    store: &BoxStore,
    name: &str,
) -> Result<(StoredBox, ResolvedPolicy), ControlError> {
    let sb = control::browser_box(store, name)?;
    view_sessions::close_orphans(&sb)?;
    let policy = crate::store::load_policy(&sb)?;
    if !sidecar::lives_for_the_box(&policy) {
        return Err(refuse(
            format!(
                "box `{name}` has no box-lifetime browser to watch ({})",
                sidecar::why_per_run(&policy)
            ),
            "watch a process- or supervised-tier browser box (an unprivileged caller needs a range in /etc/subgid)".into(),
        ));
    }
    sidecar::stream_port(&sb).map_err(|e| {
        refuse(
            format!("box `{name}` cannot be watched: {e}"),
            format!("start its browser and stream it: `h5i box run {name} -- agent-browser stream enable`"),
        )
    })?;
    Ok((sb, policy))
}

/// A `refusing: what; to fix: mend` control error.
pub fn refuse(what: String, mend: String) -> ControlError {
    ControlError::Box(BoxError::BadRequest { what, mend })
}

/// The host user running the viewer, as recorded.
pub fn me() -> String {
    control::user_label(control::caller_uid())
}

/// The egress policy as the status shows it.
pub fn egress_summary(policy: &ResolvedPolicy) -> String {
    if policy.net.mode == h5i_policy::resolved::NetMode::Host {
        return "host network (unscoped)".into();
    }
    if policy.net.egress.is_empty() {
        return "deny all (the box's own loopback only)".into();
    }
    let hosts: Vec<String> = policy.net.egress.iter().map(ToString::to_string).collect();
    format!("deny all but {}", hosts.join(", "))
}

/// Connect to the box's stream from inside its network namespace; with it, the origin of the
/// page the browser shows now (later ones arrive on the stream).
pub async fn connect(sb: &StoredBox) -> Result<(BoxStream, String), String> {
    let sb = sb.clone();
    let (port, stream, url) = tokio::task::spawn_blocking(move || {
        let port = sidecar::stream_port(&sb)?;
        let stream = crate::service::connect_inside(
            &sb.paths,
            sidecar::SERVICE,
            port,
            super::fence::SIDECAR_GID,
        )
        .map_err(|e| format!("cannot reach the box's stream ({e})"))?;
        Ok::<_, String>((port, stream, sidecar::page_url(&sb)))
    })
    .await
    .map_err(|e| format!("the connecting task failed ({e})"))??;
    stream
        .set_nonblocking(true)
        .map_err(|e| format!("cannot use the box's stream ({e})"))?;
    let stream = tokio::net::TcpStream::from_std(stream)
        .map_err(|e| format!("cannot use the box's stream ({e})"))?;
    let config = WebSocketConfig::default()
        .max_message_size(Some(MAX_BOX_MESSAGE))
        .max_frame_size(Some(MAX_BOX_MESSAGE));
    let handshake = tokio_tungstenite::client_async_with_config(
        format!("ws://127.0.0.1:{port}/"),
        stream,
        Some(config),
    );
    let origin = url.as_deref().map(origin_of).unwrap_or_default();
    match tokio::time::timeout(CONNECT, handshake).await {
        Ok(Ok((ws, _))) => Ok((ws, origin)),
        Ok(Err(e)) => Err(format!("the box's stream refused the handshake ({e})")),
        Err(_) => Err("the box's stream did not answer the handshake".into()),
    }
}

/// One frame from the box: its sequence number and its JPEG as checked base64.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// The stream's sequence number (0 when it gave none).
    pub seq: u64,
    /// The JPEG, base64 of the standard alphabet only.
    pub data: String,
}

/// What h5i takes of one message from the box: a checked frame; a URL only updates `origin`.
pub fn from_box(text: &str, origin: &mut String) -> Option<Frame> {
    let v: Value = serde_json::from_str(text).ok()?;
    match v["type"].as_str()? {
        "frame" => {
            let data = v["data"].as_str()?;
            let base64 = !data.is_empty()
                && data
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'='));
            base64.then(|| Frame {
                seq: v["seq"].as_u64().unwrap_or(0),
                data: data.to_string(),
            })
        }
        "url" => {
            *origin = origin_of(v["url"].as_str()?);
            None
        }
        _ => None,
    }
}

/// The origin of `url` as a viewer shows it: scheme and host (userinfo dropped), escapes
/// escaped, cut from the left when longer than [`ORIGIN_MAX`], so the end of the host that
/// names who owns it always shows.
pub fn origin_of(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host = authority.rsplit('@').next().unwrap_or("");
    let whole = if scheme.is_empty() {
        url.split([':', ',']).next().unwrap_or("").to_string() + ":"
    } else {
        format!("{scheme}://{host}")
    };
    cut_left(&crate::escape::escape_controls(&whole), ORIGIN_MAX)
}

/// `shown` in at most `max` characters, cut from the left behind an ellipsis.
pub fn cut_left(shown: &str, max: usize) -> String {
    let chars: Vec<char> = shown.chars().collect();
    if chars.len() <= max {
        return shown.to_string();
    }
    if max == 0 {
        return String::new();
    }
    let tail: String = chars[chars.len() - (max - 1)..].iter().collect();
    format!("…{tail}")
}

/// Whether the user running the viewer holds box `sb`'s control lock now.
pub fn mine(sb: &StoredBox) -> bool {
    let c = control::read(&sb.paths);
    c.holder == Holder::Human && c.taken_by_uid == Some(control::caller_uid())
}

/// Who holds box `sb`'s control lock, as shown (`agent`, or `human: NAME (uid N)`), and
/// whether it is the user running the viewer.
pub fn holder(sb: &StoredBox) -> (String, bool) {
    let c = control::read(&sb.paths);
    let label = match (c.holder, c.taken_by_uid) {
        (Holder::Human, Some(uid)) => format!("human: {}", control::user_label(uid)),
        (h, _) => h.as_str().to_string(),
    };
    (label, mine(sb))
}

/// Judge one input event `msg` (an object whose `type` is one of [`INPUT`]): the line to send
/// the box while the user running the viewer holds the lock (counted as sent), else `None`
/// (counted as dropped).
pub fn input(sb: &StoredBox, msg: Map<String, Value>, t: &mut Tally) -> Option<String> {
    if mine(sb) {
        t.input_sent += 1;
        return Some(Value::Object(msg).to_string());
    }
    t.input_dropped += 1;
    None
}

/// Take (`take`) or hand back box `name`'s control lock as `h5i browser take|release` does;
/// why not, as a `refusing: ...` line.
pub async fn take_or_release(
    store: &BoxStore,
    name: &str,
    take: bool,
    t: &mut Tally,
) -> Result<(), String> {
    let (store, name) = (store.clone(), name.to_string());
    let done = tokio::task::spawn_blocking(move || {
        if take {
            control::take_for_viewer(&store, &name)
        } else {
            control::release(&store, &name)
        }
    })
    .await;
    match done {
        Ok(Ok(_)) => {
            t.took_control |= take;
            Ok(())
        }
        Ok(Err(e)) => Err(e.to_string()),
        Err(e) => Err(format!(
            "refusing: the control change failed ({e}); to fix: use `h5i browser take|release`"
        )),
    }
}

/// How many console errors the box's page logged since the last drain (h5i's own read-only
/// question to the daemon, never through the relay); `None` when the browser does not answer.
pub async fn console_errors(sb: &StoredBox) -> Option<usize> {
    let sb = sb.clone();
    tokio::task::spawn_blocking(move || sidecar::console_errors(&sb))
        .await
        .ok()
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_is_taken_only_as_checked_base64_and_anything_else_is_dropped() {
        let mut origin = String::new();
        let frame = r#"{"type":"frame","seq":3,"data":"/9j/4AAQ+/=","metadata":{"deviceWidth":1280,"deviceHeight":720}}"#;
        let out = from_box(frame, &mut origin).unwrap();
        assert_eq!(out.seq, 3);
        assert_eq!(out.data, "/9j/4AAQ+/=");
        for bad in [
            r#"{"type":"frame","data":"\"><script>x</script>"}"#,
            r#"{"type":"frame","data":""}"#,
            r#"{"type":"frame","data":"AAAA\u001b]52;c;AAAA\u0007"}"#,
            r#"{"type":"console","text":"\u001b]52;c;AAAA\u0007"}"#,
            r#"{"type":"status"}"#,
            "not json",
        ] {
            assert!(from_box(bad, &mut origin).is_none(), "{bad}");
        }
        assert!(from_box(
            r#"{"type":"url","url":"http://u:p@a.test:3000/x?y"}"#,
            &mut origin
        )
        .is_none());
        assert_eq!(origin, "http://a.test:3000");
    }

    #[test]
    fn a_long_origin_is_cut_from_the_left_and_escapes_are_escaped() {
        let long = format!("https://bank.example.{}.evil.test/login", "x".repeat(80));
        let shown = origin_of(&long);
        assert!(
            shown.starts_with('…') && shown.ends_with(".evil.test"),
            "{shown}"
        );
        assert_eq!(shown.chars().count(), ORIGIN_MAX);
        for hostile in [
            "http://a\u{1b}]0;t\u{7}.test/",
            "http://a\u{9b}2J\u{9d}52;c;QQ==\u{7}.test/",
            "http://a\u{1b}P1$qm\u{1b}\\.test/",
        ] {
            let esc = origin_of(hostile);
            assert!(!esc.chars().any(crate::escape::is_control), "{esc:?}");
        }
        assert_eq!(origin_of("about:blank"), "about:");
        assert_eq!(cut_left("abcdef", 4), "…def");
        assert_eq!(cut_left("abc", 4), "abc");
        assert_eq!(cut_left("abc", 0), "");
    }
}
