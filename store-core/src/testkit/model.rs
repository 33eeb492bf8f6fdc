//! A reference model of one key's life, written independently of
//! [`crate::machine`], and a property test that runs random operation
//! sequences against a live store and the model side by side.
//!
//! The model has no clock: leases are long (a minute), so a lease ends only
//! by `release`. Time-driven transitions are covered by the behaviours in
//! the parent module.

use super::{SharedStore, key, response, unique_caller};
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

pub fn model_policy() -> Policy {
    Policy::new(60_000, 120_000, 60_000).expect("model policy is valid")
}

/// One step of a sequence. Every record the model holds is readable, so a
/// `Forget` must leave it unchanged (`Readable`), and an absent one is
/// `NotFound`.
#[derive(Debug, Clone)]
enum Op {
    Claim { key: usize, body: usize },
    Checkpoint { attempt: usize, point: u8 },
    Complete { attempt: usize, response: u8 },
    Release { attempt: usize },
    Abandon { attempt: usize },
    Inspect { key: usize },
    Forget { key: usize },
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..KEYS, 0..BODIES).prop_map(|(key, body)| Op::Claim { key, body }),
        1 => (any::<usize>(), any::<u8>()).prop_map(|(attempt, point)| Op::Checkpoint { attempt, point }),
        2 => (any::<usize>(), any::<u8>()).prop_map(|(attempt, response)| Op::Complete { attempt, response }),
        1 => any::<usize>().prop_map(|attempt| Op::Release { attempt }),
        1 => any::<usize>().prop_map(|attempt| Op::Abandon { attempt }),
        1 => (0..KEYS).prop_map(|key| Op::Inspect { key }),
        1 => (0..KEYS).prop_map(|key| Op::Forget { key }),
    ]
}

#[derive(Debug, Clone, PartialEq)]
enum ModelState {
    Started {
        token: LeaseToken,
        live: bool,
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
}

#[derive(Default)]
struct Model {
    records: HashMap<usize, ModelRecord>,
}

/// What the model expects a claim to answer.
#[derive(Debug, PartialEq)]
enum Expected {
    Acquired { takeover: bool, point: Option<u8> },
    Replay(u8),
    InProgress,
    Mismatch,
}

impl Model {
    fn claim(&mut self, key: usize, body: usize, token: LeaseToken) -> Expected {
        let Some(record) = self.records.get_mut(&key) else {
            let state = ModelState::Started {
                token,
                live: true,
                point: None,
            };
            self.records.insert(key, ModelRecord { body, state });
            return Expected::Acquired {
                takeover: false,
                point: None,
            };
        };
        if record.body != body {
            return Expected::Mismatch;
        }
        match record.state.clone() {
            ModelState::Completed { response, .. } => Expected::Replay(response),
            ModelState::Started { live: true, .. } => Expected::InProgress,
            ModelState::Started { live: false, point, .. } => {
                record.state = ModelState::Started {
                    token,
                    live: true,
                    point,
                };
                Expected::Acquired { takeover: true, point }
            }
        }
    }

    fn holds(&self, key: usize, token: LeaseToken) -> bool {
        matches!(self.records.get(&key), Some(ModelRecord { state: ModelState::Started { token: t, .. }, .. }) if *t == token)
    }

    fn fenced(&mut self, op: &Op, key: usize, token: LeaseToken) -> bool {
        if matches!(op, Op::Abandon { .. }) && !self.records.contains_key(&key) {
            return true;
        }
        if let (
            Op::Complete { .. },
            Some(ModelRecord {
                state: ModelState::Completed { by, .. },
                ..
            }),
        ) = (op, self.records.get(&key))
        {
            return *by == token;
        }
        if !self.holds(key, token) {
            return false;
        }
        let record = self.records.get_mut(&key).expect("held record exists");
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
                }
            }
            Op::Release { .. } => {
                if let ModelState::Started { live, .. } = &mut record.state {
                    *live = false;
                }
            }
            Op::Abandon { .. } => {
                self.records.remove(&key);
            }
            Op::Claim { .. } | Op::Inspect { .. } | Op::Forget { .. } => unreachable!("not a fenced operation"),
        }
        true
    }
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

async fn run_sequence(store: &SharedStore, ops: &[Op]) -> Result<(), TestCaseError> {
    let caller = unique_caller();
    let mut model = Model::default();
    let mut attempts: Vec<(usize, HeldLease)> = Vec::new();
    for (step, op) in ops.iter().enumerate() {
        let context = || format!("step {step} {op:?}");
        match op {
            Op::Claim { key: k, body } => {
                let request = ClaimRequest::new(caller.clone(), key(&key_text(*k)), body_fingerprint(*body));
                let expected = model.claim(*k, *body, request.token);
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
                        }
                    }
                    ClaimOutcome::Replay(saved) => Expected::Replay(*saved.body().last().unwrap_or(&0)),
                    ClaimOutcome::InProgress { .. } => Expected::InProgress,
                    ClaimOutcome::Mismatch => Expected::Mismatch,
                };
                check(actual == expected, || {
                    format!("{}: store {actual:?}, model {expected:?}", context())
                })?;
            }
            Op::Inspect { key: k } => inspect_matches(store, &caller, &model, *k, &context()).await?,
            Op::Forget { key: k } => forget_keeps_what_is_readable(store, &caller, &model, *k, &context()).await?,
            fenced => {
                let Some((k, lease)) = pick(&attempts, fenced) else {
                    continue;
                };
                let expected = model.fenced(fenced, k, lease.token);
                let result = match fenced {
                    Op::Checkpoint { point, .. } => store.checkpoint(&lease, point_bytes(*point)).await,
                    Op::Complete { response: r, .. } => store.complete(&lease, response(*r)).await,
                    Op::Release { .. } => store.release(&lease).await,
                    Op::Abandon { .. } => store.abandon(&lease).await,
                    Op::Claim { .. } | Op::Inspect { .. } | Op::Forget { .. } => unreachable!("handled above"),
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
        inspect_matches(store, &caller, &model, k, "final").await?;
    }
    Ok(())
}

fn pick(attempts: &[(usize, HeldLease)], op: &Op) -> Option<(usize, HeldLease)> {
    let index = match op {
        Op::Checkpoint { attempt, .. }
        | Op::Complete { attempt, .. }
        | Op::Release { attempt }
        | Op::Abandon { attempt } => *attempt,
        Op::Claim { .. } | Op::Inspect { .. } | Op::Forget { .. } => return None,
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
    inspect_matches(store, caller, model, k, context).await
}

async fn inspect_matches(
    store: &SharedStore,
    caller: &CallerId,
    model: &Model,
    k: usize,
    context: &str,
) -> Result<(), TestCaseError> {
    let stored = store
        .inspect(caller, &key(&key_text(k)))
        .await
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    let expected = model.records.get(&k);
    let same = match (&stored, expected) {
        (None, None) => true,
        (Some(record), Some(model_record)) => {
            record.fingerprint == body_fingerprint(model_record.body)
                && match (&record.state, &model_record.state) {
                    (RecordState::Started { lease, recovery_point }, ModelState::Started { token, point, .. }) => {
                        lease.token == *token && recovery_point.as_ref().map(|p| p.as_bytes()[0]) == *point
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
    F: Fn(Policy) -> Pin<Box<dyn Future<Output = SharedStore>>>,
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
    let store = runtime.block_on(make(model_policy()));
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&proptest::collection::vec(op_strategy(), 1..40), |ops| {
        runtime.block_on(run_sequence(&store, &ops))
    });
    if let Err(failure) = result {
        panic!("store disagrees with the reference model: {failure}");
    }
}
