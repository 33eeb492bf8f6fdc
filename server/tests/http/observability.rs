//! Metrics and operations: the exposition passes `promtool check metrics`,
//! the alert rules pass `promtool check rules` and their unit tests
//! (`promtool test rules`), a real Prometheus scrapes the server and answers
//! a query, and the sweeper purges and counts late keys.

use crate::common::{ALICE, Options, TestServer, fresh_key, label_body, metric_value, order_id, purchases_for};
use server::backend::StoreKind;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use store_core::ManualClock;
use store_core::types::RETENTION_MS_DEFAULT;

/// Debian's `prometheus` package installs both.
const PROMETHEUS_PROGRAM: &str = "prometheus";
const PROMTOOL_PROGRAM: &str = "promtool";
/// Longest wait for Prometheus to scrape the server and answer.
const SCRAPE_WAIT_MS_MAX: u64 = 30_000;
/// The sweeper's interval in the sweeper test: real time between its runs.
const SWEEPER_INTERVAL_MS: u64 = 100;
/// Longest wait for the sweeper to purge a record past its retention.
const SWEEPER_WAIT_MS_MAX: u64 = 10_000;

fn ops_file(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("ops").join(name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_exposition_passes_promtool_check_metrics() {
    let server = TestServer::start(StoreKind::Embedded).await;
    let reply = server
        .post_label(Some(ALICE), Some(&fresh_key()), &label_body(order_id(), 1))
        .await;
    assert_eq!(reply.status, 201);
    let metrics = server.get("/metrics", None).await;
    assert_eq!(
        metrics.header("content-type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    let text = metrics.text();
    for name in [
        "idem_http_requests_total",
        "idem_http_request_duration_seconds_bucket",
        "idem_http_requests_in_flight",
        "idem_store_operation_duration_seconds_bucket",
        "idem_carrier_calls_total",
        "idem_embedded_disk_bytes",
        "idem_embedded_level_zero_tables",
        "idem_embedded_sealed_memtables",
        "idem_embedded_compactions_running",
        "idem_embedded_reopens_total",
    ] {
        assert!(text.contains(name), "{name} missing from:\n{text}");
    }
    assert!(
        metric_value(
            &text,
            "idem_http_requests_total",
            &["route=\"/v1/labels\"", "outcome=\"created\""]
        ) >= 1.0,
        "{text}"
    );
    assert!(
        !text.contains("route=\"/v1/labels/lbl_"),
        "raw paths must never become labels"
    );
    let mut promtool = promtool(&["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|error| panic!("{}", promtool_missing(&error)));
    promtool.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let output = promtool.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&output.stdout).into_owned() + &String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && said.trim().is_empty(),
        "promtool check metrics:\n{said}"
    );
    server.shutdown().await;
}

/// A `promtool` command with `args`, run from the `ops` directory (the unit
/// tests name their rule file relative to themselves).
fn promtool(args: &[&str]) -> Command {
    let mut command = Command::new(PROMTOOL_PROGRAM);
    command.args(args).current_dir(ops_file(""));
    command
}

/// What to do when promtool cannot be started: these tests need it.
fn promtool_missing(error: &std::io::Error) -> String {
    format!(
        "cannot run {PROMTOOL_PROGRAM} ({error}): install Debian's `prometheus` package \
         (`sudo apt-get install prometheus`), or run scripts/test, which installs it"
    )
}

/// Runs promtool to the end; its stdout and stderr together.
fn promtool_says(args: &[&str]) -> (bool, String) {
    let output = promtool(args)
        .output()
        .unwrap_or_else(|error| panic!("{}", promtool_missing(&error)));
    let said = String::from_utf8_lossy(&output.stdout).into_owned() + &String::from_utf8_lossy(&output.stderr);
    (output.status.success(), said)
}

#[test]
fn the_alert_rules_pass_promtool_check_rules() {
    let (passed, said) = promtool_says(&["check", "rules", "alerts.yml"]);
    assert!(passed, "{said}");
    assert!(said.contains("SUCCESS"), "{said}");
}

/// Alert rule names in a rules file: the `- alert: Name` lines.
fn alert_names(rules: &str) -> std::collections::BTreeSet<String> {
    rules
        .lines()
        .filter_map(|line| line.trim().strip_prefix("- alert:"))
        .map(|name| name.trim().to_owned())
        .collect()
}

/// `alerts_test.yml` makes every rule fire on synthetic series and keeps it
/// quiet where it must not fire (another job, below the threshold, too short
/// for its `for`); every rule in `alerts.yml` has cases there.
#[test]
fn the_alert_rules_pass_promtool_test_rules() {
    let (passed, said) = promtool_says(&["test", "rules", "alerts_test.yml"]);
    assert!(passed, "promtool test rules server/ops/alerts_test.yml:\n{said}");
    assert!(said.contains("SUCCESS"), "{said}");
    let rules = std::fs::read_to_string(ops_file("alerts.yml")).unwrap();
    let tests = std::fs::read_to_string(ops_file("alerts_test.yml")).unwrap();
    let names = alert_names(&rules);
    assert!(names.len() >= 19, "{names:?}");
    for name in &names {
        assert!(
            tests.contains(&format!("alertname: {name}\n")),
            "{name} has no case in alerts_test.yml"
        );
    }
}

#[test]
fn the_dashboard_is_json_with_panels_on_our_metrics() {
    let text = std::fs::read_to_string(ops_file("grafana-dashboard.json")).unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(&text).unwrap();
    let panels = dashboard["panels"].as_array().expect("panels");
    assert!(panels.len() >= 6);
    for metric in [
        "idem_late_keys_total",
        "idem_lease_takeovers_total",
        "idem_store_operation_duration_seconds_bucket",
        "idem_http_request_duration_seconds_count",
        "idem_http_requests_in_flight_max",
        "idem_admission_shed_total",
        "idem_admission_queue_waiting",
        "idem_connections_open",
        "idem_connections_peer_cap_refused_total",
        "idem_ready",
        "idem_readiness_checks_total",
        "idem_waiters",
        "idem_embedded_level_zero_tables",
        "idem_embedded_sealed_memtables",
        "body_timeout",
        "parcel_in_progress",
    ] {
        assert!(text.contains(metric), "dashboard lacks {metric}");
    }
}

/// RFC 3986 percent-encoding of everything but unreserved characters.
fn percent_encoded(text: &str) -> String {
    text.bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (byte as char).to_string(),
            other => format!("%{other:02X}"),
        })
        .collect()
}

fn free_port() -> u16 {
    test_support::free_loopback_port().expect("a free loopback port")
}

/// A Prometheus process, killed on drop.
struct Prometheus(std::process::Child);

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_prometheus_scrapes_the_server_and_answers_a_query() {
    let server = TestServer::start(StoreKind::Embedded).await;
    let reply = server
        .post_label(Some(ALICE), Some(&fresh_key()), &label_body(order_id(), 1))
        .await;
    assert_eq!(reply.status, 201);
    let dir = tempfile::tempdir().unwrap();
    let target = server.base.trim_start_matches("http://");
    let config = format!(
        "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: idem\n    scrape_interval: 1s\n    \
         metrics_path: /metrics\n    static_configs:\n      - targets: ['{target}']\n"
    );
    let config_path = dir.path().join("prometheus.yml");
    std::fs::write(&config_path, config).unwrap();
    let port = free_port();
    let _prometheus = Prometheus(
        Command::new(PROMETHEUS_PROGRAM)
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg(format!("--storage.tsdb.path={}", dir.path().join("tsdb").display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus (Debian package prometheus) is installed"),
    );
    let created = "sum(idem_http_requests_total{job=\"idem\",route=\"/v1/labels\",outcome=\"created\"})";
    let value = first_answer(port, created).await;
    assert!(value >= 1.0, "Prometheus read {value}");
    // The latency SLO alerts select the 1-second bucket as `le=~"1|1\\.0"`
    // and the API routes as `route=~"/v1/.+"`: the label values the server
    // really exports must match, or the alerts watch nothing.
    let within_slo = "sum(idem_http_request_duration_seconds_bucket\
         {job=\"idem\",route=~\"/v1/.+\",le=~\"1|1\\\\.0\"})";
    let value = first_answer(port, within_slo).await;
    assert!(value >= 1.0, "Prometheus read {value} for {within_slo}");
    server.shutdown().await;
}

/// The first value Prometheus on `port` answers to `query`, asked again
/// until it has scraped what the query needs.
async fn first_answer(port: u16, query: &str) -> f64 {
    let http = crate::common::client();
    let started = Instant::now();
    loop {
        let answer = http
            .get(format!(
                "http://127.0.0.1:{port}/api/v1/query?query={}",
                percent_encoded(query)
            ))
            .send()
            .await;
        if let Ok(answer) = answer
            && let Ok(body) = answer.json::<serde_json::Value>().await
            && let Some(value) = body["data"]["result"][0]["value"][1].as_str()
        {
            return value.parse::<f64>().unwrap();
        }
        assert!(
            started.elapsed() < Duration::from_millis(SCRAPE_WAIT_MS_MAX),
            "no answer to {query} within the limit"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The sweeper purges expired records; a retry after the purge is a late
/// key (counted), and the label's uniqueness still prevents a second purchase.
/// A day's retention passes by moving the clock the store reads; the
/// sweeper's interval is real time, so the test waits for its next run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweeper_purges_and_late_keys_are_counted_without_a_second_purchase() {
    let clock = ManualClock::starting_now();
    let options = Options {
        extra_env: vec![("IDEM__SWEEPER__INTERVAL_MS".into(), SWEEPER_INTERVAL_MS.to_string())],
        clock: Some(clock.clone()),
        ..Options::default()
    };
    let server = TestServer::start_with(StoreKind::Embedded, options).await;
    let before = server.metrics_text().await;
    let purged_before = metric_value(&before, "idem_records_purged_total", &[]);
    let (key, order) = (fresh_key(), order_id());
    let first = server.post_label(Some(ALICE), Some(&key), &label_body(order, 1)).await;
    assert_eq!(first.status, 201);
    clock.advance_ms(RETENTION_MS_DEFAULT + 1);
    let started = Instant::now();
    loop {
        let metrics = server.metrics_text().await;
        if metric_value(&metrics, "idem_records_purged_total", &[]) > purged_before {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_millis(SWEEPER_WAIT_MS_MAX),
            "no purge within the limit: {metrics}"
        );
        tokio::time::sleep(Duration::from_millis(SWEEPER_INTERVAL_MS)).await;
    }
    let late = server.post_label(Some(ALICE), Some(&key), &label_body(order, 1)).await;
    assert_eq!(late.status, 201);
    assert!(
        late.header("idempotent-replayed").is_none(),
        "the record was purged: this runs as new"
    );
    assert_eq!(
        late.json()["label_id"],
        first.json()["label_id"],
        "the parcel's label, not a new one"
    );
    let after_late = server.metrics_text().await;
    assert!(
        metric_value(&after_late, "idem_late_keys_total", &[]) > metric_value(&before, "idem_late_keys_total", &[]),
        "{after_late}"
    );
    assert_eq!(purchases_for(&server.carrier_stats().await, order), 1);
    server.shutdown().await;
}

/// Made-up methods per run of the series test.
const MADE_UP_METHODS_COUNT: usize = 1_000;

/// The request metrics' series (name and labels) that concern requests no
/// route serves: the ones a stranger can create.
fn http_series(exposition: &str) -> std::collections::BTreeSet<String> {
    exposition
        .lines()
        .filter(|line| line.starts_with("idem_http_"))
        .filter_map(|line| line.rsplit_once(' ').map(|(series, _value)| series.to_owned()))
        .collect()
}

/// Every `method` label value in the exposition.
fn method_labels(exposition: &str) -> std::collections::BTreeSet<String> {
    exposition
        .split("method=\"")
        .skip(1)
        .filter_map(|rest| rest.split_once('"').map(|(value, _)| value.to_owned()))
        .collect()
}

/// The metrics middleware runs before authentication, so anyone can send
/// requests: every label must come from a fixed set, or each made-up method
/// (or path) is a new series in Prometheus, without bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn made_up_methods_and_paths_add_no_metric_series() {
    let server = TestServer::start(StoreKind::Embedded).await;
    let http = crate::common::client();
    let send = |method: String, path: &str| {
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("a valid method token");
        http.request(method, format!("{}{path}", server.base)).send()
    };
    // One of each kind first, so the series a made-up request may use exist.
    for path in ["/nothing-here", "/v1/labels"] {
        send("WARMUP".to_owned(), path).await.expect("answered");
    }
    server.metrics_text().await;
    let before = server.metrics_text().await;
    for n in 0..MADE_UP_METHODS_COUNT {
        let path = if n % 2 == 0 {
            format!("/x{n}")
        } else {
            "/v1/labels".to_owned()
        };
        let answer = send(format!("FOO{n}"), &path).await.expect("answered");
        assert!(answer.status().is_client_error(), "FOO{n} {path}: {}", answer.status());
    }
    let after = server.metrics_text().await;
    let added: Vec<_> = http_series(&after).difference(&http_series(&before)).cloned().collect();
    assert!(
        added.iter().all(|series| series.contains("route=\"/metrics\"")),
        "{} new series, e.g. {:?}",
        added.len(),
        added.iter().take(3).collect::<Vec<_>>()
    );
    let allowed = [
        "GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH", "_OTHER",
    ];
    let methods = method_labels(&after);
    assert!(
        methods.iter().all(|method| allowed.contains(&method.as_str())),
        "method labels outside the fixed set: {methods:?}"
    );
    server.shutdown().await;
}

/// Each route the router serves is counted under its own pattern, never as
/// `unmatched`: the labels come from the router's list of routes, which
/// must name every route it serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_served_is_counted_under_its_own_pattern() {
    let server = TestServer::start(StoreKind::Embedded).await;
    let created = server
        .post_label(Some(ALICE), Some(&fresh_key()), &label_body(order_id(), 1))
        .await;
    assert_eq!(created.status, 201);
    let location = created.header("location").expect("a Location").to_owned();
    assert_eq!(server.get(&location, Some(ALICE)).await.status, 200);
    for path in ["/healthz", "/readyz", "/openapi.json"] {
        assert_eq!(server.get(path, None).await.status, 200, "{path}");
    }
    let text = server.metrics_text().await;
    for (route, method) in server::app::ROUTES {
        if route == "/metrics" {
            continue; // counted after its own answer, so not in it the first time
        }
        let selector = [format!("route=\"{route}\""), format!("method=\"{method}\"")];
        let selector: Vec<&str> = selector.iter().map(String::as_str).collect();
        assert!(
            metric_value(&text, "idem_http_requests_total", &selector) >= 1.0,
            "{method} {route} not counted under its pattern:\n{text}"
        );
    }
    server.shutdown().await;
}

/// Whether the exposition has a sample of `series`: a metric name, or a
/// name with a label selector as written (`name{a="b"`), or a histogram's
/// buckets (`name_bucket`).
fn has_series(exposition: &str, series: &str) -> bool {
    exposition
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| line.strip_prefix(series))
        .any(|rest| series.contains('{') || rest.starts_with([' ', '{']))
}

/// `increase(x[15m]) > 0` cannot see the first event of a series that did
/// not exist before it (there is no earlier sample to increase from), so
/// every counter and histogram is exported at zero from the start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_counter_and_histogram_is_exported_at_zero_right_after_start() {
    let server = TestServer::start(StoreKind::Embedded).await;
    let text = server.metrics_text().await;
    let at_zero = [
        "idem_late_keys_total",
        "idem_lease_takeovers_total",
        "idem_lease_lost_completions_total",
        "idem_completion_failures_total",
        "idem_labels_existing_total",
        "idem_records_purged_total",
        "idem_tombstones_purged_total",
        "idem_sweeper_runs_total{result=\"error\"}",
        "idem_carrier_calls_total{outcome=\"timeout\"}",
        "idem_carrier_calls_total{outcome=\"server_error\"}",
        "idem_carrier_calls_total{outcome=\"slow_down\"}",
        "idem_carrier_retries_total",
        "idem_carrier_retries_throttled_total",
        "idem_admission_workers_borrowed_total",
        "idem_http_requests_total{route=\"/v1/labels\",method=\"POST\",status=\"503\",outcome=\"unavailable\"}",
        "idem_http_requests_total{route=\"/v1/labels\",method=\"POST\",status=\"500\",outcome=\"internal_error\"}",
        "idem_waiters",
        "idem_waits_total{outcome=\"replayed\"}",
        "idem_waits_total{outcome=\"refused_cap\"}",
    ];
    for series in at_zero {
        assert!(has_series(&text, series), "{series} missing right after start:\n{text}");
        assert_eq!(
            metric_value(&text, series.split('{').next().unwrap(), &series_labels(series)),
            0.0,
            "{series}"
        );
    }
    assert_eq!(
        metric_value(&text, "idem_http_requests_in_flight_max", &[]),
        Options::default().in_flight_max as f64,
        "the cap the alert IdemInFlightNearCap compares with:\n{text}"
    );
    let histograms = [
        "idem_sweeper_run_duration_seconds_bucket",
        "idem_carrier_call_duration_seconds_bucket{outcome=\"purchased\"",
        "idem_store_operation_duration_seconds_bucket{backend=\"embedded\",operation=\"claim\",result=\"error\"",
        "idem_http_request_duration_seconds_bucket{route=\"/v1/labels\",method=\"POST\"",
        "idem_wait_duration_seconds_bucket{outcome=\"timed_out\"",
    ];
    for histogram in histograms {
        assert!(
            has_series(&text, histogram),
            "{histogram} missing right after start:\n{text}"
        );
    }
    server.shutdown().await;
}

/// The `a="b"` parts of a series written as `name{a="b",c="d"}`.
fn series_labels(series: &str) -> Vec<&str> {
    series
        .split_once('{')
        .map(|(_, labels)| labels.trim_end_matches('}').split(',').collect())
        .unwrap_or_default()
}
