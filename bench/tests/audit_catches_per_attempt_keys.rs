//! The seed's first failure row, reproduced against an unmodified server: a
//! new key on every retry, with carrier replies lost after the purchase,
//! buys a second label for the same parcel. The audit must say so and the
//! command must exit non-zero.

mod common;

use bench::commands::EXIT_AUDIT_FAILED;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_attempt_keys_with_lost_replies_buy_duplicate_labels_and_fail_the_audit() {
    let service = common::LabelService::start(0.2).await;
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("report.json");
    let output = common::run_bench(
        &service,
        &json,
        &["--key-mode", "per-attempt", "--duplicate-share", "0"],
    )
    .await;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        output.status.code(),
        Some(i32::from(EXIT_AUDIT_FAILED)),
        "{stdout}\n{stderr}"
    );
    let report = common::read_report(&json);
    let http = &report["http"][0];
    let audit = &http["audit"];
    assert_eq!(audit["passed"], false);
    // About a fifth of the first purchases lost their reply; each retry
    // came with a new key and bought the parcel's label again.
    let bought_twice = audit["parcels_bought_twice"].as_u64().unwrap();
    assert!(bought_twice >= 5, "only {bought_twice} parcels bought twice: {audit}");
    assert!(audit["extra_purchases"].as_u64().unwrap() >= bought_twice);
    assert!(http["attempts"]["503_downstream_unavailable"].as_u64().unwrap() > 0);
    assert!(stdout.contains("audit FAILED"), "{stdout}");
    assert!(stdout.contains("bought from the carrier more than once"), "{stdout}");
    service.running.shutdown().await.unwrap();
}
