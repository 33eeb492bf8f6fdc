//! A self-contained SVG chart. For an open-loop run: throughput per second
//! against the target, and latency percentiles per second on a log scale.
//! For the metastable profile's second-by-second report: offered load
//! against goodput and sheds, admitted p50 and p99 against the recovery
//! objective, and the share of wasted work, with the phases' boundaries.
//! And panels of measurements over time ([`write_time_series_svg`]: a
//! store's size and a service's memory through a long run).
//!
//! plotters is built with only its SVG backend: text is written as SVG
//! `<text>` elements for the viewer to render, so no font files or
//! fontconfig are needed on the machine that draws the chart.

use crate::http_mode::overload::{OverloadReport, RECOVERED_P99_MS_MAX, SecondReport};
use crate::report::{RunSummary, SecondPoint};
use plotters::prelude::*;
use std::path::Path;

/// Width of the chart, in pixels.
const WIDTH_PX: u32 = 1_100;
/// Height of one panel (one run's throughput or latency), in pixels.
const PANEL_HEIGHT_PX: u32 = 300;
/// Most runs drawn in one chart.
pub const RUNS_MAX: usize = 16;
/// Lowest latency on the log axis, in milliseconds.
const LATENCY_FLOOR_MS: f64 = 0.01;

#[derive(Debug, thiserror::Error)]
pub enum ChartError {
    #[error("nothing to draw")]
    Empty,
    #[error("drawing the chart failed: {0}")]
    Draw(String),
}

fn draw_error(error: impl std::fmt::Display) -> ChartError {
    ChartError::Draw(error.to_string())
}

/// What one run gives the chart: its per-second series.
#[derive(Debug, Clone, Copy)]
pub enum ChartedRun<'a> {
    /// An open-loop run or a ramp step: two panels.
    OpenLoop(&'a RunSummary),
    /// The metastable profile, second by second: three panels.
    Seconds(&'a OverloadReport),
}

impl ChartedRun<'_> {
    fn panels(&self) -> usize {
        match self {
            ChartedRun::OpenLoop(_) => 2,
            ChartedRun::Seconds(_) => 3,
        }
    }

    fn has_series(&self) -> bool {
        match self {
            ChartedRun::OpenLoop(run) => !run.series.is_empty(),
            ChartedRun::Seconds(report) => !report.seconds.is_empty(),
        }
    }
}

/// Draws `runs` (name and series) into an SVG file at `path`.
pub fn write_svg(path: &Path, runs: &[(String, ChartedRun)]) -> Result<(), ChartError> {
    let runs: Vec<_> = runs.iter().filter(|(_, run)| run.has_series()).take(RUNS_MAX).collect();
    if runs.is_empty() {
        return Err(ChartError::Empty);
    }
    let panel_count: usize = runs.iter().map(|(_, run)| run.panels()).sum();
    let height = PANEL_HEIGHT_PX * panel_count as u32;
    let root = SVGBackend::new(path, (WIDTH_PX, height)).into_drawing_area();
    root.fill(&WHITE).map_err(draw_error)?;
    let panels = root.split_evenly((panel_count, 1));
    let mut next_panel = 0;
    for (name, run) in runs {
        match run {
            ChartedRun::OpenLoop(run) => {
                draw_throughput(&panels[next_panel], name, run)?;
                draw_latency(&panels[next_panel + 1], name, run)?;
            }
            ChartedRun::Seconds(report) => {
                draw_goodput(&panels[next_panel], name, report)?;
                draw_admitted_latency(&panels[next_panel + 1], name, report)?;
                draw_wasted_work(&panels[next_panel + 2], name, report)?;
            }
        }
        next_panel += run.panels();
    }
    root.present().map_err(draw_error)?;
    Ok(())
}

fn draw_throughput<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    name: &str,
    run: &RunSummary,
) -> Result<(), ChartError> {
    // Completions after the measured window (the last operations' tails)
    // would draw a partial second as a collapse in throughput.
    let seconds = (run.duration_s.ceil() as u32).clamp(1, run.series.len() as u32);
    let window = || run.series.iter().take(seconds as usize);
    let peak = window().map(|point| point.throughput_per_s).max().unwrap_or(0) as f64;
    let top = peak.max(run.target_rate_per_s.unwrap_or(0.0)).max(1.0) * 1.15;
    let mut chart = ChartBuilder::on(area)
        .caption(
            format!("{name}: throughput (successful operations per second)"),
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(32)
        .y_label_area_size(70)
        .build_cartesian_2d(0u32..seconds.max(1), 0f64..top)
        .map_err(draw_error)?;
    chart
        .configure_mesh()
        .x_desc("second of the measured window")
        .y_desc("operations/s")
        .draw()
        .map_err(draw_error)?;
    let points = window().map(|point| (point.second as u32, point.throughput_per_s as f64));
    chart
        .draw_series(LineSeries::new(points, BLUE.stroke_width(2)))
        .map_err(draw_error)?
        .label("achieved")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE));
    if let Some(target) = run.target_rate_per_s {
        chart
            .draw_series(LineSeries::new([(0, target), (seconds, target)], BLACK.mix(0.5)))
            .map_err(draw_error)?
            .label("target")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK.mix(0.5)));
    }
    draw_legend(&mut chart)
}

/// A percentile's name, colour, and where it is in a second's summary.
type PercentileLine = (&'static str, RGBColor, fn(&SecondPoint) -> f64);

fn draw_latency<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    name: &str,
    run: &RunSummary,
) -> Result<(), ChartError> {
    let seconds = run.series.len() as u32;
    let highest = run
        .series
        .iter()
        .map(|point| point.latency.max_ms)
        .fold(LATENCY_FLOOR_MS, f64::max);
    let mut chart = ChartBuilder::on(area)
        .caption(
            format!("{name}: latency from intended start (ms, log scale)"),
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(32)
        .y_label_area_size(70)
        .build_cartesian_2d(0u32..seconds.max(1), (LATENCY_FLOOR_MS..highest * 1.5).log_scale())
        .map_err(draw_error)?;
    chart
        .configure_mesh()
        .x_desc("second of the measured window")
        .y_desc("ms")
        .draw()
        .map_err(draw_error)?;
    let lines: [PercentileLine; 4] = [
        ("p50", GREEN, |point| point.latency.p50_ms),
        ("p99", BLUE, |point| point.latency.p99_ms),
        ("p99.9", MAGENTA, |point| point.latency.p999_ms),
        ("max", RED, |point| point.latency.max_ms),
    ];
    for (label, color, value) in lines {
        let points = run
            .series
            .iter()
            .filter(|point| point.latency.count > 0)
            .map(|point| (point.second as u32, value(point).max(LATENCY_FLOOR_MS)));
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))
            .map_err(draw_error)?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    draw_legend(&mut chart)
}

/// A per-second line's name, colour, and its value in a second's report
/// (none where that second has nothing to draw).
type SecondLine = (&'static str, RGBColor, fn(&SecondReport) -> Option<f64>);

/// The seconds at which each phase after the first begins.
fn phase_boundaries(report: &OverloadReport) -> Vec<u32> {
    let mut elapsed = 0.0;
    let mut boundaries = Vec::new();
    for phase in report.phases.iter().take(report.phases.len().saturating_sub(1)) {
        elapsed += phase.duration_s;
        boundaries.push(elapsed.round() as u32);
    }
    boundaries
}

/// Vertical grey lines at the phases' boundaries, from `bottom` to `top`.
fn boundary_lines(report: &OverloadReport, bottom: f64, top: f64) -> Vec<PathElement<(u32, f64)>> {
    phase_boundaries(report)
        .into_iter()
        .map(|second| PathElement::new(vec![(second, bottom), (second, top)], BLACK.mix(0.3)))
        .collect()
}

/// A line through each second's `value`, where it has one.
fn second_line<DB: DrawingBackend>(
    report: &OverloadReport,
    color: RGBColor,
    value: impl Fn(&SecondReport) -> Option<f64>,
) -> LineSeries<DB, (u32, f64)> {
    let points: Vec<_> = report
        .seconds
        .iter()
        .filter_map(|second| value(second).map(|value| (second.second as u32, value)))
        .collect();
    LineSeries::new(points, color.stroke_width(2))
}

/// Draws each line through the report's seconds, then the legend naming them.
fn draw_second_lines<'a, DB, Y>(
    chart: &mut ChartContext<'a, DB, Cartesian2d<plotters::coord::types::RangedCoordu32, Y>>,
    report: &OverloadReport,
    lines: impl IntoIterator<Item = SecondLine>,
) -> Result<(), ChartError>
where
    DB: DrawingBackend + 'a,
    Y: plotters::coord::ranged1d::Ranged<ValueType = f64>,
{
    for (label, color, value) in lines {
        chart
            .draw_series(second_line(report, color, value))
            .map_err(draw_error)?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    draw_legend(chart)
}

fn seconds_axis(report: &OverloadReport) -> u32 {
    (report.seconds.len() as u32).max(1)
}

fn draw_legend<'a, DB, X, Y>(chart: &mut ChartContext<'a, DB, Cartesian2d<X, Y>>) -> Result<(), ChartError>
where
    DB: DrawingBackend + 'a,
    X: plotters::coord::ranged1d::Ranged,
    Y: plotters::coord::ranged1d::Ranged,
{
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(draw_error)
}

fn draw_goodput<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    name: &str,
    report: &OverloadReport,
) -> Result<(), ChartError> {
    let seconds = seconds_axis(report);
    let peak = report
        .seconds
        .iter()
        .map(|second| second.offered_per_s.max(second.goodput_per_s).max(second.shed as f64))
        .fold(1.0, f64::max);
    let top = peak * 1.15;
    let mut chart = ChartBuilder::on(area)
        .caption(
            format!("{name}: offered, goodput and shed per second (lines: phase boundaries)"),
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(32)
        .y_label_area_size(70)
        .build_cartesian_2d(0u32..seconds, 0f64..top)
        .map_err(draw_error)?;
    chart
        .configure_mesh()
        .x_desc("second of the profile")
        .y_desc("intents/s")
        .draw()
        .map_err(draw_error)?;
    chart
        .draw_series(boundary_lines(report, 0.0, top))
        .map_err(draw_error)?;
    let lines: [SecondLine; 3] = [
        ("offered", BLACK, |second| Some(second.offered_per_s)),
        ("goodput", BLUE, |second| Some(second.goodput_per_s)),
        ("shed", RED, |second| Some(second.shed as f64)),
    ];
    draw_second_lines(&mut chart, report, lines)
}

fn draw_admitted_latency<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    name: &str,
    report: &OverloadReport,
) -> Result<(), ChartError> {
    let seconds = seconds_axis(report);
    let highest = report
        .seconds
        .iter()
        .map(|second| second.admitted_p99_ms)
        .fold(RECOVERED_P99_MS_MAX, f64::max);
    let top = highest * 1.5;
    let mut chart = ChartBuilder::on(area)
        .caption(
            format!("{name}: admitted latency (ms, log scale; dashed: the {RECOVERED_P99_MS_MAX} ms objective)"),
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(32)
        .y_label_area_size(70)
        .build_cartesian_2d(0u32..seconds, (LATENCY_FLOOR_MS..top).log_scale())
        .map_err(draw_error)?;
    chart
        .configure_mesh()
        .x_desc("second of the profile")
        .y_desc("ms")
        .draw()
        .map_err(draw_error)?;
    chart
        .draw_series(boundary_lines(report, LATENCY_FLOOR_MS, top))
        .map_err(draw_error)?;
    chart
        .draw_series(DashedLineSeries::new(
            [(0, RECOVERED_P99_MS_MAX), (seconds, RECOVERED_P99_MS_MAX)],
            6,
            4,
            BLACK.mix(0.6).stroke_width(1),
        ))
        .map_err(draw_error)?;
    // A second with nothing admitted has no latency to draw.
    let lines: [SecondLine; 2] = [
        ("admitted p50", GREEN, |second| {
            (second.admitted_p50_ms > 0.0).then_some(second.admitted_p50_ms.max(LATENCY_FLOOR_MS))
        }),
        ("admitted p99", BLUE, |second| {
            (second.admitted_p99_ms > 0.0).then_some(second.admitted_p99_ms.max(LATENCY_FLOOR_MS))
        }),
    ];
    draw_second_lines(&mut chart, report, lines)
}

fn draw_wasted_work<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    name: &str,
    report: &OverloadReport,
) -> Result<(), ChartError> {
    let seconds = seconds_axis(report);
    let mut chart = ChartBuilder::on(area)
        .caption(
            format!("{name}: wasted work (% of the service's requests whose client had given up)"),
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(32)
        .y_label_area_size(70)
        .build_cartesian_2d(0u32..seconds, 0f64..100.0)
        .map_err(draw_error)?;
    chart
        .configure_mesh()
        .x_desc("second of the profile")
        .y_desc("%")
        .draw()
        .map_err(draw_error)?;
    chart
        .draw_series(boundary_lines(report, 0.0, 100.0))
        .map_err(draw_error)?;
    chart
        .draw_series(second_line(report, MAGENTA, |second| {
            second.wasted_work_share.map(|share| share * 100.0)
        }))
        .map_err(draw_error)?
        .label("wasted work")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], MAGENTA));
    draw_legend(&mut chart)
}

/// Most panels drawn in one time-series chart.
pub const TIME_PANELS_MAX: usize = 8;
/// Colours of a panel's lines, in order.
const LINE_COLOURS: [RGBColor; 5] = [BLUE, RED, GREEN, MAGENTA, BLACK];

/// One measurement over time: its name and its points (seconds, value).
#[derive(Debug, Clone, PartialEq)]
pub struct TimeLine {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// One panel of a time-series chart: a title, the unit of its values and
/// its lines, drawn against seconds on a linear scale from zero.
#[derive(Debug, Clone, PartialEq)]
pub struct TimePanel {
    pub title: String,
    pub unit: String,
    pub lines: Vec<TimeLine>,
}

/// Draws `panels`, one above the other, into an SVG file at `path`;
/// panels without a point are left out.
pub fn write_time_series_svg(path: &Path, panels: &[TimePanel]) -> Result<(), ChartError> {
    let panels: Vec<&TimePanel> = panels
        .iter()
        .filter(|panel| panel.lines.iter().any(|line| !line.points.is_empty()))
        .take(TIME_PANELS_MAX)
        .collect();
    if panels.is_empty() {
        return Err(ChartError::Empty);
    }
    let root = SVGBackend::new(path, (WIDTH_PX, PANEL_HEIGHT_PX * panels.len() as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(draw_error)?;
    for (area, panel) in root.split_evenly((panels.len(), 1)).iter().zip(panels) {
        draw_time_panel(area, panel)?;
    }
    root.present().map_err(draw_error)?;
    Ok(())
}

fn draw_time_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    panel: &TimePanel,
) -> Result<(), ChartError> {
    let points = || panel.lines.iter().flat_map(|line| line.points.iter());
    let last_second = points().map(|(second, _)| *second).fold(1.0, f64::max);
    let highest = points().map(|(_, value)| *value).fold(0.0, f64::max);
    let top = if highest > 0.0 { highest * 1.15 } else { 1.0 };
    let mut chart = ChartBuilder::on(area)
        .caption(format!("{} ({})", panel.title, panel.unit), ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(32)
        .y_label_area_size(80)
        .build_cartesian_2d(0f64..last_second, 0f64..top)
        .map_err(draw_error)?;
    chart
        .configure_mesh()
        .x_desc("seconds since the first sample")
        .y_desc(panel.unit.as_str())
        .draw()
        .map_err(draw_error)?;
    for (line, colour) in panel.lines.iter().zip(LINE_COLOURS.iter().cycle()) {
        let colour = *colour;
        chart
            .draw_series(LineSeries::new(line.points.iter().copied(), colour.stroke_width(2)))
            .map_err(draw_error)?
            .label(line.name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], colour));
    }
    draw_legend(&mut chart)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http_mode::overload::PhaseReport;
    use crate::recorder::{Outcome, Recording};
    use crate::report::RunSummary;
    use std::time::{Duration, Instant};

    #[test]
    fn the_chart_is_an_svg_with_its_text_and_lines() {
        let start = Instant::now();
        let mut recording = Recording::new(start);
        for second in 0..5u64 {
            for millis in 1..=20u64 {
                let intended = start + Duration::from_secs(second) + Duration::from_millis(millis);
                recording.record(
                    intended,
                    intended + Duration::from_millis(millis),
                    Outcome::success("ok"),
                );
            }
        }
        let summary = RunSummary::of_recording(
            "embedded",
            "open_loop",
            &recording,
            Duration::ZERO,
            Duration::from_secs(5),
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("chart.svg");
        write_svg(&path, &[("embedded".to_owned(), ChartedRun::OpenLoop(&summary))]).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..80.min(svg.len())]);
        assert!(svg.contains("embedded: throughput"));
        assert!(svg.contains("p99.9"));
        assert!(svg.contains("<polyline"));
        assert!(matches!(write_svg(&path, &[]), Err(ChartError::Empty)));
    }

    fn phase(multiplier: f64, duration_s: f64) -> PhaseReport {
        PhaseReport {
            multiplier,
            offered_per_s: 100.0 * multiplier,
            duration_s,
            intents: 0,
            goodput_per_s: 0.0,
            goodput_share_of_capacity: 0.0,
            admitted_attempts: 0,
            admitted_p50_ms: 0.0,
            admitted_p99_ms: 0.0,
            shed_attempts: 0,
            unsent_attempts: 0,
            lost: 0,
            duplicated: 0,
        }
    }

    #[test]
    fn the_metastable_chart_has_goodput_admitted_latency_and_wasted_work_with_the_phases() {
        let seconds = (0..9u64)
            .map(|second| SecondReport {
                second,
                offered_per_s: if (3..6).contains(&second) { 300.0 } else { 100.0 },
                goodput_per_s: 100.0,
                admitted_p50_ms: 5.0,
                admitted_p99_ms: if second == 4 { 0.0 } else { 20.0 },
                shed: second,
                unsent: 0,
                wasted_work_share: (second != 0).then_some(0.1),
                service_mean_ms: Some(2.0),
            })
            .collect();
        let report = OverloadReport {
            capacity_per_s: 100.0,
            slo_p99_ms: 10.0,
            phases: vec![phase(1.0, 3.0), phase(3.0, 3.0), phase(1.0, 3.0)],
            recovery_s: Some(1),
            seconds,
            recovered_s: Some(1),
            wasted_work_share: Some(0.1),
        };
        assert_eq!(phase_boundaries(&report), [3, 6]);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metastable.svg");
        write_svg(&path, &[("http redis".to_owned(), ChartedRun::Seconds(&report))]).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        for panel in ["offered, goodput and shed", "admitted latency", "wasted work (%"] {
            assert!(svg.contains(&format!("http redis: {panel}")), "{panel}");
        }
        for line in ["admitted p99", "goodput", "shed", "wasted work"] {
            assert!(svg.contains(&format!("\n{line}\n</text>")), "the legend names {line}");
        }
        // The overload profile reports no seconds: nothing to draw.
        let overload = OverloadReport {
            seconds: Vec::new(),
            ..report.clone()
        };
        assert!(matches!(
            write_svg(&path, &[("http redis".to_owned(), ChartedRun::Seconds(&overload))]),
            Err(ChartError::Empty)
        ));
    }

    #[test]
    fn a_time_series_chart_has_a_panel_per_measurement_and_skips_empty_ones() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("series.svg");
        let panel = |title: &str, points: Vec<(f64, f64)>| TimePanel {
            title: title.to_owned(),
            unit: "MiB".to_owned(),
            lines: vec![TimeLine {
                name: format!("{title} line"),
                points,
            }],
        };
        let panels = [
            panel("store size", vec![(0.0, 10.0), (5.0, 12.0), (10.0, 11.0)]),
            panel("nothing sampled", Vec::new()),
        ];
        write_time_series_svg(&path, &panels).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.contains("store size (MiB)"), "{svg}");
        assert!(svg.contains("store size line"));
        assert!(!svg.contains("nothing sampled"));
        assert!(svg.contains("<polyline"));
        assert!(matches!(
            write_time_series_svg(&path, &panels[1..]),
            Err(ChartError::Empty)
        ));
    }
}
