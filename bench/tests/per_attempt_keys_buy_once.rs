//! docs/design.md#failure-new-key-per-attempt, against an unmodified server: a client that
//! makes a new key on every retry, with carrier replies lost after the
//! purchase. Each retry is a new record, but the Label service derives the
//! carrier's key from the parcel, not from the client's key, so the carrier
//! sells each parcel once and every retry gets that label back: the audit
//! finds no parcel bought twice. (With the carrier key taken from the
//! client's key, this run bought about a fifth of the parcels twice.)

mod common;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_attempt_keys_with_lost_replies_still_buy_each_parcel_once() {
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
    let report = common::read_report(&json);
    let http = &report["http"][0];
    let audit = &http["audit"];
    // The lost replies happened, and their retries came with new keys.
    assert!(
        http["attempts"]["503_downstream_unavailable"].as_u64().unwrap() > 0,
        "{}",
        http["attempts"]
    );
    assert_eq!(audit["parcels_bought_twice"], 0, "{audit}");
    assert_eq!(audit["extra_purchases"], 0, "{audit}");
    assert_eq!(audit["duplicate_labels"], 0, "{audit}");
    assert_eq!(audit["passed"], true, "{stdout}\n{stderr}");
    assert!(output.status.success(), "{stdout}\n{stderr}");
    service.running.shutdown().await.unwrap();
}
