//! `--prefer-wait`: with a carrier slower than the client's 250 ms deadline,
//! every first attempt times out while its purchase goes on, and the retry
//! finds the key in progress. Asking to wait, the retry is answered with the
//! first attempt's label (a replay after waiting) instead of 409; the audit
//! still finds each parcel bought once.

mod common;

use server::Config;

/// The simulated carrier's latency: always past the 250 ms deadline, and
/// over by less than the first retry's backoff plus the 2 s wait.
const CARRIER_LATENCY_MS_MIN: u64 = 400;
const CARRIER_LATENCY_MS_MAX: u64 = 600;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_that_ask_to_wait_get_the_answer_instead_of_409() {
    let slow_carrier = |config: &mut Config| {
        config.carrier.simulator.latency_ms_min = CARRIER_LATENCY_MS_MIN;
        config.carrier.simulator.latency_ms_max = CARRIER_LATENCY_MS_MAX;
    };
    let service = common::LabelService::start_with(0.0, slow_carrier).await;
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("report.json");
    let output = common::run_bench_at(
        &service,
        &json,
        "20",
        &["--prefer-wait", "2", "--duplicate-share", "0.2"],
    )
    .await;
    let http = common::passed_http_report(&output, &json);
    let audit = &http["audit"];
    assert_eq!(audit["labelled_exactly_once"], audit["intents"], "{audit}");
    assert_eq!(audit["parcels_bought_twice"], 0, "{audit}");
    let waits = &http["prefer_wait"];
    assert_eq!(waits["prefer_wait_s"], 2, "{waits}");
    assert!(waits["waiting_attempts"].as_u64().unwrap() > 0, "{waits}");
    assert!(
        waits["waited_then_replayed"].as_u64().unwrap() > 0,
        "no 409 became a replay by waiting: {waits}"
    );
    assert!(waits["waited_latency_ms_max"].as_f64().unwrap() > 0.0, "{waits}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("then replayed"), "{stdout}");
    service.running.shutdown().await.unwrap();
}
