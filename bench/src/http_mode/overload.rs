//! The overload profile: the same client at 1x, 2x, 3x and again 1x of a
//! rate (the service's capacity), one open-loop phase each, back to back.
//! The metastable profile is the same machinery with other phases: steady
//! at 1x, a trigger (3x by default), then 1x again for longer, reported
//! second by second with the share of the service's work done for clients
//! that had already given up (the server's `idem_work_done_total`), and the
//! time until goodput and latency are back (Bronson et al., "Metastable
//! Failures in Distributed Systems", HotOS 2021).
//!
//! Per phase it reports the goodput (intents started in the phase that got a
//! label, per second of the phase), the p99 of admitted attempts (every
//! attempt sent and not answered 503 `overloaded`, by the second the
//! attempt was sent), the attempts shed, those never sent (no connection
//! from the client's pool within their deadline: a queue of the client's,
//! not the service's), and the intents lost and duplicated; and how long after
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

/// The overload profile's rates as multiples of the capacity.
pub const PHASE_MULTIPLIERS: [f64; 4] = [1.0, 2.0, 3.0, 1.0];
/// Recovered, in the metastable profile: goodput at least this share of
/// the offered rate, ...
pub const RECOVERED_GOODPUT_SHARE_MIN: f64 = 0.95;
/// ... and the admitted p99 at most this, for [`RECOVERY_STEADY_S`] seconds.
pub const RECOVERED_P99_MS_MAX: f64 = 50.0;

/// One open-loop phase: a multiple of the rate, for a time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Phase {
    pub multiplier: f64,
    pub duration: Duration,
}

/// The overload profile's phases, each `phase` long.
pub fn overload_phases(phase: Duration) -> Vec<Phase> {
    PHASE_MULTIPLIERS
        .into_iter()
        .map(|multiplier| Phase {
            multiplier,
            duration: phase,
        })
        .collect()
}

/// The metastable profile's phases: steady, the trigger, and the time after.
pub fn metastable_phases(steady: Duration, trigger_multiplier: f64, trigger: Duration, after: Duration) -> Vec<Phase> {
    vec![
        Phase {
            multiplier: 1.0,
            duration: steady,
        },
        Phase {
            multiplier: trigger_multiplier,
            duration: trigger,
        },
        Phase {
            multiplier: 1.0,
            duration: after,
        },
    ]
}

/// One second of a run, for the metastable profile's table and chart.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SecondReport {
    pub second: u64,
    pub offered_per_s: f64,
    /// Attempts sent in this second that were answered with a label.
    pub goodput_per_s: f64,
    pub admitted_p50_ms: f64,
    pub admitted_p99_ms: f64,
    pub shed: u64,
    /// Attempts that got no connection from the client's pool within their
    /// deadline: never sent, so neither admitted nor shed (absent in older
    /// reports, whose admitted figures counted them at their deadline).
    #[serde(default)]
    pub unsent: u64,
    /// Of the service's requests whose work ended in this second, the share
    /// whose client had already given up (`None`: no sample).
    pub wasted_work_share: Option<f64>,
    /// The service's own mean time for the `POST /v1/labels` requests it
    /// answered in this second, from reading the request to answering,
    /// sheds included. Beside the client's admitted p50 it tells the time
    /// spent in the service from the time spent before and after it (the
    /// client's connection pool, its runtime, the kernel). `None`: no
    /// sample, or nothing answered.
    #[serde(default)]
    pub service_mean_ms: Option<f64>,
}
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
    /// As [`SecondReport::unsent`], over the phase.
    #[serde(default)]
    pub unsent_attempts: u64,
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
    /// Second by second (the metastable profile; empty for overload).
    #[serde(default)]
    pub seconds: Vec<SecondReport>,
    /// Seconds from the end of the trigger until goodput is at least
    /// [`RECOVERED_GOODPUT_SHARE_MIN`] of offered and p99 at most
    /// [`RECOVERED_P99_MS_MAX`] for [`RECOVERY_STEADY_S`] seconds in a row.
    #[serde(default)]
    pub recovered_s: Option<u64>,
    /// Over the whole run, the share of the service's work whose client had
    /// already given up.
    #[serde(default)]
    pub wasted_work_share: Option<f64>,
}

/// The service's cumulative figures, summed over the instances, at one
/// moment.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ServiceSample {
    /// `idem_work_done_total{client="waiting"}`.
    pub work_for_waiting: u64,
    /// `idem_work_done_total{client="gone"}`.
    pub work_for_gone: u64,
    /// `idem_http_request_duration_seconds` of `POST /v1/labels`: its sum
    /// and count.
    pub label_requests_seconds: f64,
    pub label_requests: u64,
}

/// The service's figures, sampled once a second.
pub type ServiceSamples = Vec<ServiceSample>;

impl ServiceSample {
    /// The figures of one instance's `/metrics` text.
    fn from_metrics(text: &str) -> Self {
        use test_support::http::metric_value;
        let work = |client: &str| metric_value(text, "idem_work_done_total", &[&format!("client=\"{client}\"")]) as u64;
        let label_requests = [r#"route="/v1/labels""#, r#"method="POST""#];
        Self {
            work_for_waiting: work("waiting"),
            work_for_gone: work("gone"),
            label_requests_seconds: metric_value(text, "idem_http_request_duration_seconds_sum", &label_requests),
            label_requests: metric_value(text, "idem_http_request_duration_seconds_count", &label_requests) as u64,
        }
    }

    fn add(&mut self, other: &Self) {
        self.work_for_waiting += other.work_for_waiting;
        self.work_for_gone += other.work_for_gone;
        self.label_requests_seconds += other.label_requests_seconds;
        self.label_requests += other.label_requests;
    }
}

/// Where a phase ran: its operation numbers and its seconds on the timeline.
struct PhaseSpan {
    multiplier: f64,
    index_base: u64,
    first_second: usize,
    end_second: usize,
    duration: Duration,
}

/// Runs `phases` with `client` at multiples of `plan.rate_per_s`. With
/// `service_sampler` (the metastable profile), a second-by-second report too.
pub async fn run_overload(
    plan: &LoadPlan,
    phases: &[Phase],
    slo_p99_ms: f64,
    client: Arc<FulfilmentClient>,
    service_sampler: Option<&ServiceSampler>,
) -> Result<OverloadReport, PlanError> {
    let mut spans = Vec::new();
    for (
        number,
        &Phase {
            multiplier,
            duration: phase,
        },
    ) in phases.iter().enumerate()
    {
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
    let mut report = OverloadReport {
        capacity_per_s: plan.rate_per_s,
        slo_p99_ms,
        phases,
        recovery_s: recovery_seconds(&timeline, last, slo_p99_ms),
        seconds: Vec::new(),
        recovered_s: None,
        wasted_work_share: None,
    };
    if let Some(sampler) = service_sampler {
        let samples = sampler.samples();
        report.seconds = second_reports(&spans, plan.rate_per_s, &timeline, &samples);
        let first = spans.first().map_or(0, |span| span.first_second);
        report.recovered_s = recovered_seconds(&report.seconds, last.saturating_sub(first));
        report.wasted_work_share = wasted_share(samples.first(), samples.last());
    }
    Ok(report)
}

/// The offered rate in `second`: its phase's.
fn offered_in(spans: &[PhaseSpan], capacity: f64, second: usize) -> f64 {
    spans
        .iter()
        .find(|span| (span.first_second..span.end_second.max(span.first_second + 1)).contains(&second))
        .map_or(0.0, |span| capacity * span.multiplier)
}

fn second_reports(
    spans: &[PhaseSpan],
    capacity: f64,
    timeline: &[TimelineSecond],
    samples: &ServiceSamples,
) -> Vec<SecondReport> {
    let first = spans.first().map_or(0, |span| span.first_second);
    let end = spans.last().map_or(0, |span| span.end_second).min(timeline.len());
    (first..end)
        .map(|second| {
            let figures = &timeline[second];
            SecondReport {
                second: (second - first) as u64,
                offered_per_s: offered_in(spans, capacity, second),
                goodput_per_s: figures.labelled as f64,
                admitted_p50_ms: figures.admitted.value_at_quantile(0.50) as f64 / 1_000.0,
                admitted_p99_ms: figures.admitted.value_at_quantile(0.99) as f64 / 1_000.0,
                shed: figures.shed,
                unsent: figures.unsent,
                wasted_work_share: wasted_share(samples.get(second), samples.get(second + 1)),
                service_mean_ms: service_mean_ms(samples.get(second), samples.get(second + 1)),
            }
        })
        .collect()
}

/// The share of work done for clients already gone between two samples.
fn wasted_share(before: Option<&ServiceSample>, after: Option<&ServiceSample>) -> Option<f64> {
    let (before, after) = (before?, after?);
    let gone = after.work_for_gone.saturating_sub(before.work_for_gone);
    let total = gone + after.work_for_waiting.saturating_sub(before.work_for_waiting);
    (total > 0).then(|| gone as f64 / total as f64)
}

/// The service's mean time per label request answered between two samples.
fn service_mean_ms(before: Option<&ServiceSample>, after: Option<&ServiceSample>) -> Option<f64> {
    let (before, after) = (before?, after?);
    let requests = after.label_requests.saturating_sub(before.label_requests);
    let seconds = (after.label_requests_seconds - before.label_requests_seconds).max(0.0);
    (requests > 0).then(|| seconds * 1_000.0 / requests as f64)
}

/// Seconds after `trigger_end` (an index into `seconds`) until the run is
/// back: [`RECOVERY_STEADY_S`] seconds in a row with goodput and p99
/// recovered.
fn recovered_seconds(seconds: &[SecondReport], trigger_end: usize) -> Option<u64> {
    let recovered = |second: &SecondReport| {
        second.offered_per_s > 0.0
            && second.goodput_per_s >= RECOVERED_GOODPUT_SHARE_MIN * second.offered_per_s
            && second.admitted_p99_ms <= RECOVERED_P99_MS_MAX
    };
    seconds
        .get(trigger_end..)?
        .windows(RECOVERY_STEADY_S)
        .position(|window| window.iter().all(recovered))
        .map(|offset| offset as u64)
}

/// Samples the service's figures once a second while a run goes on.
pub struct ServiceSampler {
    samples: Arc<std::sync::Mutex<ServiceSamples>>,
    task: tokio::task::JoinHandle<()>,
}

/// Samples kept at most (a day of seconds).
const SERVICE_SAMPLES_MAX: usize = 24 * 3600;

impl ServiceSampler {
    /// Starts sampling `base_urls`' `/metrics` with `admin`, aligned with
    /// `client`'s timeline (sample N is taken at the start of second N).
    pub fn start(admin: reqwest::Client, base_urls: Vec<String>, client: &FulfilmentClient) -> Self {
        let samples: Arc<std::sync::Mutex<ServiceSamples>> = Arc::default();
        let recorded = samples.clone();
        let start = client.timeline.start();
        let task = tokio::spawn(async move {
            let mut next = tokio::time::Instant::from_std(start);
            loop {
                tokio::time::sleep_until(next).await;
                let sample = service_sample(&admin, &base_urls).await;
                let mut samples = recorded.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                if samples.len() >= SERVICE_SAMPLES_MAX {
                    return;
                }
                // A failed scrape repeats the last sample: nothing counted.
                let last = samples.last().copied().unwrap_or_default();
                samples.push(sample.unwrap_or(last));
                drop(samples);
                next += Duration::from_secs(1);
            }
        });
        Self { samples, task }
    }

    fn samples(&self) -> ServiceSamples {
        self.samples
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }
}

impl Drop for ServiceSampler {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The figures summed over the instances, or `None` if one failed.
async fn service_sample(admin: &reqwest::Client, base_urls: &[String]) -> Option<ServiceSample> {
    let mut total = ServiceSample::default();
    for base_url in base_urls {
        let text = admin
            .get(format!("{base_url}/metrics"))
            .send()
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        total.add(&ServiceSample::from_metrics(&text));
    }
    Some(total)
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
        unsent_attempts: window.iter().map(|second| second.unsent).sum(),
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
            "unsent",
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
                phase.unsent_attempts.to_string(),
                phase.lost.to_string(),
                phase.duplicated.to_string(),
            ]);
        }
        let recovery = match self.recovery_s {
            Some(seconds) => format!("{seconds} s"),
            None => "not within the last phase".into(),
        };
        let mut text = format!(
            "overload profile, capacity {}/s:\n{}back to p99 <= {} ms for {RECOVERY_STEADY_S} s in a row: {recovery} after the overload ended\n",
            rate(self.capacity_per_s),
            table.render(),
            self.slo_p99_ms,
        );
        if !self.seconds.is_empty() {
            text.push_str(&self.render_seconds());
        }
        text
    }

    fn render_seconds(&self) -> String {
        let mut table = Table::new(&[
            "second",
            "offered/s",
            "goodput/s",
            "admitted p50",
            "admitted p99",
            "shed",
            "unsent",
            "wasted work",
            "service mean",
        ]);
        for second in &self.seconds {
            table.row(vec![
                second.second.to_string(),
                rate(second.offered_per_s),
                rate(second.goodput_per_s),
                ms(second.admitted_p50_ms),
                ms(second.admitted_p99_ms),
                second.shed.to_string(),
                second.unsent.to_string(),
                share(second.wasted_work_share),
                second.service_mean_ms.map_or_else(|| "-".to_owned(), ms),
            ]);
        }
        let recovered = match self.recovered_s {
            Some(seconds) => format!("{seconds} s"),
            None => "not within the last phase".into(),
        };
        format!(
            "second by second:\n{}back to goodput >= {:.0}% of offered and p99 <= {RECOVERED_P99_MS_MAX} ms for {RECOVERY_STEADY_S} s in a row: {recovered} after the trigger ended\nwasted work (the service's work for clients already gone), whole run: {}\n",
            table.render(),
            RECOVERED_GOODPUT_SHARE_MIN * 100.0,
            share(self.wasted_work_share),
        )
    }
}

fn share(value: Option<f64>) -> String {
    value.map_or_else(|| "-".to_owned(), |share| format!("{:.1}%", share * 100.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn second(latencies_us: &[u64], shed: u64) -> TimelineSecond {
        let mut admitted = Histogram::new(3).unwrap();
        for &latency in latencies_us {
            admitted.record(latency).unwrap();
        }
        TimelineSecond {
            admitted,
            shed,
            unsent: 0,
            labelled: 0,
        }
    }

    #[test]
    fn the_service_figures_of_a_second_come_from_two_samples_of_its_metrics() {
        let metrics = |waiting: u64, gone: u64, seconds: f64, requests: u64| {
            format!(
                "idem_work_done_total{{client=\"waiting\"}} {waiting}\n\
                 idem_work_done_total{{client=\"gone\"}} {gone}\n\
                 idem_http_request_duration_seconds_sum{{route=\"/v1/labels\",method=\"POST\"}} {seconds}\n\
                 idem_http_request_duration_seconds_count{{route=\"/v1/labels\",method=\"POST\"}} {requests}\n\
                 idem_http_request_duration_seconds_sum{{route=\"/metrics\",method=\"GET\"}} 99\n\
                 idem_http_request_duration_seconds_count{{route=\"/metrics\",method=\"GET\"}} 1\n"
            )
        };
        let before = ServiceSample::from_metrics(&metrics(100, 10, 2.0, 200));
        let after = ServiceSample::from_metrics(&metrics(130, 20, 2.5, 220));
        assert_eq!(wasted_share(Some(&before), Some(&after)), Some(0.25));
        // 0.5 s over 20 label requests; the scrape's own request is not one.
        let mean_ms = service_mean_ms(Some(&before), Some(&after)).expect("requests answered");
        assert!((mean_ms - 25.0).abs() < 1e-9, "{mean_ms}");
        assert_eq!(service_mean_ms(Some(&after), Some(&after)), None, "nothing answered");
        assert_eq!(service_mean_ms(None, Some(&after)), None, "no sample");
        let mut two_instances = before;
        two_instances.add(&after);
        assert_eq!(two_instances.label_requests, 420);
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
