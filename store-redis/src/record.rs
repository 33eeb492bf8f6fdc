//! The record's stored form: hash fields, and the bytes of a saved response.
//!
//! The scripts compare and copy fields but never look inside a response, so
//! the response is one opaque field: a format-version byte, then postcard.
//! Tokens and fingerprints are lowercase hex, which the scripts compare as
//! strings. Everything read back is checked again here, as outside input.

use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use store_core::{
    CodecError, Fingerprint, Lease, LeaseToken, Record, RecordState, RecoveryPoint, SavedResponse, StoreError,
};

/// The version byte in front of every stored response.
pub const RESPONSE_FORMAT_VERSION: u8 = 1;

/// The fields of a saved response, in the order postcard writes them.
#[derive(Serialize)]
struct ResponseOut<'a> {
    status: u16,
    headers: &'a [(String, String)],
    body: &'a [u8],
}

#[derive(Deserialize)]
struct ResponseIn {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

pub fn encode_response(response: &SavedResponse) -> Vec<u8> {
    let fields = ResponseOut {
        status: response.status(),
        headers: response.headers(),
        body: response.body(),
    };
    let mut bytes = vec![RESPONSE_FORMAT_VERSION];
    // Serialising plain borrowed data into a Vec has no failure mode but
    // allocation, which aborts anyway. Were it ever to fail, the version byte
    // alone would be saved as the response: stop loudly instead.
    let body = postcard::to_stdvec(&fields).expect("postcard serialises a response into a Vec");
    bytes.extend_from_slice(&body);
    bytes
}

/// Decodes and re-validates a stored response.
pub fn decode_response(bytes: &[u8]) -> Result<SavedResponse, CodecError> {
    let (&version, body) = bytes.split_first().ok_or(CodecError::Empty)?;
    if version != RESPONSE_FORMAT_VERSION {
        return Err(CodecError::UnknownVersion(version));
    }
    let (fields, rest): (ResponseIn, &[u8]) =
        postcard::take_from_bytes(body).map_err(|error| CodecError::Malformed(format!("response: {error}")))?;
    if !rest.is_empty() {
        return Err(CodecError::Malformed(format!(
            "response has {} trailing bytes",
            rest.len()
        )));
    }
    Ok(SavedResponse::new(fields.status, fields.headers, fields.body)?)
}

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

    fn response() -> SavedResponse {
        let body = vec![0x00, 0xff, 0xfe, b'{', b'}'];
        SavedResponse::new(201, vec![("location".into(), "/v1/labels/L1".into())], body).unwrap()
    }

    #[test]
    fn responses_round_trip_byte_for_byte() {
        assert_eq!(decode_response(&encode_response(&response())), Ok(response()));
    }

    #[test]
    fn damaged_responses_are_errors_not_panics() {
        let good = encode_response(&response());
        assert_eq!(decode_response(&[]), Err(CodecError::Empty));
        assert_eq!(decode_response(&[9]), Err(CodecError::UnknownVersion(9)));
        assert!(decode_response(&good[..good.len() - 1]).is_err());
        let mut long = good.clone();
        long.push(0);
        assert!(decode_response(&long).is_err());
        // A status outside 100-599 decodes but is refused by the limits.
        let out_of_range = ResponseOut {
            status: 5,
            headers: &[],
            body: &[],
        };
        let mut bad_status = vec![RESPONSE_FORMAT_VERSION];
        bad_status.extend_from_slice(&postcard::to_stdvec(&out_of_range).unwrap());
        assert!(matches!(decode_response(&bad_status), Err(CodecError::Invalid(_))));
        for position in 0..good.len() {
            let mut mutated = good.clone();
            mutated[position] ^= 0xa5;
            let _ = decode_response(&mutated);
        }
    }

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
