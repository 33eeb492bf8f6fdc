//! The records a preload writes: completed label creates, as the Label
//! service leaves them after a label was bought, for fresh parcels of one
//! run (the bench's intents, `crate::intent`).
//!
//! Record `i` of `n` (0-based) is intent `i` of the run: its derived key
//! `label:{order_id}:{parcel_no}:v{label_version}` under the preload's
//! caller, the fingerprint of its CreateLabel body, and the service's 201
//! answer for it (the label JSON, about 210 bytes, with the headers the
//! service saves: `content-type` and `location`; about 290 bytes saved in
//! all, the design's ~300). Its expiry time is
//! `reference + retention * (i + 1) / n`, and it was created one retention
//! earlier: the store holds what a steady stream of creates over the last
//! retention window left, and the sweeper finds `n / retention` records
//! falling due every second of the next window, the last one exactly one
//! retention after the reference time.

use crate::intent::{Intent, ORDER_IDS_PER_RUN, RunIds};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use store_core::{CallerId, CompletedRecord, IdempotencyKey, InvalidInput, LeaseToken, SavedResponse};

/// The first of the run bases a seed maps to (order ids start at
/// `base * ORDER_IDS_PER_RUN`, as `RunIds::random` draws them).
const RUN_BASE_MIN: u64 = 100_000;
/// How many run bases a seed maps to.
const RUN_BASES: u64 = 900_000;

/// Everything that makes the records of one preload: record `i` is the
/// same for the same settings, whoever computes it (the bench, or a test
/// that checks what the bench wrote).
#[derive(Debug, Clone)]
pub struct PreloadRecords {
    ids: RunIds,
    caller: CallerId,
    count: u64,
    retention_ms: u64,
    reference_ms: u64,
    tokens: u64,
}

impl PreloadRecords {
    /// `count` records for `caller`, their expiry spread over `retention_ms`
    /// after `reference_ms`; `seed` chooses the order ids and the tokens.
    pub fn new(seed: u64, caller: CallerId, count: u64, retention_ms: u64, reference_ms: u64) -> Self {
        let run_base = RUN_BASE_MIN + seed % RUN_BASES;
        Self {
            ids: RunIds::with_base(run_base * ORDER_IDS_PER_RUN),
            caller,
            count,
            retention_ms,
            reference_ms,
            tokens: seed,
        }
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    pub fn caller(&self) -> &CallerId {
        &self.caller
    }

    /// The intent of record `index`: its key and its request body.
    pub fn intent(&self, index: u64) -> Intent {
        self.ids.intent(index)
    }

    /// When record `index` expires: `reference + retention * (index + 1) / count`.
    pub fn expires_at_ms(&self, index: u64) -> u64 {
        let offset = u128::from(self.retention_ms) * u128::from(index + 1) / u128::from(self.count.max(1));
        self.reference_ms + u64::try_from(offset).unwrap_or(u64::MAX)
    }

    /// Record `index`, completed.
    pub fn record(&self, index: u64) -> Result<CompletedRecord, InvalidInput> {
        let intent = self.intent(index);
        let key = IdempotencyKey::new(&intent.derived_key())?;
        let expires_at_ms = self.expires_at_ms(index);
        let created_at_ms = expires_at_ms.saturating_sub(self.retention_ms);
        CompletedRecord::new(
            self.caller.clone(),
            key,
            intent.fingerprint(),
            label_created(&intent, created_at_ms)?,
            self.token(index),
            created_at_ms,
            expires_at_ms,
        )
    }

    /// Records `start..end`, one batch.
    pub fn batch(&self, start: u64, end: u64) -> Result<Vec<CompletedRecord>, InvalidInput> {
        (start..end).map(|index| self.record(index)).collect()
    }

    /// The completing attempt's token of record `index`, from the seed.
    fn token(&self, index: u64) -> LeaseToken {
        let mut rng = StdRng::seed_from_u64(self.tokens ^ index.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        LeaseToken(rng.random())
    }
}

/// The Label service's 201 for `intent`: the label JSON in the service's
/// field order, `content-type` and `location`, as idem-http saves them.
pub fn label_created(intent: &Intent, created_at_ms: u64) -> Result<SavedResponse, InvalidInput> {
    let label_id = format!(
        "lbl_{:016x}",
        intent.order_id.rotate_left(17) ^ u64::from(intent.parcel_no)
    );
    let body = format!(
        concat!(
            r#"{{"label_id":"{label_id}","order_id":{order_id},"parcel_no":{parcel_no},"label_version":{version},"#,
            r#""service":"ground","weight_g":{weight_g},"tracking_no":"GRD{order:012}{parcel:03}{check:04}","#,
            r#""cost_cents":{cost},"created_at":"{created_at}"}}"#
        ),
        label_id = label_id,
        order_id = intent.order_id,
        parcel_no = intent.parcel_no,
        version = intent.label_version,
        weight_g = intent.weight_g,
        order = intent.order_id % 1_000_000_000_000,
        parcel = intent.parcel_no % 1_000,
        check = intent.order_id % 10_000,
        cost = 400 + intent.weight_g / 10,
        created_at = rfc3339_ms(created_at_ms),
    );
    let headers = vec![
        ("content-type".to_owned(), "application/json".to_owned()),
        ("location".to_owned(), format!("/v1/labels/{label_id}")),
    ];
    SavedResponse::new(201, headers, body.into_bytes())
}

/// `2026-11-29T13:31:55.763Z`, as the service writes a label's `created_at`.
fn rfc3339_ms(ms: u64) -> String {
    let time = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
    humantime::format_rfc3339_millis(time).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn records(count: u64) -> PreloadRecords {
        PreloadRecords::new(7, CallerId::new("demo").unwrap(), count, 86_400_000, 1_000_000)
    }

    #[test]
    fn expiry_times_step_evenly_to_one_retention_after_the_reference() {
        let records = records(4);
        let times: Vec<u64> = (0..4).map(|index| records.expires_at_ms(index)).collect();
        assert_eq!(times, [22_600_000, 44_200_000, 65_800_000, 87_400_000]);
        let record = records.record(3).unwrap();
        assert_eq!(record.created_at_ms(), 1_000_000);
        assert_eq!(record.expires_at_ms(), 87_400_000);
    }

    #[test]
    fn records_are_the_same_for_the_same_seed_and_differ_by_index() {
        let (a, b) = (records(10), records(10));
        assert_eq!(a.record(5).unwrap(), b.record(5).unwrap());
        assert_ne!(a.record(5).unwrap().key(), a.record(6).unwrap().key());
        assert_ne!(a.record(5).unwrap().completed_by(), a.record(6).unwrap().completed_by());
        assert!(a.record(0).unwrap().key().as_str().starts_with("label:"));
    }

    #[test]
    fn the_saved_response_is_the_services_label_at_the_designs_size() {
        let record = records(1).record(0).unwrap();
        let response = record.response();
        assert_eq!(response.status(), 201);
        let label: serde_json::Value = serde_json::from_slice(response.body()).unwrap();
        assert_eq!(
            response.headers()[1],
            (
                "location".to_owned(),
                format!("/v1/labels/{}", label["label_id"].as_str().unwrap())
            )
        );
        assert_eq!(label["created_at"], "1970-01-01T00:16:40.000Z");
        let saved_bytes: usize = response.body().len()
            + response
                .headers()
                .iter()
                .map(|(name, value)| name.len() + value.len())
                .sum::<usize>();
        assert!((250..=350).contains(&saved_bytes), "{saved_bytes}");
    }
}
