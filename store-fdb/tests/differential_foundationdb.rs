//! Is the embedded engine faithful? The same random concurrent transaction
//! schedules, played through the `Engine` trait on the embedded engine and
//! on a real FoundationDB cluster, must give the same observations: every
//! read's answer, which commits succeed and which conflict, and the final
//! contents.
//!
//! A schedule is 2 to 4 transactions over 6 keys (after a random initial
//! state), each a few reads (point and range, with limits), writes, clears
//! and range clears and then its commit, interleaved at random. Each
//! transaction is one `Engine::run` with a single attempt, its body fed one
//! operation at a time, so the interleaving is exactly the schedule's. A
//! transaction starts at its first operation.
//!
//! Compiled only with the `foundationdb` feature; `scripts/test-foundationdb`
//! runs it. `IDEM_DIFFERENTIAL_SCHEDULES` sets the number of schedules
//! (default 300), `IDEM_DIFFERENTIAL_SEED` replays a seed.
#![cfg(feature = "foundationdb")]

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;
use store_fdb::engine::KeyValue;
use store_fdb::testkit::{embedded, foundationdb};
use store_fdb::{Engine, MaybeCommitted, RunOptions, Transaction, TxError};
use tokio::sync::{Mutex, mpsc, oneshot};

const SCHEDULES_DEFAULT: usize = 300;
const KEYS: u8 = 6;
const TRANSACTIONS_MAX: usize = 4;
const OPERATIONS_MAX: usize = 5;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Op {
    Get(u8),
    Range { begin: u8, end: u8, limit: usize },
    Set(u8, u8),
    Clear(u8),
    ClearRange(u8, u8),
    Commit,
}

/// What one operation observed.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    Value(Option<Vec<u8>>),
    Pairs(Vec<KeyValue>),
    Written,
    /// The commit's outcome: committed, or the error's kind.
    Commit(Result<(), String>),
    /// The operation failed, or its transaction had already ended.
    Failed(String),
}

#[derive(Debug, Clone)]
struct Schedule {
    initial: Vec<(u8, u8)>,
    steps: Vec<(usize, Op)>,
}

fn random_op(rng: &mut StdRng) -> Op {
    let key = |rng: &mut StdRng| rng.random_range(0..KEYS);
    let span = |rng: &mut StdRng| {
        let begin = rng.random_range(0..KEYS);
        (begin, rng.random_range(begin + 1..=KEYS))
    };
    match rng.random_range(0..10) {
        0..=2 => Op::Get(key(rng)),
        3..=4 => {
            let (begin, end) = span(rng);
            let limit = [1, 2, 100][rng.random_range(0..3)];
            Op::Range { begin, end, limit }
        }
        5..=7 => Op::Set(key(rng), rng.random()),
        8 => Op::Clear(key(rng)),
        _ => {
            let (begin, end) = span(rng);
            Op::ClearRange(begin, end)
        }
    }
}

fn random_schedule(rng: &mut StdRng) -> Schedule {
    let mut initial = Vec::new();
    for name in 0..KEYS {
        if rng.random_bool(0.5) {
            initial.push((name, rng.random()));
        }
    }
    let transactions = rng.random_range(2..=TRANSACTIONS_MAX);
    let mut queues: Vec<Vec<Op>> = (0..transactions)
        .map(|_| {
            // A read first: the embedded engine takes its snapshot when the
            // transaction starts, FoundationDB its read version at the first
            // read (the third difference, avoided here by construction).
            let mut ops = vec![Op::Get(rng.random_range(0..KEYS))];
            ops.extend((0..rng.random_range(0..OPERATIONS_MAX)).map(|_| random_op(rng)));
            ops.push(Op::Commit);
            ops.reverse();
            ops
        })
        .collect();
    let mut steps = Vec::new();
    while queues.iter().any(|queue| !queue.is_empty()) {
        let live: Vec<usize> = (0..queues.len()).filter(|&tx| !queues[tx].is_empty()).collect();
        let tx = live[rng.random_range(0..live.len())];
        steps.push((tx, queues[tx].pop().expect("an operation")));
    }
    Schedule { initial, steps }
}

fn key(prefix: &[u8], name: u8) -> Vec<u8> {
    [prefix, &[b'k', b'0' + name]].concat()
}

fn end_of(prefix: &[u8]) -> Vec<u8> {
    [prefix, &[0xff]].concat()
}

/// The error's kind, as both engines name it (FoundationDB's code).
fn kind(error: &store_core::StoreError) -> String {
    let text = error.to_string();
    for (code, name) in [
        ("1020", "not_committed"),
        ("1007", "transaction_too_old"),
        ("1021", "commit_unknown_result"),
    ] {
        if text.contains(code) {
            return name.to_owned();
        }
    }
    text
}

type Request = (Op, Option<oneshot::Sender<Seen>>);

/// One transaction of a schedule: its body runs in a task of its own and
/// takes its operations from a channel.
struct Live {
    requests: mpsc::UnboundedSender<Request>,
    done: tokio::task::JoinHandle<Result<(), store_core::StoreError>>,
}

fn start<E: Engine + Clone>(engine: &E, prefix: &[u8]) -> Live {
    let (requests, receiver) = mpsc::unbounded_channel::<Request>();
    let receiver = Arc::new(Mutex::new(receiver));
    let (engine, prefix) = (engine.clone(), prefix.to_vec());
    let done = tokio::spawn(async move {
        let options = RunOptions {
            retry_limit: 1,
            ..RunOptions::default()
        };
        let (receiver, prefix) = (&receiver, &prefix);
        engine
            .run(options, |tx, _: MaybeCommitted| async move {
                let mut receiver = receiver.lock().await;
                while let Some((op, reply)) = receiver.recv().await {
                    let seen = match op {
                        Op::Commit => return Ok(()),
                        Op::Get(name) => Seen::Value(tx.get(&key(prefix, name)).await?),
                        Op::Range { begin, end, limit } => {
                            Seen::Pairs(tx.get_range(&key(prefix, begin), &key(prefix, end), limit).await?)
                        }
                        Op::Set(name, value) => {
                            tx.set(&key(prefix, name), &[value])?;
                            Seen::Written
                        }
                        Op::Clear(name) => {
                            tx.clear(&key(prefix, name))?;
                            Seen::Written
                        }
                        Op::ClearRange(begin, end) => {
                            tx.clear_range(&key(prefix, begin), &key(prefix, end)).await?;
                            Seen::Written
                        }
                    };
                    if let Some(reply) = reply {
                        let _ = reply.send(seen);
                    }
                }
                Err(TxError::Abort(store_core::StoreError::Refused {
                    detail: "the schedule ended without a commit".into(),
                    source: None,
                }))
            })
            .await
    });
    Live { requests, done }
}

/// Plays a schedule under `prefix`: every observation, then the final contents.
async fn play<E: Engine + Clone>(engine: &E, prefix: &[u8], schedule: &Schedule) -> (Vec<Seen>, Vec<KeyValue>) {
    let initial = &schedule.initial;
    engine
        .run(RunOptions::default(), |tx, _| async move {
            for &(name, value) in initial {
                tx.set(&key(prefix, name), &[value])?;
            }
            Ok(())
        })
        .await
        .expect("the initial state commits");
    let mut live: Vec<Option<Live>> = Vec::new();
    let mut seen = Vec::new();
    for (tx, op) in &schedule.steps {
        while live.len() <= *tx {
            live.push(None);
        }
        let slot = live[*tx].get_or_insert_with(|| start(engine, prefix));
        if *op == Op::Commit {
            let _ = slot.requests.send((Op::Commit, None));
            let outcome = match (&mut slot.done).await.expect("the transaction's task") {
                Ok(()) => Ok(()),
                Err(error) => Err(kind(&error)),
            };
            seen.push(Seen::Commit(outcome));
            continue;
        }
        let (reply, answer) = oneshot::channel();
        let sent = slot.requests.send((op.clone(), Some(reply)));
        seen.push(match (sent, answer.await) {
            (Ok(()), Ok(answer)) => answer,
            _ => Seen::Failed("the transaction had ended".into()),
        });
    }
    let (begin, end) = (prefix, &end_of(prefix));
    let contents = engine
        .run(RunOptions::default(), |tx, _| async move {
            Ok(tx.get_range(begin, end, 100).await?)
        })
        .await
        .expect("read the final contents");
    (seen, contents)
}

fn strip(prefix: &[u8], pairs: &[KeyValue]) -> Vec<(Vec<u8>, Vec<u8>)> {
    pairs
        .iter()
        .map(|(key, value)| (key[prefix.len()..].to_vec(), value.clone()))
        .collect()
}

fn normalised(prefix: &[u8], seen: Vec<Seen>) -> Vec<Seen> {
    seen.into_iter()
        .map(|seen| match seen {
            Seen::Pairs(pairs) => Seen::Pairs(strip(prefix, &pairs)),
            other => other,
        })
        .collect()
}

/// The known differences (FOUNDATIONDB.md, "Is the embedded engine
/// faithful?"), as the first differing step shows them:
/// - the embedded engine conflicts where FoundationDB commits, and the
///   transaction cleared a range (fjall has no range delete: the embedded
///   engine reads the range, taking a read conflict on it) or read keys it
///   had written itself (FoundationDB answers those from the transaction's
///   writes, without a read conflict);
/// - FoundationDB conflicts where the embedded engine commits, and a clear
///   (of a key or a range) is involved: on FoundationDB a clear writes its
///   key or whole range, absent keys included, so a reader of those keys
///   conflicts with it, and its transaction is a writing one, checked at
///   commit; on the embedded engine a clear of absent keys wrote nothing a
///   reader conflicted with, and a transaction whose clears found nothing
///   committed unchecked, as a read-only one.
fn known_difference(
    schedule: &Schedule,
    step: usize,
    embedded: &[Seen],
    foundationdb: &[Seen],
) -> Option<&'static str> {
    let (tx, op) = &schedule.steps[step];
    if *op != Op::Commit {
        return None;
    }
    let conflict = Seen::Commit(Err("not_committed".into()));
    let committed = Seen::Commit(Ok(()));
    if embedded[step] == conflict && foundationdb[step] == committed {
        if clears_a_range(schedule, *tx) {
            return Some("embedded stricter: a range clear's read conflict");
        }
        if reads_own_writes(schedule, *tx) {
            return Some("embedded stricter: a read of the transaction's own writes");
        }
        let stopped_at_limit = schedule.steps[..step].iter().zip(foundationdb).any(|((owner, op), seen)| {
            matches!((op, seen), (Op::Range { limit, .. }, Seen::Pairs(pairs)) if *owner == *tx && pairs.len() == *limit)
        });
        if stopped_at_limit {
            return Some("embedded stricter: a range read stopped by its limit");
        }
    }
    if embedded[step] == committed && foundationdb[step] == conflict {
        let cleared_before = schedule.steps[..step].iter().enumerate().any(|(earlier, (other, op))| {
            *other != *tx && *op == Op::Commit && foundationdb[earlier] == committed && clears(schedule, *other)
        });
        if cleared_before {
            return Some("FoundationDB stricter: another transaction's clear of absent keys");
        }
        if clears(schedule, *tx) {
            return Some("FoundationDB stricter: the transaction's own clear of absent keys");
        }
    }
    None
}

/// Whether the final contents differ only by keys the embedded engine kept
/// inside a range that a committed transaction cleared: the embedded
/// engine's range clear removes the keys its snapshot holds, so a key
/// committed by another transaction after that snapshot survives, and when
/// the clear found nothing its transaction has no write and commits
/// unchecked, as a read-only one. FoundationDB clears the range at commit.
fn survives_a_range_clear(
    schedule: &Schedule,
    seen: &[Seen],
    embedded: &[KeyValue],
    foundationdb: &[KeyValue],
) -> bool {
    let cleared: Vec<(u8, u8)> = schedule
        .steps
        .iter()
        .enumerate()
        .filter(|(step, (_, op))| *op == Op::Commit && seen[*step] == Seen::Commit(Ok(())))
        .flat_map(|(_, (tx, _))| {
            schedule.steps.iter().filter_map(move |(owner, op)| match op {
                Op::ClearRange(begin, end) if owner == tx => Some((*begin, *end)),
                _ => None,
            })
        })
        .collect();
    let only_in_embedded: Vec<&KeyValue> = embedded.iter().filter(|pair| !foundationdb.contains(pair)).collect();
    let only_in_foundationdb = foundationdb.iter().any(|pair| !embedded.contains(pair));
    !only_in_foundationdb
        && only_in_embedded.iter().all(|(key, _)| {
            let name = key[1] - b'0';
            cleared.iter().any(|&(begin, end)| (begin..end).contains(&name))
        })
}

/// Whether transaction `tx` clears a key or a range.
fn clears(schedule: &Schedule, tx: usize) -> bool {
    schedule
        .steps
        .iter()
        .any(|(owner, op)| *owner == tx && matches!(op, Op::Clear(_) | Op::ClearRange(..)))
}

/// Whether transaction `tx` clears a range.
fn clears_a_range(schedule: &Schedule, tx: usize) -> bool {
    schedule
        .steps
        .iter()
        .any(|(owner, op)| *owner == tx && matches!(op, Op::ClearRange(..)))
}

/// Whether transaction `tx` read something it had written itself before: a
/// key it had set or cleared, or a range holding one (FoundationDB answers
/// those keys from the transaction's writes, without a read conflict on
/// them; a superset of that precise condition).
fn reads_own_writes(schedule: &Schedule, tx: usize) -> bool {
    let mut written = [false; KEYS as usize];
    for (_, op) in schedule.steps.iter().filter(|(owner, _)| *owner == tx) {
        match *op {
            Op::Set(name, _) | Op::Clear(name) => written[usize::from(name)] = true,
            Op::ClearRange(begin, end) => (begin..end).for_each(|name| written[usize::from(name)] = true),
            Op::Get(name) if written[usize::from(name)] => return true,
            Op::Range { begin, end, .. } if (begin..end).any(|name| written[usize::from(name)]) => return true,
            _ => {}
        }
    }
    false
}

/// The schedule, one step a line, with what each engine saw; `!!` marks a difference.
fn side_by_side(schedule: &Schedule, embedded: &[Seen], foundationdb: &[Seen]) -> String {
    let mut text = format!("initial {:?}\nstep tx op | embedded | FoundationDB\n", schedule.initial);
    for (step, (tx, op)) in schedule.steps.iter().enumerate() {
        let (left, right) = (embedded.get(step), foundationdb.get(step));
        let mark = if left == right { "  " } else { "!!" };
        text.push_str(&format!("{mark} {step:2} t{tx} {op:?} | {left:?} | {right:?}\n"));
    }
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_embedded_engine_and_foundationdb_agree_on_random_concurrent_schedules() {
    let schedules = std::env::var("IDEM_DIFFERENTIAL_SCHEDULES")
        .ok()
        .map_or(SCHEDULES_DEFAULT, |text| text.parse().expect("a whole number"));
    let seed = std::env::var("IDEM_DIFFERENTIAL_SEED")
        .ok()
        .map_or_else(rand::random, |text| text.parse().expect("a whole number"));
    eprintln!("differential: seed {seed} (replay with IDEM_DIFFERENTIAL_SEED={seed})");
    let mut rng = StdRng::seed_from_u64(seed);
    let fdb = foundationdb().await;
    let local = embedded().await;
    let (mut commits, mut conflicts) = (0, 0);
    let mut differences = std::collections::BTreeMap::<&str, usize>::new();
    for number in 0..schedules {
        let schedule = random_schedule(&mut rng);
        let fdb_prefix = [fdb.prefix.as_slice(), format!("/{number:05}/").as_bytes()].concat();
        let local_prefix = [local.prefix.as_slice(), format!("/{number:05}/").as_bytes()].concat();
        let (fdb_seen, fdb_contents) = play(&fdb.engine, &fdb_prefix, &schedule).await;
        let (local_seen, local_contents) = play(&local.engine, &local_prefix, &schedule).await;
        let (fdb_seen, local_seen) = (normalised(&fdb_prefix, fdb_seen), normalised(&local_prefix, local_seen));
        if let Some(step) = (0..schedule.steps.len()).find(|&step| local_seen.get(step) != fdb_seen.get(step)) {
            // Everything after a commit that went differently may differ,
            // so the schedule ends there, if the difference is a known one.
            let known = known_difference(&schedule, step, &local_seen, &fdb_seen);
            let Some(known) = known else {
                panic!(
                    "schedule {number} (seed {seed}): observations differ at step {step}\n{}",
                    side_by_side(&schedule, &local_seen, &fdb_seen)
                );
            };
            *differences.entry(known).or_insert(0) += 1;
            if differences.values().sum::<usize>() <= 3 {
                eprintln!(
                    "differential: {known}, schedule {number}:\n{}",
                    side_by_side(&schedule, &local_seen, &fdb_seen)
                );
            }
            continue;
        }
        let (local_contents, fdb_contents) = (strip(&local_prefix, &local_contents), strip(&fdb_prefix, &fdb_contents));
        if local_contents != fdb_contents
            && survives_a_range_clear(&schedule, &fdb_seen, &local_contents, &fdb_contents)
        {
            *differences
                .entry("embedded looser: a range clear misses keys committed after its snapshot")
                .or_insert(0) += 1;
            continue;
        }
        assert!(
            local_contents == fdb_contents,
            "schedule {number} (seed {seed}): final contents differ: embedded {local_contents:?}, FoundationDB \
             {fdb_contents:?}\n{}",
            side_by_side(&schedule, &local_seen, &fdb_seen)
        );
        for seen in &fdb_seen {
            match seen {
                Seen::Commit(Ok(())) => commits += 1,
                Seen::Commit(Err(_)) => conflicts += 1,
                _ => {}
            }
        }
    }
    let agreed = schedules - differences.values().sum::<usize>();
    eprintln!(
        "differential: {schedules} schedules: {agreed} agreed step for step and on the final contents \
         ({commits} commits, {conflicts} conflicts); ended at a known difference: {differences:?}"
    );
    assert!(conflicts > 0, "no schedule conflicted: the test exercises nothing");
}
