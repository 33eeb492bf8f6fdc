//! The scripts' replies as store-core outcomes. A reply of the wrong shape
//! means this build and the script on the server disagree: it is refused,
//! never guessed at.

use crate::record::recovery_point;
use redis::Value;
use store_core::{Acquired, ClaimOutcome, ClaimRequest, Fenced, HeldLease, StoreError, decode_response};

fn unexpected(script: &str, reply: &impl std::fmt::Debug) -> StoreError {
    StoreError::Refused {
        detail: format!("the {script} script answered with an unexpected reply {reply:?}"),
        source: None,
    }
}

/// The claim script's reply (see `scripts/claim.lua`).
pub fn claim_outcome(reply: Value, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
    let Value::Array(items) = reply else {
        return Err(unexpected("claim", &reply));
    };
    let mut items = items.into_iter();
    let tag = items.next().and_then(bytes);
    match tag.as_deref() {
        Some(b"acquired") => acquired(items.collect(), request).map(ClaimOutcome::Acquired),
        Some(b"replay") => {
            let response = items
                .next()
                .and_then(bytes)
                .ok_or_else(|| unexpected("claim", &"replay"))?;
            Ok(ClaimOutcome::Replay(decode_response(&response)?))
        }
        Some(b"in_progress") => {
            let retry_after_ms = items
                .next()
                .and_then(integer)
                .ok_or_else(|| unexpected("claim", &"in_progress"))?;
            Ok(ClaimOutcome::InProgress { retry_after_ms })
        }
        Some(b"mismatch") => Ok(ClaimOutcome::Mismatch),
        _ => Err(unexpected("claim", &tag)),
    }
}

/// `{locked_until_ms, takeover, late_key, recovery point or nil}`.
fn acquired(items: Vec<Value>, request: &ClaimRequest) -> Result<Acquired, StoreError> {
    let [locked_until, takeover, late_key, point] =
        <[Value; 4]>::try_from(items).map_err(|items| unexpected("claim", &items))?;
    let number = |value: Value| integer(value).ok_or_else(|| unexpected("claim", &"acquired"));
    let recovery_point = match point {
        Value::Nil => None,
        other => Some(recovery_point(
            bytes(other).ok_or_else(|| unexpected("claim", &"point"))?,
        )?),
    };
    Ok(Acquired {
        lease: HeldLease {
            caller: request.caller.clone(),
            key: request.key.clone(),
            token: request.token,
            locked_until_ms: number(locked_until)?,
        },
        takeover: number(takeover)? == 1,
        recovery_point,
        late_key: number(late_key)? == 1,
    })
}

/// `'applied'` or `'lease_lost'` from a fenced write's script.
pub fn fenced_outcome(reply: Value, script: &str) -> Result<Fenced, StoreError> {
    match bytes(reply.clone()).as_deref() {
        Some(b"applied") => Ok(Fenced::Applied(())),
        Some(b"lease_lost") => Ok(Fenced::LeaseLost),
        _ => Err(unexpected(script, &reply)),
    }
}

/// What the forget script did (see `scripts/forget.lua`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForgetReply {
    Deleted,
    NotFound,
    /// The record is not the one judged unreadable any more: nothing deleted.
    Changed,
}

pub fn forget_reply(reply: Value) -> Result<ForgetReply, StoreError> {
    match bytes(reply.clone()).as_deref() {
        Some(b"deleted") => Ok(ForgetReply::Deleted),
        Some(b"not_found") => Ok(ForgetReply::NotFound),
        Some(b"changed") => Ok(ForgetReply::Changed),
        _ => Err(unexpected("forget", &reply)),
    }
}

fn bytes(value: Value) -> Option<Vec<u8>> {
    match value {
        Value::BulkString(bytes) => Some(bytes),
        Value::SimpleString(text) => Some(text.into_bytes()),
        _ => None,
    }
}

fn integer(value: Value) -> Option<u64> {
    match value {
        Value::Int(number) => u64::try_from(number).ok(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use store_core::testkit::{claim_request, unique_caller};

    fn bulk(text: &str) -> Value {
        Value::BulkString(text.as_bytes().to_vec())
    }

    #[test]
    fn acquired_replies_become_leases_for_the_request() {
        let request = claim_request(&unique_caller(), "k", "a");
        let reply = Value::Array(vec![
            bulk("acquired"),
            Value::Int(1_000),
            Value::Int(1),
            Value::Int(0),
            bulk("p"),
        ]);
        let ClaimOutcome::Acquired(acquired) = claim_outcome(reply, &request).unwrap() else {
            panic!("not acquired")
        };
        assert_eq!(
            (acquired.lease.token, acquired.lease.locked_until_ms),
            (request.token, 1_000)
        );
        assert!(acquired.takeover && !acquired.late_key);
        assert_eq!(acquired.recovery_point.unwrap().as_bytes(), b"p");
    }

    #[test]
    fn malformed_replies_are_refused() {
        let request = claim_request(&unique_caller(), "k", "a");
        for reply in [
            Value::Nil,
            Value::Array(vec![bulk("acquired"), Value::Int(1)]),
            Value::Array(vec![bulk("in_progress"), Value::Int(-1)]),
            Value::Array(vec![bulk("replay")]),
            Value::Array(vec![bulk("surprise")]),
        ] {
            assert!(matches!(
                claim_outcome(reply, &request),
                Err(StoreError::Refused { .. })
            ));
        }
        assert!(fenced_outcome(bulk("maybe"), "release").is_err());
        assert_eq!(
            fenced_outcome(bulk("lease_lost"), "release").ok(),
            Some(Fenced::LeaseLost)
        );
    }
}
