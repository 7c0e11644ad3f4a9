//! `.h5i/env.toml` as a repository hands it to h5i: parsed, every profile it names resolved
//! against a host that can run every tier, and each resolved policy's canonical TOML loaded
//! back against its own digest (what every verb does with `policy.resolved.toml`).
#![no_main]

use std::path::Path;

use h5i_policy::{parse_env_file, resolve, HostTiers, ResolveRequest, ResolvedPolicy};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(env) = parse_env_file(Path::new(".h5i/env.toml"), text) else {
        return;
    };
    let host = HostTiers::all_available();
    let mut profiles: Vec<Option<String>> = vec![None];
    profiles.extend(env.profile_names().map(|p| Some(p.to_owned())));
    for profile in profiles {
        let req = ResolveRequest {
            profile,
            ..ResolveRequest::default()
        };
        if let Ok(policy) = resolve(Some(&env), &req, &host) {
            let toml = policy.to_canonical_toml();
            let digest = policy.digest();
            let again = ResolvedPolicy::load_verified(&toml, digest.as_str());
            assert!(
                again.is_ok(),
                "a resolved policy does not load back: {again:?}\n{toml}"
            );
        }
    }
});
