//! The Fulfilment service's intents: one parcel that needs one label.
//!
//! Operation number `index` of a run maps to one parcel of one order. Order
//! ids start from a random base per run, so runs against a long-lived server
//! never reuse each other's keys.

use serde::Serialize;
use store_core::{Fingerprint, InvalidInput, SavedResponse};

/// Parcels per order: some orders ship in more than one box.
pub const PARCELS_PER_ORDER: u64 = 2;
/// Order ids of one run span at most this many values above its base.
pub const ORDER_IDS_PER_RUN: u64 = 1_000_000_000;
/// The path of CreateLabel, used in request fingerprints.
pub const LABELS_PATH: &str = "/v1/labels";
/// The caller id the bench uses.
pub const CALLER_ID: &str = "fulfilment";

/// One run's identity: the base of its order ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunIds {
    order_base: u64,
}

impl RunIds {
    /// Order ids stay below 2^53, so JSON clients that read numbers as
    /// doubles still see them exactly.
    pub fn random() -> Self {
        let run = rand::random_range(100_000..1_000_000u64);
        Self {
            order_base: run * ORDER_IDS_PER_RUN,
        }
    }

    pub fn with_base(order_base: u64) -> Self {
        Self { order_base }
    }

    pub fn intent(&self, index: u64) -> Intent {
        Intent {
            index,
            order_id: self.order_base + (index / PARCELS_PER_ORDER) % ORDER_IDS_PER_RUN,
            parcel_no: (index % PARCELS_PER_ORDER) as u32 + 1,
            label_version: 1,
            weight_g: 250 + (index % 29) as u32 * 50,
        }
    }
}

/// A label for parcel `parcel_no` of order `order_id`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Intent {
    pub index: u64,
    pub order_id: u64,
    pub parcel_no: u32,
    pub label_version: u32,
    pub weight_g: u32,
}

/// The CreateLabel request body.
#[derive(Debug, Serialize)]
pub struct LabelRequest {
    pub order_id: u64,
    pub parcel_no: u32,
    pub label_version: u32,
    pub weight_g: u32,
    pub service: &'static str,
}

impl Intent {
    /// The derived key (docs/design.md#key-per-intent): the same parcel always gets the same key,
    /// even after the caller restarts mid-retry.
    pub fn derived_key(&self) -> String {
        format!("label:{}:{}:v{}", self.order_id, self.parcel_no, self.label_version)
    }

    pub fn request(&self) -> LabelRequest {
        LabelRequest {
            order_id: self.order_id,
            parcel_no: self.parcel_no,
            label_version: self.label_version,
            weight_g: self.weight_g,
            service: "ground",
        }
    }

    pub fn body(&self) -> Vec<u8> {
        // A struct of integers and a static string always serialises; an
        // empty body would be sent (and fingerprinted) in silence otherwise.
        serde_json::to_vec(&self.request()).expect("a label request serialises to JSON")
    }

    pub fn fingerprint(&self) -> Fingerprint {
        Fingerprint::of_request("POST", LABELS_PATH, &self.body())
    }

    /// The label id store mode saves for this intent.
    pub fn label_id(&self) -> String {
        format!("L-{}-{}-{}", self.order_id, self.parcel_no, self.label_version)
    }

    /// A response of about the design's size (~300 bytes saved per record: docs/design.md#record-size).
    pub fn saved_response(&self) -> Result<SavedResponse, InvalidInput> {
        let body = serde_json::json!({
            "label_id": self.label_id(),
            "order_id": self.order_id,
            "parcel_no": self.parcel_no,
            "tracking_no": format!("GRD{:012}{}", self.order_id % 1_000_000_000_000, self.parcel_no),
            "cost_cents": 600 + self.weight_g / 10,
            "service": "ground",
            "carrier": "simulated-ground",
            "label_url": format!("https://labels.example/v1/labels/{}.pdf", self.label_id()),
        });
        let bytes = serde_json::to_vec(&body).expect("a JSON value serialises");
        let headers = vec![("content-type".to_owned(), "application/json".to_owned())];
        SavedResponse::new(201, headers, bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_follow_the_seed_and_name_one_parcel_each() {
        let ids = RunIds::with_base(918_273_000);
        let first = ids.intent(0);
        assert_eq!(first.derived_key(), "label:918273000:1:v1");
        assert_eq!(ids.intent(1).derived_key(), "label:918273000:2:v1");
        assert_eq!(ids.intent(2).derived_key(), "label:918273001:1:v1");
        let keys: std::collections::HashSet<String> = (0..10_000).map(|i| ids.intent(i).derived_key()).collect();
        assert_eq!(keys.len(), 10_000);
    }

    #[test]
    fn the_saved_response_is_about_the_seeds_size_and_the_fingerprint_is_stable() {
        let intent = RunIds::random().intent(7);
        let size = intent.saved_response().unwrap().body().len();
        assert!((200..=400).contains(&size), "{size}");
        assert_eq!(intent.fingerprint(), intent.fingerprint());
        assert_ne!(intent.fingerprint(), RunIds::random().intent(8).fingerprint());
        assert!(RunIds::random().intent(u64::MAX).order_id < (1u64 << 53));
    }
}
