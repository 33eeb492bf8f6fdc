//! When each operation should start: the open-loop arrival schedule.
//!
//! An open-loop load generator decides every operation's start time in
//! advance, from the target rate alone, and never waits for a reply before
//! sending the next request. A slow reply therefore cannot slow the offered
//! load down and hide itself (coordinated omission). Latency is measured from
//! the intended start these offsets give, not from when the request actually
//! left.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Highest target rate accepted, in operations per second: far above what one
/// 2-core machine can drive, and low enough that every interval is at least
/// one microsecond.
pub const RATE_PER_S_MAX: f64 = 1_000_000.0;
/// Lowest target rate accepted, in operations per second.
pub const RATE_PER_S_MIN: f64 = 0.1;

/// How arrivals are spaced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Arrivals {
    /// Evenly spaced, exactly 1/rate apart (wrk2's model).
    Fixed,
    /// A Poisson process: independent exponential gaps with mean 1/rate,
    /// the arrival pattern of many independent clients.
    Poisson,
}

/// Why a schedule was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ScheduleError {
    #[error("rate {rate_per_s}/s is outside {RATE_PER_S_MIN}..={RATE_PER_S_MAX}")]
    Rate { rate_per_s: f64 },
}

/// The start offsets of one run, from the run's own start.
#[derive(Debug, Clone)]
pub struct Schedule {
    arrivals: Arrivals,
    rate_per_s: f64,
    rng: StdRng,
    next_offset_s: f64,
    next_index: u64,
}

impl Schedule {
    /// `seed` makes a Poisson schedule replayable.
    pub fn new(arrivals: Arrivals, rate_per_s: f64, seed: u64) -> Result<Self, ScheduleError> {
        if !(RATE_PER_S_MIN..=RATE_PER_S_MAX).contains(&rate_per_s) || !rate_per_s.is_finite() {
            return Err(ScheduleError::Rate { rate_per_s });
        }
        let mut schedule = Self {
            arrivals,
            rate_per_s,
            rng: StdRng::seed_from_u64(seed),
            next_offset_s: 0.0,
            next_index: 0,
        };
        // A Poisson process has its first arrival one random gap after the
        // start, like every other; a fixed schedule starts at once.
        if arrivals == Arrivals::Poisson {
            schedule.next_offset_s = schedule.gap_s();
        }
        Ok(schedule)
    }

    pub fn rate_per_s(&self) -> f64 {
        self.rate_per_s
    }

    /// The gap to the following arrival, in seconds.
    fn gap_s(&mut self) -> f64 {
        match self.arrivals {
            Arrivals::Fixed => 1.0 / self.rate_per_s,
            Arrivals::Poisson => {
                // `random::<f64>()` is in [0, 1); 1 - u is in (0, 1], so the
                // logarithm is finite.
                let uniform: f64 = self.rng.random();
                -(1.0 - uniform).ln() / self.rate_per_s
            }
        }
    }
}

/// One planned operation: its number in the run and its intended start.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Arrival {
    pub index: u64,
    pub offset: Duration,
}

impl Iterator for Schedule {
    type Item = Arrival;

    fn next(&mut self) -> Option<Arrival> {
        let arrival = Arrival {
            index: self.next_index,
            offset: Duration::from_secs_f64(self.next_offset_s),
        };
        self.next_index += 1;
        self.next_offset_s = match self.arrivals {
            // Computing from the index, not by adding gaps, keeps rounding
            // errors from accumulating over millions of arrivals.
            Arrivals::Fixed => self.next_index as f64 / self.rate_per_s,
            Arrivals::Poisson => self.next_offset_s + self.gap_s(),
        };
        Some(arrival)
    }
}

/// Every arrival of a schedule before `window`.
pub fn arrivals_within(schedule: Schedule, window: Duration) -> impl Iterator<Item = Arrival> {
    schedule.take_while(move |arrival| arrival.offset < window)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(arrivals: Arrivals, rate_per_s: f64, seconds: u64, seed: u64) -> usize {
        let schedule = Schedule::new(arrivals, rate_per_s, seed).unwrap();
        arrivals_within(schedule, Duration::from_secs(seconds)).count()
    }

    #[test]
    fn a_fixed_schedule_gives_exactly_rate_times_duration_evenly_spaced() {
        assert_eq!(count(Arrivals::Fixed, 2_000.0, 60, 1), 120_000);
        let offsets: Vec<Duration> = Schedule::new(Arrivals::Fixed, 4.0, 0)
            .unwrap()
            .take(3)
            .map(|arrival| arrival.offset)
            .collect();
        assert_eq!(offsets, [0, 250, 500].map(Duration::from_millis));
    }

    #[test]
    fn a_poisson_schedule_gives_about_rate_times_duration() {
        // 120,000 expected arrivals: the standard deviation is about 346, so
        // 1% (1,200) is more than three deviations on either side.
        for seed in [1, 2, 3] {
            let arrivals = count(Arrivals::Poisson, 2_000.0, 60, seed) as f64;
            assert!((arrivals - 120_000.0).abs() < 1_200.0, "seed {seed}: {arrivals}");
        }
    }

    #[test]
    fn poisson_gaps_vary_and_average_one_over_rate() {
        let offsets: Vec<f64> = Schedule::new(Arrivals::Poisson, 1_000.0, 7)
            .unwrap()
            .take(20_001)
            .map(|arrival| arrival.offset.as_secs_f64())
            .collect();
        let gaps: Vec<f64> = offsets.windows(2).map(|pair| pair[1] - pair[0]).collect();
        let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
        assert!((mean - 0.001).abs() < 0.000_05, "{mean}");
        // An exponential distribution's standard deviation equals its mean;
        // a fixed schedule's would be zero.
        let variance = gaps.iter().map(|gap| (gap - mean).powi(2)).sum::<f64>() / gaps.len() as f64;
        assert!((variance.sqrt() - 0.001).abs() < 0.000_1, "{}", variance.sqrt());
        assert!(gaps.iter().all(|gap| *gap >= 0.0));
    }

    #[test]
    fn the_same_seed_gives_the_same_schedule() {
        let first: Vec<Arrival> = Schedule::new(Arrivals::Poisson, 500.0, 42).unwrap().take(100).collect();
        let again: Vec<Arrival> = Schedule::new(Arrivals::Poisson, 500.0, 42).unwrap().take(100).collect();
        assert_eq!(first, again);
    }

    #[test]
    fn rates_out_of_range_are_refused() {
        for rate in [0.0, -1.0, f64::NAN, f64::INFINITY, RATE_PER_S_MAX * 2.0] {
            assert!(Schedule::new(Arrivals::Fixed, rate, 0).is_err(), "{rate}");
        }
    }
}
