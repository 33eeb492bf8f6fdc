//! Atomic completion: a caller's effect and the completed record commit in
//! one transaction, or neither does (docs/design.md#transaction-2).
//!
//! [`AtomicCompletion`] is implemented by the stores that can run the
//! caller's code inside their own transaction: the FDB-style store (both
//! engines: the effect writes through the store's `Transaction`) and
//! PostgreSQL (the effect runs statements on the connection that holds the
//! transaction open). Redis cannot: a Lua script cannot call the caller's
//! code, and Redis shares no transaction with the rows the effect writes
//! (docs/design.md#backend-redis).
//!
//! Every implementation keeps the same promises, which the conformance
//! behaviours in `testkit::atomic` check on each backend:
//!
//! - the fence is checked before the effect runs, so an attempt whose lease
//!   was taken over runs nothing and writes nothing
//!   ([`Completion::LeaseLost`]);
//! - the effect's writes and the completed record commit together: if the
//!   effect fails, or the completion fails after it, neither is written;
//! - a call made again with the same lease after an unknown result (the
//!   commit happened, its reply was lost) finds its own completion and
//!   answers with the saved response, without running the effect again
//!   ([`Completion::AlreadyCompleted`]).

use crate::outcome::{Fenced, HeldLease};
use crate::store::{IdempotencyStore, StoreError};
use crate::types::SavedResponse;
use std::future::Future;
use std::marker::PhantomData;
use std::ops::Deref;
use std::pin::Pin;

/// What an effect returns: the response to save under the key and a value
/// of its own for the caller. It may borrow the transaction's context (for
/// `'t`) and anything the caller lent to the call.
pub type EffectFuture<'t, T, E> = Pin<Box<dyn Future<Output = Result<(SavedResponse, T), E>> + Send + 't>>;

/// What [`AtomicCompletion::complete_with`] returns. Boxed, so that it is
/// `Send` by construction: callers spawn it on multi-threaded runtimes, and
/// the compiler cannot always prove `Send` through the nested closures at
/// the spawn site.
pub type CompleteWithFuture<'a, T, E> =
    Pin<Box<dyn Future<Output = Result<Completion<T>, CompleteWithError<E>>> + Send + 'a>>;

/// The handle an effect writes through (`C`, the backend's
/// [`AtomicCompletion::EffectContext`]), valid while the transaction is open
/// (`'t`), inside a call that borrows its arguments for `'a`.
///
/// The `'a: 't` bound is the point of this wrapper: it tells the compiler
/// that whatever the caller lent to `complete_with` outlives the
/// transaction, so an effect's future may borrow the caller's data instead
/// of cloning it. The handle itself is reached through `Deref` or
/// [`EffectScope::into_context`].
pub struct EffectScope<'t, 'a: 't, C> {
    context: C,
    outlives: PhantomData<&'t &'a ()>,
}

impl<'t, 'a: 't, C> EffectScope<'t, 'a, C> {
    /// Wraps the handle; called by the store, never by an effect.
    pub fn new(context: C) -> Self {
        Self {
            context,
            outlives: PhantomData,
        }
    }

    pub fn context(&self) -> &C {
        &self.context
    }

    pub fn into_context(self) -> C {
        self.context
    }
}

impl<'t, 'a: 't, C> Deref for EffectScope<'t, 'a, C> {
    type Target = C;

    fn deref(&self) -> &C {
        &self.context
    }
}

/// How [`AtomicCompletion::complete_with`] ended, when it did not fail.
#[must_use]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Completion<T> {
    /// The effect ran, and its writes and the completed record committed
    /// together.
    Committed { response: SavedResponse, value: T },
    /// This lease's completion had already committed (an earlier call, or an
    /// earlier try of this call, whose commit outcome was unknown), so the
    /// effect did not run again; here is what was saved.
    AlreadyCompleted { response: SavedResponse },
    /// The lease no longer holds the key: the effect did not run and nothing
    /// was written.
    LeaseLost,
}

impl<T> Completion<T> {
    /// The saved response, however it was saved; the effect's own value is
    /// dropped. For callers that answer the same either way.
    pub fn into_fenced(self) -> Fenced<SavedResponse> {
        match self {
            Completion::Committed { response, .. } | Completion::AlreadyCompleted { response } => {
                Fenced::Applied(response)
            }
            Completion::LeaseLost => Fenced::LeaseLost,
        }
    }
}

/// Why [`AtomicCompletion::complete_with`] wrote nothing. Either way its
/// transaction was rolled back: neither the effect's writes nor the
/// completed record were committed.
#[derive(Debug, thiserror::Error)]
pub enum CompleteWithError<E> {
    /// The store failed; see [`StoreError::is_retryable`]. After a
    /// retryable error the commit outcome may be unknown: call again with
    /// the same lease, and the store answers from the record without running
    /// the effect twice. Errors of the effect's own reads and writes that
    /// the store retries (conflicts) or that mean the store is unavailable
    /// end up here too.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The effect failed for its own reasons; the lease is still held.
    #[error("the effect failed: {0}")]
    Effect(E),
}

impl<E> CompleteWithError<E> {
    /// True when the same call may succeed later: only store errors are.
    pub fn is_retryable(&self) -> bool {
        match self {
            CompleteWithError::Store(error) => error.is_retryable(),
            CompleteWithError::Effect(_) => false,
        }
    }

    /// One [`StoreError`], for callers that report the effect's own failure
    /// as they report the store's.
    pub fn into_store_error(self) -> StoreError
    where
        E: Into<StoreError>,
    {
        match self {
            CompleteWithError::Store(error) => error,
            CompleteWithError::Effect(error) => error.into(),
        }
    }
}

/// A store that commits a caller's effect with the completion, in one
/// transaction (docs/design.md#transaction-2), keeping the promises listed
/// in this module's documentation.
pub trait AtomicCompletion: IdempotencyStore {
    /// What an effect writes through: a handle on the open transaction.
    type EffectContext<'t>: Send;

    /// An effect's own failure. The store sorts the errors of the effect's
    /// reads and writes as it sorts its own: conflicts are retried with a
    /// fresh transaction, unavailability is a [`CompleteWithError::Store`];
    /// the rest comes back as [`CompleteWithError::Effect`].
    type EffectError: std::error::Error + Send + Sync + 'static;

    /// Completes the key and commits `effect`'s writes in the same
    /// transaction, only while `lease` still holds the key.
    ///
    /// The effect must write only through the context it is given: it is
    /// called again, in a fresh transaction, when the store meets a conflict
    /// (which is why it is `Fn`, not `FnOnce`), and whatever it did
    /// elsewhere would not roll back with the transaction.
    fn complete_with<'a, T, F>(
        &'a self,
        lease: &'a HeldLease,
        effect: F,
    ) -> CompleteWithFuture<'a, T, Self::EffectError>
    where
        T: Send + 'a,
        F: for<'t> Fn(EffectScope<'t, 'a, Self::EffectContext<'t>>) -> EffectFuture<'t, T, Self::EffectError>
            + Send
            + Sync
            + 'a;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn saved() -> SavedResponse {
        SavedResponse::new(201, vec![], b"{}".to_vec()).unwrap()
    }

    #[test]
    fn every_completion_but_a_lost_lease_carries_the_saved_response() {
        let committed = Completion::Committed {
            response: saved(),
            value: 7,
        };
        assert_eq!(committed.into_fenced(), Fenced::Applied(saved()));
        let again = Completion::<u8>::AlreadyCompleted { response: saved() };
        assert_eq!(again.into_fenced(), Fenced::Applied(saved()));
        assert_eq!(Completion::<u8>::LeaseLost.into_fenced(), Fenced::LeaseLost);
    }

    #[test]
    fn only_store_errors_are_retryable() {
        let unavailable = CompleteWithError::<std::io::Error>::Store(StoreError::Unavailable {
            detail: "down".into(),
            source: None,
        });
        assert!(unavailable.is_retryable());
        let own = CompleteWithError::Effect(std::io::Error::other("refused"));
        assert!(!own.is_retryable());
    }
}
