//! A small terminal that speaks the Kitty graphics protocol, for `h5i box view --term` on a real
//! pty (`pty.rs`): it answers the probe (the graphics query `i=31`, the cell size `CSI 16 t`,
//! the device attributes `CSI c`) as a Kitty terminal would, or as a plain one (device
//! attributes only) or a mute one (nothing); it decodes every APC graphics command h5i sends
//! (chunked `m=1`, `f=24|32` raw or `o=z` compressed, or `f=100` PNG) into images of known size,
//! keeps the last text drawn on row one, and checks every other byte: only the escape
//! sequences h5i generates (CSI with plain parameters, save/restore cursor, APC graphics) may
//! appear, never an OSC, DCS, PM, SOS, a BEL or a C1 control.

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use base64::Engine as _;

use super::pty::{find, read_some, readable, Session};

/// How the terminal answers the probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answers {
    /// As kitty: the graphics query `OK`, the cell size, the device attributes.
    Kitty,
    /// As a terminal without graphics: the device attributes only.
    Plain,
    /// Nothing at all.
    Mute,
}

/// A graphics command's control keys, in order.
type Keys = Vec<(String, String)>;

/// One image h5i drew.
#[derive(Debug, Clone)]
pub struct Image {
    /// Its control keys (`a`, `f`, `s`, `v`, `c`, `r`, ...).
    pub keys: Keys,
    pub width: u32,
    pub height: u32,
    /// RGB or RGBA pixels, as `f` says.
    pub pixels: Vec<u8>,
}

impl Image {
    pub fn key(&self, k: &str) -> Option<&str> {
        self.keys
            .iter()
            .find(|(name, _)| name == k)
            .map(|(_, v)| v.as_str())
    }

    /// The pixel at `x`, `y` as RGB.
    pub fn rgb(&self, x: u32, y: u32) -> [u8; 3] {
        let bpp = if self.key("f") == Some("32") { 4 } else { 3 };
        let i = ((y * self.width + x) as usize) * bpp;
        [self.pixels[i], self.pixels[i + 1], self.pixels[i + 2]]
    }
}

/// The terminal: h5i's pty session and what it decoded so far.
pub struct Terminal {
    pub session: Session,
    answers: Answers,
    /// Where in `session.seen` parsing goes on.
    parsed: usize,
    /// A graphics transmission under way: its first command's keys and the payload so far.
    open_image: Option<(Keys, Vec<u8>)>,
    pub images: Vec<Image>,
    /// Every row-one text drawn, in order.
    pub rows: Vec<String>,
    /// Escape sequences h5i must never have sent, as found (empty when clean).
    pub foreign: Vec<String>,
    /// The probe's graphics query was seen.
    pub probed: bool,
}

fn keys_of(control: &str) -> Keys {
    control
        .split(',')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn decode_image(keys: Keys, payload: &[u8]) -> Image {
    let get = |k: &str| keys.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    let raw = base64::engine::general_purpose::STANDARD
        .decode(payload)
        .expect("an image payload that is not base64");
    let raw = if get("o").as_deref() == Some("z") {
        let mut out = Vec::new();
        flate2::read::ZlibDecoder::new(&raw[..])
            .read_to_end(&mut out)
            .expect("an o=z payload that does not inflate");
        out
    } else {
        raw
    };
    let format = get("f").unwrap_or_else(|| "32".into());
    let (width, height) = if format == "100" {
        assert_eq!(&raw[..8], b"\x89PNG\r\n\x1a\n", "f=100 but not a PNG");
        let be = |o: usize| u32::from_be_bytes([raw[o], raw[o + 1], raw[o + 2], raw[o + 3]]);
        (be(16), be(20))
    } else {
        let w: u32 = get("s").expect("raw pixels without s=").parse().unwrap();
        let h: u32 = get("v").expect("raw pixels without v=").parse().unwrap();
        let bpp = if format == "24" { 3 } else { 4 };
        assert_eq!(
            raw.len(),
            (w * h) as usize * bpp,
            "an image whose pixels do not fill {w}x{h}"
        );
        (w, h)
    };
    Image {
        keys,
        width,
        height,
        pixels: raw,
    }
}

impl Terminal {
    pub fn new(session: Session, answers: Answers) -> Terminal {
        Terminal {
            session,
            answers,
            parsed: 0,
            open_image: None,
            images: Vec::new(),
            rows: Vec::new(),
            foreign: Vec::new(),
            probed: false,
        }
    }

    fn answer(&self, bytes: &[u8]) {
        let mut f = std::fs::File::from(self.session.master.try_clone().unwrap());
        f.write_all(bytes).unwrap();
    }

    /// Type `bytes` at the terminal.
    pub fn send(&self, bytes: &[u8]) {
        self.answer(bytes);
    }

    /// Parse what arrived since the last call, answering the probe as told.
    fn parse(&mut self) {
        loop {
            let total = self.session.seen.len();
            let esc = self.session.seen[self.parsed..]
                .iter()
                .position(|&b| b == 0x1b);
            let Some(esc) = esc else {
                self.check_text(self.parsed, total);
                self.parsed = total;
                return;
            };
            self.check_text(self.parsed, self.parsed + esc);
            let at = self.parsed + esc;
            let seen = &self.session.seen;
            let Some(&kind) = seen.get(at + 1) else {
                self.parsed = at;
                return;
            };
            match kind {
                b'_' => {
                    let Some(end) = find(&seen[at..], b"\x1b\\") else {
                        self.parsed = at;
                        return;
                    };
                    let body = seen[at + 2..at + end].to_vec();
                    self.parsed = at + end + 2;
                    self.graphics(&body);
                }
                b'[' => {
                    let start = at + 2;
                    let Some(len) = seen[start..].iter().position(|b| (0x40..=0x7e).contains(b))
                    else {
                        self.parsed = at;
                        return;
                    };
                    let params = String::from_utf8_lossy(&seen[start..start + len]).into_owned();
                    let fin = seen[start + len] as char;
                    self.parsed = start + len + 1;
                    self.csi(&params, fin);
                }
                b'7' | b'8' => self.parsed = at + 2,
                other => {
                    self.foreign.push(format!("ESC {:?}", other as char));
                    self.parsed = at + 2;
                }
            }
        }
    }

    /// Text between escape sequences: no BEL, no other C0 but CR/LF/BS/TAB, no C1.
    fn check_text(&mut self, from: usize, to: usize) {
        let text = String::from_utf8_lossy(&self.session.seen[from..to]).into_owned();
        for c in text.chars() {
            let bad = (c < ' ' && !matches!(c, '\r' | '\n' | '\t' | '\u{8}'))
                || ('\u{7f}'..='\u{9f}').contains(&c);
            if bad {
                self.foreign.push(format!("control {c:?}"));
            }
        }
    }

    fn csi(&mut self, params: &str, fin: char) {
        if !params
            .bytes()
            .all(|b| b.is_ascii_digit() || b == b';' || b == b'?')
        {
            self.foreign.push(format!("CSI {params:?} {fin}"));
        }
        match (params, fin) {
            ("", 'c') if self.answers != Answers::Mute => self.answer(b"\x1b[?62;22c"),
            ("16", 't') if self.answers == Answers::Kitty => self.answer(b"\x1b[6;20;10t"),
            ("7", 'm') => {
                let seen = &self.session.seen[self.parsed..];
                if let Some(end) = find(seen, b"\x1b[0m") {
                    self.rows
                        .push(String::from_utf8_lossy(&seen[..end]).into_owned());
                }
            }
            _ => {}
        }
    }

    fn graphics(&mut self, body: &[u8]) {
        let Some(body) = body.strip_prefix(b"G") else {
            self.foreign.push("an APC that is not graphics".into());
            return;
        };
        let (control, payload) = match body.iter().position(|&b| b == b';') {
            Some(i) => (
                String::from_utf8_lossy(&body[..i]).into_owned(),
                &body[i + 1..],
            ),
            None => (String::from_utf8_lossy(body).into_owned(), &body[..0]),
        };
        let keys = keys_of(&control);
        let get = |k: &str| keys.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        if get("a") == Some("q") && get("i") == Some("31") {
            self.probed = true;
            if self.answers == Answers::Kitty {
                self.answer(b"\x1b_Gi=31;OK\x1b\\");
            }
            return;
        }
        let more = get("m") == Some("1");
        match self.open_image.take() {
            Some((first, mut data)) => {
                data.extend_from_slice(payload);
                if more {
                    self.open_image = Some((first, data));
                } else {
                    self.images.push(decode_image(first, &data));
                }
            }
            None if matches!(get("a"), Some("T") | Some("t")) => {
                if more {
                    self.open_image = Some((keys, payload.to_vec()));
                } else {
                    self.images.push(decode_image(keys, payload));
                }
            }
            None => {}
        }
    }

    /// Read (answering and decoding) until `done` says yes or `within` passes; whether it did.
    pub fn until(&mut self, within: Duration, done: impl Fn(&Terminal) -> bool) -> bool {
        let deadline = Instant::now() + within;
        loop {
            self.parse();
            if done(self) {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            let fd = self.session.master.as_raw_fd();
            if readable(fd, left.as_millis().min(200) as i32 + 1) {
                self.session.seen.extend(read_some(fd));
            }
        }
    }

    /// The last row one drawn.
    pub fn row_one(&self) -> &str {
        self.rows.last().map_or("", String::as_str)
    }

    /// Wait (60 s at most) for a row one for which `want` says yes; it.
    pub fn row_where(&mut self, what: &str, want: impl Fn(&str) -> bool) -> String {
        let ok = self.until(Duration::from_secs(60), |t| want(t.row_one()));
        assert!(ok, "no row one {what}; last: {:?}", self.row_one());
        self.row_one().to_string()
    }
}

impl Terminal {
    /// Wait for h5i to exit (60 s at most), answering and decoding meanwhile; its exit code.
    pub fn finish(&mut self) -> i32 {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            self.until(Duration::from_millis(200), |_| false);
            if let Some(st) = self.session.child.try_wait().unwrap() {
                self.until(Duration::from_millis(200), |_| false);
                return st.code().unwrap_or(-1);
            }
            assert!(
                Instant::now() < deadline,
                "h5i did not exit; transcript: {}",
                self.session.transcript()
            );
        }
    }

    /// The 1-based cell (column, row) whose centre is nearest page point `x`, `y` in the last
    /// image drawn (its `c`/`r` cells of `cell` pixels from row 2).
    pub fn cell_of(&self, x: f64, y: f64, cell: (u32, u32)) -> (u32, u32) {
        let img = self.images.last().expect("no image drawn yet");
        let cols: f64 = img.key("c").unwrap().parse().unwrap();
        let rows: f64 = img.key("r").unwrap().parse().unwrap();
        let tx = x * cols * f64::from(cell.0) / f64::from(img.width);
        let ty = y * rows * f64::from(cell.1) / f64::from(img.height);
        (
            (tx / f64::from(cell.0)).floor() as u32 + 1,
            (ty / f64::from(cell.1)).floor() as u32 + 2,
        )
    }
}
