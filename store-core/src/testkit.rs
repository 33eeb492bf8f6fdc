//! The conformance suite: one function per behaviour, run by every backend's
//! own tests against a live instance.
//!
//! A backend wires it with [`conformance_tests!`](crate::conformance_tests),
//! giving an async factory `fn(Policy) -> SharedStore`. Each behaviour makes
//! its own callers with random ids, so one store instance (one Redis server,
//! one database) may serve all of them at once.

use crate::outcome::{Acquired, ClaimOutcome, ClaimRequest, Fenced, HeldLease};
use crate::types::{CallerId, Fingerprint, IdempotencyKey, Policy, RecordState, RecoveryPoint, SavedResponse};
use crate::{IdempotencyStore, RESPONSE_BODY_BYTES_MAX};
use std::sync::Arc;
use std::time::Duration;

pub type SharedStore = Arc<dyn IdempotencyStore>;

/// Lease of the suite's policy: short, so takeovers happen in the test's time.
pub const TEST_LEASE_MS: u64 = 300;
/// Retention of the suite's policy: short, so purges happen in the test's time.
pub const TEST_RETENTION_MS: u64 = 1_500;
/// How many claims of one key the storm sends at once.
pub const STORM_CLAIMS: usize = 200;

/// The policy the conformance behaviours expect the store to be built with.
pub fn policy() -> Policy {
    Policy::new(TEST_LEASE_MS, TEST_RETENTION_MS, 60_000).expect("test policy is valid")
}

/// A caller id no other test uses.
pub fn unique_caller() -> CallerId {
    CallerId::new(format!("t-{:016x}", rand::random::<u64>())).expect("generated caller id is valid")
}

pub fn key(text: &str) -> IdempotencyKey {
    IdempotencyKey::new(text).expect("test key is valid")
}

pub fn fingerprint(body: &str) -> Fingerprint {
    Fingerprint::of_request("POST", "/v1/labels", body.as_bytes())
}

pub fn claim_request(caller: &CallerId, key_text: &str, body: &str) -> ClaimRequest {
    ClaimRequest::new(caller.clone(), key(key_text), fingerprint(body))
}

/// A response with headers and non-UTF-8 bytes, to prove replays are exact.
pub fn response(tag: u8) -> SavedResponse {
    let headers = vec![
        ("content-type".to_owned(), "application/json".to_owned()),
        ("location".to_owned(), format!("/v1/labels/L-{tag}")),
    ];
    let mut body = format!("{{\"label_id\":\"L-{tag}\"}}").into_bytes();
    body.extend_from_slice(&[0x00, 0xff, 0xfe, tag]);
    SavedResponse::new(201, headers, body).expect("test response is valid")
}

async fn sleep_ms(ms: u64) {
    tokio::time::sleep(Duration::from_millis(ms)).await;
}

pub async fn acquire(store: &SharedStore, request: &ClaimRequest) -> Acquired {
    match store.claim(request).await.expect("claim") {
        ClaimOutcome::Acquired(acquired) => acquired,
        other => panic!("expected acquired, got {other:?}"),
    }
}

fn applied(result: Result<Fenced, crate::StoreError>) {
    assert_eq!(result.expect("fenced write"), Fenced::Applied(()));
}

fn lost(result: Result<Fenced, crate::StoreError>) {
    assert_eq!(result.expect("fenced write"), Fenced::LeaseLost);
}

// ---- No record -> started ---------------------------------------------------

pub async fn first_claim_acquires_a_fresh_lease(store: SharedStore) {
    let caller = unique_caller();
    let request = claim_request(&caller, "label:1:1:v1", "a");
    let acquired = acquire(&store, &request).await;
    assert!(!acquired.takeover && !acquired.late_key && acquired.recovery_point.is_none());
    assert_eq!(acquired.lease.token, request.token);
    let record = store
        .inspect(&caller, &request.key)
        .await
        .unwrap()
        .expect("record exists");
    assert_eq!(record.fingerprint, request.fingerprint);
    assert_eq!(record.lease().map(|lease| lease.token), Some(request.token));
    assert!(record.expires_at_ms >= record.lease().unwrap().locked_until_ms);
}

// ---- Started ----------------------------------------------------------------

pub async fn repeat_while_lease_is_live_is_in_progress(store: SharedStore) {
    let caller = unique_caller();
    acquire(&store, &claim_request(&caller, "k", "a")).await;
    match store.claim(&claim_request(&caller, "k", "a")).await.unwrap() {
        ClaimOutcome::InProgress { retry_after_ms } => assert!((1..=TEST_LEASE_MS).contains(&retry_after_ms)),
        other => panic!("expected in progress, got {other:?}"),
    }
}

pub async fn repeat_with_another_body_is_a_mismatch_while_started(store: SharedStore) {
    let caller = unique_caller();
    acquire(&store, &claim_request(&caller, "k", "a")).await;
    assert_eq!(
        store.claim(&claim_request(&caller, "k", "b")).await.unwrap(),
        ClaimOutcome::Mismatch
    );
    sleep_ms(TEST_LEASE_MS + 100).await;
    assert_eq!(
        store.claim(&claim_request(&caller, "k", "b")).await.unwrap(),
        ClaimOutcome::Mismatch
    );
}

pub async fn expired_lease_is_taken_over_and_the_stale_attempt_is_fenced(store: SharedStore) {
    let caller = unique_caller();
    let first = acquire(&store, &claim_request(&caller, "k", "a")).await;
    sleep_ms(TEST_LEASE_MS + 100).await;
    let second = acquire(&store, &claim_request(&caller, "k", "a")).await;
    assert!(second.takeover, "a claim after the lease expired is a takeover");
    assert_ne!(first.lease.token, second.lease.token);
    lost(store.complete(&first.lease, response(1)).await);
    applied(store.complete(&second.lease, response(2)).await);
    let replay = store.claim(&claim_request(&caller, "k", "a")).await.unwrap();
    assert_eq!(replay, ClaimOutcome::Replay(response(2)));
}

pub async fn recovery_point_survives_a_takeover(store: SharedStore) {
    let caller = unique_caller();
    let first = acquire(&store, &claim_request(&caller, "k", "a")).await;
    let point = RecoveryPoint::new(b"carrier-called:GRD000918273".to_vec()).unwrap();
    applied(store.checkpoint(&first.lease, point.clone()).await);
    sleep_ms(TEST_LEASE_MS + 100).await;
    let second = acquire(&store, &claim_request(&caller, "k", "a")).await;
    assert!(second.takeover);
    assert_eq!(second.recovery_point, Some(point));
}

pub async fn validation_failure_abandons_and_frees_the_key(store: SharedStore) {
    let caller = unique_caller();
    let first = acquire(&store, &claim_request(&caller, "k", "bad")).await;
    applied(store.abandon(&first.lease).await);
    assert_eq!(store.inspect(&caller, &key("k")).await.unwrap(), None);
    // A corrected request with another body may use the key now.
    let second = acquire(&store, &claim_request(&caller, "k", "good")).await;
    assert!(!second.takeover && !second.late_key);
    // Abandon again with the old token: the record is another attempt's now.
    lost(store.abandon(&first.lease).await);
}

pub async fn release_lets_the_next_claim_take_over_at_once(store: SharedStore) {
    let caller = unique_caller();
    let first = acquire(&store, &claim_request(&caller, "k", "a")).await;
    applied(store.release(&first.lease).await);
    applied(store.release(&first.lease).await);
    let second = acquire(&store, &claim_request(&caller, "k", "a")).await;
    assert!(second.takeover);
    lost(store.release(&first.lease).await);
}

pub async fn stale_token_can_neither_complete_checkpoint_release_nor_abandon(store: SharedStore) {
    let caller = unique_caller();
    let first = acquire(&store, &claim_request(&caller, "k", "a")).await;
    applied(store.release(&first.lease).await);
    let second = acquire(&store, &claim_request(&caller, "k", "a")).await;
    let before = store.inspect(&caller, &key("k")).await.unwrap();
    lost(
        store
            .checkpoint(&first.lease, RecoveryPoint::new(vec![1]).unwrap())
            .await,
    );
    lost(store.complete(&first.lease, response(1)).await);
    lost(store.release(&first.lease).await);
    lost(store.abandon(&first.lease).await);
    assert_eq!(
        store.inspect(&caller, &key("k")).await.unwrap(),
        before,
        "a stale token changed the record"
    );
    applied(store.complete(&second.lease, response(2)).await);
}

pub async fn fenced_writes_on_a_missing_record_are_lease_lost(store: SharedStore) {
    let caller = unique_caller();
    let lease = HeldLease {
        caller: caller.clone(),
        key: key("never"),
        token: crate::LeaseToken(42),
        locked_until_ms: 0,
    };
    lost(store.complete(&lease, response(1)).await);
    lost(store.checkpoint(&lease, RecoveryPoint::new(vec![]).unwrap()).await);
    lost(store.release(&lease).await);
    assert_eq!(
        store.inspect(&caller, &key("never")).await.unwrap(),
        None,
        "a fenced write created a record"
    );
}

pub async fn resent_claim_with_the_same_token_gets_its_lease_back(store: SharedStore) {
    let caller = unique_caller();
    let request = claim_request(&caller, "k", "a");
    let first = acquire(&store, &request).await;
    let again = acquire(&store, &request).await;
    assert_eq!(again.lease, first.lease);
    assert!(!again.takeover);
    applied(store.complete(&again.lease, response(3)).await);
}

// ---- Started -> completed ---------------------------------------------------

pub async fn completed_repeat_replays_the_exact_response(store: SharedStore) {
    let caller = unique_caller();
    let first = acquire(&store, &claim_request(&caller, "k", r#"{"a":1,"b":2}"#)).await;
    applied(store.complete(&first.lease, response(7)).await);
    for _ in 0..2 {
        // The same body with keys reordered is the same request.
        let replay = store
            .claim(&claim_request(&caller, "k", r#"{ "b": 2, "a": 1 }"#))
            .await
            .unwrap();
        assert_eq!(replay, ClaimOutcome::Replay(response(7)));
    }
    let record = store.inspect(&caller, &key("k")).await.unwrap().unwrap();
    assert!(matches!(record.state, RecordState::Completed { .. }));
}

pub async fn completed_repeat_with_another_body_is_a_mismatch(store: SharedStore) {
    let caller = unique_caller();
    let first = acquire(&store, &claim_request(&caller, "k", "a")).await;
    applied(store.complete(&first.lease, response(1)).await);
    assert_eq!(
        store.claim(&claim_request(&caller, "k", "b")).await.unwrap(),
        ClaimOutcome::Mismatch
    );
}

pub async fn completing_twice_with_the_same_token_is_done_once(store: SharedStore) {
    let caller = unique_caller();
    let first = acquire(&store, &claim_request(&caller, "k", "a")).await;
    applied(store.complete(&first.lease, response(1)).await);
    let stored = store.inspect(&caller, &key("k")).await.unwrap();
    applied(store.complete(&first.lease, response(1)).await);
    assert_eq!(store.inspect(&caller, &key("k")).await.unwrap(), stored);
    lost(store.release(&first.lease).await);
    lost(store.abandon(&first.lease).await);
}

pub async fn largest_response_round_trips(store: SharedStore) {
    let caller = unique_caller();
    let first = acquire(&store, &claim_request(&caller, "k", "a")).await;
    let body: Vec<u8> = (0..RESPONSE_BODY_BYTES_MAX).map(|i| (i % 251) as u8).collect();
    let big = SavedResponse::new(200, vec![], body).unwrap();
    applied(store.complete(&first.lease, big.clone()).await);
    assert_eq!(
        store.claim(&claim_request(&caller, "k", "a")).await.unwrap(),
        ClaimOutcome::Replay(big)
    );
}

// ---- Scoping, purge, concurrency --------------------------------------------

pub async fn the_same_key_under_two_callers_never_collides(store: SharedStore) {
    let (alice, bob) = (unique_caller(), unique_caller());
    let a = acquire(&store, &claim_request(&alice, "shared", "a")).await;
    let b = acquire(&store, &claim_request(&bob, "shared", "b")).await;
    assert!(!b.takeover);
    applied(store.complete(&a.lease, response(1)).await);
    assert_eq!(
        store.claim(&claim_request(&bob, "shared", "b")).await.unwrap().kind(),
        "in_progress"
    );
    applied(store.complete(&b.lease, response(2)).await);
    assert_eq!(
        store.claim(&claim_request(&alice, "shared", "a")).await.unwrap(),
        ClaimOutcome::Replay(response(1))
    );
    assert_eq!(
        store.claim(&claim_request(&bob, "shared", "b")).await.unwrap(),
        ClaimOutcome::Replay(response(2))
    );
    // Bob's lease cannot touch Alice's record.
    let forged = HeldLease {
        caller: alice.clone(),
        ..b.lease.clone()
    };
    lost(store.complete(&forged, response(3)).await);
}

pub async fn purge_removes_only_expired_records_and_leaves_a_tombstone(store: SharedStore) {
    let caller = unique_caller();
    let old = acquire(&store, &claim_request(&caller, "old", "a")).await;
    applied(store.complete(&old.lease, response(1)).await);
    sleep_ms(TEST_RETENTION_MS + 200).await;
    let fresh = acquire(&store, &claim_request(&caller, "fresh", "a")).await;
    applied(store.complete(&fresh.lease, response(2)).await);
    loop {
        let report = store.purge_expired(100).await.expect("purge");
        if !report.more {
            break;
        }
    }
    assert_eq!(
        store.inspect(&caller, &key("old")).await.unwrap(),
        None,
        "expired record survived purge"
    );
    assert!(
        store.inspect(&caller, &key("fresh")).await.unwrap().is_some(),
        "purge removed a live record"
    );
    let late = acquire(&store, &claim_request(&caller, "old", "a")).await;
    assert!(
        late.late_key,
        "a key arriving after its record was purged must be reported late"
    );
    assert!(!late.takeover);
}

pub async fn an_expired_record_counts_as_late_before_any_purge(store: SharedStore) {
    let caller = unique_caller();
    let first = acquire(&store, &claim_request(&caller, "k", "a")).await;
    applied(store.complete(&first.lease, response(1)).await);
    sleep_ms(TEST_RETENTION_MS + 200).await;
    let again = acquire(&store, &claim_request(&caller, "k", "a")).await;
    assert!(
        again.late_key,
        "a claim after the retention window must be reported late, swept or not"
    );
    assert!(!again.takeover);
}

pub async fn a_late_key_stays_late_after_an_abandoned_reclaim(store: SharedStore) {
    let caller = unique_caller();
    let first = acquire(&store, &claim_request(&caller, "k", "a")).await;
    applied(store.complete(&first.lease, response(1)).await);
    sleep_ms(TEST_RETENTION_MS + 200).await;
    while store.purge_expired(100).await.expect("purge").more {}
    let late = acquire(&store, &claim_request(&caller, "k", "bad")).await;
    assert!(late.late_key);
    applied(store.abandon(&late.lease).await);
    let corrected = acquire(&store, &claim_request(&caller, "k", "good")).await;
    assert!(
        corrected.late_key,
        "abandoning a late claim must not erase the evidence that the key was purged"
    );
}

pub async fn storm_of_concurrent_claims_yields_exactly_one_acquired(store: SharedStore) {
    let caller = unique_caller();
    let barrier = Arc::new(tokio::sync::Barrier::new(STORM_CLAIMS));
    let tasks: Vec<_> = (0..STORM_CLAIMS)
        .map(|_| {
            let (store, barrier, request) = (store.clone(), barrier.clone(), claim_request(&caller, "storm", "a"));
            tokio::spawn(async move {
                barrier.wait().await;
                store.claim(&request).await.expect("claim during storm")
            })
        })
        .collect();
    let started = std::time::Instant::now();
    let (mut fresh, mut takeovers) = (0, 0);
    for task in tasks {
        match task.await.expect("storm task") {
            ClaimOutcome::Acquired(acquired) if acquired.takeover => takeovers += 1,
            ClaimOutcome::Acquired(_) => fresh += 1,
            ClaimOutcome::InProgress { .. } => {}
            other => panic!("unexpected storm outcome {other:?}"),
        }
    }
    let storm_ms = started.elapsed().as_millis();
    assert_eq!(
        fresh, 1,
        "{fresh} of {STORM_CLAIMS} concurrent claims acquired the key as new"
    );
    // A claim retried (after conflicts) past the winner's lease takes the
    // key over, as it should: only a storm longer than the lease may see it.
    assert!(
        takeovers == 0 || storm_ms > u128::from(TEST_LEASE_MS),
        "{takeovers} claims took over a lease of {TEST_LEASE_MS} ms within {storm_ms} ms"
    );
}

/// Expands to one `#[tokio::test]` per behaviour of the suite, plus the
/// model-based property test. `$make` is an async fn taking a [`Policy`]
/// and returning a [`SharedStore`] built with it.
#[macro_export]
macro_rules! conformance_tests {
    ($make:path) => {
        $crate::conformance_tests!(@each $make;
            first_claim_acquires_a_fresh_lease,
            repeat_while_lease_is_live_is_in_progress,
            repeat_with_another_body_is_a_mismatch_while_started,
            expired_lease_is_taken_over_and_the_stale_attempt_is_fenced,
            recovery_point_survives_a_takeover,
            validation_failure_abandons_and_frees_the_key,
            release_lets_the_next_claim_take_over_at_once,
            stale_token_can_neither_complete_checkpoint_release_nor_abandon,
            fenced_writes_on_a_missing_record_are_lease_lost,
            resent_claim_with_the_same_token_gets_its_lease_back,
            completed_repeat_replays_the_exact_response,
            completed_repeat_with_another_body_is_a_mismatch,
            completing_twice_with_the_same_token_is_done_once,
            largest_response_round_trips,
            the_same_key_under_two_callers_never_collides,
            purge_removes_only_expired_records_and_leaves_a_tombstone,
            an_expired_record_counts_as_late_before_any_purge,
            a_late_key_stays_late_after_an_abandoned_reclaim,
            storm_of_concurrent_claims_yields_exactly_one_acquired
        );

        #[test]
        fn conformance_matches_the_reference_model() {
            $crate::testkit::model::check_against_model(|policy| Box::pin($make(policy)));
        }
    };
    (@each $make:path; $($behaviour:ident),*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $behaviour() {
                let store = $make($crate::testkit::policy()).await;
                $crate::testkit::$behaviour(store).await;
            }
        )*
    };
}

pub mod atomic;
pub mod model;
