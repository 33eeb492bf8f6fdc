//! The plain data of the store: who is calling, which key, what the request
//! looked like, who holds the lease, and what was answered.
//!
//! Every type that comes from outside (`CallerId`, `IdempotencyKey`,
//! `SavedResponse`, `RecoveryPoint`, `Policy`) is valid by construction: its
//! constructor checks the named limits below and returns a typed error.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::fmt;

/// Longest idempotency key accepted, in bytes (Stripe's and the IETF draft's 255).
pub const IDEMPOTENCY_KEY_BYTES_MAX: usize = 255;
/// Longest caller id, in bytes.
pub const CALLER_ID_BYTES_MAX: usize = 64;
/// Largest saved response body, in bytes.
pub const RESPONSE_BODY_BYTES_MAX: usize = 1024 * 1024;
/// Most headers a saved response may carry.
pub const RESPONSE_HEADERS_COUNT_MAX: usize = 16;
/// Longest saved header name plus value, in bytes.
pub const RESPONSE_HEADER_BYTES_MAX: usize = 1024;
/// Largest recovery point, in bytes.
pub const RECOVERY_POINT_BYTES_MAX: usize = 64 * 1024;

/// Default lease: how long one attempt owns a key before a retry may take over.
pub const LEASE_MS_DEFAULT: u64 = 30_000;
/// Default retention of a completed record.
pub const RETENTION_MS_DEFAULT: u64 = 24 * 60 * 60 * 1000;
/// Default time a tombstone outlives its purged record, so late retries are noticed.
pub const TOMBSTONE_MS_DEFAULT: u64 = 7 * 24 * 60 * 60 * 1000;
/// Shortest lease accepted (tests use short leases; production uses seconds).
pub const LEASE_MS_MIN: u64 = 10;
/// Longest lease accepted.
pub const LEASE_MS_MAX: u64 = 60 * 60 * 1000;
/// Longest retention accepted (a year).
pub const RETENTION_MS_MAX: u64 = 366 * 24 * 60 * 60 * 1000;

/// Why a value from outside was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidInput {
    #[error("idempotency key is empty")]
    KeyEmpty,
    #[error("idempotency key is {length} bytes, more than {IDEMPOTENCY_KEY_BYTES_MAX}")]
    KeyTooLong { length: usize },
    #[error("idempotency key has byte 0x{byte:02x} at {position}; only printable ASCII 0x20-0x7E is allowed")]
    KeyByte { byte: u8, position: usize },
    #[error("caller id must be 1 to {CALLER_ID_BYTES_MAX} bytes of [A-Za-z0-9._-]")]
    CallerId,
    #[error("response body is {length} bytes, more than {RESPONSE_BODY_BYTES_MAX}")]
    ResponseBodyTooLarge { length: usize },
    #[error("response status {status} is outside 100-599")]
    ResponseStatus { status: u16 },
    #[error("more than {RESPONSE_HEADERS_COUNT_MAX} response headers")]
    TooManyHeaders,
    #[error(
        "response header {name:?} is not a lowercase token with a printable ASCII value of at most {RESPONSE_HEADER_BYTES_MAX} bytes"
    )]
    Header { name: String },
    #[error("recovery point is {length} bytes, more than {RECOVERY_POINT_BYTES_MAX}")]
    RecoveryPointTooLarge { length: usize },
    #[error("policy: {0}")]
    Policy(&'static str),
    #[error("a record created at {created_at_ms} ms must expire after it, not at {expires_at_ms} ms")]
    RecordTimes { created_at_ms: u64, expires_at_ms: u64 },
}

/// Who is calling. Keys are scoped per caller: the same key under two callers
/// names two records.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct CallerId(String);

impl CallerId {
    pub fn new(id: impl Into<String>) -> Result<Self, InvalidInput> {
        let id = id.into();
        let allowed = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-');
        if id.is_empty() || id.len() > CALLER_ID_BYTES_MAX || !id.bytes().all(allowed) {
            return Err(InvalidInput::CallerId);
        }
        Ok(Self(id))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for CallerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A client-chosen key naming one intent: 1 to 255 bytes of printable ASCII.
///
/// Backends never store the raw key, only [`IdempotencyKey::digest`]: keys
/// may carry personal data, and stored keys end up in logs and dumps. The
/// `Debug` form is redacted for the same reason.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    pub fn new(key: &str) -> Result<Self, InvalidInput> {
        Self::from_bytes(key.as_bytes())
    }

    /// Bytes form, for callers that read a header value as bytes.
    pub fn from_bytes(key: &[u8]) -> Result<Self, InvalidInput> {
        if key.is_empty() {
            return Err(InvalidInput::KeyEmpty);
        }
        if key.len() > IDEMPOTENCY_KEY_BYTES_MAX {
            return Err(InvalidInput::KeyTooLong { length: key.len() });
        }
        if let Some((position, &byte)) = key.iter().enumerate().find(|(_, b)| !(0x20..=0x7e).contains(*b)) {
            return Err(InvalidInput::KeyByte { byte, position });
        }
        // Printable ASCII is valid UTF-8, so this conversion cannot fail.
        let text = String::from_utf8(key.to_vec()).map_err(|_| InvalidInput::KeyByte { byte: 0, position: 0 })?;
        Ok(Self(text))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// SHA-256 of the key: what backends store and index.
    pub fn digest(&self) -> KeyDigest {
        KeyDigest(Sha256::digest(self.0.as_bytes()).into())
    }
}

impl fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IdempotencyKey({} bytes, sha256 {})", self.0.len(), self.digest())
    }
}

/// SHA-256 of an idempotency key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct KeyDigest(pub [u8; 32]);

impl fmt::Display for KeyDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

/// SHA-256 over the request's method, path and canonical body; see
/// [`crate::fingerprint`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Fingerprint(pub [u8; 32]);

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

/// Names one attempt. Set on claim and on takeover; every later write of that
/// attempt must present it (a fencing token), so an attempt that lost its
/// lease can never overwrite the work of the one that took over.
///
/// The token is made before the claim is sent, outside any retry loop, so a
/// claim that is re-sent after a lost reply is recognised as the same attempt.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LeaseToken(pub u128);

impl LeaseToken {
    pub fn random() -> Self {
        Self(rand::random::<u128>())
    }
}

impl fmt::Debug for LeaseToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LeaseToken({:032x})", self.0)
    }
}

impl fmt::Display for LeaseToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

/// How long leases, records and tombstones live. A tombstone window of 0
/// keeps no tombstones (late keys are then only noticed while an expired
/// record has not been swept yet).
///
/// Deserialised (a config file's `[policy]`: `lease_ms`, `retention_ms`,
/// `tombstone_ms`, each defaulting to [`Policy::default`]'s) through
/// [`Policy::new`], so a policy read from a file is checked like any other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "PolicyFields")]
pub struct Policy {
    lease_ms: u64,
    retention_ms: u64,
    tombstone_ms: u64,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            lease_ms: LEASE_MS_DEFAULT,
            retention_ms: RETENTION_MS_DEFAULT,
            tombstone_ms: TOMBSTONE_MS_DEFAULT,
        }
    }
}

/// The fields of a [`Policy`] as written, before [`Policy::new`] checks them.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, default)]
struct PolicyFields {
    lease_ms: u64,
    retention_ms: u64,
    tombstone_ms: u64,
}

impl Default for PolicyFields {
    fn default() -> Self {
        let policy = Policy::default();
        Self {
            lease_ms: policy.lease_ms,
            retention_ms: policy.retention_ms,
            tombstone_ms: policy.tombstone_ms,
        }
    }
}

impl TryFrom<PolicyFields> for Policy {
    type Error = InvalidInput;

    fn try_from(fields: PolicyFields) -> Result<Self, Self::Error> {
        Policy::new(fields.lease_ms, fields.retention_ms, fields.tombstone_ms)
    }
}

impl Policy {
    /// A retention shorter than the lease would purge a record while its
    /// attempt may still be running, so it is refused.
    pub fn new(lease_ms: u64, retention_ms: u64, tombstone_ms: u64) -> Result<Self, InvalidInput> {
        if !(LEASE_MS_MIN..=LEASE_MS_MAX).contains(&lease_ms) {
            return Err(InvalidInput::Policy("lease must be between 10 ms and 1 h"));
        }
        if retention_ms < lease_ms || retention_ms > RETENTION_MS_MAX {
            return Err(InvalidInput::Policy(
                "retention must be at least the lease and at most 366 days",
            ));
        }
        if tombstone_ms > RETENTION_MS_MAX {
            return Err(InvalidInput::Policy("tombstone window must be at most 366 days"));
        }
        Ok(Self {
            lease_ms,
            retention_ms,
            tombstone_ms,
        })
    }

    pub fn lease_ms(&self) -> u64 {
        self.lease_ms
    }

    pub fn retention_ms(&self) -> u64 {
        self.retention_ms
    }

    pub fn tombstone_ms(&self) -> u64 {
        self.tombstone_ms
    }
}

/// The answer that was given, kept so that every repeat gets it back byte for byte.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedResponse {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl SavedResponse {
    /// Header names must be lowercase HTTP tokens; choosing which headers to
    /// keep (the allow-list) is the HTTP layer's business.
    pub fn new(status: u16, headers: Vec<(String, String)>, body: Vec<u8>) -> Result<Self, InvalidInput> {
        if !(100..=599).contains(&status) {
            return Err(InvalidInput::ResponseStatus { status });
        }
        if body.len() > RESPONSE_BODY_BYTES_MAX {
            return Err(InvalidInput::ResponseBodyTooLarge { length: body.len() });
        }
        if headers.len() > RESPONSE_HEADERS_COUNT_MAX {
            return Err(InvalidInput::TooManyHeaders);
        }
        if let Some((name, _)) = headers.iter().find(|(name, value)| !header_is_valid(name, value)) {
            return Err(InvalidInput::Header { name: name.clone() });
        }
        Ok(Self { status, headers, body })
    }

    pub fn status(&self) -> u16 {
        self.status
    }

    pub fn headers(&self) -> &[(String, String)] {
        &self.headers
    }

    pub fn body(&self) -> &[u8] {
        &self.body
    }

    /// Re-checks the limits on a decoded value, which did not pass through `new`.
    pub(crate) fn validate(self) -> Result<Self, InvalidInput> {
        Self::new(self.status, self.headers, self.body)
    }
}

fn header_is_valid(name: &str, value: &str) -> bool {
    let token_byte = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit() || b"!#$%&'*+-.^_`|~".contains(&b);
    !name.is_empty()
        && name.len() + value.len() <= RESPONSE_HEADER_BYTES_MAX
        && name.bytes().all(token_byte)
        && value.bytes().all(|b| (0x20..=0x7e).contains(&b) || b == b'\t')
}

/// What a multi-phase handler saved after a phase, so that an attempt taking
/// over an expired lease resumes instead of starting again (Brandur Leach's
/// recovery points).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecoveryPoint(Vec<u8>);

impl RecoveryPoint {
    pub fn new(bytes: Vec<u8>) -> Result<Self, InvalidInput> {
        if bytes.len() > RECOVERY_POINT_BYTES_MAX {
            return Err(InvalidInput::RecoveryPointTooLarge { length: bytes.len() });
        }
        Ok(Self(bytes))
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    pub(crate) fn validate(self) -> Result<Self, InvalidInput> {
        Self::new(self.0)
    }
}

/// One attempt's hold on a key until `locked_until_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    pub token: LeaseToken,
    pub locked_until_ms: u64,
}

/// The record kept per (caller, key).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub fingerprint: Fingerprint,
    pub state: RecordState,
    pub created_at_ms: u64,
    /// After this instant the record counts as purged, whether or not the
    /// sweeper has deleted it yet.
    pub expires_at_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum RecordState {
    /// One attempt owns the key.
    Started {
        lease: Lease,
        recovery_point: Option<RecoveryPoint>,
    },
    /// The answer is saved. `completed_by` remembers the attempt that
    /// completed it, so that attempt's retried completion (after a commit
    /// whose outcome was unknown) is recognised as already done.
    Completed {
        response: SavedResponse,
        completed_by: LeaseToken,
    },
}

impl Record {
    pub fn is_expired(&self, now_ms: u64) -> bool {
        self.expires_at_ms <= now_ms
    }

    /// The lease, while the record is started.
    pub fn lease(&self) -> Option<&Lease> {
        match &self.state {
            RecordState::Started { lease, .. } => Some(lease),
            RecordState::Completed { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A policy read from a file is checked by `Policy::new`, takes the
    /// defaults for the fields it leaves out, and refuses unknown ones.
    #[test]
    fn a_deserialised_policy_is_checked_and_defaulted() {
        let policy: Policy = serde_json::from_str(r#"{"lease_ms": 45000}"#).unwrap();
        let defaults = Policy::default();
        assert_eq!(
            (policy.lease_ms(), policy.retention_ms(), policy.tombstone_ms()),
            (45_000, defaults.retention_ms(), defaults.tombstone_ms())
        );
        let too_short = serde_json::from_str::<Policy>(r#"{"lease_ms": 1}"#).unwrap_err();
        assert!(too_short.to_string().contains("lease must be between"), "{too_short}");
        let retention = serde_json::from_str::<Policy>(r#"{"lease_ms": 5000, "retention_ms": 4999}"#).unwrap_err();
        assert!(
            retention.to_string().contains("retention must be at least the lease"),
            "{retention}"
        );
        let unknown = serde_json::from_str::<Policy>(r#"{"lease": 5000}"#).unwrap_err();
        assert!(unknown.to_string().contains("unknown field"), "{unknown}");
    }

    #[test]
    fn keys_accept_the_printable_ascii_range_and_nothing_else() {
        assert!(IdempotencyKey::new(" ~label:918273:1:v1").is_ok());
        assert_eq!(IdempotencyKey::new(""), Err(InvalidInput::KeyEmpty));
        assert_eq!(
            IdempotencyKey::new(&"k".repeat(256)),
            Err(InvalidInput::KeyTooLong { length: 256 })
        );
        assert!(IdempotencyKey::new(&"k".repeat(255)).is_ok());
        assert_eq!(
            IdempotencyKey::new("a\u{7f}"),
            Err(InvalidInput::KeyByte {
                byte: 0x7f,
                position: 1
            })
        );
        assert_eq!(
            IdempotencyKey::new("a\tb"),
            Err(InvalidInput::KeyByte {
                byte: 0x09,
                position: 1
            })
        );
        assert!(matches!(
            IdempotencyKey::new("é"),
            Err(InvalidInput::KeyByte {
                byte: 0xc3,
                position: 0
            })
        ));
        assert!(matches!(
            IdempotencyKey::from_bytes(&[0xff, 0xfe]),
            Err(InvalidInput::KeyByte { .. })
        ));
    }

    #[test]
    fn key_debug_form_does_not_show_the_key() {
        let key = IdempotencyKey::new("customer-jane@example.com").unwrap();
        assert!(!format!("{key:?}").contains("jane"));
    }

    #[test]
    fn caller_ids_are_restricted_to_a_safe_alphabet() {
        assert!(CallerId::new("fulfilment-eu.1").is_ok());
        for bad in ["", "a:b", "a b", "a\0", "é", &"c".repeat(65)] {
            assert_eq!(CallerId::new(bad), Err(InvalidInput::CallerId), "{bad:?}");
        }
    }

    #[test]
    fn policy_refuses_retention_shorter_than_lease_and_out_of_range_leases() {
        assert!(Policy::new(30_000, 86_400_000, 0).is_ok());
        assert!(Policy::new(30_000, 29_999, 0).is_err());
        assert!(Policy::new(5, 1_000, 0).is_err());
        assert!(Policy::new(LEASE_MS_MAX + 1, RETENTION_MS_MAX, 0).is_err());
        assert!(Policy::new(1_000, RETENTION_MS_MAX + 1, 0).is_err());
    }

    #[test]
    fn saved_responses_enforce_their_limits() {
        assert!(SavedResponse::new(201, vec![("location".into(), "/v1/labels/L1".into())], vec![1]).is_ok());
        assert!(SavedResponse::new(99, vec![], vec![]).is_err());
        assert!(SavedResponse::new(200, vec![("Location".into(), "x".into())], vec![]).is_err());
        assert!(SavedResponse::new(200, vec![("x".into(), "a\nb".into())], vec![]).is_err());
        assert!(SavedResponse::new(200, vec![], vec![0; RESPONSE_BODY_BYTES_MAX + 1]).is_err());
        let many = (0..=RESPONSE_HEADERS_COUNT_MAX)
            .map(|i| (format!("h{i}"), String::new()))
            .collect();
        assert_eq!(SavedResponse::new(200, many, vec![]), Err(InvalidInput::TooManyHeaders));
    }
}
