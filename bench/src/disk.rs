//! `idem-bench disk`: this machine's own fdatasync latency, and its stalls.
//!
//! A durable store waits on every fdatasync it makes, so a disk that stalls
//! stalls the store, whatever the store does. Hosts of one kind differ:
//! on some the virtual disk alone holds a sync for hundreds of
//! milliseconds, several times a minute, with nothing else running. This
//! probe measures that beside a load test, with no store in the way: a
//! file in `--dir` gets `--write-bytes` appended and then an fdatasync
//! (`File::sync_data`), at `--rate` per second for `--duration-s`, and only
//! the sync is timed.
//!
//! The schedule is open-loop: call n is due at start + n / rate. A call
//! whose time has passed (the sync before it ran long) starts at once and
//! is counted as late; no call starts after the run's end.

use crate::interrupt::{self, INTERRUPT_POLL_MS, Interruption};
use crate::machine::Machine;
use crate::output::{self, OutputError};
use crate::recorder::{HISTOGRAM_DIGITS, latency_histogram, micros};
use clap::Args;
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::io::{Seek, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Syncs per second when `--rate` is absent.
pub const RATE_PER_S_DEFAULT: u64 = 500;
/// Most syncs per second accepted: far above what any disk sustains, so
/// such a run only measures how far behind the disk falls.
pub const RATE_PER_S_MAX: u64 = 100_000;
/// Length of the run when `--duration-s` is absent, in seconds.
pub const DURATION_S_DEFAULT: u64 = 30;
/// Longest run accepted, in seconds.
pub const DURATION_S_MAX: u64 = 3_600;
/// Bytes appended before each sync when `--write-bytes` is absent: one
/// page, about what a journal appends for one small commit.
pub const WRITE_BYTES_DEFAULT: u64 = 4_096;
/// Most bytes appended before one sync.
pub const WRITE_BYTES_MAX: u64 = 1_048_576;
/// Syncs longer than this are listed as stalls when `--stall-ms` is absent.
pub const STALL_MS_DEFAULT: u64 = 50;
/// Highest stall threshold accepted, in milliseconds.
pub const STALL_MS_MAX: u64 = 60_000;
/// Past this size the probe file is cut back to nothing, so a long run
/// at a high rate cannot fill the disk it measures.
pub const PROBE_FILE_BYTES_MAX: u64 = 64 * 1_048_576;
/// Most stalls listed, in the output and in the JSON report; the rest are
/// counted only.
pub const STALLS_LISTED_MAX: usize = 100;
/// The probe file's name starts with this; the rest is random.
pub const PROBE_FILE_PREFIX: &str = "idem-bench-disk-";
/// What the probe file is filled with.
const PROBE_BYTE: u8 = 0xA5;
const NANOS_PER_S: u64 = 1_000_000_000;

// A single append never outgrows the file's bound.
const _: () = assert!(WRITE_BYTES_MAX <= PROBE_FILE_BYTES_MAX);

/// `idem-bench disk`.
#[derive(Debug, Clone, Args)]
pub struct DiskArgs {
    /// Directory the probe file is written in (created with a unique name, removed at the end); the system's temporary directory when absent.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Syncs per second, 1 to 100,000.
    #[arg(long, default_value_t = RATE_PER_S_DEFAULT)]
    pub rate: u64,
    /// Length of the run in seconds, 1 to 3,600.
    #[arg(long, default_value_t = DURATION_S_DEFAULT)]
    pub duration_s: u64,
    /// Bytes appended before each sync, 1 to 1,048,576.
    #[arg(long, default_value_t = WRITE_BYTES_DEFAULT)]
    pub write_bytes: u64,
    /// Syncs longer than this many milliseconds are listed as stalls, 1 to 60,000.
    #[arg(long, default_value_t = STALL_MS_DEFAULT)]
    pub stall_ms: u64,
    /// Write the report as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// Why the probe could not run.
#[derive(Debug, thiserror::Error)]
pub enum DiskProbeError {
    #[error("--{argument} {value} must be between 1 and {max}")]
    OutOfRange {
        argument: &'static str,
        value: u64,
        max: u64,
    },
    #[error("cannot create a probe file in {dir}: {source}")]
    Create { dir: String, source: std::io::Error },
    #[error("{step} of the probe file {path} failed: {source}")]
    Probe {
        step: &'static str,
        path: String,
        source: std::io::Error,
    },
    #[error("the probe's thread ended without an answer: {0}")]
    Thread(#[from] tokio::task::JoinError),
}

/// The checked settings of one probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskProbeSettings {
    pub dir: PathBuf,
    pub rate_per_s: u64,
    pub duration_s: u64,
    pub write_bytes: u64,
    pub stall_ms: u64,
}

impl DiskArgs {
    /// The settings, or the first argument out of its range.
    pub fn settings(&self) -> Result<DiskProbeSettings, DiskProbeError> {
        Ok(DiskProbeSettings {
            dir: self.dir.clone().unwrap_or_else(std::env::temp_dir),
            rate_per_s: within_limit("rate", self.rate, RATE_PER_S_MAX)?,
            duration_s: within_limit("duration-s", self.duration_s, DURATION_S_MAX)?,
            write_bytes: within_limit("write-bytes", self.write_bytes, WRITE_BYTES_MAX)?,
            stall_ms: within_limit("stall-ms", self.stall_ms, STALL_MS_MAX)?,
        })
    }
}

fn within_limit(argument: &'static str, value: u64, max: u64) -> Result<u64, DiskProbeError> {
    if (1..=max).contains(&value) {
        Ok(value)
    } else {
        Err(DiskProbeError::OutOfRange { argument, value, max })
    }
}

impl DiskProbeSettings {
    /// Calls the schedule holds: rate times duration (at most 360M).
    pub fn calls_planned(&self) -> u64 {
        self.rate_per_s * self.duration_s
    }

    /// When call `call` is due, from the start. Below 360M calls times
    /// 10^9 ns the product fits a u64.
    fn due_after(&self, call: u64) -> Duration {
        Duration::from_nanos(call.saturating_mul(NANOS_PER_S) / self.rate_per_s)
    }
}

/// What `idem-bench disk` measured; written by `--json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DiskReport {
    pub version: String,
    pub command: Vec<String>,
    pub machine: Machine,
    /// Where the probe file was written.
    pub dir: String,
    pub write_bytes: u64,
    pub rate_per_s: u64,
    pub duration_s: u64,
    pub calls_planned: u64,
    /// Syncs made. Fewer than planned when slow syncs put the schedule so
    /// far behind that the run ended first, or when it was interrupted.
    pub calls: u64,
    /// Calls that started after their time, behind a slow sync.
    pub started_late: u64,
    /// Times the probe file reached [`PROBE_FILE_BYTES_MAX`] and was cut back.
    pub truncations: u64,
    pub fdatasync: SyncLatency,
    /// Syncs longer than this are stalls.
    pub stall_ms: u64,
    /// Every stall, listed or not.
    pub stalls_total: u64,
    pub longest_stall_ms: Option<f64>,
    /// The first [`STALLS_LISTED_MAX`] stalls, in order.
    pub stalls: Vec<Stall>,
    /// Set when a SIGINT or SIGTERM ended the probe early: every figure is
    /// then of the part that ran.
    #[serde(default)]
    pub interrupted: Option<Interruption>,
    /// What made the figures doubtful, found before the run (services an
    /// earlier run left running share the disk).
    #[serde(default)]
    pub warnings: Vec<String>,
}

/// Percentiles of the fdatasync time, in milliseconds, to the histogram's
/// 0.1%.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SyncLatency {
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
}

/// One fdatasync over the stall threshold.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Stall {
    /// When the sync began, in seconds from the start of the run.
    pub at_s: f64,
    pub fdatasync_ms: f64,
}

impl DiskReport {
    pub fn write_json(&self, path: &Path) -> Result<(), OutputError> {
        output::write_json_file(self, path)
    }
}

/// Runs the probe on a blocking thread (its syncs would hold a runtime
/// worker, and with it the signal listener on a one-core machine).
pub async fn run(args: &DiskArgs) -> Result<DiskReport, DiskProbeError> {
    let settings = args.settings()?;
    let machine = Machine::now();
    let probe_settings = settings.clone();
    let measured = tokio::task::spawn_blocking(move || probe_disk(&probe_settings)).await??;
    Ok(measured.report(&settings, machine))
}

/// Creates the probe file, runs the schedule, removes the file.
fn probe_disk(settings: &DiskProbeSettings) -> Result<SyncMeasurements, DiskProbeError> {
    let mut probe_file = tempfile::Builder::new()
        .prefix(PROBE_FILE_PREFIX)
        .tempfile_in(&settings.dir)
        .map_err(|source| DiskProbeError::Create {
            dir: settings.dir.display().to_string(),
            source,
        })?;
    let path = probe_file.path().display().to_string();
    // On an error the `?` drops the probe file's `NamedTempFile`, which removes it.
    let measured = paced_syncs(probe_file.as_file_mut(), &path, settings)?;
    probe_file.close().map_err(|source| DiskProbeError::Probe {
        step: "removal",
        path,
        source,
    })?;
    Ok(measured)
}

/// The open-loop schedule: each call waits for its time, or starts at once
/// when that time has passed, until every call ran or the run's time is up.
fn paced_syncs(file: &mut File, path: &str, settings: &DiskProbeSettings) -> Result<SyncMeasurements, DiskProbeError> {
    let failed = |step| {
        move |source| DiskProbeError::Probe {
            step,
            path: path.to_owned(),
            source,
        }
    };
    let block = vec![PROBE_BYTE; settings.write_bytes as usize];
    let stall_threshold = Duration::from_millis(settings.stall_ms);
    let mut measurements = SyncMeasurements::new();
    let mut length_bytes = 0;
    let start = Instant::now();
    let end = start + Duration::from_secs(settings.duration_s);
    for call in 0..settings.calls_planned() {
        let due = start + settings.due_after(call);
        let late = Instant::now() > due;
        if !late {
            sleep_until(due);
        }
        if Instant::now() >= end || interrupt::requested() {
            break;
        }
        measurements.started_late += u64::from(late);
        if length_bytes + settings.write_bytes > PROBE_FILE_BYTES_MAX {
            // Cutting the file back changes its metadata, which a later sync
            // may have to write too; the cut itself is not timed.
            file.set_len(0).map_err(failed("truncation"))?;
            file.rewind().map_err(failed("truncation"))?;
            length_bytes = 0;
            measurements.truncations += 1;
        }
        file.write_all(&block).map_err(failed("write"))?;
        length_bytes += settings.write_bytes;
        let sync_began = Instant::now();
        file.sync_data().map_err(failed("fdatasync"))?;
        measurements.record(sync_began - start, sync_began.elapsed(), stall_threshold);
    }
    Ok(measurements)
}

/// Sleeps until `due`, waking every [`INTERRUPT_POLL_MS`] so that a signal
/// at a low rate stops the run at once.
fn sleep_until(due: Instant) {
    let poll = Duration::from_millis(INTERRUPT_POLL_MS);
    loop {
        let now = Instant::now();
        if now >= due || interrupt::requested() {
            return;
        }
        std::thread::sleep((due - now).min(poll));
    }
}

/// What the syncs took, as they happen.
struct SyncMeasurements {
    /// Microseconds.
    latency: Histogram<u64>,
    started_late: u64,
    truncations: u64,
    stalls_total: u64,
    longest_stall: Option<Duration>,
    stalls_listed: Vec<Stall>,
}

impl SyncMeasurements {
    fn new() -> Self {
        Self {
            latency: latency_histogram(HISTOGRAM_DIGITS),
            started_late: 0,
            truncations: 0,
            stalls_total: 0,
            longest_stall: None,
            stalls_listed: Vec::new(),
        }
    }

    /// One sync, begun `since_start` into the run.
    fn record(&mut self, since_start: Duration, took: Duration, stall_threshold: Duration) {
        self.latency.saturating_record(micros(took));
        if took <= stall_threshold {
            return;
        }
        self.stalls_total += 1;
        self.longest_stall = self.longest_stall.max(Some(took));
        if self.stalls_listed.len() < STALLS_LISTED_MAX {
            self.stalls_listed.push(Stall {
                at_s: since_start.as_secs_f64(),
                fdatasync_ms: milliseconds(took),
            });
        }
    }

    fn report(self, settings: &DiskProbeSettings, machine: Machine) -> DiskReport {
        let quantile_ms = |quantile| self.latency.value_at_quantile(quantile) as f64 / 1_000.0;
        DiskReport {
            version: env!("CARGO_PKG_VERSION").into(),
            command: std::env::args().collect(),
            machine,
            dir: settings.dir.display().to_string(),
            write_bytes: settings.write_bytes,
            rate_per_s: settings.rate_per_s,
            duration_s: settings.duration_s,
            calls_planned: settings.calls_planned(),
            calls: self.latency.len(),
            started_late: self.started_late,
            truncations: self.truncations,
            fdatasync: SyncLatency {
                p50_ms: quantile_ms(0.5),
                p99_ms: quantile_ms(0.99),
                p999_ms: quantile_ms(0.999),
                max_ms: self.latency.max() as f64 / 1_000.0,
            },
            stall_ms: settings.stall_ms,
            stalls_total: self.stalls_total,
            longest_stall_ms: self.longest_stall.map(milliseconds),
            stalls: self.stalls_listed,
            interrupted: None,
            warnings: Vec::new(),
        }
    }
}

fn milliseconds(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1_000.0
}

/// The report as printed: the machine, the percentiles, each stall listed,
/// and their count.
pub fn render(report: &DiskReport) -> String {
    let mut text = String::new();
    if let Some(interrupted) = &report.interrupted {
        text.push_str(&format!(
            "INTERRUPTED by {} after {:.1} s: the figures are of the part that ran.\n",
            interrupted.signal.name(),
            interrupted.after_s
        ));
    }
    for warning in &report.warnings {
        text.push_str(&format!("WARNING: {warning}\n"));
    }
    let latency = &report.fdatasync;
    text.push_str(&format!(
        "machine: {}\nfdatasync of a {}-byte append, {} calls at {}/s: p50 {:.2}  p99 {:.2}  p99.9 {:.2}  max {:.2} ms\n",
        report.machine.describe(),
        report.write_bytes,
        report.calls,
        report.rate_per_s,
        latency.p50_ms,
        latency.p99_ms,
        latency.p999_ms,
        latency.max_ms
    ));
    text.push_str(&render_stalls(report));
    text.push_str(&render_schedule(report));
    text
}

fn render_stalls(report: &DiskReport) -> String {
    let mut text = String::new();
    for stall in &report.stalls {
        text.push_str(&format!(
            "+{:.3} s  fdatasync {:.1} ms\n",
            stall.at_s, stall.fdatasync_ms
        ));
    }
    let unlisted = report.stalls_total.saturating_sub(report.stalls.len() as u64);
    if unlisted > 0 {
        text.push_str(&format!("... and {unlisted} more\n"));
    }
    text.push_str(&format!("stalls over {} ms: {}", report.stall_ms, report.stalls_total));
    if let Some(longest_ms) = report.longest_stall_ms {
        text.push_str(&format!(" (longest {longest_ms:.1} ms)"));
    }
    text.push('\n');
    text
}

/// How well the schedule was kept: late starts, and calls that never ran.
fn render_schedule(report: &DiskReport) -> String {
    let mut text = format!(
        "started late: {} of {} calls (behind a slow sync)",
        report.started_late, report.calls
    );
    let not_run = report.calls_planned.saturating_sub(report.calls);
    if not_run > 0 && report.interrupted.is_none() {
        text.push_str(&format!(
            "; {not_run} planned calls were still due when the run's time was up"
        ));
    }
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args() -> DiskArgs {
        DiskArgs {
            dir: None,
            rate: RATE_PER_S_DEFAULT,
            duration_s: DURATION_S_DEFAULT,
            write_bytes: WRITE_BYTES_DEFAULT,
            stall_ms: STALL_MS_DEFAULT,
            json: None,
        }
    }

    #[test]
    fn each_argument_is_refused_by_name_outside_its_range() {
        assert_eq!(args().settings().unwrap().calls_planned(), 15_000);
        let refusals = [
            (DiskArgs { rate: 0, ..args() }, "--rate 0 must be between 1 and 100000"),
            (
                DiskArgs {
                    duration_s: DURATION_S_MAX + 1,
                    ..args()
                },
                "--duration-s 3601 must be between 1 and 3600",
            ),
            (
                DiskArgs {
                    write_bytes: WRITE_BYTES_MAX + 1,
                    ..args()
                },
                "--write-bytes 1048577 must be between 1 and 1048576",
            ),
            (
                DiskArgs { stall_ms: 0, ..args() },
                "--stall-ms 0 must be between 1 and 60000",
            ),
        ];
        for (refused, message) in refusals {
            assert_eq!(refused.settings().unwrap_err().to_string(), message);
        }
    }

    #[test]
    fn calls_are_due_at_even_intervals_from_the_start() {
        let settings = DiskArgs { rate: 400, ..args() }.settings().unwrap();
        assert_eq!(settings.due_after(0), Duration::ZERO);
        assert_eq!(settings.due_after(1), Duration::from_micros(2_500));
        assert_eq!(settings.due_after(400), Duration::from_secs(1));
        let fastest = DiskArgs {
            rate: RATE_PER_S_MAX,
            duration_s: DURATION_S_MAX,
            ..args()
        }
        .settings()
        .unwrap();
        let last = fastest.calls_planned() - 1;
        assert!(fastest.due_after(last) < Duration::from_secs(DURATION_S_MAX));
    }

    #[test]
    fn stalls_past_the_listed_ones_are_counted_and_the_longest_kept() {
        let threshold = Duration::from_millis(50);
        let mut measurements = SyncMeasurements::new();
        measurements.record(Duration::from_millis(10), Duration::from_micros(200), threshold);
        measurements.record(Duration::from_millis(20), threshold, threshold);
        for index in 0..STALLS_LISTED_MAX as u64 + 5 {
            let took = Duration::from_millis(if index == 103 { 427 } else { 60 });
            measurements.record(Duration::from_secs(index), took, threshold);
        }
        let settings = args().settings().unwrap();
        let report = measurements.report(&settings, Machine::now());
        assert_eq!(report.calls, 2 + STALLS_LISTED_MAX as u64 + 5);
        assert_eq!(report.stalls_total, STALLS_LISTED_MAX as u64 + 5);
        assert_eq!(report.stalls.len(), STALLS_LISTED_MAX);
        assert_eq!(report.longest_stall_ms, Some(427.0));
        assert!(report.fdatasync.max_ms >= 427.0 && report.fdatasync.max_ms < 427.5);

        let text = render(&report);
        assert!(
            text.contains("fdatasync of a 4096-byte append, 107 calls at 500/s: p50 60."),
            "{text}"
        );
        assert!(text.contains("\n+0.000 s  fdatasync 60.0 ms\n"), "{text}");
        assert!(
            text.contains("\n... and 5 more\nstalls over 50 ms: 105 (longest 427.0 ms)\n"),
            "{text}"
        );
        assert!(
            !text.contains("+103.000 s"),
            "only the first {STALLS_LISTED_MAX} are listed"
        );
    }

    #[test]
    fn a_run_without_stalls_says_so() {
        let mut measurements = SyncMeasurements::new();
        measurements.record(Duration::ZERO, Duration::from_micros(300), Duration::from_millis(50));
        let text = render(&measurements.report(&args().settings().unwrap(), Machine::now()));
        assert!(text.contains("\nstalls over 50 ms: 0\n"), "{text}");
        assert!(text.contains("14999 planned calls were still due"), "{text}");
    }
}
