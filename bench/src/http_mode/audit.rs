//! The audit at the end of every http run: each intent ended with exactly
//! one label, each parcel was bought from the carrier at most once (per
//! parcel and per carrier key), and the client's counts of first runs,
//! replays, 409s, 422s and 503s add up with the server's `/metrics`.
//!
//! Pure logic over what the client logged and what the server and carrier
//! report, so every rule is tested without a server.

use super::client::{IntentEntry, NO_CONNECTION_KIND};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap, HashSet};

/// Examples kept per kind of problem.
pub const EXAMPLES_MAX: usize = 10;

/// A parcel as the carrier counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Parcel {
    pub order_id: u64,
    pub parcel_no: u32,
    pub label_version: u32,
}

impl Parcel {
    pub fn of(intent: &crate::intent::Intent) -> Self {
        Self {
            order_id: intent.order_id,
            parcel_no: intent.parcel_no,
            label_version: intent.label_version,
        }
    }
}

/// Purchases the carrier simulator made, from its stats endpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CarrierStats {
    pub purchases_by_parcel: HashMap<Parcel, u64>,
    pub purchases_by_key: HashMap<String, u64>,
}

/// Answers of the label route by category: the client's count (what it
/// received) or the server's (what it sent, from `/metrics`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AnswerCounts {
    pub first_runs: u64,
    pub replays: u64,
    pub in_progress_409: u64,
    pub mismatch_422: u64,
    pub unavailable_503: u64,
    /// Requests whose client hung up before the answer (the server counts
    /// them as 499); the client saw each as a timeout.
    pub cancelled_499: u64,
    /// Of `unavailable_503`, those answered `request_timeout`: the
    /// request's time ran out while its work went on in the task the
    /// idempotency layer gives it, which may have finished it (a retry is
    /// then answered from the key). Not a category of its own in `total`.
    #[serde(default)]
    pub request_timeouts_503: u64,
    pub other: u64,
}

impl AnswerCounts {
    pub fn total(&self) -> u64 {
        self.first_runs
            + self.replays
            + self.in_progress_409
            + self.mismatch_422
            + self.unavailable_503
            + self.cancelled_499
            + self.other
    }

    fn categories(&self) -> [(&'static str, u64); 7] {
        [
            ("first runs (201)", self.first_runs),
            ("replays (201, Idempotent-Replayed)", self.replays),
            ("in progress (409)", self.in_progress_409),
            ("key reused (422)", self.mismatch_422),
            ("unavailable (503)", self.unavailable_503),
            ("cancelled by the client (499)", self.cancelled_499),
            ("other statuses", self.other),
        ]
    }

    /// The client's counts by answer kind (`201_created`, `409_request_in_progress`, `timeout`, ...).
    /// Returns the counts and the attempts that got no answer.
    pub fn from_client(kinds: &BTreeMap<String, u64>) -> (Self, u64) {
        let mut counts = Self::default();
        let mut unanswered = 0;
        for (kind, count) in kinds {
            match kind.as_str() {
                "201_created" => counts.first_runs += count,
                "201_replayed" => counts.replays += count,
                "timeout" | "transport_error" => unanswered += count,
                // Never sent (no connection from the client's pool in time):
                // nothing for the server to have answered.
                NO_CONNECTION_KIND => {}
                other if other.starts_with("409") => counts.in_progress_409 += count,
                other if other.starts_with("422") => counts.mismatch_422 += count,
                other if other.starts_with("503") => counts.unavailable_503 += count,
                _ => counts.other += count,
            }
        }
        (counts, unanswered)
    }
}

/// One category compared: the server may have sent more answers than the
/// client received (replies that arrived after the client's deadline), but
/// never fewer, and never more extra answers in all than attempts the client
/// saw go unanswered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CountCheck {
    pub category: String,
    pub client: u64,
    pub server: u64,
    pub agrees: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AuditReport {
    pub passed: bool,
    pub intents: u64,
    pub intents_sent_twice: u64,
    pub labelled_exactly_once: u64,
    /// Intents that ended without a label (or never finished).
    pub lost: u64,
    /// Intents that received more than one distinct label id.
    pub duplicate_labels: u64,
    /// Parcels of this run the carrier sold more than once.
    pub parcels_bought_twice: u64,
    /// Carrier keys under which the carrier sold more than once.
    pub carrier_keys_bought_twice: u64,
    /// Purchases of this run's parcels beyond one per parcel.
    pub extra_purchases: u64,
    /// Labelled intents whose parcel the carrier never sold.
    pub labelled_without_purchase: u64,
    pub attempts: u64,
    pub unanswered_attempts: u64,
    pub client_answers: AnswerCounts,
    pub server_answers: Option<AnswerCounts>,
    pub count_checks: Vec<CountCheck>,
    /// Every reason the audit failed, with examples.
    pub problems: Vec<String>,
    /// Things the audit could not check.
    pub notes: Vec<String>,
}

/// What the audit looks at.
pub struct AuditInput<'a> {
    pub intents: &'a [IntentEntry],
    pub client_kinds: &'a BTreeMap<String, u64>,
    /// `None` when the carrier's stats could not be read.
    pub carrier: Option<&'a CarrierStats>,
    /// The server's answers during the run (after minus before), `None`
    /// when `/metrics` could not be read.
    pub server: Option<&'a AnswerCounts>,
}

pub fn audit(input: &AuditInput<'_>) -> AuditReport {
    let (client_answers, unanswered) = AnswerCounts::from_client(input.client_kinds);
    let mut report = AuditReport {
        intents: input.intents.len() as u64,
        attempts: client_answers.total() + unanswered,
        unanswered_attempts: unanswered,
        client_answers,
        server_answers: input.server.cloned(),
        ..AuditReport::default()
    };
    check_labels(&mut report, input.intents);
    match input.carrier {
        Some(carrier) => check_carrier(&mut report, input.intents, carrier),
        None => report
            .problems
            .push("carrier stats unavailable: purchases could not be audited".into()),
    }
    match input.server {
        Some(server) => check_counts(&mut report, server, input.intents),
        None => report
            .problems
            .push("server metrics unavailable: answer counts could not be audited".into()),
    }
    report.passed = report.problems.is_empty();
    report
}

fn examples<'a>(keys: impl Iterator<Item = &'a IntentEntry>) -> String {
    let shown: Vec<String> = keys
        .take(EXAMPLES_MAX)
        .map(|entry| entry.intent.derived_key())
        .collect();
    shown.join(", ")
}

fn check_labels(report: &mut AuditReport, intents: &[IntentEntry]) {
    report.intents_sent_twice = intents.iter().filter(|entry| entry.copies > 1).count() as u64;
    let lost = || {
        intents
            .iter()
            .filter(|entry| entry.labels.is_empty() || entry.copies_running > 0)
    };
    let duplicated = || intents.iter().filter(|entry| entry.labels.len() > 1);
    report.lost = lost().count() as u64;
    report.duplicate_labels = duplicated().count() as u64;
    report.labelled_exactly_once = intents.iter().filter(|entry| entry.labels.len() == 1).count() as u64;
    if report.lost > 0 {
        report.problems.push(format!(
            "{} intents ended without a label, e.g. {}",
            report.lost,
            examples(lost())
        ));
    }
    if report.duplicate_labels > 0 {
        report.problems.push(format!(
            "{} intents received more than one label, e.g. {}",
            report.duplicate_labels,
            examples(duplicated())
        ));
    }
}

fn check_carrier(report: &mut AuditReport, intents: &[IntentEntry], carrier: &CarrierStats) {
    let parcels: HashSet<Parcel> = intents.iter().map(|entry| Parcel::of(&entry.intent)).collect();
    let bought = |parcel: &Parcel| carrier.purchases_by_parcel.get(parcel).copied().unwrap_or(0);
    let mut twice: Vec<&Parcel> = parcels.iter().filter(|parcel| bought(parcel) > 1).collect();
    twice.sort();
    report.parcels_bought_twice = twice.len() as u64;
    report.extra_purchases = twice.iter().map(|parcel| bought(parcel) - 1).sum();
    if !twice.is_empty() {
        let shown: Vec<String> = twice
            .iter()
            .take(EXAMPLES_MAX)
            .map(|parcel| {
                format!(
                    "order {} parcel {} x{}",
                    parcel.order_id,
                    parcel.parcel_no,
                    bought(parcel)
                )
            })
            .collect();
        report.problems.push(format!(
            "{} parcels were bought from the carrier more than once ({} extra purchases), e.g. {}",
            twice.len(),
            report.extra_purchases,
            shown.join(", ")
        ));
    }
    let keys_twice = carrier.purchases_by_key.values().filter(|count| **count > 1).count() as u64;
    report.carrier_keys_bought_twice = keys_twice;
    if keys_twice > 0 {
        report
            .problems
            .push(format!("{keys_twice} carrier keys were bought more than once"));
    }
    let unsold = |entry: &&IntentEntry| !entry.labels.is_empty() && bought(&Parcel::of(&entry.intent)) == 0;
    report.labelled_without_purchase = intents.iter().filter(unsold).count() as u64;
    if report.labelled_without_purchase > 0 {
        report.problems.push(format!(
            "{} intents got a label for a parcel the carrier never sold, e.g. {}",
            report.labelled_without_purchase,
            examples(intents.iter().filter(unsold))
        ));
    }
}

fn check_counts(report: &mut AuditReport, server: &AnswerCounts, intents: &[IntentEntry]) {
    let client = &report.client_answers;
    let unanswered = report.unanswered_attempts;
    let mut checks: Vec<CountCheck> = client
        .categories()
        .iter()
        .zip(server.categories())
        .map(|((category, client), (_, server))| CountCheck {
            category: (*category).to_owned(),
            client: *client,
            server,
            agrees: *client <= server && server - client <= unanswered,
        })
        .collect();
    let extra = server.total().saturating_sub(client.total());
    checks.push(CountCheck {
        category: "all answers (server extra <= client unanswered)".into(),
        client: client.total() + unanswered,
        server: server.total(),
        agrees: server.total() >= client.total() && extra <= unanswered,
    });
    // Every labelled intent had a first run, and no intent had two: one key
    // runs once. More first runs than intents means work ran twice for some
    // parcel (a new key per attempt does exactly that). The server counts a
    // first run whose client hung up as cancelled (499), and one whose
    // request timed out first as a 503 `request_timeout`, though in both the
    // work went on, finished, and a retry was answered from the key; those
    // may make up the difference on the low side. A first run whose reply
    // never reached the client leaves its intent unlabelled, which the label
    // check reports.
    let labelled = intents.iter().filter(|entry| !entry.labels.is_empty()).count() as u64;
    let intents_count = intents.len() as u64;
    let first_runs_unseen = server.cancelled_499 + server.request_timeouts_503;
    checks.push(CountCheck {
        category: "labelled intents <= first runs (+ 499s and 503 request timeouts), first runs <= intents".into(),
        client: labelled,
        server: server.first_runs,
        agrees: labelled <= server.first_runs + first_runs_unseen && server.first_runs <= intents_count,
    });
    for check in checks.iter().filter(|check| !check.agrees) {
        report.problems.push(format!(
            "count mismatch in {}: client {}, server {} (client unanswered attempts: {unanswered})",
            check.category, check.client, check.server
        ));
    }
    report.count_checks = checks;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::intent::RunIds;
    use std::collections::BTreeSet;

    fn entry(index: u64, labels: &[&str]) -> IntentEntry {
        IntentEntry {
            intent: RunIds::with_base(1_000_000).intent(index),
            copies: 1,
            copies_running: 0,
            labels: labels.iter().map(|label| (*label).to_owned()).collect::<BTreeSet<_>>(),
            attempts: 1,
            failures: Vec::new(),
        }
    }

    fn carrier_for(intents: &[IntentEntry], extra: &[(u64, u64)]) -> CarrierStats {
        let mut stats = CarrierStats::default();
        for entry in intents.iter().filter(|entry| !entry.labels.is_empty()) {
            let parcel = Parcel::of(&entry.intent);
            *stats.purchases_by_parcel.entry(parcel).or_insert(0) += 1;
            stats
                .purchases_by_key
                .insert(format!("carrier:{}", entry.intent.derived_key()), 1);
        }
        for (index, purchases) in extra {
            let intent = intents[*index as usize].intent;
            let parcel = Parcel::of(&intent);
            *stats.purchases_by_parcel.entry(parcel).or_insert(0) += purchases;
        }
        stats
    }

    fn kinds(pairs: &[(&str, u64)]) -> BTreeMap<String, u64> {
        pairs.iter().map(|(kind, count)| ((*kind).to_owned(), *count)).collect()
    }

    /// The audit of a run whose carrier and server counts are both known.
    fn audited(
        intents: &[IntentEntry],
        client: &BTreeMap<String, u64>,
        carrier: &CarrierStats,
        server: &AnswerCounts,
    ) -> AuditReport {
        audit(&AuditInput {
            intents,
            client_kinds: client,
            carrier: Some(carrier),
            server: Some(server),
        })
    }

    fn clean_run() -> (Vec<IntentEntry>, BTreeMap<String, u64>, AnswerCounts) {
        let intents: Vec<IntentEntry> = (0..4).map(|index| entry(index, &[&format!("L{index}")])).collect();
        let client = kinds(&[
            ("201_created", 4),
            ("201_replayed", 1),
            ("409_request_in_progress", 2),
            ("timeout", 1),
        ]);
        // One timed-out attempt was answered by the server after the deadline.
        let server = AnswerCounts {
            first_runs: 4,
            replays: 1,
            in_progress_409: 3,
            ..AnswerCounts::default()
        };
        (intents, client, server)
    }

    #[test]
    fn a_clean_run_passes() {
        let (intents, client, server) = clean_run();
        let carrier = carrier_for(&intents, &[]);
        let report = audited(&intents, &client, &carrier, &server);
        assert!(report.passed, "{:?}", report.problems);
        assert_eq!(report.labelled_exactly_once, 4);
        assert_eq!(report.attempts, 8);
        assert_eq!(report.unanswered_attempts, 1);
    }

    #[test]
    fn two_labels_for_one_intent_fail_the_audit() {
        let (mut intents, client, server) = clean_run();
        intents[2].labels.insert("L-second".into());
        let carrier = carrier_for(&intents, &[]);
        let report = audited(&intents, &client, &carrier, &server);
        assert!(!report.passed);
        assert_eq!(report.duplicate_labels, 1);
        assert!(
            report.problems[0].contains("more than one label"),
            "{:?}",
            report.problems
        );
    }

    #[test]
    fn a_parcel_bought_twice_fails_the_audit_even_with_one_label_seen() {
        let (intents, client, server) = clean_run();
        let carrier = carrier_for(&intents, &[(1, 1)]);
        let report = audited(&intents, &client, &carrier, &server);
        assert!(!report.passed);
        assert_eq!((report.parcels_bought_twice, report.extra_purchases), (1, 1));
        assert_eq!(report.duplicate_labels, 0);
    }

    #[test]
    fn a_carrier_key_bought_twice_fails_the_audit() {
        let (intents, client, server) = clean_run();
        let mut carrier = carrier_for(&intents, &[]);
        carrier.purchases_by_key.insert("carrier:other".into(), 2);
        let report = audited(&intents, &client, &carrier, &server);
        assert_eq!(report.carrier_keys_bought_twice, 1);
        assert!(!report.passed);
    }

    #[test]
    fn an_intent_without_a_label_is_lost() {
        let (mut intents, client, _) = clean_run();
        intents.push(entry(4, &[]));
        intents[4].failures.push("gave_up".into());
        let carrier = carrier_for(&intents, &[]);
        let server = AnswerCounts {
            first_runs: 4,
            replays: 1,
            in_progress_409: 2,
            ..AnswerCounts::default()
        };
        let report = audited(&intents, &client, &carrier, &server);
        assert_eq!(report.lost, 1);
        assert!(!report.passed);
    }

    #[test]
    fn server_counts_must_add_up_with_the_clients() {
        let (intents, client, mut server) = clean_run();
        let carrier = carrier_for(&intents, &[]);
        // Two 409s more than the client saw, with only one attempt unanswered.
        server.in_progress_409 = 4;
        let report = audited(&intents, &client, &carrier, &server);
        assert!(!report.passed);
        assert!(
            report.problems.iter().any(|p| p.contains("in progress (409)")),
            "{:?}",
            report.problems
        );
        // A first run the client never saw, beyond the labelled intents: the
        // work ran twice for some parcel.
        let (_, _, mut server) = clean_run();
        server.first_runs = 5;
        server.in_progress_409 = 2;
        let report = audited(&intents, &client, &carrier, &server);
        assert!(
            report.problems.iter().any(|p| p.contains("first runs <= intents")),
            "{:?}",
            report.problems
        );
    }

    #[test]
    fn an_attempt_never_sent_leaves_no_room_for_an_extra_server_answer() {
        let (intents, mut client, server) = clean_run();
        let carrier = carrier_for(&intents, &[]);
        // The attempt the clean run saw time out got no connection instead:
        // the server's one answer more than the client saw has no attempt.
        client.remove("timeout");
        client.insert(NO_CONNECTION_KIND.to_owned(), 1);
        let report = audited(&intents, &client, &carrier, &server);
        assert!(!report.passed);
        assert_eq!((report.attempts, report.unanswered_attempts), (7, 0));
        assert!(
            report.problems.iter().any(|p| p.contains("in progress (409)")),
            "{:?}",
            report.problems
        );
    }

    /// Intent 3's first attempt was answered `first_answer` at the client
    /// while the server finished its work, and its retry was a replay: the
    /// run passes with the server's counts `with`, and with `without` a
    /// labelled intent had no first run at all.
    fn a_first_run_the_client_did_not_see(first_answer: &str, with: AnswerCounts, without: AnswerCounts) {
        let (intents, _, _) = clean_run();
        let carrier = carrier_for(&intents, &[]);
        let client = kinds(&[
            ("201_created", 3),
            ("201_replayed", 2),
            ("409_request_in_progress", 2),
            (first_answer, 1),
        ]);
        let input = |server: &AnswerCounts| audited(&intents, &client, &carrier, server);
        let report = input(&with);
        assert!(report.passed, "{:?}", report.problems);
        let report = input(&without);
        assert!(
            report
                .problems
                .iter()
                .any(|p| p.contains("labelled intents <= first runs")),
            "{:?}",
            report.problems
        );
    }

    /// The server's counts of the run above, besides intent 3's first run.
    fn seen_answers() -> AnswerCounts {
        AnswerCounts {
            first_runs: 3,
            replays: 2,
            in_progress_409: 2,
            ..AnswerCounts::default()
        }
    }

    #[test]
    fn a_first_run_the_client_hung_up_on_counts_as_a_499() {
        // The client timed out; the server counted the hang-up as a 499.
        let with = AnswerCounts {
            cancelled_499: 1,
            ..seen_answers()
        };
        let without = AnswerCounts {
            other: 1,
            ..seen_answers()
        };
        a_first_run_the_client_did_not_see("timeout", with, without);
    }

    #[test]
    fn a_first_run_whose_request_timed_out_counts_as_a_503_request_timeout() {
        // The server ran out of time and answered 503 while the work went
        // on. A 503 for any other reason is answered before the work starts.
        let with = AnswerCounts {
            unavailable_503: 1,
            request_timeouts_503: 1,
            ..seen_answers()
        };
        let without = AnswerCounts {
            unavailable_503: 1,
            ..seen_answers()
        };
        a_first_run_the_client_did_not_see("503_request_timeout", with, without);
    }

    #[test]
    fn missing_stats_fail_the_audit_rather_than_pass_it() {
        let (intents, client, _) = clean_run();
        let report = audit(&AuditInput {
            intents: &intents,
            client_kinds: &client,
            carrier: None,
            server: None,
        });
        assert!(!report.passed);
        assert_eq!(report.problems.len(), 2);
    }
}
