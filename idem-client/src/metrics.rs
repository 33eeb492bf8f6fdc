//! The client's metrics, through the `metrics` facade (the application
//! installs the recorder; without one they cost an atomic load). Every
//! label value is one of a fixed set, so label sets stay bounded.
//!
//! | name | labels | counts |
//! |---|---|---|
//! | `idem_client_attempts_total` | `answer` | attempts, by how they were answered |
//! | `idem_client_retries_total` | `after` | retries, by the answer that caused them |
//! | `idem_client_budget_exhausted_total` | | retries the budget refused |
//! | `idem_client_replays_total` | | intents answered with a replay |
//! | `idem_client_intents_total` | `outcome` | intents, by how they ended |
//! | `idem_client_unkeyed_total` | | requests sent once, without a retry: no key, or a body that cannot be resent |

use crate::answer::AnswerClass;
use crate::middleware::IntentReport;
use crate::retry::GiveUpReason;

/// Attempts, by answer.
pub const ATTEMPTS_TOTAL: &str = "idem_client_attempts_total";
/// Retries, by the answer before them.
pub const RETRIES_TOTAL: &str = "idem_client_retries_total";
/// Retries the budget refused.
pub const BUDGET_EXHAUSTED_TOTAL: &str = "idem_client_budget_exhausted_total";
/// Intents answered with a replay.
pub const REPLAYS_TOTAL: &str = "idem_client_replays_total";
/// Intents, by outcome.
pub const INTENTS_TOTAL: &str = "idem_client_intents_total";
/// Requests sent once without retries.
pub const UNKEYED_TOTAL: &str = "idem_client_unkeyed_total";

pub(crate) fn attempt_answered(answer: &AnswerClass) {
    metrics::counter!(ATTEMPTS_TOTAL, "answer" => answer.name()).increment(1);
}

pub(crate) fn retrying(after: &AnswerClass) {
    metrics::counter!(RETRIES_TOTAL, "after" => after.name()).increment(1);
}

pub(crate) fn sent_without_key() {
    metrics::counter!(UNKEYED_TOTAL).increment(1);
}

pub(crate) fn intent_ended(report: &IntentReport) {
    if report.gave_up == Some(GiveUpReason::BudgetExhausted) {
        metrics::counter!(BUDGET_EXHAUSTED_TOTAL).increment(1);
    }
    if report.last == (AnswerClass::Done { replayed: true }) {
        metrics::counter!(REPLAYS_TOTAL).increment(1);
    }
    metrics::counter!(INTENTS_TOTAL, "outcome" => outcome_name(report)).increment(1);
}

/// How an intent ended: the final answer's name, or why it gave up.
pub(crate) fn outcome_name(report: &IntentReport) -> &'static str {
    match report.gave_up {
        Some(reason) => reason.name(),
        None => report.last.name(),
    }
}
