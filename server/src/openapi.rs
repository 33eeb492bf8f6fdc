//! The OpenAPI 3.1 document, generated from the handlers' annotations and
//! then made exact: what the annotations cannot say is added here from the
//! code that decides it, so the document and the server cannot drift.
//!
//! - the `Idempotency-Key` header's length and pattern, from `key_header`;
//! - per problem response, the `code`s it can carry (an enum) and one
//!   example per code, from [`ApiError::samples`];
//! - the `405` every path answers for a method it does not serve;
//! - examples for every other response;
//! - a link from a created label to reading it back;
//! - the configured idempotency policy (`x-idempotency`, and in words).

use crate::error::{ApiError, PROBLEM_JSON, Problem};
use crate::labels::handlers::{__path_create_label, __path_get_label};
use crate::labels::{CreateLabelRequest, Label, ShippingService};
use crate::probes::{__path_healthz, __path_metrics, __path_openapi_json, __path_readyz, Health};
use idem_http::key_header::{KEY_HEADER_BYTES_MAX, KEY_HEADER_PATTERN};
use serde_json::{Map, Value, json};
use store_core::Policy;
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::{Modify, OpenApi};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "idem Label service",
        description = "Buys shipping labels from the carrier exactly once per idempotency key. \
            Send the same `Idempotency-Key` with every attempt of one intent; a repeat gets the saved \
            answer with `Idempotent-Replayed: true`. Errors are RFC 9457 problem details with a `code`. \
            A method a path does not serve is answered `405` `method_not_allowed` with `Allow` \
            (`#/components/responses/MethodNotAllowed`); a path not listed here `404` `not_found`.",
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

/// The `code`s each problem response can carry: (path, method, status, codes).
/// Every problem response of the document must be listed, and every
/// [`ApiError`] code must appear somewhere (both checked by tests).
pub const PROBLEM_CODES: &[(&str, &str, u16, &[&str])] = &[
    (
        "/v1/labels",
        "post",
        400,
        &["idempotency_key_missing", "idempotency_key_invalid", "invalid_request"],
    ),
    ("/v1/labels", "post", 401, &["unauthorized"]),
    ("/v1/labels", "post", 408, &["body_timeout"]),
    (
        "/v1/labels",
        "post",
        409,
        &["request_in_progress", "parcel_in_progress"],
    ),
    ("/v1/labels", "post", 413, &["payload_too_large"]),
    ("/v1/labels", "post", 415, &["unsupported_media_type"]),
    ("/v1/labels", "post", 422, &["idempotency_key_reused"]),
    (
        "/v1/labels",
        "post",
        500,
        &["internal_error", "record_unreadable", "response_not_saved"],
    ),
    ("/v1/labels", "post", 502, &["downstream_rejected"]),
    (
        "/v1/labels",
        "post",
        503,
        &[
            "downstream_unavailable",
            "store_unavailable",
            "overloaded",
            "deadline_exceeded",
            "request_timeout",
        ],
    ),
    ("/v1/labels/{label_id}", "get", 401, &["unauthorized"]),
    ("/v1/labels/{label_id}", "get", 404, &["not_found"]),
    ("/v1/labels/{label_id}", "get", 500, &["internal_error"]),
    (
        "/v1/labels/{label_id}",
        "get",
        503,
        &[
            "store_unavailable",
            "overloaded",
            "deadline_exceeded",
            "request_timeout",
        ],
    ),
    ("/readyz", "get", 503, &["store_unavailable", "shutting_down"]),
];

/// Codes of the responses that are not an operation's: 405 on any path.
const METHOD_NOT_ALLOWED_CODES: &[&str] = &["method_not_allowed"];

/// The document for the default policy (what tests compare with).
pub fn document() -> Value {
    document_for(&Policy::default())
}

/// The document served at `/openapi.json`, with the configured policy.
pub fn document_for(policy: &Policy) -> Value {
    let mut document = serde_json::to_value(ApiDoc::openapi()).unwrap_or_else(|_| json!({}));
    constrain_key_header(&mut document);
    problem_codes_and_examples(&mut document);
    method_not_allowed(&mut document);
    other_examples(&mut document);
    label_link(&mut document);
    idempotency_policy(&mut document, policy);
    document
}

fn create_label_operation(document: &mut Value) -> &mut Value {
    &mut document["paths"]["/v1/labels"]["post"]
}

fn constrain_key_header(document: &mut Value) {
    let Some(parameters) = create_label_operation(document)["parameters"].as_array_mut() else {
        return;
    };
    for parameter in parameters.iter_mut().filter(|p| p["name"] == "Idempotency-Key") {
        parameter["schema"] = json!({
            "type": "string",
            "minLength": 1,
            "maxLength": KEY_HEADER_BYTES_MAX,
            "pattern": KEY_HEADER_PATTERN,
        });
        parameter["examples"] = json!({
            "bare": { "value": "label:918273:1:v1" },
            "quoted": { "summary": "RFC 8941 sf-string", "value": "\"label:918273:1:v1\"" },
        });
    }
}

/// A problem example, as the server writes it.
fn problem_example(code: &str) -> Value {
    ApiError::sample(code)
        .map(|error| serde_json::to_value(error.problem()).unwrap_or(Value::Null))
        .unwrap_or(Value::Null)
}

/// The schema and examples of a problem response that carries these codes.
fn problem_content(status: u16, codes: &[&str]) -> Value {
    let examples: Map<String, Value> = codes
        .iter()
        .map(|code| ((*code).to_owned(), json!({ "value": problem_example(code) })))
        .collect();
    json!({
        "schema": {
            "allOf": [
                { "$ref": "#/components/schemas/Problem" },
                {
                    "type": "object",
                    "properties": {
                        "status": { "const": status },
                        "code": { "enum": codes },
                        "type": { "enum": codes.iter().map(|code| format!("urn:idem:problem:{code}")).collect::<Vec<_>>() },
                    }
                }
            ]
        },
        "examples": examples,
    })
}

fn problem_codes_and_examples(document: &mut Value) {
    for (path, method, status, codes) in PROBLEM_CODES {
        let response = &mut document["paths"][*path][*method]["responses"][status.to_string()];
        if let Some(content) = response["content"].as_object_mut()
            && content.contains_key(PROBLEM_JSON)
        {
            content.insert(PROBLEM_JSON.to_owned(), problem_content(*status, codes));
        }
    }
    let all_codes: Vec<&str> = ApiError::samples().iter().map(ApiError::code).collect();
    let problem = &mut document["components"]["schemas"]["Problem"]["properties"];
    problem["code"]["enum"] = json!(all_codes);
    problem["status"]["minimum"] = json!(400);
    problem["status"]["maximum"] = json!(599);
}

fn method_not_allowed(document: &mut Value) {
    let response = json!({
        "description": "`method_not_allowed`: the path exists, the method is not one it serves. \
            Answered on every path of this document for any method not listed under it.",
        "headers": {
            "Allow": {
                "description": "The methods the path serves, e.g. `POST`.",
                "schema": { "type": "string" }
            }
        },
        "content": { PROBLEM_JSON: problem_content(405, METHOD_NOT_ALLOWED_CODES) },
    });
    document["components"]["responses"]["MethodNotAllowed"] = response;
}

/// Examples for the responses that are not problems.
fn other_examples(document: &mut Value) {
    let label = document["components"]["schemas"]["Label"]["example"].clone();
    let examples = [
        ("/v1/labels", "post", "201", "application/json", label.clone()),
        ("/v1/labels/{label_id}", "get", "200", "application/json", label),
        (
            "/healthz",
            "get",
            "200",
            "application/json",
            json!({"status": "ok", "store": "embedded"}),
        ),
        (
            "/readyz",
            "get",
            "200",
            "application/json",
            json!({"status": "ready", "store": "embedded"}),
        ),
        (
            "/metrics",
            "get",
            "200",
            "text/plain",
            json!(
                "# TYPE idem_http_requests_total counter\n\
                 idem_http_requests_total{route=\"/v1/labels\",method=\"POST\",status=\"201\",outcome=\"created\"} 1\n"
            ),
        ),
        (
            "/openapi.json",
            "get",
            "200",
            "application/json",
            json!({"openapi": "3.1.0", "info": {"title": "idem Label service", "version": "0.1.0"}, "paths": {}}),
        ),
    ];
    for (path, method, status, media_type, example) in examples {
        let content = &mut document["paths"][path][method]["responses"][status]["content"][media_type];
        if content.is_object() {
            content["example"] = example;
        }
    }
}

/// The stateful phase of a schema-driven tester (and a reader) can follow
/// a created label to where it can be read.
fn label_link(document: &mut Value) {
    let created = &mut create_label_operation(document)["responses"]["201"];
    if created.is_object() {
        created["links"] = json!({
            "GetLabel": {
                "operationId": "get_label",
                "parameters": { "label_id": "$response.body#/label_id" },
                "description": "The label just created (or replayed), read back by its id."
            }
        });
    }
}

/// A duration in the largest whole unit that states it exactly.
fn duration_text(ms: u64) -> String {
    const UNITS: [(u64, &str); 3] = [(3_600_000, "h"), (60_000, "min"), (1_000, "s")];
    UNITS
        .iter()
        .find(|(unit_ms, _)| ms >= *unit_ms && ms.is_multiple_of(*unit_ms))
        .map(|(unit_ms, unit)| format!("{} {unit}", ms / unit_ms))
        .unwrap_or_else(|| format!("{ms} ms"))
}

/// The draft on the `Idempotency-Key` header (draft-ietf-httpapi-
/// idempotency-key-header, section 2.3) asks a resource to publish how long
/// its keys live: here in words and as `x-idempotency`.
fn idempotency_policy(document: &mut Value, policy: &Policy) {
    let retention = duration_text(policy.retention_ms());
    let lease = duration_text(policy.lease_ms());
    let words = format!(
        " Keys are kept, per caller, for {retention} after their request completed; a repeat within that time \
         gets the saved answer, a later one is a new request. One attempt holds a key for at most {lease} \
         (the lease); a repeat meanwhile is answered `409` until it ends, then takes over."
    );
    if let Some(description) = document["info"]["description"].as_str() {
        document["info"]["description"] = json!(format!("{description}{words}"));
    }
    let operation = create_label_operation(document);
    if let Some(description) = operation["description"].as_str() {
        operation["description"] = json!(format!("{description}{words}"));
    } else {
        operation["description"] = json!(words.trim_start());
    }
    operation["x-idempotency"] = json!({
        "header": "Idempotency-Key",
        "scope": "caller",
        "fingerprint": "SHA-256 of method, path and the canonical JSON body",
        "retention_ms": policy.retention_ms(),
        "lease_ms": policy.lease_ms(),
        "retention": retention,
        "lease": lease,
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_stated_in_their_largest_exact_unit() {
        assert_eq!(duration_text(86_400_000), "24 h");
        assert_eq!(duration_text(30_000), "30 s");
        assert_eq!(duration_text(90_000), "90 s");
        assert_eq!(duration_text(7_200_000), "2 h");
        assert_eq!(duration_text(1_500), "1500 ms");
    }

    #[test]
    fn the_document_states_the_configured_policy() {
        let policy = Policy::new(45_000, 3_600_000, 0).unwrap();
        let document = document_for(&policy);
        let operation = &document["paths"]["/v1/labels"]["post"];
        assert_eq!(operation["x-idempotency"]["retention_ms"], 3_600_000);
        assert_eq!(operation["x-idempotency"]["lease_ms"], 45_000);
        let description = operation["description"].as_str().unwrap();
        assert!(
            description.contains("for 1 h after") && description.contains("at most 45 s"),
            "{description}"
        );
    }

    #[test]
    fn every_problem_response_lists_its_codes_and_every_code_is_listed() {
        let document = document();
        let mut listed = Vec::new();
        for (path, item) in document["paths"].as_object().unwrap() {
            for (method, operation) in item.as_object().unwrap() {
                for (status, response) in operation["responses"].as_object().unwrap() {
                    let Some(problem) = response["content"].get(PROBLEM_JSON) else {
                        continue;
                    };
                    let codes = problem["schema"]["allOf"][1]["properties"]["code"]["enum"]
                        .as_array()
                        .unwrap_or_else(|| panic!("{method} {path} {status}: no code enum"));
                    for code in codes {
                        let code = code.as_str().unwrap();
                        let sample = ApiError::sample(code).unwrap_or_else(|| panic!("{code} is no ApiError code"));
                        assert_eq!(sample.status().as_str(), status, "{method} {path}: {code}");
                        assert_eq!(problem["examples"][code]["value"]["code"], code);
                        listed.push(code.to_owned());
                    }
                }
            }
        }
        listed.extend(METHOD_NOT_ALLOWED_CODES.iter().map(|code| (*code).to_owned()));
        for error in ApiError::samples() {
            assert!(
                listed.iter().any(|code| code == error.code()),
                "{} is documented nowhere",
                error.code()
            );
        }
    }
}
