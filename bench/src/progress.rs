//! The live progress bar: elapsed seconds, and for the last whole second the
//! completion rate and p99 latency.
//!
//! indicatif draws only when standard error is a terminal, so logs and CI
//! output stay clean.

use crate::engine::{LoadPlan, SaturationPlan, Shared};
use crate::recorder::Recording;
use indicatif::{ProgressBar, ProgressStyle};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;

/// How often the bar is refreshed.
const REFRESH_MS: u64 = 250;

pub struct LiveProgress {
    running: Option<(ProgressBar, JoinHandle<()>)>,
}

impl LiveProgress {
    pub fn start(plan: &LoadPlan, shared: Arc<Shared>, start: Instant) -> Self {
        if !plan.show_progress {
            return Self { running: None };
        }
        let total = plan.warmup + plan.duration;
        Self::spawn(&plan.label, total, shared, start, plan.warmup)
    }

    pub fn start_saturation(plan: &SaturationPlan, shared: Arc<Shared>, start: Instant) -> Self {
        if !plan.show_progress {
            return Self { running: None };
        }
        let total = plan.warmup + plan.duration;
        Self::spawn(&plan.label, total, shared, start, plan.warmup)
    }

    fn spawn(label: &str, total: Duration, shared: Arc<Shared>, start: Instant, warmup: Duration) -> Self {
        let bar = ProgressBar::new(total.as_secs().max(1));
        let style = ProgressStyle::with_template("{prefix:>24} [{bar:30}] {pos:>4}/{len}s {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ");
        bar.set_style(style);
        bar.set_prefix(label.to_owned());
        let ticking = bar.clone();
        let ticker = tokio::spawn(async move {
            let mut interval = tokio::time::interval(Duration::from_millis(REFRESH_MS));
            loop {
                interval.tick().await;
                let elapsed = start.elapsed();
                ticking.set_position(elapsed.as_secs().min(total.as_secs()));
                let message = if elapsed < warmup {
                    format!(
                        "warm-up, {} started",
                        shared.started.load(std::sync::atomic::Ordering::Relaxed)
                    )
                } else {
                    last_second_summary(&shared.recording(), shared.in_flight())
                };
                ticking.set_message(message);
            }
        });
        Self {
            running: Some((bar, ticker)),
        }
    }

    pub fn finish(self) {
        if let Some((bar, ticker)) = self.running {
            ticker.abort();
            bar.finish_and_clear();
        }
    }
}

/// Rate and p99 of the last whole second of the measured window.
fn last_second_summary(recording: &Recording, in_flight: usize) -> String {
    let whole_seconds = recording.measured_start.elapsed().as_secs() as usize;
    let Some(bucket) = whole_seconds
        .checked_sub(1)
        .and_then(|last| recording.seconds.get(last))
    else {
        return format!("measuring, {} done", recording.completed());
    };
    let p99_ms = bucket.latency.value_at_quantile(0.99) as f64 / 1_000.0;
    format!(
        "rate {}/s  p99 {p99_ms:.2} ms  done {}  failed {}  in flight {in_flight}",
        bucket.successes_completed,
        recording.completed(),
        recording.failures,
    )
}
