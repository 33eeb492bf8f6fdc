//! A server binary as a child process (the Label service, its carrier
//! simulator), for every test harness and the bench's spawner: started with
//! its arguments and environment, its output kept (the last
//! [`LOG_LINES_MAX`] lines) for failure messages, ready once it says where
//! it listens or once a probe URL answers, and stopped by SIGKILL (a
//! crash), SIGTERM (a clean stop) or on drop. It is a [`TiedCommand`]: the
//! kernel kills it when the process that started it ends, even by SIGKILL
//! or a panic that skips every drop.

use crate::child::TiedCommand;
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{ChildStderr, ChildStdout};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// Longest wait for a process to be ready.
pub const STARTUP_MS_MAX: u64 = 30_000;
/// Longest wait for a process to exit after SIGTERM.
pub const STOP_MS_MAX: u64 = 30_000;
/// Lines of a process's output kept (the last ones).
pub const LOG_LINES_MAX: usize = 2_000;
/// Bytes of the end of its log a start-up error shows.
pub const LOG_TAIL_BYTES_MAX: usize = 4_000;
/// Pause between readiness probes, and between exit checks on drop.
const POLL_MS: u64 = 50;
/// Pause between exit checks while waiting for a process to end.
const EXIT_POLL_MS: u64 = 10;
/// Longest one readiness probe waits.
const PROBE_TIMEOUT_MS: u64 = 500;
/// What the server logs once its listener is bound.
const LISTENING_MARKER: &str = "listening on http";

/// When a started process counts as ready.
#[derive(Debug, Clone)]
pub enum Readiness {
    /// It logged "listening on http(s)://ADDRESS": the URL is taken from
    /// that line (a server on port 0 says which port it got). Needs the
    /// server's info-level log.
    ListeningLine,
    /// This URL answers 2xx (a server on a known port, logging at warn).
    Probe(String),
}

/// What happens to the process when its handle is dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnDrop {
    /// SIGKILL (tests: fast, and a crash is what a failed test leaves).
    Kill,
    /// SIGTERM, then SIGKILL after [`STOP_MS_MAX`] (the bench: a clean stop).
    Terminate,
}

/// How to start one process.
#[derive(Debug, Clone)]
pub struct ProcessSpec {
    pub program: PathBuf,
    pub args: Vec<String>,
    /// Set after the variables below are removed, in order.
    pub env: Vec<(String, String)>,
    /// Removed from the inherited environment (RUST_LOG always is).
    pub env_removed: Vec<String>,
    pub dir: PathBuf,
    pub readiness: Readiness,
    /// Lines that start with this are also handed to
    /// [`ServerProcess::wait_for_marked_line`] (a failpoint's "reached" line).
    pub line_marker: Option<String>,
    pub on_drop: OnDrop,
}

impl ProcessSpec {
    /// `program ARGS` in `dir`, ready on its listening line, killed on drop.
    pub fn new(program: impl Into<PathBuf>, args: &[&str], dir: &Path) -> Self {
        Self {
            program: program.into(),
            args: args.iter().map(|arg| (*arg).to_owned()).collect(),
            env: Vec::new(),
            env_removed: Vec::new(),
            dir: dir.to_owned(),
            readiness: Readiness::ListeningLine,
            line_marker: None,
            on_drop: OnDrop::Kill,
        }
    }

    pub fn env<K: ToString, V: ToString>(mut self, pairs: impl IntoIterator<Item = (K, V)>) -> Self {
        self.env.extend(
            pairs
                .into_iter()
                .map(|(name, value)| (name.to_string(), value.to_string())),
        );
        self
    }
}

/// Why a process did not start or stop as asked.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    #[error("could not start {program}: {source}")]
    Spawn { program: String, source: std::io::Error },
    #[error("the process was not ready within {STARTUP_MS_MAX} ms; end of its log:\n{log}")]
    NotReady { log: String },
    #[error("the process exited while starting ({status}); end of its log:\n{log}")]
    Exited { status: String, log: String },
    #[error("the process did not exit within {STOP_MS_MAX} ms")]
    DidNotExit,
    #[error("process I/O: {0}")]
    Io(#[from] std::io::Error),
}

/// A running process.
pub struct ServerProcess {
    child: Child,
    /// Where it serves: from its listening line, or the probe URL's origin.
    pub url: String,
    log: Arc<Mutex<VecDeque<String>>>,
    marked_lines: mpsc::UnboundedReceiver<String>,
    readers: Vec<JoinHandle<()>>,
    on_drop: OnDrop,
}

impl ServerProcess {
    /// Starts the process and waits until it is ready.
    pub async fn start(spec: ProcessSpec) -> Result<Self, ProcessError> {
        let mut tied = TiedCommand::new(&spec.program);
        let command = tied.command();
        command
            .args(&spec.args)
            .current_dir(&spec.dir)
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for name in &spec.env_removed {
            command.env_remove(name);
        }
        command.envs(spec.env.iter().map(|(name, value)| (name, value)));
        let mut child = tied.spawn().map_err(|source| ProcessError::Spawn {
            program: spec.program.display().to_string(),
            source,
        })?;
        // Read on the runtime, as the rest of the harness is async.
        let streams = output_streams(&mut child);
        let mut child = KilledOnDrop(Some(child));
        let (stdout, stderr) = streams?;
        let log = Arc::new(Mutex::new(VecDeque::new()));
        let (url_sender, mut urls) = mpsc::unbounded_channel();
        let (marked_sender, marked_lines) = mpsc::unbounded_channel();
        let lines = LineSinks {
            log: log.clone(),
            urls: url_sender,
            marker: spec.line_marker.clone(),
            marked: marked_sender,
        };
        let readers = vec![
            tokio::spawn(read_lines(stdout, lines.clone())),
            tokio::spawn(read_lines(stderr, lines)),
        ];
        let mut process = Self {
            child: child.0.take().expect("the child was just spawned"),
            url: String::new(),
            log,
            marked_lines,
            readers,
            on_drop: spec.on_drop,
        };
        process.url = match &spec.readiness {
            Readiness::ListeningLine => process.wait_for_listening_line(&mut urls).await?,
            Readiness::Probe(url) => process.wait_for_probe(url).await?,
        };
        Ok(process)
    }

    async fn wait_for_listening_line(
        &mut self,
        urls: &mut mpsc::UnboundedReceiver<String>,
    ) -> Result<String, ProcessError> {
        match tokio::time::timeout(Duration::from_millis(STARTUP_MS_MAX), urls.recv()).await {
            Ok(Some(url)) => Ok(url),
            // Output closed without the line: the process ended.
            Ok(None) => Err(self.exited_while_starting().await),
            Err(_) => Err(ProcessError::NotReady {
                log: self.log_tail(LOG_TAIL_BYTES_MAX),
            }),
        }
    }

    async fn wait_for_probe(&mut self, url: &str) -> Result<String, ProcessError> {
        let client = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_millis(STARTUP_MS_MAX);
        while Instant::now() < deadline {
            if self.child.try_wait()?.is_some() {
                return Err(self.exited_while_starting().await);
            }
            let probe = client
                .get(url)
                .timeout(Duration::from_millis(PROBE_TIMEOUT_MS))
                .send()
                .await;
            if probe.is_ok_and(|response| response.status().is_success()) {
                return Ok(origin(url));
            }
            tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
        }
        Err(ProcessError::NotReady {
            log: self.log_tail(LOG_TAIL_BYTES_MAX),
        })
    }

    async fn exited_while_starting(&mut self) -> ProcessError {
        let status = match self.wait_for_exit().await {
            Ok(status) => status.to_string(),
            Err(error) => error.to_string(),
        };
        self.drain_output().await;
        ProcessError::Exited {
            status,
            log: self.log_tail(LOG_TAIL_BYTES_MAX),
        }
    }

    /// Waits for the output readers, which end when the process's output
    /// closes, so the log holds every line.
    async fn drain_output(&mut self) {
        for reader in self.readers.drain(..) {
            let _ = reader.await;
        }
    }

    /// Its process id; always known, as the handle owns the child until
    /// it is dropped (no other waiter can collect it and free the id).
    pub fn pid(&self) -> Option<u32> {
        Some(self.child.id())
    }

    /// Waits, without blocking the runtime, until the process has exited
    /// (at most [`STOP_MS_MAX`]).
    async fn wait_for_exit(&mut self) -> Result<ExitStatus, ProcessError> {
        let deadline = Instant::now() + Duration::from_millis(STOP_MS_MAX);
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status);
            }
            if Instant::now() >= deadline {
                return Err(ProcessError::DidNotExit);
            }
            tokio::time::sleep(Duration::from_millis(EXIT_POLL_MS)).await;
        }
    }

    /// The next line that started with the spec's `line_marker`, without
    /// the marker, if one came within `wait`.
    pub async fn wait_for_marked_line(&mut self, wait: Duration) -> Option<String> {
        tokio::time::timeout(wait, self.marked_lines.recv())
            .await
            .ok()
            .flatten()
    }

    /// SIGKILL: nothing is flushed, nothing runs after it.
    pub async fn kill(mut self) {
        self.child.kill().expect("SIGKILL the process");
        self.wait_for_exit().await.expect("the process exits after SIGKILL");
    }

    /// SIGTERM, then the exit status and the whole log (a clean stop
    /// flushes the store).
    pub async fn terminate(mut self) -> (ExitStatus, String) {
        self.send_sigterm();
        let status = self.wait_for_exit().await.expect("the process stops after SIGTERM");
        self.drain_output().await;
        (status, self.log())
    }

    /// SIGTERM, unless it has already exited and been waited for (its id
    /// may then be another process's).
    fn send_sigterm(&mut self) {
        if !matches!(self.child.try_wait(), Ok(None)) {
            return;
        }
        let pid = self.child.id();
        let sent = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status();
        assert!(sent.is_ok_and(|status| status.success()), "kill -TERM {pid}");
    }

    /// The lines kept so far, oldest first.
    pub fn log(&self) -> String {
        let log = self.log.lock().unwrap_or_else(PoisonError::into_inner);
        log.iter().map(String::as_str).collect::<Vec<_>>().join("\n")
    }

    /// The last `bytes_max` bytes of the log (whole characters).
    pub fn log_tail(&self, bytes_max: usize) -> String {
        let log = self.log();
        let start = log.len().saturating_sub(bytes_max);
        let start = (start..log.len())
            .find(|at| log.is_char_boundary(*at))
            .unwrap_or(log.len());
        log[start..].to_owned()
    }

    /// The process's resident set size (VmRSS), in KiB.
    pub fn resident_kib(&self) -> u64 {
        let pid = self.pid().expect("the process runs");
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read /proc/PID/status");
        status
            .lines()
            .find_map(|line| line.strip_prefix("VmRSS:"))
            .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS in /proc/PID/status")
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        if !matches!(self.child.try_wait(), Ok(None)) {
            return; // ended, and now waited for
        }
        if self.on_drop == OnDrop::Terminate {
            self.send_sigterm();
            let deadline = Instant::now() + Duration::from_millis(STOP_MS_MAX);
            while Instant::now() < deadline {
                if !matches!(self.child.try_wait(), Ok(None)) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(POLL_MS));
            }
        }
        kill_and_wait(&mut self.child);
    }
}

/// SIGKILL, then the exit status collected, so no zombie is left.
fn kill_and_wait(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// A child not yet handed to a [`ServerProcess`]: killed if starting it
/// fails half-way.
struct KilledOnDrop(Option<Child>);

impl Drop for KilledOnDrop {
    fn drop(&mut self) {
        if let Some(child) = self.0.as_mut() {
            kill_and_wait(child);
        }
    }
}

/// The child's piped stdout and stderr, registered with the runtime.
fn output_streams(child: &mut Child) -> Result<(ChildStdout, ChildStderr), ProcessError> {
    let stdout = child.stdout.take().expect("stdout is piped");
    let stderr = child.stderr.take().expect("stderr is piped");
    Ok((ChildStdout::from_std(stdout)?, ChildStderr::from_std(stderr)?))
}

/// One environment variable for a [`ProcessSpec`] or a config override.
pub fn pair(key: &str, value: impl ToString) -> (String, String) {
    (key.to_owned(), value.to_string())
}

/// `scheme://host:port` of a URL.
fn origin(url: &str) -> String {
    let after_scheme = url.find("://").map_or(0, |at| at + 3);
    let end = url[after_scheme..].find('/').map_or(url.len(), |at| after_scheme + at);
    url[..end].to_owned()
}

#[derive(Clone)]
struct LineSinks {
    log: Arc<Mutex<VecDeque<String>>>,
    urls: mpsc::UnboundedSender<String>,
    marker: Option<String>,
    marked: mpsc::UnboundedSender<String>,
}

async fn read_lines(stream: impl tokio::io::AsyncRead + Unpin, sinks: LineSinks) {
    let mut lines = BufReader::new(stream).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        if let Some(at) = line.find(LISTENING_MARKER) {
            // Up to a closing quote, for a JSON log line.
            let rest = &line[at + "listening on ".len()..];
            let url = rest.split('"').next().unwrap_or(rest).trim().to_owned();
            let _ = sinks.urls.send(url);
        }
        if let Some(marked) = sinks.marker.as_deref().and_then(|marker| line.strip_prefix(marker)) {
            let _ = sinks.marked.send(marked.trim().to_owned());
        }
        let mut log = sinks.log.lock().unwrap_or_else(PoisonError::into_inner);
        if log.len() == LOG_LINES_MAX {
            log.pop_front();
        }
        log.push_back(line);
    }
}
