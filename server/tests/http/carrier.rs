//! The carrier client against the real simulator: how every kind of answer
//! is sorted (only definite answers may be saved under a caller's key).

use crate::common::order_id;
use server::carrier::retry::RETRY_TOKENS_MAX;
use server::carrier::{
    CARRIER_SCRIPT_PATH, CarrierClient, CarrierLabelRequest, CarrierOutcome, CarrierRetries, CarrierServer, ScriptStep,
    SimulatedFault, read_stats,
};
use server::config::SimulatorConfig;
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
    let retries = CarrierRetries {
        retries_max,
        backoff_base: Duration::from_millis(1),
    };
    CarrierClient::new(&carrier.base_url(), Duration::from_secs(5), Vec::new())
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
