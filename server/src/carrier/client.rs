//! The Label service's carrier client.
//!
//! Every answer is sorted into one of three outcomes. Only a definite answer
//! may be saved under the caller's key: a label (bought now or replayed by
//! the carrier's own key) or a refusal (a 4xx other than 408/409/429).
//! Everything else (a timeout, a dropped connection, a 5xx, a 409 because
//! our earlier attempt is still running there, an unreadable body) leaves the
//! purchase unknown, and the attempt must release its lease so that the
//! caller's retry repeats the call with the same carrier key.

use super::{CARRIER_LABELS_PATH, CarrierLabel, CarrierLabelRequest};
use crate::metrics::{CARRIER_CALL_DURATION_SECONDS, CARRIER_CALLS_TOTAL};
use std::time::{Duration, Instant};

/// Longest carrier error body kept for the saved problem, in bytes.
pub const CARRIER_DETAIL_BYTES_MAX: usize = 512;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CarrierOutcome {
    /// The carrier sold (or, `replayed`, had already sold) this label.
    Purchased { label: CarrierLabel, replayed: bool },
    /// The carrier refused for good; retrying the same request will not help.
    Rejected { status: u16, detail: String },
    /// Nobody knows whether a label was bought.
    Indeterminate { reason: &'static str },
}

impl CarrierOutcome {
    /// The `outcome` label of `idem_carrier_calls_total`.
    pub fn metric_label(&self) -> &'static str {
        match self {
            CarrierOutcome::Purchased { replayed: false, .. } => "purchased",
            CarrierOutcome::Purchased { replayed: true, .. } => "replayed",
            CarrierOutcome::Rejected { .. } => "rejected",
            CarrierOutcome::Indeterminate { reason } => reason,
        }
    }
}

/// Every `outcome` label [`CarrierOutcome::metric_label`] gives.
pub const CARRIER_OUTCOME_LABELS: [&str; 8] = [
    "purchased",
    "replayed",
    "rejected",
    "malformed",
    "in_progress",
    "server_error",
    "timeout",
    "connection_error",
];

pub struct CarrierClient {
    http: reqwest::Client,
    labels_url: String,
}

impl CarrierClient {
    /// `base_url` like `http://127.0.0.1:9090`; `timeout` bounds each call
    /// from connect to the last byte of the answer.
    pub fn new(base_url: &str, timeout: Duration) -> Result<Self, String> {
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .build()
            .map_err(|error| format!("carrier client: {error}"))?;
        Ok(Self {
            http,
            labels_url: format!("{}{CARRIER_LABELS_PATH}", base_url.trim_end_matches('/')),
        })
    }

    /// Buys a label with the derived carrier key.
    pub async fn buy(&self, carrier_key: &str, request: &CarrierLabelRequest) -> CarrierOutcome {
        let started = Instant::now();
        let outcome = self.send(carrier_key, request).await;
        let label = outcome.metric_label();
        debug_assert!(
            CARRIER_OUTCOME_LABELS.contains(&label),
            "{label} is not in CARRIER_OUTCOME_LABELS"
        );
        metrics::counter!(CARRIER_CALLS_TOTAL, "outcome" => label).increment(1);
        metrics::histogram!(CARRIER_CALL_DURATION_SECONDS, "outcome" => label).record(started.elapsed().as_secs_f64());
        outcome
    }

    async fn send(&self, carrier_key: &str, request: &CarrierLabelRequest) -> CarrierOutcome {
        let sent = self
            .http
            .post(&self.labels_url)
            .header("idempotency-key", carrier_key)
            .json(request)
            .send()
            .await;
        let response = match sent {
            Ok(response) => response,
            Err(error) => return indeterminate(&error),
        };
        let status = response.status();
        let replayed = response.headers().contains_key("idempotent-replayed");
        if status.is_success() {
            return match response.json::<CarrierLabel>().await {
                Ok(label) => CarrierOutcome::Purchased { label, replayed },
                Err(error) if error.is_decode() => CarrierOutcome::Indeterminate { reason: "malformed" },
                Err(error) => indeterminate(&error),
            };
        }
        match status.as_u16() {
            409 => CarrierOutcome::Indeterminate { reason: "in_progress" },
            408 | 429 | 500..=599 => CarrierOutcome::Indeterminate { reason: "server_error" },
            code => {
                let detail = response.text().await.unwrap_or_default();
                CarrierOutcome::Rejected {
                    status: code,
                    detail: truncated(&detail, CARRIER_DETAIL_BYTES_MAX),
                }
            }
        }
    }
}

fn indeterminate(error: &reqwest::Error) -> CarrierOutcome {
    let reason = if error.is_timeout() {
        "timeout"
    } else {
        "connection_error"
    };
    CarrierOutcome::Indeterminate { reason }
}

/// At most `limit` bytes of `text`, cut at a character boundary.
fn truncated(text: &str, limit: usize) -> String {
    let end = text
        .char_indices()
        .map(|(index, character)| index + character.len_utf8())
        .take_while(|&end| end <= limit)
        .last()
        .unwrap_or(0);
    text[..end].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn details_are_cut_at_character_boundaries() {
        assert_eq!(truncated("abcdef", 4), "abcd");
        assert_eq!(truncated("ééé", 3), "é");
        assert_eq!(truncated("", 3), "");
    }
}
