//! idem-bench: an open-loop load tester for idem.
//!
//! - [`schedule`] and [`engine`]: open-loop arrivals at a target rate, with
//!   latency from each operation's intended start (coordinated omission
//!   corrected, as wrk2 does), an in-flight bound, and closed-loop
//!   saturation runs for raw baselines. They know nothing of idem.
//! - [`recorder`] and [`report`]: HDR histograms, counts by outcome, one
//!   bucket per second, and their summaries.
//! - [`ramp`]: step the rate up until p99 passes an SLO.
//! - [`store_mode`]: the `IdempotencyStore` API driven directly, with a raw
//!   baseline per backend.
//! - [`http_mode`]: the Fulfilment service against the Label service, and
//!   the audit of every intent.
//! - [`compare`]: `compare --mode full`, the published set for every backend in one run, and its table.
//! - [`preload`]: `preload`, a store filled with completed records at its
//!   backend's bulk path, to be measured at the design's size.
//! - [`store_server`]: `store-server`, a redis-server or PostgreSQL server
//!   from the stores' harnesses, kept for a script's several steps.
//! - [`day_report`]: `day-report`, the tables and charts of
//!   `scripts/day-of-keys` runs.
//! - [`disk`]: `disk`, the machine's own fdatasync latency and its stalls,
//!   with no store in the way.
//! - [`interrupt`]: Ctrl-C and SIGTERM end a run early with a partial report.
//! - [`output`], [`chart`], [`progress`]: tables, JSON, SVG, progress bar.
//! - [`targets`]: the performance targets of BENCHMARKS.md, checked against what a run measured.

pub mod chart;
pub mod cli;
pub mod commands;
pub mod compare;
pub mod day_report;
pub mod disk;
pub mod engine;
pub mod http_mode;
pub mod intent;
pub mod interrupt;
pub mod machine;
pub mod output;
pub mod placement;
pub mod preload;
pub mod progress;
pub mod ramp;
pub mod recorder;
pub mod report;
pub mod schedule;
pub mod store_mode;
pub mod store_server;
pub mod targets;
