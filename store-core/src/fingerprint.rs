//! The request fingerprint: SHA-256 over method, path and canonical body.
//!
//! Two requests that mean the same thing must get the same fingerprint, or a
//! harmless retry would be refused as a reused key; two that differ must not,
//! or a client bug would be answered with someone else's response. A JSON body
//! is therefore canonicalised (object keys sorted, insignificant whitespace
//! removed, numbers kept exactly as written); any other body is hashed as raw
//! bytes. A domain tag keeps the two kinds from ever colliding.

use crate::types::Fingerprint;
use serde_json::Value;
use sha2::{Digest, Sha256};

impl Fingerprint {
    /// Fingerprint of one request. `path` should be the route's path without
    /// the query string, as the HTTP layer sees it.
    pub fn of_request(method: &str, path: &str, body: &[u8]) -> Self {
        let mut hasher = Sha256::new();
        hash_field(&mut hasher, method.as_bytes());
        hash_field(&mut hasher, path.as_bytes());
        match canonical_json(body) {
            Some(canonical) => {
                hasher.update(b"json");
                hash_field(&mut hasher, canonical.as_bytes());
            }
            None => {
                hasher.update(b"raw\0");
                hash_field(&mut hasher, body);
            }
        }
        Fingerprint(hasher.finalize().into())
    }
}

/// Length-prefixed, so that ("ab", "c") and ("a", "bc") hash differently.
fn hash_field(hasher: &mut Sha256, bytes: &[u8]) {
    hasher.update((bytes.len() as u64).to_be_bytes());
    hasher.update(bytes);
}

/// The canonical text of a JSON body, or `None` when the body is not JSON.
///
/// serde_json's map is ordered by key, and `to_string` writes no whitespace;
/// with the `arbitrary_precision` feature numbers keep their original digits.
/// Nesting deeper than serde_json's recursion limit (128) is not JSON here and
/// falls back to raw bytes, which is still a sound fingerprint.
pub fn canonical_json(body: &[u8]) -> Option<String> {
    let value: Value = serde_json::from_slice(body).ok()?;
    serde_json::to_string(&value).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn of(body: &str) -> Fingerprint {
        Fingerprint::of_request("POST", "/v1/labels", body.as_bytes())
    }

    #[test]
    fn key_order_and_whitespace_do_not_matter() {
        assert_eq!(of(r#"{"a":1,"b":[1,2]}"#), of("{ \"b\" : [1, 2],\n \"a\": 1 }"));
    }

    #[test]
    fn values_method_and_path_do_matter() {
        assert_ne!(of(r#"{"a":1}"#), of(r#"{"a":2}"#));
        assert_ne!(of(r#"{"a":1}"#), of(r#"{"a":"1"}"#));
        assert_ne!(of(r#"[1,2]"#), of(r#"[2,1]"#));
        let body = br#"{"a":1}"#;
        assert_ne!(
            Fingerprint::of_request("POST", "/v1/labels", body),
            Fingerprint::of_request("PUT", "/v1/labels", body)
        );
        assert_ne!(
            Fingerprint::of_request("POST", "/v1/labels", body),
            Fingerprint::of_request("POST", "/v1/label", body)
        );
    }

    #[test]
    fn large_numbers_are_not_rounded_together() {
        assert_ne!(
            of(r#"{"n":12345678901234567890123}"#),
            of(r#"{"n":12345678901234567890124}"#)
        );
        assert_ne!(of(r#"{"n":1.0}"#), of(r#"{"n":1}"#));
    }

    #[test]
    fn non_json_bodies_are_hashed_raw_and_never_equal_a_json_body() {
        assert_ne!(of("not json "), of("not json"));
        // The raw text `1` is JSON; the raw bytes "\"1\"" too. A body that is
        // not JSON can never share a fingerprint with one that is.
        assert_ne!(of("{"), of("{}"));
        assert_eq!(of(""), of(""));
    }

    proptest! {
        #[test]
        fn reformatting_and_reordering_json_keeps_the_fingerprint(
            entries in proptest::collection::btree_map("[a-z]{1,6}", any::<i64>(), 0..8),
            spaces in 0usize..3,
        ) {
            let pad = " ".repeat(spaces);
            let forward: Vec<String> = entries.iter().map(|(k, v)| format!("\"{k}\"{pad}:{pad}{v}")).collect();
            let backward: Vec<String> = forward.iter().rev().cloned().collect();
            let a = format!("{{{}}}", forward.join(","));
            let b = format!("{pad}{{{}}}\n", backward.join(&format!(",{pad}")));
            prop_assert_eq!(of(&a), of(&b));
        }

        #[test]
        fn different_json_values_give_different_fingerprints(a in any::<i64>(), b in any::<i64>()) {
            prop_assume!(a != b);
            prop_assert_ne!(of(&format!("{{\"w\":{a}}}")), of(&format!("{{\"w\":{b}}}")));
        }

        #[test]
        fn arbitrary_bytes_never_panic(body in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = Fingerprint::of_request("POST", "/", &body);
        }
    }
}
