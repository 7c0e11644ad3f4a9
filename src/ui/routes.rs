//! The console's routes: every one a GET, every one behind [`super::auth::guard`], none of them
//! reading a file from disk by a name a request chose (the page is compiled in; a box is found
//! by name through the store, which refuses a name that is not a box name).
//!
//! The store is read on the runtime's blocking threads (`status` and `diff` take the box's lock
//! and run git): the runtime's one worker thread only moves bytes.
//!
//! Must never: register a route for another method, serve a path from the filesystem, or answer
//! with a document that did not pass [`super::fleet::shown`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::middleware::from_fn_with_state;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use serde_json::Value;

use super::auth::{guard, Gate};
use super::fleet;
use crate::error::BoxError;
use crate::store::BoxStore;

/// How often a waiting `changes` request looks at the store.
const CHANGE_POLL: Duration = Duration::from_millis(250);

/// The longest a `changes` request waits before answering "no change" (the page asks again).
const CHANGE_WAIT: Duration = Duration::from_secs(20);

/// The page, its script and its style, compiled in.
const PAGE_HTML: &str = include_str!("page/index.html");
const PAGE_JS: &str = include_str!("page/app.js");
const PAGE_CSS: &str = include_str!("page/app.css");

type Store = Arc<BoxStore>;

/// Every route of the console, under the gate's session path, behind the gate.
pub fn router(store: BoxStore, gate: Arc<Gate>) -> Router {
    let base = gate.base.clone();
    Router::new()
        .route(&format!("{base}/"), get(|| asset(PAGE_HTML, "text/html")))
        .route(
            &format!("{base}/app.js"),
            get(|| asset(PAGE_JS, "text/javascript")),
        )
        .route(
            &format!("{base}/app.css"),
            get(|| asset(PAGE_CSS, "text/css")),
        )
        .route(&format!("{base}/api/fleet"), get(fleet_doc))
        .route(&format!("{base}/api/changes"), get(changes))
        .route(&format!("{base}/api/box/{{name}}"), get(detail))
        .route(
            &format!("{base}/api/box/{{name}}/receipt/{{seq}}"),
            get(receipt),
        )
        .fallback(|| async { (StatusCode::NOT_FOUND, "no such page\n") })
        .with_state(Arc::new(store))
        .layer(from_fn_with_state(gate, guard))
}

async fn asset(body: &'static str, kind: &'static str) -> Response {
    let kind = match kind {
        "text/html" => "text/html; charset=utf-8",
        "text/javascript" => "text/javascript; charset=utf-8",
        _ => "text/css; charset=utf-8",
    };
    ([(header::CONTENT_TYPE, kind)], body).into_response()
}

/// A document as the page receives it (every string through the one escaper).
fn json(doc: Value) -> Response {
    let text = crate::escape::json(&fleet::shown(doc).to_string());
    (
        [(header::CONTENT_TYPE, "application/json; charset=utf-8")],
        text,
    )
        .into_response()
}

/// Run `read` against the store on a blocking thread; its document, or its refusal.
async fn read_store(
    store: Store,
    read: impl FnOnce(&BoxStore) -> Result<Value, BoxError> + Send + 'static,
) -> Response {
    match tokio::task::spawn_blocking(move || read(&store)).await {
        Ok(Ok(doc)) => json(doc),
        Ok(Err(e)) => {
            let code = match e {
                BoxError::NoSuchBox { .. }
                | BoxError::BadName { .. }
                | BoxError::BadRequest { .. } => StatusCode::NOT_FOUND,
                _ => StatusCode::INTERNAL_SERVER_ERROR,
            };
            (code, crate::escape::escape_controls(&e.to_string())).into_response()
        }
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

async fn fleet_doc(State(store): State<Store>) -> Response {
    read_store(store, fleet::fleet_doc).await
}

async fn detail(State(store): State<Store>, Path(name): Path<String>) -> Response {
    read_store(store, move |s| fleet::detail(s, &name)).await
}

async fn receipt(State(store): State<Store>, Path((name, seq)): Path<(String, u64)>) -> Response {
    read_store(store, move |s| fleet::receipt(s, &name, seq)).await
}

/// `changes?seen=V`: answers as soon as the store's version is not `V`, or after
/// [`CHANGE_WAIT`] with the same version: a GET the page repeats, so updates arrive without a
/// reload and without a channel into the server.
#[derive(serde::Deserialize)]
struct Seen {
    seen: Option<String>,
}

async fn changes(State(store): State<Store>, Query(q): Query<Seen>) -> Response {
    let until = Instant::now() + CHANGE_WAIT;
    loop {
        let s = store.clone();
        let now = tokio::task::spawn_blocking(move || fleet::version(&s))
            .await
            .unwrap_or_default();
        if q.seen.as_deref() != Some(now.as_str()) || Instant::now() >= until {
            return json(serde_json::json!({ "version": now }));
        }
        tokio::time::sleep(CHANGE_POLL).await;
    }
}
