//! The retry loop: FoundationDB's `run` on the embedded engine. It runs the
//! body in a fresh transaction until a commit succeeds, telling it whether
//! an earlier attempt may have committed, with capped exponential backoff.

use super::EmbeddedEngine;
use super::transaction::EmbeddedTx;
use crate::engine::{Engine, MaybeCommitted, RunOptions, TxError};
use std::future::Future;
use std::time::{Duration, Instant};
use store_core::StoreError;

/// First backoff between attempts; doubles up to the cap, with jitter.
const BACKOFF_MS_MIN: u64 = 2;

const BACKOFF_MS_MAX: u64 = 200;

impl Engine for EmbeddedEngine {
    type Tx = EmbeddedTx;

    fn change_hub(&self) -> &store_core::ChangeHub {
        &self.changes
    }

    fn name(&self) -> &'static str {
        "embedded"
    }

    fn claim_batch_limits(&self) -> Option<store_core::BatchLimits> {
        self.shared.claim_batch_limits
    }

    async fn run<T, F, Fut>(&self, options: RunOptions, body: F) -> Result<T, StoreError>
    where
        T: Send,
        F: Fn(Self::Tx, MaybeCommitted) -> Fut + Send + Sync,
        Fut: Future<Output = Result<T, TxError>> + Send,
    {
        let deadline = Instant::now() + Duration::from_millis(options.timeout_ms);
        let mut maybe_committed = MaybeCommitted::No;
        let mut last_error = None;
        let mut attempts = 0;
        for attempt in 0..options.retry_limit {
            attempts += 1;
            let error = match self.attempt(&body, maybe_committed).await {
                Ok(value) => return Ok(value),
                Err(TxError::Abort(error)) => return Err(error),
                Err(TxError::Engine(error)) => error,
            };
            if !error.is_retryable() {
                return Err(error.into_store_error());
            }
            if error.maybe_committed() {
                maybe_committed = MaybeCommitted::Maybe;
            }
            last_error = Some(error);
            let pause = backoff(attempt);
            if Instant::now() + pause >= deadline {
                break;
            }
            tokio::time::sleep(pause).await;
        }
        // No error at all means no attempt was made: a retry limit of 0.
        let detail = match last_error {
            Some(error) => error.to_string(),
            None => "no attempt was made: the retry limit is 0".to_owned(),
        };
        Err(StoreError::RetriesExhausted { attempts, detail })
    }
}

impl EmbeddedEngine {
    async fn attempt<T, F, Fut>(&self, body: &F, maybe_committed: MaybeCommitted) -> Result<T, TxError>
    where
        F: Fn(EmbeddedTx, MaybeCommitted) -> Fut,
        Fut: Future<Output = Result<T, TxError>>,
    {
        let transaction = self.begin().await?;
        let value = body(transaction.clone(), maybe_committed).await?;
        self.commit(transaction).await?;
        Ok(value)
    }
}

/// Capped exponential backoff with full jitter.
fn backoff(attempt: u32) -> Duration {
    let cap = BACKOFF_MS_MIN.saturating_mul(1 << attempt.min(16)).min(BACKOFF_MS_MAX);
    Duration::from_millis(rand::random_range(1..=cap))
}
