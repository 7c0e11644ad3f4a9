//! `h5i box cache rm <eco>`: remove every cache of one ecosystem on this clone.
//!
//! A box that is running keeps the mount it has (the kernel holds the directory until the run
//! ends); the next run gets none. Must never: remove anything outside `.git/.h5i/cache/<eco>/`.

use super::{ecosystem, CacheError, CacheRoot};
use crate::error::BoxError;
use crate::store::BoxStore;

/// Remove every cache of ecosystem `name`; returns the keys removed.
pub fn rm(store: &BoxStore, name: &str) -> Result<Vec<String>, CacheError> {
    let eco = ecosystem(name)?;
    let root = CacheRoot::of(store);
    let _lock = super::refresh::EcoLock::take(&root, eco)?;
    let keys = root.keys(eco)?;
    if keys.is_empty() {
        return Err(CacheError::NoCache(eco.name));
    }
    for key in &keys {
        let dir = root.entry(eco, key);
        std::fs::remove_dir_all(&dir).map_err(|e| BoxError::io(&dir, e))?;
    }
    Ok(keys)
}
