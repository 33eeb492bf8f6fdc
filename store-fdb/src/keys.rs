//! Where everything lives, in FoundationDB's tuple encoding under one
//! configurable prefix (the same bytes on both engines):
//!
//! ```text
//! (prefix, "r", caller, key_digest, chunk)          record bytes, split in chunks of RECORD_CHUNK_BYTES_MAX
//! (prefix, "t", caller, key_digest)                 tombstone of a purged record -> its own expiry (u64 BE)
//! (prefix, "x", shard, expires_at_ms, kind, caller, key_digest)   expiry index, kind "r" or "t"
//! (prefix, "e", ...)                                effect rows, written by callers' effects
//! ```
//!
//! The expiry index is sharded by the first byte of the key digest, so that
//! new entries (whose times all sit near "now") spread over
//! `EXPIRY_SHARDS` ranges instead of piling onto one hot tail.

use foundationdb_tuple::{Bytes, Subspace};
use store_core::{CallerId, KeyDigest};

/// Largest chunk of a record value; FoundationDB allows 100,000 bytes and
/// the margin keeps room for future framing.
pub const RECORD_CHUNK_BYTES_MAX: usize = 90_000;
/// Most chunks one record may have: the largest response plus the largest
/// recovery point and the record's own fields fit in 13.
pub const RECORD_CHUNKS_MAX: usize = 16;
/// Shards of the expiry index.
pub const EXPIRY_SHARDS: u16 = 16;

pub const KIND_RECORD: &str = "r";
pub const KIND_TOMBSTONE: &str = "t";

#[derive(Debug, Clone)]
pub struct KeyLayout {
    records: Subspace,
    tombstones: Subspace,
    expiry: Subspace,
    effects: Subspace,
}

/// One (caller, key digest): the address of a record and its tombstone.
#[derive(Debug, Clone)]
pub struct Slot {
    pub caller: CallerId,
    pub digest: KeyDigest,
    pub record: Subspace,
    pub tombstone_key: Vec<u8>,
    pub shard: u16,
}

impl KeyLayout {
    pub fn new(prefix: &[u8]) -> Self {
        let root = Subspace::from_bytes(prefix);
        Self {
            records: root.subspace(&("r",)),
            tombstones: root.subspace(&("t",)),
            expiry: root.subspace(&("x",)),
            effects: root.subspace(&("e",)),
        }
    }

    /// Where every record's chunks live.
    pub fn records(&self) -> &Subspace {
        &self.records
    }

    pub fn slot(&self, caller: &CallerId, digest: KeyDigest) -> Slot {
        let id = (caller.as_str(), Bytes::from(&digest.0[..]));
        Slot {
            caller: caller.clone(),
            digest,
            record: self.records.subspace(&id),
            tombstone_key: self.tombstones.pack(&id),
            shard: u16::from(digest.0[0]) % EXPIRY_SHARDS,
        }
    }

    pub fn record_chunk_key(&self, slot: &Slot, index: usize) -> Vec<u8> {
        slot.record.pack(&(index as u64,))
    }

    pub fn expiry_key(&self, slot: &Slot, expires_at_ms: u64, kind: &str) -> Vec<u8> {
        self.expiry.pack(&(
            slot.shard,
            expires_at_ms,
            kind,
            slot.caller.as_str(),
            Bytes::from(&slot.digest.0[..]),
        ))
    }

    /// Keys of one shard expiring from `from_ms` up to `now_ms`, both
    /// included: `[begin, end)`. From 0, the range starts at the shard's
    /// first key, whatever it is, so a key that does not parse is found too.
    pub fn expiry_due_range(&self, shard: u16, from_ms: u64, now_ms: u64) -> (Vec<u8>, Vec<u8>) {
        let shard_space = self.expiry.subspace(&(shard,));
        let begin = if from_ms == 0 {
            shard_space.range().0
        } else {
            shard_space.pack(&(from_ms,))
        };
        (begin, shard_space.pack(&(now_ms + 1,)))
    }

    /// Decodes an expiry index key into (expires_at_ms, kind, slot).
    pub fn parse_expiry_key(&self, key: &[u8]) -> Option<(u64, String, Slot)> {
        let (_shard, expires_at_ms, kind, caller, digest): (u16, u64, String, String, Vec<u8>) =
            self.expiry.unpack(key).ok()?;
        let caller = CallerId::new(caller).ok()?;
        let digest = KeyDigest(digest.try_into().ok()?);
        Some((expires_at_ms, kind, self.slot(&caller, digest)))
    }

    /// Where effects keep their rows.
    pub fn effects(&self) -> &Subspace {
        &self.effects
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expiry_keys_round_trip_and_sort_by_time_within_a_shard() {
        let layout = KeyLayout::new(b"idem");
        let caller = CallerId::new("fulfilment").unwrap();
        let slot = layout.slot(&caller, KeyDigest([0x21; 32]));
        let early = layout.expiry_key(&slot, 1_000, KIND_RECORD);
        let late = layout.expiry_key(&slot, 2_000, KIND_RECORD);
        assert!(early < late);
        let (expires, kind, parsed) = layout.parse_expiry_key(&late).unwrap();
        assert_eq!(
            (expires, kind.as_str(), parsed.digest),
            (2_000, KIND_RECORD, slot.digest)
        );
        let (begin, end) = layout.expiry_due_range(slot.shard, 0, 1_500);
        assert!(begin <= early && early < end && late >= end);
        // Exactly from `from_ms`: an entry at it is in, one before it out.
        let (begin, end) = layout.expiry_due_range(slot.shard, 1_000, 2_000);
        assert!(begin <= early && late < end);
        let (begin, _) = layout.expiry_due_range(slot.shard, 1_001, 2_000);
        assert!(early < begin);
    }

    #[test]
    fn slots_of_two_callers_do_not_overlap() {
        let layout = KeyLayout::new(b"idem");
        let a = layout.slot(&CallerId::new("a").unwrap(), KeyDigest([1; 32]));
        let ab = layout.slot(&CallerId::new("ab").unwrap(), KeyDigest([1; 32]));
        assert!(!ab.record.is_start_of(a.record.bytes()) && !a.record.is_start_of(ab.record.bytes()));
    }
}
