//! The seeded fault switch: conflicts and "commit unknown result", before
//! or after a real commit, in parts per million, replayable from the seed.

use std::sync::atomic::{AtomicU64, Ordering};

/// Faults to inject at commit, in parts per million of commits. For tests:
/// production configs leave it at the default (no faults).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FaultPlan {
    /// Fail the commit with `not_committed` without committing.
    pub conflict_ppm: u32,
    /// Fail with `commit_unknown_result` without committing.
    pub unknown_before_commit_ppm: u32,
    /// Commit for real, then report `commit_unknown_result`.
    pub unknown_after_commit_ppm: u32,
    /// Seed of the fault sequence, so a failing run can be replayed.
    pub seed: u64,
}

/// Counts of what the fault switch did, for tests to assert on.
#[derive(Debug, Default)]
pub struct FaultCounters {
    pub conflicts: AtomicU64,
    pub unknown_before_commit: AtomicU64,
    pub unknown_after_commit: AtomicU64,
}

pub(super) struct FaultSwitch {
    pub(super) plan: FaultPlan,
    pub(super) sequence: AtomicU64,
    pub(super) counters: FaultCounters,
}

pub(super) enum Fault {
    None,
    Conflict,
    UnknownBeforeCommit,
    UnknownAfterCommit,
}

impl FaultSwitch {
    /// Deterministic per commit number: splitmix64 of seed and sequence.
    pub(super) fn next(&self) -> Fault {
        let plan = &self.plan;
        if plan.conflict_ppm == 0 && plan.unknown_before_commit_ppm == 0 && plan.unknown_after_commit_ppm == 0 {
            return Fault::None;
        }
        let n = self.sequence.fetch_add(1, Ordering::Relaxed);
        let roll = (splitmix64(plan.seed ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15)) % 1_000_000) as u32;
        let (a, b, c) = (
            plan.conflict_ppm,
            plan.unknown_before_commit_ppm,
            plan.unknown_after_commit_ppm,
        );
        let (fault, counter) = if roll < a {
            (Fault::Conflict, &self.counters.conflicts)
        } else if roll < a + b {
            (Fault::UnknownBeforeCommit, &self.counters.unknown_before_commit)
        } else if roll < a + b + c {
            (Fault::UnknownAfterCommit, &self.counters.unknown_after_commit)
        } else {
            return Fault::None;
        };
        counter.fetch_add(1, Ordering::Relaxed);
        fault
    }
}

fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
