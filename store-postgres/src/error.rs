//! How driver and pool errors become [`StoreError`]s, which of them are
//! retried inside the store, and the errors of the handler-level API.

use deadpool_postgres::PoolError;
use std::error::Error as _;
use store_core::{BoxError, CompleteWithError, StoreError};
use tokio_postgres::error::SqlState;

/// Transactions attempted per call before a conflict is reported as
/// [`StoreError::RetriesExhausted`].
pub const TRANSACTION_ATTEMPTS_MAX: u32 = 5;
/// Longest pause before a retried transaction. The pause grows with the
/// attempt number and is jittered, so callers that deadlocked on each other
/// do not meet again at once.
pub const RETRY_BACKOFF_MS_MAX: u64 = 40;

/// What one failed transaction attempt means to the retry loop.
#[derive(Debug)]
pub(crate) enum Attempt<E> {
    /// A conflict that a fresh transaction may not meet: a serialization
    /// failure, a deadlock, or a row that vanished between two statements.
    /// The transaction was rolled back, so nothing was written.
    Conflict(String),
    /// Final: reported to the caller as it is.
    Fail(E),
}

/// How an error from the database is handled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ErrorClass {
    /// Retry inside the store with a fresh transaction.
    Conflict,
    /// The database could not be reached or did not answer in time.
    Unavailable,
    /// The database answered with an error that retrying will not fix.
    Refused,
}

pub(crate) fn classify(error: &tokio_postgres::Error) -> ErrorClass {
    let Some(code) = error.code() else {
        return classify_without_code(error);
    };
    if *code == SqlState::T_R_SERIALIZATION_FAILURE || *code == SqlState::T_R_DEADLOCK_DETECTED {
        return ErrorClass::Conflict;
    }
    let unavailable_codes = [
        SqlState::QUERY_CANCELED,
        SqlState::LOCK_NOT_AVAILABLE,
        SqlState::IDLE_IN_TRANSACTION_SESSION_TIMEOUT,
        SqlState::ADMIN_SHUTDOWN,
        SqlState::CRASH_SHUTDOWN,
        SqlState::CANNOT_CONNECT_NOW,
        SqlState::TOO_MANY_CONNECTIONS,
        SqlState::READ_ONLY_SQL_TRANSACTION,
    ];
    // Class 08 is "connection exception"; the rest are timeouts, shutdowns
    // and a primary that became a read-only standby: all pass with time.
    if code.code().starts_with("08") || unavailable_codes.contains(code) {
        ErrorClass::Unavailable
    } else {
        ErrorClass::Refused
    }
}

/// Errors with no SQLSTATE never reached the server's executor: a closed
/// connection or an I/O failure is unavailability; anything else (a value
/// that did not convert, a bad config) is a bug that retrying will not fix.
fn classify_without_code(error: &tokio_postgres::Error) -> ErrorClass {
    let mut source = error.source();
    while let Some(cause) = source {
        if cause.is::<std::io::Error>() {
            return ErrorClass::Unavailable;
        }
        source = cause.source();
    }
    if error.is_closed() {
        ErrorClass::Unavailable
    } else {
        ErrorClass::Refused
    }
}

/// The [`StoreError`] for an error that is not retried inside the store.
pub(crate) fn store_error(error: tokio_postgres::Error) -> StoreError {
    if let Some(refusal) = crate::tls::handshake_refusal(&error) {
        return refusal;
    }
    match classify(&error) {
        ErrorClass::Unavailable => StoreError::unavailable("postgresql did not answer", error),
        ErrorClass::Conflict | ErrorClass::Refused => StoreError::refused("postgresql refused the statement", error),
    }
}

pub(crate) fn pool_error(error: PoolError) -> StoreError {
    match error {
        PoolError::Backend(error) => store_error(error),
        PoolError::Timeout(kind) => StoreError::Unavailable {
            detail: format!("no postgresql connection within the pool timeout ({kind:?})"),
            source: None,
        },
        PoolError::Closed => StoreError::Unavailable {
            detail: "the connection pool is closed".to_owned(),
            source: None,
        },
        PoolError::NoRuntimeSpecified => StoreError::Refused {
            detail: "the connection pool has no runtime for its timeouts".to_owned(),
            source: None,
        },
        PoolError::PostCreateHook(error) => StoreError::refused("a pool hook failed", error.to_string()),
    }
}

impl<E: From<StoreError>> From<tokio_postgres::Error> for Attempt<E> {
    fn from(error: tokio_postgres::Error) -> Self {
        match classify(&error) {
            ErrorClass::Conflict => Attempt::Conflict(error.to_string()),
            ErrorClass::Unavailable | ErrorClass::Refused => Attempt::Fail(store_error(error).into()),
        }
    }
}

impl<E: From<StoreError>> From<PoolError> for Attempt<E> {
    fn from(error: PoolError) -> Self {
        Attempt::Fail(pool_error(error).into())
    }
}

impl<E: From<StoreError>> From<StoreError> for Attempt<E> {
    fn from(error: StoreError) -> Self {
        Attempt::Fail(error.into())
    }
}

/// Why the effect passed to the PostgreSQL store's
/// [`store_core::AtomicCompletion::complete_with`] failed.
/// Either way its transaction was rolled back: neither the effect's rows nor
/// the completed record were written.
#[derive(Debug, thiserror::Error)]
pub enum EffectError {
    /// A statement of the effect failed. Serialization failures and
    /// deadlocks never arrive here: the store retries them with a fresh
    /// transaction, calling the effect again.
    #[error("the effect's statement failed: {0}")]
    Database(#[from] tokio_postgres::Error),
    /// The handler decided to fail, for its own reasons.
    #[error("the effect failed: {0}")]
    Handler(BoxError),
}

impl EffectError {
    /// The SQLSTATE of a failed statement, e.g. to recognise a unique
    /// violation (`23505`).
    pub fn code(&self) -> Option<&SqlState> {
        match self {
            EffectError::Database(error) => error.code(),
            EffectError::Handler(_) => None,
        }
    }
}

/// The effect's own failure, sorted like the store's: its conflicts are
/// retried, its lost connections are unavailability, the rest is its own.
pub(crate) fn effect_attempt(error: EffectError) -> Attempt<CompleteWithError<EffectError>> {
    match error {
        EffectError::Database(database) => match classify(&database) {
            ErrorClass::Conflict => Attempt::Conflict(database.to_string()),
            ErrorClass::Unavailable => Attempt::Fail(store_error(database).into()),
            ErrorClass::Refused => Attempt::Fail(CompleteWithError::Effect(EffectError::Database(database))),
        },
        handler @ EffectError::Handler(_) => Attempt::Fail(CompleteWithError::Effect(handler)),
    }
}
