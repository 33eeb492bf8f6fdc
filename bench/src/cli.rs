//! The command line of `idem-bench`.

use crate::engine::{CONCURRENCY_DEFAULT, DRAIN_MS_DEFAULT, INFLIGHT_MAX_DEFAULT, LoadPlan};
use crate::ramp::RampSettings;
use crate::schedule::Arrivals;
use crate::store_mode::run::SaturationSettings;
use clap::{Args, Parser, Subcommand, ValueEnum};
use std::path::PathBuf;
use std::time::Duration;
use store_registry::StoreKind;

/// The design's peak: 2,000 label creates per second (docs/design.md#peak).
pub const RATE_PER_S_DEFAULT: f64 = 2_000.0;
pub const DURATION_S_DEFAULT: u64 = 60;
pub const WARMUP_S_DEFAULT: u64 = 5;
/// Alternating turns of intents and baseline in a saturation phase.
pub const SATURATION_ROUNDS_DEFAULT: u32 = 4;
/// Most turns accepted.
pub const SATURATION_ROUNDS_MAX: u32 = 100;
/// The latency objective for the ramp: p99 at most 10 ms.
pub const SLO_P99_MS_DEFAULT: f64 = 10.0;

#[derive(Debug, Parser)]
#[command(
    name = "idem-bench",
    version,
    about = "Open-loop load tester for idem: plays the Fulfilment service against the Label service (http) or drives the stores directly (store), audits every intent, and compares backends."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Drive the IdempotencyStore API directly: claim, then complete with an effect.
    Store(StoreArgs),
    /// Play the Fulfilment service against a Label service over HTTP, then audit every intent.
    Http(crate::http_mode::cli::HttpArgs),
    /// Run the same workload against every backend this machine can start; print them side by side.
    Compare(CompareArgs),
    /// Fill a store with completed label records at its backend's bulk path (records only, no label rows: they replay through the service from their saved responses, while GET /v1/labels/{id} of a loaded label answers 404), to measure it at the design's size.
    Preload(crate::preload::PreloadArgs),
    /// Draw the per-second chart of reports saved by earlier runs (their `--json`) into one SVG file, running nothing.
    Chart(ChartArgs),
    /// Start a redis-server or PostgreSQL server as the stores' harnesses do (durable, a free loopback port, a temporary directory), write its URL to --url-file, and keep it until SIGINT or SIGTERM: one store for the several steps of scripts/day-of-keys.
    StoreServer(crate::store_server::StoreServerArgs),
    /// Read the folders scripts/day-of-keys wrote and print their markdown tables (the day of keys per backend, or the growth curve with its extrapolation to 172.8M records); draw each run's store size and service memory over time (day-of-keys.svg).
    DayReport(crate::day_report::DayReportArgs),
    /// Measure this machine's own fdatasync latency and list its stalls: a file appended to and synced at --rate per second, no store in the way. A durable store waits on every fdatasync, so run it beside a load test.
    Disk(crate::disk::DiskArgs),
}

/// `idem-bench chart`: saved reports in, one SVG out.
#[derive(Debug, Clone, Args)]
pub struct ChartArgs {
    /// JSON reports written by earlier runs (`--json`), drawn in the order given.
    #[arg(required = true, num_args = 1..)]
    pub reports: Vec<PathBuf>,
    /// The SVG file to write.
    #[arg(long)]
    pub out: PathBuf,
}

/// The offered load.
#[derive(Debug, Clone, Args)]
pub struct LoadArgs {
    /// Target rate in operations (intents) per second.
    #[arg(long, default_value_t = RATE_PER_S_DEFAULT)]
    pub rate: f64,
    /// Length of the measured window, in seconds.
    #[arg(long, default_value_t = DURATION_S_DEFAULT)]
    pub duration_s: u64,
    /// Warm-up before the measured window, in seconds (run at the same rate, not recorded).
    #[arg(long, default_value_t = WARMUP_S_DEFAULT)]
    pub warmup_s: u64,
    /// Arrival schedule: evenly spaced (fixed) or a Poisson process.
    #[arg(long, value_enum, default_value_t = Arrivals::Poisson)]
    pub arrivals: Arrivals,
    /// Seed of the arrival schedule, of which intents are sent twice, and of a spawned carrier's faults (random when absent).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Most operations in flight at once; past it operations wait and are counted as late starts.
    #[arg(long, default_value_t = INFLIGHT_MAX_DEFAULT)]
    pub inflight_max: usize,
    /// Seconds allowed after the last intended start for running operations to finish.
    #[arg(long, default_value_t = DRAIN_MS_DEFAULT / 1_000)]
    pub drain_s: u64,
    /// Step the rate up until p99 passes --slo-p99-ms, instead of one run at --rate.
    #[arg(long)]
    pub ramp: bool,
    /// First rate of the ramp, per second.
    #[arg(long, default_value_t = 1_000.0)]
    pub ramp_start: f64,
    /// Increase per ramp step, per second.
    #[arg(long, default_value_t = 1_000.0)]
    pub ramp_step: f64,
    /// Highest rate the ramp tries, per second.
    #[arg(long, default_value_t = 50_000.0)]
    pub ramp_max: f64,
    /// Measured seconds per ramp step (each step also gets --warmup-s).
    #[arg(long, default_value_t = 10)]
    pub ramp_step_s: u64,
    /// Bisection steps after the first step that does not hold.
    #[arg(long, default_value_t = 2)]
    pub ramp_refine: u32,
    /// Latency objective of the ramp: a step holds while p99 stays at or below this.
    #[arg(long, default_value_t = SLO_P99_MS_DEFAULT)]
    pub slo_p99_ms: f64,
}

impl LoadArgs {
    pub fn seed(&self) -> u64 {
        self.seed.unwrap_or_else(rand::random)
    }

    pub fn plan(&self, seed: u64, show_progress: bool) -> LoadPlan {
        LoadPlan {
            rate_per_s: self.rate,
            arrivals: self.arrivals,
            warmup: Duration::from_secs(self.warmup_s),
            duration: Duration::from_secs(self.duration_s),
            seed,
            inflight_max: self.inflight_max,
            drain: Duration::from_secs(self.drain_s),
            index_base: 0,
            label: String::new(),
            show_progress,
        }
    }

    /// The ramp, when `--ramp` asks for it.
    pub fn ramp(&self) -> Option<RampSettings> {
        self.ramp.then(|| self.ramp_settings())
    }

    /// The ramp the `--ramp-*` arguments describe, asked for or not.
    pub fn ramp_settings(&self) -> RampSettings {
        RampSettings {
            start_per_s: self.ramp_start,
            step_per_s: self.ramp_step,
            max_per_s: self.ramp_max,
            step_duration: Duration::from_secs(self.ramp_step_s),
            slo_p99_ms: self.slo_p99_ms,
            refine_steps: self.ramp_refine,
        }
    }
}

/// Where results go.
#[derive(Debug, Clone, Args)]
pub struct OutputArgs {
    /// Write the full report (summaries, per-second series, audit) as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write an SVG chart of throughput and latency percentiles over time.
    #[arg(long)]
    pub chart: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
}

/// When the embedded engine acknowledges a commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DurabilityArg {
    /// fdatasync before acknowledging (the default, survives power loss).
    SyncData,
    /// fsync data and metadata.
    SyncAll,
    /// OS buffers only: survives a process crash, not power loss.
    Buffer,
}

impl DurabilityArg {
    pub fn durability(self) -> store_fdb::Durability {
        match self {
            DurabilityArg::SyncData => store_fdb::Durability::SyncData,
            DurabilityArg::SyncAll => store_fdb::Durability::SyncAll,
            DurabilityArg::Buffer => store_fdb::Durability::Buffer,
        }
    }
}

/// How a spawned redis-server persists writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RedisPersistence {
    /// No persistence at all (the test harness's default).
    None,
    /// AOF with `appendfsync everysec`: may lose about a second of writes.
    Everysec,
    /// AOF with `appendfsync always`: fsync every write.
    Always,
}

/// Where each backend lives.
#[derive(Debug, Clone, Args)]
pub struct BackendArgs {
    /// Embedded engine durability.
    #[arg(long, value_enum, default_value_t = DurabilityArg::SyncData)]
    pub embedded_durability: DurabilityArg,
    /// Directory for the embedded store (kept); a temporary directory when absent.
    #[arg(long)]
    pub embedded_dir: Option<PathBuf>,
    /// Use this Redis server (redis://host:port) instead of spawning one.
    #[arg(long)]
    pub redis_url: Option<String>,
    /// Persistence of a spawned redis-server.
    #[arg(long, value_enum, default_value_t = RedisPersistence::Everysec)]
    pub redis_persistence: RedisPersistence,
    /// Use this PostgreSQL database (postgres://...) instead of spawning a server.
    #[arg(long)]
    pub postgres_url: Option<String>,
    /// FoundationDB cluster file (never spawned); else FDB_CLUSTER_FILE, else FoundationDB's default.
    #[arg(long)]
    pub foundationdb_cluster_file: Option<PathBuf>,
    /// Key prefix on the FoundationDB cluster; a fresh `bench-<hex>` per run when absent.
    #[arg(long)]
    pub foundationdb_key_prefix: Option<String>,
    /// Claims that share one transaction at most on the embedded and FoundationDB stores (1 turns batching off; the store refuses more than it allows); each store's own default when absent.
    #[arg(long)]
    pub claim_batch_items_max: Option<usize>,
}

/// Closed-loop saturation and baseline settings.
#[derive(Debug, Clone, Args)]
pub struct SaturationArgs {
    /// Seconds of closed-loop saturation for intents and for the raw baseline (0 skips both).
    #[arg(long, default_value_t = 10)]
    pub saturate_s: u64,
    /// Turns the intents and the baseline take, alternating, within --saturate-s each.
    #[arg(long, default_value_t = SATURATION_ROUNDS_DEFAULT)]
    pub saturate_rounds: u32,
    /// Concurrent workers in the saturation runs.
    #[arg(long, default_value_t = CONCURRENCY_DEFAULT)]
    pub concurrency: usize,
    /// Skip the raw baseline.
    #[arg(long)]
    pub no_baseline: bool,
}

impl SaturationArgs {
    pub fn settings(&self, warmup_s: u64) -> Option<SaturationSettings> {
        (self.saturate_s > 0).then(|| SaturationSettings {
            concurrency: self.concurrency,
            warmup: Duration::from_secs(warmup_s.min(2)),
            duration: Duration::from_secs(self.saturate_s),
            rounds: self.saturate_rounds.clamp(1, SATURATION_ROUNDS_MAX),
        })
    }
}

#[derive(Debug, Clone, Args)]
pub struct StoreArgs {
    /// Backends to run, in order (repeatable).
    #[arg(long = "backend", value_enum, default_values_t = [StoreKind::Embedded])]
    pub backends: Vec<StoreKind>,
    #[command(flatten)]
    pub load: LoadArgs,
    #[command(flatten)]
    pub saturation: SaturationArgs,
    #[command(flatten)]
    pub backend: BackendArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// What `compare` runs against each backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CompareMode {
    Store,
    Http,
    /// Store mode, http at --rate, a ramp for the capacity and the overload
    /// profile of that capacity, per backend: the published table in one run.
    Full,
}

#[derive(Debug, Clone, Args)]
pub struct CompareArgs {
    /// Store mode (the API directly), http mode (a spawned Label service per
    /// backend), or full (both, the ramp and the overload profile, one table).
    #[arg(long, value_enum, default_value_t = CompareMode::Store)]
    pub mode: CompareMode,
    /// Full mode: seconds per overload phase.
    #[arg(long, default_value_t = crate::http_mode::cli::PHASE_S_DEFAULT)]
    pub phase_s: u64,
    /// Full mode: the overload profile's 1x, per second, instead of the
    /// capacity the ramp finds (which a tight --slo-p99-ms can put far below
    /// what the machine sustains, so that 3x would overload nothing).
    #[arg(long)]
    pub overload_rate: Option<f64>,
    /// Full mode: before each run, wait for the 1-minute load to fall below this.
    #[arg(long, default_value_t = crate::compare::SETTLE_LOAD_DEFAULT)]
    pub settle_load: f64,
    /// Full mode: the longest wait for the load to fall, in seconds.
    #[arg(long, default_value_t = crate::compare::SETTLE_S_MAX_DEFAULT)]
    pub settle_s_max: u64,
    /// Backends to try; each one this machine cannot start is reported as unavailable.
    #[arg(long = "backend", value_enum, default_values_t = StoreKind::SELF_STARTED)]
    pub backends: Vec<StoreKind>,
    #[command(flatten)]
    pub load: LoadArgs,
    #[command(flatten)]
    pub saturation: SaturationArgs,
    #[command(flatten)]
    pub backend: BackendArgs,
    #[command(flatten)]
    pub http: crate::http_mode::cli::FulfilmentArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn defaults_are_the_seeds_peak_for_a_minute() {
        let cli = Cli::parse_from(["idem-bench", "store"]);
        let Command::Store(args) = cli.command else {
            panic!("store expected");
        };
        assert_eq!(args.load.rate, 2_000.0);
        assert_eq!(args.load.duration_s, 60);
        assert_eq!(args.backends, [StoreKind::Embedded]);
        assert!(args.load.ramp().is_none());
    }
}
