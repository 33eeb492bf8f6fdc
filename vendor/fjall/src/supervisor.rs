// Copyright (c) 2024-present, fjall-rs
// This source code is licensed under both the Apache 2.0 and MIT License
// (found in the LICENSE-* files in the repository)

use lsm_tree::SequenceNumberCounter;

use crate::{
    db::Keyspaces,
    flush::manager::FlushManager,
    journal::{manager::JournalManager, Journal},
    snapshot_tracker::SnapshotTracker,
    write_buffer_manager::WriteBufferManager,
};
use std::sync::{Arc, Mutex, RwLock};

pub struct SupervisorInner {
    pub db_config: crate::Config,

    /// Dictionary of all keyspaces
    #[doc(hidden)]
    pub keyspaces: Arc<RwLock<Keyspaces>>,

    pub(crate) write_buffer_size: WriteBufferManager,
    pub(crate) flush_manager: FlushManager,

    pub seqno: SequenceNumberCounter,

    pub snapshot_tracker: SnapshotTracker,

    pub(crate) journal: Arc<Journal>,

    /// Tracks journal size and garbage collects sealed journals when possible
    pub(crate) journal_manager: Arc<RwLock<JournalManager>>,

    pub(crate) backpressure_lock: Mutex<()>,

    /// idem's patch (vendor/README.md): every memtable sealed by a
    /// rotation, kept here until nothing else holds it, so that freeing
    /// it happens in a background worker, outside every lock. Otherwise
    /// the last reference is often the one dropped by the version garbage
    /// collection (`SuperVersions::maintenance`), which runs while holding
    /// the tree's version lock that every write and read takes: freeing a
    /// memtable of 16 MiB, node by node, stalled every commit for tens of
    /// milliseconds at each rotation.
    pub(crate) retired_memtables: Mutex<Vec<Arc<lsm_tree::Memtable>>>,
}

#[derive(Clone)]
pub struct Supervisor(Arc<SupervisorInner>);

impl std::ops::Deref for Supervisor {
    type Target = SupervisorInner;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl Supervisor {
    pub fn new(inner: SupervisorInner) -> Self {
        Self(Arc::new(inner))
    }

    /// Keeps a sealed memtable until nothing else holds it
    /// ([`SupervisorInner::retired_memtables`]).
    pub(crate) fn retire_memtable(&self, memtable: Arc<lsm_tree::Memtable>) {
        #[expect(clippy::expect_used)]
        self.retired_memtables
            .lock()
            .expect("lock is poisoned")
            .push(memtable);
    }

    /// Frees the retired memtables nothing else holds any more, after
    /// releasing the list's lock: the caller is a background worker that
    /// holds no other lock.
    pub(crate) fn free_unreferenced_memtables(&self) {
        let unreferenced: Vec<Arc<lsm_tree::Memtable>> = {
            #[expect(clippy::expect_used)]
            let mut retired = self.retired_memtables.lock().expect("lock is poisoned");
            let (unreferenced, still_held) = std::mem::take(&mut *retired)
                .into_iter()
                .partition(|memtable| Arc::strong_count(memtable) == 1);
            *retired = still_held;
            unreferenced
        };
        drop(unreferenced);
    }

    pub fn build_seqno_map(
        &self,
        keyspaces: &Keyspaces,
    ) -> Vec<crate::journal::manager::EvictionWatermark> {
        use crate::AbstractTree;

        let mut seqnos = Vec::with_capacity(keyspaces.len());

        for keyspace in keyspaces.values() {
            if let Some(lsn) = keyspace.tree.get_highest_memtable_seqno() {
                seqnos.push(crate::journal::manager::EvictionWatermark {
                    lsn,
                    keyspace: keyspace.clone(),
                });
            }
        }

        seqnos
    }
}
