//! Bearer-token authentication.
//!
//! The config holds only SHA-256 digests of tokens. A presented token is
//! hashed and compared with every caller's digest in constant time (and
//! without stopping at the first match), so neither the comparison nor the
//! position of a caller in the list shows in the response time.

use crate::config::{CallerConfig, token_digest};
use crate::error::ApiError;
use axum::extract::{FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use idem_http::CallerIdentity;
use sha2::{Digest, Sha256};
use std::sync::Arc;
use store_core::CallerId;
use subtle::ConstantTimeEq;

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
    use crate::config::token_sha256;
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
