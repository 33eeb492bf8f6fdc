//! The carrier client against the real simulator: how every kind of answer
//! is sorted (only definite answers may be saved under a caller's key).

use crate::common::{ALICE, Options, TestServer, fresh_key, label_body, order_id, purchases_for};
use server::backend::StoreKind;
use server::carrier::SimulatorConfig;
use server::carrier::retry::RETRY_TOKENS_MAX;
use server::carrier::{
    CARRIER_SCRIPT_PATH, CarrierClient, CarrierLabelRequest, CarrierOutcome, CarrierRetries, CarrierServer, ScriptStep,
    SimulatedFault, read_stats,
};
use server::failpoints::AFTER_CLAIM;
use server::labels::ShippingService;
use std::time::Duration;

async fn simulator() -> CarrierServer {
    let config = SimulatorConfig {
        latency_ms_min: 0,
        latency_ms_max: 0,
        ..SimulatorConfig::default()
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    CarrierServer::start(&config, listener).await.unwrap()
}

fn request(order_id: u64, weight_g: u32) -> CarrierLabelRequest {
    CarrierLabelRequest {
        order_id,
        parcel_no: 1,
        label_version: 1,
        service: ShippingService::Express,
        weight_g,
    }
}

async fn script(carrier: &CarrierServer, steps: &[ScriptStep]) {
    let url = format!("{}{CARRIER_SCRIPT_PATH}", carrier.base_url());
    let response = crate::common::client()
        .post(url)
        .json(&serde_json::json!({ "steps": steps }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 204);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_carrier_answer_is_sorted_into_purchased_rejected_or_indeterminate() {
    let carrier = simulator().await;
    let client = CarrierClient::new(&carrier.base_url(), Duration::from_millis(500), Vec::new()).unwrap();
    let order = order_id();

    let bought = client.buy("carrier:t:1", &request(order, 1_000)).await;
    let CarrierOutcome::Purchased { label, replayed: false } = &bought else {
        panic!("{bought:?}")
    };
    assert!(label.tracking_no.starts_with("EXP"));
    let again = client.buy("carrier:t:1", &request(order, 1_000)).await;
    assert_eq!(
        again,
        CarrierOutcome::Purchased {
            label: label.clone(),
            replayed: true
        }
    );

    let reused = client.buy("carrier:t:1", &request(order, 2_000)).await;
    assert!(
        matches!(reused, CarrierOutcome::Rejected { status: 422, .. }),
        "{reused:?}"
    );

    script(
        &carrier,
        &[ScriptStep {
            delay_ms: 0,
            fault: SimulatedFault::Error,
        }],
    )
    .await;
    let failed = client.buy("carrier:t:2", &request(order_id(), 1_000)).await;
    assert_eq!(failed, CarrierOutcome::Indeterminate { reason: "server_error" });

    script(
        &carrier,
        &[ScriptStep {
            delay_ms: 0,
            fault: SimulatedFault::LostReply,
        }],
    )
    .await;
    let lost = client.buy("carrier:t:3", &request(order_id(), 1_000)).await;
    assert_eq!(
        lost,
        CarrierOutcome::Indeterminate {
            reason: "connection_error"
        }
    );

    script(
        &carrier,
        &[ScriptStep {
            delay_ms: 1_500,
            fault: SimulatedFault::None,
        }],
    )
    .await;
    let slow_order = order_id();
    let slow = client.buy("carrier:t:4", &request(slow_order, 1_000)).await;
    assert_eq!(slow, CarrierOutcome::Indeterminate { reason: "timeout" });
    let meanwhile = client.buy("carrier:t:4", &request(slow_order, 1_000)).await;
    assert_eq!(meanwhile, CarrierOutcome::Indeterminate { reason: "in_progress" });

    carrier.stop().await;
    let down = client.buy("carrier:t:5", &request(order_id(), 1_000)).await;
    assert_eq!(
        down,
        CarrierOutcome::Indeterminate {
            reason: "connection_error"
        }
    );
}

fn retrying_client(carrier: &CarrierServer, retries_max: u32) -> CarrierClient {
    retrying_client_with_timeout(carrier, retries_max, Duration::from_secs(5))
}

fn retrying_client_with_timeout(carrier: &CarrierServer, retries_max: u32, timeout: Duration) -> CarrierClient {
    let retries = CarrierRetries {
        retries_max,
        backoff_base: Duration::from_millis(1),
    };
    CarrierClient::new(&carrier.base_url(), timeout, Vec::new())
        .unwrap()
        .with_retries(retries)
}

async fn calls_made(carrier: &CarrierServer) -> u64 {
    read_stats(&crate::common::client(), &carrier.base_url())
        .await
        .unwrap()
        .requests_total
}

/// A lost reply or a 5xx is asked again with the same key, up to
/// `retries_max` times; what the carrier asks us to wait for (its 409 for
/// our own call in flight) and what a repeat cannot change (a refusal) is
/// not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_that_a_repeat_may_cure_are_retried_up_to_the_limit() {
    let carrier = simulator().await;
    let client = retrying_client(&carrier, 2);
    let fault = |fault| ScriptStep { delay_ms: 0, fault };

    script(&carrier, &[fault(SimulatedFault::LostReply)]).await;
    let cured = client.buy("carrier:r:1", &request(order_id(), 1_000)).await;
    assert!(
        matches!(cured, CarrierOutcome::Purchased { replayed: true, .. }),
        "the retry is answered from the key of the purchase whose reply was lost: {cured:?}"
    );
    assert_eq!(calls_made(&carrier).await, 2);

    script(&carrier, &[fault(SimulatedFault::Error); 3]).await;
    let exhausted = client.buy("carrier:r:2", &request(order_id(), 1_000)).await;
    assert_eq!(exhausted, CarrierOutcome::Indeterminate { reason: "server_error" });
    assert_eq!(calls_made(&carrier).await, 2 + 3, "one call and two retries");

    let order = order_id();
    let slow = ScriptStep {
        delay_ms: 1_000,
        fault: SimulatedFault::None,
    };
    script(&carrier, &[slow]).await;
    let parcel = request(order, 1_000);
    let first = client.buy("carrier:r:3", &parcel);
    let meanwhile = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        client.buy("carrier:r:3", &request(order, 1_000)).await
    };
    let (_, meanwhile) = tokio::join!(first, meanwhile);
    assert_eq!(meanwhile, CarrierOutcome::Indeterminate { reason: "in_progress" });
    assert_eq!(calls_made(&carrier).await, 5 + 2, "a 409 is not retried");

    let refused = client.buy("carrier:r:3", &request(order, 2_000)).await;
    assert!(
        matches!(refused, CarrierOutcome::Rejected { status: 422, .. }),
        "{refused:?}"
    );
    assert_eq!(calls_made(&carrier).await, 7 + 1, "a refusal is not retried");
}

/// gRPC's retry throttling: when most calls fail, retries stop once half
/// the bucket is spent, and each call is made once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_carrier_spends_the_retry_budget_and_then_gets_one_call_per_purchase() {
    let carrier = simulator().await;
    let client = retrying_client(&carrier, 2);
    let purchases = 40;
    let error = ScriptStep {
        delay_ms: 0,
        fault: SimulatedFault::Error,
    };
    script(&carrier, &vec![error; 3 * purchases]).await;
    for number in 0..purchases {
        let outcome = client
            .buy(&format!("carrier:b:{number}"), &request(order_id(), 1_000))
            .await;
        assert_eq!(outcome, CarrierOutcome::Indeterminate { reason: "server_error" });
    }
    // The bucket holds 100 tokens and each failed call takes one; a retry
    // needs more than 50 left. Purchases 1 to 16 make 3 calls each (48
    // tokens spent), the 17th makes 2 (its second retry would leave 50),
    // the other 23 one each.
    assert_eq!(RETRY_TOKENS_MAX, 100.0);
    assert_eq!(calls_made(&carrier).await, 16 * 3 + 2 + 23);
}

/// The carrier call's timeout in the budget test, and the scripted sale
/// that outlasts it (by far, so a call slowed by a busy machine still
/// reaches the simulator and takes its step before its own timeout).
const CALL_TIMEOUT_MS: u64 = 500;
const SLOW_SALE_MS: u64 = 2_000;

/// Only a definite answer refills the budget: timeouts, which a repeat
/// cannot cure, neither spend a token nor give one back, so they cannot
/// reopen retries that failures closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeouts_neither_spend_nor_refill_the_retry_budget() {
    let carrier = simulator().await;
    let client = retrying_client_with_timeout(&carrier, 2, Duration::from_millis(CALL_TIMEOUT_MS));
    let step = |delay_ms, fault| ScriptStep { delay_ms, fault };
    // Fifty timeouts: were each a failure, they would spend what retries
    // may use, and this lost reply would not be retried.
    script(&carrier, &vec![step(SLOW_SALE_MS, SimulatedFault::None); 50]).await;
    assert_all_time_out(&time_out_together(&client, 50, "t").await);
    assert_eq!(calls_made(&carrier).await, 50, "every slow step was taken");
    script(&carrier, &[step(0, SimulatedFault::LostReply)]).await;
    let cured = client.buy("carrier:s:cured", &request(order_id(), 1_000)).await;
    assert!(
        matches!(cured, CarrierOutcome::Purchased { replayed: true, .. }),
        "retried: {cured:?}"
    );
    // 17 failing purchases spend the 50 tokens retries may use (see the
    // test above; the cured reply left 99.1): the budget now refuses
    // retries, with 49.1 tokens.
    script(&carrier, &vec![step(0, SimulatedFault::Error); 50]).await;
    for number in 0..17 {
        let outcome = client
            .buy(&format!("carrier:s:{number}"), &request(order_id(), 1_000))
            .await;
        assert_eq!(outcome, CarrierOutcome::Indeterminate { reason: "server_error" });
    }
    // Twenty-one timeouts: were each a success, they would give back 2.1
    // tokens, enough to open retries again (49.1 + 2.1, less the lost
    // reply's own failure, is above 50).
    script(&carrier, &vec![step(SLOW_SALE_MS, SimulatedFault::None); 21]).await;
    assert_all_time_out(&time_out_together(&client, 21, "u").await);
    let calls_before = calls_made(&carrier).await;
    script(&carrier, &[step(0, SimulatedFault::LostReply)]).await;
    let lost = client.buy("carrier:s:lost", &request(order_id(), 1_000)).await;
    assert_eq!(
        lost,
        CarrierOutcome::Indeterminate {
            reason: "connection_error"
        },
        "not retried"
    );
    assert_eq!(calls_made(&carrier).await, calls_before + 1);
}

/// `count` purchases sent at once, each a call of its own (the scripted
/// slow steps make them time out).
async fn time_out_together(client: &CarrierClient, count: usize, prefix: &str) -> Vec<CarrierOutcome> {
    let purchases = (0..count).map(|number| async move {
        let key = format!("carrier:{prefix}:{number}");
        client.buy(&key, &request(order_id(), 1_000)).await
    });
    futures::future::join_all(purchases).await
}

fn assert_all_time_out(outcomes: &[CarrierOutcome]) {
    let timeout = CarrierOutcome::Indeterminate { reason: "timeout" };
    assert!(outcomes.iter().all(|outcome| *outcome == timeout), "{outcomes:?}");
}

/// Another key for a parcel whose label is being bought right now (a
/// second instance, or a client that made a new key) is told so: 409
/// `parcel_in_progress` with `Retry-After`, not a carrier outage; with
/// `Prefer: wait`, it waits for that purchase and gets the parcel's one
/// label; and the 409's retry gets it too. The carrier sells once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_key_for_a_parcel_being_bought_gets_409_or_waits_for_its_label() {
    let server = TestServer::start(StoreKind::Embedded).await;
    let (order, first_key, refused_key) = (order_id(), fresh_key(), fresh_key());
    let body = label_body(order, 1);
    server.delay_next_carrier_call(1_500).await;
    let (first, (refused, waited)) = tokio::join!(server.post_label(Some(ALICE), Some(&first_key), &body), async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let refused = server.post_label(Some(ALICE), Some(&refused_key), &body).await;
        let waited = server
            .post_label_with_headers(Some(ALICE), Some(&fresh_key()), &body, &[("prefer", "wait=5")])
            .await;
        (refused, waited)
    });
    assert_eq!(first.status, 201, "{}", first.text());
    assert_eq!(
        (refused.status, refused.problem_code().as_str()),
        (409, "parcel_in_progress"),
        "{}",
        refused.text()
    );
    assert!(refused.retry_after().is_some(), "says when to retry");
    assert_eq!(waited.status, 201, "{}", waited.text());
    assert_eq!(waited.label_id(), first.label_id(), "the parcel's one label");
    let retried = server.post_label(Some(ALICE), Some(&refused_key), &body).await;
    assert_eq!((retried.status, retried.label_id()), (201, first.label_id()));
    assert_eq!(purchases_for(&server.carrier_stats().await, order), 1);
    server.shutdown().await;
}

/// The carrier budget counts from the claim, not from the call, so the
/// call ends while the lease holds: with the steps between claim and call
/// stalled for 800 ms of a 1,000 ms budget, a carrier that answers in
/// 600 ms is past it. The call is cut at the claim's budget (503, the key
/// released), and the retry gets the label the carrier sold, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_carrier_budget_counts_from_the_claim() {
    let options = Options {
        lease_ms: 1_500,
        carrier_timeout_ms: 1_000,
        ..Options::default()
    };
    let test_server = TestServer::start_with(StoreKind::Embedded, options).await;
    test_server.delay_next_carrier_call(600).await;
    let (key, order) = (fresh_key(), order_id());
    let body = label_body(order, 1);
    fail::cfg(AFTER_CLAIM, "return(800)").unwrap();
    let first = test_server.post_label(Some(ALICE), Some(&key), &body).await;
    fail::remove(AFTER_CLAIM);
    assert_eq!(
        (first.status, first.problem_code().as_str()),
        (503, "downstream_unavailable"),
        "{}",
        first.text()
    );
    let mut retried = None;
    for _ in 0..20 {
        let reply = test_server.post_label(Some(ALICE), Some(&key), &body).await;
        if reply.status == 201 {
            retried = Some(reply);
            break;
        }
        assert_eq!(
            (reply.status, reply.problem_code().as_str()),
            (409, "parcel_in_progress")
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(retried.is_some(), "the retry gets the label the carrier sold");
    assert_eq!(purchases_for(&test_server.carrier_stats().await, order), 1);
    test_server.shutdown().await;
}
