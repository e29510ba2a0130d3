//! Cache scopes: whose kept prompt memory a request may reuse. The prompt cache (slots' kept
//! memory and the RAM cache) is partitioned so that one client's cached prefixes never change
//! what another observes (`timings.cache_n`, timings): with API keys, each key is its own
//! partition; within a key, a request's `cache_salt` (vLLM's field) narrows it further. Without
//! either, every request shares one partition, as in llama-server.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use std::convert::Infallible;
use std::hash::{Hash, Hasher};

/// Who sent a request, as far as cache partitioning cares: the index of the API key it
/// authenticated with (none when the server has no keys). Set by the authentication layer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Caller {
    pub key: Option<usize>,
}

impl Caller {
    /// The cache scope of a request from this caller with `cache_salt` `salt`. 0 (the shared
    /// partition) only for no key and no salt.
    pub fn scope(&self, salt: Option<&str>) -> u64 {
        if self.key.is_none() && salt.is_none() {
            return 0;
        }
        // SipHash with fixed keys: scopes only need to differ, not to be secret (they never
        // leave the engine); `| 1` keeps them off the shared partition.
        let mut h = std::hash::DefaultHasher::new();
        (self.key, salt).hash(&mut h);
        h.finish() | 1
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(parts
            .extensions
            .get::<Caller>()
            .copied()
            .unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_separate_keys_and_salts() {
        let none = Caller::default();
        let (a, b) = (Caller { key: Some(0) }, Caller { key: Some(1) });
        assert_eq!(none.scope(None), 0);
        let all = [
            none.scope(Some("x")),
            none.scope(Some("y")),
            a.scope(None),
            a.scope(Some("x")),
            b.scope(None),
            b.scope(Some("x")),
        ];
        for (i, s) in all.iter().enumerate() {
            assert_ne!(*s, 0);
            for t in &all[i + 1..] {
                assert_ne!(s, t);
            }
        }
        assert_eq!(a.scope(Some("x")), Caller { key: Some(0) }.scope(Some("x")));
    }
}
