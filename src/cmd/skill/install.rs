//! `h5i skill install [--target DIR]`: write the embedded skill out, one line per file.

use std::path::PathBuf;

/// Install into `target`, or where `h5i skill path` says; refused inside a box.
pub fn run(target: Option<PathBuf>, env: fn(&str) -> Option<String>) -> anyhow::Result<i32> {
    h5i::skill::refuse_inside_box(env)?;
    let target = match target {
        Some(t) => t,
        None => h5i::skill::default_target(env)?,
    };
    for path in h5i::skill::install(&target)? {
        println!("wrote {}", path.display());
    }
    Ok(0)
}
