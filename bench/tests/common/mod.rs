//! An unmodified Label service and carrier simulator, started in-process
//! from the server crate on free loopback ports, and `idem-bench http` run
//! against them as a separate process, as an operator would run it.
// Each test binary uses a part of this module.
#![allow(dead_code)]

use server::{App, Config, RunningServer};
use std::path::Path;
use std::process::Output;
use store_fdb::Durability;
use tempfile::TempDir;
use tokio::net::TcpListener;

pub struct LabelService {
    pub running: RunningServer,
    pub carrier_url: String,
    _data: TempDir,
}

impl LabelService {
    /// The default configuration (the embedded store, the demo caller),
    /// with a fast in-process carrier that drops `lost_reply_rate` of its
    /// replies after buying.
    pub async fn start(lost_reply_rate: f64) -> Self {
        Self::start_with(lost_reply_rate, |_| {}).await
    }

    /// As [`LabelService::start`], with `configure` applied last (another
    /// store, for example).
    pub async fn start_with(lost_reply_rate: f64, configure: impl FnOnce(&mut Config)) -> Self {
        let data = tempfile::tempdir().unwrap();
        let mut config = Config::default();
        config.store.embedded.path = data.path().join("records");
        config.store.embedded.durability = Durability::Buffer;
        config.carrier.simulator.latency_ms_min = 0;
        config.carrier.simulator.latency_ms_max = 1;
        config.carrier.simulator.lost_reply_rate = lost_reply_rate;
        config.carrier.simulator.seed = 7;
        // The lost replies are for the bench's client to meet (503, then a
        // takeover with the same key), not for the service to cure with its
        // own carrier retries.
        config.carrier.retries_max = 0;
        configure(&mut config);
        let app = App::build(config).await.unwrap();
        let carrier_url = app.carrier_simulator_url().expect("the simulator runs in-process");
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let running = app.start(listener).unwrap();
        Self {
            running,
            carrier_url,
            _data: data,
        }
    }
}

/// Runs `idem-bench http` for two seconds at 100 intents/s against
/// `service`, with `extra` arguments, writing its JSON report to `json`.
pub async fn run_bench(service: &LabelService, json: &Path, extra: &[&str]) -> Output {
    run_bench_at(service, json, "100", extra).await
}

/// [`run_bench`] at `rate` intents/s.
pub async fn run_bench_at(service: &LabelService, json: &Path, rate: &str, extra: &[&str]) -> Output {
    let url = service.running.base_url();
    let json = json.display().to_string();
    let mut arguments = vec![
        "http",
        "--url",
        &url,
        "--carrier-url",
        &service.carrier_url,
        "--rate",
        rate,
        "--duration-s",
        "2",
        "--warmup-s",
        "0",
        "--seed",
        "11",
        // A debug server beside other test binaries on two cores can take
        // longer than the design's 250 ms per attempt, and past its deadline
        // it now starts no work (docs/design.md#deadlines): these runs check
        // the audit, not the speed, so each attempt may wait a second.
        "--deadline-ms",
        "1000",
        "--quiet",
        "--json",
        &json,
    ];
    arguments.extend_from_slice(extra);
    tokio::process::Command::new(env!("CARGO_BIN_EXE_idem-bench"))
        .args(&arguments)
        .output()
        .await
        .unwrap()
}

pub fn read_report(json: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(json).unwrap()).unwrap()
}

/// The http report of a run that must have exited cleanly with a passed
/// audit (asserted, with the bench's output on failure).
pub fn passed_http_report(output: &Output, json: &Path) -> serde_json::Value {
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    let http = read_report(json)["http"][0].clone();
    assert_eq!(http["audit"]["passed"], true, "{}", http["audit"]);
    http
}
