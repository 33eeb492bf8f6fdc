//! The Label service's carrier client.
//!
//! Every answer is sorted into one of three outcomes. Only a definite answer
//! may be saved under the caller's key: a label (bought now or replayed by
//! the carrier's own key) that matches what we asked for, or an explicit
//! business refusal ([`CARRIER_REFUSAL_STATUSES`]: 422). Everything else
//! leaves the purchase unknown or the carrier unusable for now, and the
//! attempt must release its lease so that the caller's retry repeats the
//! call with the same carrier key (after the client's own retries, for the
//! failures a repeat may cure: [`super::retry`]):
//! - a timeout, a dropped connection, a 408, 429 or 5xx, a 409 because our
//!   earlier attempt is still running there;
//! - an answer that is not about the parcel at all: a redirect (never
//!   followed: it would re-send the purchase, with our key, elsewhere), a
//!   401 or 403 (a bad credential must not poison every key for 24 h with a
//!   saved 502), a 404, a 415, any other status;
//! - a body over [`CARRIER_BODY_BYTES_MAX`], unreadable, or a label that
//!   does not echo our parcel or whose id or tracking number we could not
//!   store and serve.

use super::retry::{CarrierRetries, RetryBudget};
use super::{CARRIER_LABELS_PATH, CarrierLabel, CarrierLabelRequest};
use crate::labels::LABEL_ID_BYTES_MAX;
use crate::metrics::{
    CARRIER_CALL_DURATION_SECONDS, CARRIER_CALLS_TOTAL, CARRIER_RETRIES_THROTTLED_TOTAL, CARRIER_RETRIES_TOTAL,
};
use crate::request_context::TRACEPARENT_HEADER;
use std::time::{Duration, Instant};

/// Longest carrier error body kept for the saved problem, in bytes.
pub const CARRIER_DETAIL_BYTES_MAX: usize = 512;
/// Most bytes of a carrier answer read; a longer one is not a label.
pub const CARRIER_BODY_BYTES_MAX: usize = 64 * 1024;
/// Longest tracking number accepted from the carrier, in bytes.
pub const TRACKING_NO_BYTES_MAX: usize = 64;
/// The carrier's statuses that refuse the purchase for good (a business
/// refusal: the key reused with another parcel, a service the address does
/// not have). Saved as 502 `downstream_rejected` and replayed. A 400 is not
/// among them: our requests are valid by construction, so a 400 says the
/// carrier or something in between misbehaves, not that the parcel is refused.
pub const CARRIER_REFUSAL_STATUSES: [u16; 1] = [422];

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
pub const CARRIER_OUTCOME_LABELS: [&str; 10] = [
    "purchased",
    "replayed",
    "rejected",
    "malformed",
    "in_progress",
    "slow_down",
    "server_error",
    "unexpected_status",
    "timeout",
    "connection_error",
];

pub struct CarrierClient {
    http: reqwest::Client,
    /// Parsed once: parsing it for every call was 2 % of the runtime
    /// workers' samples at 2,000/s (BENCHMARKS.md, "Where the service's CPU
    /// goes").
    labels_url: reqwest::Url,
    /// Budget of one purchase, retries included.
    timeout: Duration,
    retries: CarrierRetries,
    retry_budget: RetryBudget,
}

impl CarrierClient {
    /// `base_url` like `http://127.0.0.1:9090` or `https://...`; `timeout`
    /// bounds each call from connect to the last byte of the answer. An
    /// `https://` carrier is verified against `roots` alone when any are
    /// given (`carrier.ca_file`), else against the operating system's trust
    /// store (rustls-platform-verifier: the roots operators already manage).
    pub fn new(base_url: &str, timeout: Duration, roots: Vec<reqwest::Certificate>) -> Result<Self, String> {
        let mut builder = reqwest::Client::builder()
            .timeout(timeout)
            .redirect(reqwest::redirect::Policy::none())
            .https_only(base_url.starts_with("https://"));
        if !roots.is_empty() {
            builder = builder.tls_certs_only(roots);
        }
        let http = builder.build().map_err(|error| format!("carrier client: {error}"))?;
        let labels_url = format!("{}{CARRIER_LABELS_PATH}", base_url.trim_end_matches('/'));
        let labels_url =
            reqwest::Url::parse(&labels_url).map_err(|error| format!("carrier url {labels_url:?}: {error}"))?;
        Ok(Self {
            http,
            labels_url,
            timeout,
            retries: CarrierRetries::NONE,
            retry_budget: RetryBudget::default(),
        })
    }

    /// The budget of one purchase, retries included (`carrier.timeout_ms`).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Retries calls that failed in a way a repeat may cure (a dropped
    /// connection, a 5xx) within the call's timeout: [`super::retry`].
    pub fn with_retries(mut self, retries: CarrierRetries) -> Self {
        self.retries = retries;
        self
    }

    /// Buys a label with the derived carrier key, in a trace of its own.
    pub async fn buy(&self, carrier_key: &str, request: &CarrierLabelRequest) -> CarrierOutcome {
        self.buy_traced(carrier_key, request, None, None).await
    }

    /// Buys a label with the derived carrier key, sending `traceparent`
    /// (W3C Trace Context) so the carrier's work joins the caller's trace.
    /// `within`: the time the caller's client will still wait; the call and
    /// its retries end by then, or by the carrier timeout if sooner (an
    /// answer nobody waits for is not worth a retry; the purchase, if the
    /// carrier made it, is found again by the carrier key).
    pub async fn buy_traced(
        &self,
        carrier_key: &str,
        request: &CarrierLabelRequest,
        traceparent: Option<&str>,
        within: Option<Duration>,
    ) -> CarrierOutcome {
        let budget = within.map_or(self.timeout, |within| within.min(self.timeout));
        let deadline = Instant::now() + budget;
        let mut retry = 0;
        loop {
            let (outcome, repeat) = self.call(carrier_key, request, traceparent, deadline).await;
            match repeat {
                Repeat::Answered => self.retry_budget.record_success(),
                Repeat::MayCure => self.retry_budget.record_failure(),
                Repeat::Useless => {}
            }
            if repeat != Repeat::MayCure || retry == self.retries.retries_max {
                return outcome;
            }
            let backoff = self.retries.backoff(retry);
            if Instant::now() + backoff >= deadline {
                return outcome;
            }
            if !self.retry_budget.allows_retry() {
                metrics::counter!(CARRIER_RETRIES_THROTTLED_TOTAL).increment(1);
                return outcome;
            }
            metrics::counter!(CARRIER_RETRIES_TOTAL).increment(1);
            tokio::time::sleep(backoff).await;
            retry += 1;
        }
    }

    /// One call, timed and counted, with what repeating it could do.
    async fn call(
        &self,
        carrier_key: &str,
        request: &CarrierLabelRequest,
        traceparent: Option<&str>,
        deadline: Instant,
    ) -> (CarrierOutcome, Repeat) {
        let started = Instant::now();
        let outcome = self
            .send(
                carrier_key,
                request,
                traceparent,
                deadline.saturating_duration_since(started),
            )
            .await;
        let label = outcome.metric_label();
        debug_assert!(
            CARRIER_OUTCOME_LABELS.contains(&label),
            "{label} is not in CARRIER_OUTCOME_LABELS"
        );
        metrics::counter!(CARRIER_CALLS_TOTAL, "outcome" => label).increment(1);
        metrics::histogram!(CARRIER_CALL_DURATION_SECONDS, "outcome" => label).record(started.elapsed().as_secs_f64());
        let repeat = Repeat::of(&outcome);
        (outcome, repeat)
    }

    async fn send(
        &self,
        carrier_key: &str,
        request: &CarrierLabelRequest,
        traceparent: Option<&str>,
        timeout: Duration,
    ) -> CarrierOutcome {
        let mut call = self
            .http
            .post(self.labels_url.clone())
            .timeout(timeout)
            .header("idempotency-key", carrier_key);
        if let Some(traceparent) = traceparent {
            call = call.header(TRACEPARENT_HEADER, traceparent);
        }
        let sent = call.json(request).send().await;
        let response = match sent {
            Ok(response) => response,
            Err(error) => return indeterminate(&error),
        };
        let status = response.status();
        let replayed = response.headers().contains_key("idempotent-replayed");
        if status.is_success() {
            return match read_bounded(response, CARRIER_BODY_BYTES_MAX).await {
                Ok(Body::Complete(bytes)) => purchased(&bytes, request, replayed),
                Ok(Body::TooLarge) => CarrierOutcome::Indeterminate { reason: "malformed" },
                Err(error) => indeterminate(&error),
            };
        }
        match status.as_u16() {
            409 => CarrierOutcome::Indeterminate { reason: "in_progress" },
            408 | 429 => CarrierOutcome::Indeterminate { reason: "slow_down" },
            500..=599 => CarrierOutcome::Indeterminate { reason: "server_error" },
            code if CARRIER_REFUSAL_STATUSES.contains(&code) => {
                let detail = read_prefix(response, CARRIER_DETAIL_BYTES_MAX).await;
                CarrierOutcome::Rejected {
                    status: code,
                    detail: truncated(&String::from_utf8_lossy(&detail), CARRIER_DETAIL_BYTES_MAX),
                }
            }
            code => {
                tracing::error!(
                    carrier_status = code,
                    "the carrier answered a status that is not about the parcel (a redirect, a bad credential, \
                     a wrong URL?); releasing the lease"
                );
                CarrierOutcome::Indeterminate {
                    reason: "unexpected_status",
                }
            }
        }
    }
}

/// What asking the carrier again at once, with the same key, could do;
/// the retry budget counts the first two as gRPC counts successes and
/// retryable failures, and ignores the third.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Repeat {
    /// A definite answer (a label, a refusal): nothing to repeat.
    Answered,
    /// The call failed on the way (a dropped connection: maybe a lost
    /// reply) or at the carrier (a 5xx); the repeat is answered from the
    /// carrier's key if the first got through.
    MayCure,
    /// The carrier asked us to wait (its 409 for our own earlier call, a
    /// 408 or 429), the whole budget went by (a timeout), or the answer is
    /// not about the parcel at all (a wrong URL or credential, a malformed
    /// label): a repeat only repeats it.
    Useless,
}

impl Repeat {
    fn of(outcome: &CarrierOutcome) -> Self {
        match outcome {
            CarrierOutcome::Purchased { .. } | CarrierOutcome::Rejected { .. } => Repeat::Answered,
            CarrierOutcome::Indeterminate {
                reason: "connection_error" | "server_error",
            } => Repeat::MayCure,
            CarrierOutcome::Indeterminate { .. } => Repeat::Useless,
        }
    }
}

/// A carrier answer's body, read up to a limit.
enum Body {
    Complete(Vec<u8>),
    /// Longer than the limit (declared or read); the rest is not read.
    TooLarge,
}

async fn read_bounded(mut response: reqwest::Response, limit: usize) -> Result<Body, reqwest::Error> {
    if response.content_length().is_some_and(|length| length > limit as u64) {
        return Ok(Body::TooLarge);
    }
    let mut bytes = Vec::new();
    while let Some(chunk) = response.chunk().await? {
        if bytes.len() + chunk.len() > limit {
            return Ok(Body::TooLarge);
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(Body::Complete(bytes))
}

/// At most the first `limit` bytes of a body (a refusal's detail); the rest
/// is not read. A body that fails part-way gives what arrived.
async fn read_prefix(mut response: reqwest::Response, limit: usize) -> Vec<u8> {
    let mut bytes = Vec::new();
    while bytes.len() < limit {
        match response.chunk().await {
            Ok(Some(chunk)) => bytes.extend_from_slice(&chunk[..chunk.len().min(limit - bytes.len())]),
            Ok(None) | Err(_) => break,
        }
    }
    bytes
}

/// A success body as a purchase, if it is a label for this very request
/// whose id and tracking number we can store and serve.
fn purchased(bytes: &[u8], request: &CarrierLabelRequest, replayed: bool) -> CarrierOutcome {
    let Ok(label) = serde_json::from_slice::<CarrierLabel>(bytes) else {
        return CarrierOutcome::Indeterminate { reason: "malformed" };
    };
    if let Err(problem) = check_label(&label, request) {
        tracing::error!(problem, "the carrier's label cannot be accepted; releasing the lease");
        return CarrierOutcome::Indeterminate { reason: "malformed" };
    }
    CarrierOutcome::Purchased { label, replayed }
}

/// Why a label the carrier sold is not the one we asked for, or not one we
/// can keep: the parcel it echoes, its id (a path segment and a storage
/// key), its tracking number.
fn check_label(label: &CarrierLabel, request: &CarrierLabelRequest) -> Result<(), &'static str> {
    let echoed = CarrierLabelRequest {
        order_id: label.order_id,
        parcel_no: label.parcel_no,
        label_version: label.label_version,
        service: label.service,
        weight_g: label.weight_g,
    };
    if echoed != *request {
        return Err("the label is for another parcel, service or weight than the one asked for");
    }
    let id_byte = |b: u8| b.is_ascii_alphanumeric() || b == b'_' || b == b'-';
    let id = label.carrier_label_id.as_bytes();
    if id.is_empty() || id.len() > LABEL_ID_BYTES_MAX || !id.iter().all(|&b| id_byte(b)) {
        return Err("the label id is empty, too long, or not letters, digits, '_' and '-'");
    }
    let tracking = label.tracking_no.as_bytes();
    if tracking.is_empty() || tracking.len() > TRACKING_NO_BYTES_MAX || !tracking.iter().all(u8::is_ascii_alphanumeric)
    {
        return Err("the tracking number is empty, too long, or not letters and digits");
    }
    Ok(())
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
