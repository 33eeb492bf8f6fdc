//! One store-mode benchmark of one backend: the open-loop run (or ramp) at
//! the target rate, then a closed-loop saturation of intents and of the raw
//! baseline on the same engine or server, and their ratio.

use super::{ReferenceRate, StoreTarget};
use crate::engine::{LoadPlan, PlanError, SaturationPlan, SaturationResult, run_open_loop, run_saturation};
use crate::interrupt;
use crate::ramp::{RampReport, RampSettings, run_ramp};
use crate::report::RunSummary;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Operation numbers reserved per phase, so phases never share an intent.
const INDEXES_PER_PHASE: u64 = 1 << 44;

/// A closed-loop saturation phase.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SaturationSettings {
    pub concurrency: usize,
    pub warmup: Duration,
    /// Total measured time of each side (intents, baseline).
    pub duration: Duration,
    /// Turns each side takes, alternating.
    pub rounds: u32,
}

/// What to run against each target.
#[derive(Debug, Clone)]
pub struct StoreRunSettings {
    /// The open-loop plan; its label is replaced by the backend's name.
    pub load: LoadPlan,
    /// Run a ramp instead of one open-loop run.
    pub ramp: Option<RampSettings>,
    /// Saturate intents and the baseline; `None` skips both.
    pub saturation: Option<SaturationSettings>,
    pub baseline: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BaselineReport {
    pub name: String,
    pub description: String,
    pub summary: RunSummary,
}

/// Everything store mode measured for one backend.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoreReport {
    pub backend: String,
    pub notes: Vec<String>,
    pub open_loop: Option<RunSummary>,
    pub ramp: Option<RampReport>,
    /// Intents per second with `concurrency` workers back to back.
    pub saturation: Option<RunSummary>,
    /// Raw pairs per second the same way, on the same engine or server.
    pub baseline: Option<BaselineReport>,
    /// Saturated intents/s divided by baseline pairs/s.
    pub ratio_to_baseline: Option<f64>,
    pub references: Vec<ReferenceRate>,
}

pub async fn bench_target(target: &StoreTarget, settings: &StoreRunSettings) -> Result<StoreReport, PlanError> {
    let mut report = StoreReport {
        backend: target.backend.clone(),
        notes: target.notes.clone(),
        open_loop: None,
        ramp: None,
        saturation: None,
        baseline: None,
        ratio_to_baseline: None,
        references: Vec::new(),
    };
    let plan = LoadPlan {
        label: format!("store {}", target.backend),
        index_base: 0,
        ..settings.load.clone()
    };
    match &settings.ramp {
        Some(ramp) => report.ramp = Some(run_ramp(ramp, &plan, target.intents.clone()).await?),
        None => {
            let result = run_open_loop(&plan, target.intents.clone()).await?;
            report.open_loop = Some(RunSummary::of_open_loop(&result));
        }
    }
    if let Some(saturation) = settings.saturation.as_ref().filter(|_| !interrupt::requested()) {
        saturate(target, settings, saturation, &mut report).await?;
    }
    Ok(report)
}

async fn saturate(
    target: &StoreTarget,
    settings: &StoreRunSettings,
    saturation: &SaturationSettings,
    report: &mut StoreReport,
) -> Result<(), PlanError> {
    let baseline = target.baseline.as_ref().filter(|_| settings.baseline);
    let rounds = saturation.rounds.max(1);
    let round_duration = (saturation.duration / rounds).max(Duration::from_secs(1));
    let mut intents: Option<SaturationResult> = None;
    let mut raw: Option<SaturationResult> = None;
    // Intents and baseline take turns, so that a burst of load from
    // elsewhere on the machine hits both about equally and the ratio stays
    // meaningful even when absolute rates are not.
    for round in 0..rounds {
        let plan = |label: &str, phase: u64| SaturationPlan {
            concurrency: saturation.concurrency,
            warmup: if round == 0 { saturation.warmup } else { Duration::ZERO },
            duration: round_duration,
            index_base: (phase * u64::from(rounds) + u64::from(round)) * INDEXES_PER_PHASE,
            label: format!("{label} {} ({}/{rounds})", target.backend, round + 1),
            show_progress: settings.load.show_progress,
        };
        let result = run_saturation(&plan("saturate", 1), target.intents.clone()).await?;
        absorb(&mut intents, result);
        if let Some(baseline) = baseline {
            let result = run_saturation(&plan("baseline", 2), baseline.workload.clone()).await?;
            absorb(&mut raw, result);
        }
        if interrupt::requested() {
            break;
        }
    }
    let intents = intents.map(|result| RunSummary::of_saturation(&result));
    if let (Some(baseline), Some(raw)) = (baseline, raw) {
        let raw = RunSummary::of_saturation(&raw);
        if let Some(intents) = &intents
            && raw.achieved_rate_per_s > 0.0
        {
            report.ratio_to_baseline = Some(intents.achieved_rate_per_s / raw.achieved_rate_per_s);
        }
        report.baseline = Some(BaselineReport {
            name: baseline.name.clone(),
            description: baseline.description.clone(),
            summary: raw,
        });
    }
    report.saturation = intents;
    if settings.baseline
        && !interrupt::requested()
        && let Some(references) = &target.references
    {
        let seconds = saturation.duration.as_secs().max(1);
        let concurrency = saturation.concurrency;
        report.references = tokio::task::block_in_place(|| references.measure(seconds, concurrency));
    }
    Ok(())
}

/// Adds one round to the rounds so far: counts and histograms add up, and
/// the measured time is the sum of the rounds' windows.
fn absorb(total: &mut Option<SaturationResult>, round: SaturationResult) {
    match total {
        None => *total = Some(round),
        Some(total) => {
            total.plan.duration += round.plan.duration;
            total.recording.absorb(&round.recording);
        }
    }
}
