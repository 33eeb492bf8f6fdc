//! Redis errors as store-core's typed errors.
//!
//! Retryable ([`StoreError::Unavailable`]): the connection failed or timed
//! out, or the server said "not now" (loading, a busy script, a cluster
//! reconfiguring, a failover in progress, or out of memory under
//! `noeviction`: nothing was written, and memory frees up as records
//! expire or an operator raises `maxmemory`). A timed-out script may still
//! have run; that is safe because every script is idempotent for the same
//! lease token, so the caller may send the same call again.
//!
//! Permanent: any other server or script error is [`StoreError::Refused`]; a key holding something other than one
//! of this store's records is [`StoreError::Corrupt`]. Scripts fail before
//! their first write, so none of these leaves a half-applied transition.

use redis::{ErrorKind, RedisError, ServerErrorKind};
use store_core::{CodecError, StoreError};

/// The error code the scripts raise for a hash that is not a well-formed record.
pub const CORRUPT_RECORD_CODE: &str = "IDEMCORRUPT";

/// Server error codes that mean "try again later": nothing was decided.
const RETRYABLE_SERVER_CODES: [&str; 2] = ["BUSY", "NOREPLICAS"];

pub fn store_error(operation: &str, error: RedisError) -> StoreError {
    if is_retryable(&error) {
        return StoreError::unavailable(format!("redis {operation}: {error}"), error);
    }
    match error.code() {
        Some(CORRUPT_RECORD_CODE) | Some("WRONGTYPE") => {
            StoreError::Corrupt(CodecError::Malformed(format!("redis {operation}: {error}")))
        }
        Some("OOM") => StoreError::unavailable(
            format!("redis {operation}: out of memory; nothing was written (maxmemory-policy noeviction)"),
            error,
        ),
        _ => StoreError::refused(format!("redis {operation}: {error}"), error),
    }
}

fn is_retryable(error: &RedisError) -> bool {
    match error.kind() {
        ErrorKind::Io | ErrorKind::ClusterConnectionNotFound => true,
        ErrorKind::Server(kind) => matches!(
            kind,
            ServerErrorKind::BusyLoading
                | ServerErrorKind::TryAgain
                | ServerErrorKind::ClusterDown
                | ServerErrorKind::MasterDown
                | ServerErrorKind::ReadOnly
        ),
        ErrorKind::Extension => error.code().is_some_and(|code| RETRYABLE_SERVER_CODES.contains(&code)),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io;

    fn server_error(line: &str) -> RedisError {
        let mut parser = redis::Parser::new();
        match parser.parse_value(format!("-{line}\r\n").as_bytes()) {
            Ok(redis::Value::ServerError(error)) => error.into(),
            other => panic!("not a server error: {other:?}"),
        }
    }

    #[test]
    fn connection_failures_and_timeouts_are_retryable() {
        for kind in [
            io::ErrorKind::TimedOut,
            io::ErrorKind::ConnectionRefused,
            io::ErrorKind::BrokenPipe,
        ] {
            let error = store_error("claim", RedisError::from(io::Error::from(kind)));
            assert!(error.is_retryable(), "{kind:?}: {error}");
        }
        for line in [
            "LOADING loading the dataset",
            "BUSY Redis is busy running a script",
            "TRYAGAIN x",
        ] {
            assert!(store_error("claim", server_error(line)).is_retryable(), "{line}");
        }
    }

    #[test]
    fn out_of_memory_is_retryable() {
        let oom = store_error(
            "claim",
            server_error("OOM command not allowed when used memory > 'maxmemory'."),
        );
        assert!(matches!(oom, StoreError::Unavailable { .. }) && oom.is_retryable());
    }

    #[test]
    fn script_errors_are_refused() {
        let script = store_error(
            "claim",
            server_error("ERR user_script:1: Script attempted to access a key"),
        );
        assert!(matches!(script, StoreError::Refused { .. }));
    }

    #[test]
    fn foreign_values_under_a_record_key_are_corrupt() {
        let wrong_type = server_error("WRONGTYPE Operation against a key holding the wrong kind of value");
        assert!(matches!(store_error("claim", wrong_type), StoreError::Corrupt(_)));
        let malformed = server_error("IDEMCORRUPT record k has an unknown state");
        assert!(matches!(store_error("claim", malformed), StoreError::Corrupt(_)));
    }
}
