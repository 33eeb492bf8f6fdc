//! Claims batched across requests: the claims that arrive while a batch is
//! in flight run together as one engine transaction, so a batch pays one
//! commit instead of one per claim (store-core's [`Batcher`],
//! docs/design.md#backend-foundationdb). A batch sends one commit request
//! and waits for one round of reads where its claims alone would send one
//! each. FoundationDB's commit proxies already batch the commits that reach
//! them together into one write to the transaction logs, so what a batch
//! saves is the client's and the cluster's work per transaction, not a
//! disk write: measured on one server, the capacity did not move either way
//! (bench/results/2026-12-04/claim-batching-ab/README.md).
//!
//! The transaction does for each claim what a claim alone does
//! (`FdbStore::transition`): it reads the item's record (every item's reads
//! issued at once, so the batch waits for one round of reads), runs
//! store-core's `machine::claim` on it with the batch's one clock reading,
//! and applies the machine's write. A conflict with another transaction
//! (`not_committed`) runs the whole batch again in the engine's retry loop,
//! and so does an unknown commit result: each claim recognises its own token
//! on a record an earlier attempt wrote and gets its lease back, so the body
//! is idempotent as a claim alone is.
//!
//! - **The same key twice in one batch.** Only a key's first claim goes into
//!   the transaction; its later claims are answered [`BatchedClaim::Alone`]
//!   once the transaction has committed, and take the unbatched path then,
//!   so they see the first claim's record exactly as if they had come one
//!   after the other (store-core's `first_item_of_each_key`, the rule
//!   PostgreSQL's batches follow too).
//! - **One claim's failure is its own.** A record that does not decode fails
//!   its own claim, with the error the claim would get alone, and the others
//!   go on. A transaction that fails as a whole (the retry limit reached, a
//!   write the engine refuses) sends every claim of the batch alone, where
//!   only a claim that fails alone fails; an engine that did not answer (a
//!   timeout, a storage error) fails the batch's claims as it would have
//!   failed each of them alone: unavailable, retryable. Both are safe even
//!   if the transaction committed: a claim re-sent with its own token finds
//!   its record and gets its lease back.
//! - **Nothing else differs.** A claim ends no started state, so neither
//!   path wakes waiters; a late key (a tombstone) and a takeover are the
//!   machine's decisions on what the read found, the same in both; a
//!   FoundationDB watch on a record fires on the batch's write of it as on
//!   a claim's own.

use crate::engine::{Engine, TRANSACTION_BYTES_MAX, TxError};
use crate::keys::{KeyLayout, Slot};
use crate::store::{Existing, FdbStore};
use async_trait::async_trait;
use store_core::batch::{BATCHES_IN_FLIGHT_MAX, first_item_of_each_key};
use store_core::machine;
use store_core::{BatchLimits, BatchRunner, Batcher, ClaimOutcome, ClaimRequest, RECOVERY_POINT_BYTES_MAX, StoreError};

/// Claims in one batch at most: FoundationDB's limits bound a batch's
/// transaction. The largest write of a claim is a takeover's record, which
/// carries the recovery point (at most 64 KiB); 64 of them affect about
/// 4.5 MB, under half of FoundationDB's 10 MB per transaction (asserted
/// below), so a batch never fails for its size. Its age stays far from 5 s:
/// the batch's reads are issued at once, and its writes are local until the
/// one commit. Batches grow only while claims arrive faster than one batch's
/// transaction, so a larger bound would rarely be reached anyway.
pub const CLAIM_BATCH_ITEMS_MAX: usize = 64;
/// Claims in one batch by default on FoundationDB: the bound itself, as
/// PostgreSQL's default (`store_postgres::BATCH_ITEMS_MAX_DEFAULT`).
pub const CLAIM_BATCH_ITEMS_MAX_DEFAULT_FOUNDATIONDB: usize = CLAIM_BATCH_ITEMS_MAX;
/// Claims in one batch by default on the embedded engine: 1, no batching.
/// Its committer already shares one fdatasync among the commits waiting for
/// it (`embedded/committer.rs`), and measured, batching claims made the
/// store's p99 at 2,000/s seven times worse (BENCHMARKS.md, "Claim batching
/// on the FDB-style stores").
pub const CLAIM_BATCH_ITEMS_MAX_DEFAULT_EMBEDDED: usize = 1;
/// Claim batches in flight at once by default: one batch is read and
/// decided while the other commits (store-core's `batch` module says why
/// few).
pub const CLAIM_BATCHES_IN_FLIGHT_DEFAULT: usize = 2;
/// Most claim batches in flight accepted (store-core's bound).
pub const CLAIM_BATCHES_IN_FLIGHT_MAX: usize = BATCHES_IN_FLIGHT_MAX;
/// Claims waiting for a batch at most; past it a claim is refused as
/// unavailable at once (the engine is not keeping up).
pub const CLAIM_BATCH_QUEUED_ITEMS_MAX: usize = 4_096;

/// The most bytes one claim's write affects: its record (a takeover's
/// carries the recovery point), its chunk and expiry index keys, and the
/// old index entry it clears, with room to spare for the record's own
/// fields.
const CLAIM_WRITE_BYTES_MAX: usize = RECOVERY_POINT_BYTES_MAX + 4_096;
const _: () = assert!(
    CLAIM_BATCH_ITEMS_MAX * CLAIM_WRITE_BYTES_MAX <= TRANSACTION_BYTES_MAX / 2,
    "a full claim batch stays well within FoundationDB's transaction size"
);
const _: () = assert!(CLAIM_BATCH_ITEMS_MAX <= store_core::batch::BATCH_ITEMS_MAX);

/// A batch setting of an engine's config that cannot work, named as in
/// the config file's engine section.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ClaimBatchingError {
    #[error("batch_items_max {0} is outside 1..={CLAIM_BATCH_ITEMS_MAX}")]
    BatchItems(usize),
    #[error("batches_in_flight_max {0} is outside 1..={CLAIM_BATCHES_IN_FLIGHT_MAX}")]
    BatchesInFlight(usize),
}

/// The batcher's limits for an engine config's two settings, both checked
/// whether batching is on or not; `None` when `batch_items_max` is 1 (every
/// claim its own transaction). The one check every engine's config makes.
pub fn claim_batch_limits(
    batch_items_max: usize,
    batches_in_flight_max: usize,
) -> Result<Option<BatchLimits>, ClaimBatchingError> {
    if !(1..=CLAIM_BATCH_ITEMS_MAX).contains(&batch_items_max) {
        return Err(ClaimBatchingError::BatchItems(batch_items_max));
    }
    if !(1..=CLAIM_BATCHES_IN_FLIGHT_MAX).contains(&batches_in_flight_max) {
        return Err(ClaimBatchingError::BatchesInFlight(batches_in_flight_max));
    }
    if batch_items_max == 1 {
        return Ok(None);
    }
    let limits = BatchLimits::new(batch_items_max, CLAIM_BATCH_QUEUED_ITEMS_MAX, batches_in_flight_max)
        .expect("limits within the bounds checked above are store-core's valid limits");
    Ok(Some(limits))
}

/// One claim of a batch, owned: it travels to the batch's task.
#[derive(Debug, Clone)]
pub(crate) struct ClaimItem {
    pub slot: Slot,
    pub request: ClaimRequest,
}

impl ClaimItem {
    pub(crate) fn new(layout: &KeyLayout, request: &ClaimRequest) -> Self {
        Self {
            slot: layout.slot(&request.caller, request.key.digest()),
            request: request.clone(),
        }
    }
}

/// What the batch decided for one claim.
#[derive(Debug)]
pub enum BatchedClaim {
    /// The batch's transaction committed this claim's decision.
    Decided(ClaimOutcome),
    /// The claim fails as it would have failed alone: its record does not
    /// decode, or the engine did not answer the batch.
    Failed(StoreError),
    /// Not decided by the batch: a later claim of a key already in it, a
    /// batch whose transaction failed as a whole, or a batch that ended
    /// without an answer. The unbatched path decides.
    Alone,
}

impl BatchedClaim {
    /// A short name of the variant, for tests and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Decided(_) => "decided",
            Self::Failed(_) => "failed",
            Self::Alone => "alone",
        }
    }
}

/// Runs claim batches on a store without a batcher of its own: the store's
/// engine, key layout, policy, run options and clock.
pub(crate) struct ClaimBatchRunner<E: Engine> {
    store: FdbStore<E>,
}

pub(crate) type ClaimBatcher<E> = Batcher<ClaimBatchRunner<E>>;

impl<E: Engine> ClaimBatchRunner<E> {
    pub(crate) fn new(store: FdbStore<E>) -> Self {
        Self { store }
    }
}

#[async_trait]
impl<E: Engine> BatchRunner for ClaimBatchRunner<E> {
    type Item = ClaimItem;
    type Outcome = BatchedClaim;

    async fn run(&self, items: Vec<ClaimItem>) -> Vec<BatchedClaim> {
        let mut outcomes: Vec<BatchedClaim> = items.iter().map(|_| BatchedClaim::Alone).collect();
        let chosen = first_item_of_each_key(items.iter().map(|item| (&item.slot.caller, &item.slot.digest)));
        let transaction_items: Vec<&ClaimItem> = chosen.iter().map(|&index| &items[index]).collect();
        match self.store.claim_each_in_one_transaction(&transaction_items).await {
            Ok(decided) => {
                assert_eq!(decided.len(), chosen.len(), "one decision per claim in the transaction");
                for (index, outcome) in chosen.into_iter().zip(decided) {
                    assert_decided_on_its_own_request(&items[index], &outcome);
                    outcomes[index] = outcome;
                }
            }
            Err(StoreError::Unavailable { detail, source }) => {
                let detail = match source {
                    Some(source) => format!("{detail}: {source}"),
                    None => detail,
                };
                for outcome in &mut outcomes {
                    *outcome = BatchedClaim::Failed(StoreError::Unavailable {
                        detail: detail.clone(),
                        source: None,
                    });
                }
            }
            Err(error) => {
                tracing::debug!(%error, claims = items.len(), "a claim batch failed; each claim goes alone");
            }
        }
        outcomes
    }
}

/// A lease the batch acquired goes back to the claim that asked for it:
/// decisions are matched to items by position, and a slip would hand one
/// caller another's lease.
fn assert_decided_on_its_own_request(item: &ClaimItem, outcome: &BatchedClaim) {
    if let BatchedClaim::Decided(ClaimOutcome::Acquired(acquired)) = outcome {
        let (lease, request) = (&acquired.lease, &item.request);
        assert!(
            lease.token == request.token && lease.key == request.key && lease.caller == request.caller,
            "a claim batch answers each claim with its own decision"
        );
    }
}

impl<E: Engine> FdbStore<E> {
    /// One transaction that claims every item (each of another key), and
    /// each item's decision, in the items' order.
    pub(crate) async fn claim_each_in_one_transaction(
        &self,
        items: &[&ClaimItem],
    ) -> Result<Vec<BatchedClaim>, StoreError> {
        self.engine()
            .run(self.run_options(), |tx, _maybe_committed| async move {
                // One reading for the whole batch, as a claim alone reads
                // the clock once per attempt.
                let now = self.clock().now_ms();
                let reads = items.iter().map(|item| self.read_existing(&tx, &item.slot, now));
                let found = futures::future::join_all(reads).await;
                let mut decided = Vec::with_capacity(items.len());
                for (item, existing) in items.iter().zip(found) {
                    decided.push(self.claim_in_transaction(&tx, item, existing, now).await?);
                }
                Ok(decided)
            })
            .await
    }

    /// One item of a batch's transaction, on what was read for it: its own
    /// failure, or the machine's decision with its write applied. An engine
    /// error is the whole transaction's, for the retry loop.
    async fn claim_in_transaction(
        &self,
        tx: &E::Tx,
        item: &ClaimItem,
        existing: Result<Existing, TxError>,
        now: u64,
    ) -> Result<BatchedClaim, TxError> {
        let existing = match existing {
            Ok(existing) => existing,
            // Its record does not decode: the error it gets alone (an abort
            // of its own transaction), without ending the others'.
            Err(TxError::Abort(error)) => return Ok(BatchedClaim::Failed(error)),
            Err(engine @ TxError::Engine(_)) => return Err(engine),
        };
        let step = machine::claim(existing.found(), &item.request, now, self.policy());
        self.apply(tx, &item.slot, &existing, step.write).await?;
        Ok(BatchedClaim::Decided(step.outcome))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_settings_outside_their_bounds_are_refused_and_one_turns_batching_off() {
        assert_eq!(claim_batch_limits(0, 2), Err(ClaimBatchingError::BatchItems(0)));
        assert_eq!(
            claim_batch_limits(CLAIM_BATCH_ITEMS_MAX + 1, 2),
            Err(ClaimBatchingError::BatchItems(CLAIM_BATCH_ITEMS_MAX + 1))
        );
        assert_eq!(claim_batch_limits(8, 0), Err(ClaimBatchingError::BatchesInFlight(0)));
        assert_eq!(
            claim_batch_limits(1, CLAIM_BATCHES_IN_FLIGHT_MAX + 1),
            Err(ClaimBatchingError::BatchesInFlight(CLAIM_BATCHES_IN_FLIGHT_MAX + 1)),
            "checked with batching off too"
        );
        assert_eq!(claim_batch_limits(1, 2), Ok(None), "1 is no batching, not an error");
        let limits = claim_batch_limits(CLAIM_BATCH_ITEMS_MAX, CLAIM_BATCHES_IN_FLIGHT_MAX)
            .expect("the bounds are accepted")
            .expect("batching on");
        assert_eq!(limits.items_max(), CLAIM_BATCH_ITEMS_MAX);
        assert_eq!(limits.in_flight_max(), CLAIM_BATCHES_IN_FLIGHT_MAX);
        assert_eq!(limits.queued_items_max(), CLAIM_BATCH_QUEUED_ITEMS_MAX);
    }
}
