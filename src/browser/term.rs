//! `h5i box view NAME --term`: the box's browser drawn in the terminal h5i runs in, with the
//! Kitty graphics protocol.
//!
//! Owns the terminal viewer: the probe (a Kitty graphics query followed by a primary device
//! attributes request, read for a bounded time: a terminal that answers the attributes but not
//! the query, or neither, is refused, pointing at the browser viewer), the raw-mode session
//! (`h5i_runtime::pty::RawTerminal`, restored however the viewer ends), the frames (each JPEG
//! from the box decoded to pixels by h5i, re-sent as zlib-compressed RGB in h5i's own APC
//! commands), row one (box, mode, lock holder, the page's origin cut from the left, egress
//! policy, console errors; h5i's alone: the image is placed below it and a click on it is never
//! passed), and the keys: `i` takes the control lock and drives, `Ctrl-]` hands it back, `q`
//! (or Ctrl-C) leaves, handing back a lock this viewer took. While driving, each key is sent as
//! a press and a release together, and mouse reporting (SGR) is on, a click placed at the
//! centre of its cell in page pixels.
//!
//! The frame source, the control lock and the session records are `watch` and `view_sessions`,
//! the browser viewer's own: this is the same path drawn elsewhere.
//!
//! Must never: bind anything (the stream is reached from inside the box by this process, as the
//! browser viewer does), write a byte the box chose to the terminal (only pixels cross, decoded
//! and re-encoded; every text on row one passes `crate::escape`), or leave the terminal raw.
//!
//! Guarded by `tests/browser.rs` (a Kitty-graphics-parsing terminal on a real pty) and the unit
//! tests below.

use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

use base64::Engine as _;
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message as BoxMessage;

use super::control::{self, ControlError};
use super::view_sessions::{self, Tally};
use super::watch as source;
use crate::store::{BoxStore, StoredBox};

/// The `via` of this viewer's session records.
const VIA: &str = "terminal viewer";
/// How long the terminal may take to answer the probe.
const PROBE: Duration = Duration::from_secs(3);
/// The probe: a Kitty graphics query (a 1x1 RGB image, never stored), the cell size in pixels
/// (`CSI 16 t`), then the primary device attributes, which every terminal answers last.
const PROBE_QUERY: &[u8] = b"\x1b_Gi=31,s=1,v=1,a=q,t=d,f=24;AAAA\x1b\\\x1b[16t\x1b[c";
/// Base64 bytes per graphics command (the protocol's limit).
const CHUNK: usize = 4096;
/// Largest frame decoded, each way, in pixels.
const MAX_SIDE: usize = 8192;
/// Cell size assumed when the terminal reports none (neither `TIOCGWINSZ` nor `CSI 16 t`).
const DEFAULT_CELL: (u32, u32) = (10, 20);

/// Ctrl-] as a terminal sends it.
const CTRL_RIGHT_BRACKET: u8 = 0x1d;
/// Ctrl-C as a raw terminal sends it.
const CTRL_C: u8 = 0x03;

/// What the terminal said to the probe.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ProbeAnswer {
    /// The graphics query was answered `OK`.
    pub graphics: bool,
    /// The primary device attributes arrived (the end of the answer).
    pub attributes: bool,
    /// The cell size in pixels (width, height), when the terminal said it.
    pub cell: Option<(u32, u32)>,
}

/// Read the terminal's answers to [`PROBE_QUERY`] in `bytes` (in any order, among other input).
pub fn parse_probe(bytes: &[u8]) -> ProbeAnswer {
    let mut answer = ProbeAnswer::default();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != 0x1b || i + 1 >= bytes.len() {
            i += 1;
            continue;
        }
        match bytes[i + 1] {
            b'_' => {
                let body_end = find(&bytes[i..], b"\x1b\\").map(|e| i + e);
                let Some(end) = body_end else { break };
                let body = &bytes[i + 2..end];
                if body.starts_with(b"G") && find(body, b"i=31").is_some() {
                    answer.graphics = body.ends_with(b";OK");
                }
                i = end + 2;
            }
            b'[' => {
                let start = i + 2;
                let Some(len) = csi_params_len(&bytes[start..]) else {
                    break;
                };
                let params = &bytes[start..start + len];
                match bytes[start + len] {
                    b'c' if params.starts_with(b"?") => answer.attributes = true,
                    b't' => {
                        let n: Vec<u32> = String::from_utf8_lossy(params)
                            .split(';')
                            .filter_map(|p| p.parse().ok())
                            .collect();
                        if let [6, h, w] = n[..] {
                            if h > 0 && w > 0 {
                                answer.cell = Some((w, h));
                            }
                        }
                    }
                    _ => {}
                }
                i = start + len + 1;
            }
            _ => i += 1,
        }
    }
    answer
}

/// How many parameter and intermediate bytes a CSI sequence has before its final byte
/// (0x40..=0x7e); None while the final byte has not arrived.
fn csi_params_len(after_introducer: &[u8]) -> Option<usize> {
    after_introducer
        .iter()
        .position(|b| (0x40..=0x7e).contains(b))
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Wait up to `ms` for `fd` to be readable.
fn readable(fd: RawFd, ms: i32) -> bool {
    let mut p = [libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }];
    let wait = std::time::Duration::from_millis(u64::try_from(ms).unwrap_or(0));
    matches!(h5i_sys::poll::wait(&mut p, Some(wait)), Ok(n) if n > 0)
        && p[0].revents & libc::POLLIN != 0
}

/// Send the probe and read the answers until the device attributes arrive or [`PROBE`] passes.
fn probe(tty_in: RawFd, out: &mut impl Write) -> io::Result<ProbeAnswer> {
    out.write_all(PROBE_QUERY)?;
    out.flush()?;
    let deadline = Instant::now() + PROBE;
    let mut got = Vec::new();
    let mut input = std::io::stdin().lock();
    loop {
        let answer = parse_probe(&got);
        let left = deadline.saturating_duration_since(Instant::now());
        if answer.attributes || left.is_zero() || got.len() > 64 << 10 {
            return Ok(answer);
        }
        if readable(tty_in, left.as_millis().min(100) as i32 + 1) {
            let mut buf = [0u8; 8192];
            let n = input.read(&mut buf)?;
            if n == 0 {
                return Ok(answer);
            }
            got.extend_from_slice(&buf[..n]);
        }
    }
}

/// Where the page is drawn: the cell grid below row one and the picture's size in cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Cell width and height in pixels.
    pub cell: (u32, u32),
    /// The frame's size in pixels.
    pub frame: (u32, u32),
    /// How many columns and rows the frame is drawn across (from row 2, column 1).
    pub cells: (u32, u32),
}

impl Layout {
    /// The largest drawing of a `frame`-sized picture, its aspect kept, in a terminal of `cols`
    /// by `rows` cells of `cell` pixels, below row one.
    pub fn fit(frame: (u32, u32), cols: u32, rows: u32, cell: (u32, u32)) -> Layout {
        let (aw, ah) = (
            f64::from(cols * cell.0),
            f64::from(rows.saturating_sub(1) * cell.1),
        );
        let (fw, fh) = (f64::from(frame.0.max(1)), f64::from(frame.1.max(1)));
        let scale = (aw / fw).min(ah / fh);
        let c = ((fw * scale / f64::from(cell.0)).floor() as u32).clamp(1, cols.max(1));
        let r = ((fh * scale / f64::from(cell.1)).floor() as u32)
            .clamp(1, rows.saturating_sub(1).max(1));
        Layout {
            cell,
            frame,
            cells: (c, r),
        }
    }

    /// The page pixel under the centre of the cell at 1-based `col`, `row` (as the terminal
    /// reports a click), `None` on row one or beside the picture.
    pub fn page_point(&self, col: u32, row: u32) -> Option<(u32, u32)> {
        if row < 2 || col < 1 || col > self.cells.0 || row - 1 > self.cells.1 {
            return None;
        }
        let px = (f64::from(col - 1) + 0.5) * f64::from(self.cell.0);
        let py = (f64::from(row - 2) + 0.5) * f64::from(self.cell.1);
        let sx = f64::from(self.frame.0) / f64::from(self.cells.0 * self.cell.0);
        let sy = f64::from(self.frame.1) / f64::from(self.cells.1 * self.cell.1);
        Some(((px * sx) as u32, (py * sy) as u32))
    }
}

/// A frame's JPEG (base64) decoded to RGB: its width, height and pixels. Bounded: a frame
/// larger than [`MAX_SIDE`] either way is refused.
pub fn decode_frame(data: &str) -> Result<(u32, u32, Vec<u8>), String> {
    use zune_jpeg::zune_core::{
        bytestream::ZCursor, colorspace::ColorSpace, options::DecoderOptions,
    };
    let jpeg = base64::engine::general_purpose::STANDARD
        .decode(data)
        .map_err(|e| format!("a frame that is not base64 ({e})"))?;
    let options = DecoderOptions::default()
        .set_max_width(MAX_SIDE)
        .set_max_height(MAX_SIDE)
        .jpeg_set_out_colorspace(ColorSpace::RGB);
    let mut decoder = zune_jpeg::JpegDecoder::new_with_options(ZCursor::new(jpeg), options);
    let rgb = decoder
        .decode()
        .map_err(|e| format!("a frame that is not a JPEG ({e:?})"))?;
    let (w, h) = decoder.dimensions().ok_or("a frame without dimensions")?;
    if rgb.len() != w * h * 3 {
        return Err("a frame whose pixels do not fill it".into());
    }
    Ok((w as u32, h as u32, rgb))
}

/// The Kitty graphics commands drawing `rgb` (`w` x `h`) across `layout`'s cells from row 2:
/// image 1, placement 1 (each frame replaces the last), zlib-compressed RGB in base64, in
/// chunks, responses suppressed, the cursor left where it was.
pub fn kitty_image(rgb: &[u8], w: u32, h: u32, layout: &Layout) -> Vec<u8> {
    use flate2::{write::ZlibEncoder, Compression};
    let mut z = ZlibEncoder::new(Vec::with_capacity(rgb.len() / 4), Compression::fast());
    let packed = z
        .write_all(rgb)
        .and_then(|()| z.finish())
        .unwrap_or_default();
    let b64 = base64::engine::general_purpose::STANDARD.encode(packed);
    let mut out = Vec::with_capacity(b64.len() + b64.len() / CHUNK * 16 + 128);
    out.extend_from_slice(b"\x1b7\x1b[2;1H");
    let chunks: Vec<&[u8]> = b64.as_bytes().chunks(CHUNK).collect();
    for (n, chunk) in chunks.iter().enumerate() {
        let more = u8::from(n + 1 < chunks.len());
        if n == 0 {
            out.extend_from_slice(
                format!(
                    "\x1b_Ga=T,f=24,o=z,s={w},v={h},i=1,p=1,q=2,C=1,c={},r={},m={more};",
                    layout.cells.0, layout.cells.1
                )
                .as_bytes(),
            );
        } else {
            out.extend_from_slice(format!("\x1b_Gm={more};").as_bytes());
        }
        out.extend_from_slice(chunk);
        out.extend_from_slice(b"\x1b\\");
    }
    out.extend_from_slice(b"\x1b8");
    out
}

/// What row one says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowOne {
    /// The box's name.
    pub name: String,
    /// Whether this viewer drives (holds the lock).
    pub driving: bool,
    /// Who holds the lock.
    pub holder: String,
    /// The page's origin (already escaped and cut by `watch::origin_of`).
    pub origin: String,
    /// The egress policy.
    pub egress: String,
    /// Console errors, when the browser said.
    pub errors: Option<usize>,
    /// A refusal to show instead of the keys' hint.
    pub note: Option<String>,
}

/// Cut `s` to `max` characters from the right (a trailing ellipsis when cut).
fn cut_right(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    if max == 0 {
        return String::new();
    }
    s.chars().take(max - 1).chain(['…']).collect()
}

impl RowOne {
    /// The row's text in exactly `cols` characters, every field escaped. The origin is served
    /// first (cut from the left, so the end of its host shows); the holder, the egress policy
    /// and the hint share what is left, and a row too narrow for all of it loses its end.
    pub fn text(&self, cols: usize) -> String {
        let esc = crate::escape::escape_controls;
        let mode = if self.driving { "driving" } else { "watching" };
        let errors = match self.errors {
            Some(n) => format!("console errors: {n}"),
            None => "console errors: ?".into(),
        };
        let hint = match &self.note {
            Some(n) => esc(n),
            None if self.driving => "Ctrl-] hand back".into(),
            None => "i drive  q leave".into(),
        };
        let head = format!(" h5i │ {} │ {mode} │ ", esc(&self.name));
        let fixed = head.chars().count() + " │  │  │  │ ".chars().count() + errors.chars().count();
        let room = cols.saturating_sub(fixed);
        let origin = esc(&self.origin);
        let holder = format!("lock: {}", esc(&self.holder));
        let egress = format!("egress: {}", esc(&self.egress));
        let width = |s: &str| s.chars().count();
        // The origin first (at least 20 characters of it, cut from the left), then the holder,
        // the egress policy and the hint in what is left.
        let origin_w = width(&origin).min(room.saturating_sub(14).max(20));
        let origin = source::cut_left(&origin, origin_w);
        let mut left = room.saturating_sub(origin_w);
        let holder = cut_right(&holder, width(&holder).min(left.saturating_sub(8).max(6)));
        left = left.saturating_sub(width(&holder));
        let egress = cut_right(&egress, width(&egress).min(left.max(8)));
        left = left.saturating_sub(width(&egress));
        let hint = cut_right(&hint, left);
        let row = format!("{head}{holder} │ {origin} │ {egress} │ {errors} │ {hint}");
        let row = cut_right(&row, cols);
        let pad = cols.saturating_sub(row.chars().count());
        row + &" ".repeat(pad)
    }

    /// The escape sequences drawing the row (h5i's own: cursor saved, row one cleared and
    /// written in reverse video, cursor restored).
    pub fn draw(&self, cols: usize) -> Vec<u8> {
        format!(
            "\x1b7\x1b[1;1H\x1b[2K\x1b[7m{}\x1b[0m\x1b8",
            self.text(cols)
        )
        .into_bytes()
    }
}

/// One thing the human did at the keyboard or mouse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Key {
    /// A key with its DOM `key` name and the text it types, if any.
    Press {
        /// The DOM key name (`a`, `Enter`, `ArrowLeft`).
        key: String,
        /// What it types.
        text: Option<String>,
    },
    /// A mouse button pressed (`true`) or released at a 1-based cell.
    Mouse {
        /// `left`, `middle` or `right`.
        button: &'static str,
        /// Pressed, else released.
        down: bool,
        /// The cell's column.
        col: u32,
        /// The cell's row.
        row: u32,
    },
    /// A wheel turn at a cell: up (`-1`) or down (`1`).
    Wheel {
        /// The direction.
        dir: i32,
        /// The cell's column.
        col: u32,
        /// The cell's row.
        row: u32,
    },
    /// Ctrl-]: hand control back.
    HandBack,
    /// Ctrl-C.
    Interrupt,
}

/// Split the terminal's input `bytes` into keys; what is left over (an unfinished sequence)
/// stays in `bytes` for the next read. A lone ESC at the end of a read is the Escape key.
pub fn parse_keys(bytes: &mut Vec<u8>) -> Vec<Key> {
    let mut keys = Vec::new();
    let mut i = 0;
    let press = |key: &str, text: Option<&str>| Key::Press {
        key: key.to_string(),
        text: text.map(str::to_string),
    };
    while i < bytes.len() {
        let b = bytes[i];
        match b {
            0x1b => {
                let Some(&next) = bytes.get(i + 1) else {
                    keys.push(press("Escape", None));
                    i += 1;
                    continue;
                };
                if next == b'_' || next == b'P' || next == b']' {
                    // A string the terminal sent (a late answer): skipped whole.
                    match find(&bytes[i..], b"\x1b\\") {
                        Some(e) => i += e + 2,
                        None => break,
                    }
                    continue;
                }
                if next != b'[' && next != b'O' {
                    keys.push(press("Escape", None));
                    i += 1;
                    continue;
                }
                let start = i + 2;
                let Some(len) = csi_params_len(&bytes[start..]) else {
                    break;
                };
                let params = String::from_utf8_lossy(&bytes[start..start + len]).into_owned();
                let fin = bytes[start + len];
                i = start + len + 1;
                if let Some(p) = params.strip_prefix('<') {
                    let n: Vec<u32> = p.split(';').filter_map(|x| x.parse().ok()).collect();
                    if let [b, col, row] = n[..] {
                        if b & 32 != 0 {
                            continue;
                        }
                        if b & 64 != 0 {
                            keys.push(Key::Wheel {
                                dir: if b & 1 == 0 { -1 } else { 1 },
                                col,
                                row,
                            });
                            continue;
                        }
                        let button = match b & 3 {
                            0 => "left",
                            1 => "middle",
                            2 => "right",
                            _ => continue,
                        };
                        keys.push(Key::Mouse {
                            button,
                            down: fin == b'M',
                            col,
                            row,
                        });
                    }
                    continue;
                }
                let named = match (fin, params.as_str()) {
                    (b'A', _) => "ArrowUp",
                    (b'B', _) => "ArrowDown",
                    (b'C', _) => "ArrowRight",
                    (b'D', _) => "ArrowLeft",
                    (b'H', _) => "Home",
                    (b'F', _) => "End",
                    (b'~', "3") => "Delete",
                    (b'~', "5") => "PageUp",
                    (b'~', "6") => "PageDown",
                    _ => continue,
                };
                keys.push(press(named, None));
            }
            CTRL_RIGHT_BRACKET => {
                keys.push(Key::HandBack);
                i += 1;
            }
            CTRL_C => {
                keys.push(Key::Interrupt);
                i += 1;
            }
            b'\r' | b'\n' => {
                keys.push(press("Enter", Some("\r")));
                i += 1;
            }
            b'\t' => {
                keys.push(press("Tab", None));
                i += 1;
            }
            0x7f | 0x08 => {
                keys.push(press("Backspace", None));
                i += 1;
            }
            b if b < 0x20 => i += 1,
            _ => {
                let width = match b {
                    0xc0..=0xdf => 2,
                    0xe0..=0xef => 3,
                    0xf0..=0xf7 => 4,
                    _ => 1,
                };
                if i + width > bytes.len() {
                    break;
                }
                let text = String::from_utf8_lossy(&bytes[i..i + width]).into_owned();
                i += width;
                if text.chars().all(|c| !crate::escape::is_control(c)) {
                    keys.push(press(&text, Some(&text)));
                }
            }
        }
    }
    bytes.drain(..i);
    keys
}

/// The input events for `key` (a press and its release together), `None` for a key that is
/// h5i's own or lands beside the picture.
pub fn events(key: &Key, layout: Option<&Layout>) -> Vec<Value> {
    match key {
        Key::Press { key, text } => {
            let code = match key.chars().next() {
                Some(c) if key.chars().count() == 1 && c.is_ascii_alphabetic() => {
                    format!("Key{}", c.to_ascii_uppercase())
                }
                Some(c) if key.chars().count() == 1 && c.is_ascii_digit() => format!("Digit{c}"),
                _ => key.clone(),
            };
            let mut down =
                json!({"type": "input_keyboard", "eventType": "keyDown", "key": key, "code": code});
            if let Some(t) = text {
                down["text"] = json!(t);
            }
            vec![
                down,
                json!({"type": "input_keyboard", "eventType": "keyUp", "key": key, "code": code}),
            ]
        }
        Key::Mouse {
            button,
            down,
            col,
            row,
        } => {
            let Some((x, y)) = layout.and_then(|l| l.page_point(*col, *row)) else {
                return Vec::new();
            };
            let kind = if *down {
                "mousePressed"
            } else {
                "mouseReleased"
            };
            vec![
                json!({"type": "input_mouse", "eventType": kind, "x": x, "y": y, "button": button, "clickCount": 1}),
            ]
        }
        Key::Wheel { dir, col, row } => {
            let Some((x, y)) = layout.and_then(|l| l.page_point(*col, *row)) else {
                return Vec::new();
            };
            vec![
                json!({"type": "input_mouse", "eventType": "mouseWheel", "x": x, "y": y, "deltaX": 0, "deltaY": dir * 100}),
            ]
        }
        Key::HandBack | Key::Interrupt => Vec::new(),
    }
}

/// The terminal's size in cells and its cell size in pixels (`TIOCGWINSZ`, else the probe's
/// answer, else [`DEFAULT_CELL`]).
fn size(fd: RawFd, probed: Option<(u32, u32)>) -> (u32, u32, (u32, u32)) {
    let ws = h5i_runtime::pty::window_size(fd);
    let (cols, rows) = ws.map_or((80, 24), |w| (u32::from(w.ws_col), u32::from(w.ws_row)));
    let cell = ws
        .filter(|w| w.ws_xpixel > 0 && w.ws_ypixel > 0)
        .map(|w| {
            (
                u32::from(w.ws_xpixel) / cols.max(1),
                u32::from(w.ws_ypixel) / rows.max(1),
            )
        })
        .filter(|c| c.0 > 0 && c.1 > 0)
        .or(probed)
        .unwrap_or(DEFAULT_CELL);
    (cols, rows, cell)
}

/// Entering the alternate screen with the cursor hidden; leaving turns off what driving turned
/// on, deletes h5i's images and restores the screen.
const ENTER: &[u8] = b"\x1b[?1049h\x1b[?25l\x1b[2J";
const LEAVE: &[u8] = b"\x1b[?1000l\x1b[?1006l\x1b_Ga=d,d=A,q=2\x1b\\\x1b[2J\x1b[?25h\x1b[?1049l";
const MOUSE_ON: &[u8] = b"\x1b[?1000h\x1b[?1006h";
const MOUSE_OFF: &[u8] = b"\x1b[?1000l\x1b[?1006l";

/// The screen while the viewer runs: left (alternate screen, mouse) however the viewer ends.
struct Screen {
    out: io::Stdout,
}

impl Screen {
    fn put(&mut self, bytes: &[u8]) -> io::Result<()> {
        let mut o = self.out.lock();
        o.write_all(bytes)?;
        o.flush()
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        let _ = self.put(LEAVE);
    }
}

/// `h5i box view NAME --term`: check the box, probe the terminal (refusing one without Kitty
/// graphics), then draw the box's page until `q`, Ctrl-C or a signal, recording the session in
/// the `viewer` lane. What the viewer did, for the caller to print after the screen is back.
pub fn run(store: &BoxStore, name: &str) -> Result<Tally, ControlError> {
    control::browser_box(store, name)?;
    let (tty_in, tty_out) = (io::stdin().as_raw_fd(), io::stdout().as_raw_fd());
    if !h5i_runtime::pty::is_terminal(tty_in) || !h5i_runtime::pty::is_terminal(tty_out) {
        return Err(source::refuse(
            "`--term` draws in a terminal, and this viewer's input or output is not one".into(),
            format!("run it in a terminal, or watch in your browser: `h5i box view {name}`"),
        ));
    }
    let raw = h5i_runtime::pty::RawTerminal::enter(tty_in).map_err(|e| {
        source::refuse(
            format!("cannot put the terminal in raw mode ({e})"),
            format!("watch in your browser: `h5i box view {name}`"),
        )
    })?;
    let answer = probe(tty_in, &mut io::stdout()).map_err(|e| {
        source::refuse(
            format!("cannot ask the terminal what it draws ({e})"),
            format!("watch in your browser: `h5i box view {name}`"),
        )
    })?;
    if !answer.graphics {
        drop(raw);
        let why = if answer.attributes {
            "it did not answer h5i's graphics query"
        } else {
            "it answered nothing within 3 s"
        };
        return Err(source::refuse(
            format!("this terminal does not speak the Kitty graphics protocol ({why}), so `--term` cannot draw the page"),
            format!("watch in your browser instead: `h5i box view {name}` (or use kitty, Ghostty, WezTerm or Konsole)"),
        ));
    }
    let (sb, policy) = source::watchable(store, name)?;
    let stop = crate::ui::stop::on_stop().map_err(|e| {
        source::refuse(
            format!("cannot take Ctrl-C for the viewer ({e})"),
            "report this as a bug".into(),
        )
    })?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .map_err(|e| {
            source::refuse(
                format!("cannot start the viewer's runtime ({e})"),
                "report this as a bug".into(),
            )
        })?;
    let mut claim = view_sessions::open(&sb, VIA, &source::me())?;
    let mut screen = Screen { out: io::stdout() };
    let viewer = Viewer {
        store: store.clone(),
        sb,
        egress: source::egress_summary(&policy),
        tty_out,
        probed_cell: answer.cell,
    };
    let _ = screen.put(ENTER);
    let (t, error) = runtime.block_on(viewer.watch(&mut screen, &mut claim, stop));
    drop(screen);
    drop(raw);
    claim.close(t)?;
    match error {
        Some(e) => Err(source::refuse(
            e,
            format!("run `h5i box view {name} --term` again"),
        )),
        None => Ok(t),
    }
}

/// One terminal viewer's state.
struct Viewer {
    store: BoxStore,
    sb: StoredBox,
    egress: String,
    tty_out: RawFd,
    probed_cell: Option<(u32, u32)>,
}

/// Read the terminal's input on a thread of its own (a blocking read of stdin), forwarding each
/// read; ends at end of input.
fn keyboard() -> mpsc::UnboundedReceiver<Vec<u8>> {
    let (tx, rx) = mpsc::unbounded_channel();
    std::thread::spawn(move || {
        let mut input = io::stdin();
        let mut buf = [0u8; 4096];
        while let Ok(n) = input.read(&mut buf) {
            if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                return;
            }
        }
    });
    rx
}

impl Viewer {
    fn row_one(
        &self,
        driving: bool,
        origin: &str,
        errors: Option<usize>,
        note: Option<String>,
    ) -> RowOne {
        RowOne {
            name: self.sb.manifest.name.clone(),
            driving,
            holder: source::holder(&self.sb).0,
            origin: origin.to_string(),
            egress: self.egress.clone(),
            errors,
            note,
        }
    }

    /// Draw until the human leaves; the session's counts and what ended it, if not the human.
    async fn watch(
        &self,
        screen: &mut Screen,
        claim: &mut view_sessions::Session,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) -> (Tally, Option<String>) {
        let mut t = Tally::default();
        let (upstream, mut origin) = match source::connect(&self.sb).await {
            Ok(c) => c,
            Err(e) => return (t, Some(e)),
        };
        let (mut box_tx, mut box_rx) = upstream.split();
        let mut keys = keyboard();
        let mut pending = Vec::new();
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        let mut driving = false;
        let mut took = false;
        let mut errors = None;
        let mut note: Option<String> = None;
        let mut layout: Option<Layout> = None;
        let mut ended = None;
        loop {
            let mut redraw = false;
            tokio::select! {
                m = box_rx.next() => match m {
                    Some(Ok(BoxMessage::Text(text))) => {
                        let before = origin.clone();
                        if let Some(f) = source::from_box(&text, &mut origin) {
                            match decode_frame(&f.data) {
                                Ok((w, h, rgb)) => {
                                    let (cols, rows, cell) = size(self.tty_out, self.probed_cell);
                                    let l = Layout::fit((w, h), cols, rows, cell);
                                    if layout.is_some_and(|o| o.cells != l.cells) {
                                        let _ = screen.put(b"\x1b_Ga=d,d=A,q=2\x1b\\");
                                    }
                                    layout = Some(l);
                                    if screen.put(&kitty_image(&rgb, w, h, &l)).is_err() {
                                        break;
                                    }
                                }
                                Err(e) => note = Some(format!("a frame was dropped: {e}")),
                            }
                        }
                        redraw = origin != before;
                    }
                    Some(Ok(BoxMessage::Close(_)) | Err(_)) | None => {
                        ended = Some("the box's stream closed".to_string());
                        break;
                    }
                    Some(Ok(_)) => {}
                },
                bytes = keys.recv() => {
                    let Some(bytes) = bytes else { break };
                    pending.extend(bytes);
                    redraw = true;
                    let mut leave = false;
                    for key in parse_keys(&mut pending) {
                        match (&key, driving) {
                            (Key::Interrupt, _) => leave = true,
                            (Key::Press { key, .. }, false) if key == "q" => leave = true,
                            (Key::Press { key, .. }, false) if key == "i" => {
                                match source::take_or_release(&self.store, &self.sb.manifest.name, true, &mut t).await {
                                    Ok(()) => {
                                        driving = true;
                                        took = true;
                                        note = None;
                                        let _ = screen.put(MOUSE_ON);
                                    }
                                    Err(e) => note = Some(e),
                                }
                            }
                            (Key::HandBack, true) => {
                                if let Err(e) = source::take_or_release(&self.store, &self.sb.manifest.name, false, &mut t).await {
                                    note = Some(e);
                                }
                                driving = false;
                                took = false;
                                let _ = screen.put(MOUSE_OFF);
                            }
                            (_, true) => {
                                for ev in events(&key, layout.as_ref()) {
                                    let Value::Object(msg) = ev else { continue };
                                    if let Some(line) = source::input(&self.sb, msg, &mut t) {
                                        if box_tx.send(BoxMessage::Text(line.into())).await.is_err() {
                                            leave = true;
                                        }
                                    }
                                }
                            }
                            _ => {}
                        }
                    }
                    if leave {
                        break;
                    }
                }
                _ = stop.changed() => break,
                _ = tick.tick() => {
                    errors = source::console_errors(&self.sb).await;
                    if driving && !source::mine(&self.sb) {
                        // Released elsewhere (`h5i browser release`): back to watching.
                        driving = false;
                        took = false;
                        let _ = screen.put(MOUSE_OFF);
                    }
                    redraw = true;
                }
            }
            if let Err(e) = claim.update(t) {
                note = Some(e.to_string());
            }
            if redraw {
                let (cols, _, _) = size(self.tty_out, self.probed_cell);
                let row = self.row_one(driving, &origin, errors, note.clone());
                if screen.put(&row.draw(cols as usize)).is_err() {
                    break;
                }
            }
        }
        if took && source::mine(&self.sb) {
            if let Err(e) =
                source::take_or_release(&self.store, &self.sb.manifest.name, false, &mut t).await
            {
                ended.get_or_insert(e);
            }
        }
        (t, ended)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_needs_the_graphics_answer_and_reads_the_cell_size() {
        let kitty = b"\x1b_Gi=31;OK\x1b\\\x1b[6;20;10t\x1b[?62;22c";
        assert_eq!(
            parse_probe(kitty),
            ProbeAnswer {
                graphics: true,
                attributes: true,
                cell: Some((10, 20))
            }
        );
        let plain = parse_probe(b"\x1b[?1;2c");
        assert!(plain.attributes && !plain.graphics);
        let refused = parse_probe(b"\x1b_Gi=31;ENOTSUPPORTED:no\x1b\\\x1b[?62c");
        assert!(refused.attributes && !refused.graphics);
        assert_eq!(parse_probe(b""), ProbeAnswer::default());
    }

    #[test]
    fn a_click_lands_at_the_centre_of_its_cell_in_page_pixels_never_on_row_one() {
        // 1280x720 in 80x25 cells of 10x20: 80 columns by 22 rows (800x440 px, scale 0.625).
        let l = Layout::fit((1280, 720), 80, 25, (10, 20));
        assert_eq!(l.cells, (80, 22));
        assert_eq!(l.page_point(1, 2), Some((8, 16)));
        assert_eq!(l.page_point(40, 12), Some((632, 343)));
        assert_eq!(l.page_point(5, 1), None);
        assert_eq!(l.page_point(81, 3), None);
        assert_eq!(l.page_point(3, 24), None);
    }

    #[test]
    fn keys_are_parsed_across_reads_and_sent_as_press_and_release() {
        let mut bytes = b"a\r\x1b[<0;12;7M\x1b[<0;12;7m\x1d\x1b[".to_vec();
        let keys = parse_keys(&mut bytes);
        assert_eq!(bytes, b"\x1b[");
        assert_eq!(keys.len(), 5, "{keys:?}");
        assert_eq!(keys[4], Key::HandBack);
        let ev = events(&keys[0], None);
        assert_eq!(ev.len(), 2);
        assert_eq!(ev[0]["eventType"], "keyDown");
        assert_eq!(ev[0]["text"], "a");
        assert_eq!(ev[1]["eventType"], "keyUp");
        let l = Layout::fit((800, 440), 80, 23, (10, 20));
        let click = events(&keys[2], Some(&l));
        assert_eq!(click[0]["eventType"], "mousePressed");
        assert_eq!(
            (click[0]["x"].clone(), click[0]["y"].clone()),
            (json!(115), json!(110))
        );
        assert!(events(
            &Key::Mouse {
                button: "left",
                down: true,
                col: 3,
                row: 1
            },
            Some(&l)
        )
        .is_empty());
        bytes.extend_from_slice(b"D\x1b_Gi=1;OK\x1b\\\x1b");
        assert_eq!(
            parse_keys(&mut bytes),
            [
                Key::Press {
                    key: "ArrowLeft".into(),
                    text: None
                },
                Key::Press {
                    key: "Escape".into(),
                    text: None
                }
            ]
        );
    }

    #[test]
    fn row_one_escapes_everything_and_cuts_the_origin_from_the_left_last() {
        let row = RowOne {
            name: "web".into(),
            driving: false,
            holder: "agent".into(),
            origin: "https://bank.example.evil.test".into(),
            egress: "deny all but a.test:443, b.test:443".into(),
            errors: Some(2),
            note: Some("x\u{1b}]52;c;QQ==\u{7}\u{9b}2J".into()),
        };
        let wide = row.text(200);
        assert_eq!(wide.chars().count(), 200);
        assert!(wide.contains("https://bank.example.evil.test"), "{wide}");
        assert!(wide.contains("console errors: 2"), "{wide}");
        assert!(!wide.chars().any(crate::escape::is_control), "{wide:?}");
        let middle = row.text(100);
        assert!(
            middle.contains("│ https://bank.example.evil.test │"),
            "{middle}"
        );
        assert!(middle.contains("console errors: 2"), "{middle}");
        let narrow = row.text(70);
        assert_eq!(narrow.chars().count(), 70, "{narrow}");
        assert!(narrow.contains("evil.test │"), "{narrow}");
        assert!(!narrow.contains("https://bank"), "{narrow}");
        let drawn = row.draw(80);
        let raw_escapes = drawn.iter().filter(|&&b| b == 0x1b).count();
        assert_eq!(raw_escapes, 6, "only h5i's own escapes: {drawn:?}");
    }

    #[test]
    fn a_frame_is_decoded_and_sent_as_chunked_compressed_pixels() {
        assert!(decode_frame("bm90IGEganBlZw==").is_err());
        assert!(decode_frame("!!!").is_err());
        let rgb = vec![7u8; 300 * 200 * 3];
        let l = Layout::fit((300, 200), 80, 24, (10, 20));
        let out = kitty_image(&rgb, 300, 200, &l);
        assert!(out.starts_with(b"\x1b7\x1b[2;1H\x1b_Ga=T,f=24,o=z,s=300,v=200,i=1,p=1,q=2,C=1,"));
        assert!(out.ends_with(b"\x1b\\\x1b8"));
    }
}
