//! The record's stored form: hash fields, and the bytes of a saved response.
//!
//! The scripts compare and copy fields but never look inside a response, so
//! the response is one opaque field in store-core's saved-response format
//! ([`store_core::encode_response`], pinned by a byte fixture there).
//! Tokens and fingerprints are lowercase hex, which the scripts compare as
//! strings. Everything read back is checked again here, as outside input.

use std::collections::HashMap;
use store_core::decode_response;
use store_core::{CodecError, Fingerprint, Lease, LeaseToken, Record, RecordState, RecoveryPoint, StoreError};

pub fn token_hex(token: LeaseToken) -> String {
    token.to_string()
}

pub fn fingerprint_hex(fingerprint: &Fingerprint) -> String {
    fingerprint.to_string()
}

pub fn recovery_point(bytes: Vec<u8>) -> Result<RecoveryPoint, StoreError> {
    RecoveryPoint::new(bytes).map_err(|error| StoreError::Corrupt(CodecError::Invalid(error)))
}

pub fn corrupt(detail: impl Into<String>) -> StoreError {
    StoreError::Corrupt(CodecError::Malformed(detail.into()))
}

/// The record from its hash fields (`HGETALL`), checking every field.
pub fn record_from_fields(mut fields: HashMap<String, Vec<u8>>) -> Result<Record, StoreError> {
    let mut take = |name: &str| {
        fields
            .remove(name)
            .ok_or_else(|| corrupt(format!("record lacks {name}")))
    };
    let fingerprint = Fingerprint(parse_hex::<32>(&take("fingerprint")?, "fingerprint")?);
    let created_at_ms = parse_ms(&take("created_at_ms")?, "created_at_ms")?;
    let expires_at_ms = parse_ms(&take("expires_at_ms")?, "expires_at_ms")?;
    let state = match take("state")?.as_slice() {
        b"started" => RecordState::Started {
            lease: Lease {
                token: parse_token(&take("lease_token")?)?,
                locked_until_ms: parse_ms(&take("locked_until_ms")?, "locked_until_ms")?,
            },
            recovery_point: fields.remove("point").map(recovery_point).transpose()?,
        },
        b"completed" => RecordState::Completed {
            completed_by: parse_token(&take("completed_by")?)?,
            response: decode_response(&take("response")?)?,
        },
        other => return Err(corrupt(format!("record state {:?}", String::from_utf8_lossy(other)))),
    };
    Ok(Record {
        fingerprint,
        state,
        created_at_ms,
        expires_at_ms,
    })
}

pub fn parse_ms(bytes: &[u8], name: &str) -> Result<u64, StoreError> {
    std::str::from_utf8(bytes)
        .ok()
        .and_then(|text| text.parse().ok())
        .ok_or_else(|| corrupt(format!("{name} is not a whole number of milliseconds")))
}

fn parse_token(bytes: &[u8]) -> Result<LeaseToken, StoreError> {
    Ok(LeaseToken(u128::from_be_bytes(parse_hex::<16>(bytes, "lease token")?)))
}

fn parse_hex<const N: usize>(bytes: &[u8], name: &str) -> Result<[u8; N], StoreError> {
    let mut out = [0; N];
    hex::decode_to_slice(bytes, &mut out).map_err(|_| corrupt(format!("{name} is not {N} bytes of hex")))?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_fixed_width_hex_that_parse_back() {
        let token = LeaseToken(0x00ab_0000_0000_0000_0000_0000_0000_0001);
        let text = token_hex(token);
        assert_eq!(text.len(), 32);
        assert_eq!(parse_token(text.as_bytes()).ok(), Some(token));
        assert!(parse_token(b"xyz").is_err());
    }

    #[test]
    fn a_hash_that_is_not_a_record_is_corrupt() {
        let fields = HashMap::from([("state".to_owned(), b"started".to_vec())]);
        assert!(matches!(record_from_fields(fields), Err(StoreError::Corrupt(_))));
    }
}
