//! The overload profile: the same client at 1x, 2x, 3x and again 1x of a
//! rate (the service's capacity), one open-loop phase each, back to back.
//!
//! Per phase it reports the goodput (intents started in the phase that got a
//! label, per second of the phase), the p99 of admitted attempts (every
//! answer but 503 `overloaded`, by the second the attempt was sent), the
//! attempts shed, and the intents lost and duplicated; and how long after
//! the overload ended the per-second p99 of admitted attempts was back under
//! the objective for [`RECOVERY_STEADY_S`] seconds in a row.

use super::client::{FulfilmentClient, IntentEntry, TimelineSecond};
use crate::engine::{LoadPlan, PlanError, run_open_loop};
use crate::interrupt;
use crate::report::{Table, ms, rate};
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The phases' rates as multiples of the capacity.
pub const PHASE_MULTIPLIERS: [f64; 4] = [1.0, 2.0, 3.0, 1.0];
/// Operation numbers of phase `n` start at `n` times this, so intents of
/// different phases never share a parcel.
const PHASE_INDEX_STRIDE: u64 = 100_000_000;
/// Seconds in a row the p99 must stay under the objective to count as
/// recovered.
pub const RECOVERY_STEADY_S: usize = 3;

/// One phase's figures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PhaseReport {
    pub multiplier: f64,
    pub offered_per_s: f64,
    pub duration_s: f64,
    pub intents: u64,
    /// Intents of the phase that got a label, per second of the phase.
    pub goodput_per_s: f64,
    /// Goodput over the capacity.
    pub goodput_share_of_capacity: f64,
    pub admitted_attempts: u64,
    pub admitted_p50_ms: f64,
    pub admitted_p99_ms: f64,
    pub shed_attempts: u64,
    pub lost: u64,
    pub duplicated: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OverloadReport {
    pub capacity_per_s: f64,
    pub slo_p99_ms: f64,
    pub phases: Vec<PhaseReport>,
    /// Seconds from the end of the overload to the first of
    /// [`RECOVERY_STEADY_S`] seconds in a row with p99 under the objective;
    /// `None` when that never happened within the last phase.
    pub recovery_s: Option<u64>,
}

/// Where a phase ran: its operation numbers and its seconds on the timeline.
struct PhaseSpan {
    multiplier: f64,
    index_base: u64,
    first_second: usize,
    end_second: usize,
    duration: Duration,
}

/// Runs the four phases with `client` at multiples of `plan.rate_per_s`.
pub async fn run_overload(
    plan: &LoadPlan,
    phase: Duration,
    slo_p99_ms: f64,
    client: Arc<FulfilmentClient>,
) -> Result<OverloadReport, PlanError> {
    let mut spans = Vec::new();
    for (number, multiplier) in PHASE_MULTIPLIERS.into_iter().enumerate() {
        let phase_plan = LoadPlan {
            rate_per_s: plan.rate_per_s * multiplier,
            // Only the first phase warms up; the others follow at once.
            warmup: if number == 0 { plan.warmup } else { Duration::ZERO },
            duration: phase,
            // Copies still running carry on into the next phase; the audit
            // and the phase figures count them at the end.
            drain: Duration::ZERO,
            index_base: number as u64 * PHASE_INDEX_STRIDE,
            label: format!("{} overload {multiplier}x", plan.label),
            ..plan.clone()
        };
        if number > 0 && interrupt::requested() {
            break;
        }
        let started = Instant::now() + phase_plan.warmup;
        // An interrupted phase ran for less than `phase`: its plan says how long.
        let ran = run_open_loop(&phase_plan, client.clone()).await?.plan.duration;
        spans.push(PhaseSpan {
            multiplier,
            index_base: phase_plan.index_base,
            first_second: client.timeline.second_of(started),
            end_second: client.timeline.second_of(Instant::now()),
            // The first phase's intents include its warm-up's: goodput is
            // over the time they were offered in.
            duration: ran + phase_plan.warmup,
        });
    }
    let copies_done = client.log.wait_all_done(client.settings().copy_time_max());
    interrupt::global().until_drained(copies_done).await;
    let timeline = client.timeline.snapshot();
    let intents = client.log.snapshot();
    let phases = spans
        .iter()
        .map(|span| phase_report(span, plan.rate_per_s, &timeline, &intents))
        .collect();
    let last = spans.last().map(|span| span.first_second).unwrap_or(0);
    Ok(OverloadReport {
        capacity_per_s: plan.rate_per_s,
        slo_p99_ms,
        phases,
        recovery_s: recovery_seconds(&timeline, last, slo_p99_ms),
    })
}

fn phase_report(span: &PhaseSpan, capacity: f64, timeline: &[TimelineSecond], intents: &[IntentEntry]) -> PhaseReport {
    let in_phase: Vec<&IntentEntry> = intents
        .iter()
        .filter(|entry| (span.index_base..span.index_base + PHASE_INDEX_STRIDE).contains(&entry.intent.index))
        .collect();
    let labelled = in_phase.iter().filter(|entry| !entry.labels.is_empty()).count() as u64;
    let seconds = span.duration.as_secs_f64().max(f64::MIN_POSITIVE);
    let window = timeline
        .get(span.first_second..span.end_second.min(timeline.len()))
        .unwrap_or(&[]);
    let admitted = merged(window);
    let goodput_per_s = labelled as f64 / seconds;
    PhaseReport {
        multiplier: span.multiplier,
        offered_per_s: capacity * span.multiplier,
        duration_s: seconds,
        intents: in_phase.len() as u64,
        goodput_per_s,
        goodput_share_of_capacity: goodput_per_s / capacity.max(f64::MIN_POSITIVE),
        admitted_attempts: admitted.len(),
        admitted_p50_ms: admitted.value_at_quantile(0.50) as f64 / 1_000.0,
        admitted_p99_ms: admitted.value_at_quantile(0.99) as f64 / 1_000.0,
        shed_attempts: window.iter().map(|second| second.shed).sum(),
        lost: in_phase.iter().filter(|entry| entry.labels.is_empty()).count() as u64,
        duplicated: in_phase.iter().filter(|entry| entry.labels.len() > 1).count() as u64,
    }
}

fn merged(seconds: &[TimelineSecond]) -> Histogram<u64> {
    let mut all = Histogram::<u64>::new(3).expect("3 significant figures is valid");
    for second in seconds {
        // Both auto-resize; adding cannot fail on range.
        let _ = all.add(&second.admitted);
    }
    all
}

/// The first second at or after `from` that starts [`RECOVERY_STEADY_S`]
/// seconds with admitted traffic and p99 under the objective, counted from `from`.
fn recovery_seconds(timeline: &[TimelineSecond], from: usize, slo_p99_ms: f64) -> Option<u64> {
    let calm = |second: &TimelineSecond| {
        !second.admitted.is_empty() && second.admitted.value_at_quantile(0.99) as f64 / 1_000.0 <= slo_p99_ms
    };
    let after = timeline.get(from..)?;
    after
        .windows(RECOVERY_STEADY_S)
        .position(|window| window.iter().all(calm))
        .map(|offset| offset as u64)
}

impl OverloadReport {
    pub fn render(&self) -> String {
        let mut table = Table::new(&[
            "phase",
            "offered/s",
            "goodput/s",
            "of capacity",
            "admitted p50",
            "admitted p99",
            "shed",
            "lost",
            "duplicated",
        ]);
        for phase in &self.phases {
            table.row(vec![
                format!("{}x", phase.multiplier),
                rate(phase.offered_per_s),
                rate(phase.goodput_per_s),
                format!("{:.0}%", phase.goodput_share_of_capacity * 100.0),
                ms(phase.admitted_p50_ms),
                ms(phase.admitted_p99_ms),
                phase.shed_attempts.to_string(),
                phase.lost.to_string(),
                phase.duplicated.to_string(),
            ]);
        }
        let recovery = match self.recovery_s {
            Some(seconds) => format!("{seconds} s"),
            None => "not within the last phase".into(),
        };
        format!(
            "overload profile, capacity {}/s:\n{}back to p99 <= {} ms for {RECOVERY_STEADY_S} s in a row: {recovery} after the overload ended\n",
            rate(self.capacity_per_s),
            table.render(),
            self.slo_p99_ms,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn second(latencies_us: &[u64], shed: u64) -> TimelineSecond {
        let mut admitted = Histogram::new(3).unwrap();
        for &latency in latencies_us {
            admitted.record(latency).unwrap();
        }
        TimelineSecond { admitted, shed }
    }

    #[test]
    fn recovery_needs_steady_seconds_under_the_objective() {
        let slow = second(&[50_000; 10], 0);
        let fast = second(&[2_000; 10], 0);
        let empty = second(&[], 5);
        let timeline = vec![
            slow.clone(),
            slow.clone(),
            fast.clone(),
            slow.clone(),
            fast.clone(),
            empty,
            fast.clone(),
            fast.clone(),
            fast.clone(),
        ];
        // From second 1: 2 is calm but 3 is not; 4 is calm, 5 had nothing
        // admitted; 6, 7, 8 are the first three calm seconds in a row.
        assert_eq!(recovery_seconds(&timeline, 1, 10.0), Some(5));
        assert_eq!(recovery_seconds(&timeline[..8], 1, 10.0), None);
        assert_eq!(recovery_seconds(&timeline, 0, 100.0), Some(0));
    }
}
