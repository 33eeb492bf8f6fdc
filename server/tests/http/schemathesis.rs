//! Schemathesis, a schema-driven API tester, against the real `server`
//! binary: it reads `/openapi.json`, generates requests from it (examples,
//! boundary values, random and schema-violating data, then sequences that
//! follow the document's links), and checks every answer against the
//! document. Any disagreement fails this test, with Schemathesis's report.
//!
//! Configuration: `server/schemathesis.toml` (every check on; the statuses
//! the document allows for a schema-valid request under a reused key) and
//! `server/schemathesis_hooks.py` (a fresh value for every valid generated
//! key, so bodies are validated rather than refused as a reused key's).
//! Bounded here: examples per operation and a time budget, so a run takes
//! about a minute on two cores. `IDEM_SCHEMATHESIS_SEED` replays another
//! seed (every report prints the one it used).

use std::path::Path;
use std::time::Duration;
use tokio::process::Command;

/// The CLI of PyPI's `schemathesis` 4 (scripts/test installs it).
const SCHEMATHESIS_PROGRAM: &str = "schemathesis";
/// Test cases per operation and phase.
const EXAMPLES_PER_OPERATION_MAX: u32 = 30;
/// Schemathesis's budget for the whole run; fuzzing and the stateful phase
/// repeat until it is spent.
const RUN_S_MAX: u64 = 45;
/// Longest wait for Schemathesis to exit: its budget, its set-up and
/// shrinking a failure it found.
const EXIT_S_MAX: u64 = RUN_S_MAX + 120;
/// The seed unless `IDEM_SCHEMATHESIS_SEED` says another.
const SEED_DEFAULT: u64 = 1;

/// Lines of the server's log shown with a failure.
const LOG_TAIL_LINES: usize = 40;

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

fn installed_version() -> Option<String> {
    let output = std::process::Command::new(SCHEMATHESIS_PROGRAM)
        .arg("--version")
        .output()
        .ok()?;
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemathesis_finds_no_answer_the_document_does_not_allow() {
    let Some(version) = installed_version() else {
        panic!(
            "`{SCHEMATHESIS_PROGRAM}` is not installed, so the API contract cannot be checked. \
             Run scripts/test (it installs it), or: python3 -m pip install 'schemathesis>=4,<5' \
             (add --break-system-packages on Debian's Python)"
        );
    };
    assert!(version.contains("4."), "Schemathesis 4 is expected, found {version}");
    let seed = std::env::var("IDEM_SCHEMATHESIS_SEED").unwrap_or_else(|_| SEED_DEFAULT.to_string());
    let dir = tempfile::tempdir().unwrap();
    let env = [("IDEM__SERVER__LISTEN", "127.0.0.1:0".to_owned())];
    let server = crate::process::start(&[], &env, dir.path()).await;
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut command = Command::new(SCHEMATHESIS_PROGRAM);
    command
        .env("SCHEMATHESIS_HOOKS", manifest.join("schemathesis_hooks.py"))
        .arg("--config-file")
        .arg(manifest.join("schemathesis.toml"))
        .arg("--no-color")
        .arg("run")
        .arg(format!("{}/openapi.json", server.url))
        .args(["--max-examples", &EXAMPLES_PER_OPERATION_MAX.to_string()])
        .args(["--max-time", &RUN_S_MAX.to_string()])
        .args(["--seed", &seed])
        .current_dir(dir.path())
        .kill_on_drop(true);
    let output = tokio::time::timeout(Duration::from_secs(EXIT_S_MAX), command.output())
        .await
        .unwrap_or_else(|_| panic!("Schemathesis ran longer than {EXIT_S_MAX} s"))
        .expect("Schemathesis runs");
    let said = String::from_utf8_lossy(&output.stdout).into_owned() + &String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "Schemathesis ({version}, seed {seed}) found answers the document does not allow:\n{said}\n\
         the server's last log lines:\n{}",
        tail(&server.log(), LOG_TAIL_LINES)
    );
    // Shown with --nocapture: what ran, and how many cases.
    eprintln!("{said}");
    for phase in ["Examples", "Coverage", "Fuzzing", "Stateful"] {
        assert!(
            said.contains(&format!("✅  {phase}")),
            "the {phase} phase ran and passed:\n{said}"
        );
    }
    assert!(
        said.contains("API Links:"),
        "the stateful phase followed links:\n{said}"
    );
    let (status, log) = server.terminate().await;
    assert!(status.success(), "{log}");
}
