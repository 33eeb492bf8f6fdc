//! `/openapi.json`: served, OpenAPI 3.1, valid by an independent validator
//! (Python's openapi-spec-validator), and complete: every route, header and
//! problem response of the API. That replies conform to it is checked on
//! every reply of the suite (`common::assert_documented`).

use crate::common::{Options, TestServer, openapi};
use server::backend::StoreKind;
use std::process::Command;
use store_core::Policy;
use store_core::types::{RETENTION_MS_DEFAULT, TOMBSTONE_MS_DEFAULT};

/// The validator: `python3 -m openapi_spec_validator FILE` (PyPI package
/// openapi-spec-validator; scripts/test installs it).
const PYTHON_PROGRAM: &str = "python3";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_served_document_is_openapi_3_1_and_passes_the_validator() {
    let server = TestServer::start(StoreKind::Embedded).await;
    let served = server.get("/openapi.json", None).await.json();
    let policy = Policy::new(Options::default().lease_ms, RETENTION_MS_DEFAULT, TOMBSTONE_MS_DEFAULT).unwrap();
    assert_eq!(
        served,
        server::openapi::document_for(&policy),
        "the served document is the generated one, with the configured policy"
    );
    let published = &served["paths"]["/v1/labels"]["post"]["x-idempotency"];
    assert_eq!(published["lease_ms"], Options::default().lease_ms, "{published}");
    assert_eq!(published["retention_ms"], RETENTION_MS_DEFAULT, "{published}");
    assert!(
        served["openapi"].as_str().unwrap().starts_with("3.1"),
        "{}",
        served["openapi"]
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("openapi.json");
    std::fs::write(&path, serde_json::to_vec_pretty(&served).unwrap()).unwrap();
    let output = Command::new(PYTHON_PROGRAM)
        .args(["-m", "openapi_spec_validator"])
        .arg(&path)
        .output()
        .expect("python3 runs");
    let said = String::from_utf8_lossy(&output.stdout).into_owned() + &String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "openapi-spec-validator:\n{said}");
    assert!(said.contains("OK"), "{said}");
    server.shutdown().await;
}

#[test]
fn every_route_header_and_problem_response_is_documented() {
    let document = openapi();
    let expected: &[(&str, &str, &[u16])] = &[
        (
            "/v1/labels",
            "post",
            &[201, 400, 401, 409, 413, 415, 422, 500, 502, 503],
        ),
        ("/v1/labels/{label_id}", "get", &[200, 401, 404, 500, 503]),
        ("/healthz", "get", &[200]),
        ("/readyz", "get", &[200, 503]),
        ("/metrics", "get", &[200]),
        ("/openapi.json", "get", &[200]),
    ];
    assert_eq!(
        document["paths"].as_object().unwrap().len(),
        expected.len(),
        "no undocumented extras"
    );
    for (path, method, statuses) in expected {
        let operation = &document["paths"][path][method];
        assert!(operation.is_object(), "{method} {path}");
        for status in *statuses {
            let response = &operation["responses"][status.to_string()];
            assert!(response.is_object(), "{method} {path} {status}");
            if *status >= 400 {
                let problem = &response["content"]["application/problem+json"];
                let schema = &problem["schema"]["allOf"];
                assert_eq!(
                    schema[0]["$ref"], "#/components/schemas/Problem",
                    "{method} {path} {status}"
                );
                assert_eq!(schema[1]["properties"]["status"]["const"], *status, "{method} {path}");
                let codes = schema[1]["properties"]["code"]["enum"].as_array().unwrap();
                assert!(!codes.is_empty(), "{method} {path} {status}");
                for code in codes {
                    let example = &problem["examples"][code.as_str().unwrap()]["value"];
                    assert_eq!(&example["code"], code, "{method} {path} {status}");
                    assert_eq!(example["status"], *status, "{method} {path} {status}");
                }
            }
            for (media_type, content) in response["content"].as_object().unwrap() {
                assert!(
                    content["example"].is_object() || content["example"].is_string() || content["examples"].is_object(),
                    "{method} {path} {status} {media_type}: no example"
                );
            }
        }
    }
    let create = &document["paths"]["/v1/labels"]["post"];
    let parameters = create["parameters"].as_array().unwrap();
    let key = parameters
        .iter()
        .find(|p| p["name"] == "Idempotency-Key" && p["in"] == "header" && p["required"] == true)
        .expect("the key header");
    assert_eq!(key["schema"]["minLength"], 1);
    assert_eq!(key["schema"]["maxLength"], 512);
    assert_eq!(key["schema"]["pattern"], server::key_header::KEY_HEADER_PATTERN);
    assert_eq!(
        create["responses"]["201"]["links"]["GetLabel"]["operationId"], "get_label",
        "the stateful tester follows a created label"
    );
    let not_allowed = &document["components"]["responses"]["MethodNotAllowed"];
    assert!(not_allowed["headers"]["Allow"].is_object(), "{not_allowed}");
    let request = &document["components"]["schemas"]["CreateLabelRequest"];
    for (field, maximum) in [
        ("order_id", 9_007_199_254_740_991_u64),
        ("parcel_no", 2_147_483_647),
        ("weight_g", 70_000),
        ("label_version", 2_147_483_647),
    ] {
        assert_eq!(request["properties"][field]["minimum"], 1, "{field}");
        assert_eq!(request["properties"][field]["maximum"], maximum, "{field}");
    }
    assert_eq!(request["additionalProperties"], false);
    let created_headers = &create["responses"]["201"]["headers"];
    assert!(created_headers["Location"].is_object() && created_headers["Idempotent-Replayed"].is_object());
    for status in ["409", "503"] {
        assert!(
            create["responses"][status]["headers"]["Retry-After"].is_object(),
            "{status}"
        );
    }
    assert!(document["components"]["securitySchemes"]["bearer"].is_object());
    let problem = &document["components"]["schemas"]["Problem"]["properties"];
    for field in ["type", "title", "status", "detail", "code"] {
        assert!(problem[field].is_object(), "Problem.{field}");
    }
    let description = create["responses"]["400"]["description"].as_str().unwrap();
    for code in ["idempotency_key_missing", "idempotency_key_invalid", "invalid_request"] {
        assert!(description.contains(code), "{code}");
    }
}
