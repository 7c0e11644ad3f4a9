//! `h5i box cache ls`: every cache stored for this clone, and whether it is stale against the
//! lockfiles in the repository's working tree.
//!
//! Must never: write anything, or call a cache current whose key differs from the lockfiles'.

use serde::Serialize;

use super::{CacheError, CacheRoot, RefreshRecord, ECOSYSTEMS};

use crate::store::BoxStore;

/// One stored cache.
#[derive(Debug, Clone, Serialize)]
pub struct Listed {
    /// The ecosystem.
    pub eco: &'static str,
    /// Its key.
    pub key: String,
    /// Whether the working tree's lockfiles make another key (or none): never mounted.
    pub stale: bool,
    /// Bytes under `data/` (0 for an entry [`CacheRoot::verify`] refuses).
    pub bytes: u64,
    /// What its refresh observed (absent when [`CacheRoot::verify`] refuses the entry: never
    /// mounted).
    pub refresh: Option<RefreshRecord>,
}

/// Every cache of this clone, by ecosystem then key.
pub fn list(store: &BoxStore) -> Result<Vec<Listed>, CacheError> {
    let root = CacheRoot::of(store);
    let mut out = Vec::new();
    for eco in ECOSYSTEMS {
        let keys = root.keys(eco)?;
        if keys.is_empty() {
            continue;
        }
        let want = eco.key_of(&store.repo_root).ok().flatten();
        for key in keys {
            let refresh = root.verify(eco, &key).ok();
            let bytes = match &refresh {
                Some(_) => super::tree_bytes(&root.data(eco, &key)),
                None => 0,
            };
            out.push(Listed {
                eco: eco.name,
                stale: want.as_deref() != Some(key.as_str()),
                bytes,
                key,
                refresh,
            });
        }
    }
    Ok(out)
}
