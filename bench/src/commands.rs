//! The three commands: `store`, `http` and `compare`.

use crate::cli::{Cli, Command, CompareArgs, CompareMode, OutputArgs, StoreArgs};
use crate::engine::PlanError;
use crate::http_mode::{self, HttpError, HttpReport, HttpRun};
use crate::output::{OutputError, Report, Unavailable};
use crate::store_mode::run::StoreReport;
use crate::store_mode::run::{StoreRunSettings, bench_target};
use crate::store_mode::{self, TargetError};
use server::backend::StoreKind;
use std::process::ExitCode;
use store_core::Policy;

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
}

pub async fn run(cli: Cli) -> ExitCode {
    let result = match cli.command {
        Command::Store(args) => store(args).await,
        Command::Http(args) => http(args).await,
        Command::Compare(args) => compare(args).await,
    };
    match result {
        Ok(code) => code,
        Err(error) => {
            eprintln!("idem-bench: {error}");
            ExitCode::from(EXIT_ERROR)
        }
    }
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
    for backend in &args.backends {
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
            for backend in &args.backends {
                match compare_store(&args, *backend, seed).await? {
                    Ok(store) => report.store.push(store),
                    Err(unavailable) => report.unavailable.push(unavailable),
                }
            }
            true
        }
        CompareMode::Http => {
            let mut passed = true;
            for backend in &args.backends {
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

/// Prints the tables and writes the JSON report and the chart.
fn finish(report: &mut Report, output: &OutputArgs) -> Result<(), BenchError> {
    report.check_targets();
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
