//! Properties of the three parsers that read outside input.
//!
//! - The `Idempotency-Key` header parser (`server::key_header::parse_key`):
//!   any bytes give a key or an error, never a panic; a key is always 1 to
//!   255 printable ASCII characters; every valid key reads back from its
//!   bare and its quoted (escaped) form.
//! - The body canonicaliser behind the fingerprint: store-core checks flat
//!   objects of integers; here generated nested JSON (objects, arrays,
//!   strings with escapes, numbers, literals) is written with shuffled keys,
//!   random whitespace and `\u` escapes, and must keep its fingerprint, while
//!   two different values, or one value on two paths, never share one.
//! - The record decoder: store-core checks arbitrary bytes and mutated
//!   fixtures; here generated records round-trip, and every strict prefix of
//!   an encoding is an error, never a panic or another record.

use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde_json::Value;
use server::key_header::{KeyHeaderError, parse_key};
use store_core::{Fingerprint, Lease, LeaseToken, Record, RecordState, SavedResponse, decode_record, encode_record};

const PATH: &str = "/v1/labels";

fn printable_key() -> impl Strategy<Value = String> {
    proptest::collection::vec(0x20u8..=0x7e, 1..=255).prop_map(|bytes| String::from_utf8(bytes).expect("ASCII"))
}

/// The key as an RFC 8941 sf-string.
fn quoted(key: &str) -> String {
    let mut text = String::from("\"");
    for character in key.chars() {
        if matches!(character, '"' | '\\') {
            text.push('\\');
        }
        text.push(character);
    }
    text.push('"');
    text
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn any_header_bytes_give_a_valid_key_or_an_error(raw in proptest::collection::vec(any::<u8>(), 0..600)) {
        match parse_key(&raw) {
            Ok(key) => {
                let key = key.as_str();
                prop_assert!((1..=255).contains(&key.len()));
                prop_assert!(key.bytes().all(|byte| (0x20..=0x7e).contains(&byte)));
            }
            Err(KeyHeaderError::Invalid(reason)) => prop_assert!(!reason.is_empty()),
            Err(KeyHeaderError::Missing) => prop_assert!(false, "a present header is never 'missing'"),
        }
    }

    #[test]
    fn every_valid_key_reads_back_from_its_quoted_form(key in printable_key()) {
        let parsed = parse_key(quoted(&key).as_bytes()).expect("a quoted valid key parses");
        prop_assert_eq!(parsed.as_str(), key.as_str());
    }

    #[test]
    fn every_valid_key_reads_back_from_its_bare_form(key in printable_key()) {
        // A bare value is trimmed, and one that starts with a quote is read as quoted.
        prop_assume!(key.trim() == key && !key.starts_with('"'));
        let parsed = parse_key(key.as_bytes()).expect("a bare valid key parses");
        prop_assert_eq!(parsed.as_str(), key.as_str());
    }

    #[test]
    fn keys_over_255_characters_are_refused_bare_or_quoted(key in "[a-z]{256,400}") {
        prop_assert!(parse_key(key.as_bytes()).is_err());
        prop_assert!(parse_key(quoted(&key).as_bytes()).is_err());
    }
}

/// Generated JSON: literals, integers (as their digits), strings of any
/// characters, arrays and objects, nested a few levels.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|number| serde_json::from_str(&number.to_string()).expect("an integer")),
        "\\PC{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            proptest::collection::btree_map("\\PC{0,8}", inner, 0..6)
                .prop_map(|map| Value::Object(map.into_iter().collect())),
        ]
    })
}

/// Writes `value` as JSON the way a careless client might: keys in a random
/// order, whitespace anywhere it is allowed, characters escaped at random.
fn render(value: &Value, rng: &mut StdRng, out: &mut String) {
    space(rng, out);
    match value {
        Value::Array(items) => {
            out.push('[');
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                render(item, rng, out);
            }
            space(rng, out);
            out.push(']');
        }
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.shuffle(rng);
            out.push('{');
            for (index, (key, item)) in entries.into_iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                space(rng, out);
                render_string(key, rng, out);
                space(rng, out);
                out.push(':');
                render(item, rng, out);
            }
            space(rng, out);
            out.push('}');
        }
        Value::String(text) => render_string(text, rng, out),
        literal => out.push_str(&literal.to_string()),
    }
    space(rng, out);
}

fn space(rng: &mut StdRng, out: &mut String) {
    for _ in 0..rng.random_range(0..3) {
        out.push([' ', '\n', '\t', '\r'][rng.random_range(0..4)]);
    }
}

fn render_string(text: &str, rng: &mut StdRng, out: &mut String) {
    out.push('"');
    for character in text.chars() {
        let must_escape = matches!(character, '"' | '\\') || (character as u32) < 0x20;
        if must_escape || rng.random_bool(0.2) {
            let mut units = [0u16; 2];
            for unit in character.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{unit:04x}"));
            }
        } else {
            out.push(character);
        }
    }
    out.push('"');
}

fn fingerprint(body: &str) -> Fingerprint {
    Fingerprint::of_request("POST", PATH, body.as_bytes())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn semantically_equal_json_has_one_fingerprint(value in json_value(), seed_a in any::<u64>(), seed_b in any::<u64>()) {
        let (mut a, mut b) = (String::new(), String::new());
        render(&value, &mut StdRng::seed_from_u64(seed_a), &mut a);
        render(&value, &mut StdRng::seed_from_u64(seed_b), &mut b);
        prop_assert_eq!(serde_json::from_str::<Value>(&a).expect("valid JSON"), value.clone());
        prop_assert_eq!(fingerprint(&a), fingerprint(&b), "{} vs {}", a, b);
        prop_assert_eq!(fingerprint(&a), fingerprint(&value.to_string()));
    }

    #[test]
    fn different_json_has_different_fingerprints(a in json_value(), b in json_value(), seed in any::<u64>()) {
        prop_assume!(a != b);
        let mut written = String::new();
        render(&a, &mut StdRng::seed_from_u64(seed), &mut written);
        prop_assert_ne!(fingerprint(&written), fingerprint(&b.to_string()));
    }

    #[test]
    fn the_same_body_on_another_path_or_method_has_another_fingerprint(value in json_value()) {
        let body = value.to_string();
        let here = fingerprint(&body);
        prop_assert_ne!(here, Fingerprint::of_request("POST", "/v1/orders", body.as_bytes()));
        prop_assert_ne!(here, Fingerprint::of_request("PUT", PATH, body.as_bytes()));
    }
}

fn saved_response() -> impl Strategy<Value = SavedResponse> {
    (
        100u16..600,
        proptest::collection::vec(("[a-z-]{1,12}", "[ -~]{0,24}"), 0..4),
        proptest::collection::vec(any::<u8>(), 0..2_048),
    )
        .prop_filter_map("a response the store accepts", |(status, headers, body)| {
            SavedResponse::new(status, headers, body).ok()
        })
}

fn record() -> impl Strategy<Value = Record> {
    let started = (any::<u128>(), any::<u64>()).prop_map(|(token, locked_until_ms)| RecordState::Started {
        lease: Lease {
            token: LeaseToken(token),
            locked_until_ms,
        },
        recovery_point: None,
    });
    let completed = (saved_response(), any::<u128>()).prop_map(|(response, token)| RecordState::Completed {
        response,
        completed_by: LeaseToken(token),
    });
    (
        proptest::collection::vec(any::<u8>(), 0..64),
        prop_oneof![started, completed],
        any::<u64>(),
        any::<u64>(),
    )
        .prop_map(|(body, state, created_at_ms, expires_at_ms)| Record {
            fingerprint: Fingerprint::of_request("POST", PATH, &body),
            state,
            created_at_ms,
            expires_at_ms,
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn generated_records_round_trip_and_their_prefixes_are_errors(record in record()) {
        let bytes = encode_record(&record);
        prop_assert_eq!(decode_record(&bytes).expect("round trip"), record);
        for end in 0..bytes.len() {
            prop_assert!(decode_record(&bytes[..end]).is_err(), "a {}-byte prefix decoded", end);
        }
    }
}
