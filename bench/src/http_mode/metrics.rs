//! Reading the server's side: its `/metrics` (Prometheus text format) for the
//! audit's answer counts, and a spawned server's resident memory.

use super::audit::AnswerCounts;
use std::collections::BTreeMap;

/// The server's counter of answered requests.
pub const HTTP_REQUESTS_TOTAL: &str = "idem_http_requests_total";
/// The matched route of CreateLabel, as the server labels it.
pub const LABELS_ROUTE: &str = "/v1/labels";
/// The `outcome` of a 503 the server sent because the request's time ran out
/// (its error code, `server::error::ApiError::RequestTimeout`).
pub const REQUEST_TIMEOUT_OUTCOME: &str = "request_timeout";

/// One sample: its labels and value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// Every sample of metric `name` in a Prometheus text exposition.
pub fn samples(text: &str, name: &str) -> Vec<Sample> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| parse_line(line, name))
        .collect()
}

fn parse_line(line: &str, name: &str) -> Option<Sample> {
    let rest = line.strip_prefix(name)?;
    let (labels, value) = match rest.strip_prefix('{') {
        Some(inner) => {
            let end = inner.rfind('}')?;
            (parse_labels(&inner[..end])?, inner[end + 1..].trim())
        }
        None if rest.starts_with(' ') => (BTreeMap::new(), rest.trim()),
        None => return None,
    };
    let value = value.split_whitespace().next()?.parse().ok()?;
    Some(Sample { labels, value })
}

/// `a="x",b="y"` with `\"`, `\\` and `\n` escapes in values.
fn parse_labels(text: &str) -> Option<BTreeMap<String, String>> {
    let mut labels = BTreeMap::new();
    let mut chars = text.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| *c == ',' || c.is_whitespace()) {
            chars.next();
        }
        if chars.peek().is_none() {
            return Some(labels);
        }
        let name: String = chars.by_ref().take_while(|c| *c != '=').collect();
        if chars.next() != Some('"') {
            return None;
        }
        let mut value = String::new();
        loop {
            match chars.next()? {
                '"' => break,
                '\\' => match chars.next()? {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                other => value.push(other),
            }
        }
        labels.insert(name.trim().to_owned(), value);
    }
}

/// The label route's answers by category, from `idem_http_requests_total`.
pub fn label_answers(text: &str) -> AnswerCounts {
    let mut counts = AnswerCounts::default();
    for sample in samples(text, HTTP_REQUESTS_TOTAL) {
        let label = |name: &str| sample.labels.get(name).map(String::as_str).unwrap_or_default();
        if label("route") != LABELS_ROUTE || !label("method").eq_ignore_ascii_case("post") {
            continue;
        }
        let count = sample.value.max(0.0) as u64;
        match (label("status"), label("outcome")) {
            ("201", "replayed") => counts.replays += count,
            ("201", _) => counts.first_runs += count,
            ("409", _) => counts.in_progress_409 += count,
            ("422", _) => counts.mismatch_422 += count,
            ("503", outcome) => {
                counts.unavailable_503 += count;
                if outcome == REQUEST_TIMEOUT_OUTCOME {
                    counts.request_timeouts_503 += count;
                }
            }
            ("499", _) => counts.cancelled_499 += count,
            _ => counts.other += count,
        }
    }
    counts
}

/// `after - before`, per category: the answers of one run against a server
/// that may have served earlier runs.
/// Two instances' counts together.
pub fn sum(one: &AnswerCounts, other: &AnswerCounts) -> AnswerCounts {
    AnswerCounts {
        first_runs: one.first_runs + other.first_runs,
        replays: one.replays + other.replays,
        in_progress_409: one.in_progress_409 + other.in_progress_409,
        mismatch_422: one.mismatch_422 + other.mismatch_422,
        unavailable_503: one.unavailable_503 + other.unavailable_503,
        cancelled_499: one.cancelled_499 + other.cancelled_499,
        request_timeouts_503: one.request_timeouts_503 + other.request_timeouts_503,
        other: one.other + other.other,
    }
}

pub fn difference(after: &AnswerCounts, before: &AnswerCounts) -> AnswerCounts {
    AnswerCounts {
        first_runs: after.first_runs.saturating_sub(before.first_runs),
        replays: after.replays.saturating_sub(before.replays),
        in_progress_409: after.in_progress_409.saturating_sub(before.in_progress_409),
        mismatch_422: after.mismatch_422.saturating_sub(before.mismatch_422),
        unavailable_503: after.unavailable_503.saturating_sub(before.unavailable_503),
        cancelled_499: after.cancelled_499.saturating_sub(before.cancelled_499),
        request_timeouts_503: after.request_timeouts_503.saturating_sub(before.request_timeouts_503),
        other: after.other.saturating_sub(before.other),
    }
}

/// Resident memory of a process now and at its peak, in KiB, from
/// `/proc/PID/status` (`VmRSS`, `VmHWM`).
pub fn resident_kib(pid: u32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXPOSITION: &str = r#"# HELP idem_http_requests_total Requests answered.
# TYPE idem_http_requests_total counter
idem_http_requests_total{method="POST",outcome="created",route="/v1/labels",status="201"} 120
idem_http_requests_total{method="POST",outcome="replayed",route="/v1/labels",status="201"} 7
idem_http_requests_total{method="POST",outcome="in_progress",route="/v1/labels",status="409"} 3
idem_http_requests_total{method="POST",outcome="downstream_unavailable",route="/v1/labels",status="503"} 2
idem_http_requests_total{method="POST",outcome="request_timeout",route="/v1/labels",status="503"} 5
idem_http_requests_total{method="POST",outcome="mismatch",route="/v1/labels",status="422"} 1
idem_http_requests_total{method="POST",outcome="invalid_request",route="/v1/labels",status="400"} 4
idem_http_requests_total{method="POST",outcome="cancelled",route="/v1/labels",status="499"} 6
idem_http_requests_total{method="GET",outcome="ok",route="/v1/labels/{label_id}",status="200"} 9
idem_http_requests_total_other{route="/v1/labels"} 99
idem_http_requests_in_flight 0
"#;

    #[test]
    fn answers_of_the_label_route_are_counted_by_category() {
        let counts = label_answers(EXPOSITION);
        assert_eq!(
            counts,
            AnswerCounts {
                first_runs: 120,
                replays: 7,
                in_progress_409: 3,
                mismatch_422: 1,
                unavailable_503: 7,
                cancelled_499: 6,
                request_timeouts_503: 5,
                other: 4,
            }
        );
    }

    #[test]
    fn label_values_may_hold_escapes_commas_and_braces() {
        let text = "m{a=\"x,\\\"y}\",b=\"z\"} 1.5e3\nm 2\nmx 5\n";
        let found = samples(text, "m");
        assert_eq!(found.len(), 2);
        assert_eq!(found[0].labels["a"], "x,\"y}");
        assert_eq!(found[0].labels["b"], "z");
        assert_eq!(found[0].value, 1_500.0);
        assert_eq!(found[1].value, 2.0);
    }

    #[test]
    fn a_runs_answers_are_the_difference_of_two_scrapes() {
        let before = AnswerCounts {
            first_runs: 10,
            replays: 1,
            ..AnswerCounts::default()
        };
        let after = label_answers(EXPOSITION);
        assert_eq!(difference(&after, &before).first_runs, 110);
        assert_eq!(difference(&after, &before).replays, 6);
    }

    #[test]
    fn this_process_has_a_resident_size() {
        let (rss, peak) = resident_kib(std::process::id()).unwrap();
        assert!(rss > 0 && peak >= rss);
    }
}
