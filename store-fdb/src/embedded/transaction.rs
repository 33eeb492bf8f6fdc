//! One transaction: a fjall write transaction with FoundationDB's limits
//! (key, value and transaction sizes, the 5 s age), begun on the open
//! database and committed through its committer.

use super::committer;
use super::faults::Fault;
use super::reopen::OpenDatabase;
use super::{EmbeddedEngine, io_error};
use crate::engine::{
    EngineError, EngineErrorKind, KEY_BYTES_MAX, KeyValue, TRANSACTION_BYTES_MAX, TRANSACTION_MS_MAX, Transaction,
    VALUE_BYTES_MAX,
};
use fjall::OptimisticWriteTx as WriteTransaction;
use fjall::Readable;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use store_core::SharedClock;

impl EmbeddedEngine {
    pub(super) async fn begin(&self) -> Result<EmbeddedTx, EngineError> {
        let database = self.database().await?;
        let inner = committer::begin_write(&database.database).map_err(io_error)?;
        Ok(EmbeddedTx(Arc::new(TxState {
            inner: Mutex::new(Some(inner)),
            database,
            clock: self.shared.clock.clone(),
            started_ms: self.shared.clock.monotonic_ms(),
            written_bytes: AtomicUsize::new(0),
        })))
    }

    /// Commits through the committer thread: with durable commits each one
    /// waits for an fdatasync, which must not stall the async workers.
    pub(super) async fn commit(&self, transaction: EmbeddedTx) -> Result<(), EngineError> {
        transaction.0.check_age()?;
        // Taking the transaction out makes any clone the body kept unusable.
        let inner = transaction.0.take()?;
        let committer = &transaction.0.database.committer;
        // A transaction that wrote nothing has nothing to commit, on
        // FoundationDB as here, so it cannot fail at commit. What it read
        // must still be durable before it answers: with durable commits, a
        // read may have seen a commit whose sync is still running.
        let wrote = transaction.0.written_bytes.load(Ordering::Relaxed) > 0;
        if !wrote {
            drop(inner);
            if committer.reads_are_durable() {
                return Ok(());
            }
            return match committer.submit(None).await {
                Ok(_) => Ok(()),
                Err(detail) => Err(EngineError::new(EngineErrorKind::CommitUnknownResult, detail)),
            };
        }
        let fault = self.shared.faults.next();
        match fault {
            Fault::Conflict => return Err(EngineError::new(EngineErrorKind::NotCommitted, "injected conflict")),
            Fault::UnknownBeforeCommit => {
                return Err(EngineError::new(
                    EngineErrorKind::CommitUnknownResult,
                    "injected before commit",
                ));
            }
            Fault::None | Fault::UnknownAfterCommit => {}
        }
        match committer.submit(Some(inner)).await {
            Ok(true) => {}
            Ok(false) => return Err(EngineError::new(EngineErrorKind::NotCommitted, "conflict")),
            // An I/O error during commit or sync leaves the outcome unknown.
            Err(detail) => return Err(EngineError::new(EngineErrorKind::CommitUnknownResult, detail)),
        }
        if let Fault::UnknownAfterCommit = fault {
            return Err(EngineError::new(
                EngineErrorKind::CommitUnknownResult,
                "injected after commit",
            ));
        }
        Ok(())
    }
}

/// One fjall write transaction with FoundationDB's limits.
#[derive(Clone)]
pub struct EmbeddedTx(Arc<TxState>);

struct TxState {
    /// `None` once committed. A mutex because the engine interface shares the
    /// transaction by reference, while fjall writes need `&mut`; it is never
    /// held across an await.
    inner: Mutex<Option<WriteTransaction>>,
    /// The opening this transaction began on; it commits there too.
    database: Arc<OpenDatabase>,
    /// The engine's clock, and its monotonic reading when this began: the
    /// 5 s age limit is measured on it, so a test moves it past 5 s at once.
    clock: SharedClock,
    started_ms: u64,
    written_bytes: AtomicUsize,
}

impl TxState {
    fn check_age(&self) -> Result<(), EngineError> {
        let age_ms = self.clock.monotonic_ms().saturating_sub(self.started_ms);
        if age_ms > TRANSACTION_MS_MAX {
            return Err(EngineError::new(
                EngineErrorKind::TransactionTooOld,
                "transaction older than 5 s",
            ));
        }
        Ok(())
    }

    fn lock(&self) -> Result<MutexGuard<'_, Option<WriteTransaction>>, EngineError> {
        self.check_age()?;
        self.inner.lock().map_err(|_| io_error("transaction lock poisoned"))
    }

    fn take(&self) -> Result<WriteTransaction, EngineError> {
        let mut guard = self.inner.lock().map_err(|_| io_error("transaction lock poisoned"))?;
        guard.take().ok_or_else(|| io_error("transaction already finished"))
    }

    fn with<R>(&self, f: impl FnOnce(&mut WriteTransaction) -> Result<R, EngineError>) -> Result<R, EngineError> {
        let mut guard = self.lock()?;
        let inner = guard.as_mut().ok_or_else(|| io_error("transaction already finished"))?;
        f(inner)
    }

    fn count_written(&self, bytes: usize) -> Result<(), EngineError> {
        let total = self.written_bytes.fetch_add(bytes, Ordering::Relaxed) + bytes;
        if total > TRANSACTION_BYTES_MAX {
            return Err(EngineError::new(
                EngineErrorKind::TransactionTooLarge,
                format!("{total} bytes"),
            ));
        }
        Ok(())
    }

    fn range_now(&self, begin: &[u8], end: &[u8], limit: usize) -> Result<Vec<KeyValue>, EngineError> {
        self.with(|inner| {
            let mut pairs = Vec::new();
            for guard in inner.range(&self.database.keyspace, begin..end).take(limit) {
                let (key, value) = guard.into_inner().map_err(io_error)?;
                pairs.push((key.to_vec(), value.to_vec()));
            }
            Ok(pairs)
        })
    }
}

fn check_key(key: &[u8]) -> Result<(), EngineError> {
    if key.len() > KEY_BYTES_MAX {
        return Err(EngineError::new(
            EngineErrorKind::KeyTooLarge,
            format!("{} bytes", key.len()),
        ));
    }
    Ok(())
}

impl Transaction for EmbeddedTx {
    async fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, EngineError> {
        check_key(key)?;
        let state = &self.0;
        state.with(|inner| {
            Ok(inner
                .get(&state.database.keyspace, key)
                .map_err(io_error)?
                .map(|value| value.to_vec()))
        })
    }

    async fn get_range(&self, begin: &[u8], end: &[u8], limit: usize) -> Result<Vec<KeyValue>, EngineError> {
        self.0.range_now(begin, end, limit)
    }

    fn set(&self, key: &[u8], value: &[u8]) -> Result<(), EngineError> {
        check_key(key)?;
        if value.len() > VALUE_BYTES_MAX {
            return Err(EngineError::new(
                EngineErrorKind::ValueTooLarge,
                format!("{} bytes", value.len()),
            ));
        }
        let state = &self.0;
        state.count_written(key.len() + value.len())?;
        state.with(|inner| {
            inner.insert(&state.database.keyspace, key, value);
            Ok(())
        })
    }

    fn clear(&self, key: &[u8]) -> Result<(), EngineError> {
        check_key(key)?;
        let state = &self.0;
        state.count_written(key.len())?;
        state.with(|inner| {
            inner.remove(&state.database.keyspace, key);
            Ok(())
        })
    }

    /// fjall has no range delete: read the keys and remove each. The read adds
    /// a read conflict FoundationDB would not, which is stricter, never looser.
    async fn clear_range(&self, begin: &[u8], end: &[u8]) -> Result<(), EngineError> {
        let state = &self.0;
        state.count_written(begin.len() + end.len())?;
        let keys: Vec<Vec<u8>> = state
            .range_now(begin, end, usize::MAX)?
            .into_iter()
            .map(|(key, _)| key)
            .collect();
        state.with(|inner| {
            for key in keys {
                inner.remove(&state.database.keyspace, key);
            }
            Ok(())
        })
    }
}
