//! The metastable profile never rots: a short run (1x, a trigger of 6x for
//! three seconds, 1x again) against the Label service on the embedded
//! store. It asserts the audit's exactly-once half (no parcel bought twice,
//! no intent with two labels) and that the service answers with labels
//! again after the trigger, and that its chart is drawn; never a speed.

mod common;

use common::LabelService;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_trigger_the_service_answers_again_and_nothing_is_bought_twice() {
    let service = LabelService::start(0.0).await;
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("report.json");
    let chart = dir.path().join("metastable.svg");
    let chart_argument = chart.display().to_string();
    let profile = [
        "--chart",
        &chart_argument,
        "--profile",
        "metastable",
        "--steady-s",
        "2",
        "--trigger-multiplier",
        "6",
        "--trigger-s",
        "3",
        "--after-s",
        "5",
    ];
    let output = common::run_bench_at(&service, &json, "50", &profile).await;
    // Intents whose retries ran out during the trigger are lost, which
    // fails the audit and the exit status: not this test's business.
    assert!(json.exists(), "{}", String::from_utf8_lossy(&output.stderr));
    let http = &common::read_report(&json)["http"][0];
    let audit = &http["audit"];
    assert_eq!(audit["duplicate_labels"], 0, "{audit}");
    assert_eq!(audit["parcels_bought_twice"], 0, "{audit}");
    let seconds = http["overload"]["seconds"].as_array().expect("second by second");
    assert!(seconds.len() >= 9, "{seconds:?}");
    let last_two = &seconds[seconds.len() - 2..];
    assert!(
        last_two
            .iter()
            .all(|second| second["goodput_per_s"].as_f64().unwrap() > 0.0),
        "labels again after the trigger: {seconds:?}"
    );
    assert!(
        seconds.iter().any(|second| !second["wasted_work_share"].is_null()),
        "the server's work was sampled: {seconds:?}"
    );
    // The run's chart is drawn from the seconds above.
    let svg = std::fs::read_to_string(&chart).expect("the run's chart");
    for panel in ["offered, goodput and shed", "admitted latency", "wasted work"] {
        assert!(svg.contains(panel), "the chart's {panel} panel");
    }
    service.running.shutdown().await.unwrap();
}
