//! The Fulfilment service's side of one order: a label for each parcel,
//! against the quick-start Label service.
//!
//! ```text
//! cargo run --release -p server                                # in one terminal
//! cargo run --release -p idem-client --example fulfilment      # in another
//! ```
//!
//! Each parcel is one intent, named by its key `label:<order>:<parcel>:v1`.
//! The example then does what a Fulfilment service does after a crash or a
//! lost reply (asks for a parcel's label again, with the same key: the
//! service replays the label it already made), and what a bug does (sends
//! another body with a used key: a typed error, never retried).
//!
//! `IDEM_URL` (default `http://127.0.0.1:8080`), `IDEM_TOKEN` (default
//! `demo-token`) and `IDEM_ORDER_ID` (default: from the clock) change the
//! service, the caller and the order.

use idem_client::{Done, IdemClient, IntentError, IntentKey, RetryPolicy};
use std::time::Duration;

/// Parcels in the example's order.
const PARCELS: u32 = 3;
/// Each attempt's deadline: generous, so a debug build of the service answers within it.
const ATTEMPT_TIMEOUT_MS: u64 = 2_000;

/// The CreateLabel request.
#[derive(serde::Serialize)]
struct LabelRequest {
    order_id: u64,
    parcel_no: u32,
    label_version: u32,
    weight_g: u32,
    service: &'static str,
}

/// What the example prints of a label.
#[derive(serde::Deserialize)]
struct Label {
    label_id: String,
    tracking_no: String,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("IDEM_URL").unwrap_or_else(|_| "http://127.0.0.1:8080".into());
    let token = std::env::var("IDEM_TOKEN").unwrap_or_else(|_| "demo-token".into());
    let order_id = match std::env::var("IDEM_ORDER_ID") {
        Ok(text) => text.parse()?,
        // Below 2^53, and new on every run.
        Err(_) => {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)?
                .as_millis() as u64
                % 1_000_000_000_000
        }
    };
    let policy = RetryPolicy::builder()
        .attempt_timeout(Duration::from_millis(ATTEMPT_TIMEOUT_MS))
        .prefer_wait(Some(Duration::from_secs(5)))
        .build()?;
    let client = IdemClient::builder(&url).bearer_token(token).policy(policy).build()?;
    println!("order {order_id}: {PARCELS} parcels, labels from {url}");
    for parcel_no in 1..=PARCELS {
        let outcome = create_label(&client, order_id, parcel_no, 500 * parcel_no).await;
        print_outcome(parcel_no, &outcome);
    }
    println!("parcel 1 again, as after a lost reply (same key, same body):");
    print_outcome(1, &create_label(&client, order_id, 1, 500).await);
    println!("parcel 1 again with another weight (same key, another body):");
    print_outcome(1, &create_label(&client, order_id, 1, 900).await);
    Ok(())
}

/// One intent: the label for `parcel_no` of `order_id`, version 1.
async fn create_label(client: &IdemClient, order_id: u64, parcel_no: u32, weight_g: u32) -> Result<Done, IntentError> {
    let key = IntentKey::from_parts(&["label", &order_id.to_string(), &parcel_no.to_string(), "v1"])
        .map_err(|error| IntentError::Request(error.to_string()))?;
    let request = LabelRequest {
        order_id,
        parcel_no,
        label_version: 1,
        weight_g,
        service: "ground",
    };
    client.post_json("/v1/labels", &key, &request).await
}

fn print_outcome(parcel_no: u32, outcome: &Result<Done, IntentError>) {
    match outcome {
        Ok(done) => {
            let how = if done.replayed { "replayed" } else { "created" };
            match done.json::<Label>() {
                Ok(label) => println!(
                    "  parcel {parcel_no}: {how} {} (tracking {}), {} attempt(s)",
                    label.label_id, label.tracking_no, done.attempts
                ),
                Err(error) => println!("  parcel {parcel_no}: {how}, but the label did not parse: {error}"),
            }
        }
        Err(error @ IntentError::KeyReused { .. }) => println!("  parcel {parcel_no}: refused, not retried: {error}"),
        Err(error) => println!("  parcel {parcel_no}: no label: {error}"),
    }
}
