//! Bad input and a server that answers with errors: each gets a typed error
//! and leaves no half-written record.

mod common;

use common::{connect, run_once};
use std::collections::HashMap;
use std::error::Error;
use store_core::testkit::{claim_request, response, unique_caller};
use store_core::{
    CallerId, ClaimOutcome, HeldLease, IdempotencyStore, InvalidInput, LeaseToken, RESPONSE_BODY_BYTES_MAX,
    RecoveryPoint, SavedResponse, StoreError,
};
use store_redis::testkit::RedisServer;
use store_redis::{ConfigError, RedisConfig, RedisStore};

type Fields = HashMap<Vec<u8>, Vec<u8>>;

fn assert_corrupt<T: std::fmt::Debug>(result: Result<T, StoreError>) {
    assert!(matches!(result, Err(StoreError::Corrupt(_))), "{result:?}");
}

/// Every store call on (caller, key), each expected to fail as corrupt.
async fn every_call_is_corrupt(store: &RedisStore, caller: &CallerId, key: &str) {
    let request = claim_request(caller, key, "body");
    let lease = HeldLease {
        caller: caller.clone(),
        key: request.key.clone(),
        token: LeaseToken(7),
        locked_until_ms: 0,
    };
    assert_corrupt(store.claim(&request).await);
    assert_corrupt(store.checkpoint(&lease, RecoveryPoint::new(vec![1]).unwrap()).await);
    assert_corrupt(store.complete(&lease, response(1)).await);
    assert_corrupt(store.release(&lease).await);
    assert_corrupt(store.abandon(&lease).await);
    assert_corrupt(store.inspect(caller, &request.key).await);
}

#[tokio::test]
async fn a_key_of_another_type_under_the_record_key_is_corrupt_and_untouched() {
    let server = RedisServer::start().unwrap();
    let store = connect(server.config()).await;
    let caller = unique_caller();
    let keys = store.keys(&caller, &claim_request(&caller, "planted", "body").key);
    server.query::<()>(&["SET", &keys.record, "not a record"]).unwrap();

    every_call_is_corrupt(&store, &caller, "planted").await;
    assert_eq!(server.query::<String>(&["GET", &keys.record]).unwrap(), "not a record");
    assert_eq!(
        server.query::<i64>(&["PTTL", &keys.record]).unwrap(),
        -1,
        "an expiry was set"
    );
    assert_eq!(server.query::<u32>(&["EXISTS", &keys.tombstone]).unwrap(), 0);
}

#[tokio::test]
async fn a_hash_that_is_not_a_record_is_corrupt_and_untouched() {
    let server = RedisServer::start().unwrap();
    let store = connect(server.config()).await;
    let caller = unique_caller();
    let keys = store.keys(&caller, &claim_request(&caller, "planted", "body").key);
    server
        .query::<()>(&["HSET", &keys.record, "state", "bogus", "owner", "someone else"])
        .unwrap();
    let planted: Fields = server.query(&["HGETALL", &keys.record]).unwrap();

    every_call_is_corrupt(&store, &caller, "planted").await;
    assert_eq!(server.query::<Fields>(&["HGETALL", &keys.record]).unwrap(), planted);
    assert_eq!(server.query::<u32>(&["EXISTS", &keys.tombstone]).unwrap(), 0);
}

#[tokio::test]
async fn a_tombstone_of_another_type_makes_the_claim_fail_before_it_writes() {
    let server = RedisServer::start().unwrap();
    let store = connect(server.config()).await;
    let caller = unique_caller();
    let request = claim_request(&caller, "k", "body");
    let keys = store.keys(&caller, &request.key);
    server.query::<()>(&["HSET", &keys.tombstone, "a", "b"]).unwrap();
    assert_corrupt(store.claim(&request).await);
    assert_eq!(server.query::<u32>(&["EXISTS", &keys.record]).unwrap(), 0);
}

#[tokio::test]
async fn a_damaged_saved_response_is_corrupt_not_replayed() {
    let server = RedisServer::start().unwrap();
    let store = connect(server.config()).await;
    let caller = unique_caller();
    let request = run_once(&store, &caller, "k", 1).await;
    let keys = store.keys(&caller, &request.key);
    server
        .query::<()>(&["HSET", &keys.record, "response", "\u{1}garbage"])
        .unwrap();
    let damaged: Fields = server.query(&["HGETALL", &keys.record]).unwrap();
    assert_corrupt(store.claim(&request).await);
    assert_corrupt(store.inspect(&caller, &request.key).await);
    assert_eq!(server.query::<Fields>(&["HGETALL", &keys.record]).unwrap(), damaged);
}

#[tokio::test]
async fn an_oversized_response_is_refused_before_the_store_and_the_record_stays_started() {
    let server = RedisServer::start().unwrap();
    let store = connect(server.config()).await;
    let caller = unique_caller();
    let request = claim_request(&caller, "k", "body");
    let ClaimOutcome::Acquired(acquired) = store.claim(&request).await.unwrap() else {
        panic!("not acquired")
    };
    let before = store.inspect(&caller, &request.key).await.unwrap();
    let oversized = SavedResponse::new(200, vec![], vec![0; RESPONSE_BODY_BYTES_MAX + 1]);
    assert_eq!(
        oversized,
        Err(InvalidInput::ResponseBodyTooLarge {
            length: RESPONSE_BODY_BYTES_MAX + 1
        })
    );
    assert_eq!(store.inspect(&caller, &request.key).await.unwrap(), before);
    assert!(store.complete(&acquired.lease, response(1)).await.unwrap().is_applied());
}

#[tokio::test]
async fn caller_ids_and_key_prefixes_that_could_break_the_hash_tag_are_refused() {
    for odd in ["a{b}", "a}b", "a:b", "a\0b", "é"] {
        assert_eq!(CallerId::new(odd), Err(InvalidInput::CallerId), "{odd:?}");
    }
    let server = RedisServer::start().unwrap();
    let config = RedisConfig {
        key_prefix: "idem{".into(),
        ..server.config()
    };
    let Err(refused) = RedisStore::connect(config, common::policy()).await else {
        panic!("a prefix with a brace was accepted");
    };
    let reason = refused.source().and_then(|source| source.downcast_ref::<ConfigError>());
    assert_eq!(reason, Some(&ConfigError::KeyPrefix));
    assert_eq!(server.query::<u32>(&["DBSIZE"]).unwrap(), 0);
}
