//! Forgetting an unreadable record on PostgreSQL. The table's constraints
//! keep out half-written rows, but a row can still satisfy them and not be
//! a record this build reads (a status outside 100-599, a response that
//! does not inflate, a time before
//! 1970, a field past its limit: a hand edit, another tool, a later
//! version's limits). Such a row is deleted, and only such a row.

mod common;

use common::{fresh_database, raw_client};
use std::time::Duration;
use store_core::testkit::{
    claim_request, forget_deletes_an_unreadable_record_and_frees_its_key, response, unique_caller,
};
use store_core::{CallerId, ClaimOutcome, ForgetOutcome, IdempotencyStore, Policy};
use store_postgres::PostgresStore;

/// How long the test holds a row's lock while forget waits for it.
const LOCK_HELD_MS: u64 = 300;

fn policy() -> Policy {
    Policy::new(60_000, 600_000, 60_000).expect("valid policy")
}

/// Claims `key` with body "a" and, when `complete`, completes it.
async fn record(store: &PostgresStore, caller: &CallerId, key: &str, complete: bool) {
    let request = claim_request(caller, key, "a");
    let ClaimOutcome::Acquired(acquired) = store.claim(&request).await.expect("claim") else {
        panic!("{key} was not acquired");
    };
    if complete {
        let fenced = store.complete(&acquired.lease, response(1)).await.expect("complete");
        assert!(fenced.is_applied());
    }
}

/// Runs `sql` on the row of (caller, key), `$1` and `$2` being its key columns.
async fn edit_row(client: &tokio_postgres::Client, sql: &str, caller: &CallerId, key: &str) {
    let digest = claim_request(caller, key, "a").key.digest().0.to_vec();
    let changed = client
        .execute(sql, &[&caller.as_str(), &digest])
        .await
        .expect("edit the row");
    assert_eq!(changed, 1, "{sql}");
}

/// The response in the four columns of a row written before migration
/// 0005, with a status no build writes.
const EARLIER_COLUMNS_WITH_STATUS_42: &str = "UPDATE idempotency_keys SET response = NULL, response_status = 42, \
     response_header_names = '{}', response_header_values = '{}', response_body = '' \
     WHERE caller_id = $1 AND idem_key = $2";

#[tokio::test]
async fn a_completed_row_with_a_status_outside_100_to_599_is_forgotten() {
    let database = fresh_database().await;
    let store = database.migrated_store(policy(), &[]).await.unwrap();
    let client = raw_client(&database.url).await;
    let caller = unique_caller();
    record(&store, &caller, "k", true).await;
    edit_row(&client, EARLIER_COLUMNS_WITH_STATUS_42, &caller, "k").await;
    forget_deletes_an_unreadable_record_and_frees_its_key(&store, &caller, "k", "a").await;
}

#[tokio::test]
async fn a_completed_row_whose_response_does_not_inflate_is_forgotten() {
    let database = fresh_database().await;
    let store = database.migrated_store(policy(), &[]).await.unwrap();
    let client = raw_client(&database.url).await;
    let caller = unique_caller();
    record(&store, &caller, "k", true).await;
    let sql = "UPDATE idempotency_keys SET response = '\\xdeadbeef' WHERE caller_id = $1 AND idem_key = $2";
    edit_row(&client, sql, &caller, "k").await;
    forget_deletes_an_unreadable_record_and_frees_its_key(&store, &caller, "k", "a").await;
}

#[tokio::test]
async fn a_started_row_created_before_1970_is_forgotten() {
    let database = fresh_database().await;
    let store = database.migrated_store(policy(), &[]).await.unwrap();
    let client = raw_client(&database.url).await;
    let caller = unique_caller();
    record(&store, &caller, "k", false).await;
    let sql = "UPDATE idempotency_keys SET created_at = '1969-07-20 20:17:40+00' \
               WHERE caller_id = $1 AND idem_key = $2";
    edit_row(&client, sql, &caller, "k").await;
    forget_deletes_an_unreadable_record_and_frees_its_key(&store, &caller, "k", "a").await;
}

/// The check and the delete are one transaction holding the row's lock:
/// a row repaired by a transaction that committed while forget waited for
/// the lock is judged as repaired, and kept.
#[tokio::test]
async fn a_row_repaired_while_forget_waits_for_its_lock_is_kept() {
    let database = fresh_database().await;
    let store = database.migrated_store(policy(), &[]).await.unwrap();
    let editor = raw_client(&database.url).await;
    let caller = unique_caller();
    record(&store, &caller, "k", true).await;
    let digest = claim_request(&caller, "k", "a").key.digest();
    // A byte in front of the deflated response breaks it; taking it off
    // repairs it.
    let broken = "UPDATE idempotency_keys SET response = '\\x00' || response WHERE caller_id = $1 AND idem_key = $2";
    edit_row(&editor, broken, &caller, "k").await;
    assert!(matches!(
        store.claim(&claim_request(&caller, "k", "a")).await,
        Err(store_core::StoreError::Corrupt(_))
    ));

    editor.batch_execute("BEGIN").await.unwrap();
    let repaired = "UPDATE idempotency_keys SET response = substring(response FROM 2) \
                    WHERE caller_id = $1 AND idem_key = $2";
    edit_row(&editor, repaired, &caller, "k").await;
    let forgetting = {
        let (store, caller) = (store.clone(), caller.clone());
        tokio::spawn(async move { store.forget_unreadable_record(&caller, digest).await })
    };
    tokio::time::sleep(Duration::from_millis(LOCK_HELD_MS)).await;
    assert!(!forgetting.is_finished(), "forget did not wait for the row's lock");
    editor.batch_execute("COMMIT").await.unwrap();

    assert_eq!(forgetting.await.unwrap().unwrap(), ForgetOutcome::Readable);
    assert_eq!(
        store.claim(&claim_request(&caller, "k", "a")).await.unwrap(),
        ClaimOutcome::Replay(response(1))
    );
}
