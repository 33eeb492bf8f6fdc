//! The per-key state machine, as pure functions.
//!
//! Each function takes what the backend read inside its transaction (the
//! record, if any, and the backend's clock reading) and returns the single
//! write to make plus the outcome to report. No I/O happens here, so every
//! engine that can run Rust inside its transaction (the FDB-style store on
//! either engine, PostgreSQL) shares this one implementation; the Redis
//! backend mirrors it in Lua and passes the same conformance suite.
//!
//! The transition table (from the specification, plus the fenced writes):
//!
//! | from                | event                  | guard                       | write            | outcome        |
//! |---------------------|------------------------|-----------------------------|------------------|----------------|
//! | no record / expired | claim                  |                             | insert, lease    | acquired       |
//! | started             | claim                  | other fingerprint           | none             | mismatch       |
//! | started             | claim                  | same token (re-sent claim)  | none             | acquired       |
//! | started             | claim                  | lease live                  | none             | in progress    |
//! | started             | claim                  | lease expired               | new token        | acquired, takeover |
//! | completed           | claim                  | same fingerprint            | none             | replay         |
//! | completed           | claim                  | other fingerprint           | none             | mismatch       |
//! | started             | checkpoint             | token holds                 | recovery point   | applied        |
//! | started             | complete               | token holds                 | save response    | applied        |
//! | completed           | complete               | completed by this token     | none             | applied        |
//! | started             | release                | token holds                 | lease ends now   | applied        |
//! | started             | abandon                | token holds                 | delete           | applied        |
//! | no record           | abandon                |                             | none             | applied        |
//! | any other           | fenced write           |                             | none             | lease lost     |
//! | expired             | purge                  |                             | delete           |                |
//!
//! A record whose `expires_at_ms` has passed counts as absent everywhere,
//! whether or not the sweeper has deleted it yet, and a claim over it is
//! reported late. Tombstones are the backend's business: a sweeping backend
//! writes one when it purges a record; a TTL backend (Redis) writes it ahead,
//! with the record, timed to outlive it.

use crate::outcome::{Acquired, ClaimOutcome, ClaimRequest, Fenced, HeldLease};
use crate::types::{Lease, LeaseToken, Policy, Record, RecordState, RecoveryPoint, SavedResponse};

/// The one write a transition makes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Write {
    Nothing,
    Put(Record),
    Delete,
}

/// A transition: the write to commit and the outcome to report once it has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step<O> {
    pub write: Write,
    pub outcome: O,
}

impl<O> Step<O> {
    fn answer(outcome: O) -> Self {
        Self {
            write: Write::Nothing,
            outcome,
        }
    }

    /// A step that writes `record`, checked against what every written
    /// record must satisfy.
    fn put(record: Record, outcome: O, now_ms: u64) -> Self {
        check_written_record(&record, now_ms);
        Self {
            write: Write::Put(record),
            outcome,
        }
    }
}

/// What every record the machine writes satisfies. The record was just
/// written by a transition, so it is live; it expires no earlier than it was
/// created, and no earlier than its lease ends (ARCHITECTURE.md, invariants:
/// "`expires_at` is never earlier than the live lease's end").
///
/// Debug-only: a written record carries fields of the stored one it
/// replaced (its creation time, a kept lease), and a stored record is input
/// that release builds must not panic on.
fn check_written_record(record: &Record, now_ms: u64) {
    debug_assert!(
        !record.is_expired(now_ms),
        "a written record is live: expires at {} ms, now {now_ms} ms",
        record.expires_at_ms
    );
    debug_assert!(
        record.created_at_ms <= record.expires_at_ms,
        "a record expires after it was created: {record:?}"
    );
    if let RecordState::Started { lease, .. } = &record.state {
        debug_assert!(
            lease.locked_until_ms <= record.expires_at_ms,
            "a record outlives its lease: {record:?}"
        );
    }
}

/// What a transition of an existing record keeps: which request it answers
/// (the fingerprint) and when it was created. Cheap, so always checked.
fn assert_same_record(before: &Record, after: &Record) {
    assert_eq!(
        before.fingerprint, after.fingerprint,
        "a transition changed the fingerprint"
    );
    assert_eq!(
        before.created_at_ms, after.created_at_ms,
        "a transition changed the creation time"
    );
}

/// What the backend found under (caller, key).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found<'a> {
    Nothing,
    /// No record, but a tombstone says one was purged.
    Tombstone,
    Record(&'a Record),
}

impl<'a> Found<'a> {
    pub fn from_record(record: Option<&'a Record>) -> Self {
        record.map_or(Found::Nothing, Found::Record)
    }

    /// The record, unless it has expired.
    fn live(self, now_ms: u64) -> Option<&'a Record> {
        match self {
            Found::Record(record) if !record.is_expired(now_ms) => Some(record),
            _ => None,
        }
    }
}

/// Claim a key: insert, inspect, or take over.
pub fn claim(found: Found<'_>, request: &ClaimRequest, now_ms: u64, policy: &Policy) -> Step<ClaimOutcome> {
    let Some(record) = found.live(now_ms) else {
        let late_key = !matches!(found, Found::Nothing);
        return first_run(request, now_ms, policy, late_key);
    };
    if record.fingerprint != request.fingerprint {
        return Step::answer(ClaimOutcome::Mismatch);
    }
    match &record.state {
        RecordState::Completed { response, .. } => Step::answer(ClaimOutcome::Replay(response.clone())),
        RecordState::Started { lease, recovery_point } => {
            if lease.locked_until_ms > now_ms {
                if lease.token == request.token {
                    return resent_claim(record, lease, recovery_point, request, policy);
                }
                let retry_after_ms = lease.locked_until_ms - now_ms;
                debug_assert!(retry_after_ms > 0, "a live lease has time left");
                return Step::answer(ClaimOutcome::InProgress { retry_after_ms });
            }
            take_over(record, recovery_point, request, now_ms, policy)
        }
    }
}

fn first_run(request: &ClaimRequest, now_ms: u64, policy: &Policy, late_key: bool) -> Step<ClaimOutcome> {
    let lease = Lease {
        token: request.token,
        locked_until_ms: now_ms + policy.lease_ms(),
    };
    let record = Record {
        fingerprint: request.fingerprint,
        state: RecordState::Started {
            lease,
            recovery_point: None,
        },
        created_at_ms: now_ms,
        expires_at_ms: now_ms + policy.retention_ms(),
    };
    let acquired = Acquired {
        lease: held(request, &lease),
        takeover: false,
        recovery_point: None,
        late_key,
    };
    Step::put(record, ClaimOutcome::Acquired(acquired), now_ms)
}

/// The same attempt's claim arriving again (its first reply was lost): give
/// the lease back unchanged. It was a takeover if the lease began after the
/// record was created.
fn resent_claim(
    record: &Record,
    lease: &Lease,
    recovery_point: &Option<RecoveryPoint>,
    request: &ClaimRequest,
    policy: &Policy,
) -> Step<ClaimOutcome> {
    debug_assert_eq!(lease.token, request.token, "a re-sent claim carries the lease's token");
    let lease_started_ms = lease.locked_until_ms.saturating_sub(policy.lease_ms());
    let acquired = Acquired {
        lease: held(request, lease),
        takeover: lease_started_ms > record.created_at_ms,
        recovery_point: recovery_point.clone(),
        late_key: false,
    };
    Step::answer(ClaimOutcome::Acquired(acquired))
}

fn take_over(
    record: &Record,
    recovery_point: &Option<RecoveryPoint>,
    request: &ClaimRequest,
    now_ms: u64,
    policy: &Policy,
) -> Step<ClaimOutcome> {
    let lease = Lease {
        token: request.token,
        locked_until_ms: now_ms + policy.lease_ms(),
    };
    // Fencing in time: the lease taken over had ended, so the new one ends
    // strictly later, and the record never loses retention by a takeover.
    if let Some(old) = record.lease() {
        assert!(
            old.locked_until_ms <= now_ms && lease.locked_until_ms > old.locked_until_ms,
            "a takeover replaces an ended lease ({} ms) by a later one ({} ms) at {now_ms} ms",
            old.locked_until_ms,
            lease.locked_until_ms
        );
    }
    let updated = Record {
        state: RecordState::Started {
            lease,
            recovery_point: recovery_point.clone(),
        },
        // The record must outlive the new lease.
        expires_at_ms: record.expires_at_ms.max(now_ms + policy.retention_ms()),
        ..record.clone()
    };
    assert!(updated.expires_at_ms >= record.expires_at_ms);
    assert_same_record(record, &updated);
    let acquired = Acquired {
        lease: held(request, &lease),
        takeover: true,
        recovery_point: recovery_point.clone(),
        late_key: false,
    };
    Step::put(updated, ClaimOutcome::Acquired(acquired), now_ms)
}

fn held(request: &ClaimRequest, lease: &Lease) -> HeldLease {
    HeldLease {
        caller: request.caller.clone(),
        key: request.key.clone(),
        token: lease.token,
        locked_until_ms: lease.locked_until_ms,
    }
}

/// The started record that `token` still holds, if any.
fn held_by(found: Found<'_>, token: LeaseToken, now_ms: u64) -> Option<&Record> {
    let record = found.live(now_ms)?;
    match &record.state {
        RecordState::Started { lease, .. } if lease.token == token => Some(record),
        _ => None,
    }
}

fn lease_lost<T>() -> Step<Fenced<T>> {
    Step::answer(Fenced::LeaseLost)
}

/// Save a recovery point on the record, keeping the lease.
pub fn checkpoint(found: Found<'_>, token: LeaseToken, point: RecoveryPoint, now_ms: u64) -> Step<Fenced> {
    let Some(record) = held_by(found, token, now_ms) else {
        return lease_lost();
    };
    let RecordState::Started { lease, .. } = &record.state else {
        return lease_lost();
    };
    let updated = Record {
        state: RecordState::Started {
            lease: *lease,
            recovery_point: Some(point),
        },
        ..record.clone()
    };
    assert_same_record(record, &updated);
    Step::put(updated, Fenced::Applied(()), now_ms)
}

/// Who may complete a record, checked before any effect runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompletionFence<'a> {
    /// The token holds the started record: run the effect, then complete.
    Held,
    /// This token completed the record already (an earlier try whose commit
    /// outcome was unknown): report success, run and write nothing.
    CompletedByThisToken(&'a SavedResponse),
    /// Another attempt owns the record, or it is gone.
    Lost,
}

pub fn completion_fence(found: Found<'_>, token: LeaseToken, now_ms: u64) -> CompletionFence<'_> {
    if let Some(Record {
        state: RecordState::Completed { response, completed_by },
        ..
    }) = found.live(now_ms)
        && *completed_by == token
    {
        return CompletionFence::CompletedByThisToken(response);
    }
    match held_by(found, token, now_ms) {
        Some(_) => CompletionFence::Held,
        None => CompletionFence::Lost,
    }
}

/// Save the response and end the lease; retention restarts now.
pub fn complete(
    found: Found<'_>,
    token: LeaseToken,
    response: SavedResponse,
    now_ms: u64,
    policy: &Policy,
) -> Step<Fenced> {
    match completion_fence(found, token, now_ms) {
        CompletionFence::CompletedByThisToken(_) => Step::answer(Fenced::Applied(())),
        CompletionFence::Lost => lease_lost(),
        CompletionFence::Held => {
            let Found::Record(record) = found else {
                return lease_lost();
            };
            debug_assert!(
                matches!(&record.state, RecordState::Started { lease, .. } if lease.token == token),
                "only the token holding the started record completes it"
            );
            // A completed record has a response, no lease, and the token
            // that completed it, by its type: nothing to hold it any more.
            let updated = Record {
                state: RecordState::Completed {
                    response,
                    completed_by: token,
                },
                expires_at_ms: now_ms + policy.retention_ms(),
                ..record.clone()
            };
            assert_same_record(record, &updated);
            Step::put(updated, Fenced::Applied(()), now_ms)
        }
    }
}

/// End the lease now, keeping the record, so that the next retry takes over at
/// once. Used when the outcome of the work is unknown (a downstream timeout).
pub fn release(found: Found<'_>, token: LeaseToken, now_ms: u64) -> Step<Fenced> {
    let Some(record) = held_by(found, token, now_ms) else {
        return lease_lost();
    };
    let RecordState::Started { lease, recovery_point } = &record.state else {
        return lease_lost();
    };
    let ended = Lease {
        token,
        locked_until_ms: lease.locked_until_ms.min(now_ms),
    };
    assert!(
        ended.locked_until_ms <= lease.locked_until_ms && ended.locked_until_ms <= now_ms,
        "a release only ever ends a lease sooner"
    );
    let updated = Record {
        state: RecordState::Started {
            lease: ended,
            recovery_point: recovery_point.clone(),
        },
        ..record.clone()
    };
    assert_same_record(record, &updated);
    Step::put(updated, Fenced::Applied(()), now_ms)
}

/// Delete the record: the request failed validation before any effect, so the
/// key is free for a corrected request. A missing record counts as done, so a
/// retried abandon after an unknown commit result succeeds.
pub fn abandon(found: Found<'_>, token: LeaseToken, now_ms: u64) -> Step<Fenced> {
    if found.live(now_ms).is_none() {
        return Step::answer(Fenced::Applied(()));
    }
    match held_by(found, token, now_ms) {
        Some(_) => Step {
            write: Write::Delete,
            outcome: Fenced::Applied(()),
        },
        None => lease_lost(),
    }
}

/// Whether the sweeper may delete this record now.
pub fn is_purgeable(record: &Record, now_ms: u64) -> bool {
    record.is_expired(now_ms)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{CallerId, Fingerprint, IdempotencyKey};

    const NOW: u64 = 1_000_000;
    const LEASE: u64 = 30_000;
    const RETENTION: u64 = 86_400_000;

    fn policy() -> Policy {
        Policy::new(LEASE, RETENTION, 0).unwrap()
    }

    fn request(body: &str) -> ClaimRequest {
        ClaimRequest::new(
            CallerId::new("fulfilment").unwrap(),
            IdempotencyKey::new("label:918273:1:v1").unwrap(),
            Fingerprint::of_request("POST", "/v1/labels", body.as_bytes()),
        )
    }

    fn response() -> SavedResponse {
        SavedResponse::new(201, vec![], b"{\"label_id\":\"L1\"}".to_vec()).unwrap()
    }

    fn put(step: &Step<impl std::fmt::Debug>) -> &Record {
        match &step.write {
            Write::Put(record) => record,
            other => panic!("expected a put, got {other:?}"),
        }
    }

    fn started(request: &ClaimRequest) -> Record {
        put(&claim(Found::Nothing, request, NOW, &policy())).clone()
    }

    fn completed(request: &ClaimRequest) -> Record {
        let record = started(request);
        put(&complete(
            Found::Record(&record),
            request.token,
            response(),
            NOW + 1,
            &policy(),
        ))
        .clone()
    }

    #[test]
    fn no_record_first_request_inserts_with_a_lease() {
        let request = request("a");
        let step = claim(Found::Nothing, &request, NOW, &policy());
        let ClaimOutcome::Acquired(acquired) = &step.outcome else {
            panic!("{:?}", step.outcome)
        };
        assert!(!acquired.takeover && !acquired.late_key && acquired.recovery_point.is_none());
        assert_eq!(acquired.lease.locked_until_ms, NOW + LEASE);
        let record = put(&step);
        assert_eq!(
            record.lease(),
            Some(&Lease {
                token: request.token,
                locked_until_ms: NOW + LEASE
            })
        );
        assert_eq!(record.expires_at_ms, NOW + RETENTION);
        assert_eq!(record.created_at_ms, NOW);
    }

    #[test]
    fn started_fails_validation_deletes_the_record() {
        let request = request("a");
        let record = started(&request);
        let step = abandon(Found::Record(&record), request.token, NOW + 1);
        assert_eq!(
            step,
            Step {
                write: Write::Delete,
                outcome: Fenced::Applied(())
            }
        );
    }

    #[test]
    fn started_repeat_same_body_live_lease_is_in_progress() {
        let record = started(&request("a"));
        let step = claim(Found::Record(&record), &request("a"), NOW + 1_000, &policy());
        assert_eq!(
            step,
            Step::answer(ClaimOutcome::InProgress {
                retry_after_ms: LEASE - 1_000
            })
        );
    }

    #[test]
    fn started_repeat_same_body_expired_lease_takes_over() {
        let first = request("a");
        let mut record = started(&first);
        record.state = RecordState::Started {
            lease: Lease {
                token: first.token,
                locked_until_ms: NOW + LEASE,
            },
            recovery_point: Some(RecoveryPoint::new(b"phase-1".to_vec()).unwrap()),
        };
        let retry = request("a");
        let later = NOW + LEASE;
        let step = claim(Found::Record(&record), &retry, later, &policy());
        let ClaimOutcome::Acquired(acquired) = &step.outcome else {
            panic!("{:?}", step.outcome)
        };
        assert!(acquired.takeover);
        assert_eq!(acquired.recovery_point.as_ref().unwrap().as_bytes(), b"phase-1");
        assert_eq!(
            put(&step).lease(),
            Some(&Lease {
                token: retry.token,
                locked_until_ms: later + LEASE
            })
        );
        assert_eq!(put(&step).created_at_ms, NOW);
    }

    #[test]
    fn started_repeat_new_body_is_a_mismatch() {
        let record = started(&request("a"));
        assert_eq!(
            claim(Found::Record(&record), &request("b"), NOW + 1, &policy()),
            Step::answer(ClaimOutcome::Mismatch)
        );
        // Even once the lease has expired: a different body never takes over.
        let later = NOW + LEASE + 1;
        assert_eq!(
            claim(Found::Record(&record), &request("b"), later, &policy()),
            Step::answer(ClaimOutcome::Mismatch)
        );
    }

    #[test]
    fn started_handler_returns_with_lease_ours_saves_the_response() {
        let request = request("a");
        let record = started(&request);
        let step = complete(Found::Record(&record), request.token, response(), NOW + 5, &policy());
        assert_eq!(step.outcome, Fenced::Applied(()));
        let saved = put(&step);
        assert_eq!(
            saved.state,
            RecordState::Completed {
                response: response(),
                completed_by: request.token
            }
        );
        assert_eq!(saved.expires_at_ms, NOW + 5 + RETENTION);
    }

    #[test]
    fn completed_repeat_same_body_replays() {
        let record = completed(&request("a"));
        let step = claim(Found::Record(&record), &request("a"), NOW + 10, &policy());
        assert_eq!(step, Step::answer(ClaimOutcome::Replay(response())));
    }

    #[test]
    fn completed_repeat_new_body_is_a_mismatch() {
        let record = completed(&request("a"));
        assert_eq!(
            claim(Found::Record(&record), &request("b"), NOW + 10, &policy()),
            Step::answer(ClaimOutcome::Mismatch)
        );
    }

    #[test]
    fn completed_after_retention_is_purgeable_and_then_counts_as_new() {
        let record = completed(&request("a"));
        assert!(!is_purgeable(&record, record.expires_at_ms - 1));
        assert!(is_purgeable(&record, record.expires_at_ms));
        let step = claim(Found::Record(&record), &request("a"), record.expires_at_ms, &policy());
        let ClaimOutcome::Acquired(acquired) = &step.outcome else {
            panic!("{:?}", step.outcome)
        };
        assert!(acquired.late_key && !acquired.takeover);
        let after_sweep = claim(Found::Tombstone, &request("a"), record.expires_at_ms, &policy());
        assert!(matches!(
            after_sweep.outcome,
            ClaimOutcome::Acquired(Acquired { late_key: true, .. })
        ));
    }

    #[test]
    fn a_resent_claim_with_the_same_token_gets_the_same_lease() {
        let request = request("a");
        let record = started(&request);
        let step = claim(Found::Record(&record), &request, NOW + 3, &policy());
        assert_eq!(step.write, Write::Nothing);
        let ClaimOutcome::Acquired(acquired) = step.outcome else {
            panic!()
        };
        assert_eq!(
            (acquired.lease.token, acquired.lease.locked_until_ms),
            (request.token, NOW + LEASE)
        );
        assert!(!acquired.takeover);
    }

    #[test]
    fn stale_tokens_write_nothing() {
        let first = request("a");
        let record = started(&first);
        let retry = request("a");
        let taken = put(&claim(Found::Record(&record), &retry, NOW + LEASE, &policy())).clone();
        let point = RecoveryPoint::new(vec![1]).unwrap();
        let found = Found::Record(&taken);
        let later = NOW + LEASE + 1;
        assert_eq!(checkpoint(found, first.token, point, later), lease_lost());
        assert_eq!(complete(found, first.token, response(), later, &policy()), lease_lost());
        assert_eq!(release(found, first.token, later), lease_lost());
        assert_eq!(abandon(found, first.token, later), lease_lost());
    }

    #[test]
    fn fenced_writes_on_a_completed_record_are_lost_except_its_own_completion() {
        let request = request("a");
        let record = completed(&request);
        let found = Found::Record(&record);
        assert_eq!(
            complete(found, request.token, response(), NOW + 2, &policy()),
            Step::answer(Fenced::Applied(()))
        );
        assert_eq!(
            complete(found, LeaseToken(7), response(), NOW + 2, &policy()),
            lease_lost()
        );
        assert_eq!(release(found, request.token, NOW + 2), lease_lost());
        assert_eq!(abandon(found, request.token, NOW + 2), lease_lost());
    }

    #[test]
    fn release_ends_the_lease_so_the_next_claim_takes_over_at_once() {
        let first = request("a");
        let record = started(&first);
        let released = put(&release(Found::Record(&record), first.token, NOW + 5)).clone();
        assert_eq!(released.lease().unwrap().locked_until_ms, NOW + 5);
        let step = claim(Found::Record(&released), &request("a"), NOW + 5, &policy());
        assert!(matches!(
            step.outcome,
            ClaimOutcome::Acquired(Acquired { takeover: true, .. })
        ));
    }

    #[test]
    fn checkpoint_keeps_the_lease_and_stores_the_point() {
        let request = request("a");
        let record = started(&request);
        let point = RecoveryPoint::new(b"carrier-called".to_vec()).unwrap();
        let step = checkpoint(Found::Record(&record), request.token, point.clone(), NOW + 1);
        let RecordState::Started { lease, recovery_point } = &put(&step).state else {
            panic!()
        };
        assert_eq!((lease.token, recovery_point.as_ref()), (request.token, Some(&point)));
    }

    #[test]
    fn abandon_of_a_missing_record_is_done_already() {
        assert_eq!(
            abandon(Found::Nothing, LeaseToken(1), NOW),
            Step::answer(Fenced::Applied(()))
        );
    }

    /// The invariants are asserted, not assumed: a stored record that breaks
    /// one (here a lease outliving its record, which no transition writes)
    /// stops a debug build at the next write instead of spreading.
    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "a record outlives its lease")]
    fn writing_a_record_whose_lease_outlives_it_is_caught() {
        let request = request("a");
        let mut record = started(&request);
        record.expires_at_ms = NOW + LEASE - 1;
        let point = RecoveryPoint::new(vec![1]).unwrap();
        let _ = checkpoint(Found::Record(&record), request.token, point, NOW + 1);
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "a record expires after it was created")]
    fn writing_a_record_that_expires_before_it_was_created_is_caught() {
        let request = request("a");
        let mut record = started(&request);
        record.created_at_ms = record.expires_at_ms + 1;
        let _ = release(Found::Record(&record), request.token, NOW + 1);
    }

    #[test]
    #[should_panic(expected = "a transition changed the creation time")]
    fn a_transition_that_changes_the_creation_time_is_caught() {
        let before = started(&request("a"));
        let after = Record {
            created_at_ms: before.created_at_ms + 1,
            ..before.clone()
        };
        assert_same_record(&before, &after);
    }

    #[test]
    fn takeover_keeps_the_record_alive_past_the_new_lease() {
        let short = Policy::new(100, 150, 0).unwrap();
        let first = request("a");
        let record = put(&claim(Found::Nothing, &first, NOW, &short)).clone();
        let step = claim(Found::Record(&record), &request("a"), NOW + 140, &short);
        let taken = put(&step);
        assert!(taken.expires_at_ms >= taken.lease().unwrap().locked_until_ms);
    }
}
