//! Random names and secrets from the kernel: the viewer and console tokens, CSP nonces, session
//! ids and unguessable file names, each as lowercase hex.
//!
//! Owns reading `/dev/urandom`; must never fall back to a weaker source (an error is returned
//! and the caller refuses).

use std::io::{self, Read};
use std::path::Path;

use crate::error::BoxError;

/// `bytes` random bytes as `2 * bytes` lowercase hex digits.
pub fn hex(bytes: usize) -> io::Result<String> {
    let mut raw = vec![0u8; bytes];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut raw)?;
    Ok(raw.iter().map(|b| format!("{b:02x}")).collect())
}

/// [`hex`], its error naming `/dev/urandom` for a verb's answer.
pub fn hex_for_box(bytes: usize) -> Result<String, BoxError> {
    hex(bytes).map_err(|e| BoxError::io(Path::new("/dev/urandom"), e))
}
