//! A Redis that is out of memory under `maxmemory-policy noeviction`
//! refuses every script that may write, the claim included (so a replay,
//! too). Nothing was written and memory frees up as records expire, so it
//! is an outage to retry after, not a failure of the server: 503
//! `store_unavailable` with `Retry-After`, never 500.

use crate::common::{ALICE, Options, TestServer, fresh_key, label_body, order_id, purchases_for};
use server::backend::StoreKind;
use store_redis::testkit::RedisServer;

/// Bytes of `maxmemory` that every write exceeds.
const TINY_MAXMEMORY_BYTES: &str = "1";

fn set_maxmemory(redis: &RedisServer, bytes: &str) {
    redis
        .query::<()>(&["CONFIG", "SET", "maxmemory", bytes])
        .expect("CONFIG SET maxmemory");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_out_of_memory_is_503_store_unavailable_for_new_keys_and_replays() {
    let redis = RedisServer::start_with_args(&["--maxmemory-policy", "noeviction"]).expect("start redis-server");
    let options = Options {
        extra_env: vec![
            ("IDEM__STORE__KIND".into(), "redis".into()),
            ("IDEM__STORE__REDIS__URLS".into(), format!("[\"{}\"]", redis.url())),
        ],
        ..Options::default()
    };
    let server = TestServer::start_with(StoreKind::Embedded, options).await;
    let (done_key, done_order) = (fresh_key(), order_id());
    let done = server
        .post_label(Some(ALICE), Some(&done_key), &label_body(done_order, 1))
        .await;
    assert_eq!(done.status, 201, "{}", done.text());

    set_maxmemory(&redis, TINY_MAXMEMORY_BYTES);
    let (new_key, new_order) = (fresh_key(), order_id());
    let new = server
        .post_label(Some(ALICE), Some(&new_key), &label_body(new_order, 1))
        .await;
    let replay = server
        .post_label(Some(ALICE), Some(&done_key), &label_body(done_order, 1))
        .await;
    for (name, reply) in [("new key", &new), ("replay", &replay)] {
        assert_eq!(
            (reply.status, reply.problem_code().as_str()),
            (503, "store_unavailable"),
            "{name}: {}",
            reply.text()
        );
        assert!(reply.retry_after_s() >= 1, "{name}");
    }

    // Nothing was written: with memory again, the replay replays and the
    // new key runs once.
    set_maxmemory(&redis, "0");
    let replay = server
        .post_label(Some(ALICE), Some(&done_key), &label_body(done_order, 1))
        .await;
    assert_eq!(
        (replay.status, replay.header("idempotent-replayed")),
        (201, Some("true"))
    );
    let new = server
        .post_label(Some(ALICE), Some(&new_key), &label_body(new_order, 1))
        .await;
    assert_eq!(
        (new.status, new.header("idempotent-replayed")),
        (201, None),
        "{}",
        new.text()
    );
    assert_eq!(purchases_for(&server.carrier_stats().await, new_order), 1);
    server.shutdown().await;
}
