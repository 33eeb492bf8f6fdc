//! The PostgreSQL backend, on a throw-away server from store-postgres's
//! harness (or a database given by URL), and its baseline: two single-row
//! `INSERT ... ON CONFLICT DO NOTHING` transactions through the same pool.

use super::{
    Baseline, IntentInputs, KeepAlive, ServerAddress, StoreTarget, TargetError, claim_not_acquired, store_error,
};
use crate::cli::BackendArgs;
use crate::engine::Workload;
use crate::recorder::Outcome;
use futures::future::BoxFuture;
use std::sync::Arc;
use std::sync::LazyLock;
use store_core::{AtomicCompletion, ClaimOutcome, CompleteWithError, Completion, IdempotencyStore, Policy};
use store_postgres::testkit::{PostgresServer, ServerDurability};
use store_postgres::{
    Migration, OwnedRowEffect, PostgresConfig, PostgresStore, ROW_EFFECT_FIRST_PARAMETER, RowCompletion,
};
use store_registry::{OpenedStore, StoreConfig, StoreKind};

/// The intents' effect: one label row, with the completion.
const BENCH_LABEL_INSERT: &str = "INSERT INTO bench_labels (order_id, parcel_no, label_id) VALUES ($1, $2, $3)";
const BENCH_LABEL_ROW: &str = "bench_labels (order_id, parcel_no, label_id)";
/// The same row as `complete_with_row`'s effect, its parameters numbered
/// from `store_postgres::ROW_EFFECT_FIRST_PARAMETER`.
static BENCH_LABEL_VALUES: LazyLock<String> = LazyLock::new(|| {
    let first = ROW_EFFECT_FIRST_PARAMETER;
    format!("${first}::bigint, ${}::integer, ${}::text", first + 1, first + 2)
});
/// The raw baseline's statement, prepared once per connection like the store's.
const RAW_INSERT: &str = "INSERT INTO bench_raw (k, v) VALUES ($1, $2) ON CONFLICT DO NOTHING";

/// Connections in the store's pool: enough for the saturation workers to
/// queue on the database rather than on the pool, within the harness's
/// connection limit.
pub const POOL_SIZE: usize = 64;

/// The bench's own tables: the label rows its effect writes, and the raw
/// baseline's rows.
pub const BENCH_MIGRATIONS: &[Migration] = &[Migration {
    namespace: "idem-bench",
    version: 1,
    name: "bench_labels_and_raw_rows",
    sql: "CREATE TABLE bench_labels (
        order_id  bigint  NOT NULL,
        parcel_no integer NOT NULL,
        label_id  text    NOT NULL,
        PRIMARY KEY (order_id, parcel_no)
    );
    CREATE TABLE bench_raw (
        k bigint PRIMARY KEY,
        v text   NOT NULL
    );",
}];

/// A database URL for `args`: the one given, or a fresh database on a newly
/// started server, with the guard that keeps the server alive.
pub async fn database_for(args: &BackendArgs) -> Result<ServerAddress, TargetError> {
    if let Some(url) = &args.postgres_url {
        return Ok(ServerAddress {
            url: url.clone(),
            guard: None,
            note: "given by --postgres-url".into(),
        });
    }
    let server = tokio::task::block_in_place(|| PostgresServer::start_with(ServerDurability::Durable))
        .map_err(|error| TargetError::unavailable("postgres", error))?;
    let database = server
        .create_database()
        .await
        .map_err(|error| TargetError::unavailable("postgres", error))?;
    let note = "spawned by store-postgres's harness: fsync, synchronous_commit and full_page_writes on".to_owned();
    Ok(ServerAddress {
        url: database.url,
        guard: Some(Box::new(server)),
        note,
    })
}

pub async fn open(args: &BackendArgs, policy: Policy) -> Result<StoreTarget, TargetError> {
    let ServerAddress { url, guard, note } = database_for(args).await?;
    let store_config = StoreConfig {
        kind: StoreKind::Postgres,
        postgres: PostgresConfig {
            pool_size: POOL_SIZE,
            ..PostgresConfig::new(url)
        },
        ..StoreConfig::default()
    };
    let OpenedStore::Postgres(store) = super::open_store(&store_config, policy).await? else {
        return Err(super::other_kind(StoreKind::Postgres));
    };
    store
        .migrate(BENCH_MIGRATIONS)
        .await
        .map_err(|error| TargetError::unavailable("postgres", error))?;
    let mut keep_alive: Vec<KeepAlive> = vec![Box::new(store.clone())];
    keep_alive.extend(guard);
    Ok(StoreTarget {
        backend: "postgres".into(),
        notes: vec![note, format!("pool of {POOL_SIZE} connections")],
        intents: Arc::new(PostgresIntents {
            store: store.clone(),
            inputs: Arc::new(IntentInputs::new("postgres")?),
        }),
        baseline: Some(Baseline {
            name: "raw single-row inserts".into(),
            description: "two autocommit INSERT ... ON CONFLICT DO NOTHING of one row each, through the store's pool"
                .into(),
            workload: Arc::new(RawInserts { store }),
        }),
        references: None,
        keep_alive,
    })
}

struct PostgresIntents {
    store: Arc<PostgresStore>,
    inputs: Arc<IntentInputs>,
}

impl Workload for PostgresIntents {
    fn operation(&self, index: u64) -> BoxFuture<'static, Outcome> {
        let store = self.store.clone();
        let inputs = self.inputs.clone();
        Box::pin(async move { run_intent(&store, &inputs, index).await })
    }
}

/// Claim, then `complete_with` inserting the label row in the same
/// transaction as the completed record (docs/design.md#transaction-2).
async fn run_intent(store: &PostgresStore, inputs: &IntentInputs, index: u64) -> Outcome {
    let (intent, request) = match inputs.claim(index) {
        Ok(claim) => claim,
        Err(outcome) => return outcome,
    };
    let response = &inputs.response;
    let lease = match store.claim(&request).await {
        Ok(ClaimOutcome::Acquired(acquired)) => acquired.lease,
        Ok(other) => return claim_not_acquired(&other),
        Err(error) => return store_error(&error),
    };
    let order_id = i64::try_from(intent.order_id).unwrap_or(i64::MAX);
    let parcel_no = i32::try_from(intent.parcel_no).unwrap_or(i32::MAX);
    let label_id = intent.label_id();
    // As the Label service commits a new label: batched with the other
    // completions in flight (one commit per batch), falling back to the
    // transaction when the lease or the row says otherwise.
    let row = OwnedRowEffect {
        into: BENCH_LABEL_ROW,
        values: BENCH_LABEL_VALUES.as_str(),
        params: vec![Box::new(order_id), Box::new(parcel_no), Box::new(label_id.clone())],
    };
    match store.complete_with_row_in_batch(&lease, response, row).await {
        Ok(RowCompletion::Committed) => return Outcome::success("first_run"),
        Ok(RowCompletion::Undecided) => {}
        Err(error) => return store_error(&error),
    }
    let completed = store
        .complete_with(&lease, |transaction| {
            let response = response.clone();
            let label_id = label_id.clone();
            Box::pin(async move {
                // Prepared once per connection, as the Label service's own
                // label insert is: a plain `execute(&str)` would parse and
                // plan it on every intent, one round trip more.
                let insert = transaction.prepare_cached(BENCH_LABEL_INSERT).await?;
                transaction
                    .execute(&insert, &[&order_id, &parcel_no, &label_id])
                    .await?;
                Ok((response, ()))
            })
        })
        .await;
    match completed {
        // A fresh intent's lease holds and its row is new: counted apart,
        // because the one statement should have taken it.
        Ok(Completion::Committed { .. } | Completion::AlreadyCompleted { .. }) => {
            Outcome::success("first_run_in_a_transaction")
        }
        Ok(Completion::LeaseLost) => Outcome::failure("lease_lost"),
        Err(CompleteWithError::Store(error)) => store_error(&error),
        Err(CompleteWithError::Effect(_)) => Outcome::failure("effect_failed"),
    }
}

/// Two one-row autocommit inserts: what the database costs without the store.
struct RawInserts {
    store: Arc<PostgresStore>,
}

impl Workload for RawInserts {
    fn operation(&self, index: u64) -> BoxFuture<'static, Outcome> {
        let store = self.store.clone();
        Box::pin(async move {
            let Ok(client) = store.pool().get().await else {
                return Outcome::failure("raw_pool_error");
            };
            let Ok(insert) = client.prepare_cached(RAW_INSERT).await else {
                return Outcome::failure("raw_prepare_error");
            };
            for half in 0..2u64 {
                let key = i64::try_from(index * 2 + half).unwrap_or(i64::MAX);
                let inserted = client.execute(&insert, &[&key, &"raw-baseline-row"]).await;
                if inserted.is_err() {
                    return Outcome::failure("raw_insert_error");
                }
            }
            Outcome::success("raw_pair")
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_intent_and_a_raw_pair_run_against_a_real_server() {
        let args = BackendArgs {
            embedded_durability: crate::cli::DurabilityArg::Buffer,
            embedded_dir: None,
            redis_url: None,
            redis_persistence: crate::cli::RedisPersistence::None,
            postgres_url: None,
            foundationdb_cluster_file: None,
            foundationdb_key_prefix: None,
            claim_batch_items_max: None,
        };
        let target = open(&args, Policy::default()).await.unwrap();
        assert_eq!(target.intents.operation(0).await, Outcome::success("first_run"));
        assert_eq!(target.intents.operation(0).await, Outcome::failure("unexpected_replay"));
        let baseline = target.baseline.as_ref().unwrap();
        assert_eq!(baseline.workload.operation(0).await, Outcome::success("raw_pair"));
    }
}
