//! The `server` binary as a process: zero set-up start, refusal of bad
//! config, SIGTERM, and a crash mid-purchase with the carrier as a process
//! of its own (it must outlive the server's restart).

use crate::common::{
    ALICE, Reply, callers_env, client, fresh_key, label_body, metric_value, order_id, purchases_for, read_documented,
};
use server::auth::{DEMO_TOKEN, token_sha256};
use server::carrier::{CARRIER_SCRIPT_PATH, CarrierStats, read_stats};
use std::path::Path;
use std::time::Duration;
use test_support::process::{ProcessSpec, ServerProcess};
use tokio::process::Command;

/// Runs the binary with `args` and `env` in `dir`, and waits for its
/// "listening on http://..." line; killed when dropped.
pub(crate) async fn start(args: &[&str], env: &[(&str, String)], dir: &Path) -> ServerProcess {
    let spec = ProcessSpec::new(env!("CARGO_BIN_EXE_server"), args, dir).env(env.iter().cloned());
    ServerProcess::start(spec)
        .await
        .unwrap_or_else(|error| panic!("the server process: {error}"))
}

/// The carrier simulator as a process of its own, answering at once; it
/// outlives any server started against it.
pub(crate) async fn start_carrier(dir: &Path) -> ServerProcess {
    let env = [
        ("IDEM__CARRIER__SIMULATOR__LATENCY_MS_MIN", "0".to_owned()),
        ("IDEM__CARRIER__SIMULATOR__LATENCY_MS_MAX", "0".to_owned()),
    ];
    start(&["carrier", "--listen", "127.0.0.1:0"], &env, dir).await
}

/// Makes the carrier process's next call answer after `delay_ms`.
pub(crate) async fn delay_next_carrier_call(carrier_url: &str, delay_ms: u64) {
    let script = serde_json::json!({ "steps": [{ "delay_ms": delay_ms }] });
    let scripted = client()
        .post(format!("{carrier_url}{CARRIER_SCRIPT_PATH}"))
        .json(&script)
        .send()
        .await
        .unwrap();
    assert_eq!(scripted.status(), 204);
}

/// `POST /v1/labels` to a server process, checked against the document.
pub(crate) async fn post(base: &str, token: &str, key: &str, body: &str) -> Reply {
    let response = client()
        .post(format!("{base}/v1/labels"))
        .bearer_auth(token)
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(body.to_owned())
        .send()
        .await
        .expect("server answers");
    read_documented("POST", "/v1/labels", response).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_starts_with_zero_set_up_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let env = [("IDEM__SERVER__LISTEN", "127.0.0.1:0".to_owned())];
    let server = start(&[], &env, dir.path()).await;
    let log = server.log();
    assert!(log.contains("DEVELOPMENT CALLER ENABLED"), "{log}");
    assert!(
        log.contains(&dir.path().join("data").display().to_string()),
        "says where the data is: {log}"
    );
    let reply = post(&server.url, "demo-token", &fresh_key(), &label_body(order_id(), 1)).await;
    assert_eq!(reply.status, 201, "{}", reply.text());
    assert!(dir.path().join("data").is_dir());
    let (status, log) = server.terminate().await;
    assert!(status.success(), "{status:?}\n{log}");
    assert!(log.contains("stopped"), "{log}");
}

/// JSON logs are flat (the event's fields at the top level, not under
/// `fields`), and every line a request writes carries its request id in
/// its span.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_log_lines_are_flat_and_carry_the_request_id() {
    let dir = tempfile::tempdir().unwrap();
    let env = [
        ("IDEM__SERVER__LISTEN", "127.0.0.1:0".to_owned()),
        ("IDEM__LOG__FORMAT", "json".to_owned()),
        ("IDEM__CALLERS", callers_env()),
    ];
    let server = start(&[], &env, dir.path()).await;
    let response = client()
        .post(format!("{}/v1/labels", server.url))
        .bearer_auth(ALICE)
        .header("idempotency-key", fresh_key())
        .header("content-type", "application/json")
        .header("x-request-id", "fulfilment-4711")
        .body(label_body(order_id(), 1))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    assert_eq!(response.headers()["x-request-id"], "fulfilment-4711");
    let (_status, log) = server.terminate().await;
    let lines: Vec<serde_json::Value> = log
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|error| panic!("{error}: {line}")))
        .collect();
    let request = lines
        .iter()
        .find(|line| line["message"] == "request")
        .unwrap_or_else(|| panic!("no request line: {log}"));
    assert_eq!(request["status"], 201, "flat fields: {request}");
    assert_eq!(request["route"], "/v1/labels", "{request}");
    assert_eq!(request["span"]["request_id"], "fulfilment-4711", "{request}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_config_is_refused_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let mut cases: Vec<(&[(&str, &str)], &str)> = vec![
        (&[("IDEM__POLICY__LEASE_MS", "20000")], "policy.lease_ms"),
        (&[("IDEM__SERVER__IN_FLIGHT_MAX", "0")], "server.in_flight_max"),
        (
            &[("IDEM__CARRIER__SIMULATOR__LOST_REPLY_RATE", "1.5")],
            "carrier.simulator.lost_reply_rate",
        ),
    ];
    // A kind this binary was built without names the feature that builds
    // it in. Built with it (scripts/test, where FoundationDB is found), the
    // kind opens and serves instead: the refusal's words are checked by
    // backend.rs's own test then.
    if !cfg!(feature = "foundationdb") {
        cases.push((&[("IDEM__STORE__KIND", "foundationdb")], "--features foundationdb"));
    }
    for (env, expected) in cases {
        let output = Command::new(env!("CARGO_BIN_EXE_server"))
            .current_dir(dir.path())
            .env("IDEM__SERVER__LISTEN", "127.0.0.1:0")
            .envs(env.iter().copied())
            .output()
            .await
            .unwrap();
        let text = String::from_utf8_lossy(&output.stderr).into_owned() + &String::from_utf8_lossy(&output.stdout);
        assert!(!output.status.success(), "{env:?} must be refused");
        assert!(text.contains(expected), "{env:?}: {text}");
    }
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("config.example.toml");
    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        std::fs::read_to_string(example).unwrap() + "\n[unknown_section]\nx = 1\n",
    )
    .unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_server"))
        .args(["--config", bad.to_str().unwrap()])
        .output()
        .await
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("unknown_section"));
}

async fn carrier_stats(carrier: &str) -> CarrierStats {
    read_stats(&client(), carrier).await.expect("carrier stats")
}

/// The timeline of docs/design.md#timeline: attempt 1 buys the label and dies before
/// committing; retries get 409 until its lease expires; then a retry takes
/// over, the carrier's own key hands back the same label, and one label was
/// bought. The server restarts on its data directory; the carrier, a
/// process of its own, lives on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_mid_purchase_ends_with_one_label_after_restart() {
    let dir = tempfile::tempdir().unwrap();
    let carrier = start_carrier(dir.path()).await;
    let server_env = [
        ("IDEM__SERVER__LISTEN", "127.0.0.1:0".to_owned()),
        ("IDEM__CALLERS", callers_env()),
        ("IDEM__POLICY__LEASE_MS", "3000".to_owned()),
        ("IDEM__CARRIER__TIMEOUT_MS", "2000".to_owned()),
        ("IDEM__CARRIER__URL", carrier.url.clone()),
    ];
    let first = start(&[], &server_env, dir.path()).await;
    delay_next_carrier_call(&carrier.url, 1_000).await;
    let (key, order) = (fresh_key(), order_id());
    let body = label_body(order, 1);
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let attempt = impatient
        .post(format!("{}/v1/labels", first.url))
        .bearer_auth(ALICE)
        .header("idempotency-key", &key)
        .header("content-type", "application/json")
        .body(body.clone())
        .send()
        .await;
    assert!(attempt.is_err(), "the caller gave up before the answer");
    first.kill().await;
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    assert_eq!(
        purchases_for(&carrier_stats(&carrier.url).await, order),
        1,
        "the carrier sold the label"
    );

    let second = start(&[], &server_env, dir.path()).await;
    let blocked = post(&second.url, ALICE, &key, &body).await;
    assert_eq!(
        (blocked.status, blocked.problem_code().as_str()),
        (409, "request_in_progress"),
        "{}",
        blocked.text()
    );
    tokio::time::sleep(Duration::from_secs(blocked.retry_after_s())).await;
    let mut taken_over = post(&second.url, ALICE, &key, &body).await;
    while taken_over.status == 409 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        taken_over = post(&second.url, ALICE, &key, &body).await;
    }
    assert_eq!(taken_over.status, 201, "{}", taken_over.text());
    let stats = carrier_stats(&carrier.url).await;
    assert_eq!(purchases_for(&stats, order), 1, "{stats:?}");
    assert_eq!(
        stats.deduplicated_repeats, 1,
        "the takeover got the carrier's replay: {stats:?}"
    );
    assert_eq!(stats.purchases_by_carrier_key.len(), 1);
    let metrics = client()
        .get(format!("{}/metrics", second.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(
        metric_value(&metrics, "idem_lease_takeovers_total", &[]),
        1.0,
        "{metrics}"
    );
    let (status, log) = second.terminate().await;
    assert!(status.success(), "{log}");
    let (status, _) = carrier.terminate().await;
    assert!(status.success());
}

/// Longest a refused start may take; a binary still running by then has
/// started instead of refusing, and is killed.
const REFUSAL_WAIT_MS: u64 = 20_000;

/// Runs the binary with `env` until it exits: its exit code and what it
/// printed, or `None` if it was still running after [`REFUSAL_WAIT_MS`]
/// (it started: killed, as the refusal it should have been was not).
async fn refusal(env: &[(&str, String)]) -> Option<(Option<i32>, String)> {
    let dir = tempfile::tempdir().unwrap();
    let run = Command::new(env!("CARGO_BIN_EXE_server"))
        .current_dir(dir.path())
        .envs(env.iter().map(|(name, value)| (*name, value.as_str())))
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_millis(REFUSAL_WAIT_MS), run)
        .await
        .ok()?
        .expect("run the binary");
    let text = String::from_utf8_lossy(&output.stderr).into_owned() + &String::from_utf8_lossy(&output.stdout);
    Some((output.status.code(), text))
}

/// Asserts `env` is refused at startup with exit code 2 and a message
/// that names each of `words` (the setting, the safe alternative).
async fn assert_refused_naming(env: &[(&str, String)], words: &[&str]) {
    let Some((code, text)) = refusal(env).await else {
        panic!("{env:?}: the server started instead of refusing");
    };
    assert_eq!(code, Some(2), "{env:?}: {text}");
    for word in words {
        assert!(text.contains(word), "{env:?}: {word:?} is not named: {text}");
    }
}

/// `retiring_token_sha256` is accepted as any token: the documented
/// rotation away from the demo token leaves the demo token in there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_token_being_rotated_out_on_a_public_address_is_refused() {
    let callers = format!(
        r#"[{{id = "fulfilment", token_sha256 = "{}", retiring_token_sha256 = ["{}"]}}]"#,
        token_sha256("a-real-secret"),
        token_sha256(DEMO_TOKEN)
    );
    let env = [
        ("IDEM__SERVER__LISTEN", "0.0.0.0:0".to_owned()),
        ("IDEM__CALLERS", callers),
        ("IDEM__CARRIER__URL", "http://127.0.0.1:9".to_owned()),
    ];
    assert_refused_naming(
        &env,
        &[
            "server.allow_demo_caller_on_public_address",
            "retiring_token_sha256",
            "[[callers]]",
        ],
    )
    .await;
}

/// An empty `carrier.url` sells fake labels from the in-process simulator:
/// on a public address that is refused, naming the URL to set instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_in_process_carrier_simulator_on_a_public_address_is_refused() {
    let env = [
        ("IDEM__SERVER__LISTEN", "0.0.0.0:0".to_owned()),
        ("IDEM__CALLERS", callers_env()),
    ];
    assert_refused_naming(&env, &["carrier.url", "server carrier --listen", "loopback"]).await;
}

/// A lease one millisecond longer than the carrier budget leaves no time to
/// commit the label: refused, naming the lease that would do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_that_does_not_outlast_the_carrier_budget_is_refused() {
    let env = [
        ("IDEM__SERVER__LISTEN", "127.0.0.1:0".to_owned()),
        ("IDEM__CARRIER__TIMEOUT_MS", "20000".to_owned()),
        ("IDEM__POLICY__LEASE_MS", "20001".to_owned()),
    ];
    assert_refused_naming(&env, &["policy.lease_ms", "carrier.timeout_ms", "25000", "retries"]).await;
}

/// `server --version` (and `-V`): the version and the features built in,
/// for packaging and for an operator checking what a binary can do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_names_its_version_and_the_features_built_in() {
    for flag in ["--version", "-V"] {
        let output = Command::new(env!("CARGO_BIN_EXE_server"))
            .arg(flag)
            .output()
            .await
            .unwrap();
        let text = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(
            output.status.success(),
            "{flag}: {text}{}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(text.starts_with("server "), "{flag}: {text}");
        assert!(text.contains(env!("CARGO_PKG_VERSION")), "{flag}: {text}");
        // The tests' build has the failpoints the crash harness needs.
        assert!(
            text.contains("(features: ") && text.contains("failpoints"),
            "{flag}: {text}"
        );
        assert_eq!(
            text.contains("foundationdb"),
            cfg!(feature = "foundationdb"),
            "{flag}: {text}"
        );
    }
}
