//! `idem-bench`: see `idem-bench --help` and BENCHMARKS.md.

use bench::cli::Cli;
use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("idem-bench: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let code = runtime.block_on(bench::commands::run(cli));
    // Spawned servers and detached client tasks end with the runtime.
    runtime.shutdown_timeout(std::time::Duration::from_secs(2));
    code
}
