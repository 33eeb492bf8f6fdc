//! `idem-bench preload`: fills a store with completed records at its
//! backend's bulk path (store-core's `BulkLoad`: the FDB-style store's
//! large transactions, Redis pipelines, PostgreSQL's binary `COPY`), so the
//! store can be measured at the design's size (docs/design.md#sizing: a day
//! at 400/s is 34.56M records) with the other commands.
//!
//! The records are label creates as the Label service leaves them
//! ([`records`]: key, fingerprint, saved response, and expiry times spread
//! evenly over the retention window). Only the records are written, no
//! label rows: a repeat of a loaded request is answered from the record's
//! saved response alone (idem-http's replay never reaches the label
//! route), so it replays through the service on every backend; `GET
//! /v1/labels/{id}` of a loaded label answers 404, since no label row
//! backs it.
//!
//! Batches go to the store two at a time ([`BATCHES_IN_FLIGHT`]), so the
//! next batch is made while one is written. While the store is behind,
//! batches are held back ([`target::RestProbe::behind`]: FoundationDB's
//! storage queue, before ratekeeper throttles the load into a timeout).
//! After the last batch the
//! preload waits, at most [`SETTLE_S_MAX`], until the store has absorbed
//! the load ([`target::RestProbe`]: on the embedded store, fjall's
//! compaction of it; on FoundationDB, the storage servers' and logs'
//! queues). A line of progress every
//! second (unless `--quiet`), then a summary: records written, elapsed
//! time, rate, the wait for rest, and the store's size (the disk space of the embedded directory's files,
//! PostgreSQL's table with its indexes, Redis's `used_memory` growth;
//! FoundationDB is not measured) and bytes per record.

pub mod records;
pub mod target;

use crate::cli::BackendArgs;
use crate::interrupt;
use crate::store_mode::TargetError;
use clap::Args;
use records::PreloadRecords;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use store_core::{BulkLoad, CallerId, InvalidInput, Policy, RETENTION_MS_MAX, StoreError, SystemClock};
use store_registry::StoreKind;
use target::PreloadTarget;
use tokio::task::JoinSet;

/// Most records one preload writes: above the design's worst case, a whole
/// day at the 2,000/s peak (172.8M, docs/design.md#sizing), and well inside
/// the 2 billion distinct keys one run's order ids give.
pub const PRELOAD_RECORDS_MAX: u64 = 200_000_000;
/// The design's retention: 24 hours.
pub const RETENTION_S_DEFAULT: u64 = 24 * 60 * 60;
/// The caller the records belong to: the one the server's development
/// token (`demo-token`, http mode's default `--token`) names, so a service
/// on the filled store replays them to `idem-bench http` and to curl.
pub const CALLER_DEFAULT: &str = "demo";
/// Batches written at once: one in the store while the next is made.
pub const BATCHES_IN_FLIGHT: usize = 2;
/// How often a progress line is printed.
const PROGRESS_INTERVAL_MS: u64 = 1_000;
/// How long a preload waits at most, after its last batch, for the store
/// to come to rest ([`target::RestProbe`]).
pub const SETTLE_S_MAX: u64 = 3_600;

/// `idem-bench preload`.
#[derive(Debug, Clone, Args)]
pub struct PreloadArgs {
    /// The store to fill.
    #[arg(long, value_enum, default_value_t = StoreKind::Embedded)]
    pub store_kind: StoreKind,
    /// Completed records to write, 1 to 200,000,000 (a day at 400/s is 34,560,000).
    #[arg(long)]
    pub records: u64,
    /// The retention window the records' expiry times are spread over, in
    /// seconds: record i of N expires at start + retention * (i + 1) / N.
    #[arg(long, default_value_t = RETENTION_S_DEFAULT)]
    pub retention_s: u64,
    /// Records per batch (one transaction, pipeline or COPY), 1 to the
    /// backend's maximum (embedded and FoundationDB 10,000, PostgreSQL 5,000,
    /// Redis 2,000); that maximum when absent.
    #[arg(long)]
    pub batch_records: Option<usize>,
    /// Seed of the records' order ids and tokens: the same seed writes the
    /// same keys (random when absent).
    #[arg(long)]
    pub seed: Option<u64>,
    /// The caller id the records belong to.
    #[arg(long, default_value = CALLER_DEFAULT)]
    pub caller: String,
    #[command(flatten)]
    pub backend: BackendArgs,
    /// Write the report as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// No progress lines.
    #[arg(long)]
    pub quiet: bool,
}

/// Why a preload could not run.
#[derive(Debug, thiserror::Error)]
pub enum PreloadError {
    #[error("--records must be at least 1")]
    NoRecords,
    #[error("--records {records} is more than {PRELOAD_RECORDS_MAX}")]
    TooManyRecords { records: u64 },
    #[error("--retention-s {retention_s} must be between 1 and {} (366 days)", RETENTION_MS_MAX / 1_000)]
    Retention { retention_s: u64 },
    #[error("--batch-records {batch_records} must be between 1 and {backend}'s {max}")]
    BatchRecords {
        batch_records: usize,
        backend: &'static str,
        max: usize,
    },
    #[error("--caller: {0}")]
    Caller(InvalidInput),
    #[error("record {index}: {source}")]
    Record { index: u64, source: InvalidInput },
    #[error(transparent)]
    Target(#[from] TargetError),
    #[error("{backend}: writing a batch failed after {written} records: {source}")]
    Store {
        backend: &'static str,
        written: u64,
        source: StoreError,
    },
}

/// The checked settings of one preload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreloadSettings {
    pub records: u64,
    pub retention_ms: u64,
    pub caller: CallerId,
    pub seed: u64,
}

impl PreloadArgs {
    /// The settings, or the first thing wrong with them.
    pub fn settings(&self) -> Result<PreloadSettings, PreloadError> {
        if self.records == 0 {
            return Err(PreloadError::NoRecords);
        }
        if self.records > PRELOAD_RECORDS_MAX {
            return Err(PreloadError::TooManyRecords { records: self.records });
        }
        let retention_ms = self.retention_s.saturating_mul(1_000);
        if self.retention_s == 0 || retention_ms > RETENTION_MS_MAX {
            return Err(PreloadError::Retention {
                retention_s: self.retention_s,
            });
        }
        Ok(PreloadSettings {
            records: self.records,
            retention_ms,
            caller: CallerId::new(self.caller.clone()).map_err(PreloadError::Caller)?,
            seed: self.seed.unwrap_or_else(rand::random),
        })
    }
}

/// The records per batch: `asked`, or the backend's maximum.
pub fn batch_records(asked: Option<usize>, backend: &'static str, max: usize) -> Result<usize, PreloadError> {
    match asked {
        None => Ok(max),
        Some(batch_records) if (1..=max).contains(&batch_records) => Ok(batch_records),
        Some(batch_records) => Err(PreloadError::BatchRecords {
            batch_records,
            backend,
            max,
        }),
    }
}

/// The store's size before and after, as measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoreSize {
    pub method: String,
    pub bytes_before: Option<u64>,
    pub bytes_after: Option<u64>,
    /// What the records added, divided by the records written.
    pub bytes_per_record: Option<f64>,
    /// Why a figure is missing.
    pub error: Option<String>,
}

/// What one preload did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PreloadReport {
    pub backend: String,
    pub notes: Vec<String>,
    pub caller: String,
    pub records: u64,
    pub records_written: u64,
    pub batch_records: usize,
    pub retention_s: u64,
    /// The time the expiry times count from (ms since the epoch): record i
    /// of N expires at `reference_ms + retention * (i + 1) / N`.
    pub reference_ms: u64,
    pub elapsed_s: f64,
    pub records_per_s: f64,
    /// How long, within `elapsed_s`, batches were held back because the
    /// store was behind (absent from reports written before the preload
    /// paced itself).
    #[serde(default)]
    pub paced_s: f64,
    /// The wait after the last batch until the store was at rest (absent
    /// from reports written before the preload waited).
    #[serde(default)]
    pub settle: Settle,
    pub size: StoreSize,
}

/// How long the store took to come to rest after the load.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Settle {
    pub waited_s: f64,
    /// False when [`SETTLE_S_MAX`] passed (or an interruption came) first.
    pub at_rest: bool,
    /// What the store still owed when the wait ended without rest.
    pub backlog: Option<String>,
}

/// Fills the store `args` names and reports what it wrote.
pub async fn run(args: &PreloadArgs, seed: u64) -> Result<PreloadReport, PreloadError> {
    let settings = PreloadSettings {
        seed,
        ..args.settings()?
    };
    let target = target::open(args.store_kind, &args.backend, Policy::default()).await?;
    let batch = batch_records(
        args.batch_records,
        target.backend,
        target.store.bulk_load_batch_records_max(),
    )?;
    eprintln!("preload {}: {}", target.backend, target.notes.join("; "));
    let reference_ms = SystemClock::shared().now_ms();
    let records = PreloadRecords::new(
        settings.seed,
        settings.caller.clone(),
        settings.records,
        settings.retention_ms,
        reference_ms,
    );
    let bytes_before = target.size.bytes().await;
    let started = Instant::now();
    let Loaded { written, paced_s } = load(&target, &records, batch, !args.quiet).await?;
    let elapsed = started.elapsed();
    let settle = settle(&target, !args.quiet).await;
    let bytes_after = target.size.bytes().await;
    Ok(PreloadReport {
        backend: target.backend.to_owned(),
        notes: target.notes.clone(),
        caller: settings.caller.as_str().to_owned(),
        records: settings.records,
        records_written: written,
        batch_records: batch,
        retention_s: args.retention_s,
        reference_ms,
        elapsed_s: elapsed.as_secs_f64(),
        records_per_s: per_second(written, elapsed),
        paced_s,
        settle,
        size: store_size(&target, bytes_before, bytes_after, written),
    })
}

/// Waits, after the last batch, until the store is at rest, at most
/// [`SETTLE_S_MAX`]: a day of keys arrives over a day, so the store a
/// preload hands over should owe nothing for the speed it was filled at.
async fn settle(target: &PreloadTarget, show_progress: bool) -> Settle {
    let started = Instant::now();
    let mut last_line = started;
    let mut at_rest_since = None;
    loop {
        match target.rest.backlog().await {
            None => {
                let since = *at_rest_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= Duration::from_millis(SETTLE_HELD_MS) {
                    return Settle {
                        waited_s: started.elapsed().as_secs_f64(),
                        at_rest: true,
                        backlog: None,
                    };
                }
            }
            Some(backlog) => {
                at_rest_since = None;
                if started.elapsed() >= Duration::from_secs(SETTLE_S_MAX) || interrupt::requested() {
                    return Settle {
                        waited_s: started.elapsed().as_secs_f64(),
                        at_rest: false,
                        backlog: Some(backlog),
                    };
                }
                if show_progress && last_line.elapsed() >= Duration::from_millis(PROGRESS_INTERVAL_MS) {
                    eprintln!(
                        "preload {}: waiting for the store to come to rest ({:.0} s): {backlog}",
                        target.backend,
                        started.elapsed().as_secs_f64()
                    );
                    last_line = Instant::now();
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(SETTLE_POLL_MS)).await;
    }
}

/// How often [`settle`] looks at the store.
const SETTLE_POLL_MS: u64 = 100;
/// How long the store must stay at rest before the wait ends: fjall's
/// compaction worker may pause between two compactions of one backlog.
const SETTLE_HELD_MS: u64 = 2_000;

/// Writes every batch, [`BATCHES_IN_FLIGHT`] at a time, until all are
/// written or an interruption asks to stop (the batches in flight are
/// still waited for). The first failure ends the load.
async fn load(
    target: &PreloadTarget,
    records: &PreloadRecords,
    batch: usize,
    show_progress: bool,
) -> Result<Loaded, PreloadError> {
    let mut in_flight = JoinSet::new();
    let mut progress = Progress::new(target.backend, records.count(), show_progress);
    let mut pacer = Pacer::new();
    let mut next = 0;
    let mut written = 0;
    while next < records.count() && !interrupt::requested() {
        pacer.wait_until_the_store_keeps_pace(target, show_progress).await;
        let end = (next + batch as u64).min(records.count());
        let made = records
            .batch(next, end)
            .map_err(|source| PreloadError::Record { index: next, source })?;
        let store: Arc<dyn BulkLoad> = target.store.clone();
        in_flight.spawn(async move { store.load_completed_records(&made).await });
        next = end;
        if in_flight.len() >= BATCHES_IN_FLIGHT {
            written += batch_written(in_flight.join_next().await, target.backend, written)?;
            progress.show(written);
        }
    }
    while let Some(joined) = in_flight.join_next().await {
        written += batch_written(Some(joined), target.backend, written)?;
        progress.show(written);
    }
    Ok(Loaded {
        written,
        paced_s: pacer.waited.as_secs_f64(),
    })
}

/// What [`load`] wrote, and how long it held batches back for the store.
struct Loaded {
    written: u64,
    paced_s: f64,
}

/// Holds the next batch back while the store is too far behind to take it
/// unthrottled ([`target::RestProbe::behind`]), looking at most every
/// [`PACE_POLL_MS`]: FoundationDB's status document is assembled by the
/// cluster controller from every process, too dear to read per batch.
struct Pacer {
    last_look: Option<Instant>,
    waited: Duration,
}

/// How often the preload looks whether the store keeps pace.
const PACE_POLL_MS: u64 = 1_000;
/// The longest one hold lasts: past it the next batch goes anyway, with
/// its own time budget, so a status that stays unreadable or a queue that
/// never drains ends the load with the store's error instead of hanging it.
pub const PACE_HOLD_S_MAX: u64 = 600;

impl Pacer {
    fn new() -> Self {
        Self {
            last_look: None,
            waited: Duration::ZERO,
        }
    }

    async fn wait_until_the_store_keeps_pace(&mut self, target: &PreloadTarget, show_progress: bool) {
        let poll = Duration::from_millis(PACE_POLL_MS);
        if self.last_look.is_some_and(|last| last.elapsed() < poll) {
            return;
        }
        let mut held_since = None;
        while let Some(behind) = target.rest.behind().await {
            let held = *held_since.get_or_insert_with(Instant::now);
            if interrupt::requested() || held.elapsed() >= Duration::from_secs(PACE_HOLD_S_MAX) {
                break;
            }
            if show_progress {
                eprintln!(
                    "preload {}: holding batches back ({:.0} s): {behind}",
                    target.backend,
                    held.elapsed().as_secs_f64()
                );
            }
            tokio::time::sleep(poll).await;
        }
        if let Some(held) = held_since {
            self.waited += held.elapsed();
        }
        self.last_look = Some(Instant::now());
    }
}

type JoinedBatch = Option<Result<Result<u64, StoreError>, tokio::task::JoinError>>;

/// The records one finished batch wrote, or why it failed.
fn batch_written(joined: JoinedBatch, backend: &'static str, written: u64) -> Result<u64, PreloadError> {
    let failed = |source| PreloadError::Store {
        backend,
        written,
        source,
    };
    match joined {
        None => Ok(0),
        Some(Ok(Ok(count))) => Ok(count),
        Some(Ok(Err(error))) => Err(failed(error)),
        Some(Err(join)) => Err(failed(StoreError::unavailable("a batch's task failed", join))),
    }
}

/// One line a second: records so far, the rate of the last second and the
/// average.
struct Progress {
    backend: &'static str,
    total: u64,
    enabled: bool,
    started: Instant,
    last_line: Instant,
    written_at_last_line: u64,
}

impl Progress {
    fn new(backend: &'static str, total: u64, enabled: bool) -> Self {
        let now = Instant::now();
        Self {
            backend,
            total,
            enabled,
            started: now,
            last_line: now,
            written_at_last_line: 0,
        }
    }

    fn show(&mut self, written: u64) {
        let since = self.last_line.elapsed();
        if !self.enabled || since < Duration::from_millis(PROGRESS_INTERVAL_MS) {
            return;
        }
        let now_rate = per_second(written - self.written_at_last_line, since);
        let average = per_second(written, self.started.elapsed());
        eprintln!(
            "preload {}: {written} of {} records ({:.1} %), {now_rate:.0} records/s now, {average:.0}/s on average",
            self.backend,
            self.total,
            100.0 * written as f64 / self.total.max(1) as f64
        );
        self.last_line = Instant::now();
        self.written_at_last_line = written;
    }
}

fn per_second(count: u64, elapsed: Duration) -> f64 {
    let seconds = elapsed.as_secs_f64();
    if seconds > 0.0 { count as f64 / seconds } else { 0.0 }
}

fn store_size(
    target: &PreloadTarget,
    before: Result<Option<u64>, String>,
    after: Result<Option<u64>, String>,
    written: u64,
) -> StoreSize {
    let error = [before.as_ref().err(), after.as_ref().err()]
        .into_iter()
        .flatten()
        .next()
        .cloned();
    let (bytes_before, bytes_after) = (before.ok().flatten(), after.ok().flatten());
    let bytes_per_record = match (bytes_before, bytes_after) {
        (Some(before), Some(after)) if written > 0 => Some(after.saturating_sub(before) as f64 / written as f64),
        _ => None,
    };
    StoreSize {
        method: target.size.method(),
        bytes_before,
        bytes_after,
        bytes_per_record,
        error,
    }
}

/// The summary printed at the end.
pub fn render(report: &PreloadReport) -> String {
    let size = &report.size;
    let bytes = match (size.bytes_after, size.bytes_per_record) {
        (Some(after), Some(per_record)) => format!(
            "{after} bytes after, {} before: {per_record:.0} bytes per record ({})",
            size.bytes_before.unwrap_or(0),
            size.method
        ),
        _ => format!(
            "size {}{}",
            size.method,
            size.error
                .as_ref()
                .map(|error| format!(" ({error})"))
                .unwrap_or_default()
        ),
    };
    format!(
        "preload {}: {} of {} records written in {:.2} s, {:.0} records/s ({} per batch, {:.0} s held back for the store, expiry spread over {} s)\n  {}\n  {bytes}",
        report.backend,
        report.records_written,
        report.records,
        report.elapsed_s,
        report.records_per_s,
        report.batch_records,
        report.paced_s,
        report.retention_s,
        settle_line(&report.settle)
    )
}

fn settle_line(settle: &Settle) -> String {
    match (&settle.backlog, settle.at_rest) {
        (Some(backlog), false) => format!("not at rest {:.1} s after the last batch: {backlog}", settle.waited_s),
        _ => format!("at rest {:.1} s after the last batch", settle.waited_s),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};
    use clap::Parser;

    fn args(extra: &[&str]) -> PreloadArgs {
        let mut line = vec!["idem-bench", "preload"];
        line.extend_from_slice(extra);
        match Cli::parse_from(line).command {
            Command::Preload(args) => args,
            other => panic!("preload expected, got {other:?}"),
        }
    }

    #[test]
    fn the_defaults_are_the_designs_retention_the_demo_caller_and_the_embedded_store() {
        let preload = args(&["--records", "34560000"]);
        assert_eq!(preload.store_kind, StoreKind::Embedded);
        let settings = preload.settings().unwrap();
        assert_eq!(settings.retention_ms, 86_400_000);
        assert_eq!(settings.caller.as_str(), "demo");
        assert_eq!(settings.records, 34_560_000);
    }

    #[test]
    fn bad_counts_retentions_callers_and_batches_are_refused_by_name() {
        assert!(matches!(
            args(&["--records", "0"]).settings(),
            Err(PreloadError::NoRecords)
        ));
        assert!(matches!(
            args(&["--records", "200000001"]).settings(),
            Err(PreloadError::TooManyRecords { records: 200_000_001 })
        ));
        assert!(matches!(
            args(&["--records", "1", "--retention-s", "0"]).settings(),
            Err(PreloadError::Retention { retention_s: 0 })
        ));
        assert!(matches!(
            args(&["--records", "1", "--retention-s", "31708800"]).settings(),
            Err(PreloadError::Retention { .. })
        ));
        assert!(matches!(
            args(&["--records", "1", "--caller", "not a caller"]).settings(),
            Err(PreloadError::Caller(_))
        ));
        assert_eq!(batch_records(None, "redis", 2_000).unwrap(), 2_000);
        assert_eq!(batch_records(Some(500), "redis", 2_000).unwrap(), 500);
        for refused in [0, 2_001] {
            let error = batch_records(Some(refused), "redis", 2_000).unwrap_err();
            assert!(
                matches!(error, PreloadError::BatchRecords { max: 2_000, .. }),
                "{error}"
            );
        }
    }

    #[test]
    fn bytes_per_record_is_what_the_records_added() {
        let target_method = "bytes".to_owned();
        let size = StoreSize {
            method: target_method,
            bytes_before: Some(1_000),
            bytes_after: Some(101_000),
            bytes_per_record: Some(100_000.0 / 200.0),
            error: None,
        };
        let report = PreloadReport {
            backend: "embedded".into(),
            notes: Vec::new(),
            caller: "demo".into(),
            records: 200,
            records_written: 200,
            batch_records: 100,
            retention_s: 60,
            reference_ms: 0,
            elapsed_s: 0.5,
            records_per_s: 400.0,
            paced_s: 3.0,
            settle: Settle {
                waited_s: 12.25,
                at_rest: true,
                backlog: None,
            },
            size,
        };
        let text = render(&report);
        assert!(text.contains("200 of 200 records"), "{text}");
        assert!(text.contains("500 bytes per record"), "{text}");
        assert!(text.contains("3 s held back for the store"), "{text}");
        assert!(text.contains("at rest 12.2 s after the last batch"), "{text}");
    }

    #[test]
    fn a_store_not_at_rest_says_what_it_still_owes() {
        let settle = Settle {
            waited_s: 3_600.0,
            at_rest: false,
            backlog: Some("31 tables in level 0, 0 memtables waiting for a flush, 1 compactions running".into()),
        };
        assert_eq!(
            settle_line(&settle),
            "not at rest 3600.0 s after the last batch: 31 tables in level 0, 0 memtables waiting for a flush, 1 compactions running"
        );
    }
}
