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
mod whole;

pub use fdb::FdbLabels;
pub use postgres::{LABELS_MIGRATION, PostgresLabels};
pub use split::SplitLabels;

use crate::request_context::RequestId;
use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use store_core::{CallerId, Fenced, HeldLease, SavedResponse, StoreError};
use utoipa::ToSchema;

/// Largest `POST /v1/labels` body read, in bytes (the idempotency layer
/// refuses a longer one with 413 before the route sees it).
pub const BODY_BYTES_MAX: usize = 64 * 1024;
/// Heaviest parcel accepted, in grams.
pub const WEIGHT_G_MAX: u32 = 70_000;
/// Largest order id accepted: 2^53 - 1, the largest integer every JSON
/// parser holds exactly (JavaScript's `Number.MAX_SAFE_INTEGER`; RFC 8259
/// section 6 and RFC 7493 I-JSON). Ids past it would reach a JavaScript
/// caller rounded, naming another order. Documented as `int64` with this
/// maximum.
pub const ORDER_ID_MAX: u64 = (1 << 53) - 1;
/// Largest parcel number accepted: `i32::MAX`, so the field is a JSON
/// `int32` as documented, and fits a signed 32-bit column or variable in
/// any client.
pub const PARCEL_NO_MAX: u32 = i32::MAX as u32;
/// Largest label version accepted: `i32::MAX`, for the same reason.
pub const LABEL_VERSION_MAX: u32 = i32::MAX as u32;
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
#[schema(example = json!({"order_id": 918273, "parcel_no": 1, "weight_g": 1450, "service": "ground"}))]
pub struct CreateLabelRequest {
    /// Your order's id, 1 to 2^53 - 1 (9007199254740991, the largest
    /// integer every JSON parser holds exactly).
    #[schema(format = Int64, minimum = 1, maximum = 9007199254740991_u64)]
    pub order_id: u64,
    /// 1 to 2^31 - 1.
    #[schema(format = Int32, minimum = 1, maximum = 2147483647)]
    pub parcel_no: u32,
    /// 1 to 70,000 grams.
    #[schema(format = Int32, minimum = 1, maximum = 70000)]
    pub weight_g: u32,
    pub service: ShippingService,
    /// 1 to 2^31 - 1; a reprint is a new version and a new intent.
    #[serde(default = "first_version")]
    #[schema(format = Int32, minimum = 1, maximum = 2147483647, default = 1)]
    pub label_version: u32,
}

fn first_version() -> u32 {
    1
}

/// The body as sent, before its numbers are checked.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateLabelWire {
    order_id: JsonInteger,
    parcel_no: JsonInteger,
    weight_g: JsonInteger,
    service: ShippingService,
    #[serde(default = "JsonInteger::one")]
    label_version: JsonInteger,
}

/// A JSON number that must be a whole number within a field's bounds.
#[derive(Deserialize)]
#[serde(transparent)]
struct JsonInteger(serde_json::Number);

impl JsonInteger {
    fn one() -> Self {
        Self(serde_json::Number::from(1_u8))
    }

    /// The value, if it is whole and from 1 to `max`; else which field and why.
    fn within(&self, field: &str, max: u64) -> Result<u64, String> {
        whole::whole_number(&self.0.to_string())
            .filter(|value| (1..=max).contains(value))
            .ok_or_else(|| format!("{field} must be a whole number between 1 and {max}, not {}", self.0))
    }
}

/// A bound checked against a `u32` maximum fits a `u32`.
fn narrow(value: u64) -> u32 {
    u32::try_from(value).unwrap_or(u32::MAX)
}

impl CreateLabelRequest {
    /// Parses and validates a request body; the error says which field.
    /// Numbers are read as the document declares them: integers of JSON
    /// Schema (`1450.0` is 1450) within each field's bounds.
    pub fn parse(body: &[u8]) -> Result<Self, String> {
        let wire: CreateLabelWire = serde_json::from_slice(body).map_err(|error| format!("body: {error}"))?;
        Ok(Self {
            order_id: wire.order_id.within("order_id", ORDER_ID_MAX)?,
            parcel_no: narrow(wire.parcel_no.within("parcel_no", u64::from(PARCEL_NO_MAX))?),
            weight_g: narrow(wire.weight_g.within("weight_g", u64::from(WEIGHT_G_MAX))?),
            service: wire.service,
            label_version: narrow(
                wire.label_version
                    .within("label_version", u64::from(LABEL_VERSION_MAX))?,
            ),
        })
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

/// A shipping label, as the API answers it. Its numbers have the bounds of
/// the request that made it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[schema(example = json!({
    "label_id": "lbl_2a3da6290314ecdb", "order_id": 918273, "parcel_no": 1, "label_version": 1,
    "service": "ground", "weight_g": 1450, "tracking_no": "GRD000918273001014374", "cost_cents": 530,
    "created_at": "2026-11-29T13:31:55.763Z"
}))]
pub struct Label {
    /// The carrier's id of the label, 1 to 64 bytes.
    #[schema(min_length = 1, max_length = 64)]
    pub label_id: String,
    #[schema(format = Int64, minimum = 1, maximum = 9007199254740991_u64)]
    pub order_id: u64,
    #[schema(format = Int32, minimum = 1, maximum = 2147483647)]
    pub parcel_no: u32,
    #[schema(format = Int32, minimum = 1, maximum = 2147483647)]
    pub label_version: u32,
    pub service: ShippingService,
    #[schema(format = Int32, minimum = 1, maximum = 70000)]
    pub weight_g: u32,
    pub tracking_no: String,
    #[schema(format = Int64, minimum = 0)]
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

/// The header of a saved label answer, first run and every replay alike:
/// the request id (`x-request-id`) of the attempt that completed the
/// record, after Stripe's `Original-Request`. A replay can be traced to the
/// attempt whose logs show the work; and since only the lease holder
/// completes a record, a second value for one key would show a late
/// attempt's write getting past the fence (RELIABILITY.md, fault campaign).
pub const ORIGINAL_REQUEST_HEADER: &str = "original-request";

/// A label as stored: who owns it and which key made it (its SHA-256,
/// never the key itself).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredLabel {
    #[serde(flatten)]
    pub label: Label,
    pub caller: String,
    pub created_by_key_sha256: String,
}

/// The saved (and first-run) answer for a label: 201, JSON, Location, and
/// the request id of the attempt that completes the record
/// ([`ORIGINAL_REQUEST_HEADER`]).
pub fn label_response(label: &Label, completed_by: &RequestId) -> Result<SavedResponse, StoreError> {
    let body = serde_json::to_vec(label).map_err(|error| StoreError::Refused {
        detail: format!("label could not be serialized: {error}"),
        source: None,
    })?;
    let headers = vec![
        ("content-type".to_owned(), "application/json".to_owned()),
        ("location".to_owned(), label.location()),
        (ORIGINAL_REQUEST_HEADER.to_owned(), completed_by.as_str().to_owned()),
    ];
    Ok(SavedResponse::new(201, headers, body)?)
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
    ///
    /// `completed_by` is the request whose attempt holds the lease: its id
    /// goes into the saved answer ([`label_response`]).
    async fn commit(
        &self,
        lease: &HeldLease,
        label: &StoredLabel,
        completed_by: &RequestId,
    ) -> Result<Fenced<SavedResponse>, StoreError>;

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
        let largest = CreateLabelRequest::parse(
            br#"{"order_id":9007199254740991,"parcel_no":2147483647,"weight_g":70000,"service":"express","label_version":2147483647}"#,
        )
        .unwrap();
        assert_eq!(
            (largest.order_id, largest.parcel_no, largest.label_version),
            (ORDER_ID_MAX, PARCEL_NO_MAX, LABEL_VERSION_MAX)
        );
        let written_otherwise = CreateLabelRequest::parse(
            br#"{"order_id":9.18273e5,"parcel_no":1.0,"weight_g":1450.00,"service":"ground"}"#,
        )
        .unwrap();
        assert_eq!(written_otherwise, ok, "JSON Schema integers, however written");
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
                "order_id",
            ),
            (
                r#"{"order_id":0,"parcel_no":1,"weight_g":1,"service":"ground"}"#,
                "order_id",
            ),
            (
                r#"{"order_id":9007199254740992,"parcel_no":1,"weight_g":1,"service":"ground"}"#,
                "order_id",
            ),
            (
                r#"{"order_id":1,"parcel_no":2147483648,"weight_g":1,"service":"ground"}"#,
                "parcel_no",
            ),
            (
                r#"{"order_id":1,"parcel_no":4294967296,"weight_g":1,"service":"ground"}"#,
                "parcel_no",
            ),
            (
                r#"{"order_id":1,"parcel_no":null,"weight_g":1,"service":"ground"}"#,
                "body",
            ),
            (
                r#"{"order_id":1,"parcel_no":"1","weight_g":1,"service":"ground"}"#,
                "body",
            ),
            (
                r#"{"order_id":1,"parcel_no":1,"weight_g":1,"service":"ground","label_version":2147483648}"#,
                "label_version",
            ),
            (
                r#"{"order_id":1,"parcel_no":1.5,"weight_g":1,"service":"ground"}"#,
                "parcel_no",
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
