//! The store's one-statement transitions against store-core's state machine.
//!
//! `src/one_statement.rs` makes the common case of each transition in one
//! SQL statement whose guard decides whether it writes. This test puts a
//! random record (or a tombstone, or nothing) in the table, runs one random
//! transition through the store, and runs the machine on the same record:
//! the outcome and the row left behind must be the machine's. For
//! `complete_with_row` (a completion and one effect row in one statement),
//! the effect's row may already be there, and the effect table must hold the
//! row exactly when the machine completes the record or it was there before. Times come from
//! the database's clock, read before and after the call; every time the store
//! wrote or reported must lie between what the machine gives at those two
//! instants, and everything else must be equal. The records' times sit a
//! minute away from the clock, so no decision depends on which instant
//! within the call the statement ran at. Each case runs on a store that
//! batches claims (a lone claim is a batch of one) or on one that does not.
//!
//! Claim batches (`src/claim_batch.rs`) get the same treatment: random keys in
//! random states, a random batch of claims over them (keys repeat), put into
//! one batch by the testkit; every claim's outcome and every key's row must
//! be the machine's with the claims applied one after the other in the
//! batch's order.

mod common;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use store_core::machine::{self, Found, Step, Write};
use store_core::{
    CallerId, ClaimOutcome, ClaimRequest, Fenced, Fingerprint, HeldLease, IdempotencyKey, IdempotencyStore, Lease,
    LeaseToken, Policy, Record, RecordState, RecoveryPoint, SavedResponse,
};
use store_postgres::testkit::{
    BatchCompletion, TestDatabase, claim_in_one_batch, complete_in_one_batch, complete_with_rows_in_one_batch,
};
use store_postgres::{
    BatchedClaim, Migration, OwnedRowEffect, PostgresConfig, PostgresStore, ROW_EFFECT_FIRST_PARAMETER, RowCompletion,
    RowEffect,
};
use tokio_postgres::Client;
use uuid::Uuid;

/// Cases per run: each is four or five round trips to a local server.
const CASES: u32 = 96;
/// How far from the clock every record's times are.
const OFFSET_MS: u64 = 60_000;
const HOLDER: LeaseToken = LeaseToken(0xA);
const OTHER: LeaseToken = LeaseToken(0xB);

#[derive(Debug, Clone)]
enum Initial {
    Nothing,
    Tombstone,
    Started {
        holder: LeaseToken,
        lease_live: bool,
        point: bool,
        expired: bool,
        same_body: bool,
    },
    Completed {
        by: LeaseToken,
        expired: bool,
        same_body: bool,
        /// Its response in the four columns a row written before migration
        /// 0005 has, instead of deflated in `response`.
        earlier_columns: bool,
    },
}

#[derive(Debug, Clone)]
enum Transition {
    Claim {
        token: LeaseToken,
    },
    Checkpoint,
    Complete,
    Release,
    Abandon,
    /// A completion with one effect row, which may already be there.
    CompleteWithRow {
        row_there: bool,
    },
}

/// The effect table of `CompleteWithRow`: one row per key.
const EFFECT_ROWS: Migration = Migration {
    namespace: "differential",
    version: 1,
    name: "effect_rows",
    sql: "CREATE TABLE differential_effect_rows (key_name text PRIMARY KEY, made_by text NOT NULL)",
};

fn token() -> impl Strategy<Value = LeaseToken> {
    prop_oneof![Just(HOLDER), Just(OTHER)]
}

fn initial() -> impl Strategy<Value = Initial> {
    prop_oneof![
        Just(Initial::Nothing),
        Just(Initial::Tombstone),
        (token(), any::<bool>(), any::<bool>(), any::<bool>(), any::<bool>()).prop_map(
            |(holder, lease_live, point, expired, same_body)| Initial::Started {
                holder,
                lease_live,
                point,
                expired,
                same_body
            }
        ),
        (token(), any::<bool>(), any::<bool>(), any::<bool>()).prop_map(|(by, expired, same_body, earlier_columns)| {
            Initial::Completed {
                by,
                expired,
                same_body,
                earlier_columns,
            }
        }),
    ]
}

fn transition() -> impl Strategy<Value = Transition> {
    prop_oneof![
        token().prop_map(|token| Transition::Claim { token }),
        Just(Transition::Checkpoint),
        Just(Transition::Complete),
        Just(Transition::Release),
        Just(Transition::Abandon),
        any::<bool>().prop_map(|row_there| Transition::CompleteWithRow { row_there }),
    ]
}

fn policy() -> Policy {
    Policy::new(30_000, 600_000, 3_600_000).expect("valid policy")
}

fn fingerprint(same_body: bool) -> Fingerprint {
    Fingerprint([if same_body { 1 } else { 2 }; 32])
}

fn saved(tag: &str) -> SavedResponse {
    SavedResponse::new(201, vec![("etag".into(), tag.into())], tag.as_bytes().to_vec()).expect("valid response")
}

fn point() -> RecoveryPoint {
    RecoveryPoint::new(b"carrier-call-sent".to_vec()).expect("valid point")
}

/// The record `initial` describes, with times a minute from `now_ms`.
fn record_of(initial: &Initial, now_ms: u64) -> Option<Record> {
    let around = |later: bool| if later { now_ms + OFFSET_MS } else { now_ms - OFFSET_MS };
    let (state, expired, same_body) = match initial {
        Initial::Nothing | Initial::Tombstone => return None,
        Initial::Started {
            holder,
            lease_live,
            point: with_point,
            expired,
            same_body,
        } => {
            let lease = Lease {
                token: *holder,
                locked_until_ms: around(*lease_live),
            };
            let recovery_point = with_point.then(point);
            (RecordState::Started { lease, recovery_point }, *expired, *same_body)
        }
        Initial::Completed {
            by, expired, same_body, ..
        } => (
            RecordState::Completed {
                response: saved("first"),
                completed_by: *by,
            },
            *expired,
            *same_body,
        ),
    };
    Some(Record {
        fingerprint: fingerprint(same_body),
        state,
        created_at_ms: now_ms - 2 * OFFSET_MS,
        expires_at_ms: around(!expired),
    })
}

async fn database_now_ms(client: &Client) -> u64 {
    let row = client
        .query_one(
            "SELECT (extract(epoch FROM date_trunc('milliseconds', now())) * 1000)::bigint",
            &[],
        )
        .await
        .expect("read the clock");
    u64::try_from(row.get::<_, i64>(0)).expect("a clock after 1970")
}

fn timestamp(ms: u64) -> std::time::SystemTime {
    std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms)
}

/// Writes `record` the way another client would, column by column: a
/// completed one's response deflated in `response`, or, for `initial`s
/// that say so, in the four columns of a row written before migration 0005.
async fn insert_raw(client: &Client, caller: &CallerId, key: &IdempotencyKey, record: &Record, initial: &Initial) {
    let earlier_columns = matches!(
        initial,
        Initial::Completed {
            earlier_columns: true,
            ..
        }
    );
    let (state, locked_until, token, point, response, completed_by) = match &record.state {
        RecordState::Started { lease, recovery_point } => (
            "started",
            Some(timestamp(lease.locked_until_ms)),
            Some(Uuid::from_u128(lease.token.0)),
            recovery_point.as_ref().map(|point| point.as_bytes().to_vec()),
            None,
            None,
        ),
        RecordState::Completed { response, completed_by } => (
            "completed",
            None,
            None,
            None,
            Some(response),
            Some(Uuid::from_u128(completed_by.0)),
        ),
    };
    let deflated = response
        .filter(|_| !earlier_columns)
        .map(store_core::encode_response_deflated);
    let earlier = response.filter(|_| earlier_columns);
    let status = earlier.map(|response| i32::from(response.status()));
    let names = earlier.map(|response| {
        response
            .headers()
            .iter()
            .map(|(name, _)| name.clone())
            .collect::<Vec<_>>()
    });
    let values = earlier.map(|response| {
        response
            .headers()
            .iter()
            .map(|(_, value)| value.clone())
            .collect::<Vec<_>>()
    });
    let body = earlier.map(|response| response.body().to_vec());
    client
        .execute(
            "INSERT INTO idempotency_keys (caller_id, idem_key, request_hash, state, locked_until, lease_token, \
             recovery_point, response, completed_by, created_at, expires_at, response_status, \
             response_header_names, response_header_values, response_body) \
             VALUES ($1, $2, $3, $4::text::idempotency_state, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)",
            &[
                &caller.as_str(),
                &key.digest().0.as_slice(),
                &record.fingerprint.0.as_slice(),
                &state,
                &locked_until,
                &token,
                &point,
                &deflated,
                &completed_by,
                &timestamp(record.created_at_ms),
                &timestamp(record.expires_at_ms),
                &status,
                &names,
                &values,
                &body,
            ],
        )
        .await
        .expect("insert the initial record");
}

async fn insert_tombstone(client: &Client, caller: &CallerId, key: &IdempotencyKey, now_ms: u64) {
    client
        .execute(
            "INSERT INTO idempotency_tombstones (caller_id, idem_key, expires_at) VALUES ($1, $2, $3)",
            &[
                &caller.as_str(),
                &key.digest().0.as_slice(),
                &timestamp(now_ms + OFFSET_MS),
            ],
        )
        .await
        .expect("insert a tombstone");
}

/// What a transition reports, in one type for both claim and fenced writes.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Reported {
    Claim(ClaimOutcome),
    Fenced(Fenced),
    Row(RowCompletion),
}

/// The machine's step for `transition` at `now_ms`, and the row it leaves.
fn machine_run(
    found: Found<'_>,
    transition: &Transition,
    request: &ClaimRequest,
    now_ms: u64,
) -> (Reported, Option<Record>) {
    let policy = policy();
    let before = match found {
        Found::Record(record) => Some(record.clone()),
        _ => None,
    };
    let fenced = |step: Step<Fenced>| (Reported::Fenced(step.outcome), step.write);
    let (reported, write) = match transition {
        Transition::Claim { .. } => {
            let step = machine::claim(found, request, now_ms, &policy);
            (Reported::Claim(step.outcome), step.write)
        }
        Transition::Checkpoint => fenced(machine::checkpoint(found, HOLDER, point(), now_ms)),
        Transition::Complete => fenced(machine::complete(found, HOLDER, saved("second"), now_ms, &policy)),
        Transition::Release => fenced(machine::release(found, HOLDER, now_ms)),
        Transition::Abandon => fenced(machine::abandon(found, HOLDER, now_ms)),
        // One statement only completes a record this lease holds, and only
        // with a new row; everything else is left to the locked path.
        Transition::CompleteWithRow { row_there } => {
            let held = matches!(
                machine::completion_fence(found, HOLDER, now_ms),
                machine::CompletionFence::Held
            );
            if held && !row_there {
                let step = machine::complete(found, HOLDER, saved("second"), now_ms, &policy);
                assert_eq!(step.outcome, Fenced::Applied(()));
                (Reported::Row(RowCompletion::Committed), step.write)
            } else {
                (Reported::Row(RowCompletion::Undecided), Write::Nothing)
            }
        }
    };
    let after = match write {
        Write::Nothing => before,
        Write::Put(record) => Some(record),
        Write::Delete => None,
    };
    (reported, after)
}

/// Every time a value carries, and the value with those times set to zero.
trait Times: Sized {
    fn times(&self) -> Vec<u64>;
    fn without_times(&self) -> Self;
}

impl Times for Record {
    fn times(&self) -> Vec<u64> {
        let mut times = vec![self.created_at_ms, self.expires_at_ms];
        if let RecordState::Started { lease, .. } = &self.state {
            times.push(lease.locked_until_ms);
        }
        times
    }

    fn without_times(&self) -> Self {
        let mut record = self.clone();
        record.created_at_ms = 0;
        record.expires_at_ms = 0;
        if let RecordState::Started { lease, .. } = &mut record.state {
            lease.locked_until_ms = 0;
        }
        record
    }
}

impl Times for Reported {
    fn times(&self) -> Vec<u64> {
        match self {
            Reported::Claim(ClaimOutcome::Acquired(acquired)) => vec![acquired.lease.locked_until_ms],
            Reported::Claim(ClaimOutcome::InProgress { retry_after_ms }) => vec![*retry_after_ms],
            _ => Vec::new(),
        }
    }

    fn without_times(&self) -> Self {
        let mut reported = self.clone();
        match &mut reported {
            Reported::Claim(ClaimOutcome::Acquired(acquired)) => acquired.lease.locked_until_ms = 0,
            Reported::Claim(ClaimOutcome::InProgress { retry_after_ms }) => *retry_after_ms = 0,
            _ => {}
        }
        reported
    }
}

impl<T: Times> Times for Option<T> {
    fn times(&self) -> Vec<u64> {
        self.as_ref().map(Times::times).unwrap_or_default()
    }

    fn without_times(&self) -> Self {
        self.as_ref().map(Times::without_times)
    }
}

/// `actual` equals the machine's value at both instants but for its times,
/// and each time lies between the machine's two.
fn agrees<T: Times + PartialEq + std::fmt::Debug>(actual: &T, early: &T, late: &T, what: &str) {
    assert_eq!(
        actual.without_times(),
        early.without_times(),
        "{what}: differs from the machine"
    );
    assert_eq!(
        early.without_times(),
        late.without_times(),
        "{what}: the machine's decision moved with the clock"
    );
    let (actual, early, late) = (actual.times(), early.times(), late.times());
    for ((actual, early), late) in actual.iter().zip(&early).zip(&late) {
        let (low, high) = (early.min(late), early.max(late));
        assert!(
            low <= actual && actual <= high,
            "{what}: time {actual} outside {low}..={high}"
        );
    }
}

async fn run_case(store: &store_postgres::PostgresStore, client: &Client, initial: Initial, transition: Transition) {
    let caller = CallerId::new("differential").expect("valid caller");
    let key = IdempotencyKey::new(&format!("case-{:032x}", rand::random::<u128>())).expect("valid key");
    let token = match transition {
        Transition::Claim { token } => token,
        _ => HOLDER,
    };
    let request = ClaimRequest {
        caller: caller.clone(),
        key: key.clone(),
        fingerprint: fingerprint(true),
        token,
    };
    let setup_now_ms = database_now_ms(client).await;
    let record = record_of(&initial, setup_now_ms);
    match (&initial, &record) {
        (Initial::Tombstone, _) => insert_tombstone(client, &caller, &key, setup_now_ms).await,
        (_, Some(record)) => insert_raw(client, &caller, &key, record, &initial).await,
        _ => {}
    }
    let found = match (&initial, &record) {
        (Initial::Tombstone, _) => Found::Tombstone,
        (_, record) => Found::from_record(record.as_ref()),
    };
    let before_ms = database_now_ms(client).await;
    let lease = HeldLease {
        caller: caller.clone(),
        key: key.clone(),
        token: HOLDER,
        locked_until_ms: 0,
    };
    let reported = match &transition {
        Transition::Claim { .. } => Reported::Claim(store.claim(&request).await.expect("claim")),
        Transition::Checkpoint => Reported::Fenced(store.checkpoint(&lease, point()).await.expect("checkpoint")),
        Transition::Complete => Reported::Fenced(store.complete(&lease, saved("second")).await.expect("complete")),
        Transition::Release => Reported::Fenced(store.release(&lease).await.expect("release")),
        Transition::Abandon => Reported::Fenced(store.abandon(&lease).await.expect("abandon")),
        Transition::CompleteWithRow { row_there } => {
            if *row_there {
                insert_effect_row(client, &key, "another key").await;
            }
            Reported::Row(complete_with_row(store, &lease, &key).await)
        }
    };
    let after_ms = database_now_ms(client).await;
    let row = store.inspect(&caller, &key).await.expect("inspect");
    let (early_reported, early_row) = machine_run(found, &transition, &request, before_ms);
    let (late_reported, late_row) = machine_run(found, &transition, &request, after_ms);
    let what = format!("{initial:?} then {transition:?}");
    agrees(&reported, &early_reported, &late_reported, &format!("{what}: outcome"));
    agrees(&row, &early_row, &late_row, &format!("{what}: row"));
    if let Transition::CompleteWithRow { row_there } = transition {
        let expected = match (row_there, &reported) {
            (true, _) => Some("another key".to_owned()),
            (false, Reported::Row(RowCompletion::Committed)) => Some("this key".to_owned()),
            (false, _) => None,
        };
        assert_eq!(effect_row(client, &key).await, expected, "{what}: effect row");
    }
}

async fn complete_with_row(
    store: &store_postgres::PostgresStore,
    lease: &HeldLease,
    key: &IdempotencyKey,
) -> RowCompletion {
    assert_eq!(ROW_EFFECT_FIRST_PARAMETER, 6);
    let key_name = key.as_str();
    let row = RowEffect {
        into: "differential_effect_rows (key_name, made_by)",
        values: "$6::text, 'this key'",
        params: &[&key_name],
    };
    store
        .complete_with_row(lease, &saved("second"), row)
        .await
        .expect("complete with row")
}

async fn insert_effect_row(client: &Client, key: &IdempotencyKey, made_by: &str) {
    client
        .execute(
            "INSERT INTO differential_effect_rows (key_name, made_by) VALUES ($1, $2)",
            &[&key.as_str(), &made_by],
        )
        .await
        .expect("insert the effect row");
}

async fn effect_row(client: &Client, key: &IdempotencyKey) -> Option<String> {
    client
        .query_opt(
            "SELECT made_by FROM differential_effect_rows WHERE key_name = $1",
            &[&key.as_str()],
        )
        .await
        .expect("read the effect row")
        .map(|row| row.get(0))
}

/// Two stores over one migrated database: claims batched (the default,
/// where a lone claim is a batch of one) and not (`batch_items_max = 1`,
/// every claim its own one-key statement).
async fn batched_and_unbatched_stores() -> (PostgresStore, PostgresStore, Client, TestDatabase) {
    let database = common::fresh_database().await;
    let batched = database
        .migrated_store(policy(), &[EFFECT_ROWS])
        .await
        .expect("migrated store");
    let unbatched_config = PostgresConfig {
        batch_items_max: 1,
        ..database.config()
    };
    let unbatched = PostgresStore::new(&unbatched_config, policy()).expect("store without batching");
    let client = common::raw_client(&database.url).await;
    (batched, unbatched, client, database)
}

#[test]
fn one_statement_transitions_agree_with_the_state_machine() {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let (batched, unbatched, client, _database) = runtime.block_on(batched_and_unbatched_stores());
    let mut runner = TestRunner::new(Config {
        cases: CASES,
        ..Config::default()
    });
    runner
        .run(
            &(initial(), transition(), any::<bool>()),
            |(initial, transition, batching)| {
                let store = if batching { &batched } else { &unbatched };
                runtime.block_on(run_case(store, &client, initial, transition));
                Ok(())
            },
        )
        .expect("every case agrees with the machine");
}

/// Keys one batch case spreads its claims over, so that keys repeat.
const BATCH_KEYS: usize = 3;
/// Claims in one batch case at most.
const BATCH_CLAIMS_MAX: usize = 6;
/// Batch cases per run: each is a dozen round trips.
const BATCH_CASES: u32 = 64;
const THIRD: LeaseToken = LeaseToken(0xC);

/// One claim of a batch: which key, which attempt, and whether its body is
/// the one the key's initial record was made with.
#[derive(Debug, Clone)]
struct BatchClaim {
    key: usize,
    token: LeaseToken,
    same_body: bool,
}

fn batch_claims() -> impl Strategy<Value = Vec<BatchClaim>> {
    let claim = (
        0..BATCH_KEYS,
        prop_oneof![Just(HOLDER), Just(OTHER), Just(THIRD)],
        any::<bool>(),
    )
        .prop_map(|(key, token, same_body)| BatchClaim { key, token, same_body });
    proptest::collection::vec(claim, 1..=BATCH_CLAIMS_MAX)
}

/// A key's state as the machine sees it between two claims.
#[derive(Debug, Clone)]
enum Known {
    Nothing,
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

    fn row(&self) -> Option<Record> {
        match self {
            Known::Record(record) => Some(record.clone()),
            Known::Nothing | Known::Tombstone => None,
        }
    }
}

/// The machine's claims one after the other, in the batch's order, all at
/// `now_ms`: each claim's outcome and each key's row at the end.
fn machine_claims_in_order(
    mut keys: Vec<Known>,
    claims: &[BatchClaim],
    requests: &[ClaimRequest],
    now_ms: u64,
) -> (Vec<Reported>, Vec<Option<Record>>) {
    let policy = policy();
    let mut reported = Vec::new();
    for (claim, request) in claims.iter().zip(requests) {
        let step = machine::claim(keys[claim.key].found(), request, now_ms, &policy);
        match step.write {
            Write::Nothing => {}
            Write::Put(record) => keys[claim.key] = Known::Record(record),
            Write::Delete => keys[claim.key] = Known::Nothing,
        }
        reported.push(Reported::Claim(step.outcome));
    }
    (reported, keys.iter().map(Known::row).collect())
}

/// `actual` is the machine's value at `early` but for its times, and each
/// time is within `span_ms` of the machine's: each claim of the batch ran at
/// some instant in the span, and a time may be the difference of two.
fn agrees_within<T: Times + PartialEq + std::fmt::Debug>(actual: &T, early: &T, late: &T, span_ms: u64, what: &str) {
    assert_eq!(
        actual.without_times(),
        early.without_times(),
        "{what}: differs from the machine"
    );
    assert_eq!(
        early.without_times(),
        late.without_times(),
        "{what}: the machine's decision moved with the clock"
    );
    for (actual, early) in actual.times().iter().zip(&early.times()) {
        assert!(
            actual.abs_diff(*early) <= span_ms,
            "{what}: time {actual} more than {span_ms} ms from the machine's {early}"
        );
    }
}

/// Puts each key's initial state in the table; returns what the machine
/// starts from.
async fn set_up_keys(client: &Client, caller: &CallerId, keys: &[IdempotencyKey], initial: &[Initial]) -> Vec<Known> {
    let setup_now_ms = database_now_ms(client).await;
    let mut known = Vec::new();
    for (key, initial) in keys.iter().zip(initial) {
        let record = record_of(initial, setup_now_ms);
        known.push(match (initial, record) {
            (Initial::Tombstone, _) => {
                insert_tombstone(client, caller, key, setup_now_ms).await;
                Known::Tombstone
            }
            (_, Some(record)) => {
                insert_raw(client, caller, key, &record, initial).await;
                Known::Record(record)
            }
            (_, None) => Known::Nothing,
        });
    }
    known
}

async fn run_batch_case(store: &PostgresStore, client: &Client, initial: Vec<Initial>, claims: Vec<BatchClaim>) {
    let caller = CallerId::new("differential").expect("valid caller");
    let keys: Vec<IdempotencyKey> = (0..BATCH_KEYS)
        .map(|_| IdempotencyKey::new(&format!("batch-{:032x}", rand::random::<u128>())).expect("valid key"))
        .collect();
    let known = set_up_keys(client, &caller, &keys, &initial).await;
    let requests: Vec<ClaimRequest> = claims
        .iter()
        .map(|claim| ClaimRequest {
            caller: caller.clone(),
            key: keys[claim.key].clone(),
            fingerprint: fingerprint(claim.same_body),
            token: claim.token,
        })
        .collect();
    let before_ms = database_now_ms(client).await;
    let results = claim_in_one_batch(store, &requests).await;
    let after_ms = database_now_ms(client).await;
    let what = format!("{initial:?} then the batch {claims:?}");
    for (index, (batched, _)) in results.iter().enumerate() {
        if claims[..index].iter().any(|earlier| earlier.key == claims[index].key) {
            assert_eq!(
                batched,
                &BatchedClaim::Alone,
                "{what}: claim {index} repeats a key, so goes alone"
            );
        }
    }
    let (early, early_rows) = machine_claims_in_order(known.clone(), &claims, &requests, before_ms);
    let (late, late_rows) = machine_claims_in_order(known, &claims, &requests, after_ms);
    let span_ms = after_ms - before_ms;
    for (index, (_, outcome)) in results.into_iter().enumerate() {
        let actual = Reported::Claim(outcome.expect("claim"));
        let what = format!("{what}: claim {index}");
        agrees_within(&actual, &early[index], &late[index], span_ms, &what);
    }
    for (index, key) in keys.iter().enumerate() {
        let row = store.inspect(&caller, key).await.expect("inspect");
        let what = format!("{what}: row of key {index}");
        agrees_within(&row, &early_rows[index], &late_rows[index], span_ms, &what);
    }
}

#[test]
fn claim_batches_agree_with_the_state_machine_claim_by_claim() {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let (store, _unbatched, client, _database) = runtime.block_on(batched_and_unbatched_stores());
    let mut runner = TestRunner::new(Config {
        cases: BATCH_CASES,
        ..Config::default()
    });
    let initials = proptest::collection::vec(initial(), BATCH_KEYS);
    runner
        .run(&(initials, batch_claims()), |(initial, claims)| {
            runtime.block_on(run_batch_case(&store, &client, initial, claims));
            Ok(())
        })
        .expect("every batch agrees with the machine claim by claim");
}

/// One claim request of the explicit batch cases below.
fn claim_of(caller: &CallerId, key: &IdempotencyKey, token: LeaseToken, same_body: bool) -> ClaimRequest {
    ClaimRequest {
        caller: caller.clone(),
        key: key.clone(),
        fingerprint: fingerprint(same_body),
        token,
    }
}

fn new_key(name: &str) -> IdempotencyKey {
    IdempotencyKey::new(&format!("{name}-{:032x}", rand::random::<u128>())).expect("valid key")
}

/// What each pair of claims of one key answers in one batch must be what it
/// answers when the same two claims come one after the other.
#[tokio::test]
async fn the_same_key_twice_in_one_batch_answers_as_two_claims_one_after_the_other() {
    let (store, _unbatched, _client, _database) = batched_and_unbatched_stores().await;
    let caller = CallerId::new("twice").expect("valid caller");
    // (second token, second body the same): another attempt, the same
    // attempt re-sent, another request under the same key.
    for (second_token, same_body) in [(OTHER, true), (HOLDER, true), (OTHER, false)] {
        let (in_batch, in_turn) = (new_key("in-batch"), new_key("in-turn"));
        let batch = [
            claim_of(&caller, &in_batch, HOLDER, true),
            claim_of(&caller, &in_batch, second_token, same_body),
        ];
        let results = claim_in_one_batch(&store, &batch).await;
        assert!(matches!(results[0].0, BatchedClaim::Decided(ClaimOutcome::Acquired(_))));
        assert_eq!(
            results[1].0,
            BatchedClaim::Alone,
            "the repeated key stays out of the statement"
        );
        let first = store
            .claim(&claim_of(&caller, &in_turn, HOLDER, true))
            .await
            .expect("first");
        let second = store
            .claim(&claim_of(&caller, &in_turn, second_token, same_body))
            .await
            .expect("second");
        for (batched, alone) in results.into_iter().map(|(_, outcome)| outcome).zip([first, second]) {
            let mut batched = batched.expect("claim");
            if let ClaimOutcome::Acquired(acquired) = &mut batched {
                // The one difference allowed: the key's name.
                acquired.lease.key = in_turn.clone();
            }
            let (batched, alone) = (Reported::Claim(batched), Reported::Claim(alone));
            assert_eq!(
                batched.without_times(),
                alone.without_times(),
                "{second_token:?}, {same_body}"
            );
        }
    }
}

/// One batch over keys in every state: each claim gets its own key's
/// answer, and the ones the statement cannot decide take the locked path.
#[tokio::test]
async fn a_batch_decides_each_claim_by_its_own_row() {
    let (store, _unbatched, client, _database) = batched_and_unbatched_stores().await;
    let caller = CallerId::new("mixed").expect("valid caller");
    let initial = [
        Initial::Nothing,
        Initial::Completed {
            by: OTHER,
            expired: false,
            same_body: true,
            earlier_columns: true,
        },
        Initial::Started {
            holder: OTHER,
            lease_live: true,
            point: false,
            expired: false,
            same_body: true,
        },
        // A lost lease: expired, so this claim takes the key over.
        Initial::Started {
            holder: OTHER,
            lease_live: false,
            point: true,
            expired: false,
            same_body: true,
        },
        Initial::Tombstone,
        Initial::Completed {
            by: OTHER,
            expired: false,
            same_body: false,
            earlier_columns: false,
        },
    ];
    let keys: Vec<IdempotencyKey> = (0..initial.len()).map(|_| new_key("mixed")).collect();
    set_up_keys(&client, &caller, &keys, &initial).await;
    let requests: Vec<ClaimRequest> = keys.iter().map(|key| claim_of(&caller, key, HOLDER, true)).collect();
    let results = claim_in_one_batch(&store, &requests).await;
    let kinds: Vec<(&str, &str)> = results
        .iter()
        .map(|(batched, outcome)| {
            let batched = match batched {
                BatchedClaim::Decided(_) => "decided",
                BatchedClaim::Locked => "locked",
                BatchedClaim::Alone => "alone",
                BatchedClaim::Unavailable(_) => "unavailable",
            };
            (batched, outcome.as_ref().expect("claim").kind())
        })
        .collect();
    assert_eq!(
        kinds,
        [
            ("decided", "acquired"),
            ("decided", "replay"),
            ("decided", "in_progress"),
            ("locked", "acquired"),
            ("locked", "acquired"),
            ("decided", "mismatch"),
        ]
    );
    let Ok(ClaimOutcome::Acquired(takeover)) = &results[3].1 else {
        panic!("the expired lease is taken over");
    };
    assert!(takeover.takeover && takeover.recovery_point == Some(point()));
    let Ok(ClaimOutcome::Acquired(late)) = &results[4].1 else {
        panic!("the tombstoned key is acquired");
    };
    assert!(late.late_key, "a tombstoned key is a late key");
}

/// Many claims of few keys at once through the store's `claim`, batched as
/// they happen to arrive: each key is acquired exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_claims_of_few_keys_acquire_each_key_once() {
    const KEYS: usize = 8;
    const ATTEMPTS_PER_KEY: usize = 8;
    let (store, _unbatched, _client, _database) = batched_and_unbatched_stores().await;
    let caller = CallerId::new("concurrent").expect("valid caller");
    let keys: Vec<IdempotencyKey> = (0..KEYS).map(|_| new_key("concurrent")).collect();
    let mut tasks = Vec::new();
    for attempt in 0..ATTEMPTS_PER_KEY {
        for key in &keys {
            let (store, request) = (
                store.clone(),
                claim_of(&caller, key, LeaseToken(attempt as u128 + 1), true),
            );
            tasks.push(tokio::spawn(async move {
                (request.key.clone(), store.claim(&request).await)
            }));
        }
    }
    let mut acquired = std::collections::HashMap::new();
    for task in tasks {
        let (key, outcome) = task.await.expect("task");
        match outcome.expect("claim") {
            ClaimOutcome::Acquired(_) => *acquired.entry(key).or_insert(0) += 1,
            ClaimOutcome::InProgress { .. } => {}
            other => panic!("a live lease answers in progress, not {other:?}"),
        }
    }
    assert_eq!(acquired.len(), KEYS, "every key acquired");
    assert!(acquired.values().all(|&count| count == 1), "{acquired:?}");
}

/// One completion of a batch: which key, with which lease token.
#[derive(Debug, Clone)]
struct BatchCompletionCase {
    key: usize,
    token: LeaseToken,
}

fn batch_completions() -> impl Strategy<Value = Vec<BatchCompletionCase>> {
    let completion = (0..BATCH_KEYS, token()).prop_map(|(key, token)| BatchCompletionCase { key, token });
    proptest::collection::vec(completion, 1..=BATCH_CLAIMS_MAX)
}

/// The effect row a batched completion inserts: `differential_effect_rows`
/// keyed by `row_key`, made by `made_by`.
fn owned_effect_row(row_key: &str, made_by: &str) -> OwnedRowEffect {
    OwnedRowEffect {
        into: "differential_effect_rows (key_name, made_by)",
        values: "$6::text, $7::text",
        params: vec![Box::new(row_key.to_owned()), Box::new(made_by.to_owned())],
    }
}

async fn effect_row_by_name(client: &Client, row_key: &str) -> Option<String> {
    client
        .query_opt(
            "SELECT made_by FROM differential_effect_rows WHERE key_name = $1",
            &[&row_key],
        )
        .await
        .expect("read the effect row")
        .map(|row| row.get(0))
}

fn lease_of(caller: &CallerId, key: &IdempotencyKey, token: LeaseToken) -> HeldLease {
    HeldLease {
        caller: caller.clone(),
        key: key.clone(),
        token,
        locked_until_ms: 0,
    }
}

/// The machine's completions one after the other at `now_ms`, each with its
/// key's effect row: what each answers, each key's row and who made each
/// key's effect row at the end. `rows_made` starts with the rows already
/// there.
fn machine_completions_in_order(
    mut keys: Vec<Known>,
    mut rows_made: Vec<Option<String>>,
    completions: &[BatchCompletionCase],
    now_ms: u64,
) -> (Vec<Reported>, Vec<Option<Record>>, Vec<Option<String>>) {
    let policy = policy();
    let mut reported = Vec::new();
    for (index, completion) in completions.iter().enumerate() {
        let found = keys[completion.key].found();
        let held = matches!(
            machine::completion_fence(found, completion.token, now_ms),
            machine::CompletionFence::Held
        );
        if held && rows_made[completion.key].is_none() {
            let step = machine::complete(
                found,
                completion.token,
                saved(&format!("item {index}")),
                now_ms,
                &policy,
            );
            let Write::Put(record) = step.write else {
                panic!("a held lease completes with a write");
            };
            keys[completion.key] = Known::Record(record);
            rows_made[completion.key] = Some(format!("item {index}"));
            reported.push(Reported::Row(RowCompletion::Committed));
        } else {
            reported.push(Reported::Row(RowCompletion::Undecided));
        }
    }
    (reported, keys.iter().map(Known::row).collect(), rows_made)
}

async fn run_completion_batch_case(
    store: &PostgresStore,
    client: &Client,
    initial: Vec<Initial>,
    rows_there: Vec<bool>,
    completions: Vec<BatchCompletionCase>,
) {
    let caller = CallerId::new("differential").expect("valid caller");
    let keys: Vec<IdempotencyKey> = (0..BATCH_KEYS).map(|_| new_key("completion")).collect();
    let known = set_up_keys(client, &caller, &keys, &initial).await;
    for (key, there) in keys.iter().zip(&rows_there) {
        if *there {
            insert_effect_row(client, key, "another key").await;
        }
    }
    let rows_made: Vec<Option<String>> = rows_there
        .iter()
        .map(|there| there.then(|| "another key".to_owned()))
        .collect();
    let batch = completions
        .iter()
        .enumerate()
        .map(|(index, completion)| BatchCompletion {
            lease: lease_of(&caller, &keys[completion.key], completion.token),
            response: saved(&format!("item {index}")),
            row: owned_effect_row(keys[completion.key].as_str(), &format!("item {index}")),
        })
        .collect();
    let before_ms = database_now_ms(client).await;
    let results = complete_with_rows_in_one_batch(store, batch).await;
    let after_ms = database_now_ms(client).await;
    let what = format!("{initial:?}, rows there {rows_there:?}, then the batch {completions:?}");
    for (index, (kind, _)) in results.iter().enumerate() {
        if completions[..index]
            .iter()
            .any(|earlier| earlier.key == completions[index].key)
        {
            assert_eq!(
                *kind, "alone",
                "{what}: completion {index} repeats a key, so goes alone"
            );
        }
    }
    let (early, early_rows, made) =
        machine_completions_in_order(known.clone(), rows_made.clone(), &completions, before_ms);
    let (late, late_rows, _) = machine_completions_in_order(known, rows_made, &completions, after_ms);
    let span_ms = after_ms - before_ms;
    for (index, (_, outcome)) in results.into_iter().enumerate() {
        let actual = Reported::Row(outcome.expect("completion"));
        agrees_within(
            &actual,
            &early[index],
            &late[index],
            span_ms,
            &format!("{what}: completion {index}"),
        );
    }
    for (index, key) in keys.iter().enumerate() {
        let row = store.inspect(&caller, key).await.expect("inspect");
        agrees_within(
            &row,
            &early_rows[index],
            &late_rows[index],
            span_ms,
            &format!("{what}: row {index}"),
        );
        let effect = effect_row_by_name(client, key.as_str()).await;
        assert_eq!(effect, made[index], "{what}: effect row of key {index}");
    }
}

#[test]
fn completion_batches_agree_with_the_state_machine_completion_by_completion() {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let (store, _unbatched, client, _database) = runtime.block_on(batched_and_unbatched_stores());
    let mut runner = TestRunner::new(Config {
        cases: BATCH_CASES,
        ..Config::default()
    });
    let initials = proptest::collection::vec(initial(), BATCH_KEYS);
    let rows_there = proptest::collection::vec(any::<bool>(), BATCH_KEYS);
    runner
        .run(
            &(initials, rows_there, batch_completions()),
            |(initial, rows_there, completions)| {
                runtime.block_on(run_completion_batch_case(
                    &store,
                    &client,
                    initial,
                    rows_there,
                    completions,
                ));
                Ok(())
            },
        )
        .expect("every completion batch agrees with the machine completion by completion");
}

/// One batch of completions in every situation: each commits or is left
/// undecided by its own record's token and its own row, and what is left
/// undecided wrote nothing.
#[tokio::test]
async fn a_completion_batch_fences_each_row_by_its_own_token() {
    let (store, _unbatched, client, _database) = batched_and_unbatched_stores().await;
    let caller = CallerId::new("fenced").expect("valid caller");
    let started = |holder: LeaseToken, lease_live: bool| Initial::Started {
        holder,
        lease_live,
        point: false,
        expired: false,
        same_body: true,
    };
    let initial = [
        started(HOLDER, true),
        // A lease lost to another attempt.
        started(OTHER, true),
        // Expired, but nobody took it over: the holder still completes.
        started(HOLDER, false),
        Initial::Completed {
            by: HOLDER,
            expired: false,
            same_body: true,
            earlier_columns: false,
        },
        // Its effect row is already there.
        started(HOLDER, true),
        Initial::Nothing,
    ];
    let keys: Vec<IdempotencyKey> = (0..initial.len()).map(|_| new_key("fenced")).collect();
    let known = set_up_keys(&client, &caller, &keys, &initial).await;
    insert_effect_row(&client, &keys[4], "another key").await;
    let batch = keys
        .iter()
        .map(|key| BatchCompletion {
            lease: lease_of(&caller, key, HOLDER),
            response: saved("batched"),
            row: owned_effect_row(key.as_str(), "batched"),
        })
        .collect();
    let results = complete_with_rows_in_one_batch(&store, batch).await;
    let outcomes: Vec<(&str, RowCompletion)> = results
        .into_iter()
        .map(|(kind, outcome)| (kind, outcome.expect("completion")))
        .collect();
    use RowCompletion::{Committed, Undecided};
    assert_eq!(
        outcomes,
        [
            ("committed", Committed),
            ("undecided", Undecided),
            ("committed", Committed),
            ("undecided", Undecided),
            ("undecided", Undecided),
            ("undecided", Undecided),
        ]
    );
    for index in [1, 3, 5] {
        let row = store.inspect(&caller, &keys[index]).await.expect("inspect");
        assert_eq!(
            row,
            known[index].row(),
            "key {index}: an undecided completion writes nothing"
        );
        assert_eq!(
            effect_row_by_name(&client, keys[index].as_str()).await,
            None,
            "key {index}"
        );
    }
    assert_eq!(
        effect_row_by_name(&client, keys[4].as_str()).await.as_deref(),
        Some("another key")
    );
}

/// Two keys of one batch whose effect rows collide: one commits its row and
/// its record, the other is left undecided and writes nothing, as when the
/// two come one after the other.
#[tokio::test]
async fn two_completions_of_one_batch_whose_rows_collide_commit_once() {
    let (store, _unbatched, client, _database) = batched_and_unbatched_stores().await;
    let caller = CallerId::new("collide").expect("valid caller");
    let keys = [new_key("collide"), new_key("collide")];
    let held = Initial::Started {
        holder: HOLDER,
        lease_live: true,
        point: false,
        expired: false,
        same_body: true,
    };
    set_up_keys(&client, &caller, &keys, &[held.clone(), held]).await;
    let shared_row = format!("shared-{:032x}", rand::random::<u128>());
    let batch = keys
        .iter()
        .enumerate()
        .map(|(index, key)| BatchCompletion {
            lease: lease_of(&caller, key, HOLDER),
            response: saved("collide"),
            row: owned_effect_row(&shared_row, &format!("key {index}")),
        })
        .collect();
    let results = complete_with_rows_in_one_batch(&store, batch).await;
    let committed: Vec<usize> = results
        .iter()
        .enumerate()
        .filter(|(_, (_, outcome))| outcome.as_ref().ok() == Some(&RowCompletion::Committed))
        .map(|(index, _)| index)
        .collect();
    assert_eq!(committed.len(), 1, "{results:?}");
    let winner = committed[0];
    assert_eq!(
        effect_row_by_name(&client, &shared_row).await,
        Some(format!("key {winner}"))
    );
    let loser = 1 - winner;
    let record = store
        .inspect(&caller, &keys[loser])
        .await
        .expect("inspect")
        .expect("record");
    assert!(
        matches!(record.state, RecordState::Started { .. }),
        "the other stays started"
    );
}

/// Completions at once through `complete_with_row_in_batch`, batched as
/// they happen to arrive: every held lease commits its record and its row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_completions_each_commit_their_record_and_row() {
    const COMPLETIONS: usize = 32;
    let (store, _unbatched, client, _database) = batched_and_unbatched_stores().await;
    let caller = CallerId::new("concurrent").expect("valid caller");
    let mut leases = Vec::new();
    for _ in 0..COMPLETIONS {
        let request = claim_of(&caller, &new_key("concurrent"), HOLDER, true);
        match store.claim(&request).await.expect("claim") {
            ClaimOutcome::Acquired(acquired) => leases.push(acquired.lease),
            other => panic!("a new key is acquired, not {other:?}"),
        }
    }
    let tasks: Vec<_> = leases
        .iter()
        .cloned()
        .map(|lease| {
            let store = store.clone();
            tokio::spawn(async move {
                let row = owned_effect_row(lease.key.as_str(), "concurrent");
                store
                    .complete_with_row_in_batch(&lease, &saved("concurrent"), row)
                    .await
            })
        })
        .collect();
    for task in tasks {
        assert_eq!(task.await.expect("task").expect("completion"), RowCompletion::Committed);
    }
    for lease in &leases {
        let record = store
            .inspect(&caller, &lease.key)
            .await
            .expect("inspect")
            .expect("record");
        assert!(matches!(record.state, RecordState::Completed { .. }));
        assert_eq!(
            effect_row_by_name(&client, lease.key.as_str()).await.as_deref(),
            Some("concurrent")
        );
    }
}

/// The machine's plain completions one after the other at `now_ms`: what
/// each answers and each key's row at the end.
fn machine_plain_completions_in_order(
    mut keys: Vec<Known>,
    completions: &[BatchCompletionCase],
    now_ms: u64,
) -> (Vec<Reported>, Vec<Option<Record>>) {
    let policy = policy();
    let mut reported = Vec::new();
    for (index, completion) in completions.iter().enumerate() {
        let found = keys[completion.key].found();
        let step = machine::complete(
            found,
            completion.token,
            saved(&format!("item {index}")),
            now_ms,
            &policy,
        );
        match step.write {
            Write::Nothing => {}
            Write::Put(record) => keys[completion.key] = Known::Record(record),
            Write::Delete => keys[completion.key] = Known::Nothing,
        }
        reported.push(Reported::Fenced(step.outcome));
    }
    (reported, keys.iter().map(Known::row).collect())
}

async fn run_plain_completion_batch_case(
    store: &PostgresStore,
    client: &Client,
    initial: Vec<Initial>,
    completions: Vec<BatchCompletionCase>,
) {
    let caller = CallerId::new("differential").expect("valid caller");
    let keys: Vec<IdempotencyKey> = (0..BATCH_KEYS).map(|_| new_key("plain")).collect();
    let known = set_up_keys(client, &caller, &keys, &initial).await;
    let batch = completions
        .iter()
        .enumerate()
        .map(|(index, completion)| {
            let lease = lease_of(&caller, &keys[completion.key], completion.token);
            (lease, saved(&format!("item {index}")))
        })
        .collect();
    let before_ms = database_now_ms(client).await;
    let results = complete_in_one_batch(store, batch).await;
    let after_ms = database_now_ms(client).await;
    let what = format!("{initial:?}, then the plain batch {completions:?}");
    for (index, (kind, _)) in results.iter().enumerate() {
        if completions[..index]
            .iter()
            .any(|earlier| earlier.key == completions[index].key)
        {
            assert_eq!(
                *kind, "alone",
                "{what}: completion {index} repeats a key, so goes alone"
            );
        }
    }
    let (early, early_rows) = machine_plain_completions_in_order(known.clone(), &completions, before_ms);
    let (late, late_rows) = machine_plain_completions_in_order(known, &completions, after_ms);
    let span_ms = after_ms - before_ms;
    for (index, (_, outcome)) in results.into_iter().enumerate() {
        let actual = Reported::Fenced(outcome.expect("completion"));
        agrees_within(
            &actual,
            &early[index],
            &late[index],
            span_ms,
            &format!("{what}: completion {index}"),
        );
    }
    for (index, key) in keys.iter().enumerate() {
        let row = store.inspect(&caller, key).await.expect("inspect");
        agrees_within(
            &row,
            &early_rows[index],
            &late_rows[index],
            span_ms,
            &format!("{what}: row {index}"),
        );
    }
}

#[test]
fn plain_completion_batches_agree_with_the_state_machine_completion_by_completion() {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let (store, _unbatched, client, _database) = runtime.block_on(batched_and_unbatched_stores());
    let mut runner = TestRunner::new(Config {
        cases: BATCH_CASES,
        ..Config::default()
    });
    let initials = proptest::collection::vec(initial(), BATCH_KEYS);
    runner
        .run(&(initials, batch_completions()), |(initial, completions)| {
            runtime.block_on(run_plain_completion_batch_case(&store, &client, initial, completions));
            Ok(())
        })
        .expect("every plain completion batch agrees with the machine completion by completion");
}

/// One completion whose row the database refuses (a null where the table
/// wants a value) rolls its batch's transaction back; every completion then
/// goes alone, and only the refused one is left undecided.
#[tokio::test]
async fn a_refused_row_fails_its_own_completion_and_no_other() {
    let (store, _unbatched, client, _database) = batched_and_unbatched_stores().await;
    let caller = CallerId::new("refused").expect("valid caller");
    let held = Initial::Started {
        holder: HOLDER,
        lease_live: true,
        point: false,
        expired: false,
        same_body: true,
    };
    let keys: Vec<IdempotencyKey> = (0..3).map(|_| new_key("refused")).collect();
    set_up_keys(&client, &caller, &keys, &[held.clone(), held.clone(), held]).await;
    let batch = keys
        .iter()
        .enumerate()
        .map(|(index, key)| {
            let made_by: Option<String> = (index != 1).then(|| "batched".to_owned());
            BatchCompletion {
                lease: lease_of(&caller, key, HOLDER),
                response: saved("refused"),
                row: OwnedRowEffect {
                    into: "differential_effect_rows (key_name, made_by)",
                    values: "$6::text, $7::text",
                    params: vec![Box::new(key.as_str().to_owned()), Box::new(made_by)],
                },
            }
        })
        .collect();
    let results = complete_with_rows_in_one_batch(&store, batch).await;
    let outcomes: Vec<(&str, RowCompletion)> = results
        .into_iter()
        .map(|(kind, outcome)| (kind, outcome.expect("completion")))
        .collect();
    use RowCompletion::{Committed, Undecided};
    assert_eq!(
        outcomes,
        [("alone", Committed), ("alone", Undecided), ("alone", Committed)]
    );
    assert_eq!(effect_row_by_name(&client, keys[1].as_str()).await, None);
    let record = store
        .inspect(&caller, &keys[1])
        .await
        .expect("inspect")
        .expect("record");
    assert!(
        matches!(record.state, RecordState::Started { .. }),
        "the refused one stays started"
    );
}
