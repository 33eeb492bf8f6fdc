//! A self-contained SVG chart: for each run, throughput per second against
//! the target, and latency percentiles per second on a log scale; and
//! panels of measurements over time ([`write_time_series_svg`]: a store's
//! size and a service's memory through a long run).
//!
//! plotters is built with only its SVG backend: text is written as SVG
//! `<text>` elements for the viewer to render, so no font files or
//! fontconfig are needed on the machine that draws the chart.

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

/// Draws `runs` (name and summary) into an SVG file at `path`.
pub fn write_svg(path: &Path, runs: &[(String, &RunSummary)]) -> Result<(), ChartError> {
    let runs: Vec<_> = runs
        .iter()
        .filter(|(_, run)| !run.series.is_empty())
        .take(RUNS_MAX)
        .collect();
    if runs.is_empty() {
        return Err(ChartError::Empty);
    }
    let height = PANEL_HEIGHT_PX * 2 * runs.len() as u32;
    let root = SVGBackend::new(path, (WIDTH_PX, height)).into_drawing_area();
    root.fill(&WHITE).map_err(draw_error)?;
    let panels = root.split_evenly((runs.len() * 2, 1));
    for (run_number, (name, run)) in runs.iter().enumerate() {
        draw_throughput(&panels[run_number * 2], name, run)?;
        draw_latency(&panels[run_number * 2 + 1], name, run)?;
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
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(draw_error)
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
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(draw_error)
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
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(draw_error)
}

#[cfg(test)]
mod tests {
    use super::*;
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
        write_svg(&path, &[("embedded".to_owned(), &summary)]).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..80.min(svg.len())]);
        assert!(svg.contains("embedded: throughput"));
        assert!(svg.contains("p99.9"));
        assert!(svg.contains("<polyline"));
        assert!(matches!(write_svg(&path, &[]), Err(ChartError::Empty)));
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
