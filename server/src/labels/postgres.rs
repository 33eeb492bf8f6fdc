//! Labels in PostgreSQL, in the same database as the records: the label
//! insert and the completed record commit in one transaction
//! (store-core's `AtomicCompletion::complete_with`, transaction 2 of docs/design.md#transaction-2). The table is
//! created by the server's own migration, run by store-postgres's runner.

use super::{Label, LabelStore, LabelTable, Parcel, ShippingService, StoredLabel, label_response};
use crate::failpoints;
use crate::instrumented::timed;
use crate::request_context::RequestId;
use async_trait::async_trait;
use std::sync::LazyLock;
use store_core::{
    AtomicCompletion, CallerId, CompleteWithError, Completion, Fenced, HeldLease, SavedResponse, StoreError,
};
use store_postgres::deadpool_postgres::GenericClient;
use store_postgres::tokio_postgres::{self, Row};
use store_postgres::{
    EffectError, Migration, OwnedRowEffect, PostgresStore, ROW_EFFECT_FIRST_PARAMETER, RowCompletion,
};

/// The server's migrations, applied with the store's at startup.
pub const LABELS_MIGRATION: Migration = Migration {
    namespace: "server",
    version: 1,
    name: "labels",
    sql: include_str!("../../migrations/0001_labels.sql"),
};

const BACKEND: &str = "postgres";

const LABEL_COLUMNS: &str = "label_id, order_id::text AS order_id, parcel_no, label_version, service, weight_g, \
     tracking_no, cost_cents, to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"') AS created_at";

/// The table and columns a label is inserted into, in [`LabelValues`]'s order.
const LABEL_ROW: &str = "labels (label_id, caller_id, order_id, parcel_no, label_version, service, weight_g, \
     tracking_no, cost_cents, created_at, created_by_key_sha256)";

/// A label's values as a select list from parameter `$first` on, each cast
/// to its column's type (a `SELECT` list, unlike `VALUES`, gives the server
/// no column to infer a parameter's type from).
fn label_values(first: usize) -> String {
    let casts = [
        "text",
        "text",
        "text::numeric",
        "bigint",
        "bigint",
        "text",
        "integer",
        "text",
        "bigint",
        "text::timestamptz",
        "text",
    ];
    let values: Vec<String> = (first..)
        .zip(casts)
        .map(|(number, cast)| format!("${number}::{cast}"))
        .collect();
    values.join(", ")
}

/// The label as `complete_with_row`'s effect: the values after the
/// completion's own parameters.
static LABEL_ROW_VALUES: LazyLock<String> = LazyLock::new(|| label_values(ROW_EFFECT_FIRST_PARAMETER));

/// Inserts the label unless the parcel has one, and returns the parcel's
/// label either way, in one round trip. The second SELECT reads the
/// statement's snapshot, so a label another transaction committed while the
/// insert waited on it is not seen here: the caller reads it again.
static INSERT_OR_SELECT_LABEL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "WITH inserted AS (\
             INSERT INTO {LABEL_ROW} VALUES ({values}) \
             ON CONFLICT (caller_id, order_id, parcel_no, label_version) DO NOTHING \
             RETURNING {LABEL_COLUMNS}) \
         SELECT * FROM inserted \
         UNION ALL \
         SELECT {LABEL_COLUMNS} FROM labels WHERE caller_id = $2 AND order_id = $3::text::numeric \
             AND parcel_no = $4 AND label_version = $5 AND NOT EXISTS (SELECT 1 FROM inserted)",
        values = label_values(1)
    )
});

/// A stored label as the statement parameters of [`LABEL_ROW`].
struct LabelValues<'a> {
    stored: &'a StoredLabel,
    order_id: String,
    parcel_no: i64,
    label_version: i64,
    service: &'static str,
    weight_g: i32,
    cost_cents: i64,
}

impl<'a> LabelValues<'a> {
    fn of(stored: &'a StoredLabel) -> Result<Self, EffectError> {
        let label = &stored.label;
        Ok(Self {
            stored,
            order_id: label.order_id.to_string(),
            parcel_no: i64::from(label.parcel_no),
            label_version: i64::from(label.label_version),
            service: service_name(label.service),
            weight_g: i32::try_from(label.weight_g).map_err(|error| EffectError::Handler(Box::new(error)))?,
            cost_cents: i64::try_from(label.cost_cents).map_err(|error| EffectError::Handler(Box::new(error)))?,
        })
    }

    fn params(&self) -> [&(dyn tokio_postgres::types::ToSql + Sync); 11] {
        let label = &self.stored.label;
        [
            &label.label_id,
            &self.stored.caller,
            &self.order_id,
            &self.parcel_no,
            &self.label_version,
            &self.service,
            &self.weight_g,
            &label.tracking_no,
            &self.cost_cents,
            &label.created_at,
            &self.stored.created_by_key_sha256,
        ]
    }
}

impl LabelValues<'_> {
    /// [`LabelValues::params`], owned, for a completion that waits in a batch.
    fn owned_params(&self) -> Vec<Box<dyn tokio_postgres::types::ToSql + Send + Sync>> {
        let label = &self.stored.label;
        vec![
            Box::new(label.label_id.clone()),
            Box::new(self.stored.caller.clone()),
            Box::new(self.order_id.clone()),
            Box::new(self.parcel_no),
            Box::new(self.label_version),
            Box::new(self.service),
            Box::new(self.weight_g),
            Box::new(label.tracking_no.clone()),
            Box::new(self.cost_cents),
            Box::new(label.created_at.clone()),
            Box::new(self.stored.created_by_key_sha256.clone()),
        ]
    }
}

fn select_by_parcel() -> String {
    format!(
        "SELECT {LABEL_COLUMNS} FROM labels WHERE caller_id = $1 AND order_id = $2::text::numeric \
         AND parcel_no = $3 AND label_version = $4"
    )
}

fn select_by_id() -> String {
    format!("SELECT {LABEL_COLUMNS} FROM labels WHERE label_id = $1 AND caller_id = $2")
}

/// Labels next to the records in PostgreSQL.
#[derive(Clone)]
pub struct PostgresLabels {
    store: PostgresStore,
}

impl PostgresLabels {
    pub fn new(store: PostgresStore) -> Self {
        Self { store }
    }

    /// The common case: `Some(response)` once the label and the record
    /// committed together, `None` when nothing was written.
    async fn commit_in_one_statement(
        &self,
        lease: &HeldLease,
        stored: &StoredLabel,
        completed_by: &RequestId,
    ) -> Result<Option<SavedResponse>, StoreError> {
        // Neither the label nor the record is written before the statement
        // commits both: a crash here is a crash inside the transaction.
        failpoints::reached(failpoints::BEFORE_COMMIT).await;
        let (Ok(response), Ok(values)) = (label_response(&stored.label, completed_by), LabelValues::of(stored)) else {
            // The transaction's effect reports the same refusal as its own.
            return Ok(None);
        };
        // Batched with the other labels being committed (one transaction
        // and one commit per batch, each fenced by its own lease).
        let row = OwnedRowEffect {
            into: LABEL_ROW,
            values: LABEL_ROW_VALUES.as_str(),
            params: values.owned_params(),
        };
        Ok(
            match self.store.complete_with_row_in_batch(lease, &response, row).await? {
                RowCompletion::Committed => Some(response),
                RowCompletion::Undecided => None,
            },
        )
    }

    async fn commit_in_a_transaction(
        &self,
        lease: &HeldLease,
        stored: &StoredLabel,
        completed_by: &RequestId,
    ) -> Result<Fenced<SavedResponse>, StoreError> {
        let completion = self
            .store
            .complete_with(lease, |transaction| {
                let (stored, completed_by) = (stored.clone(), completed_by.clone());
                Box::pin(async move {
                    let label = insert_or_existing(transaction.into_context(), &stored).await?;
                    failpoints::reached(failpoints::BEFORE_COMMIT).await;
                    let saved =
                        label_response(&label, &completed_by).map_err(|error| EffectError::Handler(Box::new(error)))?;
                    Ok((saved, ()))
                })
            })
            .await;
        match completion {
            Ok(Completion::Committed { response, .. }) | Ok(Completion::AlreadyCompleted { response }) => {
                Ok(Fenced::Applied(response))
            }
            Ok(Completion::LeaseLost) => Ok(Fenced::LeaseLost),
            Err(CompleteWithError::Store(error)) => Err(error),
            Err(CompleteWithError::Effect(error)) => Err(StoreError::refused("the label insert failed", error)),
        }
    }

    async fn query_one_label(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Option<Label>, StoreError> {
        let client = self
            .store
            .pool()
            .get()
            .await
            .map_err(|error| StoreError::unavailable("no postgresql connection", error))?;
        let statement = client.prepare_cached(sql).await.map_err(database_error)?;
        let row = client.query_opt(&statement, params).await.map_err(database_error)?;
        row.as_ref().map(label_from_row).transpose()
    }
}

/// An error with a SQLSTATE is the server refusing the statement; one
/// without never got an answer (a closed connection, a timeout).
fn database_error(error: tokio_postgres::Error) -> StoreError {
    if error.code().is_some() {
        StoreError::refused("postgresql refused a label statement", error)
    } else {
        StoreError::unavailable("postgresql did not answer", error)
    }
}

fn label_from_row(row: &Row) -> Result<Label, StoreError> {
    let corrupt = |detail: String| StoreError::Corrupt(store_core::CodecError::Malformed(detail));
    let get_error = |error: tokio_postgres::Error| corrupt(format!("label row: {error}"));
    let order_id: String = row.try_get("order_id").map_err(get_error)?;
    let service: String = row.try_get("service").map_err(get_error)?;
    let number =
        |value: i64, name: &str| u32::try_from(value).map_err(|_| corrupt(format!("label {name} out of range")));
    Ok(Label {
        label_id: row.try_get("label_id").map_err(get_error)?,
        order_id: order_id
            .parse()
            .map_err(|_| corrupt("label order_id is not a u64".into()))?,
        parcel_no: number(row.try_get("parcel_no").map_err(get_error)?, "parcel_no")?,
        label_version: number(row.try_get("label_version").map_err(get_error)?, "label_version")?,
        service: match service.as_str() {
            "ground" => ShippingService::Ground,
            "express" => ShippingService::Express,
            other => return Err(corrupt(format!("label service {other:?}"))),
        },
        weight_g: number(
            i64::from(row.try_get::<_, i32>("weight_g").map_err(get_error)?),
            "weight_g",
        )?,
        tracking_no: row.try_get("tracking_no").map_err(get_error)?,
        cost_cents: u64::try_from(row.try_get::<_, i64>("cost_cents").map_err(get_error)?)
            .map_err(|_| corrupt("label cost_cents is negative".into()))?,
        created_at: row.try_get("created_at").map_err(get_error)?,
    })
}

fn service_name(service: ShippingService) -> &'static str {
    match service {
        ShippingService::Ground => "ground",
        ShippingService::Express => "express",
    }
}

/// Inserts the label unless the parcel has one, and returns the parcel's
/// label: inside the record's transaction (`complete_with`), or on its own
/// beside Redis records.
async fn insert_or_existing<C: GenericClient>(transaction: &C, stored: &StoredLabel) -> Result<Label, EffectError> {
    let values = LabelValues::of(stored)?;
    let insert = transaction.prepare_cached(&INSERT_OR_SELECT_LABEL).await?;
    let mut row = transaction.query_opt(&insert, &values.params()).await?;
    let (order_id, parcel_no, label_version) = (&values.order_id, &values.parcel_no, &values.label_version);
    if row.is_none() {
        // Another transaction committed this parcel's label while the insert
        // waited on it; a new statement's snapshot sees it.
        let select = transaction.prepare_cached(&select_by_parcel()).await?;
        row = transaction
            .query_opt(&select, &[&stored.caller, order_id, parcel_no, label_version])
            .await?;
    }
    let Some(row) = row else {
        let detail = format!(
            "label {} for its parcel vanished within the transaction",
            stored.label.label_id
        );
        return Err(EffectError::Handler(detail.into()));
    };
    label_from_row(&row).map_err(|error| EffectError::Handler(Box::new(error)))
}

#[async_trait]
impl LabelStore for PostgresLabels {
    fn is_atomic_with_records(&self) -> bool {
        true
    }

    async fn find_for_parcel(&self, caller: &CallerId, parcel: Parcel) -> Result<Option<Label>, StoreError> {
        let (order_id, parcel_no, label_version) = (
            parcel.order_id.to_string(),
            i64::from(parcel.parcel_no),
            i64::from(parcel.label_version),
        );
        let (sql, caller) = (select_by_parcel(), caller.as_str());
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 4] = [&caller, &order_id, &parcel_no, &label_version];
        timed(BACKEND, "label_find_parcel", self.query_one_label(&sql, &params)).await
    }

    async fn find_by_id(&self, caller: &CallerId, label_id: &str) -> Result<Option<Label>, StoreError> {
        let (sql, caller) = (select_by_id(), caller.as_str());
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&label_id, &caller];
        timed(BACKEND, "label_find_id", self.query_one_label(&sql, &params)).await
    }

    /// The label and the completed record in one statement when the label
    /// is new and the lease holds (`complete_with_row`); otherwise in the
    /// transaction of `complete_with`, whose effect answers with the
    /// parcel's label as stored.
    async fn commit(
        &self,
        lease: &HeldLease,
        label: &StoredLabel,
        completed_by: &RequestId,
    ) -> Result<Fenced<SavedResponse>, StoreError> {
        timed(BACKEND, "label_commit", async {
            if let Some(response) = self.commit_in_one_statement(lease, label, completed_by).await? {
                return Ok(Fenced::Applied(response));
            }
            self.commit_in_a_transaction(lease, label, completed_by).await
        })
        .await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        use store_core::IdempotencyStore;
        self.store.ping().await
    }
}

/// Labels in PostgreSQL beside records elsewhere (Redis): the insert
/// commits on its own, in one statement.
#[async_trait]
impl LabelTable for PostgresLabels {
    async fn insert(&self, label: &StoredLabel) -> Result<Label, StoreError> {
        let insert = async {
            let client = self
                .store
                .pool()
                .get()
                .await
                .map_err(|error| StoreError::unavailable("no postgresql connection", error))?;
            insert_or_existing(&client, label).await.map_err(|error| match error {
                EffectError::Database(error) => database_error(error),
                other => StoreError::refused("the label insert failed", other),
            })
        };
        timed(BACKEND, "label_insert", insert).await
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::labels::ShippingService;
    use store_core::{ClaimRequest, Fingerprint, IdempotencyKey, IdempotencyStore, LeaseToken, Policy, RecordState};
    use store_postgres::testkit::PostgresServer;

    async fn labels() -> PostgresLabels {
        let database = PostgresServer::shared().create_database().await.unwrap();
        let store = database
            .migrated_store(Policy::default(), &[LABELS_MIGRATION])
            .await
            .unwrap();
        PostgresLabels::new(store)
    }

    async fn claimed(labels: &PostgresLabels, key: &str) -> HeldLease {
        let request = ClaimRequest {
            caller: CallerId::new("alice").unwrap(),
            key: IdempotencyKey::new(key).unwrap(),
            fingerprint: Fingerprint([7; 32]),
            token: LeaseToken(rand::random()),
        };
        match labels.store.claim(&request).await.unwrap() {
            store_core::ClaimOutcome::Acquired(acquired) => acquired.lease,
            other => panic!("a new key is acquired, not {other:?}"),
        }
    }

    fn completed_by() -> RequestId {
        RequestId::new("fulfilment-4711").unwrap()
    }

    fn stored(label_id: &str) -> StoredLabel {
        StoredLabel {
            label: Label {
                label_id: label_id.to_owned(),
                order_id: 9_007_199_254_740_991,
                parcel_no: 2,
                label_version: 1,
                service: ShippingService::Express,
                weight_g: 70_000,
                tracking_no: "1Z-TRACK".to_owned(),
                cost_cents: 1_234,
                created_at: "2026-12-02T06:30:00.123Z".to_owned(),
            },
            caller: "alice".to_owned(),
            created_by_key_sha256: "ab".repeat(32),
        }
    }

    #[tokio::test]
    async fn a_new_label_commits_with_its_record_in_one_statement_and_reads_back_as_answered() {
        let labels = labels().await;
        let lease = claimed(&labels, "one-statement").await;
        let label = stored("lbl_one_statement");
        let response = labels
            .commit_in_one_statement(&lease, &label, &completed_by())
            .await
            .unwrap()
            .expect("a new label for a held lease commits in one statement");
        let record = labels.store.inspect(&lease.caller, &lease.key).await.unwrap().unwrap();
        let RecordState::Completed { response: saved, .. } = record.state else {
            panic!("the record is completed");
        };
        assert_eq!(saved, response);
        let read = LabelStore::find_by_id(&labels, &lease.caller, &label.label.label_id)
            .await
            .unwrap();
        assert_eq!(read.as_ref(), Some(&label.label), "the label as stored");
        assert_eq!(
            label_response(&read.unwrap(), &completed_by()).unwrap(),
            response,
            "answered as it reads back"
        );
    }

    #[tokio::test]
    async fn a_parcel_that_has_its_label_is_left_to_the_transaction_which_answers_with_that_label() {
        let labels = labels().await;
        let first = claimed(&labels, "first-key").await;
        let existing = stored("lbl_first");
        assert_eq!(
            LabelStore::commit(&labels, &first, &existing, &completed_by())
                .await
                .unwrap(),
            Fenced::Applied(label_response(&existing.label, &completed_by()).unwrap())
        );
        let second = claimed(&labels, "second-key").await;
        let another = stored("lbl_second");
        assert_eq!(
            labels
                .commit_in_one_statement(&second, &another, &completed_by())
                .await
                .unwrap(),
            None
        );
        let record = labels
            .store
            .inspect(&second.caller, &second.key)
            .await
            .unwrap()
            .unwrap();
        assert!(matches!(record.state, RecordState::Started { .. }), "nothing written");
        assert_eq!(
            LabelStore::commit(&labels, &second, &another, &completed_by())
                .await
                .unwrap(),
            Fenced::Applied(label_response(&existing.label, &completed_by()).unwrap()),
            "the parcel's one label"
        );
    }
}
