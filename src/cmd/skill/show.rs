//! `h5i skill show [PAGE]`: print SKILL.md or one reference page, as embedded.

use std::io::Write;

/// Print the page; an unknown page is refused with the list.
pub fn run(page: Option<&str>) -> anyhow::Result<i32> {
    let text = h5i::skill::page(page)?;
    std::io::stdout().lock().write_all(text.as_bytes())?;
    Ok(0)
}
