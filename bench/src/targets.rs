//! The performance targets of BENCHMARKS.md, checked against whatever a report measured. The bench
//! reports them; it never fails a run on them (only the audit does), since
//! a busy machine can miss a latency target without anything being wrong.

use crate::http_mode::HttpReport;
use crate::http_mode::overload::OverloadReport;
use crate::output::Report;
use crate::ramp::RampReport;
use crate::report::RunSummary;
use serde::{Deserialize, Serialize};

/// Achieved rate at least this share of the target.
pub const ACHIEVED_SHARE_MIN: f64 = 0.99;
/// p99 at most this, in milliseconds.
pub const P99_MS_MAX: f64 = 10.0;
/// p99.9 at most this, in milliseconds.
pub const P999_MS_MAX: f64 = 50.0;
/// Server resident memory at most this, in MiB.
pub const SERVER_RSS_MIB_MAX: f64 = 150.0;
/// Store mode: saturated intents per second at least this share of the raw
/// baseline's pairs per second in the same run, per backend.
pub const STORE_RATIO_MIN: [(&str, f64); 3] = [("embedded", 0.75), ("redis", 0.75), ("postgres", 0.80)];
/// Overload: goodput at least this share of the capacity, per multiple of it.
pub const OVERLOAD_GOODPUT_SHARE_MIN: [(f64, f64); 2] = [(2.0, 0.90), (3.0, 0.80)];
/// Overload: p99 of the admitted attempts at most this in every phase, in milliseconds.
pub const OVERLOAD_ADMITTED_P99_MS_MAX: f64 = 50.0;
/// Overload: back under the latency objective within this many seconds of its end.
pub const OVERLOAD_RECOVERY_S_MAX: u64 = 5;
/// The highest rate with p99 within the SLO the embedded store aims for.
pub const EMBEDDED_HELD_PER_S_AIM: f64 = 10_000.0;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TargetCheck {
    pub target: String,
    pub run: String,
    pub measured: String,
    pub met: bool,
}

fn check(target: &str, run: &str, measured: String, met: bool) -> TargetCheck {
    TargetCheck {
        target: target.to_owned(),
        run: run.to_owned(),
        measured,
        met,
    }
}

pub fn evaluate(report: &Report) -> Vec<TargetCheck> {
    let mut checks = Vec::new();
    for http in &report.http {
        let name = format!("http {} ({} keys)", http.store_kind, http.key_mode);
        if let Some(run) = &http.open_loop {
            checks.extend(open_loop_checks(&name, run));
        }
        checks.extend(http_checks(&name, http));
        if let Some(ramp) = &http.ramp {
            checks.push(ramp_check(&name, ramp, http.store_kind == "embedded"));
        }
        if let Some(overload) = &http.overload {
            checks.extend(overload_checks(&name, overload));
        }
    }
    for store in &report.store {
        let name = format!("store {}", store.backend);
        let minimum = STORE_RATIO_MIN.iter().find(|(backend, _)| *backend == store.backend);
        if let (Some((_, minimum)), Some(ratio)) = (minimum, store.ratio_to_baseline) {
            checks.push(check(
                &format!(
                    "saturated intents/s >= {:.0}% of the raw baseline's pairs/s",
                    minimum * 100.0
                ),
                &name,
                format!("{:.0}%", ratio * 100.0),
                ratio >= *minimum,
            ));
        }
        if let Some(ramp) = &store.ramp {
            checks.push(ramp_check(&name, ramp, store.backend == "embedded"));
        }
    }
    checks
}

fn open_loop_checks(name: &str, run: &RunSummary) -> Vec<TargetCheck> {
    let run_name = format!(
        "{name} at {:.0}/s for {:.0} s",
        run.target_rate_per_s.unwrap_or(0.0),
        run.duration_s
    );
    let share = run.achieved_share_of_offered().unwrap_or(0.0);
    vec![
        check(
            "achieved rate within 1% of target (of the rate offered)",
            &run_name,
            format!(
                "{:.0}/s of {:.0}/s offered ({:.1}%)",
                run.achieved_rate_per_s,
                run.offered_rate_per_s.unwrap_or(0.0),
                share * 100.0
            ),
            share >= ACHIEVED_SHARE_MIN,
        ),
        check(
            "p99 <= 10 ms",
            &run_name,
            format!("{:.2} ms", run.latency.p99_ms),
            run.latency.p99_ms <= P99_MS_MAX,
        ),
        check(
            "p99.9 <= 50 ms",
            &run_name,
            format!("{:.2} ms", run.latency.p999_ms),
            run.latency.p999_ms <= P999_MS_MAX,
        ),
    ]
}

fn http_checks(name: &str, http: &HttpReport) -> Vec<TargetCheck> {
    let audit = &http.audit;
    let mut checks = vec![check(
        "zero duplicate labels and zero lost intents (audit)",
        name,
        format!(
            "{} lost, {} duplicate labels, {} parcels bought twice, {}",
            audit.lost,
            audit.duplicate_labels,
            audit.parcels_bought_twice,
            if audit.passed { "passed" } else { "FAILED" }
        ),
        audit.passed,
    )];
    if let Some(peak) = http.server_peak_rss_mib {
        checks.push(check(
            "server resident memory <= 150 MB",
            name,
            format!("peak {peak:.1} MiB"),
            peak <= SERVER_RSS_MIB_MAX,
        ));
    }
    checks
}

fn overload_checks(name: &str, overload: &OverloadReport) -> Vec<TargetCheck> {
    let run = format!("{name}, overload of {:.0}/s", overload.capacity_per_s);
    let mut checks = Vec::new();
    for (multiple, minimum) in OVERLOAD_GOODPUT_SHARE_MIN {
        if let Some(phase) = overload.phases.iter().find(|phase| phase.multiplier == multiple) {
            checks.push(check(
                &format!("goodput at {multiple}x capacity >= {:.0}% of capacity", minimum * 100.0),
                &run,
                format!("{:.0}%", phase.goodput_share_of_capacity * 100.0),
                phase.goodput_share_of_capacity >= minimum,
            ));
        }
    }
    let worst_p99 = overload
        .phases
        .iter()
        .map(|phase| phase.admitted_p99_ms)
        .fold(0.0, f64::max);
    checks.push(check(
        &format!("p99 of admitted attempts <= {OVERLOAD_ADMITTED_P99_MS_MAX} ms in every phase"),
        &run,
        format!("worst {worst_p99:.2} ms"),
        worst_p99 <= OVERLOAD_ADMITTED_P99_MS_MAX,
    ));
    checks.push(check(
        &format!("back to p99 <= SLO within {OVERLOAD_RECOVERY_S_MAX} s of the end"),
        &run,
        match overload.recovery_s {
            Some(seconds) => format!("{seconds} s"),
            None => "not within the last phase".to_owned(),
        },
        overload
            .recovery_s
            .is_some_and(|seconds| seconds <= OVERLOAD_RECOVERY_S_MAX),
    ));
    let duplicated: u64 = overload.phases.iter().map(|phase| phase.duplicated).sum();
    checks.push(check(
        "0 duplicated intents in every phase",
        &run,
        duplicated.to_string(),
        duplicated == 0,
    ));
    checks
}

fn ramp_check(name: &str, ramp: &RampReport, is_embedded: bool) -> TargetCheck {
    let held = ramp.highest_held_per_s.unwrap_or(0.0);
    let (target, met) = if is_embedded {
        (
            "highest rate with p99 <= SLO (aim >= 10,000/s)",
            held >= EMBEDDED_HELD_PER_S_AIM,
        )
    } else {
        (
            "highest rate with p99 <= SLO (reported)",
            ramp.highest_held_per_s.is_some(),
        )
    };
    check(
        target,
        name,
        format!("{held:.0}/s (SLO p99 <= {} ms)", ramp.settings.slo_p99_ms),
        met,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recorder::{Outcome, Recording};
    use std::time::{Duration, Instant};

    fn run_with_latency(latency: Duration, rate: f64, completions: u64) -> RunSummary {
        let start = Instant::now();
        let mut recording = Recording::new(start);
        for index in 0..completions {
            let intended = start + Duration::from_secs_f64(index as f64 / rate);
            recording.record(intended, intended + latency, Outcome::success("labelled"));
        }
        let mut summary =
            RunSummary::of_recording("http", "open_loop", &recording, Duration::ZERO, Duration::from_secs(1));
        summary.target_rate_per_s = Some(rate);
        summary.offered_rate_per_s = Some(rate);
        summary
    }

    #[test]
    fn open_loop_targets_are_met_or_missed_by_the_numbers() {
        let fast = open_loop_checks("http embedded", &run_with_latency(Duration::from_millis(2), 100.0, 100));
        assert!(fast.iter().all(|check| check.met), "{fast:?}");
        let slow = open_loop_checks("http embedded", &run_with_latency(Duration::from_millis(60), 100.0, 90));
        assert!(slow.iter().all(|check| !check.met), "{slow:?}");
    }
}
