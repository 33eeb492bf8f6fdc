//! `idem-bench`: see `idem-bench --help` and BENCHMARKS.md.

use bench::cli::Cli;
use clap::Parser;
use std::process::ExitCode;

/// mimalloc instead of glibc's malloc, as in the server: the client
/// allocates and frees many small buffers on several threads, and in a
/// collapsed PostgreSQL run about a sixth of the bench's CPU went to glibc's
/// allocator (BENCHMARKS.md, "Workers in front of PostgreSQL"). On a 2-core
/// machine the bench shares with what it measures, its CPU is theirs.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
