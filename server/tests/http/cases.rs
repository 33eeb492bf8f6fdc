//! The HTTP behaviours, each written once and run on every backend (see
//! `backend_suite!` in main.rs). Each test starts its own server; callers
//! and order ids are fresh per test, so tests never see each other's keys.

use crate::common::{ALICE, BOB, Options, TestServer, fresh_key, label_body, metric_value, order_id, purchases_for};
use server::backend::StoreKind;
use server::carrier::retry::CARRIER_RETRIES_MAX_DEFAULT;
use server::carrier::{ScriptStep, SimulatedFault};
use std::time::Duration;

/// Seed table, row 1: first run, 201 with the label and Location.
pub async fn first_run_creates_the_label(backend: StoreKind) {
    let server = TestServer::start(backend).await;
    let order = order_id();
    let reply = server
        .post_label(Some(ALICE), Some(&fresh_key()), &label_body(order, 1))
        .await;
    assert_eq!(reply.status, 201, "{}", reply.text());
    let label = reply.json();
    for field in [
        "label_id",
        "order_id",
        "parcel_no",
        "label_version",
        "service",
        "weight_g",
        "tracking_no",
        "cost_cents",
        "created_at",
    ] {
        assert!(!label[field].is_null(), "missing {field}: {label}");
    }
    assert_eq!(label["order_id"].as_u64(), Some(order));
    assert_eq!(label["label_version"].as_u64(), Some(1));
    let location = reply.header("location").expect("Location").to_owned();
    assert_eq!(location, format!("/v1/labels/{}", label["label_id"].as_str().unwrap()));
    assert!(reply.header("idempotent-replayed").is_none());
    let fetched = server.get(&location, Some(ALICE)).await;
    assert_eq!(fetched.status, 200);
    assert_eq!(fetched.json(), label);
    server.shutdown().await;
}

/// Seed table, row 2: a repeat gets the saved answer byte for byte, with
/// `Idempotent-Replayed: true`, and nothing runs (one purchase).
pub async fn repeat_is_replayed_byte_for_byte(backend: StoreKind) {
    let server = TestServer::start(backend).await;
    let (key, order) = (fresh_key(), order_id());
    let body = label_body(order, 1);
    let first = server.post_label(Some(ALICE), Some(&key), &body).await;
    assert_eq!(first.status, 201);
    // Same request, keys reordered and reformatted: the same fingerprint.
    let reordered = format!(r#"{{ "service": "ground", "weight_g": 1450, "parcel_no": 1, "order_id": {order} }}"#);
    for repeat_body in [body.as_str(), reordered.as_str()] {
        let repeat = server.post_label(Some(ALICE), Some(&key), repeat_body).await;
        assert_eq!(repeat.status, 201);
        assert_eq!(repeat.body, first.body, "replayed body differs");
        assert_eq!(repeat.header("location"), first.header("location"));
        assert_eq!(repeat.header("content-type"), first.header("content-type"));
        assert_eq!(repeat.header("idempotent-replayed"), Some("true"));
    }
    let stats = server.carrier_stats().await;
    assert_eq!(purchases_for(&stats, order), 1, "{stats:?}");
    assert_eq!(stats.requests_total, 1, "a replay must not call the carrier");
    server.shutdown().await;
}

/// Seed table, row 3: while an attempt holds the lease, a repeat gets 409
/// `request_in_progress` with Retry-After; afterwards, the replay.
pub async fn concurrent_repeat_gets_409_then_the_replay(backend: StoreKind) {
    let server = TestServer::start(backend).await;
    server.delay_next_carrier_call(1_500).await;
    let (key, body) = (fresh_key(), label_body(order_id(), 1));
    let first = {
        let (base_server, key, body) = (&server, key.clone(), body.clone());
        async move { base_server.post_label(Some(ALICE), Some(&key), &body).await }
    };
    let second = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        server.post_label(Some(ALICE), Some(&key), &body).await
    };
    let (first, second) = tokio::join!(first, second);
    assert_eq!(first.status, 201, "{}", first.text());
    assert_eq!(second.status, 409, "{}", second.text());
    assert_eq!(second.problem_code(), "request_in_progress");
    // "Wait briefly": the lease's remaining 30 s capped at server.retry_after_s.
    assert_eq!(second.retry_after_s(), 1, "Retry-After of a 409");
    let third = server.post_label(Some(ALICE), Some(&key), &body).await;
    assert_eq!((third.status, third.header("idempotent-replayed")), (201, Some("true")));
    assert_eq!(third.body, first.body);
    server.shutdown().await;
}

/// `Prefer: wait=N` (docs/design.md#waiting): repeats sent while the first
/// attempt runs wait for it on the backend's change notifications and get
/// its answer, byte for byte; the carrier is called once.
pub async fn waiting_repeats_get_the_first_answer(backend: StoreKind) {
    const WAITERS: usize = 5;
    let server = TestServer::start(backend).await;
    server.delay_next_carrier_call(1_500).await;
    let order = order_id();
    let (key, body) = (fresh_key(), label_body(order, 1));
    let first = server.post_label(Some(ALICE), Some(&key), &body);
    let waiters = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let repeats = (0..WAITERS)
            .map(|_| server.post_label_with_headers(Some(ALICE), Some(&key), &body, &[("prefer", "wait=5")]));
        futures::future::join_all(repeats).await
    };
    let (first, waiters) = tokio::join!(first, waiters);
    assert_eq!(first.status, 201, "{}", first.text());
    for waiter in &waiters {
        assert_eq!(waiter.status, 201, "{}", waiter.text());
        assert_eq!(waiter.header("idempotent-replayed"), Some("true"));
        assert_eq!(waiter.header("preference-applied"), Some("wait=5"));
        assert_eq!(waiter.body, first.body, "a replay is the saved answer, byte for byte");
    }
    let stats = server.carrier_stats().await;
    assert_eq!(purchases_for(&stats, order), 1, "{stats:?}");
    server.shutdown().await;
}

/// Seed table, row 4: same key, different body: 422, after completion and
/// while in progress, and the saved answer is unchanged.
pub async fn same_key_with_another_body_is_422(backend: StoreKind) {
    let server = TestServer::start(backend).await;
    let (key, order) = (fresh_key(), order_id());
    let first = server.post_label(Some(ALICE), Some(&key), &label_body(order, 1)).await;
    assert_eq!(first.status, 201);
    let reused = server.post_label(Some(ALICE), Some(&key), &label_body(order, 2)).await;
    assert_eq!(
        (reused.status, reused.problem_code().as_str()),
        (422, "idempotency_key_reused")
    );
    let replay = server.post_label(Some(ALICE), Some(&key), &label_body(order, 1)).await;
    assert_eq!(replay.body, first.body);

    server.delay_next_carrier_call(1_000).await;
    let busy_key = fresh_key();
    let slow_body = label_body(order, 3);
    let slow = server.post_label(Some(ALICE), Some(&busy_key), &slow_body);
    let clash = async {
        tokio::time::sleep(Duration::from_millis(250)).await;
        server
            .post_label(Some(ALICE), Some(&busy_key), &label_body(order, 4))
            .await
    };
    let (slow, clash) = tokio::join!(slow, clash);
    assert_eq!(slow.status, 201);
    assert_eq!(
        (clash.status, clash.problem_code().as_str()),
        (422, "idempotency_key_reused")
    );
    server.shutdown().await;
}

/// Seed table, row 5, and the other key errors: missing 400, invalid 400;
/// the quoted form names the same key as the bare one.
pub async fn key_header_errors_and_the_quoted_form(backend: StoreKind) {
    let server = TestServer::start(backend).await;
    let body = label_body(order_id(), 1);
    let missing = server.post_label(Some(ALICE), None, &body).await;
    assert_eq!(
        (missing.status, missing.problem_code().as_str()),
        (400, "idempotency_key_missing")
    );
    for invalid in [
        "k".repeat(256),
        "\"unterminated".to_owned(),
        "\"bad\\escape\"".to_owned(),
        String::new(),
    ] {
        let reply = server.post_label(Some(ALICE), Some(&invalid), &body).await;
        assert_eq!(
            (reply.status, reply.problem_code().as_str()),
            (400, "idempotency_key_invalid"),
            "{invalid:?}"
        );
    }
    let key = fresh_key();
    let bare = server.post_label(Some(ALICE), Some(&key), &body).await;
    assert_eq!(bare.status, 201);
    let quoted = server.post_label(Some(ALICE), Some(&format!("\"{key}\"")), &body).await;
    assert_eq!(
        (quoted.status, quoted.header("idempotent-replayed")),
        (201, Some("true"))
    );
    assert_eq!(quoted.body, bare.body);
    let longest = server
        .post_label(Some(ALICE), Some(&"k".repeat(255)), &label_body(order_id(), 1))
        .await;
    assert_eq!(longest.status, 201);
    server.shutdown().await;
}

/// Validation fails before any effect: 400 `invalid_request`, the record is
/// deleted, nothing is bought, and the key is free for the corrected request.
pub async fn invalid_request_frees_the_key(backend: StoreKind) {
    let server = TestServer::start(backend).await;
    let (key, order) = (fresh_key(), order_id());
    for bad in [
        format!(r#"{{"order_id":{order},"parcel_no":0,"weight_g":1450,"service":"ground"}}"#),
        format!(r#"{{"order_id":{order},"parcel_no":1,"weight_g":70001,"service":"ground"}}"#),
        "not json".to_owned(),
    ] {
        let reply = server.post_label(Some(ALICE), Some(&key), &bad).await;
        assert_eq!(
            (reply.status, reply.problem_code().as_str()),
            (400, "invalid_request"),
            "{bad}"
        );
    }
    let corrected = server.post_label(Some(ALICE), Some(&key), &label_body(order, 1)).await;
    assert_eq!(
        corrected.status,
        201,
        "the key must be free again: {}",
        corrected.text()
    );
    assert!(corrected.header("idempotent-replayed").is_none());
    let stats = server.carrier_stats().await;
    assert_eq!((stats.requests_total, purchases_for(&stats, order)), (1, 1));
    server.shutdown().await;
}

/// No token or an unknown token: 401 `unauthorized`, before anything else.
pub async fn unknown_callers_are_refused(backend: StoreKind) {
    let server = TestServer::start(backend).await;
    let body = label_body(order_id(), 1);
    for token in [None, Some("demo-token"), Some("not-a-token")] {
        let reply = server.post_label(token, Some(&fresh_key()), &body).await;
        assert_eq!(
            (reply.status, reply.problem_code().as_str()),
            (401, "unauthorized"),
            "{token:?}"
        );
        assert_eq!(reply.header("www-authenticate"), Some("Bearer"));
        let read = server.get("/v1/labels/lbl_0", token).await;
        assert_eq!(read.status, 401);
    }
    assert_eq!(server.carrier_stats().await.requests_total, 0);
    server.shutdown().await;
}

/// Keys are scoped per caller: the same key from two callers names two
/// intents; neither sees the other's answer or label.
pub async fn callers_are_isolated(backend: StoreKind) {
    let server = TestServer::start(backend).await;
    let key = fresh_key();
    let (alice_order, bob_order) = (order_id(), order_id());
    let alice = server
        .post_label(Some(ALICE), Some(&key), &label_body(alice_order, 1))
        .await;
    let bob = server
        .post_label(Some(BOB), Some(&key), &label_body(bob_order, 1))
        .await;
    assert_eq!((alice.status, bob.status), (201, 201), "{}", bob.text());
    assert!(
        bob.header("idempotent-replayed").is_none(),
        "bob must not get alice's answer"
    );
    assert_ne!(alice.json()["label_id"], bob.json()["label_id"]);
    let alice_location = alice.header("location").unwrap();
    assert_eq!(server.get(alice_location, Some(ALICE)).await.status, 200);
    let stolen = server.get(alice_location, Some(BOB)).await;
    assert_eq!((stolen.status, stolen.problem_code().as_str()), (404, "not_found"));
    let stats = server.carrier_stats().await;
    assert_eq!(
        stats.purchases_by_carrier_key.len(),
        2,
        "one carrier key per caller: {stats:?}"
    );
    server.shutdown().await;
}

/// The second line of defence: a new key for a parcel that has its label
/// returns that label, and the carrier sells one label per parcel.
pub async fn a_new_key_for_a_labelled_parcel_buys_nothing(backend: StoreKind) {
    let server = TestServer::start(backend).await;
    let order = order_id();
    let first = server
        .post_label(Some(ALICE), Some(&fresh_key()), &label_body(order, 1))
        .await;
    let again = server
        .post_label(Some(ALICE), Some(&fresh_key()), &label_body(order, 1))
        .await;
    assert_eq!((first.status, again.status), (201, 201));
    assert_eq!(first.json()["label_id"], again.json()["label_id"]);
    let reprint =
        format!(r#"{{"order_id":{order},"parcel_no":1,"weight_g":1450,"service":"ground","label_version":2}}"#);
    let second_version = server.post_label(Some(ALICE), Some(&fresh_key()), &reprint).await;
    assert_ne!(second_version.json()["label_id"], first.json()["label_id"]);
    let stats = server.carrier_stats().await;
    let versions: Vec<_> = stats
        .purchases_by_parcel
        .iter()
        .filter(|p| p.order_id == order)
        .collect();
    assert_eq!(versions.len(), 2, "{stats:?}");
    assert!(versions.iter().all(|parcel| parcel.purchases == 1), "{stats:?}");
    server.shutdown().await;
}

/// A carrier 5xx or a lost reply is an unknown outcome. The service first
/// asks the carrier again within the request, with the same carrier key
/// (docs/design.md#carrier-retries): one such failure is invisible to the
/// client, who gets its label at once. When every retry fails too: 503
/// `downstream_unavailable` with Retry-After, nothing saved, lease
/// released; the client's retry with the same key takes over at once,
/// calls the carrier with the same carrier key, and exactly one label is
/// bought.
pub async fn unknown_carrier_outcomes_are_retried_then_released_and_the_retry_buys_once(backend: StoreKind) {
    let server = TestServer::start(backend).await;
    let retries_before = metric_value(&server.metrics_text().await, "idem_carrier_retries_total", &[]);
    let calls_per_request = 1 + CARRIER_RETRIES_MAX_DEFAULT as usize;
    for fault in [SimulatedFault::Error, SimulatedFault::LostReply] {
        server.carrier_script(&[ScriptStep { delay_ms: 0, fault }]).await;
        let (key, order) = (fresh_key(), order_id());
        let absorbed = server.post_label(Some(ALICE), Some(&key), &label_body(order, 1)).await;
        assert_eq!(
            absorbed.status,
            201,
            "{fault:?}: retried within the request: {}",
            absorbed.text()
        );
        assert_eq!(purchases_for(&server.carrier_stats().await, order), 1, "{fault:?}");

        let every_call_fails = vec![ScriptStep { delay_ms: 0, fault }; calls_per_request];
        server.carrier_script(&every_call_fails).await;
        let (key, order) = (fresh_key(), order_id());
        let failed = server.post_label(Some(ALICE), Some(&key), &label_body(order, 1)).await;
        assert_eq!(
            (failed.status, failed.problem_code().as_str()),
            (503, "downstream_unavailable"),
            "{fault:?}"
        );
        assert!(failed.retry_after_s() >= 1);
        let retried = server.post_label(Some(ALICE), Some(&key), &label_body(order, 1)).await;
        assert_eq!(
            retried.status,
            201,
            "{fault:?}: the retry must take over at once: {}",
            retried.text()
        );
        assert!(
            retried.header("idempotent-replayed").is_none(),
            "nothing was saved for the failed attempt"
        );
        let stats = server.carrier_stats().await;
        assert_eq!(purchases_for(&stats, order), 1, "{fault:?}: {stats:?}");
    }
    let stats = server.carrier_stats().await;
    assert_eq!(stats.purchases_by_carrier_key.values().sum::<u64>(), 4);
    assert!(
        stats.purchases_by_carrier_key.values().all(|&count| count == 1),
        "{stats:?}"
    );
    // Every call after a lost reply was answered from the carrier's key.
    let faults = 1 + calls_per_request as u64;
    assert_eq!(
        (stats.errors_injected, stats.replies_dropped, stats.deduplicated_repeats),
        (faults, faults, faults)
    );
    // Per fault kind: the one retry that cured it, then every retry allowed.
    let retries = metric_value(&server.metrics_text().await, "idem_carrier_retries_total", &[]) - retries_before;
    assert_eq!(retries, (2 * calls_per_request) as f64);
    server.shutdown().await;
}

/// A carrier timeout is an unknown outcome too; the purchase that was in
/// flight completes at the carrier, and the retries end with that one label.
pub async fn carrier_timeout_then_retry_gets_the_same_label(backend: StoreKind) {
    let options = Options {
        lease_ms: 2_000,
        carrier_timeout_ms: 400,
        ..Options::default()
    };
    let server = TestServer::start_with(backend, options).await;
    server.delay_next_carrier_call(900).await;
    let (key, order) = (fresh_key(), order_id());
    let timed_out = server.post_label(Some(ALICE), Some(&key), &label_body(order, 1)).await;
    assert_eq!(
        (timed_out.status, timed_out.problem_code().as_str()),
        (503, "downstream_unavailable")
    );
    let mut answer = None;
    for _ in 0..20 {
        let reply = server.post_label(Some(ALICE), Some(&key), &label_body(order, 1)).await;
        if reply.status == 201 {
            answer = Some(reply);
            break;
        }
        // While the timed-out purchase still runs at the carrier, the
        // retry is told so (409); after a carrier timeout, 503.
        let answer = (reply.status, reply.problem_code());
        assert!(
            [(409, "parcel_in_progress"), (503, "downstream_unavailable")].contains(&(answer.0, answer.1.as_str())),
            "{answer:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let answer = answer.expect("a retry succeeds once the carrier's purchase completed");
    let stats = server.carrier_stats().await;
    assert_eq!(purchases_for(&stats, order), 1, "{stats:?}");
    assert!(
        stats.deduplicated_repeats >= 1,
        "the carrier replayed its sale: {stats:?}"
    );
    let label_id = answer.json()["label_id"].as_str().unwrap().to_owned();
    assert!(server.get(&format!("/v1/labels/{label_id}"), Some(ALICE)).await.status == 200);
    server.shutdown().await;
}

/// `GET /v1/labels/{id}`: 404 for an unknown id; probes answer.
pub async fn reads_and_probes(backend: StoreKind) {
    let server = TestServer::start(backend).await;
    let missing = server.get("/v1/labels/lbl_ffffffffffffffff", Some(ALICE)).await;
    assert_eq!((missing.status, missing.problem_code().as_str()), (404, "not_found"));
    let health = server.get("/healthz", None).await;
    assert_eq!((health.status, health.json()["status"].as_str()), (200, Some("ok")));
    let ready = server.get("/readyz", None).await;
    assert_eq!((ready.status, ready.json()["status"].as_str()), (200, Some("ready")));
    assert_eq!(ready.json()["store"].as_str(), Some(backend.name()));
    server.shutdown().await;
}

/// The body limit: 413 `payload_too_large`, and the key stays unclaimed.
pub async fn oversized_bodies_are_413(backend: StoreKind) {
    let server = TestServer::start(backend).await;
    let key = fresh_key();
    let padding = "x".repeat(server::labels::BODY_BYTES_MAX);
    let huge = format!(r#"{{"order_id":1,"parcel_no":1,"weight_g":1,"service":"ground","pad":"{padding}"}}"#);
    let reply = server.post_label(Some(ALICE), Some(&key), &huge).await;
    assert_eq!(
        (reply.status, reply.problem_code().as_str()),
        (413, "payload_too_large")
    );
    let normal = server
        .post_label(Some(ALICE), Some(&key), &label_body(order_id(), 1))
        .await;
    assert_eq!(normal.status, 201, "the key was never claimed");
    server.shutdown().await;
}
