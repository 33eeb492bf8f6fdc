//! The nemeses: faults injected into the running fleet on a schedule drawn
//! from the campaign's seed, one at a time, each healed before the next.

use crate::cluster::{Cluster, LEASE_MS, Stores, signal};
use crate::history::{FaultWindow, JsonLines, now_ms};
use crate::network::Peer;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use std::time::Duration;
use test_support::fault_proxy::Fault;
use tokio::time::Instant;

/// Quiet time before each fault.
const GAP_MS: u64 = 1_500;
/// How far a skewed instance's clock runs ahead: several leases.
pub const CLOCK_SKEW_MS: i64 = 5_000;
/// How long the carrier's proxy holds each chunk back when it is slow:
/// two chunks each way outlast the carrier timeout.
const SLOW_CARRIER_DELAY_MS: u64 = 300;

/// One kind of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Nemesis {
    /// One instance cannot reach the stores.
    PartitionStore,
    /// One instance cannot reach the carrier.
    PartitionCarrier,
    /// SIGSTOP for longer than the lease, then SIGCONT.
    Pause,
    /// SIGKILL, then a restart.
    Kill,
    /// One instance restarted with its clock ahead, then restarted without.
    ClockSkew,
    /// PostgreSQL `pg_ctl stop -m immediate`, Redis killed, or one of
    /// FoundationDB's processes killed; then started again.
    StoreCrash,
    /// The carrier answers slower than the service waits.
    SlowCarrier,
    /// The carrier sells and its replies are lost.
    LostCarrierReplies,
}

impl Nemesis {
    pub const ALL: [Nemesis; 8] = [
        Nemesis::PartitionStore,
        Nemesis::PartitionCarrier,
        Nemesis::Pause,
        Nemesis::Kill,
        Nemesis::ClockSkew,
        Nemesis::StoreCrash,
        Nemesis::SlowCarrier,
        Nemesis::LostCarrierReplies,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Nemesis::PartitionStore => "partition-store",
            Nemesis::PartitionCarrier => "partition-carrier",
            Nemesis::Pause => "pause",
            Nemesis::Kill => "kill",
            Nemesis::ClockSkew => "clock-skew",
            Nemesis::StoreCrash => "store-crash",
            Nemesis::SlowCarrier => "slow-carrier",
            Nemesis::LostCarrierReplies => "lost-carrier-replies",
        }
    }

    /// How long the fault lasts.
    fn duration_ms(self) -> u64 {
        match self {
            // Well past the lease, so another instance takes the keys over
            // while this one sleeps with work in hand.
            Nemesis::Pause => 3 * LEASE_MS,
            Nemesis::Kill => 2_000,
            Nemesis::ClockSkew => 4_000,
            Nemesis::StoreCrash => 2_000,
            Nemesis::PartitionStore | Nemesis::PartitionCarrier => 3_000,
            Nemesis::SlowCarrier | Nemesis::LostCarrierReplies => 3_000,
        }
    }

    /// Whether the fault is aimed at one instance.
    fn targets_an_instance(self) -> bool {
        !matches!(
            self,
            Nemesis::StoreCrash | Nemesis::SlowCarrier | Nemesis::LostCarrierReplies
        )
    }
}

/// One fault of the schedule.
#[derive(Debug, Clone, Copy)]
pub struct Planned {
    pub nemesis: Nemesis,
    pub instance: usize,
    pub duration_ms: u64,
}

/// How many nemeses a short campaign runs: the pause (which is what the
/// fence and the carrier key are for) and this many more drawn by the seed.
const SHORT_CAMPAIGN_EXTRA_NEMESES: usize = 2;

/// The schedule of a short campaign: the pause first, then a few others.
pub fn short_schedule(seed: u64, instances: usize) -> Vec<Planned> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut others: Vec<Nemesis> = Nemesis::ALL.into_iter().filter(|n| *n != Nemesis::Pause).collect();
    others.shuffle(&mut rng);
    std::iter::once(Nemesis::Pause)
        .chain(others.into_iter().take(SHORT_CAMPAIGN_EXTRA_NEMESES))
        .map(|nemesis| plan(nemesis, &mut rng, instances))
        .collect()
}

/// The schedule of a long campaign: every nemesis in a seeded order, again
/// and again, until `load_ms` is used up.
pub fn long_schedule(seed: u64, instances: usize, load_ms: u64) -> Vec<Planned> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut schedule = Vec::new();
    let mut used = 0;
    loop {
        let mut round = Nemesis::ALL.to_vec();
        round.shuffle(&mut rng);
        for nemesis in round {
            let planned = plan(nemesis, &mut rng, instances);
            used += GAP_MS + planned.duration_ms;
            if used > load_ms {
                return schedule;
            }
            schedule.push(planned);
        }
    }
}

fn plan(nemesis: Nemesis, rng: &mut StdRng, instances: usize) -> Planned {
    Planned {
        nemesis,
        instance: rng.random_range(0..instances),
        duration_ms: nemesis.duration_ms(),
    }
}

/// Runs the schedule against the fleet, logging each fault's window.
pub async fn run(cluster: &mut Cluster, schedule: &[Planned], log: &JsonLines) {
    for planned in schedule {
        tokio::time::sleep(Duration::from_millis(GAP_MS)).await;
        let start_ms = now_ms();
        let target = inject(cluster, planned).await;
        let until = Instant::now() + Duration::from_millis(planned.duration_ms);
        tokio::time::sleep_until(until).await;
        heal(cluster, planned).await;
        let window = FaultWindow {
            nemesis: planned.nemesis.name().to_owned(),
            target,
            start_ms,
            end_ms: now_ms(),
        };
        eprintln!(
            "FAULTS nemesis={} target={} held_ms={}",
            window.nemesis,
            window.target,
            window.end_ms - window.start_ms
        );
        log.append(&window);
    }
    tokio::time::sleep(Duration::from_millis(GAP_MS)).await;
    log.flush();
}

/// Injects the fault; answers what it hit.
async fn inject(cluster: &mut Cluster, planned: &Planned) -> String {
    let index = planned.instance;
    match planned.nemesis {
        Nemesis::PartitionStore => cluster.network.cut(index, Peer::Store),
        Nemesis::PartitionCarrier => cluster.network.cut(index, Peer::Carrier),
        Nemesis::Pause => signal(cluster.pid(index), "-STOP"),
        Nemesis::Kill => {
            let process = cluster.instances[index].process.take().expect("the instance runs");
            process.kill().await;
        }
        Nemesis::ClockSkew => restart_instance(cluster, index, Some(CLOCK_SKEW_MS)).await,
        Nemesis::StoreCrash => return crash_store(cluster).await,
        Nemesis::SlowCarrier => cluster
            .carrier_proxy
            .set(Fault::Delay(Duration::from_millis(SLOW_CARRIER_DELAY_MS))),
        Nemesis::LostCarrierReplies => cluster.carrier_proxy.set(Fault::DropReplies),
    }
    match planned.nemesis.targets_an_instance() {
        true => format!("instance {index}"),
        false => "carrier".to_owned(),
    }
}

async fn heal(cluster: &mut Cluster, planned: &Planned) {
    let index = planned.instance;
    match planned.nemesis {
        Nemesis::PartitionStore => cluster.network.heal(index, Peer::Store),
        Nemesis::PartitionCarrier => cluster.network.heal(index, Peer::Carrier),
        Nemesis::Pause => signal(cluster.pid(index), "-CONT"),
        Nemesis::Kill => {
            let process = cluster.start_instance(index, None).await;
            cluster.instances[index].process = Some(process);
        }
        Nemesis::ClockSkew => restart_instance(cluster, index, None).await,
        Nemesis::StoreCrash => restart_store(cluster).await,
        Nemesis::SlowCarrier | Nemesis::LostCarrierReplies => cluster.carrier_proxy.set(Fault::Pass),
    }
}

/// A clean shutdown (SIGTERM, work in flight finished), then a start with the
/// clock offset given.
async fn restart_instance(cluster: &mut Cluster, index: usize, clock_offset_ms: Option<i64>) {
    let process = cluster.instances[index].process.take().expect("the instance runs");
    let (status, log) = process.terminate().await;
    assert!(status.success(), "instance {index} did not exit cleanly: {log}");
    let process = cluster.start_instance(index, clock_offset_ms).await;
    cluster.instances[index].process = Some(process);
}

async fn crash_store(cluster: &mut Cluster) -> String {
    match &mut cluster.stores {
        Stores::Postgres { server, .. } => {
            tokio::task::block_in_place(|| server.shut_down_immediately()).expect("pg_ctl stop -m immediate");
            "postgres".to_owned()
        }
        Stores::Redis { redis, .. } => {
            redis.kill();
            "redis".to_owned()
        }
        #[cfg(feature = "foundationdb")]
        Stores::Foundationdb { cluster: fdb, .. } => {
            fdb.kill(1);
            "fdbserver 1 of 3".to_owned()
        }
    }
}

async fn restart_store(cluster: &mut Cluster) {
    match &mut cluster.stores {
        Stores::Postgres { server, .. } => {
            tokio::task::block_in_place(|| server.start_again()).expect("pg_ctl start");
        }
        Stores::Redis { redis, .. } => {
            tokio::task::block_in_place(|| redis.restart()).expect("redis-server restarts");
        }
        #[cfg(feature = "foundationdb")]
        Stores::Foundationdb { cluster: fdb, .. } => fdb.restart(1),
    }
}
