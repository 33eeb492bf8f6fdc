//! `idem-bench compare --mode full` on the embedded store, every phase a
//! second long: store mode with its baseline, the peak run, the ramp and the
//! overload profile each run (a spawned `server` each, the binary built
//! beside this test's), the load is recorded around each, and the one table
//! is printed. It asserts the shape and the audits, never a speed.

mod common;

#[test]
fn a_full_comparison_runs_every_phase_and_prints_the_one_table() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("full.json");
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_idem-bench"))
        .args([
            "compare",
            "--mode",
            "full",
            "--backend",
            "embedded",
            "--rate",
            "40",
            "--duration-s",
            "1",
        ])
        .args(["--warmup-s", "0", "--saturate-s", "1", "--saturate-rounds", "1"])
        .args([
            "--ramp-start",
            "40",
            "--ramp-step",
            "40",
            "--ramp-max",
            "80",
            "--ramp-step-s",
            "1",
        ])
        .args([
            "--ramp-refine",
            "0",
            "--phase-s",
            "1",
            "--settle-load",
            "1000",
            "--seed",
            "7",
            "--quiet",
        ])
        .arg("--json")
        .arg(&json)
        .output()
        .expect("idem-bench runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("the whole set, one run"), "{stdout}");
    let report = common::read_report(&json);
    assert_eq!(report["store"][0]["backend"], "embedded");
    assert!(
        report["store"][0]["ratio_to_baseline"].is_number(),
        "{}",
        report["store"]
    );
    let http = report["http"].as_array().unwrap();
    assert_eq!(http.len(), 3, "the peak run, the ramp and the overload profile");
    assert!(http[0]["open_loop"].is_object());
    assert!(http[1]["ramp"].is_object());
    let phases = http[2]["overload"]["phases"].as_array().unwrap();
    assert_eq!(phases.len(), 4, "1x, 2x, 3x, 1x");
    assert!(
        phases.iter().all(|phase| phase["unsent_attempts"].is_u64()),
        "each phase counts the attempts never sent: {phases:?}"
    );
    for run in http {
        assert_eq!(run["audit"]["passed"], true, "{}", run["audit"]);
    }
    let loads = report["run_loads"].as_array().unwrap();
    let names: Vec<&str> = loads.iter().map(|load| load["run"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        ["store embedded", "http embedded", "ramp embedded", "overload embedded"]
    );
    assert!(
        loads
            .iter()
            .all(|load| load["before_1m"].is_number() && load["after_1m"].is_number())
    );
}
