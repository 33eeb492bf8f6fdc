//! Looking behind the service's back: which labels the label store holds,
//! per parcel, and how many rows the record store holds.

use server::labels::StoredLabel;
use std::collections::BTreeMap;
use std::path::Path;
use store_core::Policy;
use store_fdb::{EmbeddedConfig, EmbeddedStore, Engine, FdbStore, RunOptions, Transaction};
use store_postgres::tokio_postgres;

/// Most rows one census reads.
pub const CENSUS_ROWS_MAX: usize = 10_000_000;

/// (caller, order_id, parcel_no, label_version).
pub type ParcelId = (String, u64, u32, u32);

/// Every label in a label store, grouped by parcel.
#[derive(Debug, Default)]
pub struct LabelCensus {
    pub by_parcel: BTreeMap<ParcelId, Vec<String>>,
}

impl LabelCensus {
    fn add(&mut self, parcel: ParcelId, label_id: String) {
        self.by_parcel.entry(parcel).or_default().push(label_id);
    }

    pub fn labels_total(&self) -> usize {
        self.by_parcel.values().map(Vec::len).sum()
    }

    pub fn parcels_with_more_than_one_label(&self) -> usize {
        self.by_parcel.values().filter(|labels| labels.len() > 1).count()
    }

    /// The labels of one parcel (version 1).
    pub fn labels_of(&self, caller: &str, order_id: u64, parcel_no: u32) -> &[String] {
        self.by_parcel
            .get(&(caller.to_owned(), order_id, parcel_no, 1))
            .map_or(&[], Vec::as_slice)
    }
}

/// Every key of an embedded store, labels and records alike.
pub async fn embedded_pairs(store: &EmbeddedStore) -> Vec<(Vec<u8>, Vec<u8>)> {
    store
        .engine()
        .run(RunOptions::default(), |tx, _| async move {
            Ok(tx.get_range(&[], &[0xff], CENSUS_ROWS_MAX).await?)
        })
        .await
        .expect("scan the embedded store")
}

/// Every key under a store's prefix on a FoundationDB cluster (the cluster
/// is shared, so not the whole keyspace).
#[cfg(feature = "foundationdb")]
pub async fn foundationdb_pairs(store: &store_fdb::FoundationDbStore, prefix: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
    // The prefix's successor: prefixes are "t" and 16 hex digits, so the
    // last byte is never 0xff.
    let mut end = prefix.to_vec();
    *end.last_mut().expect("a prefix") += 1;
    let (begin, end) = (prefix, end.as_slice());
    store
        .engine()
        .run(RunOptions::default(), |tx, _| async move {
            Ok(tx.get_range(begin, end, CENSUS_ROWS_MAX).await?)
        })
        .await
        .expect("scan the store's prefix")
}

/// The labels in an open FDB-style store: the embedded one, or (with the
/// `foundationdb` feature) one on a FoundationDB cluster.
pub async fn census_embedded<E: Engine>(store: &FdbStore<E>) -> LabelCensus {
    let (begin, end) = store.layout().effects().subspace(&("label",)).range();
    let (begin, end) = (&begin, &end);
    let rows = store
        .engine()
        .run(RunOptions::default(), |tx, _| async move {
            Ok(tx.get_range(begin, end, CENSUS_ROWS_MAX).await?)
        })
        .await
        .expect("scan the labels");
    let mut census = LabelCensus::default();
    for (_, value) in rows {
        let stored: StoredLabel = serde_json::from_slice(&value).expect("a label row is a StoredLabel");
        let label = stored.label;
        let parcel = (stored.caller, label.order_id, label.parcel_no, label.label_version);
        census.add(parcel, label.label_id);
    }
    census
}

/// Opens the embedded store a (stopped) server process left in `path`.
pub fn open_embedded_at(path: &Path) -> EmbeddedStore {
    EmbeddedStore::open_embedded(&EmbeddedConfig::new(path), Policy::default()).expect("open the embedded store")
}

/// A connection to a test database, its driver running in the background.
pub async fn postgres_client(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connect to the test database");
    tokio::spawn(connection);
    client
}

/// The labels in a PostgreSQL database.
pub async fn census_postgres(url: &str) -> LabelCensus {
    let client = postgres_client(url).await;
    let rows = client
        .query(
            "SELECT caller_id, order_id::text, parcel_no, label_version, label_id FROM labels",
            &[],
        )
        .await
        .expect("read the labels");
    let mut census = LabelCensus::default();
    for row in rows {
        let order: String = row.get(1);
        let parcel_no: i64 = row.get(2);
        let version: i64 = row.get(3);
        let parcel = (
            row.get::<_, String>(0),
            order.parse().expect("order id"),
            u32::try_from(parcel_no).expect("parcel_no"),
            u32::try_from(version).expect("label_version"),
        );
        census.add(parcel, row.get(4));
    }
    census
}

/// Rows in PostgreSQL's record and tombstone tables.
pub async fn postgres_record_rows(url: &str) -> i64 {
    let client = postgres_client(url).await;
    let row = client
        .query_one(
            "SELECT (SELECT count(*) FROM idempotency_keys) + (SELECT count(*) FROM idempotency_tombstones)",
            &[],
        )
        .await
        .expect("count records");
    row.get(0)
}
