//! `server forget-unreadable-record`: the operator's way out for a key
//! whose stored record cannot be decoded.
//!
//! Such a key answers 500 `record_unreadable` to every request, and its
//! record, having no readable expiry, is never purged (the FDB-style
//! store's sweeper quarantines it: RELIABILITY.md section 10). The command
//! opens the record store the config names, asks it once to delete that
//! one record, and says what the store found. The store deletes a record
//! only if it is unreadable, in the same transaction as the check
//! ([`store_core::IdempotencyStore::forget_unreadable_record`]): a readable record is
//! refused, because deleting it would let a retry run its effect again.
//!
//! The record is named by its caller and the SHA-256 of its key, as the
//! log lines print them (`caller`, `key_sha256`), or by the raw key, which
//! is hashed here exactly as the stores hash it ([`IdempotencyKey::digest`]).

use crate::backend::{self, BackendError};
use crate::config::Config;
use store_core::{
    CallerId, ForgetOutcome, IDEMPOTENCY_KEY_BYTES_MAX, IdempotencyKey, InvalidInput, KeyDigest, StoreError,
};
use store_fdb::EmbeddedEngine;
use store_registry::StoreKind;

/// Hex digits of a key's SHA-256 (`key_sha256` in the logs).
pub const KEY_SHA256_HEX_CHARS: usize = 64;

/// Why the record named on the command line was refused before any store
/// was opened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordNameError {
    #[error("--caller: {0}")]
    Caller(InvalidInput),
    #[error(
        "--key-sha256 must be the {KEY_SHA256_HEX_CHARS} hexadecimal digits of the key_sha256 a log line shows; \
         this one has {length} characters"
    )]
    DigestLength { length: usize },
    #[error("--key-sha256 must be hexadecimal digits (0-9, a-f); {found:?} at position {position} is not one")]
    DigestDigit { found: char, position: usize },
    #[error("--key: {0} (an Idempotency-Key is 1 to {IDEMPOTENCY_KEY_BYTES_MAX} bytes of printable ASCII)")]
    Key(InvalidInput),
    #[error("name the key with --key-sha256 HEX or --key KEY")]
    KeyMissing,
}

/// How the operator names the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyNamed<'a> {
    /// The key's SHA-256 in hex, from a log line.
    Sha256(&'a str),
    /// The key itself, as the client sent it in `Idempotency-Key`.
    Raw(&'a str),
}

/// The record to forget: a caller and the SHA-256 of a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordName {
    pub caller: CallerId,
    pub key_sha256: KeyDigest,
}

impl RecordName {
    /// Checks the caller id and the key as the server checks them.
    pub fn parse(caller: &str, key: KeyNamed<'_>) -> Result<Self, RecordNameError> {
        let caller = CallerId::new(caller).map_err(RecordNameError::Caller)?;
        let key_sha256 = match key {
            KeyNamed::Sha256(hex_digits) => parse_key_sha256(hex_digits)?,
            KeyNamed::Raw(key) => IdempotencyKey::new(key).map_err(RecordNameError::Key)?.digest(),
        };
        Ok(Self { caller, key_sha256 })
    }
}

/// The digest from its 64 hex digits, in either case (logs print lowercase).
pub fn parse_key_sha256(hex_digits: &str) -> Result<KeyDigest, RecordNameError> {
    if let Some((position, found)) = hex_digits.chars().enumerate().find(|(_, c)| !c.is_ascii_hexdigit()) {
        return Err(RecordNameError::DigestDigit { found, position });
    }
    let length = hex_digits.len();
    let mut digest = [0; 32];
    if length != KEY_SHA256_HEX_CHARS || hex::decode_to_slice(hex_digits, &mut digest).is_err() {
        return Err(RecordNameError::DigestLength { length });
    }
    Ok(KeyDigest(digest))
}

/// Why the command could not ask the store, or the store failed.
#[derive(Debug, thiserror::Error)]
pub enum ForgetError {
    /// The embedded store's directory is held by another process.
    #[error(
        "{source}. The embedded store serves one process: stop the server that runs on it, run this command, \
         then start the server again. Nothing was changed"
    )]
    EmbeddedStoreInUse {
        #[source]
        source: BackendError,
    },
    /// Opening would create an empty store: a wrong path or working
    /// directory, most likely.
    #[error(
        "there is no embedded store at {path} (store.embedded.path; a relative path is taken from the working \
         directory). Nothing was changed: check --config and the directory the server runs in"
    )]
    NoEmbeddedStore { path: String },
    #[error("cannot open the record store: {0}. Nothing was changed")]
    Open(BackendError),
    #[error("the store failed: {0}")]
    Store(#[from] StoreError),
}

impl From<BackendError> for ForgetError {
    fn from(error: BackendError) -> Self {
        match &error {
            BackendError::Store { source, .. } if EmbeddedEngine::is_directory_locked(source) => {
                ForgetError::EmbeddedStoreInUse { source: error }
            }
            _ => ForgetError::Open(error),
        }
    }
}

/// Opens the record store of `config` and forgets `record` if it is
/// unreadable: one call, no retry beyond the store's own.
pub async fn forget_unreadable_record(config: &Config, record: &RecordName) -> Result<ForgetOutcome, ForgetError> {
    let embedded_path = &config.store.embedded.path;
    if config.store.kind == StoreKind::Embedded && !embedded_path.exists() {
        let path = std::path::absolute(embedded_path).unwrap_or_else(|_| embedded_path.clone());
        return Err(ForgetError::NoEmbeddedStore {
            path: path.display().to_string(),
        });
    }
    let store = backend::open_records(&config.store, config.policy).await?;
    Ok(store
        .forget_unreadable_record(&record.caller, record.key_sha256)
        .await?)
}

/// What to tell the operator about `outcome`, in full sentences; the first
/// word is the outcome's [`ForgetOutcome::kind`], for scripts.
pub fn report(outcome: ForgetOutcome, record: &RecordName, store_kind: &str) -> String {
    let named = format!(
        "caller {}, key_sha256 {}, {store_kind} store",
        record.caller, record.key_sha256
    );
    match outcome {
        ForgetOutcome::Deleted => format!(
            "deleted: the unreadable record ({named}) is gone, and its key may be claimed again. The next \
             request with it runs as a first one: if the lost record was completed, its work may run again \
             (per-parcel label uniqueness and the carrier key are what stop a second purchase)."
        ),
        ForgetOutcome::NotFound => format!(
            "not_found: there is no record ({named}): never written, purged, or deleted already. Nothing was \
             changed."
        ),
        ForgetOutcome::Readable => format!(
            "readable: refusing to delete the record ({named}): it decodes, so its key does not answer \
             record_unreadable, and deleting it would let a retry run its work a second time. Nothing was \
             changed. Check the caller, the key and that --config names the store the server uses."
        ),
        ForgetOutcome::NewerFormat => format!(
            "newer_format: refusing to delete the record ({named}): it is in a format newer than this \
             build reads, written by a newer build (a rolling upgrade), which reads it. Nothing was \
             changed. Finish the upgrade; the newer build serves this key."
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIGEST_OF_K: &str = "8254c329a92850f6d539dd376f4816ee2764517da5e0235514af433164480d7a";

    #[test]
    fn a_raw_key_is_hashed_as_the_stores_hash_it() {
        let by_key = RecordName::parse("alice", KeyNamed::Raw("k")).unwrap();
        let by_digest = RecordName::parse("alice", KeyNamed::Sha256(DIGEST_OF_K)).unwrap();
        assert_eq!(by_key, by_digest);
        assert_eq!(by_key.key_sha256, IdempotencyKey::new("k").unwrap().digest());
        let upper = RecordName::parse("alice", KeyNamed::Sha256(&DIGEST_OF_K.to_uppercase())).unwrap();
        assert_eq!(upper, by_digest);
    }

    #[test]
    fn malformed_names_are_refused_with_typed_errors() {
        let refused = |caller: &str, key: KeyNamed<'_>| RecordName::parse(caller, key).unwrap_err();
        assert_eq!(
            refused("alice", KeyNamed::Sha256(&DIGEST_OF_K[1..])),
            RecordNameError::DigestLength { length: 63 }
        );
        assert_eq!(
            refused("alice", KeyNamed::Sha256(&format!("{DIGEST_OF_K}00"))),
            RecordNameError::DigestLength { length: 66 }
        );
        assert_eq!(
            refused("alice", KeyNamed::Sha256(&format!("{}g", &DIGEST_OF_K[1..]))),
            RecordNameError::DigestDigit {
                found: 'g',
                position: 63
            }
        );
        assert_eq!(
            refused("alice", KeyNamed::Sha256("é")),
            RecordNameError::DigestDigit {
                found: 'é',
                position: 0
            }
        );
        let long_key = "k".repeat(IDEMPOTENCY_KEY_BYTES_MAX + 1);
        assert_eq!(
            refused("alice", KeyNamed::Raw(&long_key)),
            RecordNameError::Key(InvalidInput::KeyTooLong { length: 256 })
        );
        assert_eq!(
            refused("alice", KeyNamed::Raw("")),
            RecordNameError::Key(InvalidInput::KeyEmpty)
        );
        assert_eq!(
            refused("a:b", KeyNamed::Raw("k")),
            RecordNameError::Caller(InvalidInput::CallerId)
        );
    }

    #[test]
    fn each_report_starts_with_its_outcome() {
        let record = RecordName::parse("alice", KeyNamed::Raw("k")).unwrap();
        for outcome in [
            ForgetOutcome::Deleted,
            ForgetOutcome::NotFound,
            ForgetOutcome::Readable,
            ForgetOutcome::NewerFormat,
        ] {
            let text = report(outcome, &record, "embedded");
            assert!(text.starts_with(&format!("{}:", outcome.kind())), "{text}");
            assert!(text.contains(DIGEST_OF_K) && text.contains("alice"), "{text}");
        }
    }
}
