//! The claim batch's behaviours (`src/claim_batch.rs`), written once and run
//! on every engine by [`store_tests!`](crate::store_tests): a batch claims
//! its keys in one transaction; a key's second claim in a batch answers as
//! if it had come after the first; each claim is decided on its own record;
//! an unreadable record fails its own claim only; a conflict runs the batch
//! again; a transaction that fails as a whole sends every claim alone, or
//! fails each as unavailable when the engine did not answer; a full batch of
//! the largest claims fits one FoundationDB transaction; and random batches
//! over keys in random states agree with the state machine applied one
//! claim after the other.
//!
//! [`claim_in_one_batch`] puts the claims it is given into one batch, which
//! concurrent calls do only by chance. Every store here reads the test's
//! manual clock, which no behaviour moves while a batch runs, so the
//! machine's times are the store's to the millisecond.

use super::{ObservedEngine, TestEngine, caller, key, overwrite_with_unreadable_bytes};
use crate::claim_batch::{CLAIM_BATCH_ITEMS_MAX, ClaimBatchRunner, ClaimItem};
use crate::engine::{Engine, RunOptions, Transaction};
use crate::store::FdbStore;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use store_core::machine::{self, Found, Write};
use store_core::testkit::{TestTime, policy};
use store_core::{
    BatchRunner, CallerId, ClaimOutcome, ClaimRequest, Fingerprint, IdempotencyKey, IdempotencyStore, Lease,
    LeaseToken, RECOVERY_POINT_BYTES_MAX, Record, RecordState, RecoveryPoint, SavedResponse, StoreError,
};

const HOLDER: LeaseToken = LeaseToken(0xA);
const OTHER: LeaseToken = LeaseToken(0xB);
const THIRD: LeaseToken = LeaseToken(0xC);
/// The body the keys' records were made with, and another one.
const BODY: Fingerprint = Fingerprint([1; 32]);
const OTHER_BODY: Fingerprint = Fingerprint([2; 32]);
/// How far from the clock the set-up records' times are: no decision
/// depends on a millisecond.
const OFFSET_MS: u64 = 60_000;
/// Keys one random case spreads its claims over, so that keys repeat.
const RANDOM_CASE_KEYS: usize = 3;
/// Claims in one random case at most.
const RANDOM_CASE_CLAIMS_MAX: usize = 6;
/// Random cases per run by default; `IDEM_CLAIM_BATCH_CASES` sets another
/// number, `IDEM_CLAIM_BATCH_SEED` replays a seed.
const RANDOM_CASES_DEFAULT: usize = 64;
/// Real time every read of the concurrent behaviour takes, so that claims
/// queue behind the batches in flight.
const CONCURRENT_READ_DELAY_MS: u64 = 20;

/// Runs `requests` as one claim batch, as if they had all arrived while the
/// previous batch was in flight, then finishes each claim, in order, on the
/// path its batch outcome chose, as the store's `claim` does. Returns what
/// the batch decided for each claim ([`crate::BatchedClaim::kind`]) and the
/// claim's outcome.
pub async fn claim_in_one_batch<E: Engine>(
    store: &FdbStore<E>,
    requests: &[ClaimRequest],
) -> Vec<(&'static str, Result<ClaimOutcome, StoreError>)> {
    let items = requests
        .iter()
        .map(|request| ClaimItem::new(store.layout(), request))
        .collect();
    let runner = ClaimBatchRunner::new(store.without_claim_batcher());
    let batched = runner.run(items).await;
    assert_eq!(batched.len(), requests.len(), "one outcome per claim");
    let mut outcomes = Vec::with_capacity(requests.len());
    for (request, batched) in requests.iter().zip(batched) {
        let kind = batched.kind();
        outcomes.push((kind, store.finish_claim(request, batched).await));
    }
    outcomes
}

// ---- Helpers ------------------------------------------------------------------

fn claim_of(caller: &CallerId, key: &IdempotencyKey, token: LeaseToken, body: Fingerprint) -> ClaimRequest {
    ClaimRequest {
        caller: caller.clone(),
        key: key.clone(),
        fingerprint: body,
        token,
    }
}

fn fresh_key(stem: &str) -> IdempotencyKey {
    key(&format!("{stem}-{:016x}", rand::random::<u64>()))
}

fn fresh_keys(stem: &str, count: usize) -> Vec<IdempotencyKey> {
    (0..count)
        .map(|index| key(&format!("{stem}-{index}-{:016x}", rand::random::<u64>())))
        .collect()
}

fn kinds(results: &[(&'static str, Result<ClaimOutcome, StoreError>)]) -> Vec<(&'static str, &'static str)> {
    results
        .iter()
        .map(|(batched, outcome)| match outcome {
            Ok(outcome) => (*batched, outcome.kind()),
            Err(_) => (*batched, "error"),
        })
        .collect()
}

fn acquired(outcome: &Result<ClaimOutcome, StoreError>) -> &store_core::Acquired {
    match outcome {
        Ok(ClaimOutcome::Acquired(acquired)) => acquired,
        other => panic!("expected acquired, got {other:?}"),
    }
}

/// A key's state, as the machine sees it between two claims.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Known {
    Nothing,
    /// A live tombstone, no record.
    Tombstone,
    Record(Record),
}

impl Known {
    fn found(&self) -> Found<'_> {
        match self {
            Known::Nothing => Found::Nothing,
            Known::Tombstone => Found::Tombstone,
            Known::Record(record) => Found::Record(record),
        }
    }

    fn record(&self) -> Option<Record> {
        match self {
            Known::Record(record) => Some(record.clone()),
            Known::Nothing | Known::Tombstone => None,
        }
    }
}

fn started(holder: LeaseToken, lease_live: bool, point: Option<RecoveryPoint>, body: Fingerprint, now: u64) -> Known {
    let locked_until_ms = if lease_live { now + OFFSET_MS } else { now - OFFSET_MS };
    Known::Record(Record {
        fingerprint: body,
        state: RecordState::Started {
            lease: Lease {
                token: holder,
                locked_until_ms,
            },
            recovery_point: point,
        },
        created_at_ms: now - 2 * OFFSET_MS,
        expires_at_ms: now + 10 * OFFSET_MS,
    })
}

fn completed(by: LeaseToken, body: Fingerprint, expired: bool, now: u64) -> Known {
    Known::Record(Record {
        fingerprint: body,
        state: RecordState::Completed {
            response: SavedResponse::new(201, vec![], b"saved".to_vec()).expect("small response"),
            completed_by: by,
        },
        created_at_ms: now - 2 * OFFSET_MS,
        expires_at_ms: if expired { now - OFFSET_MS } else { now + 10 * OFFSET_MS },
    })
}

/// Writes `known` under (`caller`, `key`), which has nothing yet.
async fn set_up<E: Engine>(store: &FdbStore<E>, caller: &CallerId, key: &IdempotencyKey, known: &Known, now: u64) {
    let slot = &store.layout().slot(caller, key.digest());
    store
        .engine()
        .run(RunOptions::default(), |tx, _| async move {
            let existing = store.read_existing(&tx, slot, now).await?;
            match known {
                Known::Nothing => {}
                Known::Tombstone => tx.set(&slot.tombstone_key, &(now + OFFSET_MS).to_be_bytes())?,
                Known::Record(record) => {
                    store.apply(&tx, slot, &existing, Write::Put(record.clone())).await?;
                }
            }
            Ok(())
        })
        .await
        .expect("set up the key");
}

/// The machine's claims one after the other, at `now`: each claim's outcome
/// and each key's state at the end.
fn machine_in_order(
    mut keys: Vec<Known>,
    claims: &[(usize, ClaimRequest)],
    now: u64,
) -> (Vec<ClaimOutcome>, Vec<Known>) {
    let policy = policy();
    let mut outcomes = Vec::new();
    for (index, request) in claims {
        let step = machine::claim(keys[*index].found(), request, now, &policy);
        match step.write {
            Write::Nothing => {}
            Write::Put(record) => keys[*index] = Known::Record(record),
            Write::Delete => keys[*index] = Known::Nothing,
        }
        outcomes.push(step.outcome);
    }
    (outcomes, keys)
}

/// The outcome with its lease's key replaced: the one difference allowed
/// between two keys' claims.
fn renamed(outcome: ClaimOutcome, key: &IdempotencyKey) -> ClaimOutcome {
    match outcome {
        ClaimOutcome::Acquired(mut acquired) => {
            acquired.lease.key = key.clone();
            ClaimOutcome::Acquired(acquired)
        }
        other => other,
    }
}

// ---- Behaviours ---------------------------------------------------------------

/// Claims of distinct new keys in one batch: one transaction, every claim
/// acquired with its own lease, every record holding its own token.
pub async fn claims_of_distinct_keys_in_one_batch_commit_in_one_transaction<E: Engine>(test: TestEngine<E>) {
    let store = test.observed().store(policy());
    let caller = caller("batch-distinct");
    let keys = fresh_keys("distinct", 32);
    let requests: Vec<ClaimRequest> = (0..keys.len())
        .map(|index| claim_of(&caller, &keys[index], LeaseToken(index as u128 + 1), BODY))
        .collect();
    let runs_before = store.engine().counters().runs.load(Ordering::SeqCst);
    let results = claim_in_one_batch(&store, &requests).await;
    let runs = store.engine().counters().runs.load(Ordering::SeqCst) - runs_before;
    assert_eq!(runs, 1, "one transaction for the whole batch");
    for ((_, outcome), request) in results.iter().zip(&requests) {
        let acquired = acquired(outcome);
        assert_eq!(acquired.lease.token, request.token, "each claim gets its own lease");
        assert_eq!(acquired.lease.key, request.key);
        assert!(!acquired.takeover && !acquired.late_key);
    }
    assert!(results.iter().all(|(batched, _)| *batched == "decided"));
    for request in &requests {
        let record = store
            .inspect(&caller, &request.key)
            .await
            .expect("inspect")
            .expect("record");
        assert!(
            matches!(record.state, RecordState::Started { lease, .. } if lease.token == request.token),
            "the record of {:?} holds its own claim's token",
            request.key
        );
    }
}

/// Claims at once through the store's `claim`, batched as they happen to
/// arrive: claims of distinct keys share transactions (batches form while
/// others are in flight) and are all acquired; many claims of a few keys
/// acquire each key exactly once, its other claims answered in progress,
/// as the same claims one after the other would be.
pub async fn concurrent_claims_share_transactions_and_acquire_each_key_once<E: Engine>(test: TestEngine<E>) {
    const DISTINCT_KEYS: usize = 64;
    const REPEATED_KEYS: usize = 8;
    const ATTEMPTS_PER_KEY: usize = 8;
    let engine = ObservedEngine::new(test.engine, TestTime::Wall);
    engine.delay_reads(CONCURRENT_READ_DELAY_MS);
    let store = Arc::new(FdbStore::new(engine, &test.prefix, policy()).with_clock(test.clock.clone()));
    let caller = caller("batch-concurrent");

    let requests: Vec<ClaimRequest> = fresh_keys("distinct", DISTINCT_KEYS)
        .iter()
        .map(|key| claim_of(&caller, key, HOLDER, BODY))
        .collect();
    let runs_before = store.engine().counters().runs.load(Ordering::SeqCst);
    let acquired_per_key = claim_concurrently(&store, requests).await;
    let runs = store.engine().counters().runs.load(Ordering::SeqCst) - runs_before;
    assert_eq!(acquired_per_key.len(), DISTINCT_KEYS, "every key acquired");
    let claims = DISTINCT_KEYS as u64;
    assert!(
        runs <= claims / 4,
        "{claims} claims took {runs} transactions: they were not batched"
    );

    let keys = fresh_keys("repeated", REPEATED_KEYS);
    let requests: Vec<ClaimRequest> = (0..ATTEMPTS_PER_KEY)
        .flat_map(|attempt| {
            let token = LeaseToken(attempt as u128 + 1);
            keys.iter().map(move |key| (key.clone(), token))
        })
        .map(|(key, token)| claim_of(&caller, &key, token, BODY))
        .collect();
    let acquired_per_key = claim_concurrently(&store, requests).await;
    assert_eq!(acquired_per_key.len(), REPEATED_KEYS, "every key acquired");
    assert!(
        acquired_per_key.values().all(|&count| count == 1),
        "{acquired_per_key:?}"
    );
}

/// Sends every claim at once, each in a task of its own; how many times
/// each key was acquired (every other claim must be in progress).
async fn claim_concurrently<E: Engine>(
    store: &Arc<FdbStore<E>>,
    requests: Vec<ClaimRequest>,
) -> HashMap<IdempotencyKey, usize> {
    let tasks: Vec<_> = requests
        .into_iter()
        .map(|request| {
            let store = Arc::clone(store);
            tokio::spawn(async move { (request.key.clone(), store.claim(&request).await) })
        })
        .collect();
    let mut acquired_per_key: HashMap<IdempotencyKey, usize> = HashMap::new();
    for task in tasks {
        let (key, outcome) = task.await.expect("claim task");
        match outcome.expect("claim") {
            ClaimOutcome::Acquired(_) => *acquired_per_key.entry(key).or_default() += 1,
            ClaimOutcome::InProgress { .. } => {}
            other => panic!("a live lease answers in progress, not {other:?}"),
        }
    }
    acquired_per_key
}

/// A key's second claim in one batch goes alone after the batch, and
/// answers what it answers after the first claim alone: another attempt is
/// in progress, the same attempt re-sent gets its lease back, another body
/// is a mismatch.
pub async fn the_same_key_twice_in_one_batch_answers_as_two_claims_one_after_the_other<E: Engine>(test: TestEngine<E>) {
    let store = test.store(policy());
    let caller = caller("batch-twice");
    for (second_token, second_body) in [(OTHER, BODY), (HOLDER, BODY), (OTHER, OTHER_BODY)] {
        let (in_batch, in_turn) = (fresh_key("in-batch"), fresh_key("in-turn"));
        let batch = [
            claim_of(&caller, &in_batch, HOLDER, BODY),
            claim_of(&caller, &in_batch, second_token, second_body),
        ];
        let results = claim_in_one_batch(&store, &batch).await;
        assert_eq!(
            results.iter().map(|(batched, _)| *batched).collect::<Vec<_>>(),
            ["decided", "alone"],
            "the repeated key stays out of the transaction"
        );
        let first = store.claim(&claim_of(&caller, &in_turn, HOLDER, BODY)).await;
        let second = store
            .claim(&claim_of(&caller, &in_turn, second_token, second_body))
            .await;
        for ((_, batched), alone) in results.into_iter().zip([first, second]) {
            let batched = renamed(batched.expect("claim in the batch"), &in_turn);
            assert_eq!(
                batched,
                alone.expect("claim alone"),
                "{second_token:?}, {second_body:?}"
            );
        }
    }
}

/// One batch over keys in every state: each claim gets its own key's answer
/// (a new key acquired, a completed one replayed, a live lease in progress,
/// an expired lease taken over with its recovery point, a tombstoned key
/// acquired as late, another body a mismatch), all in the one transaction.
pub async fn a_batch_decides_each_claim_on_its_own_record<E: Engine>(test: TestEngine<E>) {
    let store = test.observed().store(policy());
    let caller = caller("batch-mixed");
    let now = store.clock().now_ms();
    let point = RecoveryPoint::new(b"half done".to_vec()).expect("small recovery point");
    let states = [
        Known::Nothing,
        completed(OTHER, BODY, false, now),
        started(OTHER, true, None, BODY, now),
        started(OTHER, false, Some(point.clone()), BODY, now),
        Known::Tombstone,
        completed(OTHER, OTHER_BODY, false, now),
        completed(OTHER, BODY, true, now),
    ];
    let keys = fresh_keys("mixed", states.len());
    for (key, state) in keys.iter().zip(&states) {
        set_up(&store, &caller, key, state, now).await;
    }
    let requests: Vec<ClaimRequest> = keys.iter().map(|key| claim_of(&caller, key, HOLDER, BODY)).collect();
    let runs_before = store.engine().counters().runs.load(Ordering::SeqCst);
    let results = claim_in_one_batch(&store, &requests).await;
    let runs = store.engine().counters().runs.load(Ordering::SeqCst) - runs_before;
    assert_eq!(runs, 1, "one transaction decided them all");
    assert_eq!(
        kinds(&results),
        [
            ("decided", "acquired"),
            ("decided", "replay"),
            ("decided", "in_progress"),
            ("decided", "acquired"),
            ("decided", "acquired"),
            ("decided", "mismatch"),
            ("decided", "acquired"),
        ]
    );
    let takeover = acquired(&results[3].1);
    assert!(takeover.takeover && takeover.recovery_point == Some(point));
    assert!(acquired(&results[4].1).late_key, "a tombstoned key is a late key");
    assert!(acquired(&results[6].1).late_key, "an expired record is a late key");
    assert!(!acquired(&results[0].1).late_key && !acquired(&results[0].1).takeover);
}

/// A record that does not decode fails its own claim, with the error the
/// claim gets alone, while the batch's other claims commit.
pub async fn an_unreadable_record_fails_only_its_own_claim_in_a_batch<E: Engine>(test: TestEngine<E>) {
    let store = test.observed().store(policy());
    let caller = caller("batch-unreadable");
    let keys = fresh_keys("unreadable", 3);
    overwrite_with_unreadable_bytes(&store, &caller, keys[1].digest()).await;
    let requests: Vec<ClaimRequest> = keys.iter().map(|key| claim_of(&caller, key, HOLDER, BODY)).collect();
    let runs_before = store.engine().counters().runs.load(Ordering::SeqCst);
    let results = claim_in_one_batch(&store, &requests).await;
    let runs = store.engine().counters().runs.load(Ordering::SeqCst) - runs_before;
    assert_eq!(runs, 1, "the unreadable record did not end the transaction");
    assert_eq!(
        kinds(&results),
        [("decided", "acquired"), ("failed", "error"), ("decided", "acquired")]
    );
    assert!(
        matches!(results[1].1, Err(StoreError::Corrupt(_))),
        "{:?}",
        results[1].1
    );
    let alone = store.claim(&requests[1]).await;
    assert!(matches!(alone, Err(StoreError::Corrupt(_))), "alone too: {alone:?}");
    for index in [0, 2] {
        let record = store.inspect(&caller, &keys[index]).await.expect("inspect");
        assert!(record.is_some(), "the claim of key {index} committed");
    }
}

/// A conflict runs the whole batch again, which then commits every claim;
/// a batch whose transaction keeps conflicting until the retry limit sends
/// every claim alone, where each is decided as it would have been.
pub async fn a_conflict_runs_the_batch_again_and_a_failed_batch_sends_each_claim_alone<E: Engine>(test: TestEngine<E>) {
    const ATTEMPTS: u32 = 3;
    let run_options = RunOptions {
        retry_limit: ATTEMPTS,
        ..RunOptions::default()
    };
    let store = test.observed().store(policy()).with_run_options(run_options);
    let counters = || {
        let counters = store.engine().counters();
        (
            counters.runs.load(Ordering::SeqCst),
            counters.attempts.load(Ordering::SeqCst),
        )
    };
    let caller = caller("batch-conflict");

    let keys = fresh_keys("conflict-once", 3);
    let requests: Vec<ClaimRequest> = keys.iter().map(|key| claim_of(&caller, key, HOLDER, BODY)).collect();
    let before = counters();
    store.engine().inject_conflicts(1);
    let results = claim_in_one_batch(&store, &requests).await;
    let after = counters();
    assert_eq!(
        (after.0 - before.0, after.1 - before.1),
        (1, 2),
        "one run, attempted twice"
    );
    assert_eq!(kinds(&results), [("decided", "acquired"); 3]);

    let keys = fresh_keys("conflict-always", 3);
    let requests: Vec<ClaimRequest> = keys.iter().map(|key| claim_of(&caller, key, HOLDER, BODY)).collect();
    let before = counters();
    store.engine().inject_conflicts(ATTEMPTS);
    let results = claim_in_one_batch(&store, &requests).await;
    let after = counters();
    assert_eq!(
        (after.0 - before.0, after.1 - before.1),
        (1 + 3, u64::from(ATTEMPTS) + 3),
        "the batch's run used up its attempts, then each claim ran alone"
    );
    assert_eq!(kinds(&results), [("alone", "acquired"); 3]);
    for ((_, outcome), request) in results.iter().zip(&requests) {
        assert_eq!(acquired(outcome).lease.token, request.token);
    }
}

/// An engine that did not answer the batch (here: its commit failed as
/// unavailable) fails every claim of the batch as unavailable, retryable,
/// as each claim alone would have failed, and nothing was written: the
/// same claims, sent again, acquire their keys.
pub async fn a_batch_the_engine_does_not_answer_fails_each_claim_as_unavailable<E: Engine>(test: TestEngine<E>) {
    let store = test.observed().store(policy());
    let caller = caller("batch-unavailable");
    let keys = fresh_keys("unavailable", 3);
    let requests: Vec<ClaimRequest> = keys.iter().map(|key| claim_of(&caller, key, HOLDER, BODY)).collect();
    let records = store.layout().records().bytes().to_vec();
    store.engine().fail_commits_writing(Some(records));
    let results = claim_in_one_batch(&store, &requests).await;
    let alone = store.claim(&claim_of(&caller, &fresh_key("alone"), HOLDER, BODY)).await;
    store.engine().fail_commits_writing(None);
    assert_eq!(kinds(&results), [("failed", "error"); 3]);
    for (_, outcome) in &results {
        let error = outcome.as_ref().expect_err("unavailable");
        assert!(
            matches!(error, StoreError::Unavailable { .. }) && error.is_retryable(),
            "{error}"
        );
    }
    assert!(
        matches!(alone, Err(StoreError::Unavailable { .. })),
        "alone too: {alone:?}"
    );
    for key in &keys {
        assert_eq!(
            store.inspect(&caller, key).await.expect("inspect"),
            None,
            "nothing committed"
        );
    }
    let again = claim_in_one_batch(&store, &requests).await;
    assert_eq!(kinds(&again), [("decided", "acquired"); 3]);
}

/// A full batch of the largest claims, takeovers that each carry the
/// largest recovery point, commits in one transaction: the batch bound
/// keeps a batch within FoundationDB's transaction size.
pub async fn a_full_batch_of_the_largest_claims_commits_in_one_transaction<E: Engine>(test: TestEngine<E>) {
    let store = test.observed().store(policy());
    let caller = caller("batch-largest");
    let now = store.clock().now_ms();
    let point = RecoveryPoint::new(vec![7; RECOVERY_POINT_BYTES_MAX]).expect("the largest recovery point");
    let keys = fresh_keys("largest", CLAIM_BATCH_ITEMS_MAX);
    for key in &keys {
        set_up(
            &store,
            &caller,
            key,
            &started(OTHER, false, Some(point.clone()), BODY, now),
            now,
        )
        .await;
    }
    let requests: Vec<ClaimRequest> = keys.iter().map(|key| claim_of(&caller, key, HOLDER, BODY)).collect();
    let runs_before = store.engine().counters().runs.load(Ordering::SeqCst);
    let results = claim_in_one_batch(&store, &requests).await;
    let runs = store.engine().counters().runs.load(Ordering::SeqCst) - runs_before;
    assert_eq!(runs, 1, "the whole batch in one transaction");
    for (batched, outcome) in &results {
        assert_eq!(*batched, "decided");
        let acquired = acquired(outcome);
        assert!(acquired.takeover && acquired.recovery_point.as_ref() == Some(&point));
    }
}

/// Random batches of claims over a few keys in random states (keys
/// repeated, tokens and bodies shared or not): every claim's outcome and
/// every key's record are the machine's with the claims applied one after
/// the other in the batch's order, and a key's later claims went alone.
pub async fn claim_batches_agree_with_the_machine_claim_by_claim<E: Engine>(test: TestEngine<E>) {
    let cases = std::env::var("IDEM_CLAIM_BATCH_CASES")
        .ok()
        .map_or(RANDOM_CASES_DEFAULT, |text| text.parse().expect("a whole number"));
    let seed = std::env::var("IDEM_CLAIM_BATCH_SEED")
        .ok()
        .map_or_else(rand::random, |text| text.parse().expect("a whole number"));
    eprintln!("claim batches: seed {seed} (replay with IDEM_CLAIM_BATCH_SEED={seed})");
    let mut rng = StdRng::seed_from_u64(seed);
    let store = test.store(policy());
    for case in 0..cases {
        run_random_case(&store, &mut rng, &format!("seed {seed}, case {case}")).await;
    }
}

fn random_token(rng: &mut StdRng) -> LeaseToken {
    [HOLDER, OTHER, THIRD][rng.random_range(0..3)]
}

fn random_body(rng: &mut StdRng) -> Fingerprint {
    if rng.random_bool(0.8) { BODY } else { OTHER_BODY }
}

fn random_known(rng: &mut StdRng, now: u64) -> Known {
    match rng.random_range(0..5) {
        0 => Known::Nothing,
        1 => Known::Tombstone,
        2 => {
            let point = rng
                .random_bool(0.5)
                .then(|| RecoveryPoint::new(b"point".to_vec()).expect("small recovery point"));
            let (holder, lease_live, body) = (random_token(rng), rng.random_bool(0.5), random_body(rng));
            started(holder, lease_live, point, body, now)
        }
        3 => completed(random_token(rng), random_body(rng), rng.random_bool(0.2), now),
        _ => {
            // A started record past its retention: absent, a late key.
            let Known::Record(mut record) = started(random_token(rng), false, None, BODY, now) else {
                unreachable!("started makes a record");
            };
            record.expires_at_ms = now - 1;
            Known::Record(record)
        }
    }
}

async fn run_random_case<E: Engine>(store: &FdbStore<E>, rng: &mut StdRng, case: &str) {
    let now = store.clock().now_ms();
    let caller = caller("batch-random");
    let keys = fresh_keys("random", RANDOM_CASE_KEYS);
    let initial: Vec<Known> = (0..RANDOM_CASE_KEYS).map(|_| random_known(rng, now)).collect();
    for (key, known) in keys.iter().zip(&initial) {
        set_up(store, &caller, key, known, now).await;
    }
    let claims: Vec<(usize, ClaimRequest)> = (0..rng.random_range(1..=RANDOM_CASE_CLAIMS_MAX))
        .map(|_| {
            let index = rng.random_range(0..RANDOM_CASE_KEYS);
            (
                index,
                claim_of(&caller, &keys[index], random_token(rng), random_body(rng)),
            )
        })
        .collect();
    let requests: Vec<ClaimRequest> = claims.iter().map(|(_, request)| request.clone()).collect();
    let results = claim_in_one_batch(store, &requests).await;
    assert_eq!(now, store.clock().now_ms(), "the clock stood still");
    let (expected, expected_keys) = machine_in_order(initial.clone(), &claims, now);
    let what = |index: usize| format!("{case}: {initial:?} then the batch {claims:?}: claim {index}");
    for (index, ((batched, outcome), expected)) in results.into_iter().zip(expected).enumerate() {
        let repeats_a_key = claims[..index].iter().any(|(earlier, _)| *earlier == claims[index].0);
        if repeats_a_key {
            assert_eq!(batched, "alone", "{}: a repeated key goes alone", what(index));
        }
        assert_eq!(outcome.expect("claim"), expected, "{}", what(index));
    }
    for (index, key) in keys.iter().enumerate() {
        let record = store.inspect(&caller, key).await.expect("inspect");
        assert_eq!(
            record,
            expected_keys[index].record(),
            "{case}: the record of key {index}"
        );
    }
}
