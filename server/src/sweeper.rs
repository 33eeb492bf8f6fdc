//! The sweeper: purges expired records (and tombstones) in bounded batches
//! at a fixed interval, so the store does not grow without end.
//!
//! Each batch runs on a thread of the runtime's blocking pool, not on the
//! workers that serve requests. The embedded store reads inside its
//! transactions synchronously, and the records a purge reads are a day old,
//! cold, out of the block cache: at the design's 34.56M records one batch
//! held a request worker for a large share of its time (35 % of the
//! service's CPU samples at 400/s, BENCHMARKS.md "A day of keys"). Off the
//! workers, the operating system shares the cores between the purge and the
//! requests, and no request waits for a worker a batch holds.

use crate::metrics::{
    RECORDS_PURGED_TOTAL, RECORDS_QUARANTINED_TOTAL, SWEEPER_RUN_DURATION_SECONDS, SWEEPER_RUNS_TOTAL,
    TOMBSTONES_PURGED_TOTAL,
};
use crate::setting::{ConfigError, check_range};
use serde::Deserialize;
use std::sync::Arc;
use std::time::{Duration, Instant};
use store_core::PURGE_BATCH_MAX;
use store_core::{IdempotencyStore, PurgeReport, StoreError};
use tokio_util::sync::CancellationToken;

/// Default sweeper interval.
pub const SWEEPER_INTERVAL_MS_DEFAULT: u64 = 60_000;

/// Shortest sweeper interval accepted.
pub const SWEEPER_INTERVAL_MS_MIN: u64 = 10;

/// Default records purged per batch.
pub const SWEEPER_BATCH_MAX_DEFAULT: usize = 1_000;

/// Default batches per sweeper run, so one run stays bounded.
pub const SWEEPER_BATCHES_PER_RUN_DEFAULT: usize = 100;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SweeperConfig {
    pub interval_ms: u64,
    pub batch_max: usize,
    pub batches_per_run_max: usize,
}

impl SweeperConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        let sweeper = self;
        check_range(
            "sweeper.interval_ms",
            sweeper.interval_ms,
            SWEEPER_INTERVAL_MS_MIN,
            u64::from(u32::MAX),
        )?;
        check_range("sweeper.batch_max", sweeper.batch_max as u64, 1, PURGE_BATCH_MAX as u64)?;
        check_range(
            "sweeper.batches_per_run_max",
            sweeper.batches_per_run_max as u64,
            1,
            1_000_000,
        )
    }
}

impl Default for SweeperConfig {
    fn default() -> Self {
        Self {
            interval_ms: SWEEPER_INTERVAL_MS_DEFAULT,
            batch_max: SWEEPER_BATCH_MAX_DEFAULT,
            batches_per_run_max: SWEEPER_BATCHES_PER_RUN_DEFAULT,
        }
    }
}

/// What one run did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SweepReport {
    pub records_purged: u64,
    pub tombstones_purged: u64,
    /// Undecodable records set aside (see `PurgeReport::records_quarantined`).
    pub records_quarantined: u64,
    pub batches: usize,
    /// True when the run stopped at its batch cap with more due.
    pub more: bool,
}

/// One run: batches of at most `batch_max` until nothing more is due,
/// `batches_per_run_max` batches ran, or `stop` is cancelled. The stop is
/// read before every batch, not only between runs: with a backlog a run
/// lasts up to `batches_per_run_max` batches (about two minutes on a
/// FoundationDB store loaded with millions of records, BENCHMARKS.md "A day
/// of keys"), and a shutdown that waited for the whole run would outlast
/// its grace period.
pub async fn sweep_once(
    store: &Arc<dyn IdempotencyStore>,
    config: &SweeperConfig,
    stop: &CancellationToken,
) -> Result<SweepReport, StoreError> {
    let mut report = SweepReport::default();
    while report.batches < config.batches_per_run_max && !stop.is_cancelled() {
        let PurgeReport {
            records_purged,
            tombstones_purged,
            records_quarantined,
            more,
        } = purge_off_the_request_workers(store.clone(), config.batch_max).await?;
        report.batches += 1;
        report.records_purged += records_purged;
        report.tombstones_purged += tombstones_purged;
        report.records_quarantined += records_quarantined;
        metrics::counter!(RECORDS_PURGED_TOTAL).increment(records_purged);
        metrics::counter!(TOMBSTONES_PURGED_TOTAL).increment(tombstones_purged);
        metrics::counter!(RECORDS_QUARANTINED_TOTAL).increment(records_quarantined);
        report.more = more;
        if !more {
            break;
        }
    }
    Ok(report)
}

/// One purge batch, polled on a blocking-pool thread (see the module's
/// comment). It runs on the same runtime: what it spawns, its timers and
/// its sockets are the runtime's, as when a worker polls it.
async fn purge_off_the_request_workers(
    store: Arc<dyn IdempotencyStore>,
    batch_max: usize,
) -> Result<PurgeReport, StoreError> {
    let runtime = tokio::runtime::Handle::current();
    tokio::task::spawn_blocking(move || runtime.block_on(store.purge_expired(batch_max)))
        .await
        .map_err(|failed| StoreError::unavailable("the sweeper's purge batch did not finish", failed))?
}

/// Runs the sweeper until `stop` is cancelled.
pub fn spawn(
    store: Arc<dyn IdempotencyStore>,
    config: SweeperConfig,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut interval = tokio::time::interval(Duration::from_millis(config.interval_ms));
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                () = stop.cancelled() => return,
                _ = interval.tick() => {}
            }
            let started = Instant::now();
            let result = sweep_once(&store, &config, &stop).await;
            metrics::histogram!(SWEEPER_RUN_DURATION_SECONDS).record(started.elapsed().as_secs_f64());
            match result {
                Ok(report) => {
                    metrics::counter!(SWEEPER_RUNS_TOTAL, "result" => "ok").increment(1);
                    if report.records_purged + report.tombstones_purged + report.records_quarantined > 0 {
                        tracing::info!(
                            records = report.records_purged,
                            tombstones = report.tombstones_purged,
                            quarantined = report.records_quarantined,
                            batches = report.batches,
                            more = report.more,
                            "sweeper purged expired records"
                        );
                    }
                }
                Err(error) => {
                    metrics::counter!(SWEEPER_RUNS_TOTAL, "result" => "error").increment(1);
                    tracing::warn!(%error, "sweeper run failed; retrying at the next interval");
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use store_core::testkit::{acquire, claim_request, policy, response, unique_caller};
    use store_core::{
        CallerId, ClaimOutcome, ClaimRequest, Fenced, ForgetOutcome, HeldLease, IdempotencyKey, KeyDigest, ManualClock,
        Record, RecoveryPoint, SavedResponse,
    };

    const DUE_RECORDS: usize = 5;

    /// A memory store holding `DUE_RECORDS` completed records, all past
    /// their retention.
    async fn store_with_due_records() -> Arc<dyn IdempotencyStore> {
        let clock = ManualClock::starting_at(1_000_000);
        let store: Arc<dyn IdempotencyStore> = Arc::new(store_memory::MemoryStore::new(policy(), clock.clone()));
        let caller = unique_caller();
        for index in 0..DUE_RECORDS {
            let acquired = acquire(&store, &claim_request(&caller, &format!("k-{index}"), "a")).await;
            let completed = store.complete(&acquired.lease, response(1)).await.unwrap();
            assert_eq!(completed, Fenced::Applied(()));
        }
        clock.advance(Duration::from_millis(policy().retention_ms() * 2));
        store
    }

    fn one_record_a_batch() -> SweeperConfig {
        SweeperConfig {
            batch_max: 1,
            ..SweeperConfig::default()
        }
    }

    #[tokio::test]
    async fn a_run_purges_batch_after_batch_until_nothing_is_due() {
        let store = store_with_due_records().await;
        let report = sweep_once(&store, &one_record_a_batch(), &CancellationToken::new())
            .await
            .unwrap();
        assert_eq!(report.records_purged, DUE_RECORDS as u64);
        assert!(!report.more);
    }

    /// Delegates to a memory store, noting the thread that polled each
    /// purge.
    struct PurgeThreadsNoted {
        inner: Arc<dyn IdempotencyStore>,
        purge_threads: std::sync::Mutex<Vec<std::thread::ThreadId>>,
    }

    #[async_trait::async_trait]
    impl IdempotencyStore for PurgeThreadsNoted {
        fn backend_name(&self) -> &'static str {
            self.inner.backend_name()
        }
        async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
            self.inner.claim(request).await
        }
        async fn checkpoint(&self, lease: &HeldLease, point: RecoveryPoint) -> Result<Fenced, StoreError> {
            self.inner.checkpoint(lease, point).await
        }
        async fn complete(&self, lease: &HeldLease, response: SavedResponse) -> Result<Fenced, StoreError> {
            self.inner.complete(lease, response).await
        }
        async fn release(&self, lease: &HeldLease) -> Result<Fenced, StoreError> {
            self.inner.release(lease).await
        }
        async fn abandon(&self, lease: &HeldLease) -> Result<Fenced, StoreError> {
            self.inner.abandon(lease).await
        }
        async fn purge_expired(&self, limit: usize) -> Result<PurgeReport, StoreError> {
            self.purge_threads.lock().unwrap().push(std::thread::current().id());
            self.inner.purge_expired(limit).await
        }
        async fn inspect(&self, caller: &CallerId, key: &IdempotencyKey) -> Result<Option<Record>, StoreError> {
            self.inner.inspect(caller, key).await
        }
        async fn forget_unreadable_record(
            &self,
            caller: &CallerId,
            key: KeyDigest,
        ) -> Result<ForgetOutcome, StoreError> {
            self.inner.forget_unreadable_record(caller, key).await
        }
        async fn ping(&self) -> Result<(), StoreError> {
            self.inner.ping().await
        }
    }

    /// The runtime of this test has one worker, the test's own thread: a
    /// batch polled there would hold every request of a service.
    #[tokio::test]
    async fn every_purge_batch_runs_off_the_threads_that_serve_requests() {
        let noted = Arc::new(PurgeThreadsNoted {
            inner: store_with_due_records().await,
            purge_threads: std::sync::Mutex::new(Vec::new()),
        });
        let store: Arc<dyn IdempotencyStore> = noted.clone();
        let report = sweep_once(&store, &one_record_a_batch(), &CancellationToken::new())
            .await
            .unwrap();
        assert_eq!(report.records_purged, DUE_RECORDS as u64);
        let threads = noted.purge_threads.lock().unwrap();
        assert_eq!(threads.len(), DUE_RECORDS, "one batch a record");
        let worker = std::thread::current().id();
        assert!(
            threads.iter().all(|thread| *thread != worker),
            "{threads:?} include {worker:?}"
        );
    }

    /// A shutdown's stop ends a run before its next batch, backlog or not.
    #[tokio::test]
    async fn a_stopped_run_starts_no_further_batch() {
        let store = store_with_due_records().await;
        let stop = CancellationToken::new();
        stop.cancel();
        let report = sweep_once(&store, &one_record_a_batch(), &stop).await.unwrap();
        assert_eq!(report.batches, 0, "{report:?}");
        let rest = sweep_once(&store, &one_record_a_batch(), &CancellationToken::new())
            .await
            .unwrap();
        assert_eq!(
            rest.records_purged, DUE_RECORDS as u64,
            "the stopped run purged nothing"
        );
    }
}
