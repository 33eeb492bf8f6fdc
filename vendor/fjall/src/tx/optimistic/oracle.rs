// Copyright (c) 2024-present, fjall-rs
// This source code is licensed under both the Apache 2.0 and MIT License
// (found in the LICENSE-* files in the repository)

use super::conflict_manager::ConflictManager;
use crate::snapshot_tracker::SnapshotTracker;
use crate::SeqNo;
use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

pub enum CommitOutcome<E> {
    Ok,
    Aborted(E),
    Conflicted,
}

pub struct Oracle {
    pub(super) write_serialize_lock: Mutex<BTreeMap<SeqNo, ConflictManager>>,
    pub(super) snapshot_tracker: SnapshotTracker,
}

impl Oracle {
    pub(super) fn with_commit<E, F: FnOnce() -> Result<(), E>>(
        &self,
        instant: SeqNo,
        conflict_checker: ConflictManager,
        f: F,
    ) -> crate::Result<CommitOutcome<E>> {
        let mut committed_txns = self
            .write_serialize_lock
            .lock()
            .map_err(|_| crate::Error::Poisoned)?;

        // If the committed_txn.ts is less than `SeqNo` that implies that the
        // committed_txn finished before the current transaction started.
        // We don't need to check for conflict in that case.
        // This change assumes linearizability. Lack of linearizability could
        // cause the read ts of a new txn to be lower than the commit ts of
        // a txn before it.
        let conflicted =
            committed_txns
                .range((instant + 1)..)
                .any(|(_ts, other_conflict_checker)| {
                    conflict_checker.has_conflict(other_conflict_checker)
                });

        // TODO: This can be expensive and should probably be done in a background worker, or a after a memtable rotation
        let safe_to_gc = self.snapshot_tracker.get_seqno_safe_to_gc();
        // idem's patch (vendor/README.md): the keys are commit sequence
        // numbers, so what is at or below the watermark is one prefix of the
        // map, cut off without visiting the entries kept. `retain` visited
        // every entry on every commit, under the lock `write_tx` takes too,
        // and the map holds up to 10,000 of them between two watermark moves.
        match safe_to_gc.checked_add(1) {
            Some(first_kept) => {
                let kept = committed_txns.split_off(&first_kept);
                drop_passed_conflict_sets(std::mem::replace(&mut *committed_txns, kept));
            }
            None => drop_passed_conflict_sets(std::mem::take(&mut *committed_txns)),
        }

        if conflicted {
            return Ok(CommitOutcome::Conflicted);
        }

        if let Err(e) = f() {
            return Ok(CommitOutcome::Aborted(e));
        }

        committed_txns.insert(self.snapshot_tracker.get(), conflict_checker);

        Ok(CommitOutcome::Ok)
    }

    pub(super) fn write_serialize_lock(
        &self,
    ) -> crate::Result<MutexGuard<'_, BTreeMap<u64, ConflictManager>>> {
        self.write_serialize_lock
            .lock()
            .map_err(|_| crate::Error::Poisoned)
    }
}

/// idem's patch (vendor/README.md): the most conflict sets a commit drops on
/// its own thread. The watermark moves once every 10,000 closed snapshots
/// (`snapshot_tracker.rs`), so one commit can pass thousands of conflict sets
/// at once; dropping about 6,600 of them took 10 ms, while the commit held the
/// lock every `write_tx` takes and the commits queued behind it waited.
const CONFLICT_SETS_DROPPED_IN_PLACE_MAX: usize = 256;

/// Drops the conflict sets the watermark has passed: in place when they are
/// few, otherwise on a short-lived thread of their own, so that the commit
/// which cut them off goes on at once.
fn drop_passed_conflict_sets(passed: BTreeMap<SeqNo, ConflictManager>) {
    if passed.len() <= CONFLICT_SETS_DROPPED_IN_PLACE_MAX {
        drop(passed);
        return;
    }
    // When the thread cannot be started, `spawn` drops the closure, and the
    // conflict sets with it, here: in place, as before the patch.
    let dropper = std::thread::Builder::new()
        .name("fjall:conflict-sets-dropped".into())
        .stack_size(256 * 1024)
        .spawn(move || drop(passed));
    #[cfg(test)]
    if dropper.is_ok() {
        tests::DROPS_OFF_THE_COMMIT_THREAD.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    drop(dropper);
}

#[cfg(test)]
mod tests {
    use crate::{KeyspaceCreateOptions, OptimisticTxDatabase, OptimisticTxKeyspace, Readable};

    /// idem's patch (vendor/README.md): how many times a commit handed the
    /// conflict sets it passed to another thread.
    pub(super) static DROPS_OFF_THE_COMMIT_THREAD: std::sync::atomic::AtomicUsize =
        std::sync::atomic::AtomicUsize::new(0);

    #[expect(clippy::significant_drop_tightening)]
    fn run_tx(
        db: &OptimisticTxDatabase,
        tree: &OptimisticTxKeyspace,
    ) -> Result<(), Box<dyn std::error::Error>> {
        let mut tx1 = db.write_tx()?;
        let mut tx2 = db.write_tx()?;
        tx1.insert(tree.inner(), "hello", "world");

        tx1.commit()??;
        assert!(tree.contains_key("hello")?);

        _ = tx2.get(tree.inner(), "hello")?;

        tx2.insert(tree.inner(), "hello", "world2");
        assert!(tx2.commit()?.is_err()); // intended to conflict

        Ok(())
    }

    #[expect(clippy::unwrap_used)]
    #[test]
    fn oracle_committed_txns_does_not_leak() -> crate::Result<()> {
        let tmpdir = tempfile::tempdir()?;
        let db = OptimisticTxDatabase::builder(tmpdir.path()).open()?;

        let part = db.keyspace("foo", KeyspaceCreateOptions::default)?;

        for _ in 0..10_000 {
            run_tx(&db, &part).unwrap();
        }

        assert!(dbg!(db.oracle.write_serialize_lock.lock().unwrap().len()) < 10_000);

        for _ in 0..10_000 {
            run_tx(&db, &part).unwrap();
        }

        assert!(dbg!(db.oracle.write_serialize_lock.lock().unwrap().len()) < 10_000);

        Ok(())
    }

    #[test]
    fn committing_transaction_closes_only_its_snapshot() -> Result<(), Box<dyn std::error::Error>> {
        let tmpdir = tempfile::tempdir()?;
        let db = OptimisticTxDatabase::builder(tmpdir.path()).open()?;
        let tree = db.keyspace("foo", KeyspaceCreateOptions::default)?;

        let mut tx1 = db.write_tx()?;
        let tx2 = db.write_tx()?;
        assert_eq!(2, db.inner().supervisor.snapshot_tracker.open_snapshots());

        tx1.insert(tree.inner(), "hello", "world");
        tx1.commit()??;
        assert_eq!(1, db.inner().supervisor.snapshot_tracker.open_snapshots());

        drop(tx2);
        assert_eq!(0, db.inner().supervisor.snapshot_tracker.open_snapshots());

        Ok(())
    }

    // idem's patch (vendor/README.md).
    #[expect(clippy::unwrap_used)]
    #[test]
    fn many_passed_conflict_sets_are_dropped_off_the_commit_thread() -> crate::Result<()> {
        let tmpdir = tempfile::tempdir()?;
        let db = OptimisticTxDatabase::builder(tmpdir.path()).open()?;
        let part = db.keyspace("foo", KeyspaceCreateOptions::default)?;
        let before = DROPS_OFF_THE_COMMIT_THREAD.load(std::sync::atomic::Ordering::Relaxed);

        // Two watermark moves (one per 10,000 closed snapshots), each passing
        // thousands of conflict sets at once.
        for _ in 0..20_000 {
            run_tx(&db, &part).unwrap();
        }

        let after = DROPS_OFF_THE_COMMIT_THREAD.load(std::sync::atomic::Ordering::Relaxed);
        assert!(after > before, "no commit handed its passed conflict sets to another thread");
        assert!(db.oracle.write_serialize_lock.lock().unwrap().len() < 10_000);
        Ok(())
    }
}
