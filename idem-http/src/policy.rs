//! [`FinishPolicy`]: what the layer does with the key once the route answered.
//!
//! The route has run, so the default is to save its answer: a route that
//! did half its work and failed must not run a second time (the
//! specification's "replay every final outcome once execution began, errors
//! included"). Two kinds of answer are not final:
//! - a transient status (408, 425, 429, 503) says the route did nothing
//!   final and the caller should try again: the lease is released, nothing
//!   is saved, and the retry runs the route;
//! - a refusal before the route did anything (400, and axum's own 415
//!   from an extractor): the record is deleted, so the corrected request is
//!   a fresh one.
//!
//! A route may override the policy for one answer by putting a
//! [`Disposition`] in the response's extensions (an application's error
//! type can do it for each of its kinds).
//!
//! The lease and the retention are the store's `store_core::Policy`, set
//! when a store handle is opened; a route with its own gets a handle of its
//! own ([`crate::Idempotency::with_store`]).

use axum::http::StatusCode;
use axum::response::Response;

/// What the layer does with the key once the route answered. Routes that
/// finish their attempt themselves (the handler-level API) never need this;
/// routes that only wear the layer may set it on a response to override
/// the layer's [`FinishPolicy`] for that answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    /// A definitive answer: save it and replay it to every repeat.
    Save,
    /// Nothing happened (validation failed before any effect): delete the
    /// record, so the key is free for a corrected request.
    Abandon,
    /// The outcome is unknown: keep the record, end the lease now, so the
    /// caller's retry takes over at once.
    Release,
}

/// Statuses that release the key by default: the route did nothing final.
pub const TRANSIENT_STATUSES: [StatusCode; 4] = [
    StatusCode::REQUEST_TIMEOUT,
    StatusCode::TOO_EARLY,
    StatusCode::TOO_MANY_REQUESTS,
    StatusCode::SERVICE_UNAVAILABLE,
];

/// Statuses that delete the record by default: the request was refused
/// before the route did anything (axum's extractors answer 400 and 415
/// themselves, before the handler runs; the specification's "fails
/// validation: delete, 400"). A 422 is not among them: it is as often a
/// business answer; a route whose 422 is a validation failure says so with
/// [`FinishPolicy::abandoning`].
pub const REFUSED_BEFORE_RUNNING_STATUSES: [StatusCode; 2] =
    [StatusCode::BAD_REQUEST, StatusCode::UNSUPPORTED_MEDIA_TYPE];

/// Per route: which answers release the key, which delete the record;
/// every other answer is saved and replayed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FinishPolicy {
    release_statuses: Vec<StatusCode>,
    abandon_statuses: Vec<StatusCode>,
}

impl Default for FinishPolicy {
    fn default() -> Self {
        Self {
            release_statuses: TRANSIENT_STATUSES.to_vec(),
            abandon_statuses: REFUSED_BEFORE_RUNNING_STATUSES.to_vec(),
        }
    }
}

impl FinishPolicy {
    /// Saves (and replays) answers with `status`, for a route where it is final.
    pub fn saving(mut self, status: StatusCode) -> Self {
        self.release_statuses.retain(|listed| *listed != status);
        self.abandon_statuses.retain(|listed| *listed != status);
        self
    }

    /// Releases the key after answers with `status`: the route declares
    /// that with this status it did nothing final.
    pub fn releasing(mut self, status: StatusCode) -> Self {
        self = self.saving(status);
        self.release_statuses.push(status);
        self
    }

    /// Deletes the record after answers with `status`: the route declares
    /// that with this status it refused before doing anything.
    pub fn abandoning(mut self, status: StatusCode) -> Self {
        self = self.saving(status);
        self.abandon_statuses.push(status);
        self
    }

    /// What to do with the key after `response`: its own [`Disposition`]
    /// if it carries one, else the policy's by status.
    pub fn disposition(&self, response: &Response) -> Disposition {
        if let Some(disposition) = response.extensions().get::<Disposition>() {
            return *disposition;
        }
        let status = response.status();
        if self.release_statuses.contains(&status) {
            Disposition::Release
        } else if self.abandon_statuses.contains(&status) {
            Disposition::Abandon
        } else {
            Disposition::Save
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::response::IntoResponse;

    fn disposition(policy: &FinishPolicy, status: StatusCode) -> Disposition {
        policy.disposition(&status.into_response())
    }

    #[test]
    fn the_default_saves_all_but_transient_statuses_and_early_refusals() {
        let policy = FinishPolicy::default();
        for status in TRANSIENT_STATUSES {
            assert_eq!(disposition(&policy, status), Disposition::Release, "{status}");
        }
        assert_eq!(
            disposition(&policy, StatusCode::UNSUPPORTED_MEDIA_TYPE),
            Disposition::Abandon
        );
        assert_eq!(disposition(&policy, StatusCode::BAD_REQUEST), Disposition::Abandon);
        for status in [200, 201, 404, 409, 422, 500, 502, 504] {
            let status = StatusCode::from_u16(status).unwrap();
            assert_eq!(disposition(&policy, status), Disposition::Save, "{status}");
        }
    }

    #[test]
    fn a_route_may_move_a_status_and_an_answer_may_say_for_itself() {
        let policy = FinishPolicy::default()
            .saving(StatusCode::TOO_MANY_REQUESTS)
            .releasing(StatusCode::BAD_GATEWAY)
            .abandoning(StatusCode::UNPROCESSABLE_ENTITY)
            .saving(StatusCode::BAD_REQUEST);
        assert_eq!(disposition(&policy, StatusCode::TOO_MANY_REQUESTS), Disposition::Save);
        assert_eq!(disposition(&policy, StatusCode::BAD_GATEWAY), Disposition::Release);
        assert_eq!(
            disposition(&policy, StatusCode::UNPROCESSABLE_ENTITY),
            Disposition::Abandon
        );
        assert_eq!(disposition(&policy, StatusCode::BAD_REQUEST), Disposition::Save);
        let mut response = StatusCode::SERVICE_UNAVAILABLE.into_response();
        response.extensions_mut().insert(Disposition::Save);
        assert_eq!(policy.disposition(&response), Disposition::Save);
    }
}
