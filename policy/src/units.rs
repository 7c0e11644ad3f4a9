//! Resource units: memory sizes (`"4G"`) and wall-clock durations (`"1h30m"`).
//!
//! Owns the grammar of `resources.mem` and `resources.wall`. Must never: accept a zero, a
//! negative, a fraction or an overflowing value (a limit that rounds to something else is not
//! the limit that was written). Values are capped at `i64::MAX` so they survive TOML.
//!
//! Guarded by the tests below.

/// The largest value a resource limit may take (TOML integers are signed 64-bit).
pub const MAX_LIMIT: u64 = i64::MAX as u64;

/// How to write a memory size, for error mends.
pub const MEM_MEND: &str =
    "write a positive size with an optional binary suffix, like \"4G\", \"512M\" or a byte count";

/// How to write a duration, for error mends.
pub const WALL_MEND: &str =
    "write a positive duration in h/m/s, largest unit first, like \"30m\", \"90s\" or \"1h30m\"";

/// Parse a memory size: digits with an optional `K`, `M`, `G` or `T` suffix (binary units,
/// either case), or plain digits for bytes. Returns bytes.
pub fn parse_mem(text: &str) -> Result<u64, String> {
    let (digits, mult): (&str, u64) = match text.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let mult = match c.to_ascii_uppercase() {
                'K' => 1 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                _ => return Err(format!("`{text}` has an unknown size suffix `{c}`")),
            };
            (&text[..i], mult)
        }
        _ => (text, 1),
    };
    let n = parse_digits(digits).ok_or_else(|| format!("`{text}` is not a memory size"))?;
    check_limit(n.checked_mul(mult), text)
}

/// Validate a memory size given as a TOML integer (bytes).
pub fn mem_from_int(n: i64) -> Result<u64, String> {
    if n <= 0 {
        return Err(format!("memory size {n} is not positive"));
    }
    Ok(n.unsigned_abs())
}

/// Parse a duration: one or more `<digits><unit>` parts with units `h`, `m`, `s`, each unit at
/// most once, largest first (`"1h30m"`, `"45s"`). Returns seconds.
pub fn parse_wall(text: &str) -> Result<u64, String> {
    let bad = || format!("`{text}` is not a duration");
    if text.is_empty() {
        return Err(bad());
    }
    let mut total: u64 = 0;
    let mut last_rank = usize::MAX;
    let mut rest = text;
    while !rest.is_empty() {
        let end = rest
            .find(|c: char| !c.is_ascii_digit())
            .ok_or_else(|| format!("`{text}` has a number with no unit (h, m or s)"))?;
        let n = parse_digits(&rest[..end]).ok_or_else(bad)?;
        let unit = rest[end..].chars().next().ok_or_else(bad)?;
        let (rank, secs) = match unit {
            'h' => (2, 3600),
            'm' => (1, 60),
            's' => (0, 1),
            _ => return Err(format!("`{text}` has an unknown unit `{unit}`")),
        };
        if rank >= last_rank {
            return Err(format!(
                "`{text}` repeats a unit or puts a smaller one first"
            ));
        }
        last_rank = rank;
        let part = n.checked_mul(secs).ok_or_else(bad)?;
        total = total.checked_add(part).ok_or_else(bad)?;
        rest = &rest[end + unit.len_utf8()..];
    }
    check_limit(Some(total), text)
}

fn parse_digits(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

fn check_limit(v: Option<u64>, text: &str) -> Result<u64, String> {
    match v {
        Some(0) => Err(format!(
            "`{text}` is zero, which would stop the box from running anything"
        )),
        Some(n) if n <= MAX_LIMIT => Ok(n),
        _ => Err(format!("`{text}` is too large")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_accepts_binary_suffixes_and_plain_bytes() {
        assert_eq!(parse_mem("4G"), Ok(4 << 30));
        assert_eq!(parse_mem("4g"), Ok(4 << 30));
        assert_eq!(parse_mem("512M"), Ok(512 << 20));
        assert_eq!(parse_mem("1K"), Ok(1024));
        assert_eq!(parse_mem("2T"), Ok(2 << 40));
        assert_eq!(parse_mem("4096"), Ok(4096));
        assert_eq!(mem_from_int(4096), Ok(4096));
    }

    #[test]
    fn mem_refuses_zero_fractions_junk_and_overflow() {
        for bad in [
            "",
            "0",
            "0G",
            "G",
            "4.5G",
            "-1G",
            "4GB",
            "4 G",
            "4X",
            "99999999999T",
        ] {
            assert!(parse_mem(bad).is_err(), "{bad:?} accepted");
        }
        assert!(mem_from_int(0).is_err());
        assert!(mem_from_int(-5).is_err());
    }

    #[test]
    fn wall_accepts_units_and_combinations() {
        assert_eq!(parse_wall("30m"), Ok(1800));
        assert_eq!(parse_wall("90s"), Ok(90));
        assert_eq!(parse_wall("1h30m"), Ok(5400));
        assert_eq!(parse_wall("2h"), Ok(7200));
        assert_eq!(parse_wall("1h1m1s"), Ok(3661));
    }

    #[test]
    fn wall_refuses_zero_bare_numbers_repeats_and_junk() {
        for bad in [
            "", "0s", "0h0m", "1800", "30", "m", "1m1h", "1m1m", "1d", "1.5h", "1h 30m", "-1s",
        ] {
            assert!(parse_wall(bad).is_err(), "{bad:?} accepted");
        }
    }
}
