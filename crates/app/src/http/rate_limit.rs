//! Per-key request rates under `/v1`: each API key may make `per_second`
//! requests a second on average and `burst` at once (GCRA, from governor);
//! past that it gets 429 `rate-limited` with `Retry-After`.
//!
//! The limiter is keyed by [`KeyId`], the key's SHA-256 digest, never the
//! key; the key check puts it on the request. Only requests whose key was accepted are counted, so it tracks at
//! most the number of valid keys (those configured and those stored); and
//! every [`SWEEP_EVERY`] checks it forgets the keys whose allowance is full
//! again (governor's `retain_recent`), so revoked or idle keys do not stay.
//! The probes and every request without a valid key are not limited here.
//! Limits are per process: behind a load balancer with `n` processes a key
//! may make up to `n` times as many requests.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse as _, Response};
use governor::clock::Clock as _;
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};

use super::ApiError;

/// Which key opened a request: the key's SHA-256 digest, never the key
/// (the key check makes it). Rate limits are kept per `KeyId`; `Debug`
/// shows only a fingerprint (the first 4 bytes, in hex).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeyId([u8; 32]);

impl KeyId {
    /// The id of the key whose SHA-256 digest is `digest`.
    pub fn new(digest: [u8; 32]) -> Self {
        Self(digest)
    }

    /// The first 4 bytes of the digest, in hex.
    pub fn fingerprint(&self) -> String {
        hex::encode(&self.0[..4])
    }
}

impl std::fmt::Debug for KeyId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KeyId({})", self.fingerprint())
    }
}

/// How many checks pass between two sweeps of idle keys.
pub(crate) const SWEEP_EVERY: u32 = 1024;

/// A request rate: `per_second` on average, `burst` at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimit {
    per_second: NonZeroU32,
    burst: NonZeroU32,
}

impl RateLimit {
    /// `per_second` requests a second, `burst` at once; `None` (no limit)
    /// when either is 0.
    pub fn new(per_second: u32, burst: u32) -> Option<Self> {
        Some(Self {
            per_second: NonZeroU32::new(per_second)?,
            burst: NonZeroU32::new(burst)?,
        })
    }
}

/// The limiter shared by every request of a process.
pub(crate) struct KeyLimiter {
    limit: RateLimit,
    limiter: DefaultKeyedRateLimiter<KeyId>,
    checks: AtomicU32,
}

impl KeyLimiter {
    pub(crate) fn new(limit: RateLimit) -> Self {
        let quota = Quota::per_second(limit.per_second).allow_burst(limit.burst);
        Self {
            limit,
            limiter: RateLimiter::keyed(quota),
            checks: AtomicU32::new(0),
        }
    }

    pub(crate) fn limit(&self) -> RateLimit {
        self.limit
    }

    /// Counts a request of `key`: `Ok`, or how long until the key may make
    /// its next one.
    pub(crate) fn check(&self, key: &KeyId) -> Result<(), Duration> {
        if self.checks.fetch_add(1, Ordering::Relaxed) % SWEEP_EVERY == SWEEP_EVERY - 1 {
            self.limiter.retain_recent();
            self.limiter.shrink_to_fit();
        }
        self.limiter
            .check_key(key)
            .map_err(|not_until| not_until.wait_time_from(self.limiter.clock().now()))
    }

    /// How many keys the limiter holds state for.
    #[cfg(test)]
    fn tracked(&self) -> usize {
        self.limiter.len()
    }
}

/// Middleware under the key check: 429 `rate-limited` when the request's
/// key is over its rate.
pub(crate) async fn limit(
    State(limiter): State<Arc<KeyLimiter>>,
    req: Request,
    next: Next,
) -> Response {
    if let Some(key) = req.extensions().get::<KeyId>()
        && let Err(wait) = limiter.check(key)
    {
        return ApiError::rate_limited(wait).into_response();
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u32) -> KeyId {
        let mut digest = [0u8; 32];
        digest[..4].copy_from_slice(&n.to_be_bytes());
        KeyId::new(digest)
    }

    #[test]
    fn zero_turns_the_limit_off() {
        assert!(RateLimit::new(0, 10).is_none());
        assert!(RateLimit::new(10, 0).is_none());
        assert!(RateLimit::new(1, 1).is_some());
    }

    #[test]
    fn a_key_past_its_burst_waits_and_other_keys_do_not() {
        let limiter = KeyLimiter::new(RateLimit::new(1, 2).unwrap());
        let (a, b) = (key(1), key(2));
        assert!(limiter.check(&a).is_ok());
        assert!(limiter.check(&a).is_ok());
        let wait = limiter.check(&a).unwrap_err();
        assert!(
            wait > Duration::ZERO && wait <= Duration::from_secs(1),
            "{wait:?}"
        );
        assert!(limiter.check(&b).is_ok());
    }

    #[test]
    fn idle_keys_are_forgotten() {
        // 1000 a second with a burst of 1: a key's allowance is full again
        // 1 ms after its request.
        let limiter = KeyLimiter::new(RateLimit::new(1000, 1).unwrap());
        for i in 0..500 {
            limiter.check(&key(i)).unwrap();
        }
        assert_eq!(limiter.tracked(), 500);
        std::thread::sleep(Duration::from_millis(50));
        // One busy key makes the checks that trigger a sweep.
        let busy = key(u32::MAX);
        for _ in 0..SWEEP_EVERY {
            let _ = limiter.check(&busy);
        }
        assert!(
            limiter.tracked() <= 1,
            "idle keys kept: {}",
            limiter.tracked()
        );
    }
}
