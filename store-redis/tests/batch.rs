//! Claims pipelined across calls on a standalone server (`src/batch.rs`):
//! a pipeline's claims are its claims one after the other, each answered on
//! its own, and a claim the pipeline could not answer goes alone.

use store_core::{CallerId, ClaimOutcome, ClaimRequest, Fingerprint, IdempotencyKey, IdempotencyStore, LeaseToken};
use store_core::{Policy, SavedResponse};
use store_redis::RedisStore;
use store_redis::testkit::{RedisServer, claim_in_one_pipeline, shared_server};

const FIRST: LeaseToken = LeaseToken(0xA);
const SECOND: LeaseToken = LeaseToken(0xB);

fn key(name: &str) -> IdempotencyKey {
    IdempotencyKey::new(&format!("{name}-{:032x}", rand::random::<u128>())).expect("valid key")
}

fn claim(key: &IdempotencyKey, token: LeaseToken, body: u8) -> ClaimRequest {
    ClaimRequest {
        caller: CallerId::new("batch").expect("valid caller"),
        key: key.clone(),
        fingerprint: Fingerprint([body; 32]),
        token,
    }
}

/// An outcome with what differs between two keys and two instants taken
/// out: the key, the lease's end, the wait.
fn comparable(outcome: ClaimOutcome) -> ClaimOutcome {
    match outcome {
        ClaimOutcome::Acquired(mut acquired) => {
            acquired.lease.key = IdempotencyKey::new("compared").expect("valid key");
            acquired.lease.locked_until_ms = 0;
            ClaimOutcome::Acquired(acquired)
        }
        ClaimOutcome::InProgress { .. } => ClaimOutcome::InProgress { retry_after_ms: 0 },
        other => other,
    }
}

/// A store whose claim script the server has loaded (a claim alone loads
/// it), so that a pipeline's claims are answered in the pipeline.
async fn store_on(server: &RedisServer) -> RedisStore {
    let store = RedisStore::connect(server.config(), Policy::default())
        .await
        .expect("store connects");
    store
        .claim(&claim(&key("load"), FIRST, 1))
        .await
        .expect("a claim alone");
    store
}

#[tokio::test]
async fn the_same_key_twice_in_one_pipeline_answers_as_two_claims_one_after_the_other() {
    let server = shared_server().expect("redis-server starts");
    let store = store_on(&server).await;
    // Another attempt, the same attempt re-sent, another request.
    for (second_token, second_body) in [(SECOND, 1), (FIRST, 1), (SECOND, 2)] {
        let (in_pipeline, in_turn) = (key("in-pipeline"), key("in-turn"));
        let pipeline = [
            claim(&in_pipeline, FIRST, 1),
            claim(&in_pipeline, second_token, second_body),
        ];
        let results = claim_in_one_pipeline(&store, &pipeline).await;
        assert!(results.iter().all(|(kind, _)| *kind == "reply"), "{results:?}");
        let first = store.claim(&claim(&in_turn, FIRST, 1)).await.expect("first");
        let second = store
            .claim(&claim(&in_turn, second_token, second_body))
            .await
            .expect("second");
        for ((_, pipelined), alone) in results.into_iter().zip([first, second]) {
            assert_eq!(comparable(pipelined.expect("claim")), comparable(alone));
        }
    }
}

#[tokio::test]
async fn a_pipeline_answers_each_claim_by_its_own_record() {
    let server = shared_server().expect("redis-server starts");
    let store = store_on(&server).await;
    let (fresh, completed, started) = (key("fresh"), key("completed"), key("started"));
    for existing in [&completed, &started] {
        let ClaimOutcome::Acquired(acquired) = store.claim(&claim(existing, SECOND, 1)).await.expect("claim") else {
            panic!("a new key is acquired");
        };
        if existing == &completed {
            let response = SavedResponse::new(201, Vec::new(), b"done".to_vec()).expect("valid response");
            assert!(
                store
                    .complete(&acquired.lease, response)
                    .await
                    .expect("complete")
                    .is_applied()
            );
        }
    }
    let pipeline = [
        claim(&fresh, FIRST, 1),
        claim(&completed, FIRST, 1),
        claim(&started, FIRST, 1),
        claim(&completed, FIRST, 2),
    ];
    let kinds: Vec<&str> = claim_in_one_pipeline(&store, &pipeline)
        .await
        .into_iter()
        .map(|(_, outcome)| outcome.expect("claim").kind())
        .collect();
    assert_eq!(kinds, ["acquired", "replay", "in_progress", "mismatch"]);
}

/// After a restart (here: `SCRIPT FLUSH`) the pipeline's scripts are not
/// loaded: each claim goes alone, which loads the script, and is answered.
#[tokio::test]
async fn claims_whose_script_was_flushed_go_alone_and_are_answered() {
    let server = RedisServer::start().expect("redis-server starts");
    let store = store_on(&server).await;
    let _: String = server.query(&["SCRIPT", "FLUSH"]).expect("flush the scripts");
    let pipeline = [claim(&key("a"), FIRST, 1), claim(&key("b"), FIRST, 1)];
    let results = claim_in_one_pipeline(&store, &pipeline).await;
    for (kind, outcome) in results {
        assert_eq!(kind, "alone", "a flushed script gets no reply in the pipeline");
        assert_eq!(outcome.expect("claim").kind(), "acquired");
    }
    let results = claim_in_one_pipeline(&store, &[claim(&key("c"), FIRST, 1)]).await;
    assert_eq!(results[0].0, "reply", "once loaded, the pipeline answers");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_claims_of_few_keys_acquire_each_key_once() {
    const KEYS: usize = 8;
    const ATTEMPTS_PER_KEY: u128 = 8;
    let server = shared_server().expect("redis-server starts");
    let store = store_on(&server).await;
    let keys: Vec<IdempotencyKey> = (0..KEYS).map(|_| key("concurrent")).collect();
    let mut tasks = Vec::new();
    for attempt in 0..ATTEMPTS_PER_KEY {
        for key in &keys {
            let (store, request) = (store.clone(), claim(key, LeaseToken(attempt + 1), 1));
            tasks.push(tokio::spawn(async move {
                (request.key.clone(), store.claim(&request).await)
            }));
        }
    }
    let mut acquired = std::collections::HashMap::new();
    for task in tasks {
        let (key, outcome) = task.await.expect("task");
        match outcome.expect("claim") {
            ClaimOutcome::Acquired(_) => *acquired.entry(key).or_insert(0) += 1,
            ClaimOutcome::InProgress { .. } => {}
            other => panic!("a live lease answers in progress, not {other:?}"),
        }
    }
    assert_eq!(acquired.len(), KEYS);
    assert!(acquired.values().all(|&count| count == 1), "{acquired:?}");
}

/// A server that no longer answers fails a pipeline's claims as unavailable,
/// as it fails a claim alone, rather than send each once more on its own.
#[tokio::test]
async fn a_frozen_server_fails_the_pipelines_claims_as_unavailable() {
    const RESPONSE_TIMEOUT_MS: u64 = 300;
    let server = RedisServer::start().expect("redis-server starts");
    let config = store_redis::RedisConfig {
        response_timeout_ms: RESPONSE_TIMEOUT_MS,
        ..server.config()
    };
    let store = RedisStore::connect(config, Policy::default())
        .await
        .expect("store connects");
    store
        .claim(&claim(&key("load"), FIRST, 1))
        .await
        .expect("a claim alone");
    server.pause().expect("freeze the server");
    let pipeline = [claim(&key("a"), FIRST, 1), claim(&key("b"), FIRST, 1)];
    let results = claim_in_one_pipeline(&store, &pipeline).await;
    server.resume().expect("thaw the server");
    for (kind, outcome) in results {
        assert_eq!(kind, "unavailable", "failed in the pipeline, not sent again alone");
        assert!(
            matches!(outcome, Err(store_core::StoreError::Unavailable { .. })),
            "{outcome:?}"
        );
    }
}
