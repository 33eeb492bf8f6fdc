//! The files `scripts/day-of-keys` leaves in its folder, read from their
//! text: pure functions, so the report's arithmetic is tested without a
//! run.
//!
//! - `scenario.txt`: `name=value` lines, what the run was asked to do and
//!   what it did (the records loaded, the retention it chose).
//! - `samples.csv`: one line every few seconds while the service ran.
//! - `restarts.csv`: one line per restart (the signal, how long the old
//!   process took to end, how long the new one took to be ready).
//! - the JSON reports of `idem-bench http` and `idem-bench preload`, of
//!   which only a few figures are read.

use serde_json::Value;
use std::collections::BTreeMap;

/// Why a file of the folder could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("{file}: line {line}: {detail}")]
    Line { file: String, line: usize, detail: String },
    #[error("{file}: {detail}")]
    File { file: String, detail: String },
}

fn line_error(file: &str, line: usize, detail: impl Into<String>) -> ParseError {
    ParseError::Line {
        file: file.to_owned(),
        line,
        detail: detail.into(),
    }
}

fn file_error(file: &str, detail: impl Into<String>) -> ParseError {
    ParseError::File {
        file: file.to_owned(),
        detail: detail.into(),
    }
}

/// What one run was asked to do, and what it chose (`scenario.txt`).
#[derive(Debug, Clone, PartialEq)]
pub struct Scenario {
    pub backend: String,
    /// `--records` as given.
    pub records_requested: u64,
    /// What was loaded: fewer than asked on Redis when memory would not
    /// hold them.
    pub records: u64,
    /// The service's retention, chosen so that the loaded records fall due
    /// at the steady rate.
    pub retention_s: u64,
    pub steady_rate_per_s: f64,
    pub steady_s: u64,
    pub peak_rate_per_s: f64,
    pub peak_s: u64,
    /// Every other line, kept for the notes.
    pub other: BTreeMap<String, String>,
}

pub const SCENARIO_FILE: &str = "scenario.txt";

/// Reads `name=value` lines; blank lines and lines starting with `#` are
/// skipped.
pub fn parse_scenario(text: &str) -> Result<Scenario, ParseError> {
    let mut values = BTreeMap::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (name, value) = line
            .split_once('=')
            .ok_or_else(|| line_error(SCENARIO_FILE, number + 1, "expected name=value"))?;
        values.insert(name.trim().to_owned(), value.trim().to_owned());
    }
    let mut take = |name: &str| {
        values
            .remove(name)
            .ok_or_else(|| file_error(SCENARIO_FILE, format!("no {name}")))
    };
    let number = |name: &str, value: String| {
        value
            .parse::<f64>()
            .map_err(|_| file_error(SCENARIO_FILE, format!("{name}={value} is not a number")))
    };
    let backend = take("backend")?;
    let records_requested = number("records_requested", take("records_requested")?)? as u64;
    let records = number("records", take("records")?)? as u64;
    let retention_s = number("retention_s", take("retention_s")?)? as u64;
    let steady_rate_per_s = number("steady_rate_per_s", take("steady_rate_per_s")?)?;
    let steady_s = number("steady_s", take("steady_s")?)? as u64;
    let peak_rate_per_s = number("peak_rate_per_s", take("peak_rate_per_s")?)?;
    let peak_s = number("peak_s", take("peak_s")?)? as u64;
    Ok(Scenario {
        backend,
        records_requested,
        records,
        retention_s,
        steady_rate_per_s,
        steady_s,
        peak_rate_per_s,
        peak_s,
        other: values,
    })
}

/// One line of `samples.csv`. A figure the backend does not have (dead
/// tuples outside PostgreSQL) or that could not be read is `None`.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub unix_ms: u64,
    /// What the service was doing: `start`, `steady`, `peak`.
    pub phase: String,
    pub store_bytes: Option<u64>,
    pub record_count: Option<u64>,
    pub service_rss_kib: Option<u64>,
    /// Records purged since the service started (Redis: keys expired since
    /// the server started).
    pub purged_total: Option<u64>,
    /// Records the service created since it started.
    pub created_total: Option<u64>,
    pub dead_tuples: Option<u64>,
    pub autovacuum_runs: Option<u64>,
}

pub const SAMPLES_FILE: &str = "samples.csv";
/// The columns of `samples.csv`, in the order the script writes them.
pub const SAMPLE_COLUMNS: [&str; 9] = [
    "unix_ms",
    "phase",
    "store_bytes",
    "record_count",
    "service_rss_kib",
    "purged_total",
    "created_total",
    "dead_tuples",
    "autovacuum_runs",
];

/// Reads `samples.csv`: a header naming [`SAMPLE_COLUMNS`] (in any order),
/// then one sample a line.
pub fn parse_samples(text: &str) -> Result<Vec<Sample>, ParseError> {
    let mut lines = text.lines().enumerate().filter(|(_, line)| !line.trim().is_empty());
    let (_, header) = lines
        .next()
        .ok_or_else(|| file_error(SAMPLES_FILE, "empty: no header"))?;
    let header: Vec<&str> = header.split(',').map(str::trim).collect();
    let position = |name: &str| {
        header
            .iter()
            .position(|column| *column == name)
            .ok_or_else(|| file_error(SAMPLES_FILE, format!("no column {name}")))
    };
    let columns: Vec<usize> = SAMPLE_COLUMNS
        .iter()
        .map(|name| position(name))
        .collect::<Result<_, _>>()?;
    lines
        .map(|(number, line)| parse_sample_line(line, &columns, number + 1))
        .collect()
}

fn parse_sample_line(line: &str, columns: &[usize], number: usize) -> Result<Sample, ParseError> {
    let cells: Vec<&str> = line.split(',').map(str::trim).collect();
    let cell = |index: usize| cells.get(columns[index]).copied().unwrap_or("");
    let optional = |index: usize| -> Result<Option<u64>, ParseError> {
        let text = cell(index);
        if text.is_empty() {
            return Ok(None);
        }
        text.parse::<u64>().map(Some).map_err(|_| {
            line_error(
                SAMPLES_FILE,
                number,
                format!("{} is not a count: {text:?}", SAMPLE_COLUMNS[index]),
            )
        })
    };
    let unix_ms = optional(0)?.ok_or_else(|| line_error(SAMPLES_FILE, number, "no unix_ms"))?;
    Ok(Sample {
        unix_ms,
        phase: cell(1).to_owned(),
        store_bytes: optional(2)?,
        record_count: optional(3)?,
        service_rss_kib: optional(4)?,
        purged_total: optional(5)?,
        created_total: optional(6)?,
        dead_tuples: optional(7)?,
        autovacuum_runs: optional(8)?,
    })
}

/// One restart of the service (`restarts.csv`).
#[derive(Debug, Clone, PartialEq)]
pub struct Restart {
    /// `SIGTERM` or `SIGKILL`.
    pub signal: String,
    /// From the signal to the old process's exit, in seconds.
    pub stopped_s: f64,
    /// From the new process's start to its first ready answer, in seconds.
    pub ready_s: f64,
}

pub const RESTARTS_FILE: &str = "restarts.csv";

/// Reads `restarts.csv`: a header `signal,stopped_ms,ready_ms`, then one
/// restart a line.
pub fn parse_restarts(text: &str) -> Result<Vec<Restart>, ParseError> {
    let mut restarts = Vec::new();
    for (number, line) in text.lines().enumerate().skip(1) {
        if line.trim().is_empty() {
            continue;
        }
        let cells: Vec<&str> = line.split(',').map(str::trim).collect();
        let [signal, stopped_ms, ready_ms] = cells[..] else {
            return Err(line_error(
                RESTARTS_FILE,
                number + 1,
                "expected signal,stopped_ms,ready_ms",
            ));
        };
        let milliseconds = |text: &str| {
            text.parse::<u64>()
                .map(|ms| ms as f64 / 1_000.0)
                .map_err(|_| line_error(RESTARTS_FILE, number + 1, format!("{text:?} is not milliseconds")))
        };
        restarts.push(Restart {
            signal: signal.to_owned(),
            stopped_s: milliseconds(stopped_ms)?,
            ready_s: milliseconds(ready_ms)?,
        });
    }
    Ok(restarts)
}

/// What one `idem-bench http` run measured: its rate and latency.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoadFigures {
    pub achieved_per_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub audit_passed: bool,
}

/// The first http run of an `idem-bench http --json` report.
pub fn load_figures(file: &str, report: &Value) -> Result<LoadFigures, ParseError> {
    let run = report
        .pointer("/http/0")
        .ok_or_else(|| file_error(file, "no http run in the report"))?;
    let number = |pointer: &str| {
        run.pointer(pointer)
            .and_then(Value::as_f64)
            .ok_or_else(|| file_error(file, format!("no number at http[0]{pointer}")))
    };
    Ok(LoadFigures {
        achieved_per_s: number("/open_loop/achieved_rate_per_s")?,
        p50_ms: number("/open_loop/latency/p50_ms")?,
        p99_ms: number("/open_loop/latency/p99_ms")?,
        p999_ms: number("/open_loop/latency/p999_ms")?,
        audit_passed: run.pointer("/audit/passed").and_then(Value::as_bool).unwrap_or(false),
    })
}

/// What `idem-bench preload --json` wrote.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PreloadFigures {
    pub records_written: u64,
    pub records_per_s: f64,
    pub bytes_per_record: Option<f64>,
    /// The wait for the store to come to rest after the load, and whether
    /// it did; absent from reports written before the preload waited.
    pub settle: Option<(f64, bool)>,
}

pub fn preload_figures(file: &str, report: &Value) -> Result<PreloadFigures, ParseError> {
    let preload = report
        .get("preload")
        .filter(|preload| !preload.is_null())
        .ok_or_else(|| file_error(file, "no preload section in the report"))?;
    Ok(PreloadFigures {
        records_written: preload
            .get("records_written")
            .and_then(Value::as_u64)
            .ok_or_else(|| file_error(file, "no records_written"))?,
        records_per_s: preload.get("records_per_s").and_then(Value::as_f64).unwrap_or(0.0),
        bytes_per_record: preload.pointer("/size/bytes_per_record").and_then(Value::as_f64),
        settle: preload
            .pointer("/settle/waited_s")
            .and_then(Value::as_f64)
            .zip(preload.pointer("/settle/at_rest").and_then(Value::as_bool)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCENARIO: &str = "# written by scripts/day-of-keys\nbackend=postgres\nrecords_requested=34560000\nrecords=34560000\nretention_s=86400\nsteady_rate_per_s=400\nsteady_s=1800\npeak_rate_per_s=2000\npeak_s=60\nsweeper_interval_ms=10000\n";

    #[test]
    fn a_scenario_keeps_its_figures_and_its_other_lines() {
        let scenario = parse_scenario(SCENARIO).unwrap();
        assert_eq!(scenario.backend, "postgres");
        assert_eq!(scenario.records, 34_560_000);
        assert_eq!(scenario.retention_s, 86_400);
        assert_eq!(scenario.steady_s, 1_800);
        assert_eq!(scenario.peak_rate_per_s, 2_000.0);
        assert_eq!(scenario.other["sweeper_interval_ms"], "10000");
        let missing = parse_scenario(&SCENARIO.replace("peak_s=60\n", "")).unwrap_err();
        assert!(missing.to_string().contains("no peak_s"), "{missing}");
        let not_a_line = parse_scenario("backend postgres").unwrap_err();
        assert!(not_a_line.to_string().contains("line 1"), "{not_a_line}");
    }

    #[test]
    fn samples_are_read_by_column_name_with_empty_cells_as_absent() {
        let text = "phase,unix_ms,store_bytes,record_count,service_rss_kib,purged_total,created_total,dead_tuples,autovacuum_runs\nsteady,1000,4096,200,51200,10,12,,\npeak,6000,8192,210,52000,20,40,5,1\n";
        let samples = parse_samples(text).unwrap();
        assert_eq!(samples.len(), 2);
        assert_eq!(samples[0].phase, "steady");
        assert_eq!(samples[0].unix_ms, 1_000);
        assert_eq!(samples[0].dead_tuples, None);
        assert_eq!(samples[1].dead_tuples, Some(5));
        assert_eq!(samples[1].created_total, Some(40));
        let bad = parse_samples(&text.replace("8192", "8k")).unwrap_err();
        assert!(bad.to_string().contains("line 3"), "{bad}");
        let no_column = parse_samples("unix_ms,phase\n1,steady\n").unwrap_err();
        assert!(no_column.to_string().contains("no column store_bytes"), "{no_column}");
    }

    #[test]
    fn restarts_are_in_seconds() {
        let restarts = parse_restarts("signal,stopped_ms,ready_ms\nSIGTERM,2100,850\nSIGKILL,3,12500\n").unwrap();
        assert_eq!(restarts.len(), 2);
        assert_eq!(restarts[0].stopped_s, 2.1);
        assert_eq!(restarts[1].signal, "SIGKILL");
        assert_eq!(restarts[1].ready_s, 12.5);
        assert!(parse_restarts("signal,stopped_ms,ready_ms\nSIGTERM,1\n").is_err());
    }

    #[test]
    fn load_figures_come_from_the_first_http_run() {
        let report = serde_json::json!({"http": [{
            "open_loop": {"achieved_rate_per_s": 399.5, "latency": {"p50_ms": 1.5, "p99_ms": 6.0, "p999_ms": 20.0}},
            "audit": {"passed": true}
        }]});
        let figures = load_figures("steady.json", &report).unwrap();
        assert_eq!(figures.p99_ms, 6.0);
        assert!(figures.audit_passed);
        let error = load_figures("steady.json", &serde_json::json!({"http": []})).unwrap_err();
        assert!(error.to_string().starts_with("steady.json"), "{error}");
    }

    /// A figure read by its place equals the one the bench's own types read:
    /// with `arbitrary_precision` a Value keeps the digits and `as_f64` parses
    /// them exactly, so the typed path must parse exactly too (serde_json's
    /// `float_roundtrip`). This number, from a real report, came back one
    /// unit in the last place lower without it.
    #[test]
    fn a_figure_reads_back_as_the_same_double_by_place_and_by_type() {
        let written = "97.21570795001425";
        let by_place = serde_json::from_str::<Value>(written).unwrap().as_f64().unwrap();
        let by_type: f64 = serde_json::from_str(written).unwrap();
        assert_eq!(by_place, written.parse::<f64>().unwrap());
        assert_eq!(by_type, by_place);
    }
}
