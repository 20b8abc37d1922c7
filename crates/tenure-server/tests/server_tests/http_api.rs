//! The Tenure v1 HTTP API of a cluster of real `tenure` node processes, spoken only in JSON as a
//! Tenure client would, through every node in turn: the lease routes with the exact field names
//! of contract section 7, their error codes and HTTP statuses (ALREADY_HELD, LEASE_MISMATCH,
//! LEASE_EXPIRED, NOT_FOUND, INVALID_ARGUMENT for bad JSON, missing fields and out-of-bounds
//! TTLs), JSON errors for unknown routes and oversized bodies, health, readiness, metrics and
//! the OpenAPI document; then authentication and tenant isolation on a cluster with bearer
//! tokens, over HTTP and over the native QUIC protocol.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    missing_docs
)]

use crate::common;

use std::collections::HashMap;

use common::{ClusterOptions, ProcessCluster, TestToken, forward, http_json, http_request};
use serde_json::{Value, json};
use tenure_core::{AcquireRequest, ErrorCode, ResourceKey};
use tenure_proto::client::{Principal, RequestBody, RequestFlags, ResponseBody};

const TENANT_HEADER: &str = "X-Tenure-Principal-Tenant";
const PRINCIPAL_HEADER: &str = "X-Tenure-Principal-Id";

/// What a step expects back.
enum Expect {
    /// 200 with these fields present (and the given values where not null in the template).
    Ok(Value),
    /// An error: status and code.
    Error(u16, &'static str),
}

/// One step of the table.
struct Step {
    name: &'static str,
    method: &'static str,
    /// Path; `$name` is replaced by a captured value.
    path: &'static str,
    /// JSON body; string values `$name` are replaced by captured values. `None` sends no body.
    body: Option<Value>,
    /// A raw body instead of JSON (sent with `Content-Type: application/json`).
    raw: Option<Vec<u8>>,
    expect: Expect,
    /// Captures `(name, JSON pointer)` from a successful answer.
    capture: &'static [(&'static str, &'static str)],
}

fn step(
    name: &'static str,
    method: &'static str,
    path: &'static str,
    body: Option<Value>,
    expect: Expect,
) -> Step {
    Step {
        name,
        method,
        path,
        body,
        raw: None,
        expect,
        capture: &[],
    }
}

fn substitute(value: &Value, vars: &HashMap<String, Value>) -> Value {
    match value {
        Value::String(text) if text.starts_with('$') => vars
            .get(&text[1..])
            .cloned()
            .unwrap_or_else(|| panic!("no captured value {text}")),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(key, value)| (key.clone(), substitute(value, vars)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(|v| substitute(v, vars)).collect()),
        other => other.clone(),
    }
}

fn substitute_path(path: &str, vars: &HashMap<String, Value>) -> String {
    let mut out = path.to_string();
    for (name, value) in vars {
        let text = match value {
            Value::String(text) => text.clone(),
            other => other.to_string(),
        };
        out = out.replace(&format!("${name}"), &text);
    }
    out
}

/// Every key of `expected` is in `actual`; non-null expected values are equal.
fn check_fields(name: &str, expected: &Value, actual: &Value) {
    let (Value::Object(expected), Value::Object(actual)) = (expected, actual) else {
        assert_eq!(expected, actual, "{name}");
        return;
    };
    for (key, want) in expected {
        let got = actual
            .get(key)
            .unwrap_or_else(|| panic!("{name}: field `{key}` missing in {actual:?}"));
        match want {
            Value::Null => {}
            Value::Object(_) => check_fields(&format!("{name}.{key}"), want, got),
            _ => assert_eq!(got, want, "{name}: field `{key}`"),
        }
    }
}

fn check_error_shape(name: &str, status: u16, body: &Value, code: &str) {
    assert_eq!(body["code"], code, "{name}: {status} {body}");
    assert!(
        body["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{name}: message in {body}"
    );
    assert!(
        body["retryable"].is_boolean(),
        "{name}: retryable in {body}"
    );
    assert!(
        body.get("leader_hint").is_some(),
        "{name}: leader_hint in {body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenure_v1_routes_fields_and_errors() {
    let cluster = ProcessCluster::start_ready(ClusterOptions::default()).await;
    let tenant = "http-tenant";
    let headers = [(TENANT_HEADER, tenant), (PRINCIPAL_HEADER, "http-tests")];
    let acquire_fields =
        json!({"lease_id": null, "expiry_time": null, "fencing_token": null, "created": true});
    let lease_fields = json!({
        "tenant_id": tenant, "resource_id": "res-1", "lease_id": "$lease_id", "holder_id": "alice",
        "status": "ACTIVE", "expiry_time": null, "fencing_token": "$token", "version": null
    });
    let steps = vec![
        Step {
            capture: &[("lease_id", "/lease_id"), ("token", "/fencing_token")],
            ..step(
                "acquire",
                "POST",
                "/v1/leases/acquire",
                Some(
                    json!({"tenant_id": tenant, "resource_id": "res-1", "holder_id": "alice", "ttl_seconds": 30, "request_id": "r1"}),
                ),
                Expect::Ok(acquire_fields.clone()),
            )
        },
        step(
            "get active",
            "GET",
            "/v1/leases/http-tenant/res-1",
            None,
            Expect::Ok(json!({"found": true, "lease": lease_fields})),
        ),
        step(
            "acquire by another holder",
            "POST",
            "/v1/leases/acquire",
            Some(
                json!({"tenant_id": tenant, "resource_id": "res-1", "holder_id": "bob", "ttl_seconds": 30, "request_id": "r2"}),
            ),
            Expect::Error(409, "ALREADY_HELD"),
        ),
        step(
            "renew by the wrong holder",
            "POST",
            "/v1/leases/renew",
            Some(
                json!({"tenant_id": tenant, "resource_id": "res-1", "lease_id": "$lease_id", "holder_id": "bob", "ttl_seconds": 30, "request_id": "r3"}),
            ),
            Expect::Error(409, "LEASE_MISMATCH"),
        ),
        step(
            "renew",
            "POST",
            "/v1/leases/renew",
            Some(
                json!({"tenant_id": tenant, "resource_id": "res-1", "lease_id": "$lease_id", "holder_id": "alice", "ttl_seconds": 45, "request_id": "r4"}),
            ),
            Expect::Ok(
                json!({"lease_id": "$lease_id", "expiry_time": null, "fencing_token": "$token", "renewed": true}),
            ),
        ),
        step(
            "renew with ttl_ms",
            "POST",
            "/v1/leases/renew",
            Some(
                json!({"tenant_id": tenant, "resource_id": "res-1", "lease_id": "$lease_id", "holder_id": "alice", "ttl_ms": 5001, "request_id": "r4b"}),
            ),
            Expect::Ok(
                json!({"lease_id": "$lease_id", "fencing_token": "$token", "renewed": true}),
            ),
        ),
        step(
            "list",
            "GET",
            "/v1/tenants/http-tenant/leases?page_size=100",
            None,
            Expect::Ok(json!({"leases": null, "next_page_token": null})),
        ),
        step(
            "release",
            "POST",
            "/v1/leases/release",
            Some(
                json!({"tenant_id": tenant, "resource_id": "res-1", "lease_id": "$lease_id", "holder_id": "alice", "request_id": "r5"}),
            ),
            Expect::Ok(
                json!({"lease_id": "$lease_id", "released": true, "expiry_time": null, "fencing_token": "$token"}),
            ),
        ),
        step(
            "get released",
            "GET",
            "/v1/leases/http-tenant/res-1",
            None,
            Expect::Ok(
                json!({"found": true, "lease": {"status": "RELEASED", "lease_id": "$lease_id"}}),
            ),
        ),
        step(
            "renew after release",
            "POST",
            "/v1/leases/renew",
            Some(
                json!({"tenant_id": tenant, "resource_id": "res-1", "lease_id": "$lease_id", "holder_id": "alice", "ttl_seconds": 30, "request_id": "r6"}),
            ),
            Expect::Error(409, "LEASE_EXPIRED"),
        ),
        step(
            "release after release",
            "POST",
            "/v1/leases/release",
            Some(
                json!({"tenant_id": tenant, "resource_id": "res-1", "lease_id": "$lease_id", "holder_id": "alice", "request_id": "r7"}),
            ),
            Expect::Error(409, "LEASE_EXPIRED"),
        ),
        step(
            "idempotent retry of the first acquire",
            "POST",
            "/v1/leases/acquire",
            Some(
                json!({"tenant_id": tenant, "resource_id": "res-1", "holder_id": "alice", "ttl_seconds": 30, "request_id": "r1"}),
            ),
            Expect::Ok(
                json!({"lease_id": "$lease_id", "fencing_token": "$token", "created": true, "replayed": true}),
            ),
        ),
        step(
            "request id reused for another holder",
            "POST",
            "/v1/leases/acquire",
            Some(
                json!({"tenant_id": tenant, "resource_id": "res-1", "holder_id": "mallory", "ttl_seconds": 30, "request_id": "r1"}),
            ),
            Expect::Error(400, "INVALID_ARGUMENT"),
        ),
        step(
            "get unknown resource",
            "GET",
            "/v1/leases/http-tenant/never-leased",
            None,
            Expect::Ok(json!({"found": false, "lease": null})),
        ),
        step(
            "renew unknown resource",
            "POST",
            "/v1/leases/renew",
            Some(
                json!({"tenant_id": tenant, "resource_id": "never-leased", "lease_id": "$lease_id", "holder_id": "alice", "ttl_seconds": 30, "request_id": "r8"}),
            ),
            Expect::Error(404, "NOT_FOUND"),
        ),
        Step {
            raw: Some(b"{\"tenant_id\": \"http-tenant\", ".to_vec()),
            ..step(
                "bad JSON",
                "POST",
                "/v1/leases/acquire",
                None,
                Expect::Error(400, "INVALID_ARGUMENT"),
            )
        },
        step(
            "missing field",
            "POST",
            "/v1/leases/acquire",
            Some(
                json!({"tenant_id": tenant, "resource_id": "res-2", "ttl_seconds": 30, "request_id": "r9"}),
            ),
            Expect::Error(400, "INVALID_ARGUMENT"),
        ),
        step(
            "ttl below the minimum",
            "POST",
            "/v1/leases/acquire",
            Some(
                json!({"tenant_id": tenant, "resource_id": "res-2", "holder_id": "alice", "ttl_seconds": 1, "request_id": "r10"}),
            ),
            Expect::Error(400, "INVALID_ARGUMENT"),
        ),
        step(
            "ttl above the maximum",
            "POST",
            "/v1/leases/acquire",
            Some(
                json!({"tenant_id": tenant, "resource_id": "res-2", "holder_id": "alice", "ttl_seconds": 3601, "request_id": "r11"}),
            ),
            Expect::Error(400, "INVALID_ARGUMENT"),
        ),
        step(
            "malformed lease id",
            "POST",
            "/v1/leases/renew",
            Some(
                json!({"tenant_id": tenant, "resource_id": "res-1", "lease_id": "nope", "holder_id": "alice", "ttl_seconds": 30, "request_id": "r12"}),
            ),
            Expect::Error(400, "INVALID_ARGUMENT"),
        ),
        step(
            "unknown route",
            "GET",
            "/v1/nothing-here",
            None,
            Expect::Error(404, "NOT_FOUND"),
        ),
        step(
            "unknown route (POST)",
            "POST",
            "/v2/leases/acquire",
            Some(json!({})),
            Expect::Error(404, "NOT_FOUND"),
        ),
        step(
            "wrong method",
            "GET",
            "/v1/leases/acquire",
            None,
            Expect::Error(405, "INVALID_ARGUMENT"),
        ),
        Step {
            raw: Some(
                serde_json::to_vec(&json!({
                    "tenant_id": tenant, "resource_id": "res-3", "holder_id": "x".repeat(70 * 1024),
                    "ttl_seconds": 30, "request_id": "r13"
                }))
                .unwrap(),
            ),
            ..step(
                "oversized body",
                "POST",
                "/v1/leases/acquire",
                None,
                Expect::Error(413, "INVALID_ARGUMENT"),
            )
        },
    ];

    let mut vars: HashMap<String, Value> = HashMap::new();
    let ids = cluster.ids();
    for (index, step) in steps.iter().enumerate() {
        // Any node: each step goes to the next node in turn.
        let node = ids[index % ids.len()];
        let url = format!(
            "{}{}",
            cluster.http_url(node),
            substitute_path(step.path, &vars)
        );
        let body = match (&step.raw, &step.body) {
            (Some(raw), _) => Some(raw.clone()),
            (None, Some(json)) => Some(serde_json::to_vec(&substitute(json, &vars)).unwrap()),
            (None, None) => None,
        };
        let (status, _, bytes) = http_request(step.method, &url, &headers, body)
            .await
            .unwrap_or_else(|error| panic!("{}: {error}", step.name));
        let answer: Value = serde_json::from_slice(&bytes).unwrap_or_else(|error| {
            panic!(
                "{} (node {node}): {status} answer is not JSON ({error}): {:?}",
                step.name,
                String::from_utf8_lossy(&bytes)
            )
        });
        let name = format!("{} (node {node})", step.name);
        match &step.expect {
            Expect::Ok(fields) => {
                assert_eq!(status, 200, "{name}: {answer}");
                check_fields(&name, &substitute(fields, &vars), &answer);
            }
            Expect::Error(want_status, code) => {
                assert_eq!(status, *want_status, "{name}: {answer}");
                check_error_shape(&name, status, &answer, code);
            }
        }
        for (var, pointer) in step.capture {
            let value = answer
                .pointer(pointer)
                .unwrap_or_else(|| panic!("{name}: nothing at {pointer} in {answer}"))
                .clone();
            vars.insert((*var).to_string(), value);
        }
        println!("ok: {name}: {status}");
    }

    // Details the table does not check.
    let url = cluster.http_url(2);
    let (status, answer) = http_json(
        "POST",
        &format!("{url}/v1/leases/acquire"),
        &headers,
        Some(&json!({"tenant_id": tenant, "resource_id": "res-held", "holder_id": "alice", "ttl_seconds": 30, "request_id": "h1"})),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert!(answer["expiry_time"].as_str().unwrap().ends_with('Z'));
    let (status, answer) = http_json(
        "POST",
        &format!("{}/v1/leases/acquire", cluster.http_url(3)),
        &headers,
        Some(&json!({"tenant_id": tenant, "resource_id": "res-held", "holder_id": "bob", "ttl_seconds": 30, "request_id": "h2"})),
    )
    .await;
    assert_eq!(status, 409, "{answer}");
    assert_eq!(answer["retryable"], false);
    assert_eq!(
        answer["holder_id"], "alice",
        "ALREADY_HELD names the holder: {answer}"
    );
    assert!(
        answer["remaining_ttl_ms"]
            .as_u64()
            .is_some_and(|ms| ms > 0 && ms <= 30_000)
    );

    // The TTL error names the bounds.
    let (ttl_min, ttl_max) = cluster.ttl_bounds_ms();
    let (status, answer) = http_json(
        "POST",
        &format!("{url}/v1/leases/acquire"),
        &headers,
        Some(&json!({"tenant_id": tenant, "resource_id": "res-2", "holder_id": "alice", "ttl_seconds": 1, "request_id": "r10"})),
    )
    .await;
    assert_eq!(status, 400);
    let message = answer["message"].as_str().unwrap();
    assert!(
        message.contains(&ttl_min.to_string()) && message.contains(&ttl_max.to_string()),
        "the bounds: {message}"
    );

    // A body that is not declared JSON.
    let (status, _, bytes) = http_request(
        "POST",
        &format!("{url}/v1/leases/acquire"),
        &[
            (TENANT_HEADER, tenant),
            (PRINCIPAL_HEADER, "http-tests"),
            ("content-type", "text/plain"),
        ],
        Some(br#"{"tenant_id": "http-tenant"}"#.to_vec()),
    )
    .await
    .unwrap();
    let answer: Value = serde_json::from_slice(&bytes).expect("a JSON error");
    assert_eq!(status, 415, "{answer}");
    check_error_shape("wrong content type", status, &answer, "INVALID_ARGUMENT");

    // The list shows the leases of the tenant.
    let (status, answer) = http_json(
        "GET",
        &format!("{url}/v1/tenants/{tenant}/leases?page_size=500"),
        &headers,
        None,
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    let leases = answer["leases"].as_array().unwrap();
    assert!(
        leases
            .iter()
            .any(|lease| lease["resource_id"] == "res-held" && lease["holder_id"] == "alice"),
        "{answer}"
    );
    for lease in leases {
        for field in [
            "tenant_id",
            "resource_id",
            "lease_id",
            "holder_id",
            "status",
            "expiry_time",
            "fencing_token",
            "version",
        ] {
            assert!(
                lease.get(field).is_some(),
                "list item without {field}: {lease}"
            );
        }
    }
    let (status, answer) = http_json(
        "GET",
        &format!("{url}/v1/tenants/{tenant}/leases?filter_status=RELEASED"),
        &headers,
        None,
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert!(
        answer["leases"]
            .as_array()
            .unwrap()
            .iter()
            .all(|lease| lease["status"] == "RELEASED")
    );

    // Health, readiness, metrics, OpenAPI on every node.
    for id in cluster.ids() {
        let url = cluster.http_url(id);
        let (status, answer) = http_json("GET", &format!("{url}/healthz"), &[], None).await;
        assert_eq!(status, 200, "{answer}");
        let (status, answer) = http_json("GET", &format!("{url}/readyz"), &[], None).await;
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["ready"], true);
        let (status, _, metrics) = http_request("GET", &format!("{url}/metrics"), &[], None)
            .await
            .unwrap();
        assert_eq!(status, 200);
        let metrics = String::from_utf8(metrics).unwrap();
        assert!(
            metrics.contains("tenure_requests_total"),
            "node {id} metrics:\n{metrics}"
        );
        let (status, answer) = http_json("GET", &format!("{url}/openapi.json"), &[], None).await;
        assert_eq!(status, 200);
        assert!(
            answer["openapi"]
                .as_str()
                .is_some_and(|v| v.starts_with('3')),
            "{answer}"
        );
        assert!(answer["paths"].get("/v1/leases/acquire").is_some());
    }
}

/// (name, method, path, headers, JSON body, expected status, expected code).
type AuthCase<'a> = (
    &'a str,
    &'a str,
    String,
    Vec<(&'a str, &'a str)>,
    Option<Value>,
    u16,
    &'a str,
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_and_tenant_isolation() {
    let tokens = vec![
        TestToken {
            token: "token-of-tenant-a".to_string(),
            principal_id: "svc-a".to_string(),
            tenant_id: "tenant-a".to_string(),
        },
        TestToken {
            token: "token-of-tenant-b".to_string(),
            principal_id: "svc-b".to_string(),
            tenant_id: "tenant-b".to_string(),
        },
    ];
    let cluster = ProcessCluster::start_ready(ClusterOptions {
        insecure_dev_mode: false,
        tokens,
        ..ClusterOptions::default()
    })
    .await;
    let bearer_a = "Bearer token-of-tenant-a";
    let bearer_b = "Bearer token-of-tenant-b";
    let acquire = |tenant: &str, resource: &str, request: &str| json!({"tenant_id": tenant, "resource_id": resource, "holder_id": "h", "ttl_seconds": 30, "request_id": request});

    // HTTP.
    let url = cluster.http_url(1);
    let cases: Vec<AuthCase<'_>> = vec![
        (
            "no token",
            "POST",
            "/v1/leases/acquire".into(),
            vec![],
            Some(acquire("tenant-a", "r", "1")),
            401,
            "UNAUTHORIZED",
        ),
        (
            "unknown token",
            "POST",
            "/v1/leases/acquire".into(),
            vec![("Authorization", "Bearer nope")],
            Some(acquire("tenant-a", "r", "2")),
            401,
            "UNAUTHORIZED",
        ),
        (
            "principal headers without a token",
            "POST",
            "/v1/leases/acquire".into(),
            vec![(TENANT_HEADER, "tenant-a"), (PRINCIPAL_HEADER, "mallory")],
            Some(acquire("tenant-a", "r", "3")),
            401,
            "UNAUTHORIZED",
        ),
        (
            "get without a token",
            "GET",
            "/v1/leases/tenant-a/r".into(),
            vec![],
            None,
            401,
            "UNAUTHORIZED",
        ),
        (
            "token of A on tenant B (acquire)",
            "POST",
            "/v1/leases/acquire".into(),
            vec![("Authorization", bearer_a)],
            Some(acquire("tenant-b", "r", "4")),
            403,
            "FORBIDDEN",
        ),
        (
            "token of A on tenant B (get)",
            "GET",
            "/v1/leases/tenant-b/r".into(),
            vec![("Authorization", bearer_a)],
            None,
            403,
            "FORBIDDEN",
        ),
        (
            "token of A on tenant B (list)",
            "GET",
            "/v1/tenants/tenant-b/leases".into(),
            vec![("Authorization", bearer_a)],
            None,
            403,
            "FORBIDDEN",
        ),
        (
            "token of A claiming tenant B",
            "POST",
            "/v1/leases/acquire".into(),
            vec![("Authorization", bearer_a), (TENANT_HEADER, "tenant-b")],
            Some(acquire("tenant-b", "r", "5")),
            403,
            "FORBIDDEN",
        ),
    ];
    for (name, method, path, headers, body, status, code) in cases {
        let (got, answer) =
            http_json(method, &format!("{url}{path}"), &headers, body.as_ref()).await;
        assert_eq!(got, status, "{name}: {answer}");
        check_error_shape(name, got, &answer, code);
        println!("ok: {name}: {got}");
    }
    let (status, answer) = http_json(
        "POST",
        &format!("{}/v1/leases/acquire", cluster.http_url(2)),
        &[("Authorization", bearer_a)],
        Some(&acquire("tenant-a", "shared-name", "ok-a")),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    let lease_a = answer["lease_id"].as_str().unwrap().to_string();
    // Tenant B's resource of the same name is another resource.
    let (status, answer) = http_json(
        "POST",
        &format!("{}/v1/leases/acquire", cluster.http_url(3)),
        &[("Authorization", bearer_b)],
        Some(&acquire("tenant-b", "shared-name", "ok-b")),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    // B cannot release A's lease, even naming tenant A's resource.
    let (status, answer) = http_json(
        "POST",
        &format!("{url}/v1/leases/release"),
        &[("Authorization", bearer_b)],
        Some(&json!({"tenant_id": "tenant-a", "resource_id": "shared-name", "lease_id": lease_a, "holder_id": "h", "request_id": "steal"})),
    )
    .await;
    assert_eq!(status, 403, "{answer}");
    // Health and readiness need no credentials.
    let (status, _) = http_json("GET", &format!("{url}/healthz"), &[], None).await;
    assert_eq!(status, 200);

    // QUIC.
    let client = cluster.bare_client(2).await.unwrap();
    let acquire_body = |tenant: &str, request: &str| {
        RequestBody::Lease(tenure_core::LeaseOp::Acquire(AcquireRequest {
            key: ResourceKey::new(tenant, "quic-resource"),
            holder_id: "h".to_string(),
            ttl_ms: 30_000,
            request_id: request.to_string(),
        }))
    };
    let error = client
        .call(acquire_body("tenant-a", "q1"), forward())
        .await
        .expect_err("a request before Authenticate");
    assert_eq!(error.code, ErrorCode::Unauthorized, "{error}");
    // Naming a principal does not help outside insecure mode.
    let claimed = Principal {
        principal_id: "mallory".to_string(),
        tenant_id: "tenant-a".to_string(),
    };
    let error = client
        .call_with(acquire_body("tenant-a", "q2"), forward(), Some(claimed), 0)
        .await
        .expect_err("a claimed principal without a token");
    assert_eq!(error.code, ErrorCode::Unauthorized, "{error}");
    let error = client
        .authenticate("wrong-token")
        .await
        .expect_err("a bad token");
    assert_eq!(error.code, ErrorCode::Unauthorized, "{error}");
    let principal = client
        .authenticate("token-of-tenant-a")
        .await
        .expect("authenticate");
    assert_eq!(principal.tenant_id, "tenant-a");
    assert_eq!(principal.principal_id, "svc-a");
    let answer = client
        .call(acquire_body("tenant-a", "q3"), forward())
        .await
        .expect("tenant A's own resource");
    assert!(matches!(answer, ResponseBody::Lease(_)), "{answer:?}");
    let error = client
        .call(acquire_body("tenant-b", "q4"), forward())
        .await
        .expect_err("tenant B's resource");
    assert_eq!(error.code, ErrorCode::Forbidden, "{error}");
    let error = client
        .call(
            RequestBody::Get {
                key: ResourceKey::new("tenant-b", "shared-name"),
            },
            forward(),
        )
        .await
        .expect_err("reading tenant B");
    assert_eq!(error.code, ErrorCode::Forbidden, "{error}");
    // Naming tenant B's principal on a connection bound to tenant A.
    let error = client
        .call_with(
            acquire_body("tenant-b", "q5"),
            forward(),
            Some(Principal {
                principal_id: "svc-b".to_string(),
                tenant_id: "tenant-b".to_string(),
            }),
            0,
        )
        .await
        .expect_err("claiming another tenant");
    assert_eq!(error.code, ErrorCode::Forbidden, "{error}");
    // Routing needs no tenant.
    let answer = client
        .call(RequestBody::Routing, RequestFlags::default())
        .await
        .expect("routing");
    assert!(matches!(answer, ResponseBody::Routing(_)));
}
