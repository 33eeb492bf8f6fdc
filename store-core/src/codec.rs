//! The stored forms of a record and of a saved response: each one
//! format-version byte, then postcard.
//!
//! postcard is compact, stable (its wire format is frozen at 1.0) and
//! maintained; bincode is avoided (see the README's dependency notes). A
//! committed byte fixture for each (`tests/fixtures/record-v1.bin`,
//! `tests/fixtures/response-v1.bin`) is decoded and re-encoded by a test, so
//! any change to a layout is caught before it ships; the deflated response's
//! fixture (`response-v1-deflated.bin`, written by another deflater, zlib)
//! is decoded.
//!
//! Who uses which: the FDB-style store keeps whole records
//! ([`encode_record`]); the Redis store keeps a record as hash fields, its
//! saved response as one opaque field ([`encode_response`]), since its
//! scripts copy a response but never look inside; PostgreSQL keeps the
//! response deflated in one column ([`encode_response_deflated`]), since
//! PostgreSQL compresses nothing in a row under about 2 KB and the design
//! sizes a record at 512 bytes (BENCHMARKS.md, "A day of keys").

use crate::types::{
    InvalidInput, RESPONSE_BODY_BYTES_MAX, RESPONSE_HEADER_BYTES_MAX, RESPONSE_HEADERS_COUNT_MAX, Record, RecordState,
    SavedResponse,
};
use serde::{Deserialize, Serialize};

/// The version byte written in front of every encoded record.
pub const RECORD_FORMAT_VERSION: u8 = 1;
/// The version byte written in front of every encoded saved response.
pub const RESPONSE_FORMAT_VERSION: u8 = 1;
/// How far above this build's format version a version byte is taken for a
/// newer build's ([`CodecError::NewerVersion`]: kept, never deleted as
/// unreadable). Formats change one version at a time, a few in the life of
/// a deployment; a byte far above (a torn write, a foreign writer, the 255
/// of a test's garbage) is corruption, so the operator can still clear it.
pub const FORMAT_VERSIONS_AHEAD_MAX: u8 = 16;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    #[error("record is empty")]
    Empty,
    #[error("record format version {0} is not known to this build")]
    UnknownVersion(u8),
    /// A version byte above this build's: written by a newer build (a
    /// rolling upgrade that changed the format), so readable by that build.
    /// Not corruption: nothing may delete it as unreadable.
    #[error("record format version {0} is newer than this build reads; a newer build wrote it")]
    NewerVersion(u8),
    #[error("record bytes are malformed: {0}")]
    Malformed(String),
    #[error("record breaks a limit: {0}")]
    Invalid(#[from] InvalidInput),
}

impl CodecError {
    /// True when the bytes were written by a newer build: readable there,
    /// so to be kept, not deleted as unreadable.
    pub fn is_newer_format(&self) -> bool {
        matches!(self, CodecError::NewerVersion(_))
    }
}

/// Refuses a version byte other than `known`, telling a newer build's
/// (at most [`FORMAT_VERSIONS_AHEAD_MAX`] above) from one no build wrote.
fn check_version(version: u8, known: u8) -> Result<(), CodecError> {
    let newer = known.saturating_add(1)..=known.saturating_add(FORMAT_VERSIONS_AHEAD_MAX);
    match version {
        _ if version == known => Ok(()),
        _ if newer.contains(&version) => Err(CodecError::NewerVersion(version)),
        _ => Err(CodecError::UnknownVersion(version)),
    }
}

pub fn encode_record(record: &Record) -> Vec<u8> {
    let mut bytes = vec![RECORD_FORMAT_VERSION];
    // Serialising plain owned data into a Vec has no failure mode but
    // allocation, which aborts anyway. Were it ever to fail, writing the
    // version byte alone would store a record no one can read: stop loudly.
    let body = postcard::to_stdvec(record).expect("postcard serialises a record into a Vec");
    bytes.extend_from_slice(&body);
    bytes
}

/// Decodes and re-validates a record: bytes from disk or the network are
/// outside input like any other.
pub fn decode_record(bytes: &[u8]) -> Result<Record, CodecError> {
    let (&version, body) = bytes.split_first().ok_or(CodecError::Empty)?;
    check_version(version, RECORD_FORMAT_VERSION)?;
    let (record, rest): (Record, &[u8]) =
        postcard::take_from_bytes(body).map_err(|error| CodecError::Malformed(error.to_string()))?;
    if !rest.is_empty() {
        return Err(CodecError::Malformed(format!("{} trailing bytes", rest.len())));
    }
    validate(record)
}

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

/// A saved response as stored on its own (status, headers, body), for
/// replay.
pub fn encode_response(response: &SavedResponse) -> Vec<u8> {
    let fields = ResponseOut {
        status: response.status(),
        headers: response.headers(),
        body: response.body(),
    };
    let mut bytes = vec![RESPONSE_FORMAT_VERSION];
    // Serialising plain borrowed data into a Vec has no failure mode but
    // allocation, which aborts anyway.
    bytes.extend_from_slice(&postcard::to_stdvec(&fields).unwrap_or_default());
    bytes
}

/// Longest [`encode_response`] output a response within the limits can
/// have: the version byte, the status, the header count, every header and
/// the body with their lengths (postcard writes a length as a varint of at
/// most 10 bytes). [`decode_response_deflated`] inflates no further, so
/// bytes that inflate without end are refused, not buffered.
pub const ENCODED_RESPONSE_BYTES_MAX: usize =
    1 + 3 + 10 + RESPONSE_HEADERS_COUNT_MAX * (RESPONSE_HEADER_BYTES_MAX + 2 * 10) + 10 + RESPONSE_BODY_BYTES_MAX;

/// miniz's default level. On the Label service's ~300-byte response (about
/// 10 µs to deflate, 4 µs to inflate), level 1 saves 3 bytes less and is
/// not reliably faster: most of the time goes to preparing the
/// compressor's tables, not to the search.
const RESPONSE_DEFLATE_LEVEL: u8 = 6;

/// [`encode_response`], deflated (RFC 1951, raw). The Label service's
/// 201 (about 300 bytes) becomes about 215.
pub fn encode_response_deflated(response: &SavedResponse) -> Vec<u8> {
    miniz_oxide::deflate::compress_to_vec(&encode_response(response), RESPONSE_DEFLATE_LEVEL)
}

/// Inflates (at most [`ENCODED_RESPONSE_BYTES_MAX`]) and decodes what
/// [`encode_response_deflated`] wrote.
pub fn decode_response_deflated(bytes: &[u8]) -> Result<SavedResponse, CodecError> {
    if bytes.is_empty() {
        return Err(CodecError::Empty);
    }
    let encoded = miniz_oxide::inflate::decompress_to_vec_with_limit(bytes, ENCODED_RESPONSE_BYTES_MAX)
        .map_err(|error| CodecError::Malformed(format!("deflated response: {error}")))?;
    decode_response(&encoded)
}

/// Decodes and re-validates a stored response: its limits are checked again,
/// as for any outside input.
pub fn decode_response(bytes: &[u8]) -> Result<SavedResponse, CodecError> {
    let (&version, body) = bytes.split_first().ok_or(CodecError::Empty)?;
    check_version(version, RESPONSE_FORMAT_VERSION)?;
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

fn validate(mut record: Record) -> Result<Record, CodecError> {
    record.state = match record.state {
        RecordState::Started { lease, recovery_point } => RecordState::Started {
            lease,
            recovery_point: recovery_point.map(|p| p.validate()).transpose()?,
        },
        RecordState::Completed { response, completed_by } => RecordState::Completed {
            response: response.validate()?,
            completed_by,
        },
    };
    Ok(record)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{Fingerprint, Lease, LeaseToken, RecoveryPoint, SavedResponse};
    use proptest::prelude::*;

    const FIXTURE: &[u8] = include_bytes!("../tests/fixtures/record-v1.bin");
    const RESPONSE_FIXTURE: &[u8] = include_bytes!("../tests/fixtures/response-v1.bin");

    /// The response stored in the response fixture. As with the record's,
    /// a format change means a new version byte and a new fixture.
    fn fixture_response() -> SavedResponse {
        SavedResponse::new(
            201,
            vec![
                ("content-type".into(), "application/json".into()),
                ("location".into(), "/v1/labels/L-5521".into()),
            ],
            br#"{"label_id":"L-5521","tracking_no":"GRD000918273"}"#.to_vec(),
        )
        .unwrap()
    }

    #[test]
    fn the_committed_response_fixture_decodes_to_the_known_response() {
        assert_eq!(decode_response(RESPONSE_FIXTURE), Ok(fixture_response()));
        assert_eq!(encode_response(&fixture_response()), RESPONSE_FIXTURE);
    }

    const DEFLATED_RESPONSE_FIXTURE: &[u8] = include_bytes!("../tests/fixtures/response-v1-deflated.bin");

    /// A deflater may write other bytes for the same input in another
    /// version, so the fixture pins what a stored response inflates to, and
    /// the encoder is checked by the round trip.
    #[test]
    fn the_committed_deflated_fixture_decodes_to_the_known_response() {
        assert_eq!(
            decode_response_deflated(DEFLATED_RESPONSE_FIXTURE),
            Ok(fixture_response())
        );
        let deflated = encode_response_deflated(&fixture_response());
        assert_eq!(decode_response_deflated(&deflated), Ok(fixture_response()));
        assert!(deflated.len() < RESPONSE_FIXTURE.len(), "{} bytes", deflated.len());
    }

    #[test]
    fn damaged_deflated_responses_are_errors_not_panics() {
        assert_eq!(decode_response_deflated(&[]), Err(CodecError::Empty));
        let fixture = DEFLATED_RESPONSE_FIXTURE;
        assert!(matches!(
            decode_response_deflated(&fixture[..fixture.len() - 1]),
            Err(CodecError::Malformed(_))
        ));
        assert!(matches!(
            decode_response_deflated(&[0xde, 0xad, 0xbe, 0xef]),
            Err(CodecError::Malformed(_))
        ));
        // Deflated bytes that are not an encoded response.
        let not_a_response = miniz_oxide::deflate::compress_to_vec(&[0, 1, 2], RESPONSE_DEFLATE_LEVEL);
        assert_eq!(
            decode_response_deflated(&not_a_response),
            Err(CodecError::UnknownVersion(0))
        );
    }

    /// A few bytes that inflate past any response within the limits are
    /// refused once the limit is reached, not inflated to the end.
    #[test]
    fn a_deflated_response_that_inflates_past_the_limit_is_refused() {
        let huge = vec![b'x'; ENCODED_RESPONSE_BYTES_MAX + 1];
        let bomb = miniz_oxide::deflate::compress_to_vec(&huge, RESPONSE_DEFLATE_LEVEL);
        assert!(bomb.len() < 4096, "{} bytes", bomb.len());
        assert!(matches!(
            decode_response_deflated(&bomb),
            Err(CodecError::Malformed(message)) if message.contains("deflated response")
        ));
    }

    #[test]
    fn the_largest_response_within_the_limits_fits_the_inflate_limit() {
        let header_value = "v".repeat(RESPONSE_HEADER_BYTES_MAX - 2);
        let headers = (0..RESPONSE_HEADERS_COUNT_MAX)
            .map(|index| (format!("h{}", (b'a' + index as u8) as char), header_value.clone()))
            .collect();
        let largest = SavedResponse::new(599, headers, vec![0xff; RESPONSE_BODY_BYTES_MAX]).unwrap();
        assert!(encode_response(&largest).len() <= ENCODED_RESPONSE_BYTES_MAX);
        assert_eq!(
            decode_response_deflated(&encode_response_deflated(&largest)),
            Ok(largest)
        );
    }

    #[test]
    fn damaged_responses_are_errors_not_panics() {
        assert_eq!(decode_response(&[]), Err(CodecError::Empty));
        assert_eq!(decode_response(&[0]), Err(CodecError::UnknownVersion(0)));
        assert_eq!(decode_response(&[255]), Err(CodecError::UnknownVersion(255)));
        let fixture = RESPONSE_FIXTURE;
        assert!(matches!(
            decode_response(&fixture[..fixture.len() - 1]),
            Err(CodecError::Malformed(_))
        ));
        let mut long = fixture.to_vec();
        long.push(0);
        assert!(matches!(decode_response(&long), Err(CodecError::Malformed(_))));
        // A status outside 100-599 decodes but is refused by the limits.
        let out_of_range = ResponseOut {
            status: 5,
            headers: &[],
            body: &[],
        };
        let mut bad_status = vec![RESPONSE_FORMAT_VERSION];
        bad_status.extend_from_slice(&postcard::to_stdvec(&out_of_range).unwrap());
        assert!(matches!(decode_response(&bad_status), Err(CodecError::Invalid(_))));
    }

    /// The record stored in the fixture. Changing the format means adding a
    /// new version byte and a new fixture, never editing this one.
    fn fixture_record() -> Record {
        let response = SavedResponse::new(
            201,
            vec![("location".into(), "/v1/labels/L-5521".into())],
            br#"{"label_id":"L-5521","tracking_no":"GRD000918273"}"#.to_vec(),
        )
        .unwrap();
        Record {
            fingerprint: Fingerprint([7; 32]),
            state: RecordState::Completed {
                response,
                completed_by: LeaseToken(0x0123_4567_89ab_cdef_0011_2233_4455_6677),
            },
            created_at_ms: 1_790_000_000_000,
            expires_at_ms: 1_790_086_400_000,
        }
    }

    #[test]
    fn the_committed_fixture_decodes_to_the_known_record() {
        assert_eq!(decode_record(FIXTURE), Ok(fixture_record()));
        assert_eq!(encode_record(&fixture_record()), FIXTURE);
    }

    #[test]
    fn round_trip_of_a_started_record() {
        let record = Record {
            fingerprint: Fingerprint([1; 32]),
            state: RecordState::Started {
                lease: Lease {
                    token: LeaseToken(9),
                    locked_until_ms: 5,
                },
                recovery_point: Some(RecoveryPoint::new(vec![1, 2, 3]).unwrap()),
            },
            created_at_ms: 1,
            expires_at_ms: 2,
        };
        assert_eq!(decode_record(&encode_record(&record)), Ok(record));
    }

    #[test]
    fn unknown_versions_empty_and_trailing_bytes_are_errors() {
        assert_eq!(decode_record(&[]), Err(CodecError::Empty));
        assert_eq!(decode_record(&[0, 0]), Err(CodecError::UnknownVersion(0)));
        let mut long = FIXTURE.to_vec();
        long.push(0);
        assert!(matches!(decode_record(&long), Err(CodecError::Malformed(_))));
        assert!(matches!(
            decode_record(&FIXTURE[..FIXTURE.len() - 1]),
            Err(CodecError::Malformed(_))
        ));
    }

    /// A rolling upgrade that changes the format: the next version's bytes
    /// (here, this version's body under the next version byte) are a
    /// newer build's record, never mistaken for corruption; a version no
    /// build wrote still is.
    #[test]
    fn a_newer_format_version_is_told_from_corruption() {
        let mut next = FIXTURE.to_vec();
        next[0] = RECORD_FORMAT_VERSION + 1;
        let newer = decode_record(&next).unwrap_err();
        assert_eq!(newer, CodecError::NewerVersion(RECORD_FORMAT_VERSION + 1));
        assert!(newer.is_newer_format());
        let mut response = RESPONSE_FIXTURE.to_vec();
        response[0] = RESPONSE_FORMAT_VERSION + 1;
        assert!(decode_response(&response).unwrap_err().is_newer_format());
        let mut far_ahead = FIXTURE.to_vec();
        far_ahead[0] = RECORD_FORMAT_VERSION + FORMAT_VERSIONS_AHEAD_MAX + 1;
        for corrupt in [vec![0, 0], vec![], FIXTURE[..FIXTURE.len() - 1].to_vec(), far_ahead] {
            let error = decode_record(&corrupt).unwrap_err();
            assert!(!error.is_newer_format(), "{corrupt:?}: {error}");
        }
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_give_an_error_or_a_valid_record_never_a_panic(
            bytes in proptest::collection::vec(any::<u8>(), 0..512)
        ) {
            let _ = decode_record(&bytes);
        }

        #[test]
        fn responses_round_trip_byte_for_byte(
            status in 100u16..=599,
            body in proptest::collection::vec(any::<u8>(), 0..256),
            location in "[ -~]{0,64}",
        ) {
            let response = SavedResponse::new(status, vec![("location".into(), location)], body).unwrap();
            prop_assert_eq!(decode_response(&encode_response(&response)), Ok(response));
        }

        #[test]
        fn mutated_response_fixtures_never_panic(position in 0usize..RESPONSE_FIXTURE.len(), byte in any::<u8>()) {
            let mut bytes = RESPONSE_FIXTURE.to_vec();
            bytes[position] = byte;
            let _ = decode_response(&bytes);
        }

        #[test]
        fn mutated_fixtures_never_panic(position in 0usize..FIXTURE.len(), byte in any::<u8>()) {
            let mut bytes = FIXTURE.to_vec();
            bytes[position] = byte;
            let _ = decode_record(&bytes);
        }
    }
}
