//! The conformance behaviours of [`AtomicCompletion`], run on every store
//! that implements it (docs/design.md#transaction-2): the effect and the
//! completed record commit together or not at all, a stale token runs no
//! effect, and a retry after an unknown result finds its own completion.
//!
//! The behaviours need to see whether an effect's write committed, which
//! only the backend knows how to do: each backend's tests implement
//! [`EffectHarness`] (write a named marker row through the effect's
//! context, read it back outside any transaction, make completions fail
//! after their effect) and expand the behaviours with
//! [`atomic_completion_tests!`](crate::atomic_completion_tests), giving an
//! async factory `fn(Policy) -> impl EffectHarness`.

use super::{TEST_LEASE_MS, TestTime, claim_request, response, unique_caller};
use crate::atomic::{AtomicCompletion, CompleteWithError, Completion};
use crate::outcome::{ClaimOutcome, HeldLease};
use crate::store::IdempotencyStore;
use crate::types::{LeaseToken, RecordState};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};

/// The effect error of a harness's store.
pub type HarnessEffectError<H> = <<H as EffectHarness>::Store as AtomicCompletion>::EffectError;
/// The effect context of a harness's store.
pub type HarnessContext<'t, H> = <<H as EffectHarness>::Store as AtomicCompletion>::EffectContext<'t>;

/// What the behaviours need from a backend besides its store.
pub trait EffectHarness: Send + Sync + 'static {
    type Store: AtomicCompletion;

    /// The store under test, built with [`super::policy`].
    fn store(&self) -> &Self::Store;

    /// How the store's time passes: its manual clock moved, or a real
    /// sleep for a store whose server keeps the time.
    fn time(&self) -> TestTime;

    /// Writes the marker row `name` through the effect's context, so that it
    /// commits with the effect's transaction or not at all.
    fn write_marker<'c>(
        &'c self,
        context: &'c HarnessContext<'_, Self>,
        name: &'c str,
    ) -> Pin<Box<dyn Future<Output = Result<(), HarnessEffectError<Self>>> + Send + 'c>>;

    /// Whether the marker row `name` is committed, read outside any
    /// transaction of the store's.
    fn marker_exists(&self, name: &str) -> impl Future<Output = bool> + Send;

    /// An effect's own failure (a handler that decided to fail).
    fn effect_failure(&self, detail: &str) -> HarnessEffectError<Self>;

    /// While `fail` holds, every completion fails after its effect has run
    /// and before its transaction commits: a crash or an error between the
    /// effect and the commit, injected by the backend's own means.
    fn fail_completions(&self, fail: bool) -> impl Future<Output = ()> + Send;
}

/// A marker name no other behaviour uses.
fn marker(what: &str) -> String {
    format!("{what}-{:016x}", rand::random::<u64>())
}

async fn acquire_lease<S: IdempotencyStore + ?Sized>(store: &S, caller: &crate::CallerId, key: &str) -> HeldLease {
    match store.claim(&claim_request(caller, key, "a")).await.expect("claim") {
        ClaimOutcome::Acquired(acquired) => acquired.lease,
        other => panic!("expected acquired, got {other:?}"),
    }
}

/// How an effect of these behaviours ends after writing its marker.
#[derive(Clone, Copy)]
enum EffectEnd {
    /// Answers `response(tag)` with `tag` as its own value.
    Answer(u8),
    /// Fails for its own reasons.
    Fail,
}

/// Completes `lease` with an effect that counts its runs in `runs`, writes
/// the marker `name` and then ends as `end` says.
async fn complete_with_marker<H: EffectHarness>(
    harness: &H,
    lease: &HeldLease,
    name: &str,
    runs: &AtomicU32,
    end: EffectEnd,
) -> Result<Completion<u8>, CompleteWithError<HarnessEffectError<H>>> {
    harness
        .store()
        .complete_with(lease, move |scope| {
            runs.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move {
                harness.write_marker(scope.context(), name).await?;
                match end {
                    EffectEnd::Answer(tag) => Ok((response(tag), tag)),
                    EffectEnd::Fail => Err(harness.effect_failure("the handler refused the parcel")),
                }
            })
        })
        .await
}

fn completed_by(record: Option<crate::Record>) -> Option<LeaseToken> {
    match record?.state {
        RecordState::Completed { completed_by, .. } => Some(completed_by),
        RecordState::Started { .. } => None,
    }
}

pub async fn the_effect_and_the_completed_record_commit_together<H: EffectHarness>(harness: H) {
    let store = harness.store();
    let caller = unique_caller();
    let lease = acquire_lease(store, &caller, "k").await;
    let (name, runs) = (marker("together"), AtomicU32::new(0));
    let outcome = complete_with_marker(&harness, &lease, &name, &runs, EffectEnd::Answer(1)).await;
    assert_eq!(
        outcome.expect("complete with an effect"),
        Completion::Committed {
            response: response(1),
            value: 1
        }
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "runs of the effect");
    assert!(harness.marker_exists(&name).await, "the effect's row did not commit");
    let record = store.inspect(&caller, &lease.key).await.unwrap();
    assert_eq!(
        completed_by(record),
        Some(lease.token),
        "the record is not completed by this lease"
    );
    assert_eq!(
        store.claim(&claim_request(&caller, "k", "a")).await.unwrap(),
        ClaimOutcome::Replay(response(1))
    );
}

pub async fn a_failing_effect_commits_neither_its_writes_nor_the_completion<H: EffectHarness>(harness: H) {
    let store = harness.store();
    let caller = unique_caller();
    let lease = acquire_lease(store, &caller, "k").await;
    let before = store.inspect(&caller, &lease.key).await.unwrap();
    let (name, runs) = (marker("failing"), AtomicU32::new(0));
    let outcome = complete_with_marker(&harness, &lease, &name, &runs, EffectEnd::Fail).await;
    assert!(
        matches!(outcome, Err(CompleteWithError::Effect(_))),
        "expected the effect's own error, got {outcome:?}"
    );
    assert!(!harness.marker_exists(&name).await, "a failed effect's row committed");
    assert_eq!(
        store.inspect(&caller, &lease.key).await.unwrap(),
        before,
        "a failed effect changed the record"
    );
    // Nothing was written, so the lease still holds and the attempt can
    // still complete.
    let outcome = complete_with_marker(&harness, &lease, &name, &runs, EffectEnd::Answer(2)).await;
    assert!(matches!(outcome, Ok(Completion::Committed { .. })), "{outcome:?}");
    assert!(harness.marker_exists(&name).await);
}

pub async fn a_completion_that_fails_after_the_effect_commits_neither<H: EffectHarness>(harness: H) {
    let store = harness.store();
    let caller = unique_caller();
    let lease = acquire_lease(store, &caller, "k").await;
    let before = store.inspect(&caller, &lease.key).await.unwrap();
    let (name, runs) = (marker("completion-fails"), AtomicU32::new(0));
    harness.fail_completions(true).await;
    let outcome = complete_with_marker(&harness, &lease, &name, &runs, EffectEnd::Answer(1)).await;
    harness.fail_completions(false).await;
    assert!(
        matches!(outcome, Err(CompleteWithError::Store(_))),
        "expected the store's error, got {outcome:?}"
    );
    assert!(
        runs.load(Ordering::SeqCst) >= 1,
        "the completion failed before the effect ran, which this behaviour does not test"
    );
    assert!(
        !harness.marker_exists(&name).await,
        "the effect's row committed without its completion"
    );
    assert_eq!(
        store.inspect(&caller, &lease.key).await.unwrap(),
        before,
        "a failed completion changed the record"
    );
    let outcome = complete_with_marker(&harness, &lease, &name, &runs, EffectEnd::Answer(1)).await;
    assert!(matches!(outcome, Ok(Completion::Committed { .. })), "{outcome:?}");
    assert!(harness.marker_exists(&name).await);
}

pub async fn a_stale_token_runs_no_effect<H: EffectHarness>(harness: H) {
    let store = harness.store();
    let caller = unique_caller();
    let first = acquire_lease(store, &caller, "k").await;
    assert!(store.release(&first).await.unwrap().is_applied());
    let second = acquire_lease(store, &caller, "k").await;
    assert_ne!(first.token, second.token, "the second claim took the key over");
    let before = store.inspect(&caller, &first.key).await.unwrap();
    let (name, runs) = (marker("stale"), AtomicU32::new(0));
    let outcome = complete_with_marker(&harness, &first, &name, &runs, EffectEnd::Answer(1)).await;
    assert_eq!(outcome.expect("fenced"), Completion::LeaseLost);
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the effect ran for a stale token");
    assert!(!harness.marker_exists(&name).await, "a stale token's effect committed");
    assert_eq!(
        store.inspect(&caller, &first.key).await.unwrap(),
        before,
        "a stale token changed the record"
    );
    // A lease on a key that has no record at all is stale too.
    let never = HeldLease {
        key: crate::testkit::key("never-claimed"),
        ..first.clone()
    };
    let outcome = complete_with_marker(&harness, &never, &name, &runs, EffectEnd::Answer(1)).await;
    assert_eq!(outcome.expect("fenced"), Completion::LeaseLost);
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the effect ran without a record");
    assert_eq!(store.inspect(&caller, &never.key).await.unwrap(), None);
    // The attempt that took over completes.
    let outcome = complete_with_marker(&harness, &second, &name, &runs, EffectEnd::Answer(2)).await;
    assert!(matches!(outcome, Ok(Completion::Committed { .. })), "{outcome:?}");
}

pub async fn an_expired_lease_that_nobody_took_over_still_completes<H: EffectHarness>(harness: H) {
    let store = harness.store();
    let caller = unique_caller();
    let lease = acquire_lease(store, &caller, "k").await;
    harness.time().pass(TEST_LEASE_MS + 100).await;
    // Tokens are checked, not clocks (ARCHITECTURE.md, invariants).
    let (name, runs) = (marker("expired"), AtomicU32::new(0));
    let outcome = complete_with_marker(&harness, &lease, &name, &runs, EffectEnd::Answer(1)).await;
    assert!(matches!(outcome, Ok(Completion::Committed { .. })), "{outcome:?}");
    assert!(harness.marker_exists(&name).await);
}

pub async fn a_retry_after_an_unknown_result_finds_its_own_completion<H: EffectHarness>(harness: H) {
    let store = harness.store();
    let caller = unique_caller();
    let lease = acquire_lease(store, &caller, "k").await;
    let (name, runs) = (marker("retry"), AtomicU32::new(0));
    let first = complete_with_marker(&harness, &lease, &name, &runs, EffectEnd::Answer(1)).await;
    assert!(matches!(first, Ok(Completion::Committed { .. })), "{first:?}");
    let stored = store.inspect(&caller, &lease.key).await.unwrap();
    // The reply of that commit was lost: the caller sends the same call
    // again, with the same lease. Its effect would answer differently, so
    // the answer shows where it came from.
    let again = complete_with_marker(&harness, &lease, &name, &runs, EffectEnd::Answer(2)).await;
    assert_eq!(
        again.expect("retry"),
        Completion::AlreadyCompleted { response: response(1) }
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the retry ran the effect again");
    assert_eq!(
        store.inspect(&caller, &lease.key).await.unwrap(),
        stored,
        "the retry changed the record"
    );
    assert!(harness.marker_exists(&name).await);
}

/// Expands to one `#[tokio::test]` per behaviour of [`AtomicCompletion`].
/// `$make` is an async fn taking a [`crate::Policy`] and returning an
/// [`EffectHarness`] whose store was built with it.
#[macro_export]
macro_rules! atomic_completion_tests {
    ($make:path) => {
        $crate::atomic_completion_tests!(@each $make;
            the_effect_and_the_completed_record_commit_together,
            a_failing_effect_commits_neither_its_writes_nor_the_completion,
            a_completion_that_fails_after_the_effect_commits_neither,
            a_stale_token_runs_no_effect,
            an_expired_lease_that_nobody_took_over_still_completes,
            a_retry_after_an_unknown_result_finds_its_own_completion
        );
    };
    (@each $make:path; $($behaviour:ident),*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $behaviour() {
                let harness = $make($crate::testkit::policy()).await;
                $crate::testkit::atomic::$behaviour(harness).await;
            }
        )*
    };
}
