//! [`CallerIdentity`]: the application says who the caller of a request is.
//!
//! Keys are scoped by caller (docs/design.md#the-record): two callers may
//! use the same key for different requests without meeting each other's
//! records. The middleware does no authentication itself; it asks the
//! application, after the application's own authentication has run.

use axum::http::request::Parts;
use store_core::CallerId;

/// Who sent a request, as the application knows it.
///
/// Called once per request, before the key is read. `None` means the
/// application's authentication did not run before the layer, which is a
/// misconfigured route: the layer answers 500 `internal_error` and claims
/// nothing. Refuse unauthenticated requests (401) in your own middleware,
/// outside the layer.
///
/// Any `Fn(&Parts) -> Option<CallerId>` is one; [`SingleCaller`] serves
/// applications that have no notion of callers.
pub trait CallerIdentity: Send + Sync + 'static {
    /// The caller of the request whose head is `request`.
    fn caller(&self, request: &Parts) -> Option<CallerId>;
}

impl<F> CallerIdentity for F
where
    F: Fn(&Parts) -> Option<CallerId> + Send + Sync + 'static,
{
    fn caller(&self, request: &Parts) -> Option<CallerId> {
        self(request)
    }
}

/// Every request comes from the same caller: for an application with no
/// authentication, or one caller per deployment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SingleCaller(pub CallerId);

impl CallerIdentity for SingleCaller {
    fn caller(&self, _request: &Parts) -> Option<CallerId> {
        Some(self.0.clone())
    }
}

/// The caller is a value of type `T` that the application's authentication
/// middleware put in the request's extensions, turned into a [`CallerId`]
/// by `to_caller`.
pub struct CallerFromExtension<T> {
    to_caller: fn(&T) -> CallerId,
}

impl<T> CallerFromExtension<T> {
    /// Reads the `T` extension and names its caller with `to_caller`.
    pub fn new(to_caller: fn(&T) -> CallerId) -> Self {
        Self { to_caller }
    }
}

impl<T: Send + Sync + 'static> CallerIdentity for CallerFromExtension<T> {
    fn caller(&self, request: &Parts) -> Option<CallerId> {
        request.extensions.get::<T>().map(self.to_caller)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::Request;

    #[derive(Clone)]
    struct Authenticated(CallerId);

    fn parts() -> Parts {
        Request::new(()).into_parts().0
    }

    #[test]
    fn the_extension_names_the_caller_and_its_absence_names_none() {
        let identity = CallerFromExtension::new(|authenticated: &Authenticated| authenticated.0.clone());
        let mut request = parts();
        assert_eq!(identity.caller(&request), None);
        request
            .extensions
            .insert(Authenticated(CallerId::new("alice").unwrap()));
        assert_eq!(identity.caller(&request).unwrap().as_str(), "alice");
    }

    #[test]
    fn a_closure_and_a_single_caller_are_identities() {
        let from_header = |request: &Parts| {
            let value = request.headers.get("x-tenant")?.to_str().ok()?;
            CallerId::new(value).ok()
        };
        let mut request = parts();
        assert_eq!(from_header.caller(&request), None);
        request.headers.insert("x-tenant", "acme".parse().unwrap());
        assert_eq!(from_header.caller(&request).unwrap().as_str(), "acme");
        let single = SingleCaller(CallerId::new("only").unwrap());
        assert_eq!(single.caller(&parts()).unwrap().as_str(), "only");
    }
}
