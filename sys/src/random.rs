//! Random bytes from the kernel (`getrandom(2)`), for values that must not be guessed (a
//! session number on a socket another user could reach).
//!
//! On rustix. Must never: fall back to a weaker source on its own (a short or failed read is
//! the caller's error to handle, which chooses what a guessable value costs it). Tested below.

use std::io;

/// Fill `buf` with random bytes from the kernel's pool (waits only until the pool is first
/// initialised, early at boot). A short read is an error (`UnexpectedEof`).
pub fn fill(buf: &mut [u8]) -> io::Result<()> {
    let n = rustix::rand::getrandom(&mut *buf, rustix::rand::GetRandomFlags::empty())?;
    if n != buf.len() {
        return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    /// Two 16-byte draws differ (a collision has probability 2^-128).
    #[test]
    fn two_draws_differ() {
        let (mut a, mut b) = ([0u8; 16], [0u8; 16]);
        super::fill(&mut a).unwrap();
        super::fill(&mut b).unwrap();
        assert_ne!(a, b);
    }
}
