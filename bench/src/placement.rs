//! Where the processes of a run execute: with `--split-cpus`, the Label
//! service and the store servers the bench spawns on CPU 0, and the bench
//! and the carrier simulator on CPU 1, so the service's figures are the
//! service's alone and hold across machines with more cores.
//!
//! Affinity is set with util-linux's `taskset` (`-a`: every thread of the
//! process), which Debian always has, rather than `sched_setaffinity`
//! through a crate: the workspace forbids `unsafe`, and a child spawned
//! after its parent was pinned inherits the parent's CPU set, which is how
//! the stores and the service get CPU 0 (the bench pins itself to CPU 0
//! before spawning them, then to CPU 1).

use std::process::Command;

/// The CPU of the service and its stores.
pub const SERVICE_CPU: usize = 0;
/// The CPU of the bench and the carrier simulator.
pub const CLIENT_CPU: usize = 1;

#[derive(Debug, thiserror::Error)]
pub enum PlacementError {
    #[error("--split-cpus needs at least 2 CPUs; this machine has {0}")]
    TooFewCpus(usize),
    #[error("taskset could not pin process {pid} to CPU {cpu}: {detail}")]
    Taskset { pid: u32, cpu: usize, detail: String },
}

/// Checks that the machine has the two CPUs the split needs.
pub fn check_cpus() -> Result<(), PlacementError> {
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    if cpus < 2 {
        return Err(PlacementError::TooFewCpus(cpus));
    }
    Ok(())
}

/// Pins every thread of process `pid` to `cpu` (its children spawned later
/// inherit it).
pub fn pin(pid: u32, cpu: usize) -> Result<(), PlacementError> {
    let failed = |detail: String| PlacementError::Taskset { pid, cpu, detail };
    let output = Command::new("taskset")
        .args(["-a", "-p", "-c", &cpu.to_string(), &pid.to_string()])
        .output()
        .map_err(|error| failed(error.to_string()))?;
    if !output.status.success() {
        return Err(failed(String::from_utf8_lossy(&output.stderr).trim().to_owned()));
    }
    Ok(())
}

/// The CPUs process `pid`'s main thread may run on, as `taskset` lists them.
pub fn cpus_of(pid: u32) -> Option<String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|line| line.starts_with("Cpus_allowed_list:"))?;
    Some(line.trim_start_matches("Cpus_allowed_list:").trim().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pinned_process_runs_on_its_cpu_only() {
        if check_cpus().is_err() {
            return;
        }
        let mut child = Command::new("sleep").arg("5").spawn().expect("sleep");
        pin(child.id(), CLIENT_CPU).expect("taskset");
        assert_eq!(cpus_of(child.id()).as_deref(), Some("1"));
        pin(child.id(), SERVICE_CPU).expect("taskset");
        assert_eq!(cpus_of(child.id()).as_deref(), Some("0"));
        let _ = child.kill();
        let _ = child.wait();
    }
}
