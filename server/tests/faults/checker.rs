//! The checker: reads a campaign's files (history, faults, sales, labels;
//! see [`crate::history`]) and nothing else, and says whether the
//! guarantees held, with counterexamples:
//!
//! 1. each parcel bought at most once at the carrier;
//! 2. every 201 for one (caller, key) carries the same label id, the same
//!    body bytes and the same `Original-Request` (the attempt that completed
//!    the record), whichever instance answered and whenever: a late
//!    attempt whose completion got past the fence shows up as a second
//!    `Original-Request`, even where its body is byte for byte the winner's;
//! 3. every intent answered 201 has exactly one label row, the one it was told;
//! 4. after the heal, every intent has its 201 (lost = 0);
//! 5. availability during each kind of fault: the share of the intents in
//!    flight during its windows that got their 201 in the load phase (within
//!    the client's own retries), and the answers given instead.
//!
//! On Redis, a violation is matched against store-redis/LIMITS.md: the
//! limits whose conditions the run met (a crash of Redis with
//! `appendfsync everysec`, a clock moved) predict some losses, and such a
//! violation is reported as predicted, naming the row, not as a failure.

use crate::history::{
    AttemptRecord, CAMPAIGN_FILE, CampaignInfo, FAULTS_FILE, FaultWindow, HISTORY_FILE, LABELS_FILE, LabelRow, Phase,
    SALES_FILE, read_lines,
};
use server::carrier::CarrierStats;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Counterexamples shown per property.
const COUNTEREXAMPLES_SHOWN_MAX: usize = 10;
/// The caller every intent is sent as.
const CALLER: &str = test_support::callers::ALICE_ID;

/// One property that failed for one intent or parcel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub property: Property,
    pub detail: String,
    /// The nemeses whose windows the intent's load overlapped.
    pub during: BTreeSet<String>,
    /// The LIMITS.md row that predicts it (Redis only).
    pub predicted_by: Option<&'static str>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Property {
    BoughtTwice,
    DivergentAnswers,
    LabelRows,
    LostAfterHeal,
}

/// Figures for one kind of fault (or "none": intents whose load phase met no
/// fault). An intent counts under every kind of fault its load phase (first
/// attempt sent to last answer) overlapped.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NemesisFigures {
    pub faults: usize,
    pub intents: usize,
    pub answered_201: usize,
    /// Non-201 answers to attempts sent during the windows, by status and code.
    pub answers_instead: BTreeMap<String, usize>,
}

impl NemesisFigures {
    pub fn availability(&self) -> f64 {
        if self.intents == 0 {
            return 1.0;
        }
        self.answered_201 as f64 / self.intents as f64
    }
}

/// What the checker found.
#[derive(Debug)]
pub struct Report {
    pub info: CampaignInfo,
    pub intents: usize,
    pub attempts: usize,
    pub purchases: u64,
    pub label_rows: usize,
    pub violations: Vec<Violation>,
    pub by_nemesis: BTreeMap<String, NemesisFigures>,
}

impl Report {
    pub fn count(&self, property: Property, nemesis: Option<&str>) -> usize {
        self.violations
            .iter()
            .filter(|violation| violation.property == property)
            .filter(|violation| nemesis.is_none_or(|name| violation.during.contains(name)))
            .count()
    }

    /// Violations no documented limit predicts.
    pub fn unpredicted(&self) -> Vec<&Violation> {
        self.violations
            .iter()
            .filter(|violation| violation.predicted_by.is_none())
            .collect()
    }

    /// One line per nemesis, then the totals, for the log and RELIABILITY.md.
    pub fn table(&self) -> String {
        let mut lines = vec![format!(
            "FAULTS backend={} seed={} load_s={:.0} intents={} attempts={} purchases={} label_rows={}",
            self.info.backend,
            self.info.seed,
            self.info.load_ms as f64 / 1_000.0,
            self.intents,
            self.attempts,
            self.purchases,
            self.label_rows
        )];
        for (nemesis, figures) in &self.by_nemesis {
            let name = Some(nemesis.as_str());
            lines.push(format!(
                "FAULTS   {nemesis:<21} faults={:<3} intents={:<5} bought_twice={} divergent={} lost_after_heal={} \
                 availability={:.1}% instead={:?}",
                figures.faults,
                figures.intents,
                self.count(Property::BoughtTwice, name),
                self.count(Property::DivergentAnswers, name),
                self.count(Property::LostAfterHeal, name),
                100.0 * figures.availability(),
                figures.answers_instead
            ));
        }
        let mut shown: BTreeMap<Property, usize> = BTreeMap::new();
        for violation in &self.violations {
            let seen = shown.entry(violation.property).or_default();
            *seen += 1;
            if *seen <= COUNTEREXAMPLES_SHOWN_MAX {
                lines.push(format!(
                    "FAULTS   violation {:?}: {} (during {:?}){}",
                    violation.property,
                    violation.detail,
                    violation.during,
                    violation
                        .predicted_by
                        .map(|row| format!(" predicted by store-redis/LIMITS.md {row}"))
                        .unwrap_or_default()
                ));
            }
        }
        lines.join("\n")
    }
}

/// One intent's attempts, in the order they were sent.
struct IntentHistory<'a> {
    attempts: Vec<&'a AttemptRecord>,
}

impl IntentHistory<'_> {
    fn first(&self) -> &AttemptRecord {
        self.attempts[0]
    }

    fn load_span(&self) -> Option<(u64, u64)> {
        let load: Vec<_> = self.attempts.iter().filter(|a| a.phase == Phase::Load).collect();
        Some((load.first()?.sent_ms, load.iter().map(|a| a.answered_ms).max()?))
    }

    fn created(&self) -> impl Iterator<Item = &&AttemptRecord> {
        self.attempts.iter().filter(|attempt| attempt.status == Some(201))
    }
}

/// Reads the campaign in `dir` and checks it.
pub fn check(dir: &Path) -> Report {
    let info: CampaignInfo =
        serde_json::from_str(&std::fs::read_to_string(dir.join(CAMPAIGN_FILE)).expect("campaign.json"))
            .expect("campaign.json parses");
    let history: Vec<AttemptRecord> = read_lines(&dir.join(HISTORY_FILE));
    let faults: Vec<FaultWindow> = read_lines(&dir.join(FAULTS_FILE));
    let labels: Vec<LabelRow> = read_lines(&dir.join(LABELS_FILE));
    let sales: CarrierStats = serde_json::from_str(&std::fs::read_to_string(dir.join(SALES_FILE)).expect("sales.json"))
        .expect("sales.json parses");
    let mut by_intent: BTreeMap<u64, IntentHistory> = BTreeMap::new();
    for attempt in &history {
        by_intent
            .entry(attempt.intent)
            .or_insert_with(|| IntentHistory { attempts: Vec::new() })
            .attempts
            .push(attempt);
    }
    for intent in by_intent.values_mut() {
        intent
            .attempts
            .sort_by_key(|attempt| (attempt.sent_ms, attempt.attempt));
    }
    let during = |intent: &IntentHistory| -> BTreeSet<String> {
        let Some((from, to)) = intent.load_span() else {
            return BTreeSet::new();
        };
        faults
            .iter()
            .filter(|window| window.start_ms <= to && from <= window.end_ms)
            .map(|window| window.nemesis.clone())
            .collect()
    };
    let mut violations = Vec::new();
    let parcels: BTreeMap<(u64, u32), &IntentHistory> = by_intent
        .values()
        .map(|intent| ((intent.first().order_id, intent.first().parcel_no), intent))
        .collect();
    for parcel in &sales.purchases_by_parcel {
        if parcel.purchases > 1 {
            let intent = parcels.get(&(parcel.order_id, parcel.parcel_no));
            violations.push(Violation {
                property: Property::BoughtTwice,
                detail: format!(
                    "order {} parcel {} bought {} times (key {})",
                    parcel.order_id,
                    parcel.parcel_no,
                    parcel.purchases,
                    intent.map_or("?", |intent| intent.first().key.as_str())
                ),
                during: intent.map(|intent| during(intent)).unwrap_or_default(),
                predicted_by: None,
            });
        }
    }
    let mut rows: BTreeMap<(u64, u32), Vec<&LabelRow>> = BTreeMap::new();
    for row in labels
        .iter()
        .filter(|row| row.caller == CALLER && row.label_version == 1)
    {
        rows.entry((row.order_id, row.parcel_no)).or_default().push(row);
    }
    for intent in by_intent.values() {
        let first = intent.first();
        let answers: BTreeSet<(Option<&str>, Option<&str>, Option<&str>)> = intent
            .created()
            .map(|attempt| {
                (
                    attempt.label_id.as_deref(),
                    attempt.body_sha256.as_deref(),
                    attempt.original_request.as_deref(),
                )
            })
            .collect();
        let mut violation = |property, detail| {
            violations.push(Violation {
                property,
                detail,
                during: during(intent),
                predicted_by: None,
            })
        };
        if answers.len() > 1 {
            let instances: BTreeSet<usize> = intent.created().map(|attempt| attempt.instance).collect();
            violation(
                Property::DivergentAnswers,
                format!(
                    "key {}: {} different 201 answers {answers:?} from instances {instances:?}",
                    first.key,
                    answers.len()
                ),
            );
        }
        let Some(told) = intent.created().next() else {
            violation(
                Property::LostAfterHeal,
                format!("key {}: no 201 after the heal", first.key),
            );
            continue;
        };
        let stored = rows
            .get(&(first.order_id, first.parcel_no))
            .map_or(&[][..], Vec::as_slice);
        let matches = stored.len() == 1 && Some(stored[0].label_id.as_str()) == told.label_id.as_deref();
        if !matches {
            let ids: Vec<&str> = stored.iter().map(|row| row.label_id.as_str()).collect();
            violation(
                Property::LabelRows,
                format!("key {}: answered {:?}, label rows {ids:?}", first.key, told.label_id),
            );
        }
    }
    if let Some(fsync) = info.redis_fsync.as_deref() {
        for violation in &mut violations {
            violation.predicted_by = redis_limit(violation, fsync);
        }
    }
    Report {
        intents: by_intent.len(),
        attempts: history.len(),
        purchases: sales.purchases_total,
        label_rows: labels.len(),
        by_nemesis: figures_by_nemesis(&by_intent, &faults, &history),
        violations,
        info,
    }
}

/// The LIMITS.md row that predicts a Redis violation, if one does.
fn redis_limit(violation: &Violation, fsync: &str) -> Option<&'static str> {
    let forgets_records = matches!(violation.property, Property::DivergentAnswers | Property::LostAfterHeal);
    if violation.during.contains("store-crash") && fsync == "everysec" && forgets_records {
        return Some("#3 (restart: appendfsync everysec forgets up to a second of acknowledged records)");
    }
    if violation.during.contains("clock-skew") && violation.property != Property::LabelRows {
        return Some("#6 (clock jumps: leases end early, both attempts may run)");
    }
    None
}

fn figures_by_nemesis(
    by_intent: &BTreeMap<u64, IntentHistory>,
    faults: &[FaultWindow],
    history: &[AttemptRecord],
) -> BTreeMap<String, NemesisFigures> {
    let mut figures: BTreeMap<String, NemesisFigures> = BTreeMap::new();
    for window in faults {
        figures.entry(window.nemesis.clone()).or_default().faults += 1;
    }
    let window_of = |at: u64| {
        faults
            .iter()
            .find(|window| window.start_ms <= at && at <= window.end_ms)
            .map_or("none", |window| window.nemesis.as_str())
    };
    for intent in by_intent.values() {
        let Some((from, to)) = intent.load_span() else {
            continue;
        };
        let created_in_load = intent
            .attempts
            .iter()
            .any(|attempt| attempt.phase == Phase::Load && attempt.status == Some(201));
        // Counted once under every kind of fault it lived through, or "none".
        let mut kinds: BTreeSet<&str> = faults
            .iter()
            .filter(|window| window.start_ms <= to && from <= window.end_ms)
            .map(|window| window.nemesis.as_str())
            .collect();
        if kinds.is_empty() {
            kinds.insert("none");
        }
        for kind in kinds {
            let entry = figures.entry(kind.to_owned()).or_default();
            entry.intents += 1;
            entry.answered_201 += usize::from(created_in_load);
        }
    }
    for attempt in history.iter().filter(|attempt| attempt.phase == Phase::Load) {
        if attempt.status == Some(201) {
            continue;
        }
        let answer = match (attempt.status, attempt.error.as_deref()) {
            (Some(status), Some(code)) => format!("{status} {code}"),
            (Some(status), None) => status.to_string(),
            (None, Some(error)) => error.to_owned(),
            (None, None) => "no answer".to_owned(),
        };
        let entry = figures.entry(window_of(attempt.sent_ms).to_owned()).or_default();
        *entry.answers_instead.entry(answer).or_default() += 1;
    }
    figures
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{JsonLines, SALES_FILE};
    use server::carrier::simulator::ParcelPurchases;

    fn attempt(intent: u64, phase: Phase, sent_ms: u64, status: Option<u16>, label: &str, body: &str) -> AttemptRecord {
        AttemptRecord {
            intent,
            key: format!("label:{intent}:1:v1"),
            order_id: 1_000 + intent,
            parcel_no: 1,
            phase,
            attempt: 1,
            instance: (intent % 3) as usize,
            sent_ms,
            answered_ms: sent_ms + 10,
            status,
            error: None,
            label_id: (status == Some(201)).then(|| label.to_owned()),
            replayed: phase == Phase::Replay,
            body_sha256: status.map(|_| body.to_owned()),
            original_request: (status == Some(201)).then(|| format!("req_{intent}")),
        }
    }

    fn row(intent: u64, label: &str) -> LabelRow {
        LabelRow {
            caller: CALLER.to_owned(),
            order_id: 1_000 + intent,
            parcel_no: 1,
            label_version: 1,
            label_id: label.to_owned(),
        }
    }

    /// Writes a campaign's files: two intents, the second begun during a pause.
    fn write_campaign(dir: &Path, history: &[AttemptRecord], labels: &[LabelRow], purchases: &[(u64, u64)]) {
        let info = CampaignInfo {
            backend: "postgres".to_owned(),
            redis_fsync: None,
            seed: 7,
            load_ms: 1_000,
            started_ms: 0,
            ended_ms: 2_000,
        };
        std::fs::write(dir.join(CAMPAIGN_FILE), serde_json::to_string(&info).unwrap()).unwrap();
        let lines = JsonLines::create(&dir.join(HISTORY_FILE));
        history.iter().for_each(|record| lines.append(record));
        lines.flush();
        let lines = JsonLines::create(&dir.join(LABELS_FILE));
        labels.iter().for_each(|record| lines.append(record));
        lines.flush();
        let lines = JsonLines::create(&dir.join(FAULTS_FILE));
        lines.append(&FaultWindow {
            nemesis: "pause".to_owned(),
            target: "instance 1".to_owned(),
            start_ms: 150,
            end_ms: 400,
        });
        lines.flush();
        let sales = CarrierStats {
            requests_total: 0,
            purchases_total: purchases.iter().map(|(_, count)| count).sum(),
            deduplicated_repeats: 0,
            in_progress_answers: 0,
            errors_injected: 0,
            replies_dropped: 0,
            purchases_by_carrier_key: BTreeMap::new(),
            purchases_by_parcel: purchases
                .iter()
                .map(|(order_id, purchases)| ParcelPurchases {
                    order_id: *order_id,
                    parcel_no: 1,
                    label_version: 1,
                    purchases: *purchases,
                })
                .collect(),
        };
        std::fs::write(dir.join(SALES_FILE), serde_json::to_string(&sales).unwrap()).unwrap();
    }

    fn clean_history() -> Vec<AttemptRecord> {
        vec![
            attempt(0, Phase::Load, 100, Some(201), "lbl_a", "d1"),
            attempt(0, Phase::Replay, 900, Some(201), "lbl_a", "d1"),
            attempt(1, Phase::Load, 200, None, "", ""),
            attempt(1, Phase::Load, 300, Some(409), "", "problem"),
            attempt(1, Phase::Heal, 600, Some(201), "lbl_b", "d2"),
            attempt(1, Phase::Replay, 900, Some(201), "lbl_b", "d2"),
        ]
    }

    #[test]
    fn a_clean_history_passes_with_its_availability_per_fault() {
        let dir = tempfile::tempdir().unwrap();
        write_campaign(
            dir.path(),
            &clean_history(),
            &[row(0, "lbl_a"), row(1, "lbl_b")],
            &[(1_000, 1), (1_001, 1)],
        );
        let report = check(dir.path());
        assert!(report.violations.is_empty(), "{:?}", report.violations);
        assert_eq!(report.intents, 2);
        let pause = &report.by_nemesis["pause"];
        assert_eq!((pause.faults, pause.intents, pause.answered_201), (1, 1, 0));
        assert_eq!(pause.answers_instead.get("409"), Some(&1));
        assert_eq!(report.by_nemesis["none"].availability(), 1.0);
    }

    #[test]
    fn a_parcel_bought_twice_is_reported_with_its_key() {
        let dir = tempfile::tempdir().unwrap();
        write_campaign(
            dir.path(),
            &clean_history(),
            &[row(0, "lbl_a"), row(1, "lbl_b")],
            &[(1_000, 1), (1_001, 2)],
        );
        let report = check(dir.path());
        assert_eq!(report.count(Property::BoughtTwice, None), 1);
        assert_eq!(report.count(Property::BoughtTwice, Some("pause")), 1);
        assert!(
            report.violations[0].detail.contains("label:1:1:v1"),
            "{:?}",
            report.violations
        );
    }

    #[test]
    fn a_replay_with_other_bytes_is_a_divergent_answer() {
        let dir = tempfile::tempdir().unwrap();
        let mut history = clean_history();
        history[5].body_sha256 = Some("late-write".to_owned());
        write_campaign(
            dir.path(),
            &history,
            &[row(0, "lbl_a"), row(1, "lbl_b")],
            &[(1_000, 1), (1_001, 1)],
        );
        let report = check(dir.path());
        assert_eq!(
            report.count(Property::DivergentAnswers, None),
            1,
            "{:?}",
            report.violations
        );
        assert_eq!(report.unpredicted().len(), 1);
    }

    /// What a completion past the fence leaves: the same label and the same
    /// bytes, written by another attempt.
    #[test]
    fn a_replay_naming_another_original_request_is_a_divergent_answer() {
        let dir = tempfile::tempdir().unwrap();
        let mut history = clean_history();
        history[5].original_request = Some("req_late".to_owned());
        write_campaign(
            dir.path(),
            &history,
            &[row(0, "lbl_a"), row(1, "lbl_b")],
            &[(1_000, 1), (1_001, 1)],
        );
        let report = check(dir.path());
        assert_eq!(
            report.count(Property::DivergentAnswers, Some("pause")),
            1,
            "{:?}",
            report.violations
        );
        assert!(
            report.violations[0].detail.contains("req_late"),
            "{:?}",
            report.violations
        );
    }

    #[test]
    fn missing_or_extra_label_rows_and_lost_intents_are_reported() {
        let dir = tempfile::tempdir().unwrap();
        let mut history = clean_history();
        history.truncate(4); // intent 1 never got its 201
        write_campaign(dir.path(), &history, &[row(0, "lbl_a"), row(0, "lbl_c")], &[(1_000, 1)]);
        let report = check(dir.path());
        assert_eq!(report.count(Property::LabelRows, None), 1, "{:?}", report.violations);
        assert_eq!(
            report.count(Property::LostAfterHeal, None),
            1,
            "{:?}",
            report.violations
        );
    }

    #[test]
    fn on_redis_a_forgotten_record_after_a_crash_with_everysec_is_predicted_and_with_always_is_not() {
        let violation = |during: &str| Violation {
            property: Property::DivergentAnswers,
            detail: String::new(),
            during: BTreeSet::from([during.to_owned()]),
            predicted_by: None,
        };
        assert!(redis_limit(&violation("store-crash"), "everysec").is_some_and(|row| row.starts_with("#3")));
        assert_eq!(redis_limit(&violation("store-crash"), "always"), None);
        assert_eq!(redis_limit(&violation("pause"), "everysec"), None);
        let twice = Violation {
            property: Property::BoughtTwice,
            ..violation("store-crash")
        };
        assert_eq!(
            redis_limit(&twice, "everysec"),
            None,
            "the carrier key covers a forgotten record"
        );
    }
}
