//! The carrier client against the real simulator: how every kind of answer
//! is sorted (only definite answers may be saved under a caller's key).

use crate::common::order_id;
use server::carrier::{
    CARRIER_SCRIPT_PATH, CarrierClient, CarrierLabelRequest, CarrierOutcome, CarrierServer, ScriptStep, SimulatedFault,
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
