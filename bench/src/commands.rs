//! The commands: `store`, `http`, `compare`, `preload`, `chart`,
//! `store-server`, `day-report` and `disk`.

use crate::cli::{ChartArgs, Cli, Command, CompareArgs, CompareMode, OutputArgs, StoreArgs};
use crate::engine::PlanError;
use crate::http_mode::{self, HttpError, HttpReport, HttpRun};
use crate::interrupt;
use crate::output::{OutputError, Report, Unavailable};
use crate::store_mode::run::StoreReport;
use crate::store_mode::run::{StoreRunSettings, bench_target};
use crate::store_mode::{self, TargetError};
use std::process::ExitCode;
use std::sync::OnceLock;
use store_core::Policy;
use store_registry::StoreKind;

/// Exit status when the benchmark could not run.
pub const EXIT_ERROR: u8 = 1;
/// Exit status when an http run's audit found a duplicate or lost intent
/// (or could not check for them).
pub const EXIT_AUDIT_FAILED: u8 = 2;

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error(transparent)]
    Target(#[from] TargetError),
    #[error(transparent)]
    Output(#[from] OutputError),
    #[error(transparent)]
    Http(#[from] HttpError),
    #[error(transparent)]
    Preload(#[from] crate::preload::PreloadError),
    #[error(transparent)]
    StoreServer(#[from] crate::store_server::StoreServerError),
    #[error(transparent)]
    DayReport(#[from] crate::day_report::DayReportError),
    #[error(transparent)]
    Disk(#[from] crate::disk::DiskProbeError),
}

/// Runs one command. A SIGINT or SIGTERM ends it early with a partial
/// report and the signal's exit status (130 or 143); see [`interrupt`].
pub async fn run(cli: Cli) -> ExitCode {
    if let Err(error) = interrupt::listen() {
        eprintln!("idem-bench: cannot listen for Ctrl-C and SIGTERM: {error}");
        return ExitCode::from(EXIT_ERROR);
    }
    warn_of_leftover_services();
    let result = match cli.command {
        Command::Store(args) => store(args).await,
        Command::Http(args) => http(args).await,
        Command::Compare(args) => compare(args).await,
        Command::Preload(args) => preload(args).await,
        Command::Chart(args) => chart(&args),
        Command::StoreServer(args) => crate::store_server::run(&args)
            .await
            .map(|()| ExitCode::SUCCESS)
            .map_err(BenchError::from),
        Command::DayReport(args) => day_report(&args),
        Command::Disk(args) => disk(&args).await,
    };
    match (result, interrupt::global().interruption()) {
        (Ok(_), Some(interruption)) => ExitCode::from(interruption.signal.exit_code()),
        (Ok(code), None) => code,
        (Err(error), _) => {
            eprintln!("idem-bench: {}", with_causes(&error));
            ExitCode::from(EXIT_ERROR)
        }
    }
}

/// An error's message and every cause it does not show already: a store
/// error's own message is short ("transaction failed"), and what failed
/// (FoundationDB's error name and code) is in its source.
fn with_causes(error: &dyn std::error::Error) -> String {
    let mut line = error.to_string();
    let mut cause = error.source();
    while let Some(next) = cause {
        let text = next.to_string();
        if !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        cause = next.source();
    }
    line
}

/// Services an earlier run spawned and left running share this machine's
/// cores with the one about to be measured: said before the run starts
/// and again in the report.
fn warn_of_leftover_services() {
    for warning in leftover_service_warnings() {
        eprintln!("idem-bench: warning: {warning}");
    }
}

/// What the machine held when the command started (looked at once).
fn leftover_service_warnings() -> &'static [String] {
    static WARNINGS: OnceLock<Vec<String>> = OnceLock::new();
    WARNINGS.get_or_init(http_mode::spawn::leftover_service_warnings)
}

fn store_settings(args: &StoreArgs, seed: u64) -> StoreRunSettings {
    StoreRunSettings {
        load: args.load.plan(seed, !args.output.quiet),
        ramp: args.load.ramp(),
        saturation: args.saturation.settings(args.load.warmup_s),
        baseline: !args.saturation.no_baseline,
    }
}

async fn store(args: StoreArgs) -> Result<ExitCode, BenchError> {
    let seed = args.load.seed();
    let mut report = Report::new(seed);
    let settings = store_settings(&args, seed);
    for backend in args.backends.iter().take_while(|_| !interrupt::requested()) {
        let target = store_mode::prepare(*backend, &args.backend, Policy::default()).await?;
        announce(&target.backend, &target.notes);
        report.store.push(bench_target(&target, &settings).await?);
    }
    finish(&mut report, &args.output)?;
    Ok(ExitCode::SUCCESS)
}

async fn http(args: http_mode::cli::HttpArgs) -> Result<ExitCode, BenchError> {
    let seed = args.load.seed();
    let mut report = Report::new(seed);
    let run = HttpRun::from_args(&args, seed);
    let http_report = http_mode::run(&run).await?;
    let passed = http_report.audit.passed;
    report.http.push(http_report);
    finish(&mut report, &args.output)?;
    Ok(exit_for_audit(passed))
}

/// Fills one store; prints the summary and writes the JSON report (the
/// report's `preload`).
/// Draws saved reports again: a chart for a run that was made without
/// `--chart`, or several runs in one picture. Each run is named after its
/// report's file when there are several.
fn chart(args: &ChartArgs) -> Result<ExitCode, BenchError> {
    let reports = args
        .reports
        .iter()
        .map(|path| Ok((path, Report::read_json(path)?)))
        .collect::<Result<Vec<_>, OutputError>>()?;
    let several = reports.len() > 1;
    let mut runs = Vec::new();
    for (path, report) in &reports {
        let file_name = path.file_stem().map(|stem| stem.to_string_lossy()).unwrap_or_default();
        for (name, run) in report.charted_runs() {
            let name = if several { format!("{file_name}: {name}") } else { name };
            runs.push((name, run));
        }
    }
    crate::chart::write_svg(&args.out, &runs).map_err(OutputError::from)?;
    eprintln!("chart written to {}", args.out.display());
    Ok(ExitCode::SUCCESS)
}

async fn preload(args: crate::preload::PreloadArgs) -> Result<ExitCode, BenchError> {
    let seed = args.seed.unwrap_or_else(rand::random);
    let mut report = Report::new(seed);
    let preloaded = crate::preload::run(&args, seed).await?;
    println!("{}", crate::preload::render(&preloaded));
    report.preload = Some(preloaded);
    report.interrupted = interrupt::global().interruption();
    report.warnings = leftover_service_warnings().to_vec();
    if let Some(path) = &args.json {
        report.write_json(path)?;
        eprintln!("report written to {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// Prints the report of day-of-keys folders (its charts are written into them).
fn day_report(args: &crate::day_report::DayReportArgs) -> Result<ExitCode, BenchError> {
    print!("{}", crate::day_report::run(args)?);
    Ok(ExitCode::SUCCESS)
}

/// Probes the disk; prints the figures and writes the JSON report.
async fn disk(args: &crate::disk::DiskArgs) -> Result<ExitCode, BenchError> {
    let mut report = crate::disk::run(args).await?;
    report.interrupted = interrupt::global().interruption();
    report.warnings = leftover_service_warnings().to_vec();
    print!("{}", crate::disk::render(&report));
    if let Some(path) = &args.json {
        report.write_json(path)?;
        eprintln!("report written to {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}

fn exit_for_audit(passed: bool) -> ExitCode {
    if passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_AUDIT_FAILED)
    }
}

/// The same workload against each backend; one that cannot start here is
/// reported as unavailable, not as an error.
async fn compare(args: CompareArgs) -> Result<ExitCode, BenchError> {
    let seed = args.load.seed();
    let mut report = Report::new(seed);
    let passed = match args.mode {
        CompareMode::Full => crate::compare::full(&args, seed, &mut report).await?,
        CompareMode::Store => {
            for backend in args.backends.iter().take_while(|_| !interrupt::requested()) {
                match compare_store(&args, *backend, seed).await? {
                    Ok(store) => report.store.push(store),
                    Err(unavailable) => report.unavailable.push(unavailable),
                }
            }
            true
        }
        CompareMode::Http => {
            let mut passed = true;
            for backend in args.backends.iter().take_while(|_| !interrupt::requested()) {
                match compare_http(&HttpRun::for_compare(&args, *backend, seed), *backend).await? {
                    Ok(http) => {
                        passed &= http.audit.passed;
                        report.http.push(http);
                    }
                    Err(unavailable) => report.unavailable.push(unavailable),
                }
            }
            passed
        }
    };
    finish(&mut report, &args.output)?;
    Ok(exit_for_audit(passed))
}

/// One backend in store mode, as `compare` runs it: `Err` when this machine
/// cannot start it.
pub(crate) async fn compare_store(
    args: &CompareArgs,
    backend: StoreKind,
    seed: u64,
) -> Result<Result<StoreReport, Unavailable>, BenchError> {
    let store_args = StoreArgs {
        backends: vec![backend],
        load: args.load.clone(),
        saturation: args.saturation.clone(),
        backend: args.backend.clone(),
        output: args.output.clone(),
    };
    match store_mode::prepare(backend, &args.backend, Policy::default()).await {
        Ok(target) => {
            announce(&target.backend, &target.notes);
            Ok(Ok(bench_target(&target, &store_settings(&store_args, seed)).await?))
        }
        Err(error) => Ok(Err(unavailable(backend.name(), &error))),
    }
}

/// One http run of `compare`: `Err` when its Label service cannot start here.
pub(crate) async fn compare_http(
    run: &HttpRun,
    backend: StoreKind,
) -> Result<Result<HttpReport, Unavailable>, BenchError> {
    match http_mode::run(run).await {
        Ok(http) => Ok(Ok(http)),
        Err(error @ HttpError::Spawn(_)) => Ok(Err(unavailable(backend.name(), &error))),
        Err(error) => Err(error.into()),
    }
}

fn unavailable(backend: &str, error: &dyn std::fmt::Display) -> Unavailable {
    eprintln!("{backend}: unavailable: {error}");
    Unavailable {
        backend: backend.to_owned(),
        reason: error.to_string(),
    }
}

fn announce(backend: &str, notes: &[String]) {
    eprintln!("{backend}: {}", notes.join("; "));
}

/// Prints the tables and writes the JSON report and the chart; an
/// interrupted run's are marked as partial.
fn finish(report: &mut Report, output: &OutputArgs) -> Result<(), BenchError> {
    report.interrupted = interrupt::global().interruption();
    report.warnings = leftover_service_warnings().to_vec();
    // A partial run says nothing about the targets.
    if report.interrupted.is_none() {
        report.check_targets();
    }
    println!("{}", report.render_tables());
    if let Some(path) = &output.json {
        report.write_json(path)?;
        eprintln!("report written to {}", path.display());
    }
    if let Some(path) = &output.chart {
        report.write_chart(path)?;
        eprintln!("chart written to {}", path.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("fdb 1031: transaction timed out")]
    struct Engine;

    #[derive(Debug, thiserror::Error)]
    #[error("store unavailable: transaction failed")]
    struct Store(#[source] Engine);

    #[derive(Debug, thiserror::Error)]
    #[error("writing a batch failed: {0}")]
    struct Batch(#[source] Store);

    #[test]
    fn an_error_shows_the_causes_its_message_leaves_out_once() {
        assert_eq!(
            with_causes(&Batch(Store(Engine))),
            "writing a batch failed: store unavailable: transaction failed: fdb 1031: transaction timed out"
        );
    }
}
