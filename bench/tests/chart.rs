//! `idem-bench chart` draws saved reports again: a short run's JSON in, an
//! SVG out with the run's panels; a file that is not a report is refused by
//! name and no chart is written.

mod common;

use common::LabelService;
use std::path::Path;
use std::process::Output;

async fn chart(reports: &[&Path], out: &Path) -> Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_idem-bench"))
        .arg("chart")
        .args(reports)
        .arg("--out")
        .arg(out)
        .output()
        .await
        .expect("idem-bench runs")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saved_report_is_drawn_again_and_anything_else_is_refused() {
    let service = LabelService::start(0.0).await;
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("steady.json");
    let run = common::run_bench(&service, &report, &[]).await;
    common::passed_http_report(&run, &report);
    service.running.shutdown().await.unwrap();

    let one = dir.path().join("one.svg");
    let output = chart(&[&report], &one).await;
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let svg = std::fs::read_to_string(&one).expect("the chart");
    assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(200)]);
    assert!(svg.contains("\nhttp "), "the run's panels, named as the run");
    assert!(
        svg.contains(": throughput (successful operations per second)"),
        "the run's panel"
    );

    let copy = dir.path().join("again.json");
    std::fs::copy(&report, &copy).unwrap();
    let two = dir.path().join("two.svg");
    let output = chart(&[&report, &copy], &two).await;
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let svg = std::fs::read_to_string(&two).expect("the chart of two reports");
    assert!(svg.contains("\nsteady: http "), "named after its file");
    assert!(svg.contains("\nagain: http "), "named after its file");

    let not_a_report = dir.path().join("other.json");
    std::fs::write(&not_a_report, r#"{"rows": []}"#).unwrap();
    let refused = dir.path().join("refused.svg");
    let output = chart(&[&report, &not_a_report], &refused).await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(stderr.contains("other.json is not an idem-bench report"), "{stderr}");
    assert!(!refused.exists(), "no chart from a refused input");
}
