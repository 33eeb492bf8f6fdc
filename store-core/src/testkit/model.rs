//! A reference model of one key's life, written independently of
//! [`crate::machine`], and a property test that runs random operation
//! sequences against a live store and the model side by side.
//!
//! On a store that reads a manual clock ([`TestTime::Manual`]) the sequences
//! also move time, by amounts that land on the edges (a lease's last
//! millisecond, its end, the end of retention), and the model decides lease
//! expiry, takeover and late keys by its own arithmetic; the lease and
//! expiry of every stored record must then match it to the millisecond. On a
//! wall clock (Redis, PostgreSQL) time does not move within a sequence:
//! leases are long (a minute), so a lease ends only by `release`, and
//! time-driven transitions are covered by the behaviours in the parent
//! module.

use super::{SharedStore, Subject, TestTime, key, response, unique_caller};
use crate::clock::Clock;
use crate::outcome::{ClaimOutcome, ClaimRequest, Fenced, ForgetOutcome, HeldLease};
use crate::types::{CallerId, Fingerprint, LeaseToken, Policy, RecordState, RecoveryPoint};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;

/// Cases per run; raise with `IDEM_MODEL_CASES` for a longer search.
pub const MODEL_CASES_DEFAULT: u32 = 48;
const KEYS: usize = 3;
const BODIES: usize = 2;
const MODEL_LEASE_MS: u64 = 60_000;
const MODEL_RETENTION_MS: u64 = 120_000;

pub fn model_policy() -> Policy {
    Policy::new(MODEL_LEASE_MS, MODEL_RETENTION_MS, 60_000).expect("model policy is valid")
}

/// One step of a sequence. Every record the model holds is readable, so a
/// `Forget` must leave it unchanged (`Readable`), and an absent one is
/// `NotFound`.
#[derive(Debug, Clone)]
enum Op {
    Claim {
        key: usize,
        body: usize,
    },
    Checkpoint {
        attempt: usize,
        point: u8,
    },
    Complete {
        attempt: usize,
        response: u8,
    },
    Release {
        attempt: usize,
    },
    Abandon {
        attempt: usize,
    },
    Inspect {
        key: usize,
    },
    Forget {
        key: usize,
    },
    /// Moves the manual clock forward.
    Advance {
        ms: u64,
    },
}

fn op_strategy(time_moves: bool) -> BoxedStrategy<Op> {
    let without_time = prop_oneof![
        3 => (0..KEYS, 0..BODIES).prop_map(|(key, body)| Op::Claim { key, body }),
        1 => (any::<usize>(), any::<u8>()).prop_map(|(attempt, point)| Op::Checkpoint { attempt, point }),
        2 => (any::<usize>(), any::<u8>()).prop_map(|(attempt, response)| Op::Complete { attempt, response }),
        1 => any::<usize>().prop_map(|attempt| Op::Release { attempt }),
        1 => any::<usize>().prop_map(|attempt| Op::Abandon { attempt }),
        1 => (0..KEYS).prop_map(|key| Op::Inspect { key }),
        1 => (0..KEYS).prop_map(|key| Op::Forget { key }),
    ];
    if !time_moves {
        return without_time.boxed();
    }
    prop_oneof![
        9 => without_time,
        2 => advance_strategy().prop_map(|ms| Op::Advance { ms }),
    ]
    .boxed()
}

/// Steps that land on the edges: a lease's last millisecond and its end,
/// retention's, and anything in between.
fn advance_strategy() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(1),
        Just(MODEL_LEASE_MS - 1),
        Just(MODEL_LEASE_MS),
        Just(MODEL_RETENTION_MS - MODEL_LEASE_MS),
        Just(MODEL_RETENTION_MS),
        0..2 * MODEL_RETENTION_MS,
    ]
}

#[derive(Debug, Clone, PartialEq)]
enum ModelState {
    Started {
        token: LeaseToken,
        locked_until_ms: u64,
        point: Option<u8>,
    },
    Completed {
        response: u8,
        by: LeaseToken,
    },
}

#[derive(Debug, Clone)]
struct ModelRecord {
    body: usize,
    state: ModelState,
    expires_at_ms: u64,
}

impl ModelRecord {
    fn is_live(&self, now_ms: u64) -> bool {
        now_ms < self.expires_at_ms
    }
}

#[derive(Default)]
struct Model {
    /// Every record as stored, expired ones included (a store keeps them
    /// until a purge, and a model sequence never purges).
    records: HashMap<usize, ModelRecord>,
}

/// What the model expects a claim to answer.
#[derive(Debug, PartialEq)]
enum Expected {
    Acquired {
        takeover: bool,
        point: Option<u8>,
        late: bool,
    },
    Replay(u8),
    InProgress {
        retry_after_ms: u64,
    },
    Mismatch,
}

impl Model {
    fn claim(&mut self, key: usize, body: usize, token: LeaseToken, now_ms: u64) -> Expected {
        let fresh = |point| ModelState::Started {
            token,
            locked_until_ms: now_ms + MODEL_LEASE_MS,
            point,
        };
        let Some(record) = self.records.get_mut(&key).filter(|record| record.is_live(now_ms)) else {
            // Absent, or expired: counts as absent, and a claim over an
            // expired record is late.
            let late = self.records.contains_key(&key);
            let record = ModelRecord {
                body,
                state: fresh(None),
                expires_at_ms: now_ms + MODEL_RETENTION_MS,
            };
            self.records.insert(key, record);
            return Expected::Acquired {
                takeover: false,
                point: None,
                late,
            };
        };
        if record.body != body {
            return Expected::Mismatch;
        }
        match record.state.clone() {
            ModelState::Completed { response, .. } => Expected::Replay(response),
            ModelState::Started { locked_until_ms, .. } if now_ms < locked_until_ms => Expected::InProgress {
                retry_after_ms: locked_until_ms - now_ms,
            },
            ModelState::Started { point, .. } => {
                record.state = fresh(point);
                record.expires_at_ms = record.expires_at_ms.max(now_ms + MODEL_RETENTION_MS);
                Expected::Acquired {
                    takeover: true,
                    point,
                    late: false,
                }
            }
        }
    }

    /// The live started record whose lease `token` holds: tokens are
    /// checked, not clocks, so an expired lease nobody took over still holds.
    fn held(&mut self, key: usize, token: LeaseToken, now_ms: u64) -> Option<&mut ModelRecord> {
        self.records.get_mut(&key).filter(|record| {
            record.is_live(now_ms) && matches!(record.state, ModelState::Started { token: t, .. } if t == token)
        })
    }

    fn fenced(&mut self, op: &Op, key: usize, token: LeaseToken, now_ms: u64) -> bool {
        let live = self.records.get(&key).filter(|record| record.is_live(now_ms));
        if matches!(op, Op::Abandon { .. }) && live.is_none() {
            return true;
        }
        if let (
            Op::Complete { .. },
            Some(ModelRecord {
                state: ModelState::Completed { by, .. },
                ..
            }),
        ) = (op, live)
        {
            return *by == token;
        }
        let Some(record) = self.held(key, token, now_ms) else {
            return false;
        };
        match op {
            Op::Checkpoint { point, .. } => {
                if let ModelState::Started { point: p, .. } = &mut record.state {
                    *p = Some(*point);
                }
            }
            Op::Complete { response, .. } => {
                record.state = ModelState::Completed {
                    response: *response,
                    by: token,
                };
                record.expires_at_ms = now_ms + MODEL_RETENTION_MS;
            }
            Op::Release { .. } => {
                if let ModelState::Started { locked_until_ms, .. } = &mut record.state {
                    *locked_until_ms = (*locked_until_ms).min(now_ms);
                }
            }
            Op::Abandon { .. } => {
                self.records.remove(&key);
            }
            Op::Claim { .. } | Op::Inspect { .. } | Op::Advance { .. } | Op::Forget { .. } => {
                unreachable!("not a fenced operation")
            }
        }
        true
    }
}

/// The model's reading of time: the store's manual clock, or, on a wall
/// clock, a time that stands still (nothing expires within a sequence).
fn model_now_ms(time: &TestTime) -> u64 {
    time.manual_clock().map_or(0, |clock| clock.now_ms())
}

fn body_fingerprint(body: usize) -> Fingerprint {
    Fingerprint::of_request("POST", "/model", format!("{{\"body\":{body}}}").as_bytes())
}

fn key_text(key: usize) -> String {
    format!("model-key-{key}")
}

fn point_bytes(point: u8) -> RecoveryPoint {
    RecoveryPoint::new(vec![point; 3]).expect("small point")
}

fn check(condition: bool, message: impl FnOnce() -> String) -> Result<(), TestCaseError> {
    if condition {
        Ok(())
    } else {
        Err(TestCaseError::fail(message()))
    }
}

async fn run_sequence(store: &SharedStore, time: &TestTime, ops: &[Op]) -> Result<(), TestCaseError> {
    let caller = unique_caller();
    let mut model = Model::default();
    let mut attempts: Vec<(usize, HeldLease)> = Vec::new();
    for (step, op) in ops.iter().enumerate() {
        let context = || format!("step {step} {op:?}");
        match op {
            Op::Claim { key: k, body } => {
                let request = ClaimRequest::new(caller.clone(), key(&key_text(*k)), body_fingerprint(*body));
                let expected = model.claim(*k, *body, request.token, model_now_ms(time));
                let actual = store
                    .claim(&request)
                    .await
                    .map_err(|e| TestCaseError::fail(format!("{}: {e}", context())))?;
                let actual = match actual {
                    ClaimOutcome::Acquired(acquired) => {
                        attempts.push((*k, acquired.lease.clone()));
                        let point = acquired.recovery_point.map(|p| p.as_bytes()[0]);
                        Expected::Acquired {
                            takeover: acquired.takeover,
                            point,
                            late: acquired.late_key,
                        }
                    }
                    ClaimOutcome::Replay(saved) => Expected::Replay(*saved.body().last().unwrap_or(&0)),
                    // On a wall clock the model cannot know the time left.
                    ClaimOutcome::InProgress { retry_after_ms } => Expected::InProgress {
                        retry_after_ms: match time {
                            TestTime::Manual(_) => retry_after_ms,
                            TestTime::Wall => expected_retry_after(&expected),
                        },
                    },
                    ClaimOutcome::Mismatch => Expected::Mismatch,
                };
                check(actual == expected, || {
                    format!("{}: store {actual:?}, model {expected:?}", context())
                })?;
            }
            Op::Inspect { key: k } => inspect_matches(store, &caller, &model, time, *k, &context()).await?,
            Op::Forget { key: k } => {
                forget_keeps_what_is_readable(store, &caller, &model, time, *k, &context()).await?
            }
            Op::Advance { ms } => time.pass(*ms).await,
            fenced => {
                let Some((k, lease)) = pick(&attempts, fenced) else {
                    continue;
                };
                let expected = model.fenced(fenced, k, lease.token, model_now_ms(time));
                let result = match fenced {
                    Op::Checkpoint { point, .. } => store.checkpoint(&lease, point_bytes(*point)).await,
                    Op::Complete { response: r, .. } => store.complete(&lease, response(*r)).await,
                    Op::Release { .. } => store.release(&lease).await,
                    Op::Abandon { .. } => store.abandon(&lease).await,
                    Op::Claim { .. } | Op::Inspect { .. } | Op::Advance { .. } | Op::Forget { .. } => {
                        unreachable!("handled above")
                    }
                };
                let actual =
                    result.map_err(|e| TestCaseError::fail(format!("{}: {e}", context())))? == Fenced::Applied(());
                check(actual == expected, || {
                    format!("{}: store applied={actual}, model applied={expected}", context())
                })?;
            }
        }
    }
    for k in 0..KEYS {
        inspect_matches(store, &caller, &model, time, k, "final").await?;
    }
    Ok(())
}

fn expected_retry_after(expected: &Expected) -> u64 {
    match expected {
        Expected::InProgress { retry_after_ms } => *retry_after_ms,
        _ => 0,
    }
}

fn pick(attempts: &[(usize, HeldLease)], op: &Op) -> Option<(usize, HeldLease)> {
    let index = match op {
        Op::Checkpoint { attempt, .. }
        | Op::Complete { attempt, .. }
        | Op::Release { attempt }
        | Op::Abandon { attempt } => *attempt,
        Op::Claim { .. } | Op::Inspect { .. } | Op::Advance { .. } | Op::Forget { .. } => return None,
    };
    if attempts.is_empty() {
        None
    } else {
        Some(attempts[index % attempts.len()].clone())
    }
}

/// Forgets key `k`, then checks that the record is still the model's.
async fn forget_keeps_what_is_readable(
    store: &SharedStore,
    caller: &CallerId,
    model: &Model,
    time: &TestTime,
    k: usize,
    context: &str,
) -> Result<(), TestCaseError> {
    let outcome = store
        .forget_unreadable_record(caller, key(&key_text(k)).digest())
        .await
        .map_err(|e| TestCaseError::fail(format!("{context}: {e}")))?;
    let expected = if model.records.contains_key(&k) {
        ForgetOutcome::Readable
    } else {
        ForgetOutcome::NotFound
    };
    check(outcome == expected, || {
        format!("{context}: store {outcome:?}, model {expected:?}")
    })?;
    inspect_matches(store, caller, model, time, k, context).await
}

async fn inspect_matches(
    store: &SharedStore,
    caller: &CallerId,
    model: &Model,
    time: &TestTime,
    k: usize,
    context: &str,
) -> Result<(), TestCaseError> {
    let stored = store
        .inspect(caller, &key(&key_text(k)))
        .await
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    let expected = model.records.get(&k);
    // Times are compared only where the model knows them: on a manual clock.
    let times_known = matches!(time, TestTime::Manual(_));
    let same = match (&stored, expected) {
        (None, None) => true,
        (Some(record), Some(model_record)) => {
            record.fingerprint == body_fingerprint(model_record.body)
                && (!times_known || record.expires_at_ms == model_record.expires_at_ms)
                && match (&record.state, &model_record.state) {
                    (
                        RecordState::Started { lease, recovery_point },
                        ModelState::Started {
                            token,
                            locked_until_ms,
                            point,
                        },
                    ) => {
                        lease.token == *token
                            && (!times_known || lease.locked_until_ms == *locked_until_ms)
                            && recovery_point.as_ref().map(|p| p.as_bytes()[0]) == *point
                    }
                    (
                        RecordState::Completed {
                            response: saved,
                            completed_by,
                        },
                        ModelState::Completed { response: r, by },
                    ) => *saved == response(*r) && completed_by == by,
                    _ => false,
                }
        }
        _ => false,
    };
    check(same, || {
        format!("{context}: key {k}: store {stored:?}, model {expected:?}")
    })
}

/// Runs random sequences of operations against the store and the model.
pub fn check_against_model<F>(make: F)
where
    F: Fn(Policy) -> Pin<Box<dyn Future<Output = Subject>>>,
{
    let cases = std::env::var("IDEM_MODEL_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(MODEL_CASES_DEFAULT);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let Subject { store, time } = runtime.block_on(make(model_policy()));
    let time_moves = matches!(time, TestTime::Manual(_));
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&proptest::collection::vec(op_strategy(time_moves), 1..40), |ops| {
        runtime.block_on(run_sequence(&store, &time, &ops))
    });
    if let Err(failure) = result {
        panic!("store disagrees with the reference model: {failure}");
    }
}
