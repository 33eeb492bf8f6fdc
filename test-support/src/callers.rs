//! The Label service's test callers and requests: two callers with their
//! bearer tokens (never the public demo caller), and label bodies for
//! fresh orders.

use sha2::{Digest, Sha256};

pub const ALICE: &str = "alice-token";
pub const BOB: &str = "bob-token";
/// The caller ids behind the tokens.
pub const ALICE_ID: &str = "alice";
pub const BOB_ID: &str = "bob";
/// Largest order id handed out: well inside the API's 2^53 - 1.
pub const TEST_ORDER_ID_MAX: u64 = 999_999_999_999;

/// Hex SHA-256 of a bearer token, as the server's config stores it.
pub fn token_sha256(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// `IDEM__CALLERS` for alice and bob.
pub fn callers_env() -> String {
    format!(
        r#"[{{id = "{ALICE_ID}", token_sha256 = "{}"}}, {{id = "{BOB_ID}", token_sha256 = "{}"}}]"#,
        token_sha256(ALICE),
        token_sha256(BOB)
    )
}

/// A label request body.
pub fn label_body(order_id: u64, parcel_no: u32) -> String {
    format!(r#"{{"order_id":{order_id},"parcel_no":{parcel_no},"weight_g":1450,"service":"ground"}}"#)
}

/// A fresh order id, so tests never share a parcel.
pub fn unique_order_id() -> u64 {
    1 + rand::random::<u64>() % TEST_ORDER_ID_MAX
}

/// A fresh idempotency key.
pub fn fresh_key() -> String {
    format!("label:{:016x}", rand::random::<u64>())
}
