//! Where a record lives: the key layout.
//!
//! ```text
//! {prefix}{<caller id>:<hex SHA-256 of the idempotency key>}:rec    hash: the record
//! {prefix}{<caller id>:<hex SHA-256 of the idempotency key>}:tomb   string: the tombstone
//! ```
//!
//! The raw idempotency key never appears: keys may carry personal data, and
//! Redis keys show up in logs, `MONITOR` output and RDB files.
//!
//! The braces are a Redis Cluster hash tag: both keys of one record hash to
//! the same slot, so one script may touch both. Two keys are needed because
//! Redis 7.0 can expire only whole keys (per-field TTLs arrived in 7.4): the
//! record, with its response of up to 1 MiB, must go at the end of retention,
//! while a marker must outlive it for the tombstone window (7 days by default).
//! Keeping the whole record for the window instead would multiply memory by
//! (retention + window) / retention, eight times with the defaults. Caller ids
//! are `[A-Za-z0-9._-]` and prefixes may not contain braces, so the tag is
//! always exactly `{caller:digest}`.

use store_core::{CallerId, IdempotencyKey, KeyDigest};

/// The two keys of one record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordKeys {
    /// The hash holding the record.
    pub record: String,
    /// The string whose presence says a record under this key existed.
    pub tombstone: String,
    /// The pub/sub channel the scripts announce the end of a started state
    /// on (`notify.rs`); it shares the record's hash tag, so on Cluster it
    /// is a sharded channel of the record's own slot.
    pub changes: String,
}

impl RecordKeys {
    pub fn new(prefix: &str, caller: &CallerId, key: &IdempotencyKey) -> Self {
        Self::of_digest(prefix, caller, key.digest())
    }

    /// The keys from the key's SHA-256 alone, which is all the names hold:
    /// how an operator with only a logged `key_sha256` finds the record.
    pub fn of_digest(prefix: &str, caller: &CallerId, digest: KeyDigest) -> Self {
        let tag = format!("{prefix}{{{caller}:{digest}}}");
        Self {
            record: format!("{tag}:rec"),
            tombstone: format!("{tag}:tomb"),
            changes: format!("{tag}{}", crate::notify::CHANGE_CHANNEL_SUFFIX),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_carry_the_caller_and_the_digest_never_the_raw_key() {
        let caller = CallerId::new("fulfilment").unwrap();
        let key = IdempotencyKey::new("customer-jane@example.com").unwrap();
        let keys = RecordKeys::new("idem:", &caller, &key);
        let digest = key.digest().to_string();
        assert_eq!(keys.record, format!("idem:{{fulfilment:{digest}}}:rec"));
        assert_eq!(keys.tombstone, format!("idem:{{fulfilment:{digest}}}:tomb"));
        assert!(!keys.record.contains("jane") && !keys.tombstone.contains("jane"));
    }

    #[test]
    fn both_keys_of_a_record_share_one_cluster_slot() {
        let caller = CallerId::new("a.b-c_9").unwrap();
        let keys = RecordKeys::new("idem:", &caller, &IdempotencyKey::new("k").unwrap());
        let slot = |key: &str| redis::cluster_routing::Slot::for_key(key);
        assert_eq!(slot(&keys.record), slot(&keys.tombstone));
        let other = RecordKeys::new("idem:", &caller, &IdempotencyKey::new("other").unwrap());
        assert_ne!(keys.record, other.record);
    }
}
