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
//! within the call the statement ran at.

mod common;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use store_core::machine::{self, Found, Step, Write};
use store_core::{
    CallerId, ClaimOutcome, ClaimRequest, Fenced, Fingerprint, HeldLease, IdempotencyKey, IdempotencyStore, Lease,
    LeaseToken, Policy, Record, RecordState, RecoveryPoint, SavedResponse,
};
use store_postgres::{Migration, ROW_EFFECT_FIRST_PARAMETER, RowCompletion, RowEffect};
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
        (token(), any::<bool>(), any::<bool>()).prop_map(|(by, expired, same_body)| Initial::Completed {
            by,
            expired,
            same_body
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
        Initial::Completed { by, expired, same_body } => (
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

/// Writes `record` the way another client would, column by column.
async fn insert_raw(client: &Client, caller: &CallerId, key: &IdempotencyKey, record: &Record) {
    let (state, locked_until, token, point, status, names, values, body, completed_by) = match &record.state {
        RecordState::Started { lease, recovery_point } => (
            "started",
            Some(timestamp(lease.locked_until_ms)),
            Some(Uuid::from_u128(lease.token.0)),
            recovery_point.as_ref().map(|point| point.as_bytes().to_vec()),
            None,
            None,
            None,
            None,
            None,
        ),
        RecordState::Completed { response, completed_by } => (
            "completed",
            None,
            None,
            None,
            Some(i32::from(response.status())),
            Some(
                response
                    .headers()
                    .iter()
                    .map(|(name, _)| name.clone())
                    .collect::<Vec<_>>(),
            ),
            Some(
                response
                    .headers()
                    .iter()
                    .map(|(_, value)| value.clone())
                    .collect::<Vec<_>>(),
            ),
            Some(response.body().to_vec()),
            Some(Uuid::from_u128(completed_by.0)),
        ),
    };
    client
        .execute(
            "INSERT INTO idempotency_keys (caller_id, idem_key, request_hash, state, locked_until, lease_token, \
             recovery_point, response_status, response_header_names, response_header_values, response_body, \
             completed_by, created_at, expires_at) \
             VALUES ($1, $2, $3, $4::text::idempotency_state, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)",
            &[
                &caller.as_str(),
                &key.digest().0.as_slice(),
                &record.fingerprint.0.as_slice(),
                &state,
                &locked_until,
                &token,
                &point,
                &status,
                &names,
                &values,
                &body,
                &completed_by,
                &timestamp(record.created_at_ms),
                &timestamp(record.expires_at_ms),
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
        (_, Some(record)) => insert_raw(client, &caller, &key, record).await,
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
    assert_eq!(ROW_EFFECT_FIRST_PARAMETER, 9);
    let key_name = key.as_str();
    let row = RowEffect {
        into: "differential_effect_rows (key_name, made_by)",
        values: "$9::text, 'this key'",
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

#[test]
fn one_statement_transitions_agree_with_the_state_machine() {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let (store, client, _database) = runtime.block_on(async {
        let database = common::fresh_database().await;
        let store = database
            .migrated_store(policy(), &[EFFECT_ROWS])
            .await
            .expect("migrated store");
        let client = common::raw_client(&database.url).await;
        (store, client, database)
    });
    let mut runner = TestRunner::new(Config {
        cases: CASES,
        ..Config::default()
    });
    runner
        .run(&(initial(), transition()), |(initial, transition)| {
            runtime.block_on(run_case(&store, &client, initial, transition));
            Ok(())
        })
        .expect("every case agrees with the machine");
}
