//! Seeded dice for the crash-safety tests: kill points reproducible from a printed seed
//! (`H5I_CRASH_SEED`), for h5i's and h5i-runc's crash tests.

use std::time::Duration;

/// xorshift64*: reproducible kill points from a printed seed.
pub struct Dice(u64);

impl Dice {
    pub fn new(test: &str) -> Dice {
        let seed = std::env::var("H5I_CRASH_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos() as u64
                    | 1
            });
        eprintln!("{test}: H5I_CRASH_SEED={seed}");
        Dice(seed)
    }

    /// A point in `[0, span)`.
    pub fn within(&mut self, span: Duration) -> Duration {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let r = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D);
        span.mul_f64((r >> 11) as f64 / (1u64 << 53) as f64)
    }
}
