//! The carrier: the wire format, the client the Label service uses, and a
//! simulator to run against.
//!
//! The Label service passes a key derived from its own downstream
//! (`carrier:` + caller + SHA-256 of the caller's key), so each hop dedupes
//! its own repeats: a retry that takes over an expired lease buys nothing
//! new, the carrier hands back the label it sold the first time.

pub mod client;
pub mod config;
pub mod retry;
pub mod simulator;

pub use client::{CarrierClient, CarrierOutcome};
pub use config::{CarrierConfig, SimulatorConfig};
pub use retry::CarrierRetries;
pub use simulator::{CarrierServer, CarrierStats, ScriptStep, SimulatedFault};

use crate::labels::Parcel;
use crate::labels::{CreateLabelRequest, ShippingService};
use serde::{Deserialize, Serialize};
use store_core::CallerId;

/// Where the carrier sells labels.
pub const CARRIER_LABELS_PATH: &str = "/carrier/v1/labels";
/// The simulator's audit counters.
pub const CARRIER_STATS_PATH: &str = "/carrier/v1/stats";
/// The simulator's fault script (tests).
pub const CARRIER_SCRIPT_PATH: &str = "/carrier/v1/script";

/// The simulator's audit counters, read over HTTP from the simulator at
/// `carrier_url`: what the tests (in-process or against a process) count
/// purchases with.
pub async fn read_stats(client: &reqwest::Client, carrier_url: &str) -> Result<CarrierStats, reqwest::Error> {
    let response = client.get(format!("{carrier_url}{CARRIER_STATS_PATH}")).send().await?;
    response.error_for_status()?.json().await
}

/// The key the Label service sends the carrier for one intent: the caller
/// and the parcel (order, parcel number, label version), never the client's
/// idempotency key.
///
/// Derived from the intent itself, any number of idempotency keys for one
/// parcel (a client that makes a new key per retry, two services racing for
/// the same parcel, several instances) reach the carrier as one purchase,
/// and the carrier's own idempotency returns that purchase to every one of
/// them. It carries the caller because two callers' order numbers are
/// unrelated. No caller's key leaves the service.
pub fn carrier_key(caller: &CallerId, parcel: Parcel) -> String {
    format!(
        "parcel:{caller}:{}:{}:v{}",
        parcel.order_id, parcel.parcel_no, parcel.label_version
    )
}

/// What the Label service asks the carrier for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CarrierLabelRequest {
    pub order_id: u64,
    pub parcel_no: u32,
    pub label_version: u32,
    pub service: ShippingService,
    pub weight_g: u32,
}

impl From<&CreateLabelRequest> for CarrierLabelRequest {
    fn from(request: &CreateLabelRequest) -> Self {
        Self {
            order_id: request.order_id,
            parcel_no: request.parcel_no,
            label_version: request.label_version,
            service: request.service,
            weight_g: request.weight_g,
        }
    }
}

/// What the carrier sold.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CarrierLabel {
    pub carrier_label_id: String,
    pub tracking_no: String,
    pub cost_cents: u64,
    pub order_id: u64,
    pub parcel_no: u32,
    pub label_version: u32,
    pub service: ShippingService,
    pub weight_g: u32,
}
