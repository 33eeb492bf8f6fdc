//! Facts about the machine a report was measured on, and when.

use serde::{Deserialize, Serialize};
use std::time::{SystemTime, UNIX_EPOCH};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Machine {
    /// UTC time the run started, ISO 8601.
    pub started_at: String,
    pub cpus: usize,
    pub cpu_model: String,
    pub memory_mib: u64,
    /// 1-minute load average when the run started: above the CPU count, the
    /// machine was busy with something else.
    pub load_average_1m: Option<f64>,
}

impl Machine {
    pub fn now() -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let loadavg = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
        Self {
            started_at: iso_utc(SystemTime::now()),
            cpus: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
            cpu_model: field(&cpuinfo, "model name").unwrap_or_else(|| "unknown".into()),
            memory_mib: field(&meminfo, "MemTotal")
                .and_then(|value| value.trim_end_matches("kB").trim().parse::<u64>().ok())
                .map(|kib| kib / 1_024)
                .unwrap_or(0),
            load_average_1m: loadavg.split_whitespace().next().and_then(|value| value.parse().ok()),
        }
    }

    pub fn describe(&self) -> String {
        let load = self
            .load_average_1m
            .map(|load| format!(", load {load:.2}"))
            .unwrap_or_default();
        format!(
            "{}: {} CPUs ({}), {} MiB{load}",
            self.started_at, self.cpus, self.cpu_model, self.memory_mib
        )
    }
}

/// The value of the first `name: value` line.
fn field(text: &str, name: &str) -> Option<String> {
    text.lines()
        .find(|line| line.split(':').next().is_some_and(|key| key.trim() == name))
        .and_then(|line| line.split_once(':'))
        .map(|(_, value)| value.trim().to_owned())
}

/// `YYYY-MM-DDTHH:MM:SSZ` for a time after 1970.
pub fn iso_utc(time: SystemTime) -> String {
    humantime::format_rfc3339_seconds(time.max(UNIX_EPOCH)).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn dates_are_utc_iso_8601() {
        assert_eq!(iso_utc(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        let leap_day = UNIX_EPOCH + Duration::from_secs(951_782_400 + 3_723);
        assert_eq!(iso_utc(leap_day), "2000-02-29T01:02:03Z");
    }

    #[test]
    fn fields_are_read_from_proc_style_text() {
        assert_eq!(
            field("model name\t: AMD EPYC\n", "model name").as_deref(),
            Some("AMD EPYC")
        );
        assert_eq!(field("MemTotal:  24684 kB\n", "MemTotal").as_deref(), Some("24684 kB"));
        assert_eq!(field("", "MemTotal"), None);
    }
}
