//! `idem-bench day-report` over folders laid out as `scripts/day-of-keys`
//! writes them, made here with known figures: the day's table says what
//! those figures give (bytes per record, p99 against the empty store,
//! purges against inserts, the drifts, the restart times, PostgreSQL's
//! vacuum) and which targets they miss, the chart is drawn, a growth
//! folder's sizes are extrapolated along their line to 172.8M records, and
//! a folder that is not a run's is refused by name. The fixtures hold only
//! what the report reads, so the figures are also read from reports that
//! `idem-bench http` and `preload` really wrote.

mod common;

use bench::day_report::parse::{load_figures, preload_figures};
use bench::output::Report;
use common::LabelService;
use std::path::Path;
use std::process::Output;

/// Start of the fixture's samples, ms since the epoch.
const START_MS: u64 = 1_800_000_000_000;

fn write(folder: &Path, name: &str, text: &str) {
    std::fs::create_dir_all(folder).unwrap();
    std::fs::write(folder.join(name), text).unwrap();
}

fn scenario(backend: &str, records: u64, steady_s: u64, peak_s: u64) -> String {
    format!(
        "# Written by scripts/day-of-keys.\nbackend={backend}\nrecords_requested={records}\nrecords={records}\nretention_s={}\nsteady_rate_per_s=400\nsteady_s={steady_s}\npeak_rate_per_s=2000\npeak_s={peak_s}\nsweeper_interval_ms=10000\n",
        records / 400
    )
}

/// An `idem-bench http --json` report with only what the day's report reads.
fn http_report(achieved: f64, p50: f64, p99: f64, p999: f64, passed: bool) -> String {
    serde_json::json!({"http": [{
        "open_loop": {
            "achieved_rate_per_s": achieved,
            "latency": {"p50_ms": p50, "p99_ms": p99, "p999_ms": p999}
        },
        "audit": {"passed": passed}
    }]})
    .to_string()
}

fn preload_report(records: u64, bytes_per_record: f64) -> String {
    serde_json::json!({"preload": {
        "records_written": records,
        "records_per_s": 50_000.0,
        "settle": {"waited_s": 42.0, "at_rest": true, "backlog": null},
        "size": {"bytes_per_record": bytes_per_record}
    }})
    .to_string()
}

const SAMPLES_HEADER: &str =
    "unix_ms,phase,store_bytes,record_count,service_rss_kib,purged_total,created_total,dead_tuples,autovacuum_runs\n";

/// 100 s of the steady phase, a sample every 10 s: inserts at 400/s,
/// purges at 398/s, the record count drifting up to +2 %, the RSS to +20 %
/// of its reference (100 MiB at 10 s; the first sample, before it settled,
/// is left out), dead tuples rising to 9,000 with two autovacuum runs;
/// then one peak sample.
fn day_samples(records: u64) -> String {
    let mut text = SAMPLES_HEADER.to_owned();
    for tenth in 0..=10u64 {
        let rss_kib = match tenth {
            0 => 50 * 1024,
            10 => 120 * 1024,
            _ => 100 * 1024,
        };
        let count = records + records * 2 / 100 * tenth / 10;
        text.push_str(&format!(
            "{},steady,{},{count},{rss_kib},{},{},{},{}\n",
            START_MS + tenth * 10_000,
            count * 500,
            tenth * 3_980,
            tenth * 4_000,
            tenth * 900,
            tenth / 5
        ));
    }
    text.push_str(&format!(
        "{},peak,{},{records},{},0,0,9000,2\n",
        START_MS + 110_000,
        records * 500,
        100 * 1024
    ));
    text
}

fn write_day(folder: &Path, backend: &str, records: u64, bytes_per_record: f64) {
    write(folder, "scenario.txt", &scenario(backend, records, 100, 15));
    write(folder, "preload.json", &preload_report(records, bytes_per_record));
    write(folder, "empty-steady.json", &http_report(400.0, 1.5, 6.0, 12.0, true));
    write(folder, "steady.json", &http_report(399.0, 2.0, 12.0, 30.0, true));
    write(folder, "empty-peak.json", &http_report(1_998.0, 3.0, 20.0, 40.0, true));
    write(folder, "peak.json", &http_report(1_990.0, 4.0, 25.0, 60.0, false));
    write(folder, "samples.csv", &day_samples(records));
    write(
        folder,
        "restarts.csv",
        "signal,stopped_ms,ready_ms\nSIGTERM,2100,900\nSIGKILL,3,75000\n",
    );
}

fn day_report(folders: &[&Path]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_idem-bench"))
        .arg("day-report")
        .args(folders)
        .output()
        .unwrap()
}

fn stdout_of(output: &Output) -> String {
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// The table's row of `backend`, split into its cells.
fn row_of(table: &str, backend: &str) -> Vec<String> {
    let line = table
        .lines()
        .find(|line| line.starts_with(&format!("| {backend} |")))
        .unwrap_or_else(|| panic!("no row for {backend} in:\n{table}"));
    line.trim_matches('|')
        .split(" | ")
        .map(|cell| cell.trim().to_owned())
        .collect()
}

#[test]
fn the_days_table_has_each_backends_figures_and_the_targets_they_miss() {
    let dir = tempfile::tempdir().unwrap();
    let (embedded, postgres) = (dir.path().join("embedded"), dir.path().join("postgres"));
    write_day(&embedded, "embedded", 200_000, 600.0);
    write_day(&postgres, "postgres", 200_000, 480.0);
    let table = stdout_of(&day_report(&[&embedded, &postgres]));

    let row = row_of(&table, "embedded");
    assert_eq!(row[1], "200,000");
    assert_eq!(row[2], "600");
    assert_eq!(row[3], "2.00 / 12.00 / 30.00 at 399/s (1.50 / 6.00 / 12.00)");
    assert_eq!(row[4], "2.00");
    assert_eq!(row[5], "4.00 / 25.00 / 60.00 at 1990/s (3.00 / 20.00 / 40.00)");
    assert_eq!(row[6], "398 / 400");
    // Both drifts against the sample at 10 s: the count rose 2 % from
    // 0.2 %, the RSS 20 % from 100 MiB.
    assert_eq!(row[7], "+1.8 %");
    assert_eq!(row[8], "+20.0 %");
    assert_eq!(row[9], "0.9 s / 75.0 s");
    assert_eq!(row[10], "0 / 9,000 / 9,000, 2 runs");
    for missed in [
        "bytes/record > 512",
        "p99 at the steady rate > 1.5x empty",
        "RSS beyond ±10 %",
        "ready > 60 s after SIGKILL",
        "audit of the peak run failed",
    ] {
        assert!(row[11].contains(missed), "{missed} not in {}", row[11]);
    }
    assert!(!row[11].contains("record count"), "{}", row[11]);
    // 480 bytes a record meets the target; the restart targets are the
    // embedded store's.
    let row = row_of(&table, "postgres");
    assert_eq!(row[2], "480");
    assert!(!row[11].contains("bytes/record"), "{}", row[11]);
    assert!(!row[11].contains("SIGKILL"), "{}", row[11]);

    assert!(
        table.contains("loaded at 50000 records/s, at rest 42 s later"),
        "the preload's wait for rest is in the notes:\n{table}"
    );

    let chart = std::fs::read_to_string(embedded.join("day-of-keys.svg")).unwrap();
    assert!(chart.contains("store size (MiB)"), "no store size panel");
    assert!(chart.contains("service resident memory (MiB)"));
    assert!(chart.contains("dead tuples of idempotency_keys"));
}

#[test]
fn a_growth_folder_gives_a_row_per_size_and_their_line_at_the_worst_case() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "empty-steady.json",
        &http_report(400.0, 1.0, 5.0, 9.0, true),
    );
    // p99 of 5 + 1 ms per million records; 300 bytes a record and 200 MB
    // besides, so 500, 400 and 350 bytes a record at these sizes.
    for (records, p99) in [(1_000_000u64, 6.0), (2_000_000, 7.0), (4_000_000, 9.0)] {
        let size = dir.path().join(format!("size-{records}"));
        write(&size, "scenario.txt", &scenario("embedded", records, 100, 0));
        let bytes_per_record = 300.0 + 200_000_000.0 / records as f64;
        write(&size, "preload.json", &preload_report(records, bytes_per_record));
        write(&size, "steady.json", &http_report(400.0, 2.0, p99, 20.0, true));
        write(&size, "samples.csv", &day_samples(records));
        write(&size, "restarts.csv", "signal,stopped_ms,ready_ms\nSIGTERM,2000,1000\n");
    }
    let table = stdout_of(&day_report(&[dir.path()]));

    let lines: Vec<&str> = table.lines().filter(|line| line.starts_with("| ")).collect();
    assert_eq!(lines.len(), 5, "header and four rows:\n{table}");
    assert!(lines[1].starts_with("| 1,000,000 |"), "sizes in order:\n{table}");
    assert!(lines[3].starts_with("| 4,000,000 |"), "{table}");
    let worst = row_of(&table, "172,800,000 (linear fit)");
    // The last steady sample holds 102 % of the records, 500 bytes each.
    let store_mib = 172_800_000.0 * 1.02 * 500.0 / 1_048_576.0;
    let found_mib: f64 = worst[1].parse().unwrap();
    assert!((found_mib - store_mib).abs() < 1.0, "{found_mib} against {store_mib}");
    // Per record, from the line of the total: 300 + 200 MB / 172.8M.
    assert_eq!(worst[2], "301.2");
    assert_eq!(worst[3], "177.8", "p99 along its line at 172.8M");
    assert!(dir.path().join("size-1000000").join("day-of-keys.svg").is_file());
}

#[test]
fn a_folder_without_a_scenario_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let output = day_report(&[dir.path()]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(stderr.contains("scenario.txt"), "{stderr}");
    assert!(stderr.contains("not a day-of-keys folder"), "{stderr}");
}

/// The report reads its figures by their place in the JSON: here from the
/// reports the bench writes, compared with the same figures read through
/// the bench's own types, so that a renamed field fails here and not in a
/// day-long run's report.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_figures_are_read_from_the_reports_the_bench_really_writes() {
    let service = LabelService::start(0.0).await;
    let dir = tempfile::tempdir().unwrap();
    let http_json = dir.path().join("steady.json");
    let run = common::run_bench(&service, &http_json, &[]).await;
    common::passed_http_report(&run, &http_json);
    service.running.shutdown().await.unwrap();
    let figures = load_figures("steady.json", &common::read_report(&http_json)).expect("an http report's figures");
    let typed = Report::read_json(&http_json).unwrap();
    let open_loop = typed.http[0].open_loop.as_ref().expect("an open-loop run");
    assert_eq!(figures.achieved_per_s, open_loop.achieved_rate_per_s);
    assert_eq!(figures.p50_ms, open_loop.latency.p50_ms);
    assert_eq!(figures.p99_ms, open_loop.latency.p99_ms);
    assert_eq!(figures.p999_ms, open_loop.latency.p999_ms);
    assert!(figures.audit_passed);

    let preload_json = dir.path().join("preload.json");
    let store_dir = dir.path().join("store");
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_idem-bench"))
        .args([
            "preload",
            "--store-kind",
            "embedded",
            "--records",
            "500",
            "--quiet",
            "--json",
        ])
        .arg(&preload_json)
        .arg("--embedded-dir")
        .arg(&store_dir)
        .output()
        .await
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let figures = preload_figures("preload.json", &common::read_report(&preload_json)).expect("a preload's figures");
    let typed = Report::read_json(&preload_json)
        .unwrap()
        .preload
        .expect("a preload report");
    assert_eq!(figures.records_written, 500);
    assert_eq!(figures.records_written, typed.records_written);
    assert_eq!(figures.records_per_s, typed.records_per_s);
    assert_eq!(figures.bytes_per_record, typed.size.bytes_per_record);
    assert!(
        figures.bytes_per_record.is_some(),
        "the embedded store's size is measured"
    );
    assert_eq!(figures.settle, Some((typed.settle.waited_s, typed.settle.at_rest)));
    assert_eq!(
        figures.settle.map(|(_, at_rest)| at_rest),
        Some(true),
        "500 records leave no backlog"
    );
}
