//! What each process of a run costs per intent: CPU time and context
//! switches, read from `/proc` before and after the load, for the bench, the
//! Label service, the carrier simulator and the store's servers.
//!
//! The store's servers are found by name ([`STORE_PROCESS_NAMES`]) among the
//! processes started after the bench itself, so a machine's own PostgreSQL
//! or Redis (started before) is left out, while every backend process of a
//! spawned PostgreSQL is counted. A store the bench did not spawn (a
//! FoundationDB cluster, `--postgres-url`) is not in the table: its cost
//! must be read on its own machine.

use super::spawn::SpawnedServer;
use serde::{Deserialize, Serialize};

/// Process names (`/proc/PID/comm`) of the store servers a run may spawn.
pub const STORE_PROCESS_NAMES: [&str; 3] = ["postgres", "redis-server", "fdbserver"];
/// The name the store's processes are reported under.
pub const STORE_PROCESSES: &str = "store servers";

/// Clock ticks per second in `/proc/PID/stat` (Linux's USER_HZ, 100 on
/// every mainstream architecture).
pub const CLOCK_TICKS_PER_S: f64 = 100.0;

/// One process (or group of processes) and its cost during the load.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcessCpu {
    pub process: String,
    pub cpu_s: f64,
    pub ms_per_intent: f64,
    /// Voluntary and involuntary context switches of every thread, per
    /// intent: the hand-offs between threads and the waits in the kernel.
    #[serde(default)]
    pub context_switches_per_intent: Option<f64>,
}

/// The counters of one process at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Counters {
    cpu_s: f64,
    context_switches: u64,
}

impl Counters {
    fn of(pid: u32) -> Option<Self> {
        Some(Self {
            cpu_s: cpu_seconds(pid)?,
            context_switches: context_switches(pid).unwrap_or(0),
        })
    }
}

/// A named group of processes and their counters when the load began.
struct Group {
    name: String,
    before: Vec<(u32, Counters)>,
    /// For the store's servers: processes of theirs started during the
    /// load (a pool's connection opened late is a new PostgreSQL backend)
    /// are found again at the end and count from zero.
    joined_since: Option<u64>,
}

impl Group {
    fn of(name: &str, pids: Vec<u32>) -> Self {
        Self {
            name: name.to_owned(),
            before: pids
                .into_iter()
                .filter_map(|pid| Counters::of(pid).map(|counters| (pid, counters)))
                .collect(),
            joined_since: None,
        }
    }
}

/// Counters of the processes involved, read before and after the load.
pub struct CostMeter {
    groups: Vec<Group>,
}

impl CostMeter {
    /// Reads the counters of the bench, the spawned service(s), the carrier
    /// simulator and the store's servers started after the bench.
    pub fn start(spawned: Option<&SpawnedServer>) -> Self {
        let mut groups = vec![Group::of("idem-bench", vec![std::process::id()])];
        if let Some(spawned) = spawned {
            for (number, pid) in spawned.pids().into_iter().enumerate() {
                let name = match number {
                    0 => "label service".to_owned(),
                    _ => format!("label service {}", number + 1),
                };
                groups.push(Group::of(&name, vec![pid]));
            }
            groups.extend(
                spawned
                    .carrier_pid()
                    .map(|pid| Group::of("carrier simulator", vec![pid])),
            );
            let since = start_ticks(std::process::id()).unwrap_or(u64::MAX);
            groups.push(Group {
                joined_since: Some(since),
                ..Group::of(STORE_PROCESSES, store_processes_started_since(since))
            });
        }
        groups.retain(|group| !group.before.is_empty() || group.joined_since.is_some());
        Self { groups }
    }

    /// Each group's cost since [`CostMeter::start`], per intent. A process
    /// that ended meanwhile counts for nothing.
    pub fn finish(self, intents: usize) -> Vec<ProcessCpu> {
        let per_intent = |total: f64| total / intents.max(1) as f64;
        self.groups
            .into_iter()
            .filter_map(|group| {
                let mut spent = Counters::default();
                let mut before = group.before;
                if let Some(since) = group.joined_since {
                    let known: Vec<u32> = before.iter().map(|(pid, _)| *pid).collect();
                    let joined = store_processes_started_since(since)
                        .into_iter()
                        .filter(|pid| !known.contains(pid));
                    before.extend(joined.map(|pid| (pid, Counters::default())));
                }
                if before.is_empty() {
                    return None;
                }
                for (pid, before) in &before {
                    if let Some(after) = Counters::of(*pid) {
                        spent.cpu_s += (after.cpu_s - before.cpu_s).max(0.0);
                        spent.context_switches += after.context_switches.saturating_sub(before.context_switches);
                    }
                }
                Some(ProcessCpu {
                    process: group.name,
                    cpu_s: spent.cpu_s,
                    ms_per_intent: per_intent(spent.cpu_s * 1_000.0),
                    context_switches_per_intent: Some(per_intent(spent.context_switches as f64)),
                })
            })
            .collect()
    }
}

/// The fields of `/proc/PID/stat` after the command name, which may hold
/// spaces and parentheses: the first of them is the state (field 3).
fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    Some(stat.rsplit_once(')')?.1.split_whitespace().map(str::to_owned).collect())
}

/// CPU time (user plus system) a process has used so far, in seconds.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    // utime (field 14) and stime (field 15).
    let fields = stat_fields(pid)?;
    let user: f64 = fields.get(11)?.parse().ok()?;
    let system: f64 = fields.get(12)?.parse().ok()?;
    Some((user + system) / CLOCK_TICKS_PER_S)
}

/// When a process started, in clock ticks since boot (field 22).
fn start_ticks(pid: u32) -> Option<u64> {
    stat_fields(pid)?.get(19)?.parse().ok()
}

/// Voluntary and involuntary context switches of every live thread of a
/// process.
pub fn context_switches(pid: u32) -> Option<u64> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut total = 0;
    for task in tasks.flatten() {
        let Ok(status) = std::fs::read_to_string(task.path().join("status")) else {
            continue;
        };
        total += status
            .lines()
            .filter(|line| {
                line.starts_with("voluntary_ctxt_switches:") || line.starts_with("nonvoluntary_ctxt_switches:")
            })
            .filter_map(|line| line.split_whitespace().nth(1)?.parse::<u64>().ok())
            .sum::<u64>();
    }
    Some(total)
}

/// The store servers' processes ([`STORE_PROCESS_NAMES`]) started at or
/// after `since` (clock ticks since boot).
fn store_processes_started_since(since: u64) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&candidate| {
            let name = std::fs::read_to_string(format!("/proc/{candidate}/comm")).unwrap_or_default();
            STORE_PROCESS_NAMES.contains(&name.trim()) && start_ticks(candidate).is_some_and(|start| start >= since)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_busy_process_shows_cpu_and_context_switches() {
        // A process of its own, not this test binary: its other tests'
        // threads come and go, and a thread that ends takes its counts with
        // it. The shell waits for 30 short sleeps, a context switch each.
        // Its last sleep replaces the shell, so killing the child ends it.
        let mut child = std::process::Command::new("sh")
            .args(["-c", "for i in $(seq 30); do sleep 0.01; done; exec sleep 5"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("sh");
        let before = Counters::of(child.id()).expect("the child's counters");
        std::thread::sleep(std::time::Duration::from_millis(1_500));
        let after = Counters::of(child.id()).expect("the child's counters");
        let _ = child.kill();
        let _ = child.wait();
        assert!(after.cpu_s >= before.cpu_s);
        assert!(
            after.context_switches >= before.context_switches + 20,
            "{before:?} -> {after:?}"
        );
    }

    /// A copy of `sleep` named like a store server, so its comm is one.
    fn spawn_named_store_server(directory: &std::path::Path) -> std::process::Child {
        let binary = directory.join("redis-server");
        if !binary.exists() {
            std::fs::copy("/bin/sleep", &binary).expect("copy sleep");
        }
        std::process::Command::new(&binary).arg("5").spawn().expect("spawn")
    }

    #[test]
    fn store_servers_started_since_a_moment_are_found_and_older_ones_are_not() {
        let directory = tempfile::tempdir().expect("temporary directory");
        let mut older = spawn_named_store_server(directory.path());
        // Start times are in clock ticks (10 ms): let one pass.
        std::thread::sleep(std::time::Duration::from_millis(50));
        let mut newer = spawn_named_store_server(directory.path());
        let since = start_ticks(newer.id()).expect("start time");
        let found = store_processes_started_since(since);
        for child in [&mut older, &mut newer] {
            let _ = child.kill();
            let _ = child.wait();
        }
        assert!(found.contains(&newer.id()), "{found:?} lacks {}", newer.id());
        assert!(!found.contains(&older.id()), "{found:?} has {}", older.id());
    }
}
