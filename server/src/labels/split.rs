//! Records in Redis, labels in a store of their own (the embedded store, or
//! PostgreSQL): the label commits first, then the record. Not atomic: a
//! crash between the two leaves a label without a completed record, and the
//! retry that takes over finds the label through the parcel index (and the
//! carrier's own key, derived from the parcel) instead of buying another.

use super::{Label, LabelStore, LabelTable, Parcel, StoredLabel, label_response};
use crate::failpoints;
use crate::request_context::RequestId;
use async_trait::async_trait;
use std::sync::Arc;
use store_core::{CallerId, Fenced, HeldLease, IdempotencyStore, SavedResponse, StoreError};

pub struct SplitLabels<T: LabelTable> {
    records: Arc<dyn IdempotencyStore>,
    labels: T,
}

impl<T: LabelTable> SplitLabels<T> {
    pub fn new(records: Arc<dyn IdempotencyStore>, labels: T) -> Self {
        Self { records, labels }
    }
}

#[async_trait]
impl<T: LabelTable> LabelStore for SplitLabels<T> {
    fn is_atomic_with_records(&self) -> bool {
        false
    }

    async fn find_for_parcel(&self, caller: &CallerId, parcel: Parcel) -> Result<Option<Label>, StoreError> {
        self.labels.find_for_parcel(caller, parcel).await
    }

    async fn find_by_id(&self, caller: &CallerId, label_id: &str) -> Result<Option<Label>, StoreError> {
        self.labels.find_by_id(caller, label_id).await
    }

    async fn commit(
        &self,
        lease: &HeldLease,
        label: &StoredLabel,
        completed_by: &RequestId,
    ) -> Result<Fenced<SavedResponse>, StoreError> {
        let stored = self.labels.insert(label).await?;
        // The non-atomic window: the label is committed, the record is not.
        failpoints::reached(failpoints::BEFORE_COMMIT).await;
        let saved = label_response(&stored, completed_by)?;
        Ok(match self.records.complete(lease, saved.clone()).await? {
            Fenced::Applied(()) => Fenced::Applied(saved),
            Fenced::LeaseLost => Fenced::LeaseLost,
        })
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.labels.ping().await
    }
}
