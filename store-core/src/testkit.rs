//! The conformance suite: one function per behaviour, run by every backend's
//! own tests against a live instance.
//!
//! A backend wires it with [`conformance_tests!`](crate::conformance_tests).
//! Each behaviour makes its own callers with random ids, so one store
//! instance (one Redis server, one database) may serve all of them at once.
//!
//! Behaviours that need time to pass (a lease to expire, a record to outlive
//! its retention) ask the [`TestTime`] they are given. A store that takes an
//! injected clock (`conformance_tests!(clocked: make)`) is built on a
//! [`ManualClock`] and time passes at once when the behaviour moves it; a
//! store whose server decides expiry by its own clock
//! (`conformance_tests!(make)`: Redis, PostgreSQL) gets [`TestTime::Wall`],
//! the suite's one real sleep.

use crate::clock::{ManualClock, SharedClock};
use crate::outcome::{Acquired, ClaimOutcome, ClaimRequest, Fenced, ForgetOutcome, HeldLease};
use crate::types::{CallerId, Fingerprint, IdempotencyKey, Policy, RecordState, RecoveryPoint, SavedResponse};
use crate::{IdempotencyStore, RESPONSE_BODY_BYTES_MAX, StoreError};
use std::sync::Arc;
use std::time::Duration;

pub type SharedStore = Arc<dyn IdempotencyStore>;

/// Lease of the suite's policy: short, so takeovers happen in the test's
/// time on a wall clock too. Behaviours that expect a lease to be live
/// assume two round trips fit in it, which only a manual clock guarantees.
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

/// How time passes for the store under test.
#[derive(Debug, Clone)]
pub enum TestTime {
    /// The store reads this clock: time passes when a behaviour moves it,
    /// at once.
    Manual(Arc<ManualClock>),
    /// The store's server decides expiry by its own clock (Redis `TIME`,
    /// PostgreSQL `now()`): time passes only by really waiting.
    Wall,
}

impl TestTime {
    /// A fresh manual clock at the current time, and the time that moves it.
    pub fn manual() -> (SharedClock, Self) {
        let clock = ManualClock::starting_now();
        (clock.clone(), Self::Manual(clock))
    }

    /// Lets `ms` pass for the store: moves the manual clock, or sleeps.
    pub async fn pass(&self, ms: u64) {
        match self {
            Self::Manual(clock) => clock.advance_ms(ms),
            // The suite's only real sleep, for stores whose server keeps the time.
            Self::Wall => tokio::time::sleep(Duration::from_millis(ms)).await,
        }
    }

    /// The manual clock, if the store reads one.
    pub fn manual_clock(&self) -> Option<&Arc<ManualClock>> {
        match self {
            Self::Manual(clock) => Some(clock),
            Self::Wall => None,
        }
    }
}

/// A store under test and how time passes for it.
pub struct Subject {
    pub store: SharedStore,
    pub time: TestTime,
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

pub async fn first_claim_acquires_a_fresh_lease(subject: Subject) {
    let store = subject.store;
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

pub async fn repeat_while_lease_is_live_is_in_progress(subject: Subject) {
    let Subject { store, time } = subject;
    let caller = unique_caller();
    acquire(&store, &claim_request(&caller, "k", "a")).await;
    // On a manual clock the lease is live to its last millisecond.
    let before_the_end = TEST_LEASE_MS - 1;
    if let TestTime::Manual(_) = time {
        time.pass(before_the_end).await;
    }
    match store.claim(&claim_request(&caller, "k", "a")).await.unwrap() {
        ClaimOutcome::InProgress { retry_after_ms } => match time {
            TestTime::Manual(_) => assert_eq!(retry_after_ms, TEST_LEASE_MS - before_the_end),
            TestTime::Wall => assert!((1..=TEST_LEASE_MS).contains(&retry_after_ms)),
        },
        other => panic!("expected in progress, got {other:?}"),
    }
}

pub async fn repeat_with_another_body_is_a_mismatch_while_started(subject: Subject) {
    let Subject { store, time } = subject;
    let caller = unique_caller();
    acquire(&store, &claim_request(&caller, "k", "a")).await;
    assert_eq!(
        store.claim(&claim_request(&caller, "k", "b")).await.unwrap(),
        ClaimOutcome::Mismatch
    );
    time.pass(TEST_LEASE_MS + 100).await;
    assert_eq!(
        store.claim(&claim_request(&caller, "k", "b")).await.unwrap(),
        ClaimOutcome::Mismatch
    );
}

pub async fn expired_lease_is_taken_over_and_the_stale_attempt_is_fenced(subject: Subject) {
    let Subject { store, time } = subject;
    let caller = unique_caller();
    let first = acquire(&store, &claim_request(&caller, "k", "a")).await;
    time.pass(TEST_LEASE_MS + 100).await;
    let second = acquire(&store, &claim_request(&caller, "k", "a")).await;
    assert!(second.takeover, "a claim after the lease expired is a takeover");
    assert_ne!(first.lease.token, second.lease.token);
    lost(store.complete(&first.lease, response(1)).await);
    applied(store.complete(&second.lease, response(2)).await);
    let replay = store.claim(&claim_request(&caller, "k", "a")).await.unwrap();
    assert_eq!(replay, ClaimOutcome::Replay(response(2)));
}

pub async fn recovery_point_survives_a_takeover(subject: Subject) {
    let Subject { store, time } = subject;
    let caller = unique_caller();
    let first = acquire(&store, &claim_request(&caller, "k", "a")).await;
    let point = RecoveryPoint::new(b"carrier-called:GRD000918273".to_vec()).unwrap();
    applied(store.checkpoint(&first.lease, point.clone()).await);
    time.pass(TEST_LEASE_MS + 100).await;
    let second = acquire(&store, &claim_request(&caller, "k", "a")).await;
    assert!(second.takeover);
    assert_eq!(second.recovery_point, Some(point));
}

pub async fn validation_failure_abandons_and_frees_the_key(subject: Subject) {
    let store = subject.store;
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

pub async fn release_lets_the_next_claim_take_over_at_once(subject: Subject) {
    let store = subject.store;
    let caller = unique_caller();
    let first = acquire(&store, &claim_request(&caller, "k", "a")).await;
    applied(store.release(&first.lease).await);
    applied(store.release(&first.lease).await);
    let second = acquire(&store, &claim_request(&caller, "k", "a")).await;
    assert!(second.takeover);
    lost(store.release(&first.lease).await);
}

pub async fn stale_token_can_neither_complete_checkpoint_release_nor_abandon(subject: Subject) {
    let store = subject.store;
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

pub async fn fenced_writes_on_a_missing_record_are_lease_lost(subject: Subject) {
    let store = subject.store;
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

pub async fn resent_claim_with_the_same_token_gets_its_lease_back(subject: Subject) {
    let store = subject.store;
    let caller = unique_caller();
    let request = claim_request(&caller, "k", "a");
    let first = acquire(&store, &request).await;
    let again = acquire(&store, &request).await;
    assert_eq!(again.lease, first.lease);
    assert!(!again.takeover);
    applied(store.complete(&again.lease, response(3)).await);
}

// ---- Started -> completed ---------------------------------------------------

pub async fn completed_repeat_replays_the_exact_response(subject: Subject) {
    let store = subject.store;
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

pub async fn completed_repeat_with_another_body_is_a_mismatch(subject: Subject) {
    let store = subject.store;
    let caller = unique_caller();
    let first = acquire(&store, &claim_request(&caller, "k", "a")).await;
    applied(store.complete(&first.lease, response(1)).await);
    assert_eq!(
        store.claim(&claim_request(&caller, "k", "b")).await.unwrap(),
        ClaimOutcome::Mismatch
    );
}

pub async fn completing_twice_with_the_same_token_is_done_once(subject: Subject) {
    let store = subject.store;
    let caller = unique_caller();
    let first = acquire(&store, &claim_request(&caller, "k", "a")).await;
    applied(store.complete(&first.lease, response(1)).await);
    let stored = store.inspect(&caller, &key("k")).await.unwrap();
    applied(store.complete(&first.lease, response(1)).await);
    assert_eq!(store.inspect(&caller, &key("k")).await.unwrap(), stored);
    lost(store.release(&first.lease).await);
    lost(store.abandon(&first.lease).await);
}

pub async fn largest_response_round_trips(subject: Subject) {
    let store = subject.store;
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

pub async fn the_same_key_under_two_callers_never_collides(subject: Subject) {
    let store = subject.store;
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

pub async fn purge_removes_only_expired_records_and_leaves_a_tombstone(subject: Subject) {
    let Subject { store, time } = subject;
    let caller = unique_caller();
    let old = acquire(&store, &claim_request(&caller, "old", "a")).await;
    applied(store.complete(&old.lease, response(1)).await);
    time.pass(TEST_RETENTION_MS + 200).await;
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

pub async fn an_expired_record_counts_as_late_before_any_purge(subject: Subject) {
    let Subject { store, time } = subject;
    let caller = unique_caller();
    let first = acquire(&store, &claim_request(&caller, "k", "a")).await;
    applied(store.complete(&first.lease, response(1)).await);
    time.pass(TEST_RETENTION_MS + 200).await;
    let again = acquire(&store, &claim_request(&caller, "k", "a")).await;
    assert!(
        again.late_key,
        "a claim after the retention window must be reported late, swept or not"
    );
    assert!(!again.takeover);
}

pub async fn a_late_key_stays_late_after_an_abandoned_reclaim(subject: Subject) {
    let Subject { store, time } = subject;
    let caller = unique_caller();
    let first = acquire(&store, &claim_request(&caller, "k", "a")).await;
    applied(store.complete(&first.lease, response(1)).await);
    time.pass(TEST_RETENTION_MS + 200).await;
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

pub async fn storm_of_concurrent_claims_yields_exactly_one_acquired(subject: Subject) {
    let Subject { store, time } = subject;
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
    if let TestTime::Manual(_) = time {
        assert_eq!(takeovers, 0, "a lease taken over while the clock stood still");
    }
    // A claim retried (after conflicts) past the winner's lease takes the
    // key over, as it should: only a storm longer than the lease may see it.
    assert!(
        takeovers == 0 || storm_ms > u128::from(TEST_LEASE_MS),
        "{takeovers} claims took over a lease of {TEST_LEASE_MS} ms within {storm_ms} ms"
    );
}

// ---- Forgetting an unreadable record -----------------------------------------

/// A started and a completed record are readable: forgetting either is
/// refused and changes nothing, so the lease still holds and the answer
/// still replays.
pub async fn forgetting_a_readable_record_is_refused_and_changes_nothing(subject: Subject) {
    let store = subject.store;
    let caller = unique_caller();
    let started = acquire(&store, &claim_request(&caller, "started", "a")).await;
    let before = store.inspect(&caller, &key("started")).await.unwrap();
    let forgotten = store
        .forget_unreadable_record(&caller, key("started").digest())
        .await
        .expect("forget a started record");
    assert_eq!(forgotten, ForgetOutcome::Readable);
    assert_eq!(store.inspect(&caller, &key("started")).await.unwrap(), before);
    applied(store.complete(&started.lease, response(4)).await);

    let forgotten = store
        .forget_unreadable_record(&caller, key("started").digest())
        .await
        .expect("forget a completed record");
    assert_eq!(forgotten, ForgetOutcome::Readable);
    assert_eq!(
        store.claim(&claim_request(&caller, "started", "a")).await.unwrap(),
        ClaimOutcome::Replay(response(4)),
        "a readable record was changed by forget"
    );
}

/// No record, an abandoned one, and another caller's record under the same
/// key are all `NotFound` for this caller, and the other caller's record
/// stays.
pub async fn forgetting_an_absent_record_is_not_found(subject: Subject) {
    let store = subject.store;
    let (alice, bob) = (unique_caller(), unique_caller());
    let never = store.forget_unreadable_record(&alice, key("never").digest()).await;
    assert_eq!(never.expect("forget a key never claimed"), ForgetOutcome::NotFound);

    let abandoned = acquire(&store, &claim_request(&alice, "abandoned", "a")).await;
    applied(store.abandon(&abandoned.lease).await);
    let gone = store.forget_unreadable_record(&alice, key("abandoned").digest()).await;
    assert_eq!(gone.expect("forget an abandoned key"), ForgetOutcome::NotFound);

    let alices = acquire(&store, &claim_request(&alice, "shared", "a")).await;
    applied(store.complete(&alices.lease, response(5)).await);
    let other = store.forget_unreadable_record(&bob, key("shared").digest()).await;
    assert_eq!(other.expect("forget under another caller"), ForgetOutcome::NotFound);
    assert_eq!(
        store.claim(&claim_request(&alice, "shared", "a")).await.unwrap(),
        ClaimOutcome::Replay(response(5))
    );
}

/// For backends whose own tests can make a record unreadable (the suite
/// cannot: it sees the store only through its API). Call it after the
/// record of (`caller`, `key_text`) was overwritten with something the
/// store cannot decode: the key answers `Corrupt` to a claim with `body`
/// (the record's own body, where a store reads the fingerprint before the
/// part that is damaged), forget deletes the record, a second forget finds
/// nothing, and the key may be claimed again and then holds a readable
/// record that forget refuses.
pub async fn forget_deletes_an_unreadable_record_and_frees_its_key<S>(
    store: &S,
    caller: &CallerId,
    key_text: &str,
    body: &str,
) where
    S: IdempotencyStore + ?Sized,
{
    let request = claim_request(caller, key_text, body);
    let before = store.claim(&request).await;
    assert!(
        matches!(before, Err(StoreError::Corrupt(_))),
        "the record should be unreadable: {before:?}"
    );
    let digest = request.key.digest();
    let forgotten = store.forget_unreadable_record(caller, digest).await;
    assert_eq!(forgotten.expect("forget the unreadable record"), ForgetOutcome::Deleted);
    assert_eq!(store.inspect(caller, &request.key).await.expect("inspect"), None);
    let again = store.forget_unreadable_record(caller, digest).await;
    assert_eq!(again.expect("forget again"), ForgetOutcome::NotFound);

    let fresh = match store.claim(&request).await.expect("claim after forget") {
        ClaimOutcome::Acquired(acquired) => acquired,
        other => panic!("a claim after forget should acquire, got {other:?}"),
    };
    assert!(!fresh.takeover, "nothing was left to take over");
    applied(store.complete(&fresh.lease, response(6)).await);
    let readable = store.forget_unreadable_record(caller, digest).await;
    assert_eq!(readable.expect("forget the new record"), ForgetOutcome::Readable);
    assert_eq!(store.claim(&request).await.unwrap(), ClaimOutcome::Replay(response(6)));
}

/// Expands to one `#[tokio::test]` per behaviour of the suite, plus the
/// model-based property test.
///
/// - `conformance_tests!(clocked: make)`: `make` is an async fn taking a
///   [`Policy`] and a [`SharedClock`](crate::SharedClock) and returning a
///   [`SharedStore`] that reads that clock. Each test gets a fresh
///   [`ManualClock`], and time passes when a behaviour moves it.
/// - `conformance_tests!(make)`: `make` is an async fn taking a [`Policy`],
///   for stores whose server decides expiry by its own clock; time passes
///   by sleeping.
#[macro_export]
macro_rules! conformance_tests {
    (clocked: $make:path) => {
        $crate::conformance_tests!(@suite {
            |policy: $crate::Policy| async move {
                let (clock, time) = $crate::testkit::TestTime::manual();
                $crate::testkit::Subject { store: $make(policy, clock).await, time }
            }
        });
    };
    ($make:path) => {
        $crate::conformance_tests!(@suite {
            |policy: $crate::Policy| async move {
                $crate::testkit::Subject { store: $make(policy).await, time: $crate::testkit::TestTime::Wall }
            }
        });
    };
    (@suite $subject:block) => {
        $crate::conformance_tests!(@each $subject;
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
            storm_of_concurrent_claims_yields_exactly_one_acquired,
            forgetting_a_readable_record_is_refused_and_changes_nothing,
            forgetting_an_absent_record_is_not_found
        );

        #[test]
        fn conformance_matches_the_reference_model() {
            let subject = $subject;
            $crate::testkit::model::check_against_model(move |policy| Box::pin(subject(policy)));
        }
    };
    (@each $subject:block; $($behaviour:ident),*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $behaviour() {
                let subject = $subject;
                $crate::testkit::$behaviour(subject($crate::testkit::policy()).await).await;
            }
        )*
    };
}

pub mod atomic;
pub mod bulk;
pub mod model;
pub mod waiting;
