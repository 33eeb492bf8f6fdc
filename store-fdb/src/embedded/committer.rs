//! Group commit on one thread of its own: every waiting commit goes into
//! the journal, then one sync covers them all before any is acknowledged.

use super::config::Durability;
use fjall::OptimisticTxDatabase;
use fjall::OptimisticWriteTx as WriteTransaction;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use tokio::sync::oneshot;

/// What the committer thread answers: `Ok(true)` committed (and durable,
/// when the durability asks for it), `Ok(false)` a conflict (nothing was
/// written), `Err` an I/O failure during the commit or the sync (unknown).
type CommitAnswer = Result<bool, String>;

/// One request to the committer thread.
struct CommitRequest {
    /// `None` for a read-only transaction: nothing to commit, but what it
    /// read must be durable before it is acknowledged.
    transaction: Option<WriteTransaction>,
    answer: oneshot::Sender<CommitAnswer>,
}

/// Group commit on one thread of its own. Every commit is handed to it; it
/// takes all the requests that are waiting, commits them one after another
/// into the journal's buffer in memory, then persists the batch once (one
/// write to the OS and, when the durability asks for it, one fdatasync), and
/// only then answers each. Commits that arrive meanwhile wait for the next
/// batch, so under load many commits share one write and one sync, and a
/// commit costs one hand-off instead of a blocking thread of its own.
///
/// A commit itself makes no system call: fjall holds its transaction lock
/// (the one every `write_tx` takes to begin) while it writes the journal,
/// and a write per commit under that lock made the async workers wait for
/// it (`bench/results/2026-12-02/whole-set-and-stalls/`). (fjall persists a
/// journal before rotating it, so a batch never misses a commit that landed
/// in the previous journal.)
pub(super) struct Committer {
    /// `None` once the engine is being dropped, which ends the thread.
    requests: Option<mpsc::Sender<CommitRequest>>,
    thread: Option<std::thread::JoinHandle<()>>,
    pub(super) watermarks: Arc<Watermarks>,
}

/// Counts of write commits, so a read-only transaction can tell whether
/// anything it may have read is not durable yet. Only the committer thread
/// moves them.
#[derive(Default)]
pub(super) struct Watermarks {
    /// Write commits started, counted before each becomes visible.
    pub(super) started: AtomicU64,
    /// Every write commit counted up to here is persisted as the
    /// durability asks (synced, or with the OS for `Buffer`).
    pub(super) durable: AtomicU64,
    /// Batches persisted, for tests.
    pub(super) syncs: AtomicU64,
    /// Set when a commit or a sync failed: fjall takes no more writes on
    /// this opening of the database.
    pub(super) failed: AtomicBool,
}

impl Committer {
    pub(super) fn start(database: OptimisticTxDatabase, durability: Durability) -> std::io::Result<Self> {
        let (requests, queue) = mpsc::channel();
        let watermarks = Arc::new(Watermarks::default());
        let mode = durability.persist_mode();
        let thread_watermarks = watermarks.clone();
        let thread = std::thread::Builder::new()
            .name("idem-embedded-commit".to_owned())
            .spawn(move || run_committer(&queue, &thread_watermarks, || database.persist(mode)))?;
        Ok(Self {
            requests: Some(requests),
            thread: Some(thread),
            watermarks,
        })
    }

    /// Hands a request to the thread and waits for its answer.
    pub(super) async fn submit(&self, transaction: Option<WriteTransaction>) -> CommitAnswer {
        let (answer, answered) = oneshot::channel();
        let request = CommitRequest { transaction, answer };
        let sent = match &self.requests {
            Some(requests) => requests.send(request).is_ok(),
            None => false,
        };
        if !sent {
            return Err("the committer thread has stopped".to_owned());
        }
        answered
            .await
            .unwrap_or_else(|_| Err("the committer thread dropped a commit".to_owned()))
    }

    /// True when every write commit that a read could have seen is
    /// persisted already: a read-only transaction then needs no hand-off.
    /// Called after the transaction's reads: a commit they saw was counted
    /// in `started` before it became visible.
    pub(super) fn reads_are_durable(&self) -> bool {
        let started = self.watermarks.started.load(Ordering::SeqCst);
        self.watermarks.durable.load(Ordering::SeqCst) >= started
    }
}

impl Drop for Committer {
    fn drop(&mut self) {
        // Closing the channel ends the thread once it has answered every
        // request; joining it releases its handle on the database, so the
        // directory can be opened again at once.
        self.requests = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A write transaction as the committer expects it: with no durability of
/// its own, so its commit writes only the journal's buffer in memory and the
/// batch's persist writes it out.
pub(super) fn begin_write(database: &OptimisticTxDatabase) -> fjall::Result<WriteTransaction> {
    Ok(database.write_tx()?.durability(None))
}

/// Most requests one batch takes: one sync covers at most this many
/// commits, so a burst cannot keep every commit of it waiting on a sync
/// behind an unbounded journal write. Commits left in the queue go into the
/// next batch at once.
pub(super) const COMMIT_BATCH_MAX: usize = 1_024;

/// The committer thread: batches until the channel closes. `persist` writes
/// the journal's buffer to the OS and syncs it as the durability asks.
fn run_committer(
    queue: &mpsc::Receiver<CommitRequest>,
    watermarks: &Watermarks,
    persist: impl Fn() -> Result<(), fjall::Error>,
) {
    while let Ok(first) = queue.recv() {
        let mut batch = vec![first];
        batch.extend(queue.try_iter().take(COMMIT_BATCH_MAX - 1));
        assert!(
            (1..=COMMIT_BATCH_MAX).contains(&batch.len()),
            "a batch holds 1 to {COMMIT_BATCH_MAX} requests"
        );
        let durable_before = watermarks.durable.load(Ordering::SeqCst);
        let mut answers: Vec<_> = batch
            .into_iter()
            .map(|request| {
                let answer = commit_one(request.transaction, watermarks);
                (request.answer, answer)
            })
            .collect();
        let started = watermarks.started.load(Ordering::SeqCst);
        // Only this thread moves the watermarks: what is durable never runs
        // ahead of what was started, nor goes back.
        assert!(
            durable_before <= started && durable_before == watermarks.durable.load(Ordering::SeqCst),
            "durable watermark {durable_before} against started {started}"
        );
        // Only commits since the last persist need one; a batch of read-only
        // requests whose reads are covered already goes without.
        let synced = if watermarks.durable.load(Ordering::SeqCst) < started {
            watermarks.syncs.fetch_add(1, Ordering::Relaxed);
            persist()
        } else {
            Ok(())
        };
        match synced {
            Ok(()) => watermarks.durable.store(started, Ordering::SeqCst),
            // A failed sync leaves every commit of the batch, and every read
            // waiting on it, unknown.
            Err(error) => {
                watermarks.failed.store(true, Ordering::SeqCst);
                for (_, answer) in &mut answers {
                    if !matches!(answer, Ok(false)) {
                        *answer = Err(format!("sync failed: {error}"));
                    }
                }
            }
        }
        for (sender, answer) in answers {
            // A caller that stopped waiting has nothing to be told.
            let _ = sender.send(answer);
        }
    }
}

/// Commits one transaction into the journal's buffer (transactions begin
/// with no durability of their own: the batch's persist writes them out),
/// counting it as started before it can become visible.
fn commit_one(transaction: Option<WriteTransaction>, watermarks: &Watermarks) -> CommitAnswer {
    let Some(transaction) = transaction else {
        return Ok(true);
    };
    watermarks.started.fetch_add(1, Ordering::SeqCst);
    match transaction.commit() {
        Ok(Ok(())) => Ok(true),
        Ok(Err(_conflict)) => Ok(false),
        Err(error) => {
            watermarks.failed.store(true, Ordering::SeqCst);
            Err(error.to_string())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::config::EmbeddedConfig;
    use super::super::tests::open_database;
    use super::super::{EmbeddedEngine, KEYSPACE_NAME};
    use super::*;
    use fjall::{KeyspaceCreateOptions, PersistMode};
    use std::sync::Mutex;

    /// In every value `queued_writes` writes, to find it in the journal.
    const MARKER: &str = "written-by-the-committer-test";

    /// A fresh fjall database with one written, uncommitted transaction per
    /// request, queued for the committer.
    fn queued_writes(
        count: usize,
    ) -> (
        OptimisticTxDatabase,
        mpsc::Receiver<CommitRequest>,
        Vec<oneshot::Receiver<CommitAnswer>>,
    ) {
        queued_writes_in(&EmbeddedConfig::temporary().path, count)
    }

    fn queued_writes_in(
        directory: &std::path::Path,
        count: usize,
    ) -> (
        OptimisticTxDatabase,
        mpsc::Receiver<CommitRequest>,
        Vec<oneshot::Receiver<CommitAnswer>>,
    ) {
        let database = OptimisticTxDatabase::builder(directory).temporary(true).open().unwrap();
        let keyspace = database
            .keyspace(KEYSPACE_NAME, KeyspaceCreateOptions::default)
            .unwrap();
        let (requests, queue) = mpsc::channel();
        let mut answers = Vec::new();
        for n in 0..count {
            let mut transaction = begin_write(&database).unwrap();
            transaction.insert(&keyspace, format!("key-{n}"), format!("value-{n}-{MARKER}"));
            let (answer, answered) = oneshot::channel();
            requests
                .send(CommitRequest {
                    transaction: Some(transaction),
                    answer,
                })
                .unwrap();
            answers.push(answered);
        }
        (database, queue, answers)
    }

    #[test]
    fn waiting_commits_share_one_sync_and_none_is_answered_before_it() {
        const COMMITS: usize = 20;
        let (database, queue, answers) = queued_writes(COMMITS);
        let answers = Mutex::new(answers);
        let watermarks = Watermarks::default();
        let sync = || {
            for answered in answers.lock().unwrap().iter_mut() {
                assert!(answered.try_recv().is_err(), "a commit was answered before its sync");
            }
            database.persist(PersistMode::SyncData)
        };
        // The channel closes when the queue is drained: the thread's loop ends.
        run_committer(&queue, &watermarks, sync);
        for mut answered in answers.into_inner().unwrap() {
            assert_eq!(answered.try_recv().unwrap(), Ok(true));
        }
        assert_eq!(watermarks.syncs.load(Ordering::SeqCst), 1);
        assert_eq!(watermarks.started.load(Ordering::SeqCst), COMMITS as u64);
        assert_eq!(watermarks.durable.load(Ordering::SeqCst), COMMITS as u64);
    }

    /// The journal files' bytes on disk, as another process would read them.
    fn journal_bytes(directory: &std::path::Path) -> Vec<u8> {
        let mut bytes = Vec::new();
        for entry in std::fs::read_dir(directory).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|extension| extension == "jnl") {
                bytes.extend(std::fs::read(path).unwrap());
            }
        }
        bytes
    }

    fn contains(haystack: &[u8], needle: &str) -> bool {
        haystack.windows(needle.len()).any(|window| window == needle.as_bytes())
    }

    #[test]
    fn commits_reach_the_journal_file_only_with_their_batchs_persist() {
        let directory = EmbeddedConfig::temporary().path;
        let (database, queue, _answers) = queued_writes_in(&directory, 3);
        let watermarks = Watermarks::default();
        for request in queue.try_iter() {
            assert_eq!(commit_one(request.transaction, &watermarks), Ok(true));
        }
        assert!(
            !contains(&journal_bytes(&directory), MARKER),
            "a commit wrote its journal entry out by itself: one system call per commit"
        );
        database.persist(fjall::PersistMode::Buffer).unwrap();
        assert!(
            contains(&journal_bytes(&directory), MARKER),
            "the batch's persist writes the commits out"
        );
    }

    #[test]
    fn a_burst_larger_than_a_batch_is_synced_in_two() {
        let (_database, queue, answers) = queued_writes(COMMIT_BATCH_MAX + 1);
        let watermarks = Watermarks::default();
        let syncs_seen = std::sync::atomic::AtomicUsize::new(0);
        let sync = || {
            syncs_seen.fetch_add(1, Ordering::SeqCst);
            Ok(())
        };
        run_committer(&queue, &watermarks, sync);
        for mut answered in answers {
            assert_eq!(answered.try_recv().unwrap(), Ok(true));
        }
        assert_eq!(
            syncs_seen.load(Ordering::SeqCst),
            2,
            "one sync per batch of at most {COMMIT_BATCH_MAX}"
        );
        assert_eq!(watermarks.durable.load(Ordering::SeqCst), COMMIT_BATCH_MAX as u64 + 1);
    }

    #[test]
    fn a_failed_sync_leaves_every_commit_of_its_batch_unknown_and_nothing_durable() {
        let (_database, queue, answers) = queued_writes(3);
        let watermarks = Watermarks::default();
        run_committer(&queue, &watermarks, || Err(fjall::Error::Poisoned));
        for mut answered in answers {
            assert!(answered.try_recv().unwrap().is_err());
        }
        assert_eq!(watermarks.durable.load(Ordering::SeqCst), 0);
        assert!(
            watermarks.failed.load(Ordering::SeqCst),
            "the opening is marked for reopening"
        );
    }

    #[tokio::test]
    async fn reads_wait_only_for_commits_not_yet_durable() {
        let engine = EmbeddedEngine::open(&EmbeddedConfig::temporary()).unwrap();
        let database = open_database(&engine);
        let committer = &database.committer;
        assert!(committer.reads_are_durable(), "nothing written yet");
        let watermarks = &committer.watermarks;
        // A commit counted as started but not yet synced: a read may have seen it.
        watermarks.started.fetch_add(1, Ordering::SeqCst);
        assert!(!committer.reads_are_durable());
        // The read's barrier makes the committer sync what was started.
        committer.submit(None).await.unwrap();
        assert!(committer.reads_are_durable());
        assert_eq!(watermarks.syncs.load(Ordering::SeqCst), 1);
        // A barrier with nothing new to cover runs no sync.
        committer.submit(None).await.unwrap();
        assert_eq!(watermarks.syncs.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn dropping_the_committer_ends_its_thread_and_releases_the_database() {
        let database = OptimisticTxDatabase::builder(EmbeddedConfig::temporary().path)
            .temporary(true)
            .open()
            .unwrap();
        let committer = Committer::start(database, Durability::SyncData).unwrap();
        let watermarks = committer.watermarks.clone();
        assert_eq!(
            Arc::strong_count(&watermarks),
            3,
            "the committer, its thread and this test"
        );
        drop(committer);
        assert_eq!(
            Arc::strong_count(&watermarks),
            1,
            "the thread still runs after the drop"
        );
    }
}
