//! Labels on the FDB-style store (the embedded engine, or FoundationDB).
//!
//! Two rows per label under the store's effects subspace:
//! `("label", label_id) -> StoredLabel JSON` and
//! `("parcel", caller, order_id, parcel_no, label_version) -> label_id`, the
//! uniqueness index. With [`FdbLabels`] the rows commit in the same
//! transaction as the record (store-core's `AtomicCompletion::complete_with`); as a
//! [`LabelTable`] beside Redis records ([`super::SplitLabels`]) they commit
//! on their own first.

use super::{Label, LabelStore, LabelTable, Parcel, StoredLabel, label_response};
use crate::failpoints;
use crate::instrumented::timed;
use crate::request_context::RequestId;
use async_trait::async_trait;
use std::sync::Arc;
use store_core::{
    AtomicCompletion, CallerId, CodecError, CompleteWithError, Completion, Fenced, HeldLease, IdempotencyStore,
    SavedResponse, StoreError,
};
use store_fdb::{Engine, FdbStore, KeyLayout, RunOptions, Transaction, TxError};

/// Labels in the same FDB-style store as the records.
pub struct FdbLabels<E: Engine> {
    store: Arc<FdbStore<E>>,
}

impl<E: Engine> Clone for FdbLabels<E> {
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
        }
    }
}

fn label_key(layout: &KeyLayout, label_id: &str) -> Vec<u8> {
    layout.effects().pack(&("label", label_id))
}

fn parcel_key(layout: &KeyLayout, caller: &str, parcel: Parcel) -> Vec<u8> {
    layout.effects().pack(&(
        "parcel",
        caller,
        parcel.order_id,
        parcel.parcel_no,
        parcel.label_version,
    ))
}

fn corrupt(detail: impl Into<String>) -> TxError {
    TxError::Abort(StoreError::Corrupt(CodecError::Malformed(detail.into())))
}

async fn read_label<T: Transaction>(
    tx: &T,
    layout: &KeyLayout,
    label_id: &str,
) -> Result<Option<StoredLabel>, TxError> {
    let Some(bytes) = tx.get(&label_key(layout, label_id)).await? else {
        return Ok(None);
    };
    let stored = serde_json::from_slice(&bytes).map_err(|error| corrupt(format!("label row: {error}")))?;
    Ok(Some(stored))
}

async fn read_parcel<T: Transaction>(
    tx: &T,
    layout: &KeyLayout,
    caller: &str,
    parcel: Parcel,
) -> Result<Option<StoredLabel>, TxError> {
    let Some(label_id) = tx.get(&parcel_key(layout, caller, parcel)).await? else {
        return Ok(None);
    };
    let label_id = String::from_utf8(label_id).map_err(|_| corrupt("parcel index holds a non-UTF-8 id"))?;
    match read_label(tx, layout, &label_id).await? {
        Some(stored) => Ok(Some(stored)),
        None => Err(corrupt(format!("parcel index names missing label {label_id}"))),
    }
}

/// The unique insert: the parcel's existing label, or this one, written.
async fn insert_or_existing<T: Transaction>(
    tx: &T,
    layout: &KeyLayout,
    label: &StoredLabel,
) -> Result<StoredLabel, TxError> {
    let parcel = label.label.parcel();
    if let Some(existing) = read_parcel(tx, layout, &label.caller, parcel).await? {
        return Ok(existing);
    }
    if read_label(tx, layout, &label.label.label_id).await?.is_some() {
        return Err(TxError::Abort(StoreError::Refused {
            detail: format!("label id {} already names another parcel", label.label.label_id),
            source: None,
        }));
    }
    let row = serde_json::to_vec(label).map_err(|error| corrupt(format!("label: {error}")))?;
    tx.set(&label_key(layout, &label.label.label_id), &row)?;
    tx.set(
        &parcel_key(layout, &label.caller, parcel),
        label.label.label_id.as_bytes(),
    )?;
    Ok(label.clone())
}

impl<E: Engine> FdbLabels<E> {
    pub fn new(store: Arc<FdbStore<E>>) -> Self {
        Self { store }
    }

    fn backend(&self) -> &'static str {
        self.store.engine().name()
    }
}

#[async_trait]
impl<E: Engine> LabelTable for FdbLabels<E> {
    async fn insert(&self, label: &StoredLabel) -> Result<Label, StoreError> {
        let layout = self.store.layout();
        let run = self.store.engine().run(RunOptions::default(), |tx, _| async move {
            insert_or_existing(&tx, layout, label).await
        });
        Ok(timed(self.backend(), "label_insert", run).await?.label)
    }

    async fn find_for_parcel(&self, caller: &CallerId, parcel: Parcel) -> Result<Option<Label>, StoreError> {
        LabelStore::find_for_parcel(self, caller, parcel).await
    }

    async fn find_by_id(&self, caller: &CallerId, label_id: &str) -> Result<Option<Label>, StoreError> {
        LabelStore::find_by_id(self, caller, label_id).await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        LabelStore::ping(self).await
    }
}

#[async_trait]
impl<E: Engine> LabelStore for FdbLabels<E> {
    fn is_atomic_with_records(&self) -> bool {
        true
    }

    async fn find_for_parcel(&self, caller: &CallerId, parcel: Parcel) -> Result<Option<Label>, StoreError> {
        let layout = self.store.layout();
        let caller = caller.as_str();
        let run = self.store.engine().run(RunOptions::default(), |tx, _| async move {
            read_parcel(&tx, layout, caller, parcel).await
        });
        Ok(timed(self.backend(), "label_find_parcel", run)
            .await?
            .map(|stored| stored.label))
    }

    async fn find_by_id(&self, caller: &CallerId, label_id: &str) -> Result<Option<Label>, StoreError> {
        let layout = self.store.layout();
        let run = self.store.engine().run(RunOptions::default(), |tx, _| async move {
            read_label(&tx, layout, label_id).await
        });
        let stored = timed(self.backend(), "label_find_id", run).await?;
        Ok(stored
            .filter(|stored| stored.caller == caller.as_str())
            .map(|stored| stored.label))
    }

    async fn commit(
        &self,
        lease: &HeldLease,
        label: &StoredLabel,
        completed_by: &RequestId,
    ) -> Result<Fenced<SavedResponse>, StoreError> {
        let layout = self.store.layout();
        let commit = self.store.complete_with(lease, |tx| {
            Box::pin(async move {
                let stored = insert_or_existing(tx.context(), layout, label).await?;
                failpoints::reached(failpoints::BEFORE_COMMIT).await;
                Ok((label_response(&stored.label, completed_by).map_err(TxError::Abort)?, ()))
            })
        });
        let commit = async {
            commit
                .await
                .map(Completion::into_fenced)
                .map_err(CompleteWithError::into_store_error)
        };
        timed(self.backend(), "label_commit", commit).await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.store.ping().await
    }
}
