//! Bearer-token authentication.
//!
//! The config holds only SHA-256 digests of tokens. A presented token is
//! hashed and compared with every caller's digest in constant time (and
//! without stopping at the first match), so neither the comparison nor the
//! position of a caller in the list shows in the response time.

use crate::error::ApiError;
use crate::setting::{ConfigError, field_error};
use axum::extract::{FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use idem_http::CallerIdentity;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use std::collections::HashSet;
use std::sync::Arc;
use store_core::CallerId;
use subtle::ConstantTimeEq;

/// The development caller's id.
pub const DEMO_CALLER_ID: &str = "demo";

/// The development caller's token. Only its SHA-256 is in the default
/// config; the server warns loudly whenever this token is accepted.
pub const DEMO_TOKEN: &str = "demo-token";

/// Tokens a caller may present at most (the current one and those being
/// rotated out).
pub const CALLER_TOKENS_MAX: usize = 8;

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CallerConfig {
    pub id: String,
    /// Hex SHA-256 of the caller's bearer token (`server hash-token < token-file`).
    pub token_sha256: String,
    /// Digests of tokens being rotated out, still accepted for the same
    /// caller: a token is rotated without changing the caller id, which
    /// scopes its keys, labels and carrier keys, so a retry that spans the
    /// rotation replays instead of buying again. Remove them once every
    /// client has the new token.
    #[serde(default)]
    pub retiring_token_sha256: Vec<String>,
}

impl CallerConfig {
    /// A caller with one token.
    pub fn new(id: impl Into<String>, token_sha256: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            token_sha256: token_sha256.into(),
            retiring_token_sha256: Vec::new(),
        }
    }

    /// Every digest this caller is accepted with, current first.
    pub fn token_digests(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.token_sha256.as_str()).chain(self.retiring_token_sha256.iter().map(String::as_str))
    }

    /// The development caller: id `demo`, token `demo-token`.
    pub fn demo() -> Self {
        Self {
            id: DEMO_CALLER_ID.to_owned(),
            token_sha256: token_sha256(DEMO_TOKEN),
            retiring_token_sha256: Vec::new(),
        }
    }
}

/// Hex SHA-256 of a bearer token, as the config stores it.
pub fn token_sha256(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// The 32 bytes of a hex SHA-256 digest, in either case; `None` when it is
/// not 64 hex characters. Digests are compared as these bytes, never as
/// strings, so the case a digest is written in changes nothing.
pub fn token_digest(hex_digest: &str) -> Option<[u8; 32]> {
    if hex_digest.len() != 64 {
        return None;
    }
    hex::decode(hex_digest).ok()?.try_into().ok()
}

/// True when the development caller's token is accepted, however its
/// digest is written (the digests are compared as bytes), and whichever
/// digest of a caller it is: a token being rotated out
/// (`retiring_token_sha256`) is accepted as any other, so rotating away
/// from the demo token leaves it open until its digest is removed.
pub fn has_demo_caller(callers: &[CallerConfig]) -> bool {
    let demo: [u8; 32] = Sha256::digest(DEMO_TOKEN.as_bytes()).into();
    callers
        .iter()
        .flat_map(CallerConfig::token_digests)
        .any(|digest| token_digest(digest) == Some(demo))
}

/// `[[callers]]`: at least one, ids valid and distinct, every token a
/// digest, no digest twice.
pub fn validate_callers(callers: &[CallerConfig]) -> Result<(), ConfigError> {
    if callers.is_empty() {
        return Err(field_error("callers", "at least one caller is required"));
    }
    let (mut ids, mut digests) = (HashSet::new(), HashSet::new());
    for caller in callers {
        CallerId::new(caller.id.as_str())
            .map_err(|error| field_error("callers.id", format!("{:?}: {error}", caller.id)))?;
        if caller.retiring_token_sha256.len() >= CALLER_TOKENS_MAX {
            let detail = format!("caller {:?}: at most {CALLER_TOKENS_MAX} tokens in all", caller.id);
            return Err(field_error("callers.retiring_token_sha256", detail));
        }
        for hex_digest in caller.token_digests() {
            let Some(digest) = token_digest(hex_digest) else {
                return Err(field_error(
                    "callers.token_sha256",
                    format!(
                        "caller {:?}: must be 64 hex characters (server hash-token < token-file)",
                        caller.id
                    ),
                ));
            };
            if !digests.insert(digest) {
                return Err(field_error("callers.token_sha256", "one token appears twice"));
            }
        }
        if !ids.insert(caller.id.as_str()) {
            return Err(field_error("callers.id", format!("{:?} appears twice", caller.id)));
        }
    }
    Ok(())
}

/// Longest `Authorization` header read, in bytes.
pub const AUTHORIZATION_BYTES_MAX: usize = 4_096;

/// The authenticated caller of a request. Inserted into the request's (and
/// the response's) extensions by [`require_caller`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller(pub CallerId);

/// The caller [`require_caller`] authenticated, as the idempotency layer
/// asks for it: keys are scoped by this caller. The layer runs inside
/// `require_caller`, so a request without one never reaches it.
#[derive(Debug, Clone, Copy, Default)]
pub struct BearerCaller;

impl CallerIdentity for BearerCaller {
    fn caller(&self, request: &Parts) -> Option<CallerId> {
        request.extensions.get::<Caller>().map(|Caller(caller)| caller.clone())
    }
}

/// The callers the server accepts.
#[derive(Clone)]
pub struct Callers {
    entries: Arc<Vec<(CallerId, [u8; 32])>>,
}

impl Callers {
    /// Builds the table from validated config entries.
    pub fn from_config(callers: &[CallerConfig]) -> Result<Self, String> {
        let mut entries = Vec::with_capacity(callers.len());
        for caller in callers {
            let id = CallerId::new(caller.id.as_str()).map_err(|error| format!("caller {:?}: {error}", caller.id))?;
            // One entry per token: the current one and any being rotated out.
            for hex_digest in caller.token_digests() {
                let digest = token_digest(hex_digest)
                    .ok_or_else(|| format!("caller {:?}: a token digest is not 32 bytes of hex", caller.id))?;
                entries.push((id.clone(), digest));
            }
        }
        Ok(Self {
            entries: Arc::new(entries),
        })
    }

    /// The caller whose token this is, if any.
    pub fn authenticate(&self, token: &[u8]) -> Option<CallerId> {
        let presented: [u8; 32] = Sha256::digest(token).into();
        let mut found = None;
        for (id, digest) in self.entries.iter() {
            if bool::from(presented.ct_eq(digest)) {
                found = Some(id.clone());
            }
        }
        found
    }

    /// The token from `Authorization: Bearer <token>`, if well formed.
    fn bearer_token(headers: &HeaderMap) -> Option<&[u8]> {
        let value = headers.get(header::AUTHORIZATION)?.as_bytes();
        if value.len() > AUTHORIZATION_BYTES_MAX || value.len() < 7 {
            return None;
        }
        let (scheme, token) = value.split_at(7);
        let token = token.trim_ascii();
        (scheme.eq_ignore_ascii_case(b"bearer ") && !token.is_empty()).then_some(token)
    }
}

/// Middleware: answers 401 unless the request carries a known token; else
/// puts the [`Caller`] into the request's and the response's extensions
/// (the latter for the request log).
pub async fn require_caller(State(callers): State<Callers>, mut request: Request, next: Next) -> Response {
    let caller = Callers::bearer_token(request.headers()).and_then(|token| callers.authenticate(token));
    let Some(caller) = caller else {
        return ApiError::Unauthorized.into_response();
    };
    let caller = Caller(caller);
    request.extensions_mut().insert(caller.clone());
    let mut response = next.run(request).await;
    response.extensions_mut().insert(caller);
    response
}

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        parts.extensions.get::<Caller>().cloned().ok_or(ApiError::Unauthorized)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn callers() -> Callers {
        Callers::from_config(&[
            CallerConfig::new("a", token_sha256("token-a")),
            CallerConfig {
                retiring_token_sha256: vec![token_sha256("old-token-b")],
                ..CallerConfig::new("b", token_sha256("token-b"))
            },
        ])
        .unwrap()
    }

    #[test]
    fn tokens_map_to_their_caller_and_nothing_else() {
        let callers = callers();
        assert_eq!(callers.authenticate(b"token-a").unwrap().as_str(), "a");
        assert_eq!(callers.authenticate(b"token-b").unwrap().as_str(), "b");
        // A token being rotated out still names its caller.
        assert_eq!(callers.authenticate(b"old-token-b").unwrap().as_str(), "b");
        assert!(callers.authenticate(b"token-c").is_none());
        assert!(callers.authenticate(b"").is_none());
    }

    #[test]
    fn only_the_bearer_scheme_is_read() {
        let mut headers = HeaderMap::new();
        for (value, expected) in [
            ("Bearer token-a", Some(&b"token-a"[..])),
            ("bearer token-a", Some(&b"token-a"[..])),
            ("Basic dG9rZW4tYQ==", None),
            ("Bearer ", None),
            ("Bearer", None),
        ] {
            headers.insert(header::AUTHORIZATION, HeaderValue::from_static(value));
            assert_eq!(Callers::bearer_token(&headers), expected, "{value}");
        }
    }
}
