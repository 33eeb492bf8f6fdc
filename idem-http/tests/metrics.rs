//! The metric prefix: every counter is named under it. A test binary of its
//! own, because it installs the process-wide recorder.

use axum::Router;
use axum::body::Body;
use axum::handler::Handler;
use axum::http::{Request, StatusCode};
use axum::routing::post;
use idem_http::{Idempotency, IdempotencyLayer, SingleCaller};
use metrics_exporter_prometheus::PrometheusBuilder;
use std::sync::Arc;
use store_core::{CallerId, Policy, RESPONSE_BODY_BYTES_MAX};
use store_fdb::{EmbeddedConfig, EmbeddedStore};
use tower::ServiceExt;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_are_named_under_the_configured_prefix() {
    let handle = PrometheusBuilder::new().install_recorder().expect("the only recorder");
    let store = EmbeddedStore::open_embedded(&EmbeddedConfig::temporary(), Policy::default()).unwrap();
    let caller = SingleCaller(CallerId::new("shop").unwrap());
    let idempotency = Idempotency::builder(Arc::new(store), caller)
        .metric_prefix("shop_idem_")
        .unwrap()
        .build();
    idempotency.metric_names().register_at_zero();
    let rendered = handle.render();
    for (name, _) in idempotency.metric_names().all() {
        assert!(name.starts_with("shop_idem_"), "{name}");
        assert!(
            rendered.contains(&format!("{name} 0")),
            "{name} registered at zero:\n{rendered}"
        );
    }
    // An answer too large to save: the counter moves under the prefix.
    let too_large = || async { (StatusCode::CREATED, vec![b'x'; RESPONSE_BODY_BYTES_MAX + 1]) };
    let app = Router::new().route(
        "/orders",
        post(too_large.layer(IdempotencyLayer::new(idempotency, 1_024))),
    );
    let request = Request::post("/orders")
        .header("idempotency-key", "k")
        .body(Body::empty())
        .unwrap();
    let response = app.oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let rendered = handle.render();
    assert!(rendered.contains("shop_idem_responses_not_saved_total 1"), "{rendered}");
    assert!(
        !rendered.contains("\nidem_"),
        "nothing under the default prefix:\n{rendered}"
    );
}

#[test]
fn a_prefix_that_makes_no_metric_name_is_refused_by_the_builder() {
    let store = EmbeddedStore::open_embedded(&EmbeddedConfig::temporary(), Policy::default()).unwrap();
    let caller = SingleCaller(CallerId::new("shop").unwrap());
    assert!(
        Idempotency::builder(Arc::new(store), caller)
            .metric_prefix("9lives")
            .is_err()
    );
}
