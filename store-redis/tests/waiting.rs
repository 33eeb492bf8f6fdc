//! Waiting on Redis (docs/design.md#waiting): store-core's waiting suite on
//! two store instances (each with its own connections and its own
//! subscriber) over one standalone server and over one three-master
//! cluster, and what happens when the subscriber connection is killed.

use std::time::Duration;
use store_core::testkit::waiting::{WAIT_TEST_POLL_INTERVAL_MS, waiting_policy};
use store_core::testkit::{SharedStore, claim_request, response, unique_caller};
use store_core::{CallerId, ClaimOutcome, Fenced, IdempotencyStore, Policy, WaitLimits, Woken};
use store_redis::RedisStore;
use store_redis::testkit::{RedisServer, shared_cluster, shared_server, two_instances};
use tokio::time::Instant;

async fn standalone_pair(policy: Policy) -> (SharedStore, SharedStore) {
    let server = shared_server().expect("redis-server starts");
    two_instances(server.clone(), server.config(), policy).await
}

async fn cluster_pair(policy: Policy) -> (SharedStore, SharedStore) {
    let cluster = shared_cluster().expect("redis cluster starts");
    two_instances(cluster.clone(), cluster.config(), policy).await
}

mod standalone {
    store_core::waiting_tests!(super::standalone_pair);
}

mod cluster {
    store_core::waiting_tests!(super::cluster_pair);
}

/// The poll interval of the lost-subscriber tests: short, so the tests are.
const LOST_SUBSCRIBER_POLL_MS: u64 = 400;

/// Kills every subscriber connection on `nodes` (`CLIENT KILL TYPE pubsub`)
/// and returns how many it killed.
fn kill_subscribers(nodes: &[&RedisServer]) -> i64 {
    nodes
        .iter()
        .map(|node| {
            node.query::<i64>(&["CLIENT", "KILL", "TYPE", "pubsub"])
                .expect("client kill")
        })
        .sum()
}

async fn acquire(store: &RedisStore, caller: &CallerId, key: &str) -> store_core::HeldLease {
    match store.claim(&claim_request(caller, key, "body")).await.unwrap() {
        ClaimOutcome::Acquired(acquired) => acquired.lease,
        other => panic!("expected acquired, got {other:?}"),
    }
}

/// Takes the wake-ups of an arming (a subscription is confirmed both by its
/// reply and by a push) out of the way, so the next one is the write's.
async fn drain_wake_ups(watch: &mut store_core::RecordWatch) {
    while watch.changed(Instant::now() + Duration::from_millis(300)).await == Woken::Notified {}
}

/// A waiter whose subscriber connection is killed just before the record's
/// completion is still woken (by the poll, or by the resubscription's
/// wake-up), and a later completion wakes a later waiter by notification
/// again: the subscriber came back.
async fn lost_subscriber_is_covered(waiting: RedisStore, writing: RedisStore, nodes: &[&RedisServer]) {
    let policy_hub = waiting.record_changes().expect("waiting").clone();
    policy_hub.set_limits(WaitLimits::new(8, 8, LOST_SUBSCRIBER_POLL_MS).unwrap());
    let caller = unique_caller();
    let lease = acquire(&writing, &caller, "k").await;
    let request = claim_request(&caller, "k", "body");
    let mut watch = policy_hub.subscribe(&caller, &request.key).expect("subscribe");
    // The subscription's confirmation wakes the waiter: it is armed.
    assert_eq!(
        watch.changed(Instant::now() + Duration::from_secs(5)).await,
        Woken::Notified
    );
    drain_wake_ups(&mut watch).await;
    assert!(kill_subscribers(nodes) >= 1, "no subscriber connection to kill");
    assert_eq!(
        writing.complete(&lease, response(4)).await.unwrap(),
        Fenced::Applied(())
    );
    let completed_at = Instant::now();
    let woken = watch.changed(completed_at + Duration::from_secs(10)).await;
    let delay = completed_at.elapsed();
    assert_ne!(woken, Woken::DeadlinePassed);
    assert!(
        delay <= Duration::from_millis(LOST_SUBSCRIBER_POLL_MS + 500),
        "the waiter woke {delay:?} after a completion whose message was lost"
    );
    assert_eq!(
        waiting.claim(&request).await.unwrap(),
        ClaimOutcome::Replay(response(4))
    );
    drop(watch);

    policy_hub.set_limits(WaitLimits::new(8, 8, WAIT_TEST_POLL_INTERVAL_MS).unwrap());
    let again = acquire(&writing, &caller, "k2").await;
    let key = claim_request(&caller, "k2", "body").key;
    let mut watch = policy_hub.subscribe(&caller, &key).expect("subscribe");
    let armed = watch.changed(Instant::now() + Duration::from_secs(10)).await;
    assert_eq!(armed, Woken::Notified, "the subscriber did not subscribe again");
    drain_wake_ups(&mut watch).await;
    assert_eq!(
        writing.complete(&again, response(5)).await.unwrap(),
        Fenced::Applied(())
    );
    let completed_at = Instant::now();
    assert_eq!(
        watch.changed(completed_at + Duration::from_secs(10)).await,
        Woken::Notified
    );
    assert!(completed_at.elapsed() < Duration::from_millis(750));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn standalone_a_killed_subscriber_is_covered_and_comes_back() {
    let server = RedisServer::start().expect("redis-server starts");
    let policy = waiting_policy();
    let waiting = RedisStore::connect(server.config(), policy).await.unwrap();
    let writing = RedisStore::connect(server.config(), policy).await.unwrap();
    lost_subscriber_is_covered(waiting, writing, &[&server]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cluster_a_killed_subscriber_is_covered_and_comes_back() {
    let cluster = store_redis::testkit::RedisCluster::start().expect("redis cluster starts");
    let policy = waiting_policy();
    let waiting = RedisStore::connect(cluster.config(), policy).await.unwrap();
    let writing = RedisStore::connect(cluster.config(), policy).await.unwrap();
    let nodes: Vec<&RedisServer> = cluster.nodes().iter().collect();
    lost_subscriber_is_covered(waiting, writing, &nodes).await;
}
