//! Labels in PostgreSQL, in the same database as the records: the label
//! insert and the completed record commit in one transaction
//! (store-core's `AtomicCompletion::complete_with`, transaction 2 of docs/design.md#transaction-2). The table is
//! created by the server's own migration, run by store-postgres's runner.

use super::{Label, LabelStore, LabelTable, Parcel, ShippingService, StoredLabel, label_response};
use crate::failpoints;
use crate::instrumented::timed;
use async_trait::async_trait;
use store_core::{
    AtomicCompletion, CallerId, CompleteWithError, Completion, Fenced, HeldLease, SavedResponse, StoreError,
};
use store_postgres::deadpool_postgres::GenericClient;
use store_postgres::tokio_postgres::{self, Row};
use store_postgres::{EffectError, Migration, PostgresStore};

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

/// Inserts the label unless the parcel has one, and returns the parcel's
/// label either way, in one round trip. The second SELECT reads the
/// statement's snapshot, so a label another transaction committed while the
/// insert waited on it is not seen here: the caller reads it again.
fn insert_or_select_label() -> String {
    format!(
        "WITH inserted AS (\
             INSERT INTO labels (label_id, caller_id, order_id, parcel_no, label_version, service, weight_g, \
                 tracking_no, cost_cents, created_at, created_by_key_sha256) \
             VALUES ($1, $2, $3::text::numeric, $4, $5, $6, $7, $8, $9, $10::text::timestamptz, $11) \
             ON CONFLICT (caller_id, order_id, parcel_no, label_version) DO NOTHING \
             RETURNING {LABEL_COLUMNS}) \
         SELECT * FROM inserted \
         UNION ALL \
         SELECT {LABEL_COLUMNS} FROM labels WHERE caller_id = $2 AND order_id = $3::text::numeric \
             AND parcel_no = $4 AND label_version = $5 AND NOT EXISTS (SELECT 1 FROM inserted)"
    )
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
    let label = &stored.label;
    let order_id = label.order_id.to_string();
    let (parcel_no, label_version) = (i64::from(label.parcel_no), i64::from(label.label_version));
    let weight_g = i32::try_from(label.weight_g).map_err(|error| EffectError::Handler(Box::new(error)))?;
    let cost_cents = i64::try_from(label.cost_cents).map_err(|error| EffectError::Handler(Box::new(error)))?;
    let insert = transaction.prepare_cached(&insert_or_select_label()).await?;
    let mut row = transaction
        .query_opt(
            &insert,
            &[
                &label.label_id,
                &stored.caller,
                &order_id,
                &parcel_no,
                &label_version,
                &service_name(label.service),
                &weight_g,
                &label.tracking_no,
                &cost_cents,
                &label.created_at,
                &stored.created_by_key_sha256,
            ],
        )
        .await?;
    if row.is_none() {
        // Another transaction committed this parcel's label while the insert
        // waited on it; a new statement's snapshot sees it.
        let select = transaction.prepare_cached(&select_by_parcel()).await?;
        row = transaction
            .query_opt(&select, &[&stored.caller, &order_id, &parcel_no, &label_version])
            .await?;
    }
    let Some(row) = row else {
        let detail = format!(
            "label {} for its parcel vanished within the transaction",
            label.label_id
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

    async fn commit(&self, lease: &HeldLease, label: &StoredLabel) -> Result<Fenced<SavedResponse>, StoreError> {
        let commit = self.store.complete_with(lease, |transaction| {
            let stored = label.clone();
            Box::pin(async move {
                let label = insert_or_existing(transaction.into_context(), &stored).await?;
                failpoints::reached(failpoints::BEFORE_COMMIT).await;
                let saved = label_response(&label).map_err(|error| EffectError::Handler(Box::new(error)))?;
                Ok((saved, ()))
            })
        });
        match timed(BACKEND, "label_commit", commit).await {
            Ok(Completion::Committed { response, .. }) | Ok(Completion::AlreadyCompleted { response }) => {
                Ok(Fenced::Applied(response))
            }
            Ok(Completion::LeaseLost) => Ok(Fenced::LeaseLost),
            Err(CompleteWithError::Store(error)) => Err(error),
            Err(CompleteWithError::Effect(error)) => Err(StoreError::refused("the label insert failed", error)),
        }
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
