//! The ways this backend can forget or fail, reproduced against real
//! redis-server processes, each asserting the outcome LIMITS.md documents.

mod common;

use common::{assert_unavailable, claim_until_available, connect, is_first_run, run_once};
use std::error::Error;
use std::time::Duration;
use store_core::testkit::{claim_request, response, unique_caller};
use store_core::{ClaimOutcome, Fenced, IdempotencyStore, RecordState, StoreError};
use store_redis::scripts::Scripts;
use store_redis::testkit::RedisServer;
use store_redis::{RedisConfig, RedisStore, ServerRefusal, WaitConfig};

/// Size of each filler value written to push a server past maxmemory.
const FILLER_BYTES: usize = 64 * 1024;
/// Most filler values written before the test gives up waiting for eviction.
const FILLER_VALUES_MAX: usize = 1_000;

fn warning_kinds(store: &RedisStore) -> Vec<&'static str> {
    store
        .server_report()
        .warnings
        .iter()
        .map(|warning| warning.kind())
        .collect()
}

#[tokio::test]
async fn eviction_under_allkeys_lru_forgets_a_completed_record_and_the_retry_runs_again() {
    let server = RedisServer::start_with_args(&["--maxmemory", "4mb", "--maxmemory-policy", "allkeys-lru"]).unwrap();
    let store = connect(RedisConfig {
        accept_eviction: true,
        ..server.config()
    })
    .await;
    assert!(warning_kinds(&store).contains(&"eviction_accepted"));
    let caller = unique_caller();
    let request = run_once(&store, &caller, "label:918273:1:v1", 1).await;
    assert_eq!(store.claim(&request).await.unwrap(), ClaimOutcome::Replay(response(1)));

    // Other data fills the memory; LRU evicts the record like any other key.
    let record_key = store.keys(&caller, &request.key).record;
    let filler = "x".repeat(FILLER_BYTES);
    let evicted = (0..FILLER_VALUES_MAX).any(|index| {
        server
            .query::<()>(&["SET", &format!("filler:{index}"), &filler])
            .unwrap();
        server.query::<u32>(&["EXISTS", &record_key]).unwrap() == 0
    });
    assert!(evicted, "the record survived {FILLER_VALUES_MAX} filler values");

    // The documented outcome: the retry is a fresh first run, so the effect runs twice.
    let retry = claim_request(&caller, "label:918273:1:v1", "body");
    assert!(is_first_run(&store.claim(&retry).await.unwrap()));
}

#[tokio::test]
async fn out_of_memory_under_noeviction_refuses_writes_up_front_and_writes_nothing() {
    let server = RedisServer::start().unwrap();
    let store = connect(server.config()).await;
    let caller = unique_caller();
    let completed = run_once(&store, &caller, "completed", 1).await;
    let started = claim_request(&caller, "started", "body");
    let ClaimOutcome::Acquired(held) = store.claim(&started).await.unwrap() else {
        panic!("not acquired")
    };
    let before = store.inspect(&caller, &started.key).await.unwrap();

    server.query::<()>(&["CONFIG", "SET", "maxmemory", "1"]).unwrap();
    let fresh = claim_request(&caller, "fresh", "body");
    let refused = store.claim(&fresh).await;
    assert!(
        matches!(&refused, Err(StoreError::Unavailable { detail, .. }) if detail.contains("out of memory")),
        "{refused:?}"
    );
    assert!(refused.unwrap_err().is_retryable(), "memory frees up: retry later");
    let fresh_keys = store.keys(&caller, &fresh.key);
    assert_eq!(
        server
            .query::<u32>(&["EXISTS", &fresh_keys.record, &fresh_keys.tombstone])
            .unwrap(),
        0
    );
    // A completion is refused whole: the record is still started, unchanged.
    assert!(matches!(
        store.complete(&held.lease, response(2)).await,
        Err(StoreError::Unavailable { .. })
    ));
    assert_eq!(store.inspect(&caller, &started.key).await.unwrap(), before);
    // The claim script may write, so even a claim that would only replay is refused.
    assert!(matches!(
        store.claim(&completed).await,
        Err(StoreError::Unavailable { .. })
    ));

    server.query::<()>(&["CONFIG", "SET", "maxmemory", "0"]).unwrap();
    assert!(is_first_run(&store.claim(&fresh).await.unwrap()));
    assert_eq!(
        store.complete(&held.lease, response(2)).await.unwrap(),
        Fenced::Applied(())
    );
}

#[tokio::test]
async fn restart_without_persistence_forgets_completed_keys() {
    let mut server = RedisServer::start().unwrap();
    let store = connect(server.config()).await;
    assert!(warning_kinds(&store).contains(&"no_persistence"));
    let caller = unique_caller();
    run_once(&store, &caller, "k", 1).await;
    server.restart().unwrap();
    let retry = claim_request(&caller, "k", "body");
    let outcome = claim_until_available(&store, &retry).await;
    // Record and tombstone are both gone: a first run, not even flagged late.
    assert!(
        matches!(&outcome, ClaimOutcome::Acquired(a) if !a.takeover && !a.late_key),
        "{outcome:?}"
    );
    assert_ne!(outcome, ClaimOutcome::Replay(response(1)));
}

#[tokio::test]
async fn restart_with_an_append_only_file_fsynced_always_keeps_completed_keys() {
    let mut server = RedisServer::start_with_args(&["--appendonly", "yes", "--appendfsync", "always"]).unwrap();
    let store = connect(server.config()).await;
    assert_eq!(warning_kinds(&store), Vec::<&str>::new());
    let caller = unique_caller();
    let request = run_once(&store, &caller, "k", 1).await;
    server.restart().unwrap();
    assert_eq!(
        claim_until_available(&store, &request).await,
        ClaimOutcome::Replay(response(1))
    );
}

#[tokio::test]
async fn script_cache_loss_is_survived_by_loading_the_script_again() {
    let server = RedisServer::start().unwrap();
    let store = connect(server.config()).await;
    let caller = unique_caller();
    let first = run_once(&store, &caller, "before-flush", 1).await;
    let claim_hash = Scripts::new().claim.get_hash().to_owned();
    assert_eq!(
        server.query::<Vec<u32>>(&["SCRIPT", "EXISTS", &claim_hash]).unwrap(),
        [1]
    );

    server.query::<()>(&["SCRIPT", "FLUSH"]).unwrap();
    assert_eq!(
        server.query::<Vec<u32>>(&["SCRIPT", "EXISTS", &claim_hash]).unwrap(),
        [0]
    );
    assert_eq!(store.claim(&first).await.unwrap(), ClaimOutcome::Replay(response(1)));
    assert!(is_first_run(
        &store
            .claim(&claim_request(&caller, "after-flush", "body"))
            .await
            .unwrap()
    ));
    assert_eq!(
        server.query::<Vec<u32>>(&["SCRIPT", "EXISTS", &claim_hash]).unwrap(),
        [1]
    );
}

#[tokio::test]
async fn startup_check_refuses_an_evicting_server_unless_eviction_is_accepted() {
    let server = RedisServer::start_with_args(&["--maxmemory-policy", "allkeys-lru"]).unwrap();
    let Err(refused) = RedisStore::connect(server.config(), common::policy()).await else {
        panic!("an evicting server was accepted");
    };
    assert!(matches!(refused, StoreError::Refused { .. }) && !refused.is_retryable());
    let reason = refused
        .source()
        .and_then(|source| source.downcast_ref::<ServerRefusal>());
    assert!(
        matches!(reason, Some(ServerRefusal::Eviction { policy, .. }) if policy == "allkeys-lru"),
        "{refused}"
    );

    let accepted = RedisConfig {
        accept_eviction: true,
        ..server.config()
    };
    assert!(warning_kinds(&connect(accepted).await).contains(&"eviction_accepted"));
}

#[tokio::test]
async fn killed_server_is_unavailable_and_the_store_recovers_on_the_same_port() {
    let mut server = RedisServer::start().unwrap();
    let store = connect(server.config()).await;
    let caller = unique_caller();
    run_once(&store, &caller, "before", 1).await;

    server.kill();
    let request = claim_request(&caller, "during", "body");
    assert_unavailable(store.claim(&request).await);
    assert_unavailable(store.inspect(&caller, &request.key).await);
    assert_unavailable(store.ping().await);

    server.restart().unwrap();
    assert!(is_first_run(&claim_until_available(&store, &request).await));
    store.ping().await.unwrap();
}

#[tokio::test]
async fn a_claim_whose_reply_timed_out_may_have_applied_and_resending_it_gets_the_same_lease() {
    let server = RedisServer::start().unwrap();
    let store = connect(RedisConfig {
        response_timeout_ms: 200,
        ..server.config()
    })
    .await;
    let caller = unique_caller();
    let request = claim_request(&caller, "k", "body");

    server.pause().unwrap();
    assert_unavailable(store.claim(&request).await);
    // Thawed, the server runs the claim it had already received.
    server.resume().unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;

    let ClaimOutcome::Acquired(resent) = claim_until_available(&store, &request).await else {
        panic!("the resent claim was not acquired");
    };
    let record = store
        .inspect(&caller, &request.key)
        .await
        .unwrap()
        .expect("the timed-out claim applied");
    assert_eq!(
        record.lease().map(|lease| lease.locked_until_ms),
        Some(resent.lease.locked_until_ms)
    );
    assert!(!resent.takeover);
    let other_attempt = claim_request(&caller, "k", "body");
    assert_eq!(store.claim(&other_attempt).await.unwrap().kind(), "in_progress");
}

/// Waits until `replica` reports its link to its primary is up.
async fn wait_for_replication(replica: &RedisServer) {
    for _ in 0..200 {
        let info: String = replica.query(&["INFO", "replication"]).unwrap();
        if info.contains("master_link_status:up") {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("replication did not start");
}

#[tokio::test]
async fn failover_loses_writes_the_old_primary_acknowledged_and_wait_only_reports_them() {
    let primary = RedisServer::start().unwrap();
    let port = primary.port().to_string();
    let replica = RedisServer::start_with_args(&["--replicaof", "127.0.0.1", &port]).unwrap();
    wait_for_replication(&replica).await;
    let plain = connect(primary.config()).await;
    let waiting = connect(RedisConfig {
        wait: Some(WaitConfig {
            replicas: 1,
            timeout_ms: 300,
        }),
        ..primary.config()
    })
    .await;
    let caller = unique_caller();
    let replicated = run_once(&waiting, &caller, "replicated", 1).await;

    // The replica is promoted (a failover during a partition) while clients
    // still reach the old primary, which goes on acknowledging writes.
    replica.query::<()>(&["REPLICAOF", "NO", "ONE"]).unwrap();
    let acknowledged = run_once(&plain, &caller, "acknowledged", 2).await;
    let reported = claim_request(&caller, "reported", "body");
    assert_unavailable(waiting.claim(&reported).await);

    // Clients move to the new primary: only what was replicated is there.
    let promoted = connect(replica.config()).await;
    assert_eq!(
        promoted.claim(&replicated).await.unwrap(),
        ClaimOutcome::Replay(response(1))
    );
    assert!(is_first_run(&promoted.claim(&acknowledged).await.unwrap()));
    assert!(is_first_run(&promoted.claim(&reported).await.unwrap()));
    let on_old_primary = plain.inspect(&caller, &acknowledged.key).await.unwrap();
    assert!(matches!(
        on_old_primary.map(|record| record.state),
        Some(RecordState::Completed { .. })
    ));
}

#[tokio::test]
async fn checking_again_after_a_config_change_refuses_eviction_turned_on_at_runtime() {
    let server = RedisServer::start().unwrap();
    let store = connect(server.config()).await;
    store.check_server().await.unwrap();
    server
        .query::<()>(&["CONFIG", "SET", "maxmemory-policy", "allkeys-lfu"])
        .unwrap();
    let refused = store.check_server().await.unwrap_err();
    let reason = refused
        .source()
        .and_then(|source| source.downcast_ref::<ServerRefusal>());
    assert!(
        matches!(reason, Some(ServerRefusal::Eviction { policy, .. }) if policy == "allkeys-lfu"),
        "{refused}"
    );
}
