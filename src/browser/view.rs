//! `h5i box view NAME [--port N]`: a human's window onto a box's browser, served on loopback.
//!
//! Owns the viewer server: a listener on `127.0.0.1` only (on `--port`, `viewer::DEFAULT_PORT`
//! unless told, `0` for one the OS picks), a current-thread tokio runtime serving two GET
//! routes with axum: `/` (the page, `view.html`, embedded) and `/ws` (the WebSocket the page
//! opens). Every request must carry the box's token (`viewer.rs`, compared in constant time)
//! or gets 401, before anything else is looked at; a request naming another host (a rebound DNS
//! name) gets 421; a WebSocket handshake whose `Origin` is not the viewer's own gets 403.
//!
//! Each WebSocket session connects to the box's screencast stream through `watch` (the frame
//! source and control lock `h5i box view --term` uses too), and then:
//! - box -> page: only `frame` messages (base64 checked, re-encoded by h5i)
//!   and the page's URL, cut to its origin (userinfo dropped, escapes escaped) for h5i's status
//!   bar; everything else the box sends is dropped;
//! - page -> box: `input_mouse|input_keyboard|input_touch` pass only while a human holds the
//!   control lock and that human is the user running the viewer (`watch::input`, read per
//!   event); otherwise they are dropped and counted; `take` and `release` are `h5i browser
//!   take|release` (the same code, the same `viewer`-lane record);
//! - h5i's own status (box, holder, page origin, egress policy, console errors, inputs sent and
//!   dropped) every second and after every change.
//!
//! Each session lands in the box's receipt log as a `viewer`-lane `viewer-session` record when
//! it opens and when it closes (who, whether a human took control from it, inputs sent and
//! dropped), through `view_sessions`: Ctrl-C closes every session before the viewer exits, and
//! a viewer killed outright leaves a claim the next `box view` or `box export` closes as
//! `killed`.
//!
//! What it does not close: the stream port is on the box's own loopback, so a process in the
//! box can connect to it too and send input events of its own; the lock binds the viewer and
//! agent-browser's channel (the relay), not every socket in the box (as with Chromium's DevTools
//! port, `relay.rs`).
//!
//! Must never: bind anything but loopback, answer a request without the token, accept a
//! cross-origin WebSocket, pass input to the box while the agent (or another user) holds the
//! lock, hand the page any box-supplied text but a checked frame and an escaped origin, publish
//! the box's stream port, or write the token anywhere.
//!
//! Guarded by `tests/browser.rs` and the unit tests of `watch`.

use std::collections::HashMap;
use std::future::IntoFuture;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{Message as PageMessage, WebSocket, WebSocketUpgrade};
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::sync::{mpsc, watch};
use tokio_tungstenite::tungstenite::Message as BoxMessage;

use super::control::ControlError;
use super::view_sessions::{self, Tally};
use super::viewer;
use super::watch::{self as source, BoxStream};
use crate::error::BoxError;
use crate::store::{BoxStore, StoredBox};

/// The page, with `{NONCE}` where its script's CSP nonce goes.
const PAGE: &str = include_str!("view.html");
/// Longest message the page may send (an input event is a few hundred bytes).
const MAX_PAGE_MESSAGE: usize = 64 << 10;
/// How long the sessions may take to write their `closed` records at Ctrl-C.
const CLOSING: Duration = Duration::from_secs(10);
/// The `via` of this viewer's session records.
const VIA: &str = "browser viewer";

/// What one viewer serves.
struct View {
    store: BoxStore,
    sb: StoredBox,
    token: String,
    /// `127.0.0.1:PORT`, the only Host the viewer answers.
    host: String,
    /// `http://127.0.0.1:PORT`, the only Origin a WebSocket may come from.
    origin: String,
    egress: String,
    nonce: String,
    /// Turns true at Ctrl-C: every session ends and writes its `closed` record.
    stop: watch::Receiver<bool>,
    /// Cloned by each session for its life; taken at Ctrl-C, so the server can wait for the
    /// last session's clone to go.
    live: Mutex<Option<mpsc::Sender<()>>>,
    /// The `--open` handoff file, removed once the token is first presented.
    handoff: OnceLock<Arc<crate::ui::handoff::Handoff>>,
}

/// `h5i box view NAME`: close the sessions of viewers gone (`view_sessions`), check the box can
/// be watched, bind `127.0.0.1:port`, call `ready` with the viewer's URL (and with `open`, hand
/// it to the desktop's browser: `ui::handoff`), and serve until Ctrl-C, when every session
/// writes its `closed` record before the viewer exits.
pub fn serve(
    store: &BoxStore,
    name: &str,
    port: u16,
    open: bool,
    ready: impl FnOnce(&str),
) -> Result<(), ControlError> {
    let (sb, policy) = source::watchable(store, name)?;
    let refuse = source::refuse;
    let token = viewer::token(&sb.paths)?;
    let listener = std::net::TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, port)))
        .and_then(|l| l.set_nonblocking(true).map(|()| l))
        .map_err(|e| {
            refuse(
                format!("cannot bind 127.0.0.1:{port} for the viewer ({e})"),
                "pick another port with `--port N` (0: any free one)".into(),
            )
        })?;
    let bound = listener
        .local_addr()
        .map_err(|e| BoxError::io(std::path::Path::new("127.0.0.1"), e))?
        .port();
    let stop = crate::ui::stop::on_stop().map_err(|e| {
        refuse(
            format!("cannot take Ctrl-C for the viewer ({e})"),
            "report this as a bug".into(),
        )
    })?;
    let (live, mut all_ended) = mpsc::channel::<()>(1);
    let view = Arc::new(View {
        store: store.clone(),
        host: format!("127.0.0.1:{bound}"),
        origin: format!("http://127.0.0.1:{bound}"),
        egress: source::egress_summary(&policy),
        nonce: nonce()?,
        stop: stop.clone(),
        live: Mutex::new(Some(live)),
        handoff: OnceLock::new(),
        sb,
        token,
    });
    let url = viewer::url_with(&view.token, bound);
    ready(&url);
    if open {
        match crate::ui::handoff::Handoff::open(store, &url) {
            Ok(h) => {
                let _ = view.handoff.set(h);
            }
            Err(e) => eprintln!("h5i: {e}"),
        }
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .map_err(|e| {
            refuse(
                format!("cannot start the viewer's runtime ({e})"),
                "report this as a bug".into(),
            )
        })?;
    let app = Router::new()
        .route("/", get(page))
        .route("/ws", get(socket))
        .fallback(page)
        .with_state(Arc::clone(&view));
    let mut stopped = stop;
    runtime
        .block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener)?;
            tokio::select! {
                served = axum::serve(listener, app).into_future() => served?,
                _ = stopped.wait_for(|s| *s) => {}
            }
            if let Some(h) = view.handoff.get() {
                h.used();
            }
            // Every session has seen the stop; wait (bounded) for each to write its record.
            drop(view.live.lock().map(|mut l| l.take()));
            let _ = tokio::time::timeout(CLOSING, all_ended.recv()).await;
            Ok::<(), std::io::Error>(())
        })
        .map_err(|e| {
            refuse(
                format!("the viewer stopped ({e})"),
                "run `h5i box view` again".into(),
            )
        })
}

/// A fresh CSP nonce for the page's script (hex of 16 random bytes).
fn nonce() -> Result<String, BoxError> {
    crate::random::hex_for_box(16)
}

fn refusal(status: StatusCode, text: String) -> Response {
    (status, [(header::CACHE_CONTROL, "no-store")], text + "\n").into_response()
}

/// The token first (401 without it, whatever else the request says), then the Host.
fn admit(v: &View, headers: &HeaderMap, query: &HashMap<String, String>) -> Result<(), Response> {
    let name = v.sb.manifest.name.as_str();
    if !query
        .get("token")
        .is_some_and(|t| viewer::token_matches(&v.token, t))
    {
        return Err(refusal(
            StatusCode::UNAUTHORIZED,
            format!("refusing: no valid viewer token; to fix: open the URL `h5i browser url {name}` prints"),
        ));
    }
    if headers.get(header::HOST).and_then(|h| h.to_str().ok()) != Some(v.host.as_str()) {
        return Err(refusal(
            StatusCode::MISDIRECTED_REQUEST,
            format!("refusing: the viewer answers only as {}; to fix: open the URL `h5i browser url {name}` prints", v.host),
        ));
    }
    if let Some(h) = v.handoff.get() {
        h.used();
    }
    Ok(())
}

/// `/` (the page) and every other path (404), each behind [`admit`].
async fn page(
    State(v): State<Arc<View>>,
    uri: Uri,
    headers: HeaderMap,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    if let Err(r) = admit(&v, &headers, &query) {
        return r;
    }
    if uri.path() != "/" {
        return refusal(
            StatusCode::NOT_FOUND,
            "refusing: no such page; to fix: open `/`".into(),
        );
    }
    let csp = format!(
        "default-src 'none'; script-src 'nonce-{n}'; style-src 'nonce-{n}'; img-src data:; connect-src ws://{h}; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
        n = v.nonce,
        h = v.host
    );
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8".to_string()),
            (header::CONTENT_SECURITY_POLICY, csp),
            (header::X_FRAME_OPTIONS, "DENY".into()),
            (header::REFERRER_POLICY, "no-referrer".into()),
            (header::CACHE_CONTROL, "no-store".into()),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff".into()),
        ],
        PAGE.replace("{NONCE}", &v.nonce),
    )
        .into_response()
}

async fn socket(
    State(v): State<Arc<View>>,
    headers: HeaderMap,
    Query(query): Query<HashMap<String, String>>,
    upgrade: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Response {
    if let Err(r) = admit(&v, &headers, &query) {
        return r;
    }
    let origin = headers.get(header::ORIGIN).and_then(|o| o.to_str().ok());
    if origin != Some(v.origin.as_str()) {
        return refusal(
            StatusCode::FORBIDDEN,
            format!(
                "refusing: a WebSocket from origin {}, not the viewer's own ({}); to fix: use the viewer's own page",
                crate::escape::escape_controls(origin.unwrap_or("(none)")),
                v.origin
            ),
        );
    }
    match upgrade {
        Ok(u) => u
            .max_message_size(MAX_PAGE_MESSAGE)
            .on_upgrade(move |ws| session(v, ws)),
        Err(e) => e.into_response(),
    }
}

/// What the page asked for.
enum FromPage {
    /// An input event to pass to the box.
    Input(String),
    /// Taking or handing back control was done (or refused: the text says why).
    Control(Option<String>),
    /// Nothing to do.
    Nothing,
}

/// Judge one message from the page.
async fn from_page(v: &Arc<View>, text: &str, t: &mut Tally) -> FromPage {
    let Ok(Value::Object(msg)) = serde_json::from_str::<Value>(text) else {
        return FromPage::Nothing;
    };
    let kind = msg.get("type").and_then(Value::as_str).unwrap_or("");
    if source::INPUT.contains(&kind) {
        return source::input(&v.sb, msg, t).map_or(FromPage::Nothing, FromPage::Input);
    }
    let take = match kind {
        "take" => true,
        "release" => false,
        _ => return FromPage::Nothing,
    };
    FromPage::Control(
        source::take_or_release(&v.store, &v.sb.manifest.name, take, t)
            .await
            .err(),
    )
}

/// h5i's status line for the page; `errors`: the page's console errors, when the browser said.
fn status(v: &View, t: &Tally, origin: &str, errors: Option<usize>, error: Option<&str>) -> String {
    let (holder, mine) = source::holder(&v.sb);
    json!({
        "type": "h5i",
        "box": v.sb.manifest.name,
        "holder": holder,
        "mine": mine,
        "origin": origin,
        "egress": v.egress,
        "console_errors": errors,
        "input_sent": t.input_sent,
        "input_dropped": t.input_dropped,
        "error": error,
    })
    .to_string()
}

/// One page's session: the box's stream out, the human's input in (while they hold the lock),
/// its claim and records kept by `view_sessions` (refused when they cannot be written: a
/// session is never unrecorded).
async fn session(v: Arc<View>, page: WebSocket) {
    let mut t = Tally::default();
    let (mut page_tx, mut page_rx) = page.split();
    let live = v.live.lock().ok().and_then(|l| l.clone());
    let sb = v.sb.clone();
    let opened = tokio::task::spawn_blocking(move || view_sessions::open(&sb, VIA, &source::me()))
        .await
        .map_err(|e| e.to_string())
        .and_then(|o| o.map_err(|e| e.to_string()));
    let (Some(_live), Ok(mut claim)) = (live, opened) else {
        let text = status(
            &v,
            &t,
            "",
            None,
            Some("refusing: the viewer is stopping, or cannot record the session; to fix: run `h5i box view` again"),
        );
        let _ = page_tx.send(PageMessage::Text(text.into())).await;
        return;
    };
    let mut stop = v.stop.clone();
    let error = match source::connect(&v.sb).await {
        Ok((upstream, origin)) => {
            pass_both_ways(
                &v,
                &mut t,
                &mut claim,
                upstream,
                origin,
                &mut page_tx,
                &mut page_rx,
                &mut stop,
            )
            .await;
            None
        }
        Err(e) => Some(format!(
            "refusing: {e}; to fix: start the box's browser with a run"
        )),
    };
    if let Some(e) = error {
        let text = status(&v, &t, "", None, Some(&e));
        let _ = page_tx.send(PageMessage::Text(text.into())).await;
    }
    let closed = tokio::task::spawn_blocking(move || claim.close(t)).await;
    if let Ok(Err(e)) = closed {
        eprintln!("h5i: {e}");
    }
}

type PageTx = futures_util::stream::SplitSink<WebSocket, PageMessage>;
type PageRx = futures_util::stream::SplitStream<WebSocket>;

/// Pass messages both ways until either side closes or the viewer stops, saving the session's
/// counts as they change.
#[allow(clippy::too_many_arguments)]
async fn pass_both_ways(
    v: &Arc<View>,
    t: &mut Tally,
    claim: &mut view_sessions::Session,
    upstream: BoxStream,
    mut origin: String,
    page_tx: &mut PageTx,
    page_rx: &mut PageRx,
    stop: &mut watch::Receiver<bool>,
) {
    let (mut box_tx, mut box_rx) = upstream.split();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut errors = None;
    while !*stop.borrow_and_update() {
        let said = tokio::select! {
            m = box_rx.next() => match m {
                Some(Ok(BoxMessage::Text(text))) => source::from_box(&text, &mut origin).map(|f| {
                    json!({"type": "frame", "seq": f.seq, "data": f.data}).to_string()
                }),
                Some(Ok(BoxMessage::Close(_)) | Err(_)) | None => break,
                Some(Ok(_)) => None,
            },
            m = page_rx.next() => match m {
                Some(Ok(PageMessage::Text(text))) => match from_page(v, &text, t).await {
                    FromPage::Input(line) => {
                        if box_tx.send(BoxMessage::Text(line.into())).await.is_err() {
                            break;
                        }
                        None
                    }
                    FromPage::Control(error) => Some(status(v, t, &origin, errors, error.as_deref())),
                    FromPage::Nothing => Some(status(v, t, &origin, errors, None)),
                },
                Some(Ok(PageMessage::Close(_)) | Err(_)) | None => break,
                Some(Ok(_)) => None,
            },
            _ = stop.changed() => break,
            _ = tick.tick() => {
                errors = source::console_errors(&v.sb).await;
                Some(status(v, t, &origin, errors, None))
            }
        };
        if let Err(e) = claim.update(*t) {
            eprintln!("h5i: {e}");
        }
        if let Some(text) = said {
            if page_tx.send(PageMessage::Text(text.into())).await.is_err() {
                break;
            }
        }
    }
}
