//! The OpenAPI 3.1 document, generated from the handlers' annotations.

use crate::error::Problem;
use crate::labels::handlers::{__path_create_label, __path_get_label};
use crate::labels::{CreateLabelRequest, Label, ShippingService};
use crate::probes::{__path_healthz, __path_metrics, __path_openapi_json, __path_readyz, Health};
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::{Modify, OpenApi};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "idem Label service",
        description = "Buys shipping labels from the carrier exactly once per idempotency key. \
            Send the same `Idempotency-Key` with every attempt of one intent; a repeat gets the saved \
            answer with `Idempotent-Replayed: true`. Keys are kept for the configured retention \
            (24 h by default) after completion. Errors are RFC 9457 problem details with a `code`.",
        version = "0.1.0"
    ),
    paths(create_label, get_label, healthz, readyz, metrics, openapi_json),
    components(schemas(CreateLabelRequest, Label, ShippingService, Problem, Health)),
    modifiers(&BearerAuth),
    tags((name = "labels", description = "Shipping labels"), (name = "operations", description = "Probes, metrics and this document"))
)]
pub struct ApiDoc;

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme("bearer", SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)));
    }
}

/// The document served at `/openapi.json`.
pub fn document() -> utoipa::openapi::OpenApi {
    ApiDoc::openapi()
}
