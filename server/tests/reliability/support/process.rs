//! The real `server` binary as a child process, through test-support's
//! harness: started with a config in its environment, killed with SIGKILL
//! (a crash) or stopped with SIGTERM.
//!
//! `cargo test` builds the binary with this crate's `failpoints` feature
//! (the dev-dependency on the crate itself turns it on), so a process
//! started with `FAILPOINTS=label.after_carrier=return` parks the request
//! at that step and says so on stderr;
//! [`ServerProcess::wait_for_marked_line`] reads that line, and the test
//! then kills the process there.

use server::failpoints::{FAILPOINTS_VARIABLE, REACHED_MARKER};
use std::path::Path;
pub use test_support::process::ServerProcess;
use test_support::process::{ProcessSpec, pair};

/// The carrier simulator as a process of its own (it outlives the
/// service's crashes and restarts), on a port of its choosing, answering
/// after `latency_ms` (min, max) and dropping `lost_reply_rate` of its
/// replies after selling.
pub async fn start_carrier(latency_ms: (u64, u64), lost_reply_rate: f64, dir: &Path) -> ServerProcess {
    let env = [
        pair("IDEM__CARRIER__SIMULATOR__LATENCY_MS_MIN", latency_ms.0),
        pair("IDEM__CARRIER__SIMULATOR__LATENCY_MS_MAX", latency_ms.1),
        pair("IDEM__CARRIER__SIMULATOR__LOST_REPLY_RATE", lost_reply_rate),
    ];
    start_server(&["carrier", "--listen", "127.0.0.1:0"], &env, None, dir).await
}

/// Runs `server ARGS` with `env` in `dir`, optionally with `FAILPOINTS`,
/// and waits for its "listening on http://..." line.
pub async fn start_server(
    args: &[&str],
    env: &[(String, String)],
    failpoints: Option<&str>,
    dir: &Path,
) -> ServerProcess {
    let mut spec = ProcessSpec::new(env!("CARGO_BIN_EXE_server"), args, dir)
        .env([("IDEM__LOG__LEVEL", "warn,server=info")])
        .env(env.iter().cloned());
    spec.env_removed.push(FAILPOINTS_VARIABLE.to_owned());
    spec.line_marker = Some(REACHED_MARKER.to_owned());
    if let Some(failpoints) = failpoints {
        spec = spec.env([(FAILPOINTS_VARIABLE, failpoints)]);
    }
    ServerProcess::start(spec)
        .await
        .unwrap_or_else(|error| panic!("the server process: {error}"))
}
