//! `idem-bench http` with a spawned Label service and carrier simulator
//! (the `server` binary built beside this test's), stopped from outside as
//! a person or a CI runner would: a Ctrl-C (SIGINT) must stop the load,
//! stop both processes, remove their directory, and leave a partial report
//! that says so; a SIGKILL, which the bench cannot answer, must still take
//! both processes with it, and the redis-server it started for a Redis
//! store. A low rate; no figure is asserted.

mod common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::io::AsyncBufReadExt;
use tokio::process::{Child, Command};

/// The bench's spawn directory, in its children's command lines.
const SPAWN_MARKER: &str = "/idem-bench-server-";
/// Longest wait for the bench to start its service and carrier simulator.
const CHILDREN_WAIT_MS_MAX: u64 = 60_000;
/// Longest wait for the load to reach the service.
const LOAD_WAIT_MS_MAX: u64 = 30_000;
/// Longest wait for the bench to exit after a signal (its drain is 5 s).
const EXIT_WAIT_MS_MAX: u64 = 60_000;
/// Longest wait for the kernel to end the children of a killed bench.
const ORPHAN_WAIT_MS_MAX: u64 = 10_000;
/// Pause between looks at /proc.
const POLL_MS: u64 = 50;
/// The run's planned length: far longer than the test lets it run.
const PLANNED_DURATION_S: u64 = 60;
/// Intents per second: low, so the run stays light on a shared machine.
const RATE_PER_S: u64 = 20;

/// A bench run on `store_kind` that will not end by itself within the
/// test, killed if the test fails before it does.
fn start_bench(json: &Path, store_kind: &str) -> Child {
    Command::new(env!("CARGO_BIN_EXE_idem-bench"))
        .args(["http", "--store-kind", store_kind, "--warmup-s", "0", "--seed", "5"])
        .args(["--rate", &RATE_PER_S.to_string()])
        .args(["--duration-s", &PLANNED_DURATION_S.to_string()])
        .arg("--quiet")
        .arg("--json")
        .arg(json)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("idem-bench starts")
}

/// A running process's command line (arguments joined by spaces), or
/// `None` when it has ended: gone, or a zombie whose parent has not
/// collected its exit status yet.
fn command_line_if_running(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let state = stat.rsplit(')').next()?.split_whitespace().next()?;
    if state == "Z" || state == "X" {
        return None;
    }
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(String::from_utf8_lossy(&raw).replace('\0', " "))
}

fn parent_of(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("PPid:")?.trim().parse().ok())
}

/// The running processes `bench` started, with their command lines.
fn children_of(bench: u32) -> Vec<(u32, String)> {
    let entries = std::fs::read_dir("/proc").expect("/proc");
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| parent_of(*pid) == Some(bench))
        .filter_map(|pid| Some((pid, command_line_if_running(pid)?)))
        .collect()
}

/// Waits until the bench runs its service and its carrier simulator (both
/// from its spawn directory), and `others` more children (a store's
/// server); returns them all.
async fn wait_for_children(bench: &mut Child, others: usize) -> Vec<(u32, String)> {
    let pid = bench.id().expect("the bench runs");
    let deadline = Instant::now() + Duration::from_millis(CHILDREN_WAIT_MS_MAX);
    loop {
        let children = children_of(pid);
        let spawned = children.iter().filter(|(_, command)| command.contains(SPAWN_MARKER));
        let carrier = spawned.clone().any(|(_, command)| command.contains(" carrier "));
        if spawned.count() == 2 && carrier && children.len() == 2 + others {
            return children;
        }
        if let Ok(Some(status)) = bench.try_wait() {
            let output = printed(bench).await;
            panic!("idem-bench exited ({status}) before spawning its service:\n{output}");
        }
        assert!(
            Instant::now() < deadline,
            "no service and carrier after {CHILDREN_WAIT_MS_MAX} ms: {children:?}"
        );
        tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
    }
}

/// What an exited bench printed, for a failure message.
async fn printed(bench: &mut Child) -> String {
    use tokio::io::AsyncReadExt;
    let mut text = String::new();
    if let Some(stdout) = bench.stdout.as_mut() {
        let _ = stdout.read_to_string(&mut text).await;
    }
    if let Some(stderr) = bench.stderr.as_mut() {
        let _ = stderr.read_to_string(&mut text).await;
    }
    text
}

/// The service's `http://127.0.0.1:PORT`, from the config file its
/// command line names (`--config DIR/server-0.toml`).
fn service_url(children: &[(u32, String)]) -> (String, PathBuf) {
    let (_, command) = children
        .iter()
        .find(|(_, command)| command.contains(SPAWN_MARKER) && !command.contains(" carrier "))
        .expect("the service");
    let config = command
        .split_whitespace()
        .skip_while(|argument| *argument != "--config")
        .nth(1)
        .expect("--config PATH");
    let config = PathBuf::from(config);
    let text = std::fs::read_to_string(&config).expect("the service's config");
    let listen = text
        .lines()
        .find_map(|line| line.strip_prefix("listen = "))
        .expect("listen = in [server]")
        .trim_matches('"');
    (format!("http://{listen}"), config)
}

/// Waits until the service has answered at least one label request.
async fn wait_for_load(url: &str) {
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_millis(LOAD_WAIT_MS_MAX);
    while Instant::now() < deadline {
        if let Ok(response) = client.get(format!("{url}/metrics")).send().await
            && let Ok(text) = response.text().await
            && bench::http_mode::metrics::label_answers(&text).first_runs > 0
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
    }
    panic!("no label request reached {url} within {LOAD_WAIT_MS_MAX} ms");
}

fn signal(pid: u32, name: &str) {
    let status = std::process::Command::new("kill")
        .args([name, &pid.to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success(), "kill {name} {pid}");
}

/// Waits until none of `children` runs any more; the ones still running
/// after `wait_ms_max` (same id, same command line).
async fn still_running_after(children: &[(u32, String)], wait_ms_max: u64) -> Vec<(u32, String)> {
    let deadline = Instant::now() + Duration::from_millis(wait_ms_max);
    loop {
        let running: Vec<(u32, String)> = children
            .iter()
            .filter(|(pid, command)| command_line_if_running(*pid).as_ref() == Some(command))
            .cloned()
            .collect();
        if running.is_empty() || Instant::now() >= deadline {
            return running;
        }
        tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_stops_the_load_and_every_spawned_process_and_writes_a_partial_report() {
    interrupted_run_leaves_nothing_but_its_report("SIGINT", 130).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_ends_a_run_as_ctrl_c_does() {
    interrupted_run_leaves_nothing_but_its_report("SIGTERM", 143).await;
}

/// Sends `signal_name` to a loaded run, and checks what it leaves: a
/// partial report that says so, no process, no spawn directory.
async fn interrupted_run_leaves_nothing_but_its_report(signal_name: &str, exit_code: i32) {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("interrupted.json");
    let mut bench = start_bench(&json, "embedded");
    let children = wait_for_children(&mut bench, 0).await;
    let (url, config) = service_url(&children);
    wait_for_load(&url).await;
    signal(
        bench.id().unwrap(),
        &format!("-{}", signal_name.trim_start_matches("SIG")),
    );
    let output = tokio::time::timeout(Duration::from_millis(EXIT_WAIT_MS_MAX), bench.wait_with_output())
        .await
        .expect("idem-bench exits after one signal")
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(exit_code), "{stdout}\n{stderr}");
    assert!(stdout.contains(&format!("INTERRUPTED by {signal_name}")), "{stdout}");
    assert!(
        stderr.contains(&format!("{signal_name}: stopping the load")),
        "{stderr}"
    );
    // Stopped by the bench itself, before it exited: nothing is left.
    assert_eq!(still_running_after(&children, 0).await, Vec::new(), "{children:?}");
    let spawn_dir = config.parent().unwrap();
    assert!(!spawn_dir.exists(), "{} was left behind", spawn_dir.display());
    let report = common::read_report(&json);
    assert_eq!(
        report["interrupted"]["signal"], signal_name,
        "{}",
        report["interrupted"]
    );
    let open_loop = &report["http"][0]["open_loop"];
    let intended = open_loop["intended"].as_u64().unwrap();
    assert!(intended > 0, "{open_loop}");
    assert!(
        intended < PLANNED_DURATION_S * RATE_PER_S,
        "the load went on: {open_loop}"
    );
    assert!(open_loop["duration_s"].as_f64().unwrap() < PLANNED_DURATION_S as f64);
    assert_eq!(
        report["targets"],
        serde_json::json!([]),
        "a partial run checks no target"
    );
}

/// A second Ctrl-C, once the first has been taken: the bench exits at once
/// without a report, and the kernel ends its children.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_ctrl_c_exits_at_once_and_still_ends_the_children() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("twice.json");
    let mut bench = start_bench(&json, "embedded");
    let children = wait_for_children(&mut bench, 0).await;
    let (url, config) = service_url(&children);
    wait_for_load(&url).await;
    let pid = bench.id().unwrap();
    signal(pid, "-INT");
    let mut stderr = tokio::io::BufReader::new(bench.stderr.take().unwrap()).lines();
    let mut printed = String::new();
    while !printed.contains("SIGINT: stopping the load") {
        let line = tokio::time::timeout(Duration::from_millis(EXIT_WAIT_MS_MAX), stderr.next_line())
            .await
            .expect("the bench says it took the first Ctrl-C");
        printed.push_str(
            &line
                .unwrap()
                .unwrap_or_else(|| panic!("the bench closed stderr: {printed}")),
        );
    }
    signal(pid, "-INT");
    let status = tokio::time::timeout(Duration::from_millis(EXIT_WAIT_MS_MAX), bench.wait())
        .await
        .expect("idem-bench exits after a second Ctrl-C")
        .unwrap();
    while let Ok(Some(line)) = stderr.next_line().await {
        printed.push_str(&line);
    }
    assert_eq!(status.code(), Some(130), "{printed}");
    assert!(printed.contains("SIGINT again: stopping at once"), "{printed}");
    let left = still_running_after(&children, ORPHAN_WAIT_MS_MAX).await;
    for (pid, _) in &left {
        signal(*pid, "-KILL");
    }
    let _ = std::fs::remove_dir_all(config.parent().unwrap());
    assert_eq!(left, Vec::new(), "outlived the bench");
    assert!(!json.exists(), "no report after a second Ctrl-C");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_bench_takes_its_service_and_carrier_with_it() {
    killed_bench_leaves_no_child("embedded", 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_bench_takes_its_redis_server_with_it() {
    killed_bench_leaves_no_child("redis", 1).await;
}

/// SIGKILLs a bench on `store_kind` once its service, its carrier and
/// `store_servers` more children run, and checks that they all end.
async fn killed_bench_leaves_no_child(store_kind: &str, store_servers: usize) {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("killed.json");
    let mut bench = start_bench(&json, store_kind);
    let children = wait_for_children(&mut bench, store_servers).await;
    let (_, config) = service_url(&children);
    signal(bench.id().unwrap(), "-KILL");
    let status = tokio::time::timeout(Duration::from_millis(EXIT_WAIT_MS_MAX), bench.wait())
        .await
        .expect("a SIGKILL ends idem-bench")
        .unwrap();
    assert_eq!(status.code(), None, "ended by a signal: {status}");
    let left = still_running_after(&children, ORPHAN_WAIT_MS_MAX).await;
    // A killed bench cannot remove its spawn directory: the test does.
    let _ = std::fs::remove_dir_all(config.parent().unwrap());
    for (pid, _) in &left {
        // This test's own leftovers, ended by id so the machine stays clean.
        signal(*pid, "-KILL");
    }
    assert_eq!(left, Vec::new(), "outlived the killed bench");
    assert!(!json.exists(), "a killed bench writes no report");
}
