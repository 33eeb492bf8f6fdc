//! Labels: the request and response of the API, and where labels live.
//!
//! A label is unique per (caller, order_id, parcel_no, label_version): a
//! second insert for the same parcel returns the label that is already
//! there instead of adding (or buying) another. That constraint is the
//! second line of defence (docs/design.md#second-line-of-defence), behind the idempotency key. It is scoped
//! per caller because order ids belong to each caller's own systems, and a
//! caller must never be handed another caller's label.

mod fdb;
pub mod handlers;
mod postgres;
mod split;

pub use fdb::FdbLabels;
pub use postgres::{LABELS_MIGRATION, PostgresLabels};
pub use split::SplitLabels;

use crate::error::PROBLEM_JSON;
use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use store_core::{CallerId, Fenced, HeldLease, InvalidInput, SavedResponse, StoreError};
use utoipa::ToSchema;

/// Heaviest parcel accepted, in grams.
pub const WEIGHT_G_MAX: u32 = 70_000;
/// Longest label id accepted from the carrier, in bytes.
pub const LABEL_ID_BYTES_MAX: usize = 64;

/// How the parcel travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ShippingService {
    Ground,
    Express,
}

/// The body of `POST /v1/labels`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateLabelRequest {
    pub order_id: u64,
    /// 1 or more.
    #[schema(minimum = 1)]
    pub parcel_no: u32,
    /// 1 to 70,000 grams.
    #[schema(minimum = 1, maximum = 70000)]
    pub weight_g: u32,
    pub service: ShippingService,
    /// 1 or more; a reprint is a new version and a new intent.
    #[serde(default = "first_version")]
    #[schema(minimum = 1, default = 1)]
    pub label_version: u32,
}

fn first_version() -> u32 {
    1
}

impl CreateLabelRequest {
    /// Parses and validates a request body; the error says which field.
    pub fn parse(body: &[u8]) -> Result<Self, String> {
        let request: Self = serde_json::from_slice(body).map_err(|error| format!("body: {error}"))?;
        if request.parcel_no < 1 {
            return Err("parcel_no must be at least 1".into());
        }
        if !(1..=WEIGHT_G_MAX).contains(&request.weight_g) {
            return Err(format!("weight_g must be between 1 and {WEIGHT_G_MAX}"));
        }
        if request.label_version < 1 {
            return Err("label_version must be at least 1".into());
        }
        Ok(request)
    }

    pub fn parcel(&self) -> Parcel {
        Parcel {
            order_id: self.order_id,
            parcel_no: self.parcel_no,
            label_version: self.label_version,
        }
    }
}

/// What a label is unique by, within one caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Parcel {
    pub order_id: u64,
    pub parcel_no: u32,
    pub label_version: u32,
}

/// A shipping label, as the API answers it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Label {
    /// The carrier's id of the label.
    pub label_id: String,
    pub order_id: u64,
    pub parcel_no: u32,
    pub label_version: u32,
    pub service: ShippingService,
    pub weight_g: u32,
    pub tracking_no: String,
    pub cost_cents: u64,
    /// RFC 3339, UTC.
    #[schema(format = DateTime)]
    pub created_at: String,
}

impl Label {
    pub fn parcel(&self) -> Parcel {
        Parcel {
            order_id: self.order_id,
            parcel_no: self.parcel_no,
            label_version: self.label_version,
        }
    }

    /// `/v1/labels/{label_id}`.
    pub fn location(&self) -> String {
        format!("/v1/labels/{}", self.label_id)
    }
}

/// A label as stored: who owns it and which key made it (its SHA-256,
/// never the key itself).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredLabel {
    #[serde(flatten)]
    pub label: Label,
    pub caller: String,
    pub created_by_key_sha256: String,
}

/// The saved (and first-run) answer for a label: 201, JSON, Location.
pub fn label_response(label: &Label) -> Result<SavedResponse, StoreError> {
    let body = serde_json::to_vec(label).map_err(|error| StoreError::Refused {
        detail: format!("label could not be serialized: {error}"),
        source: None,
    })?;
    let headers = vec![
        ("content-type".to_owned(), "application/json".to_owned()),
        ("location".to_owned(), label.location()),
    ];
    Ok(SavedResponse::new(201, headers, body)?)
}

/// A saved problem answer (for definitive errors saved under the key).
pub fn problem_response(status: u16, body: Vec<u8>) -> Result<SavedResponse, InvalidInput> {
    SavedResponse::new(status, vec![("content-type".to_owned(), PROBLEM_JSON.to_owned())], body)
}

/// Where labels live, next to (or together with) the idempotency records.
#[async_trait]
pub trait LabelStore: Send + Sync {
    /// True when a label and its record commit in one transaction.
    fn is_atomic_with_records(&self) -> bool;

    /// The caller's label for this parcel, if it has one.
    async fn find_for_parcel(&self, caller: &CallerId, parcel: Parcel) -> Result<Option<Label>, StoreError>;

    /// The label with this id, if it exists and belongs to the caller.
    async fn find_by_id(&self, caller: &CallerId, label_id: &str) -> Result<Option<Label>, StoreError>;

    /// Inserts the label unless its parcel has one, and completes the
    /// lease's record with the answer for the parcel's label, while the
    /// lease holds. Atomic stores do both in one transaction.
    async fn commit(&self, lease: &HeldLease, label: &StoredLabel) -> Result<Fenced<SavedResponse>, StoreError>;

    /// A cheap round trip, for readiness.
    async fn ping(&self) -> Result<(), StoreError>;
}

/// Labels alone, in a store that does not hold the records: what
/// [`SplitLabels`] commits a label to before it completes the record.
#[async_trait]
pub trait LabelTable: Send + Sync {
    /// Inserts the label unless its parcel has one; returns the parcel's label.
    async fn insert(&self, label: &StoredLabel) -> Result<Label, StoreError>;

    async fn find_for_parcel(&self, caller: &CallerId, parcel: Parcel) -> Result<Option<Label>, StoreError>;

    async fn find_by_id(&self, caller: &CallerId, label_id: &str) -> Result<Option<Label>, StoreError>;

    async fn ping(&self) -> Result<(), StoreError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_validated_field_by_field() {
        let ok = CreateLabelRequest::parse(br#"{"order_id":918273,"parcel_no":1,"weight_g":1450,"service":"ground"}"#)
            .unwrap();
        assert_eq!(ok.label_version, 1);
        for (body, field) in [
            (
                r#"{"order_id":1,"parcel_no":0,"weight_g":1,"service":"ground"}"#,
                "parcel_no",
            ),
            (
                r#"{"order_id":1,"parcel_no":1,"weight_g":0,"service":"ground"}"#,
                "weight_g",
            ),
            (
                r#"{"order_id":1,"parcel_no":1,"weight_g":70001,"service":"ground"}"#,
                "weight_g",
            ),
            (
                r#"{"order_id":1,"parcel_no":1,"weight_g":1,"service":"ground","label_version":0}"#,
                "label_version",
            ),
            (r#"{"order_id":1,"parcel_no":1,"weight_g":1,"service":"air"}"#, "air"),
            (
                r#"{"order_id":-1,"parcel_no":1,"weight_g":1,"service":"ground"}"#,
                "body",
            ),
            (
                r#"{"order_id":1,"parcel_no":1,"weight_g":1,"service":"ground","x":1}"#,
                "x",
            ),
            ("not json", "body"),
        ] {
            let error = CreateLabelRequest::parse(body.as_bytes()).unwrap_err();
            assert!(error.contains(field), "{body}: {error}");
        }
    }
}
