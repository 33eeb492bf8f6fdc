//! `idem-bench disk` run as an operator runs it: a one-second probe at 200
//! syncs per second reports about 200 syncs with ordered percentiles and
//! removes its probe file; an argument out of its range is refused by name
//! before anything is written, and so is a directory that does not exist.

use std::path::Path;
use std::process::{Command, Output};

fn disk(arguments: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_idem-bench"))
        .arg("disk")
        .args(arguments)
        .output()
        .expect("idem-bench runs")
}

fn path_argument(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 temporary path")
}

fn entries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

#[test]
fn a_short_probe_reports_its_syncs_and_removes_its_file() {
    let probed = tempfile::tempdir().unwrap();
    let reports = tempfile::tempdir().unwrap();
    let json = reports.path().join("disk.json");
    let output = disk(&[
        "--dir",
        path_argument(probed.path()),
        "--rate",
        "200",
        "--duration-s",
        "1",
        "--json",
        path_argument(&json),
    ]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.starts_with("machine: "), "{stdout}");
    assert!(stdout.contains("\nfdatasync of a 4096-byte append, "), "{stdout}");
    assert!(stdout.contains("\nstalls over 50 ms: "), "{stdout}");

    let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(report["calls_planned"], 200, "{report}");
    let calls = report["calls"].as_u64().unwrap();
    // A slow sync near the end leaves the calls due after it unstarted:
    // on a busy test machine one sync can take hundreds of milliseconds.
    assert!((20..=200).contains(&calls), "{report}");
    let figure = |name: &str| report["fdatasync"][name].as_f64().unwrap();
    let (p50, p99, max) = (figure("p50_ms"), figure("p99_ms"), figure("max_ms"));
    assert!(p50 > 0.0, "{report}");
    assert!(max >= p99 && p99 >= p50, "{report}");
    let stalls_listed = report["stalls"].as_array().unwrap().len() as u64;
    assert!(stalls_listed <= report["stalls_total"].as_u64().unwrap(), "{report}");

    assert_eq!(
        entries(probed.path()),
        Vec::<String>::new(),
        "the probe file is removed"
    );
}

#[test]
fn an_argument_out_of_range_is_refused_by_name_and_nothing_is_written() {
    let probed = tempfile::tempdir().unwrap();
    let json = probed.path().join("disk.json");
    let dir = path_argument(probed.path());
    let json_argument = path_argument(&json);
    let refusals = [
        (vec!["--rate", "0"], "--rate 0 must be between 1 and 100000"),
        (
            vec!["--write-bytes", "1048577"],
            "--write-bytes 1048577 must be between 1 and 1048576",
        ),
        (
            vec!["--duration-s", "3601"],
            "--duration-s 3601 must be between 1 and 3600",
        ),
    ];
    for (arguments, message) in refusals {
        let mut all = vec!["--dir", dir, "--json", json_argument];
        all.extend(arguments);
        let output = disk(&all);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{message}");
        assert!(stderr.contains(message), "{stderr}");
        assert_eq!(
            entries(probed.path()),
            Vec::<String>::new(),
            "nothing written for {message}"
        );
    }

    let missing = probed.path().join("missing");
    let output = disk(&["--dir", path_argument(&missing), "--json", json_argument]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains(&format!("cannot create a probe file in {}", missing.display())),
        "{stderr}"
    );
    assert!(!json.exists(), "no report for a probe that did not run");
}
