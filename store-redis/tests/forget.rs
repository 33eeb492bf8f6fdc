//! Forgetting an unreadable record: every shape of record Redis can hold
//! that the store cannot read is deleted, and its key may be claimed again;
//! a readable record is never deleted, even one written between the
//! store's read and its delete.

mod common;

use common::{connect, run_once};
use std::collections::HashMap;
use store_core::testkit::{claim_request, forget_deletes_an_unreadable_record_and_frees_its_key, unique_caller};
use store_core::{ClaimOutcome, ForgetOutcome, IdempotencyStore};
use store_redis::RedisStore;
use store_redis::scripts::Scripts;
use store_redis::testkit::{RedisCluster, RedisServer};

type Fields = HashMap<Vec<u8>, Vec<u8>>;

/// The record's Redis key of (caller, key text).
fn record_key(store: &RedisStore, caller: &store_core::CallerId, key_text: &str) -> String {
    store.keys(caller, &claim_request(caller, key_text, "body").key).record
}

#[tokio::test]
async fn a_hash_that_is_not_a_record_is_forgotten() {
    let server = RedisServer::start().unwrap();
    let store = connect(server.config()).await;
    let caller = unique_caller();
    let record = record_key(&store, &caller, "planted");
    server.query::<()>(&["HSET", &record, "state", "bogus"]).unwrap();
    forget_deletes_an_unreadable_record_and_frees_its_key(&store, &caller, "planted", "body").await;
}

#[tokio::test]
async fn a_key_of_another_type_is_forgotten() {
    let server = RedisServer::start().unwrap();
    let store = connect(server.config()).await;
    let caller = unique_caller();
    let record = record_key(&store, &caller, "planted");
    server.query::<()>(&["RPUSH", &record, "not", "a", "record"]).unwrap();
    forget_deletes_an_unreadable_record_and_frees_its_key(&store, &caller, "planted", "body").await;
}

/// The scripts read this record (its fields are all there), only the Rust
/// decoder of the saved response refuses it: the judgement is Rust's.
#[tokio::test]
async fn a_record_with_a_damaged_saved_response_is_forgotten() {
    let server = RedisServer::start().unwrap();
    let store = connect(server.config()).await;
    let caller = unique_caller();
    let request = run_once(&store, &caller, "k", 1).await;
    let record = store.keys(&caller, &request.key).record;
    server
        .query::<()>(&["HSET", &record, "response", "\u{1}garbage"])
        .unwrap();
    forget_deletes_an_unreadable_record_and_frees_its_key(&store, &caller, "k", "body").await;
}

/// Forget deletes the record only: the tombstone its claim wrote stays, so
/// the next claim of the key is reported late (a possible duplicate).
#[tokio::test]
async fn forget_keeps_the_tombstone_so_the_next_claim_is_late() {
    let server = RedisServer::start().unwrap();
    let store = connect(server.config()).await;
    let caller = unique_caller();
    let request = run_once(&store, &caller, "k", 1).await;
    let keys = store.keys(&caller, &request.key);
    server.query::<()>(&["HSET", &keys.record, "state", "bogus"]).unwrap();
    let tombstone: String = server.query(&["GET", &keys.tombstone]).unwrap();
    let forgotten = store.forget_unreadable_record(&caller, request.key.digest()).await;
    assert_eq!(forgotten.unwrap(), ForgetOutcome::Deleted);
    assert_eq!(server.query::<u32>(&["EXISTS", &keys.record]).unwrap(), 0);
    assert_eq!(server.query::<String>(&["GET", &keys.tombstone]).unwrap(), tombstone);
    match store.claim(&claim_request(&caller, "k", "body")).await.unwrap() {
        ClaimOutcome::Acquired(acquired) => assert!(acquired.late_key && !acquired.takeover),
        other => panic!("expected acquired, got {other:?}"),
    }
}

/// The script's own guard, for a record that changes after the store read
/// it: handed the fields of an unreadable record, it deletes nothing once
/// the key holds a readable record, or another unreadable one.
#[tokio::test]
async fn the_forget_script_deletes_only_the_record_it_was_shown() {
    let server = RedisServer::start().unwrap();
    let store = connect(server.config()).await;
    let mut connection = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let forget = Scripts::new().forget;
    let caller = unique_caller();
    let request = run_once(&store, &caller, "k", 2).await;
    let record = store.keys(&caller, &request.key).record;
    let readable: Fields = server.query(&["HGETALL", &record]).unwrap();
    let shown: [&[u8]; 3] = [b"hash", b"state", b"bogus"];

    let mut invocation = forget.key(&record);
    for arg in shown {
        invocation.arg(arg);
    }
    let reply: String = invocation.invoke_async(&mut connection).await.unwrap();
    assert_eq!(reply, "changed");
    assert_eq!(server.query::<Fields>(&["HGETALL", &record]).unwrap(), readable);

    // Told the key was no hash: it is one now, so nothing is deleted.
    let reply: String = forget
        .key(&record)
        .arg("not_a_hash")
        .invoke_async(&mut connection)
        .await
        .unwrap();
    assert_eq!(reply, "changed");
    assert_eq!(server.query::<Fields>(&["HGETALL", &record]).unwrap(), readable);

    // Another unreadable hash with one field more than shown: left too.
    server.query::<()>(&["DEL", &record]).unwrap();
    server
        .query::<()>(&["HSET", &record, "state", "bogus", "extra", "x"])
        .unwrap();
    let mut invocation = forget.key(&record);
    for arg in shown {
        invocation.arg(arg);
    }
    let reply: String = invocation.invoke_async(&mut connection).await.unwrap();
    assert_eq!(reply, "changed");
    assert_eq!(server.query::<u32>(&["EXISTS", &record]).unwrap(), 1);

    // Shown exactly what is there: deleted.
    let mut invocation = forget.key(&record);
    for arg in [&b"hash"[..], b"state", b"bogus", b"extra", b"x"] {
        invocation.arg(arg);
    }
    let reply: String = invocation.invoke_async(&mut connection).await.unwrap();
    assert_eq!(reply, "deleted");
    assert_eq!(server.query::<u32>(&["EXISTS", &record]).unwrap(), 0);
}

#[tokio::test]
async fn a_readable_record_is_refused_and_an_absent_one_is_not_found() {
    let server = RedisServer::start().unwrap();
    let store = connect(server.config()).await;
    let caller = unique_caller();
    let request = run_once(&store, &caller, "k", 3).await;
    let record = store.keys(&caller, &request.key).record;
    let before: Fields = server.query(&["HGETALL", &record]).unwrap();
    let readable = store.forget_unreadable_record(&caller, request.key.digest()).await;
    assert_eq!(readable.unwrap(), ForgetOutcome::Readable);
    assert_eq!(server.query::<Fields>(&["HGETALL", &record]).unwrap(), before);
    let absent = claim_request(&caller, "never", "body").key.digest();
    assert_eq!(
        store.forget_unreadable_record(&caller, absent).await.unwrap(),
        ForgetOutcome::NotFound
    );
}

/// On Redis Cluster the read, the script and `WAIT` go to the record's slot.
#[tokio::test]
async fn an_unreadable_record_is_forgotten_on_a_cluster() {
    let cluster = RedisCluster::start().unwrap();
    let store = connect(cluster.config()).await;
    let caller = unique_caller();
    let request = run_once(&store, &caller, "k", 4).await;
    let record = store.keys(&caller, &request.key).record;
    let client = redis::cluster::ClusterClient::new(cluster.urls()).unwrap();
    let mut connection = client.get_async_connection().await.unwrap();
    redis::cmd("HSET")
        .arg(&record)
        .arg("state")
        .arg("bogus")
        .query_async::<()>(&mut connection)
        .await
        .unwrap();
    forget_deletes_an_unreadable_record_and_frees_its_key(&store, &caller, "k", "body").await;
}

/// A rolling upgrade that changes the saved response's format: a record
/// whose response a newer build wrote (the next version byte) is not
/// corruption, and forget keeps it, however often it is asked.
#[tokio::test]
async fn a_record_in_a_newer_format_is_kept() {
    let server = RedisServer::start().unwrap();
    let store = connect(server.config()).await;
    let caller = unique_caller();
    let request = run_once(&store, &caller, "k", 1).await;
    let record = store.keys(&caller, &request.key).record;
    let client = redis::Client::open(server.url()).unwrap();
    let mut connection = client.get_multiplexed_async_connection().await.unwrap();
    let mut response: Vec<u8> = redis::cmd("HGET")
        .arg(&record)
        .arg("response")
        .query_async(&mut connection)
        .await
        .unwrap();
    assert_eq!(response[0], store_core::codec::RESPONSE_FORMAT_VERSION);
    response[0] = store_core::codec::RESPONSE_FORMAT_VERSION + 1;
    redis::cmd("HSET")
        .arg(&record)
        .arg("response")
        .arg(response)
        .query_async::<()>(&mut connection)
        .await
        .unwrap();
    for _ in 0..2 {
        let forgotten = store.forget_unreadable_record(&caller, request.key.digest()).await;
        assert_eq!(forgotten.unwrap(), ForgetOutcome::NewerFormat);
    }
    assert_eq!(server.query::<u32>(&["EXISTS", &record]).unwrap(), 1, "kept");
}
