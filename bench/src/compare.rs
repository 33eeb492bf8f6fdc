//! `compare --mode full`: every backend through the whole published set in
//! one run (BENCHMARKS.md), and one table of it.
//!
//! Per backend, in order: store mode against its raw baseline (the ratio),
//! http at `--rate` for `--duration-s` (the peak row), a ramp for the
//! capacity (the highest rate whose p99 stayed within `--slo-p99-ms` with
//! the rate achieved), and the overload profile (1x, 2x, 3x, 1x) of that
//! capacity. Every run spawns its own Label service and store. Before each
//! run the machine is let settle (the 1-minute load below `--settle-load`,
//! waiting at most `--settle-s-max`): a run right after another inherits its
//! load, which is the earlier run's result, not this one's. The load before
//! and after each run is in the report.

use crate::cli::CompareArgs;
use crate::commands::{BenchError, compare_http, compare_store};
use crate::http_mode::{HttpReport, HttpRun};
use crate::interrupt;
use crate::output::{Report, RunLoad, Unavailable};
use crate::report::{Table, ms, rate};
use crate::store_mode::run::StoreReport;
use std::time::{Duration, Instant};
use store_registry::StoreKind;

/// The default of `--settle-load`: what `scripts/bench-quiet` waited for.
pub const SETTLE_LOAD_DEFAULT: f64 = 0.5;
/// The default of `--settle-s-max`.
pub const SETTLE_S_MAX_DEFAULT: u64 = 300;
/// How often the load is read while settling.
const SETTLE_POLL_MS: u64 = 5_000;

/// The four kinds of run, as named in the report's loads.
const RUN_STORE: &str = "store";
const RUN_PEAK: &str = "http";
const RUN_RAMP: &str = "ramp";
const RUN_OVERLOAD: &str = "overload";

/// The 1-minute load average, if the kernel tells it.
pub fn load_1m() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Waits until the load is below `below` or `wait_max` has passed.
async fn settle(below: f64, wait_max: Duration) {
    let started = Instant::now();
    while load_1m().is_some_and(|load| load >= below) && started.elapsed() < wait_max && !interrupt::requested() {
        tokio::time::sleep(Duration::from_millis(SETTLE_POLL_MS)).await;
    }
}

/// One run between two load readings, recorded in the report.
async fn measured<T, F: Future<Output = T>>(report: &mut Report, args: &CompareArgs, name: String, run: F) -> T {
    settle(args.settle_load, Duration::from_secs(args.settle_s_max)).await;
    let before_1m = load_1m();
    let started_at = crate::machine::iso_utc(std::time::SystemTime::now());
    let output = run.await;
    report.run_loads.push(RunLoad {
        run: name,
        started_at,
        before_1m,
        after_1m: load_1m(),
    });
    output
}

fn run_name(kind: &str, backend: StoreKind) -> String {
    format!("{kind} {}", backend.name())
}

/// Runs the whole set against every backend. Returns whether every audit passed.
pub async fn full(args: &CompareArgs, seed: u64, report: &mut Report) -> Result<bool, BenchError> {
    let mut passed = true;
    for backend in args.backends.iter().copied() {
        if interrupt::requested() {
            break;
        }
        let store = measured(
            report,
            args,
            run_name(RUN_STORE, backend),
            compare_store(args, backend, seed),
        )
        .await?;
        if !kept(report, store, |report, store| report.store.push(store)) {
            continue;
        }
        let peak = HttpRun::for_compare(args, backend, seed);
        let Some(peak) = http_run(report, args, RUN_PEAK, backend, peak).await? else {
            continue;
        };
        keep_http(report, &mut passed, peak);
        let mut ramp = HttpRun::for_compare(args, backend, seed);
        ramp.ramp = Some(args.load.ramp_settings());
        let Some(ramp) = http_run(report, args, RUN_RAMP, backend, ramp).await? else {
            continue;
        };
        let capacity = capacity_of(&ramp, args);
        keep_http(report, &mut passed, ramp);
        let mut overload = HttpRun::for_compare(args, backend, seed);
        overload.plan.rate_per_s = capacity;
        overload.phases = Some((
            crate::http_mode::overload::overload_phases(Duration::from_secs(args.phase_s)),
            false,
        ));
        if let Some(overload) = http_run(report, args, RUN_OVERLOAD, backend, overload).await? {
            keep_http(report, &mut passed, overload);
        }
    }
    Ok(passed)
}

fn keep_http(report: &mut Report, passed: &mut bool, http: HttpReport) {
    *passed &= http.audit.passed;
    report.http.push(http);
}

/// Keeps a run's report, or the backend's unavailability; true when it ran.
fn kept<T>(report: &mut Report, ran: Result<T, Unavailable>, keep: impl FnOnce(&mut Report, T)) -> bool {
    match ran {
        Ok(value) => {
            keep(report, value);
            true
        }
        Err(unavailable) => {
            report.unavailable.push(unavailable);
            false
        }
    }
}

/// The overload profile's 1x: `--overload-rate`, else the ramp's capacity,
/// or its first rate when not even that held (the table says which).
fn capacity_of(ramp: &HttpReport, args: &CompareArgs) -> f64 {
    let found = ramp.ramp.as_ref().and_then(|ramp| ramp.highest_held_per_s);
    args.overload_rate.or(found).unwrap_or(args.load.ramp_start)
}

/// One http run between two load readings; `None` (the backend reported
/// unavailable) when its Label service could not start here.
async fn http_run(
    report: &mut Report,
    args: &CompareArgs,
    kind: &str,
    backend: StoreKind,
    run: HttpRun,
) -> Result<Option<HttpReport>, BenchError> {
    // Interrupted: no new Label service is started for a run that would stop at once.
    if interrupt::requested() {
        return Ok(None);
    }
    let ran = measured(report, args, run_name(kind, backend), compare_http(&run, backend)).await?;
    let mut http = None;
    kept(report, ran, |_, ran| http = Some(ran));
    Ok(http)
}

/// The one table of a full comparison: a row per backend, then the
/// overload phases of every backend, then the load around each run.
pub fn render_summary(report: &Report) -> String {
    let backends: Vec<&str> = report.store.iter().map(|store| store.backend.as_str()).collect();
    if backends.is_empty() || !report.http.iter().any(|http| http.overload.is_some()) {
        return String::new();
    }
    let mut table = Table::new(&[
        "backend",
        "store intents/s : raw/s",
        "capacity (ramp)",
        "peak: achieved",
        "p50",
        "p99",
        "p99.9",
        "lost",
        "dup",
        "RSS MiB",
        "service ms/intent",
    ]);
    let mut phases = Table::new(&[
        "backend",
        "phase",
        "offered/s",
        "goodput/s",
        "of capacity",
        "admitted p99",
        "shed",
        "unsent",
        "lost",
        "dup",
    ]);
    let mut recoveries = Vec::new();
    for backend in backends {
        let of_backend = |http: &&HttpReport| http.store_kind == backend;
        let peak = report
            .http
            .iter()
            .filter(of_backend)
            .find(|http| http.open_loop.is_some());
        let ramp = report
            .http
            .iter()
            .filter(of_backend)
            .find_map(|http| http.ramp.as_ref());
        let overload = report
            .http
            .iter()
            .filter(of_backend)
            .find_map(|http| http.overload.as_ref());
        let store = report.store.iter().find(|store| store.backend == backend);
        let mut row = vec![backend.to_owned(), store.map(store_ratio).unwrap_or_default()];
        row.push(match (ramp.and_then(|ramp| ramp.highest_held_per_s), ramp) {
            (Some(held), _) => format!("{}/s", rate(held)),
            (None, Some(ramp)) => format!("< {}/s, the first step", rate(ramp.settings.start_per_s)),
            (None, None) => String::new(),
        });
        row.extend(peak.map(peak_cells).unwrap_or_else(|| vec![String::new(); 8]));
        table.row(row);
        if let Some(overload) = overload {
            for phase in &overload.phases {
                phases.row(vec![
                    backend.to_owned(),
                    format!("{}x", phase.multiplier),
                    rate(phase.offered_per_s),
                    rate(phase.goodput_per_s),
                    format!("{:.0}%", phase.goodput_share_of_capacity * 100.0),
                    ms(phase.admitted_p99_ms),
                    phase.shed_attempts.to_string(),
                    phase.unsent_attempts.to_string(),
                    phase.lost.to_string(),
                    phase.duplicated.to_string(),
                ]);
            }
            recoveries.push(match overload.recovery_s {
                Some(seconds) => format!("{backend}: {seconds} s"),
                None => format!("{backend}: not within the last phase"),
            });
        }
    }
    let mut loads = Table::new(&["run", "started", "load before", "load after"]);
    for load in &report.run_loads {
        let shown = |value: Option<f64>| value.map(|load| format!("{load:.2}")).unwrap_or_default();
        loads.row(vec![
            load.run.clone(),
            load.started_at.clone(),
            shown(load.before_1m),
            shown(load.after_1m),
        ]);
    }
    format!(
        "\nthe whole set, one run (compare --mode full):\n{}\noverload phases (1x = --overload-rate, else the capacity the ramp found, else its first step):\n{}back to p99 <= SLO after the overload: {}\n\nthe machine's 1-minute load around each run:\n{}",
        table.render(),
        phases.render(),
        recoveries.join(", "),
        loads.render()
    )
}

fn store_ratio(store: &StoreReport) -> String {
    match (&store.saturation, &store.baseline, store.ratio_to_baseline) {
        (Some(intents), Some(baseline), Some(ratio)) => format!(
            "{} : {} ({:.0}%)",
            rate(intents.achieved_rate_per_s),
            rate(baseline.summary.achieved_rate_per_s),
            ratio * 100.0
        ),
        _ => "no baseline".to_owned(),
    }
}

fn peak_cells(http: &HttpReport) -> Vec<String> {
    let Some(run) = &http.open_loop else {
        return vec![String::new(); 8];
    };
    let service = http
        .cpu
        .iter()
        .find(|process| process.process == "label service")
        .map(|process| format!("{:.2}", process.ms_per_intent))
        .unwrap_or_default();
    vec![
        format!(
            "{}/s of {}/s",
            rate(run.achieved_rate_per_s),
            rate(run.offered_rate_per_s.unwrap_or(0.0))
        ),
        ms(run.latency.p50_ms),
        ms(run.latency.p99_ms),
        ms(run.latency.p999_ms),
        http.audit.lost.to_string(),
        http.audit.duplicate_labels.to_string(),
        http.server_peak_rss_mib
            .map(|peak| format!("{peak:.1}"))
            .unwrap_or_default(),
        service,
    ]
}
