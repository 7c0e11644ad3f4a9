//! A scripted model service for end-to-end agent tests: a TLS server (with a certificate from
//! the test's own CA) on a test host of the test's own (a `198.18.0.0/15` address in a network
//! namespace the test made, [`ModelService::serve`]) or, for the demo, on 127.0.0.1; it speaks
//! enough of the Anthropic Messages API (for `claude -p`) and the OpenAI Responses API (for
//! `codex exec`) to play a script.
//!
//! A script is data: a list of [`Turn`]s, each the model's reply (text, tool calls, or both)
//! and what the client must have sent before it (substrings of the task prompt for the first
//! turn, of the previous turn's tool results after that). Which turn a request asks for is read
//! from the conversation the client sends back, never from a counter: every tool call id this
//! service hands out names its turn (`toolu_h5i_T_K`, `call_h5i_T_K`), so a retried request
//! gets the same turn again. A request that carries no tools (the CLIs' side calls: titles,
//! quota checks) gets a one-word reply and is logged; so is every path the APIs do not need.
//!
//! Every request is recorded with its headers, so a test asserts which credential arrived.
//! A mismatch between the script and what the client sent is answered `400` (the client stops)
//! and kept in [`ModelService::problems`], so the test names the turn that went wrong.
//!
//! Bounded like the rest of the test support: at most [`MAX_CONNS`] connections and
//! [`MAX_REQUESTS_PER_CONN`] requests per connection, every socket with a read timeout.
//! Include it beside the broker's test support (it reuses its request reader):
//! `#[path = "../broker/tests/support/mod.rs"] mod support; mod model;` (the agent tests add
//! the session checks of `model/agent.rs` as their own module; `examples/scripted_model.rs`
//! serves the demo's script with this service alone).
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustls::{ServerConfig, ServerConnection, StreamOwned};
use serde_json::{json, Value};

use crate::support::{read_request, Seen};

/// Connections the service accepts before it stops by itself.
pub const MAX_CONNS: usize = 256;
/// Requests served on one keep-alive connection.
pub const MAX_REQUESTS_PER_CONN: usize = 256;
/// A client that sends nothing for this long is dropped.
pub const READ_TIMEOUT: Duration = Duration::from_secs(120);

/// Which API the service speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// Anthropic Messages (`POST /v1/messages`, SSE when `stream` is true).
    Anthropic,
    /// OpenAI Responses (`POST /v1/responses`, SSE).
    OpenAi,
}

/// One tool call the model makes.
#[derive(Debug, Clone)]
pub struct Call {
    /// The tool's name as the client declared it (`Bash`, `Edit`, `shell`, ...).
    pub tool: String,
    /// Its input: a JSON object (a function call), or, for an OpenAI custom tool such as
    /// `apply_patch`, a JSON string (its free-form input).
    pub input: Value,
}

impl Call {
    pub fn new(tool: &str, input: Value) -> Self {
        Call {
            tool: tool.to_owned(),
            input,
        }
    }
}

/// One turn of the script: what the client must have sent, and the model's reply.
#[derive(Debug, Clone, Default)]
pub struct Turn {
    /// Substrings the client's input must hold: the task prompt for the first turn, the text of
    /// the previous turn's tool results after that.
    pub expect: Vec<String>,
    /// Text the model says (before its calls, if any).
    pub text: Option<String>,
    /// Tool calls; a turn without any ends the session.
    pub calls: Vec<Call>,
}

impl Turn {
    /// A turn that makes `calls`.
    pub fn calls(calls: Vec<Call>) -> Self {
        Turn {
            calls,
            ..Turn::default()
        }
    }

    /// The last turn: the model says `text` and stops.
    pub fn finish(text: &str) -> Self {
        Turn {
            text: Some(text.to_owned()),
            ..Turn::default()
        }
    }

    /// The client's input must contain `s` before this turn is played.
    pub fn expecting(mut self, s: &str) -> Self {
        self.expect.push(s.to_owned());
        self
    }
}

/// What a logged request was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// A turn of the script (its index).
    Turn(usize),
    /// A model call without tools: answered with one word.
    Side,
    /// `count_tokens`.
    CountTokens,
    /// The model list.
    Models,
    /// Anything else: answered minimally.
    Other,
    /// Refused: the script and the client disagreed (see `problems`).
    Refused,
}

/// One request the service received, and what it made of it.
#[derive(Debug, Clone)]
pub struct Logged {
    pub kind: Kind,
    pub seen: Seen,
}

#[derive(Default)]
struct State {
    log: Vec<Logged>,
    problems: Vec<String>,
}

/// A running scripted model service.
pub struct ModelService {
    pub addr: SocketAddr,
    api: Api,
    state: Arc<Mutex<State>>,
}

impl ModelService {
    /// Serve `turns` as `api` over TLS with `cfg` on a fresh 127.0.0.1 port (the demo's way).
    pub fn start(cfg: Arc<ServerConfig>, api: Api, turns: Vec<Turn>) -> Self {
        Self::serve(TcpListener::bind("127.0.0.1:0").unwrap(), cfg, api, turns)
    }

    /// Serve `turns` as `api` over TLS with `cfg` on `listener` (the tests': one bound on a
    /// test host of their own, see `common::testnet::TestHosts::listen`).
    pub fn serve(
        listener: TcpListener,
        cfg: Arc<ServerConfig>,
        api: Api,
        turns: Vec<Turn>,
    ) -> Self {
        for (i, t) in turns.iter().enumerate() {
            assert!(
                i + 1 == turns.len() || !t.calls.is_empty(),
                "turn {i}: only the last turn may end the session (it has no calls)"
            );
        }
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(State::default()));
        let script = Arc::new(turns);
        let st = Arc::clone(&state);
        std::thread::spawn(move || {
            for stream in listener.incoming().take(MAX_CONNS) {
                let Ok(stream) = stream else { continue };
                let (cfg, st, script) = (Arc::clone(&cfg), Arc::clone(&st), Arc::clone(&script));
                std::thread::spawn(move || serve(stream, cfg, api, &script, &st));
            }
        });
        ModelService { addr, api, state }
    }

    /// Every request so far, in arrival order.
    pub fn requests(&self) -> Vec<Logged> {
        self.state.lock().unwrap().log.clone()
    }

    /// Every disagreement between the script and the client, in order.
    pub fn problems(&self) -> Vec<String> {
        self.state.lock().unwrap().problems.clone()
    }

    /// The turn indices served, in order (a retried turn appears twice).
    pub fn turns_served(&self) -> Vec<usize> {
        self.requests()
            .into_iter()
            .filter_map(|l| match l.kind {
                Kind::Turn(i) => Some(i),
                _ => None,
            })
            .collect()
    }

    /// The credential each request carried (`x-api-key`, else `Authorization`), in order.
    pub fn credentials(&self) -> Vec<Option<String>> {
        self.requests()
            .iter()
            .map(|l| {
                l.seen
                    .header("x-api-key")
                    .or_else(|| l.seen.header("authorization"))
                    .map(str::to_owned)
            })
            .collect()
    }

    /// The API this service speaks.
    pub fn api(&self) -> Api {
        self.api
    }
}

fn serve(
    stream: TcpStream,
    cfg: Arc<ServerConfig>,
    api: Api,
    script: &[Turn],
    state: &Mutex<State>,
) {
    if stream.set_read_timeout(Some(READ_TIMEOUT)).is_err() {
        return;
    }
    let Ok(conn) = ServerConnection::new(cfg) else {
        return;
    };
    let mut r = BufReader::new(StreamOwned::new(conn, stream));
    for _ in 0..MAX_REQUESTS_PER_CONN {
        let Some(req) = read_request(&mut r) else {
            return;
        };
        let (kind, answer) = answer(api, script, &req, state);
        state.lock().unwrap().log.push(Logged { kind, seen: req });
        if answer.write(r.get_mut()).is_err() {
            return;
        }
    }
}

/// A response: a status and a JSON body, or an SSE stream of (event, data) pairs.
enum Answer {
    Json(u16, Value),
    Events(Vec<(String, Value)>),
    Empty,
}

impl Answer {
    fn write(&self, w: &mut impl Write) -> std::io::Result<()> {
        match self {
            Answer::Json(status, body) => {
                let body = body.to_string();
                write!(
                    w,
                    "HTTP/1.1 {status} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                    if *status == 200 { "OK" } else { "Bad Request" },
                    body.len()
                )?;
            }
            Answer::Empty => write!(w, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")?,
            Answer::Events(events) => {
                write!(
                    w,
                    "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n"
                )?;
                for (event, data) in events {
                    let chunk = format!("event: {event}\ndata: {data}\n\n");
                    write!(w, "{:x}\r\n{chunk}\r\n", chunk.len())?;
                    w.flush()?;
                }
                write!(w, "0\r\n\r\n")?;
            }
        }
        w.flush()
    }
}

fn refuse(api: Api, problem: String, state: &Mutex<State>) -> (Kind, Answer) {
    let body = match api {
        Api::Anthropic => {
            json!({"type": "error", "error": {"type": "invalid_request_error", "message": problem}})
        }
        Api::OpenAi => json!({"error": {"type": "invalid_request_error", "message": problem}}),
    };
    state.lock().unwrap().problems.push(problem);
    (Kind::Refused, Answer::Json(400, body))
}

fn answer(api: Api, script: &[Turn], req: &Seen, state: &Mutex<State>) -> (Kind, Answer) {
    let path = req.path.split('?').next().unwrap_or("");
    match (req.method.as_str(), path) {
        ("POST", "/v1/messages/count_tokens") => (
            Kind::CountTokens,
            Answer::Json(200, json!({"input_tokens": 42})),
        ),
        ("GET", "/v1/models") => (Kind::Models, Answer::Json(200, models(api))),
        ("POST", "/v1/messages") if api == Api::Anthropic => model_call(api, script, req, state),
        ("POST", "/v1/responses") if api == Api::OpenAi => model_call(api, script, req, state),
        ("HEAD", _) => (Kind::Other, Answer::Empty),
        _ => (Kind::Other, Answer::Json(200, json!({}))),
    }
}

fn models(api: Api) -> Value {
    match api {
        Api::Anthropic => json!({
            "data": [{"type": "model", "id": "claude-scripted", "display_name": "Scripted",
                      "created_at": "2026-01-01T00:00:00Z"}],
            "has_more": false, "first_id": "claude-scripted", "last_id": "claude-scripted"
        }),
        Api::OpenAi => json!({
            "object": "list",
            "data": [{"id": "gpt-scripted", "object": "model", "created": 0, "owned_by": "h5i-test"}]
        }),
    }
}

/// The turn a conversation asks for: one past the highest turn named by a call id this service
/// handed out, or 0 when the conversation holds none.
fn turn_asked(body: &Value, prefix: &str) -> usize {
    let mut ids = Vec::new();
    collect_strings(body, &mut ids);
    ids.iter()
        .filter_map(|s| s.strip_prefix(prefix))
        .filter_map(|rest| rest.split('_').next()?.parse::<usize>().ok())
        .max()
        .map_or(0, |t| t + 1)
}

fn collect_strings(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::String(s) => out.push(s.clone()),
        Value::Array(a) => a.iter().for_each(|x| collect_strings(x, out)),
        Value::Object(o) => o.values().for_each(|x| collect_strings(x, out)),
        _ => {}
    }
}

fn model_call(api: Api, script: &[Turn], req: &Seen, state: &Mutex<State>) -> (Kind, Answer) {
    let body: Value = match serde_json::from_slice(&req.body) {
        Ok(v) => v,
        Err(e) => return refuse(api, format!("request body is not JSON: {e}"), state),
    };
    // Codex sends its tools as an `additional_tools` input item (namespaces of tools), not in
    // the top-level `tools` list.
    let nonempty = |v: &Value| v["tools"].as_array().is_some_and(|t| !t.is_empty());
    let has_tools = nonempty(&body)
        || body["input"].as_array().is_some_and(|items| {
            items
                .iter()
                .any(|i| i["type"] == "additional_tools" && nonempty(i))
        });
    if !has_tools {
        let reply = Turn::finish("ok");
        return (Kind::Side, reply_for(api, &body, usize::MAX, &reply));
    }
    let (prefix, inputs) = match api {
        Api::Anthropic => ("toolu_h5i_", anthropic_inputs(&body)),
        Api::OpenAi => ("call_h5i_", openai_inputs(&body)),
    };
    let turn = turn_asked(&body["messages"], prefix).max(turn_asked(&body["input"], prefix));
    let Some(t) = script.get(turn) else {
        return refuse(
            api,
            format!(
                "the client asked for turn {turn}; the script has {} turns",
                script.len()
            ),
            state,
        );
    };
    let mut seen_text = Vec::new();
    if turn == 0 {
        seen_text.push(inputs.prompt.as_str());
    } else {
        for k in 0..script[turn - 1].calls.len() {
            let id = format!("{prefix}{}_{k}", turn - 1);
            match inputs.results.iter().find(|(got, _)| *got == id) {
                Some((_, text)) => seen_text.push(text),
                None => {
                    return refuse(
                        api,
                        format!(
                            "turn {turn}: no tool result for call {id} (got {:?}; last: {})",
                            inputs.results, inputs.last
                        ),
                        state,
                    )
                }
            }
        }
    }
    let seen_text = seen_text.join("\n");
    for e in &t.expect {
        if !seen_text.contains(e.as_str()) {
            return refuse(
                api,
                format!("turn {turn}: expected {e:?} in what the client sent, got {seen_text:?}"),
                state,
            );
        }
    }
    (Kind::Turn(turn), reply_for(api, &body, turn, t))
}

/// What the client sent: the first user text (the task), and every tool result in the
/// conversation as (call id, text).
struct Inputs {
    prompt: String,
    results: Vec<(String, String)>,
    /// The conversation's last entry, for a refusal's message.
    last: String,
}

fn text_of(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Array(a) => a
            .iter()
            .map(|b| {
                b["text"]
                    .as_str()
                    .map_or_else(|| text_of(&b["content"]), str::to_owned)
            })
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

fn anthropic_inputs(body: &Value) -> Inputs {
    let msgs = body["messages"].as_array().cloned().unwrap_or_default();
    let prompt = msgs
        .iter()
        .find(|m| m["role"] == "user")
        .map(|m| text_of(&m["content"]))
        .unwrap_or_default();
    let results = msgs
        .iter()
        .filter(|m| m["role"] == "user")
        .flat_map(|m| m["content"].as_array().cloned().unwrap_or_default())
        .filter(|b| b["type"] == "tool_result")
        .map(|b| {
            let id = b["tool_use_id"].as_str().unwrap_or("").to_owned();
            (id, text_of(&b["content"]))
        })
        .collect();
    let last = msgs.last().map(short).unwrap_or_default();
    Inputs {
        prompt,
        results,
        last,
    }
}

/// A JSON value as text, cut to 600 characters.
fn short(v: &Value) -> String {
    v.to_string().chars().take(600).collect()
}

fn openai_inputs(body: &Value) -> Inputs {
    let items = body["input"].as_array().cloned().unwrap_or_default();
    let prompt = items
        .iter()
        .filter(|i| i["role"] == "user")
        .map(|i| text_of(&i["content"]))
        .collect::<Vec<_>>()
        .join("\n");
    let results = items
        .iter()
        .filter(|i| {
            matches!(
                i["type"].as_str(),
                Some("function_call_output" | "custom_tool_call_output")
            )
        })
        .map(|i| {
            // A string, or (Codex's custom tools) a list of `input_text` items.
            let out = match &i["output"] {
                Value::Array(_) => text_of(&i["output"]),
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            (i["call_id"].as_str().unwrap_or("").to_owned(), out)
        })
        .collect();
    let last = items.last().map(short).unwrap_or_default();
    Inputs {
        prompt,
        results,
        last,
    }
}

fn reply_for(api: Api, body: &Value, turn: usize, t: &Turn) -> Answer {
    let model = body["model"].as_str().unwrap_or("scripted").to_owned();
    match api {
        Api::Anthropic => anthropic_reply(&model, body["stream"] == true, turn, t),
        Api::OpenAi => openai_reply(&model, turn, t),
    }
}

fn anthropic_reply(model: &str, stream: bool, turn: usize, t: &Turn) -> Answer {
    let mut blocks = Vec::new();
    if let Some(text) = &t.text {
        blocks.push(json!({"type": "text", "text": text}));
    }
    for (k, c) in t.calls.iter().enumerate() {
        blocks.push(
            json!({"type": "tool_use", "id": format!("toolu_h5i_{turn}_{k}"),
                           "name": c.tool, "input": c.input}),
        );
    }
    let stop = if t.calls.is_empty() {
        "end_turn"
    } else {
        "tool_use"
    };
    let id = format!("msg_h5i_{turn}");
    let usage = json!({"input_tokens": 10, "output_tokens": 10,
                       "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0});
    if !stream {
        return Answer::Json(
            200,
            json!({"id": id, "type": "message", "role": "assistant", "model": model,
                   "content": blocks, "stop_reason": stop, "stop_sequence": null, "usage": usage}),
        );
    }
    let mut ev = vec![(
        "message_start".to_owned(),
        json!({"type": "message_start", "message": {"id": id, "type": "message",
               "role": "assistant", "model": model, "content": [], "stop_reason": null,
               "stop_sequence": null, "usage": usage}}),
    )];
    for (index, b) in blocks.iter().enumerate() {
        let (start, delta) = if b["type"] == "text" {
            (
                json!({"type": "text", "text": ""}),
                json!({"type": "text_delta", "text": b["text"]}),
            )
        } else {
            (
                json!({"type": "tool_use", "id": b["id"], "name": b["name"], "input": {}}),
                json!({"type": "input_json_delta", "partial_json": b["input"].to_string()}),
            )
        };
        ev.push((
            "content_block_start".into(),
            json!({"type": "content_block_start", "index": index, "content_block": start}),
        ));
        ev.push((
            "content_block_delta".into(),
            json!({"type": "content_block_delta", "index": index, "delta": delta}),
        ));
        ev.push((
            "content_block_stop".into(),
            json!({"type": "content_block_stop", "index": index}),
        ));
    }
    ev.push((
        "message_delta".into(),
        json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null},
               "usage": {"output_tokens": 10}}),
    ));
    ev.push(("message_stop".into(), json!({"type": "message_stop"})));
    Answer::Events(ev)
}

fn openai_reply(model: &str, turn: usize, t: &Turn) -> Answer {
    let id = format!("resp_h5i_{turn}");
    let mut items = Vec::new();
    if let Some(text) = &t.text {
        items.push(
            json!({"type": "message", "id": format!("msg_h5i_{turn}"), "role": "assistant",
                          "status": "completed",
                          "content": [{"type": "output_text", "text": text, "annotations": []}]}),
        );
    }
    for (k, c) in t.calls.iter().enumerate() {
        let call_id = format!("call_h5i_{turn}_{k}");
        items.push(match &c.input {
            Value::String(s) => {
                json!({"type": "custom_tool_call", "id": format!("ctc_h5i_{turn}_{k}"),
                "status": "completed", "call_id": call_id, "name": c.tool, "input": s})
            }
            other => json!({"type": "function_call", "id": format!("fc_h5i_{turn}_{k}"),
                "status": "completed", "call_id": call_id, "name": c.tool,
                "arguments": other.to_string()}),
        });
    }
    let response = |status: &str, output: &[Value]| {
        json!({"id": id, "object": "response", "created_at": 0, "status": status, "model": model,
               "output": output,
               "usage": {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 0},
                         "output_tokens": 10, "output_tokens_details": {"reasoning_tokens": 0},
                         "total_tokens": 20}})
    };
    let mut ev = vec![(
        "response.created".to_owned(),
        json!({"type": "response.created", "response": response("in_progress", &[])}),
    )];
    for (index, item) in items.iter().enumerate() {
        ev.push((
            "response.output_item.added".into(),
            json!({"type": "response.output_item.added", "output_index": index, "item": item}),
        ));
        if let Some(text) = t.text.as_ref().filter(|_| item["type"] == "message") {
            ev.push((
                "response.output_text.delta".into(),
                json!({"type": "response.output_text.delta", "item_id": item["id"],
                       "output_index": index, "content_index": 0, "delta": text}),
            ));
        }
        ev.push((
            "response.output_item.done".into(),
            json!({"type": "response.output_item.done", "output_index": index, "item": item}),
        ));
    }
    ev.push((
        "response.completed".into(),
        json!({"type": "response.completed", "response": response("completed", &items)}),
    ));
    Answer::Events(ev)
}
