//! store-core's conformance suites against a real PostgreSQL server: the
//! store API, and atomic completion (an effect committed with the
//! completion).

mod common;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use store_core::Policy;
use store_core::testkit::SharedStore;
use store_core::testkit::atomic::EffectHarness;
use store_postgres::deadpool_postgres::Client;
use store_postgres::{EffectError, Migration, PostgresStore};

async fn make(policy: Policy) -> SharedStore {
    Arc::new(common::fresh_store(policy).await)
}

store_core::conformance_tests!(make);

/// The atomic completion behaviours' tables: the marker rows effects write,
/// and a switch that makes every completing `UPDATE` of a record fail. The
/// trigger runs inside the completing statement, after the effect's
/// statements and before `COMMIT`: the failure lands between the effect and
/// the commit, where a crash or a lost connection would.
const EFFECT_HARNESS_MIGRATION: Migration = Migration {
    namespace: "conformance",
    version: 1,
    name: "effect harness",
    sql: "CREATE TABLE conformance_markers (name text PRIMARY KEY);
        CREATE TABLE conformance_fail_completions (armed boolean NOT NULL);
        CREATE FUNCTION conformance_fail_completion() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF EXISTS (SELECT 1 FROM conformance_fail_completions) THEN
                RAISE EXCEPTION 'injected: the completion failed after its effect';
            END IF;
            RETURN NEW;
        END $$;
        CREATE TRIGGER conformance_fail_completion BEFORE UPDATE ON idempotency_keys
            FOR EACH ROW WHEN (NEW.state = 'completed') EXECUTE FUNCTION conformance_fail_completion();",
};

struct PostgresEffects {
    store: PostgresStore,
}

impl PostgresEffects {
    /// A statement outside any of the store's transactions, on its pool.
    async fn query(&self, sql: &str, name: &str) -> u64 {
        let client = self.store.pool().get().await.expect("pooled connection");
        client.execute(sql, &[&name]).await.expect("harness statement")
    }
}

impl EffectHarness for PostgresEffects {
    type Store = PostgresStore;

    fn store(&self) -> &PostgresStore {
        &self.store
    }

    fn time(&self) -> store_core::testkit::TestTime {
        store_core::testkit::TestTime::Wall
    }

    fn write_marker<'c>(
        &'c self,
        context: &'c &Client,
        name: &'c str,
    ) -> Pin<Box<dyn Future<Output = Result<(), EffectError>> + Send + 'c>> {
        Box::pin(async move {
            context
                .execute("INSERT INTO conformance_markers (name) VALUES ($1)", &[&name])
                .await?;
            Ok(())
        })
    }

    async fn marker_exists(&self, name: &str) -> bool {
        self.query("SELECT 1 FROM conformance_markers WHERE name = $1", name)
            .await
            == 1
    }

    fn effect_failure(&self, detail: &str) -> EffectError {
        EffectError::Handler(detail.into())
    }

    async fn fail_completions(&self, fail: bool) {
        let client = self.store.pool().get().await.expect("pooled connection");
        let sql = if fail {
            "INSERT INTO conformance_fail_completions (armed) VALUES (true)"
        } else {
            "DELETE FROM conformance_fail_completions"
        };
        client
            .execute(sql, &[])
            .await
            .expect("arm or disarm the completion failure");
    }
}

async fn make_effects(policy: Policy) -> PostgresEffects {
    let store = common::fresh_database()
        .await
        .migrated_store(policy, &[EFFECT_HARNESS_MIGRATION])
        .await
        .expect("migrated store with the effect harness");
    PostgresEffects { store }
}

store_core::atomic_completion_tests!(make_effects);
