//! The waiting suite (docs/design.md#waiting): one function per behaviour,
//! each run on two instances of one backend — two store handles on the same
//! server (or, for the embedded engine, the same open database) — so a
//! waiter on one is woken by a write through the other.
//!
//! A backend wires it with [`waiting_tests!`](crate::waiting_tests), giving
//! an async factory `fn(Policy) -> (SharedStore, SharedStore)`. Each
//! behaviour uses its own random caller, so the two instances may serve all
//! behaviours at once, but the caps are per instance: the behaviours that
//! set small caps make a pair of their own.

use super::{SharedStore, claim_request, response, unique_caller};
use crate::outcome::{ClaimOutcome, ClaimRequest, Fenced, HeldLease};
use crate::types::{CallerId, Policy, SavedResponse};
use crate::waiting::{ChangeHub, WaitLimits, WaitRefused, WaitedClaim, Woken, claim_waiting};
use std::time::Duration;
use tokio::time::Instant;

/// Lease of the waiting suite's policy: long, so a lease end never wakes a
/// waiter before the write the behaviour is about.
pub const WAIT_TEST_LEASE_MS: u64 = 20_000;
/// How long a waiter may take to wake after another instance's write, at
/// most: far below [`WAIT_TEST_POLL_INTERVAL_MS`], so only a notification
/// can make it in time.
pub const WAKE_PROMPT_MS: u64 = 750;
/// The poll interval of the behaviours that prove a notification woke the
/// waiter: long enough that the poll cannot be what woke it.
pub const WAIT_TEST_POLL_INTERVAL_MS: u64 = 15_000;
/// Waiters in the "many waiters" behaviours, as the specification's test.
pub const WAITERS_IN_A_CROWD: usize = 50;

/// The policy the waiting behaviours expect both stores to be built with.
pub fn waiting_policy() -> Policy {
    Policy::new(WAIT_TEST_LEASE_MS, 60_000, 60_000).expect("waiting test policy is valid")
}

fn hub(store: &SharedStore) -> &ChangeHub {
    store
        .record_changes()
        .expect("this backend's store must support waiting")
}

/// Sets both instances' limits (on the embedded engine they share one hub).
fn set_limits(stores: &(SharedStore, SharedStore), limits: WaitLimits) {
    hub(&stores.0).set_limits(limits);
    hub(&stores.1).set_limits(limits);
}

fn long_poll() -> WaitLimits {
    WaitLimits::new(
        WAITERS_IN_A_CROWD * 2,
        WAITERS_IN_A_CROWD * 4,
        WAIT_TEST_POLL_INTERVAL_MS,
    )
    .expect("limits")
}

async fn holder(store: &SharedStore, caller: &CallerId, key: &str) -> HeldLease {
    match store.claim(&claim_request(caller, key, "body")).await.expect("claim") {
        ClaimOutcome::Acquired(acquired) => acquired.lease,
        other => panic!("expected the first claim to acquire, got {other:?}"),
    }
}

fn applied(result: Result<Fenced, crate::StoreError>) {
    assert_eq!(result.expect("fenced write"), Fenced::Applied(()));
}

fn later(ms: u64) -> Instant {
    Instant::now() + Duration::from_millis(ms)
}

/// The write another instance makes while a waiter waits.
#[derive(Debug, Clone, Copy)]
enum Ending {
    Complete,
    Release,
    Abandon,
}

/// A waiter on `waiting` subscribes to a record `writing` holds, `writing`
/// ends it, and the waiter must wake by notification, promptly; its next
/// claim then sees the write.
async fn a_waiter_wakes_promptly_when_another_instance_ends_the_record(
    stores: (SharedStore, SharedStore),
    ending: Ending,
) -> ClaimOutcome {
    set_limits(&stores, long_poll());
    let (waiting, writing) = stores;
    let caller = unique_caller();
    let lease = holder(&writing, &caller, "k").await;
    let request = claim_request(&caller, "k", "body");
    let mut watch = hub(&waiting).subscribe(&caller, &request.key).expect("subscribe");
    // As `claim_waiting` does before each read after which it may sleep.
    watch.expect_end().await.expect("expect the record's end");
    assert_eq!(waiting.claim(&request).await.unwrap().kind(), "in_progress");
    // Let a source that arms asynchronously (a watch, a subscription) arm,
    // and take its "armed" nudge out of the way.
    while watch.changed(later(300)).await == Woken::Notified {}
    let writer = tokio::spawn(async move {
        match ending {
            Ending::Complete => applied(writing.complete(&lease, response(9)).await),
            Ending::Release => applied(writing.release(&lease).await),
            Ending::Abandon => applied(writing.abandon(&lease).await),
        }
        Instant::now()
    });
    let woken = watch.changed(later(WAIT_TEST_POLL_INTERVAL_MS - 1_000)).await;
    let woke_at = Instant::now();
    let written_at = writer.await.expect("writer task");
    assert_eq!(woken, Woken::Notified, "the waiter was not notified of {ending:?}");
    let delay = woke_at.saturating_duration_since(written_at);
    assert!(
        delay <= Duration::from_millis(WAKE_PROMPT_MS),
        "the waiter woke {delay:?} after {ending:?}"
    );
    waiting.claim(&request).await.expect("claim after waking")
}

pub async fn a_waiter_wakes_promptly_when_another_instance_completes(stores: (SharedStore, SharedStore)) {
    let outcome = a_waiter_wakes_promptly_when_another_instance_ends_the_record(stores, Ending::Complete).await;
    assert_eq!(outcome, ClaimOutcome::Replay(response(9)));
}

pub async fn a_waiter_wakes_promptly_when_another_instance_releases(stores: (SharedStore, SharedStore)) {
    let outcome = a_waiter_wakes_promptly_when_another_instance_ends_the_record(stores, Ending::Release).await;
    assert!(
        matches!(&outcome, ClaimOutcome::Acquired(acquired) if acquired.takeover),
        "after a release the waiter takes over, got {outcome:?}"
    );
}

pub async fn a_waiter_wakes_promptly_when_another_instance_abandons(stores: (SharedStore, SharedStore)) {
    let outcome = a_waiter_wakes_promptly_when_another_instance_ends_the_record(stores, Ending::Abandon).await;
    assert!(
        matches!(&outcome, ClaimOutcome::Acquired(acquired) if !acquired.takeover),
        "after an abandon the waiter claims the key afresh, got {outcome:?}"
    );
}

/// `count` waiters, spread over both instances, each running
/// [`claim_waiting`] until `until`.
fn crowd(
    stores: &(SharedStore, SharedStore),
    request: &ClaimRequest,
    count: usize,
    wait_ms: u64,
) -> Vec<tokio::task::JoinHandle<(WaitedClaim, Instant)>> {
    (0..count)
        .map(|index| {
            let store = if index % 2 == 0 {
                stores.0.clone()
            } else {
                stores.1.clone()
            };
            // Each waiter is its own request: its own lease token.
            let request = ClaimRequest {
                token: crate::LeaseToken::random(),
                ..request.clone()
            };
            tokio::spawn(async move {
                let outcome = claim_waiting(store.as_ref(), &request, later(wait_ms), std::future::pending())
                    .await
                    .expect("claim_waiting");
                (outcome, Instant::now())
            })
        })
        .collect()
}

/// Waits until `count` waiters are registered over both hubs.
async fn until_waiting(stores: &(SharedStore, SharedStore), count: usize) {
    let deadline = later(10_000);
    loop {
        let (a, b) = (hub(&stores.0), hub(&stores.1));
        let registered = if a.is_shared_with(b) {
            a.waiters()
        } else {
            a.waiters() + b.waiters()
        };
        if registered >= count {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "only {registered} of {count} waiters registered"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

pub async fn fifty_waiters_get_one_effect_and_fifty_identical_replays(stores: (SharedStore, SharedStore)) {
    set_limits(&stores, long_poll());
    let caller = unique_caller();
    let lease = holder(&stores.0, &caller, "slow").await;
    let request = claim_request(&caller, "slow", "body");
    let waiters = crowd(&stores, &request, WAITERS_IN_A_CROWD, 10_000);
    until_waiting(&stores, WAITERS_IN_A_CROWD).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    applied(stores.0.complete(&lease, response(5)).await);
    let completed_at = Instant::now();
    let mut replays: Vec<SavedResponse> = Vec::new();
    for waiter in waiters {
        let (outcome, at) = waiter.await.expect("waiter task");
        match outcome {
            WaitedClaim::Decided(ClaimOutcome::Replay(saved)) => replays.push(saved),
            other => panic!("a waiter ended with {other:?}, not a replay"),
        }
        let delay = at.saturating_duration_since(completed_at);
        assert!(
            delay <= Duration::from_millis(WAKE_PROMPT_MS * 2),
            "a waiter answered {delay:?} after the completion"
        );
    }
    assert_eq!(replays.len(), WAITERS_IN_A_CROWD);
    assert!(replays.iter().all(|saved| *saved == response(5)), "replays differ");
    assert_eq!(hub(&stores.0).waiters(), 0);
    assert_eq!(hub(&stores.1).waiters(), 0);
}

pub async fn a_release_makes_exactly_one_waiter_the_new_attempt(stores: (SharedStore, SharedStore)) {
    set_limits(&stores, long_poll());
    let caller = unique_caller();
    let lease = holder(&stores.1, &caller, "released").await;
    let request = claim_request(&caller, "released", "body");
    let count = 20;
    let mut waiters = crowd(&stores, &request, count, 10_000);
    until_waiting(&stores, count).await;
    applied(stores.1.release(&lease).await);
    // Exactly one waiter acquires; the others wait on for it.
    let mut winner = None;
    let started = Instant::now();
    while winner.is_none() {
        assert!(started.elapsed() < Duration::from_secs(5), "no waiter took over");
        let mut still = Vec::new();
        for waiter in waiters {
            if waiter.is_finished() {
                let (outcome, _) = waiter.await.expect("waiter task");
                match outcome {
                    WaitedClaim::Decided(ClaimOutcome::Acquired(acquired)) if acquired.takeover => {
                        assert!(winner.is_none(), "a second waiter acquired the key");
                        winner = Some(acquired.lease);
                    }
                    other => panic!("a waiter ended with {other:?} before the new attempt finished"),
                }
            } else {
                still.push(waiter);
            }
        }
        waiters = still;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(waiters.len(), count - 1, "waiters ended while the new attempt ran");
    let new_attempt = winner.expect("winner");
    applied(stores.0.complete(&new_attempt, response(6)).await);
    for waiter in waiters {
        let (outcome, _) = waiter.await.expect("waiter task");
        assert_eq!(outcome, WaitedClaim::Decided(ClaimOutcome::Replay(response(6))));
    }
}

pub async fn a_waiter_past_its_deadline_is_still_in_progress(stores: (SharedStore, SharedStore)) {
    set_limits(&stores, long_poll());
    let caller = unique_caller();
    let _lease = holder(&stores.1, &caller, "held").await;
    let request = claim_request(&caller, "held", "body");
    let started = Instant::now();
    let outcome = claim_waiting(stores.0.as_ref(), &request, later(400), std::future::pending())
        .await
        .unwrap();
    let waited = started.elapsed();
    match outcome {
        WaitedClaim::StillInProgress { retry_after_ms } => {
            assert!((1..=WAIT_TEST_LEASE_MS).contains(&retry_after_ms));
        }
        other => panic!("expected still in progress, got {other:?}"),
    }
    assert!(
        waited >= Duration::from_millis(400) && waited < Duration::from_millis(400 + WAKE_PROMPT_MS),
        "waited {waited:?} for a 400 ms deadline"
    );
    assert_eq!(hub(&stores.0).waiters(), 0);
}

pub async fn waiter_caps_refuse_at_once_and_a_dropped_waiter_frees_its_place(stores: (SharedStore, SharedStore)) {
    let caps = WaitLimits::new(2, 3, WAIT_TEST_POLL_INTERVAL_MS).expect("limits");
    set_limits(&stores, caps);
    let waiting = &stores.0;
    let caller = unique_caller();
    let _first = holder(&stores.1, &caller, "a").await;
    let _second = holder(&stores.1, &caller, "b").await;
    let request_a = claim_request(&caller, "a", "body");
    let request_b = claim_request(&caller, "b", "body");
    let mut on_a = crowd(&(waiting.clone(), waiting.clone()), &request_a, 2, 10_000);
    until_waiting(&(waiting.clone(), waiting.clone()), 2).await;
    let started = Instant::now();
    let refused = claim_waiting(waiting.as_ref(), &request_a, later(10_000), std::future::pending())
        .await
        .unwrap();
    assert!(
        matches!(
            refused,
            WaitedClaim::Refused {
                reason: WaitRefused::TooManyWaitersOnKey(2),
                ..
            }
        ),
        "{refused:?}"
    );
    let on_b = crowd(&(waiting.clone(), waiting.clone()), &request_b, 1, 10_000);
    until_waiting(&(waiting.clone(), waiting.clone()), 3).await;
    let refused = claim_waiting(waiting.as_ref(), &request_b, later(10_000), std::future::pending())
        .await
        .unwrap();
    assert!(
        matches!(
            refused,
            WaitedClaim::Refused {
                reason: WaitRefused::TooManyWaitersOnInstance(3),
                ..
            }
        ),
        "{refused:?}"
    );
    assert!(
        started.elapsed() < Duration::from_millis(WAKE_PROMPT_MS),
        "a refusal waited"
    );
    // A client that hangs up drops its request's future: its place is free.
    on_a.pop().expect("a waiter").abort();
    let deadline = later(5_000);
    while hub(waiting).waiters() > 2 {
        assert!(Instant::now() < deadline, "an aborted waiter kept its place");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut again = hub(waiting).subscribe(&caller, &request_a.key).expect("a freed place");
    // A notification may still come: a backend's subscription confirmation
    // wakes a record's waiters (a wake only means "read again"), and over
    // a slower connection (TLS) it can arrive this late.
    let woken = again.changed(later(50)).await;
    assert!(matches!(woken, Woken::DeadlinePassed | Woken::Notified), "{woken:?}");
    drop(again);
    for waiter in on_a.into_iter().chain(on_b) {
        waiter.abort();
    }
}

pub async fn a_stopped_waiter_stops_at_once_and_frees_its_place(stores: (SharedStore, SharedStore)) {
    set_limits(&stores, long_poll());
    let caller = unique_caller();
    let _lease = holder(&stores.1, &caller, "held").await;
    let request = claim_request(&caller, "held", "body");
    let hung_up = tokio::time::sleep(Duration::from_millis(200));
    let started = Instant::now();
    let outcome = claim_waiting(stores.0.as_ref(), &request, later(10_000), hung_up)
        .await
        .unwrap();
    assert!(matches!(outcome, WaitedClaim::Stopped { .. }), "{outcome:?}");
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(200) && waited < Duration::from_millis(200 + WAKE_PROMPT_MS),
        "a waiter stopped after 200 ms took {waited:?}"
    );
    assert_eq!(hub(&stores.0).waiters(), 0, "a stopped waiter kept its place");
}

/// Expands to one `#[tokio::test]` per waiting behaviour. `$make_pair` is an
/// async fn taking a [`Policy`] and returning two instances of one store
/// (two handles on one server or database), both built with it.
#[macro_export]
macro_rules! waiting_tests {
    ($make_pair:path) => {
        $crate::waiting_tests!(@each $make_pair;
            a_waiter_wakes_promptly_when_another_instance_completes,
            a_waiter_wakes_promptly_when_another_instance_releases,
            a_waiter_wakes_promptly_when_another_instance_abandons,
            fifty_waiters_get_one_effect_and_fifty_identical_replays,
            a_release_makes_exactly_one_waiter_the_new_attempt,
            a_waiter_past_its_deadline_is_still_in_progress,
            waiter_caps_refuse_at_once_and_a_dropped_waiter_frees_its_place,
            a_stopped_waiter_stops_at_once_and_frees_its_place
        );
    };
    (@each $make_pair:path; $($behaviour:ident),*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $behaviour() {
                let stores = $make_pair($crate::testkit::waiting::waiting_policy()).await;
                $crate::testkit::waiting::$behaviour(stores).await;
            }
        )*
    };
}
