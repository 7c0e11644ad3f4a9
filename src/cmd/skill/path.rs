//! `h5i skill path`: where `h5i skill install` would write.

/// Print the default target.
pub fn run(env: fn(&str) -> Option<String>) -> anyhow::Result<i32> {
    println!("{}", h5i::skill::default_target(env)?.display());
    Ok(0)
}
