//! The real `server` binary as a child process: started with a config in
//! its environment, killed with SIGKILL (a crash) or stopped with SIGTERM.
//!
//! `cargo test` builds the binary with this crate's `failpoints` feature
//! (the dev-dependency on the crate itself turns it on), so a process
//! started with `FAILPOINTS=label.after_carrier=return` parks the request
//! at that step and says so on stderr; [`ServerProcess::wait_for_failpoint`]
//! reads that line, and the test then kills the process there.

use server::failpoints::{FAILPOINTS_VARIABLE, REACHED_MARKER};
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

/// Longest wait for a process to say where it listens.
pub const STARTUP_MS_MAX: u64 = 30_000;
/// Lines of a process's output kept for failure messages.
const LOG_LINES_MAX: usize = 400;

pub struct ServerProcess {
    child: Child,
    pub url: String,
    failpoints_reached: mpsc::UnboundedReceiver<String>,
    log: Arc<Mutex<Vec<String>>>,
}

impl ServerProcess {
    /// Runs `server ARGS` with `env` in `dir`, optionally with `FAILPOINTS`,
    /// and waits for its "listening on http://..." line.
    pub async fn start(args: &[&str], env: &[(String, String)], failpoints: Option<&str>, dir: &Path) -> Self {
        let mut command = Command::new(env!("CARGO_BIN_EXE_server"));
        command
            .args(args)
            .current_dir(dir)
            .env_remove("RUST_LOG")
            .env_remove(FAILPOINTS_VARIABLE)
            .env("IDEM__LOG__LEVEL", "warn,server=info")
            .envs(env.iter().map(|(name, value)| (name, value)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        if let Some(failpoints) = failpoints {
            command.env(FAILPOINTS_VARIABLE, failpoints);
        }
        let mut child = command.spawn().expect("spawn the server binary");
        let log = Arc::new(Mutex::new(Vec::new()));
        let (url_sender, url_receiver) = mpsc::unbounded_channel();
        let (failpoint_sender, failpoints_reached) = mpsc::unbounded_channel();
        let stdout = child.stdout.take().expect("stdout");
        let stderr = child.stderr.take().expect("stderr");
        tokio::spawn(read_lines(stdout, log.clone(), url_sender, failpoint_sender.clone()));
        tokio::spawn(read_lines(
            stderr,
            log.clone(),
            mpsc::unbounded_channel().0,
            failpoint_sender,
        ));
        let mut url_receiver = url_receiver;
        let url = tokio::time::timeout(Duration::from_millis(STARTUP_MS_MAX), url_receiver.recv())
            .await
            .ok()
            .flatten()
            .unwrap_or_else(|| panic!("the server did not say where it listens; its log:\n{}", log_text(&log)));
        Self {
            child,
            url,
            failpoints_reached,
            log,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id().expect("the process runs")
    }

    /// The name of the next failpoint a request parked at, if one did within `wait`.
    pub async fn wait_for_failpoint(&mut self, wait: Duration) -> Option<String> {
        tokio::time::timeout(wait, self.failpoints_reached.recv())
            .await
            .ok()
            .flatten()
    }

    /// SIGKILL: nothing is flushed, nothing runs after it.
    pub async fn kill(mut self) {
        self.child.kill().await.expect("SIGKILL the server");
    }

    /// SIGTERM, then the exit status (a clean stop flushes the store).
    pub async fn terminate(mut self) -> std::process::ExitStatus {
        let status = std::process::Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status()
            .expect("kill -TERM");
        assert!(status.success());
        tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .expect("the server stops after SIGTERM")
            .expect("exit status")
    }

    pub fn log(&self) -> String {
        log_text(&self.log)
    }

    /// The process's resident set size (VmRSS), in KiB.
    pub fn resident_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).expect("read /proc/PID/status");
        status
            .lines()
            .find_map(|line| line.strip_prefix("VmRSS:"))
            .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS in /proc/PID/status")
    }
}

fn log_text(log: &Mutex<Vec<String>>) -> String {
    log.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).join("\n")
}

async fn read_lines(
    stream: impl tokio::io::AsyncRead + Unpin,
    log: Arc<Mutex<Vec<String>>>,
    url: mpsc::UnboundedSender<String>,
    failpoints: mpsc::UnboundedSender<String>,
) {
    let mut lines = BufReader::new(stream).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        if let Some(at) = line.find("listening on http://") {
            let _ = url.send(line[at + "listening on ".len()..].trim().to_owned());
        }
        if let Some(name) = line.strip_prefix(REACHED_MARKER) {
            let _ = failpoints.send(name.trim().to_owned());
        }
        let mut log = log.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if log.len() < LOG_LINES_MAX {
            log.push(line);
        }
    }
}
