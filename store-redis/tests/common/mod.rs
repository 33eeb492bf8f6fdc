//! Helpers shared by the limit and bad-input tests.

#![allow(dead_code)] // Each test binary uses its own subset.

use std::time::{Duration, Instant};
use store_core::testkit::{claim_request, response};
use store_core::{CallerId, ClaimOutcome, ClaimRequest, Fenced, IdempotencyStore, Policy, StoreError};
use store_redis::{RedisConfig, RedisStore};

/// Longer than any test: leases never end by themselves here.
pub const LEASE_MS: u64 = 60_000;
/// Longest a test waits for a restarted server to be usable again.
pub const RECOVERY_MS_MAX: u64 = 10_000;

pub fn policy() -> Policy {
    Policy::new(LEASE_MS, 10 * LEASE_MS, LEASE_MS).expect("valid policy")
}

pub async fn connect(config: RedisConfig) -> RedisStore {
    RedisStore::connect(config, policy()).await.expect("store connects")
}

/// Claims `key` and completes it with `response(tag)`: one first run.
pub async fn run_once(store: &RedisStore, caller: &CallerId, key: &str, tag: u8) -> ClaimRequest {
    let request = claim_request(caller, key, "body");
    let ClaimOutcome::Acquired(acquired) = store.claim(&request).await.expect("claim") else {
        panic!("{key} was not acquired");
    };
    assert_eq!(
        store.complete(&acquired.lease, response(tag)).await.expect("complete"),
        Fenced::Applied(())
    );
    request
}

/// Sends the same claim until the store answers, as a caller would after
/// `Unavailable`; fails if it stays unavailable past `RECOVERY_MS_MAX`.
pub async fn claim_until_available(store: &RedisStore, request: &ClaimRequest) -> ClaimOutcome {
    let deadline = Instant::now() + Duration::from_millis(RECOVERY_MS_MAX);
    loop {
        match store.claim(request).await {
            Ok(outcome) => return outcome,
            Err(error) if error.is_retryable() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(error) => panic!("store did not recover: {error}"),
        }
    }
}

pub fn is_first_run(outcome: &ClaimOutcome) -> bool {
    matches!(outcome, ClaimOutcome::Acquired(acquired) if !acquired.takeover)
}

pub fn assert_unavailable(result: Result<impl std::fmt::Debug, StoreError>) {
    match result {
        Err(error @ StoreError::Unavailable { .. }) => assert!(error.is_retryable()),
        other => panic!("expected Unavailable, got {other:?}"),
    }
}
