//! `idem-bench day-report DIR...`: the report of `scripts/day-of-keys`
//! runs. Each DIR is one run's folder (one backend: a row of the day's
//! table and a chart, `day-of-keys.svg`, of the store's size, the service's
//! memory, the records and PostgreSQL's dead tuples over time), or a growth
//! folder (`size-N` run folders: a row per size and each figure
//! extrapolated to the design's worst case, 172.8M records).
//!
//! [`parse`] reads the files and [`summary`] computes the figures, both
//! without I/O; [`folder`] knows the file names; [`render`] writes the
//! markdown and the chart's panels.

pub mod folder;
pub mod parse;
pub mod render;
pub mod summary;

use clap::Args;
use std::path::{Path, PathBuf};
use summary::DaySummary;

/// The chart written into each run folder.
pub const CHART_FILE: &str = "day-of-keys.svg";

/// `idem-bench day-report`.
#[derive(Debug, Clone, Args)]
pub struct DayReportArgs {
    /// Folders written by scripts/day-of-keys: one run each (one backend),
    /// or a growth folder of size-N runs (--growth).
    #[arg(required = true)]
    pub folders: Vec<PathBuf>,
    /// Do not write the charts.
    #[arg(long)]
    pub no_charts: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum DayReportError {
    #[error(transparent)]
    Folder(#[from] folder::FolderError),
    #[error("{path}: {source}")]
    Chart {
        path: String,
        source: crate::chart::ChartError,
    },
}

/// The report's markdown; the charts are written beside the files they
/// were drawn from.
pub fn run(args: &DayReportArgs) -> Result<String, DayReportError> {
    let mut days = Vec::new();
    let mut text = String::new();
    for folder in &args.folders {
        let sizes = folder::size_folders(folder)?;
        if sizes.is_empty() {
            days.push((folder.clone(), DaySummary::of(folder::read_day(folder)?)));
            continue;
        }
        let growth: Vec<DaySummary> = folder::read_growth(folder, &sizes)?
            .into_iter()
            .map(DaySummary::of)
            .collect();
        text.push_str(&growth_section(folder, &growth));
        if !args.no_charts {
            for (size, summary) in sizes.iter().zip(&growth) {
                write_chart(size, summary)?;
            }
        }
    }
    if !days.is_empty() {
        let summaries: Vec<DaySummary> = days.iter().map(|(_, summary)| summary.clone()).collect();
        text.insert_str(0, &day_section(&summaries));
        if !args.no_charts {
            for (folder, summary) in &days {
                write_chart(folder, summary)?;
            }
        }
    }
    Ok(text)
}

fn day_section(summaries: &[DaySummary]) -> String {
    format!(
        "## A day of keys\n\n{}\n{}\n",
        render::day_table(summaries),
        render::day_notes(summaries)
    )
}

fn growth_section(folder: &Path, summaries: &[DaySummary]) -> String {
    let backend = summaries
        .first()
        .map(|summary| summary.inputs.scenario.backend.as_str())
        .unwrap_or("?");
    format!(
        "## Growth: {backend} ({})\n\n{}\n",
        folder.display(),
        render::growth_table(summaries)
    )
}

/// A run's chart, when it has samples.
fn write_chart(folder: &Path, summary: &DaySummary) -> Result<(), DayReportError> {
    if summary.inputs.samples.is_empty() {
        return Ok(());
    }
    let path = folder.join(CHART_FILE);
    crate::chart::write_time_series_svg(&path, &render::chart_panels(&summary.inputs.samples)).map_err(|source| {
        DayReportError::Chart {
            path: path.display().to_string(),
            source,
        }
    })?;
    eprintln!("chart written to {}", path.display());
    Ok(())
}
