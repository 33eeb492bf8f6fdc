//! The Fulfilment service done right: one derived key per intent, the same
//! key on every retry. With carrier replies lost and intents sent twice at
//! once, every intent still ends with exactly one label, nothing is bought
//! twice, and the counts agree with the server's metrics.

mod common;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn derived_keys_survive_lost_replies_and_duplicates_with_a_clean_audit() {
    let service = common::LabelService::start(0.2).await;
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("report.json");
    let output = common::run_bench(&service, &json, &["--key-mode", "derived", "--duplicate-share", "0.2"]).await;
    let http = common::passed_http_report(&output, &json);
    let audit = &http["audit"];
    assert_eq!(audit["lost"], 0);
    assert_eq!(audit["duplicate_labels"], 0);
    assert_eq!(audit["parcels_bought_twice"], 0);
    assert_eq!(audit["labelled_exactly_once"], audit["intents"]);
    // The faults really happened: replies were lost (503, then a takeover
    // with the same key) and duplicates met a held lease or a saved answer.
    assert!(
        http["attempts"]["503_downstream_unavailable"].as_u64().unwrap() > 0,
        "{}",
        http["attempts"]
    );
    assert!(audit["intents_sent_twice"].as_u64().unwrap() > 0);
    let repeats = audit["client_answers"]["replays"].as_u64().unwrap()
        + audit["client_answers"]["in_progress_409"].as_u64().unwrap();
    assert!(repeats > 0, "{audit}");
    assert!(
        audit["count_checks"]
            .as_array()
            .unwrap()
            .iter()
            .all(|check| check["agrees"] == true)
    );
    // The run names its client: the design's, by default, and its pool's order.
    assert_eq!(http["client_profile"], "standard", "{}", http["client_profile"]);
    assert_eq!(http["pool_order"], "adaptive-lifo", "{}", http["pool_order"]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("(derived keys, standard client, adaptive-lifo pool) audit PASSED"),
        "{stdout}"
    );
    service.running.shutdown().await.unwrap();
}
