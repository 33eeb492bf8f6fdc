//! The whole report of one `idem-bench` command: JSON file, SVG chart and
//! the tables printed at the end.

use crate::chart::{self, ChartedRun};
use crate::http_mode::HttpReport;
use crate::interrupt::Interruption;
use crate::machine::Machine;
use crate::preload::PreloadReport;
use crate::ramp::RampReport;
use crate::report::{RUN_HEADERS, Table, ms, rate, run_row};
use crate::store_mode::run::StoreReport;
use crate::targets::{self, TargetCheck};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// A backend that could not be benchmarked on this machine, and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Unavailable {
    pub backend: String,
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub tool: String,
    pub version: String,
    pub command: Vec<String>,
    pub machine: Machine,
    pub seed: u64,
    pub store: Vec<StoreReport>,
    pub http: Vec<HttpReport>,
    pub unavailable: Vec<Unavailable>,
    /// The performance targets (BENCHMARKS.md) against what this report measured.
    pub targets: Vec<TargetCheck>,
    /// The machine's load around each run (`compare --mode full`).
    #[serde(default)]
    pub run_loads: Vec<RunLoad>,
    /// Set when a SIGINT or SIGTERM ended the command early: every figure
    /// is then of the part that ran.
    #[serde(default)]
    pub interrupted: Option<Interruption>,
    /// What made this run's figures doubtful, found before it started
    /// (services an earlier run left running).
    #[serde(default)]
    pub warnings: Vec<String>,
    /// What `idem-bench preload` wrote.
    #[serde(default)]
    pub preload: Option<PreloadReport>,
}

/// The machine's 1-minute load average before and after one run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunLoad {
    pub run: String,
    /// UTC, ISO 8601.
    pub started_at: String,
    pub before_1m: Option<f64>,
    pub after_1m: Option<f64>,
}

#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    #[error("cannot write {path}: {source}")]
    Write { path: String, source: std::io::Error },
    #[error("cannot read {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("{path} is not an idem-bench report: {source}")]
    NotAReport { path: String, source: serde_json::Error },
    #[error("cannot encode the report: {0}")]
    Encode(#[from] serde_json::Error),
    #[error(transparent)]
    Chart(#[from] chart::ChartError),
}

impl Report {
    pub fn new(seed: u64) -> Self {
        Self {
            tool: "idem-bench".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            command: std::env::args().collect(),
            machine: Machine::now(),
            seed,
            store: Vec::new(),
            http: Vec::new(),
            unavailable: Vec::new(),
            targets: Vec::new(),
            run_loads: Vec::new(),
            interrupted: None,
            warnings: Vec::new(),
            preload: None,
        }
    }

    /// Fills in the target checks from the runs.
    pub fn check_targets(&mut self) {
        self.targets = targets::evaluate(self);
    }

    pub fn write_json(&self, path: &Path) -> Result<(), OutputError> {
        write_json_file(self, path)
    }

    /// A report an earlier run wrote with `--json`.
    pub fn read_json(path: &Path) -> Result<Self, OutputError> {
        let text = std::fs::read_to_string(path).map_err(|source| OutputError::Read {
            path: path.display().to_string(),
            source,
        })?;
        serde_json::from_str(&text).map_err(|source| OutputError::NotAReport {
            path: path.display().to_string(),
            source,
        })
    }

    /// Every run with a per-second series, named for the chart.
    pub fn charted_runs(&self) -> Vec<(String, ChartedRun<'_>)> {
        let mut runs = Vec::new();
        for store in &self.store {
            if let Some(open_loop) = &store.open_loop {
                runs.push((format!("store {}", store.backend), ChartedRun::OpenLoop(open_loop)));
            }
            if let Some(ramp) = &store.ramp {
                push_ramp(&mut runs, &format!("store {}", store.backend), ramp);
            }
        }
        for http in &self.http {
            if let Some(open_loop) = &http.open_loop {
                runs.push((format!("http {}", http.store_kind), ChartedRun::OpenLoop(open_loop)));
            }
            if let Some(ramp) = &http.ramp {
                push_ramp(&mut runs, &format!("http {}", http.store_kind), ramp);
            }
            if let Some(overload) = &http.overload {
                runs.push((format!("http {}", http.store_kind), ChartedRun::Seconds(overload)));
            }
        }
        runs
    }

    pub fn write_chart(&self, path: &Path) -> Result<(), OutputError> {
        chart::write_svg(path, &self.charted_runs())?;
        Ok(())
    }

    /// The final tables, side by side for every backend.
    pub fn render_tables(&self) -> String {
        let mut text = self.render_interruption();
        for warning in &self.warnings {
            text.push_str(&format!("WARNING: {warning}\n"));
        }
        text.push_str(&format!(
            "machine: {}\nseed: {}\n\n",
            self.machine.describe(),
            self.seed
        ));
        let mut runs = Table::new(&RUN_HEADERS);
        for store in &self.store {
            if let Some(open_loop) = &store.open_loop {
                runs.row(run_row(&format!("store {}", store.backend), open_loop));
            }
        }
        for http in &self.http {
            if let Some(open_loop) = &http.open_loop {
                runs.row(run_row(
                    &format!("http {} ({})", http.store_kind, http.key_mode),
                    open_loop,
                ));
            }
        }
        text.push_str(&runs.render());
        text.push_str(&self.render_outcomes());
        text.push_str(&self.render_saturation());
        text.push_str(&self.render_ramps());
        for http in &self.http {
            text.push('\n');
            text.push_str(&http.render());
        }
        text.push_str(&crate::compare::render_summary(self));
        text.push_str(&self.render_targets());
        for unavailable in &self.unavailable {
            text.push_str(&format!(
                "\n{} unavailable: {}\n",
                unavailable.backend, unavailable.reason
            ));
        }
        // Again at the end, where a reader of the terminal looks first.
        if self.interrupted.is_some() {
            text.push('\n');
            text.push_str(&self.render_interruption());
        }
        text
    }

    /// The first line of an interrupted run's report, and the last.
    fn render_interruption(&self) -> String {
        let Some(interrupted) = &self.interrupted else {
            return String::new();
        };
        format!(
            "INTERRUPTED by {} after {:.1} s: a partial report. The load stopped early, requests still in flight after {} ms were given up (unfinished, or their intents lost), every process this run started was stopped, and the targets were not checked.\n",
            interrupted.signal.name(),
            interrupted.after_s,
            interrupted.drain_ms_max
        )
    }

    fn render_targets(&self) -> String {
        if self.targets.is_empty() {
            return String::new();
        }
        let mut table = Table::new(&["target", "run", "measured", "met"]);
        for target in &self.targets {
            table.row(vec![
                target.target.clone(),
                target.run.clone(),
                target.measured.clone(),
                if target.met { "yes" } else { "NO" }.into(),
            ]);
        }
        format!("\ntargets:\n{}", table.render())
    }

    fn render_outcomes(&self) -> String {
        let mut text = String::from("\noutcomes:\n");
        let open_loops = self
            .store
            .iter()
            .filter_map(|store| {
                store
                    .open_loop
                    .as_ref()
                    .map(|run| (format!("store {}", store.backend), run))
            })
            .chain(self.http.iter().filter_map(|http| {
                http.open_loop
                    .as_ref()
                    .map(|run| (format!("http {}", http.store_kind), run))
            }));
        for (name, run) in open_loops {
            text.push_str(&format!(
                "  {name}: {}  (not sent {}, unfinished {}, start lag p99 {} ms)\n",
                run.outcomes_text(),
                run.not_sent,
                run.unfinished,
                ms(run.start_lag.p99_ms)
            ));
        }
        text
    }

    fn render_saturation(&self) -> String {
        let mut table = Table::new(&[
            "backend",
            "workers",
            "intents/s (saturated)",
            "p99 ms",
            "baseline",
            "baseline pairs/s",
            "ratio",
        ]);
        let mut any = false;
        for store in &self.store {
            let Some(saturation) = &store.saturation else {
                continue;
            };
            any = true;
            let (baseline_name, baseline_rate) = match &store.baseline {
                Some(baseline) => (baseline.name.clone(), rate(baseline.summary.achieved_rate_per_s)),
                None => ("-".into(), "-".into()),
            };
            table.row(vec![
                store.backend.clone(),
                saturation.concurrency.to_string(),
                rate(saturation.achieved_rate_per_s),
                ms(saturation.latency.p99_ms),
                baseline_name,
                baseline_rate,
                store
                    .ratio_to_baseline
                    .map(|ratio| format!("{:.0}%", ratio * 100.0))
                    .unwrap_or("-".into()),
            ]);
            for reference in &store.references {
                table.row(vec![
                    store.backend.clone(),
                    String::new(),
                    String::new(),
                    String::new(),
                    reference.name.clone(),
                    rate(reference.pairs_per_s),
                    format!(
                        "{:.0}%",
                        saturation.achieved_rate_per_s / reference.pairs_per_s.max(1.0) * 100.0
                    ),
                ]);
            }
        }
        if !any {
            return String::new();
        }
        format!(
            "\nsaturation (closed loop) against the raw baseline:\n{}",
            table.render()
        )
    }

    fn render_ramps(&self) -> String {
        let ramps = self
            .store
            .iter()
            .filter_map(|store| {
                store
                    .ramp
                    .as_ref()
                    .map(|ramp| (format!("store {}", store.backend), ramp))
            })
            .chain(self.http.iter().filter_map(|http| {
                http.ramp
                    .as_ref()
                    .map(|ramp| (format!("http {}", http.store_kind), ramp))
            }));
        let mut text = String::new();
        for (name, ramp) in ramps {
            text.push_str(&render_ramp(&name, ramp));
        }
        text
    }
}

fn push_ramp<'a>(runs: &mut Vec<(String, ChartedRun<'a>)>, name: &str, ramp: &'a RampReport) {
    for step in &ramp.steps {
        runs.push((
            format!("{name} @ {}/s", rate(step.rate_per_s)),
            ChartedRun::OpenLoop(&step.summary),
        ));
    }
}

pub fn render_ramp(name: &str, ramp: &RampReport) -> String {
    let mut table = Table::new(&[
        "rate/s",
        "achieved/s",
        "p50 ms",
        "p99 ms",
        "p99.9 ms",
        "held",
        "why not",
    ]);
    for step in &ramp.steps {
        table.row(vec![
            rate(step.rate_per_s),
            rate(step.summary.achieved_rate_per_s),
            ms(step.summary.latency.p50_ms),
            ms(step.summary.latency.p99_ms),
            ms(step.summary.latency.p999_ms),
            if step.held { "yes" } else { "no" }.into(),
            step.reasons.join("; "),
        ]);
    }
    let highest = ramp
        .highest_held_per_s
        .map(|value| format!("{}/s", rate(value)))
        .unwrap_or_else(|| "none".into());
    format!(
        "\n{name} ramp (SLO p99 <= {} ms): highest rate that held: {highest}\n{}",
        ramp.settings.slo_p99_ms,
        table.render()
    )
}

/// Writes `value` to `path` as pretty-printed JSON: every report's `--json`.
pub fn write_json_file<T: Serialize>(value: &T, path: &Path) -> Result<(), OutputError> {
    let text = serde_json::to_string_pretty(value)?;
    std::fs::write(path, text).map_err(|source| OutputError::Write {
        path: path.display().to_string(),
        source,
    })
}
