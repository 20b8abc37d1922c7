//! Regression test of issue 19 item 11, "Tenure v1 compatibility defects": the reference Tenure
//! service's documented examples and behaviours (its `docs/api/lease-service.md` examples, the
//! demo documents' curl calls and expected outcomes, and the JSON shapes of its HTTP routes),
//! replayed against a `tenure serve` node in insecure development mode exactly as a Tenure
//! client sends them (principal headers, `ttl_seconds`), checked field by field: names, JSON
//! types, values where Tenure documents them, and HTTP statuses.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    missing_docs
)]

use crate::common;

use std::collections::HashMap;
use std::time::Duration;

use common::{ClusterOptions, ProcessCluster, http_request, wait_for};
use serde_json::{Value, json};

/// What one field of an answer must be.
#[derive(Debug, Clone)]
enum Want {
    /// A JSON string (any).
    Str,
    /// An RFC 3339 UTC timestamp string.
    Time,
    /// A non-negative JSON integer.
    Uint,
    /// A JSON boolean.
    Bool,
    /// A JSON array.
    Array,
    /// Exactly this value.
    Is(Value),
    /// Equal to a captured value.
    Same(&'static str),
    /// An integer greater than a captured one.
    Above(&'static str),
}

/// Which principal headers a step sends.
#[derive(Debug, Clone, Copy)]
enum Who {
    /// `X-Tenure-Principal-Id` and `X-Tenure-Principal-Tenant` of the tenant.
    Principal(&'static str),
    /// Only `X-Tenure-Principal-Tenant`.
    TenantOnly(&'static str),
    /// Only `X-Tenure-Principal-Id`.
    IdOnly,
    /// Neither.
    Nobody,
}

struct Case {
    name: &'static str,
    method: &'static str,
    /// `$name` is replaced by a captured value.
    path: &'static str,
    who: Who,
    body: Option<Value>,
    status: u16,
    /// `(JSON pointer, what it must be)`.
    fields: Vec<(&'static str, Want)>,
    /// `(name, JSON pointer)` to capture from the answer.
    capture: Vec<(&'static str, &'static str)>,
}

fn case(
    name: &'static str,
    method: &'static str,
    path: &'static str,
    who: Who,
    body: Option<Value>,
    status: u16,
    fields: Vec<(&'static str, Want)>,
) -> Case {
    Case {
        name,
        method,
        path,
        who,
        body,
        status,
        fields,
        capture: Vec::new(),
    }
}

fn is_rfc3339_utc(text: &str) -> bool {
    let bytes = text.as_bytes();
    text.len() >= 20
        && text.ends_with('Z')
        && bytes[4] == b'-'
        && bytes[7] == b'-'
        && bytes[10] == b'T'
        && bytes[13] == b':'
        && bytes[16] == b':'
        && text[..4].bytes().all(|b| b.is_ascii_digit())
}

fn substitute(value: &Value, vars: &HashMap<&'static str, Value>) -> Value {
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
        other => other.clone(),
    }
}

fn check(name: &str, pointer: &str, want: &Want, answer: &Value, vars: &HashMap<&str, Value>) {
    let got = answer
        .pointer(pointer)
        .unwrap_or_else(|| panic!("{name}: field {pointer} missing in {answer}"));
    let ok = match want {
        Want::Str => got.is_string(),
        Want::Time => got.as_str().is_some_and(is_rfc3339_utc),
        Want::Uint => got.is_u64(),
        Want::Bool => got.is_boolean(),
        Want::Array => got.is_array(),
        Want::Is(value) => got == value,
        Want::Same(var) => Some(got) == vars.get(var),
        Want::Above(var) => got
            .as_u64()
            .zip(vars.get(var).and_then(Value::as_u64))
            .is_some_and(|(now, before)| now > before),
    };
    assert!(
        ok,
        "{name}: field {pointer} is {got}, expected {want:?} (captured: {vars:?}); answer {answer}"
    );
}

/// The error shape of Tenure's API document: `{code, message, retryable, leader_hint}`.
fn error(code: &'static str) -> Vec<(&'static str, Want)> {
    vec![
        ("/code", Want::Is(json!(code))),
        ("/message", Want::Str),
        ("/retryable", Want::Bool),
        ("/leader_hint", Want::Is(Value::Null)),
    ]
}

/// The eight fields of Tenure's `LeaseView` under `prefix`, as `(pointer, want)`.
fn lease_view(
    prefix: &'static str,
    status: &'static str,
) -> impl Iterator<Item = (&'static str, Want)> {
    let field = move |name: &str| -> &'static str {
        Box::leak(format!("{prefix}/{name}").into_boxed_str())
    };
    vec![
        (field("tenant_id"), Want::Is(json!(TENANT))),
        (field("resource_id"), Want::Str),
        (field("lease_id"), Want::Str),
        (field("holder_id"), Want::Str),
        (field("status"), Want::Is(json!(status))),
        (field("expiry_time"), Want::Time),
        (field("fencing_token"), Want::Uint),
        (field("version"), Want::Uint),
    ]
    .into_iter()
}

const TENANT: &str = "acme";
/// The API document's resource, percent-encoded in paths (it contains a slash).
const RESOURCE: &str = "scheduler/primary";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenure_v1_documented_examples_field_by_field() {
    let cluster = ProcessCluster::start_ready(ClusterOptions {
        nodes: 1,
        groups: 4,
        ..ClusterOptions::default()
    })
    .await;
    let acquire = |resource: &str, holder: &str, request: &str| {
        json!({"tenant_id": TENANT, "resource_id": resource, "holder_id": holder,
               "ttl_seconds": 15, "request_id": request})
    };
    let lease_op = |resource: &str, holder: &str, request: &str, ttl: bool| {
        let mut body = json!({"tenant_id": TENANT, "resource_id": resource,
                              "lease_id": "$lease_id", "holder_id": holder, "request_id": request});
        if ttl {
            body["ttl_seconds"] = json!(15);
        }
        body
    };
    let me = Who::Principal(TENANT);
    let cases = vec![
        // lease-service.md, "Acquire".
        Case {
            capture: vec![
                ("lease_id", "/lease_id"),
                ("token", "/fencing_token"),
                ("acquired_expiry", "/expiry_time"),
            ],
            ..case(
                "acquire (API example)",
                "POST",
                "/v1/leases/acquire",
                me,
                Some(acquire(RESOURCE, "worker-17", "8c9a0f0a-1")),
                200,
                vec![
                    ("/lease_id", Want::Str),
                    ("/expiry_time", Want::Time),
                    ("/fencing_token", Want::Uint),
                    ("/created", Want::Is(json!(true))),
                ],
            )
        },
        // milestone-4/8 demos: an exact retry returns the same lease_id and fencing_token.
        case(
            "acquire retried with the same request_id",
            "POST",
            "/v1/leases/acquire",
            me,
            Some(acquire(RESOURCE, "worker-17", "8c9a0f0a-1")),
            200,
            vec![
                ("/lease_id", Want::Same("lease_id")),
                ("/fencing_token", Want::Same("token")),
                ("/created", Want::Is(json!(true))),
            ],
        ),
        // An ownership conflict is 409.
        case(
            "acquire held by another holder",
            "POST",
            "/v1/leases/acquire",
            me,
            Some(acquire(RESOURCE, "worker-18", "other-1")),
            409,
            error("ALREADY_HELD"),
        ),
        // lease-service.md, "Get".
        Case {
            capture: vec![("version_acquired", "/lease/version")],
            ..case(
                "get (API example)",
                "GET",
                "/v1/leases/acme/scheduler%2Fprimary",
                me,
                None,
                200,
                std::iter::once(("/found", Want::Is(json!(true))))
                    .chain(lease_view("/lease", "ACTIVE"))
                    .chain([
                        ("/lease/resource_id", Want::Is(json!(RESOURCE))),
                        ("/lease/lease_id", Want::Same("lease_id")),
                        ("/lease/holder_id", Want::Is(json!("worker-17"))),
                        ("/lease/fencing_token", Want::Same("token")),
                    ])
                    .collect(),
            )
        },
        // lease-service.md, "Renew".
        case(
            "renew (API example)",
            "POST",
            "/v1/leases/renew",
            me,
            Some(lease_op(RESOURCE, "worker-17", "8c9a0f0a-2", true)),
            200,
            vec![
                ("/lease_id", Want::Same("lease_id")),
                ("/expiry_time", Want::Time),
                ("/fencing_token", Want::Same("token")),
                ("/renewed", Want::Is(json!(true))),
            ],
        ),
        case(
            "renew by another holder",
            "POST",
            "/v1/leases/renew",
            me,
            Some(lease_op(RESOURCE, "worker-18", "other-2", true)),
            409,
            error("LEASE_MISMATCH"),
        ),
        // lease-service.md, "List" (the listing fits one page: next_page_token is "").
        case(
            "list (API example)",
            "GET",
            "/v1/tenants/acme/leases?page_size=2&page_token=&filter_status=ACTIVE",
            me,
            None,
            200,
            lease_view("/leases/0", "ACTIVE")
                .chain([
                    ("/leases", Want::Array),
                    ("/next_page_token", Want::Is(json!(""))),
                ])
                .collect(),
        ),
        // ListLeasesRequest.filter_status: enum { ANY, ACTIVE, EXPIRED, RELEASED }.
        case(
            "list with filter_status=ANY",
            "GET",
            "/v1/tenants/acme/leases?filter_status=ANY",
            me,
            None,
            200,
            vec![
                ("/leases/0/resource_id", Want::Is(json!(RESOURCE))),
                ("/next_page_token", Want::Is(json!(""))),
            ],
        ),
        // lease-service.md, "Release".
        case(
            "release (API example)",
            "POST",
            "/v1/leases/release",
            me,
            Some(lease_op(RESOURCE, "worker-17", "8c9a0f0a-3", false)),
            200,
            vec![
                ("/lease_id", Want::Same("lease_id")),
                ("/released", Want::Is(json!(true))),
                ("/expiry_time", Want::Time),
                ("/fencing_token", Want::Same("token")),
            ],
        ),
        Case {
            capture: vec![("version_released", "/lease/version")],
            ..case(
                "get after release",
                "GET",
                "/v1/leases/acme/scheduler%2Fprimary",
                me,
                None,
                200,
                std::iter::once(("/found", Want::Is(json!(true))))
                    .chain(lease_view("/lease", "RELEASED"))
                    .chain([("/lease/version", Want::Above("version_acquired"))])
                    .collect(),
            )
        },
        // LEASE_EXPIRED: "no longer valid for renewal or release", a 409 like every ownership
        // conflict in Tenure's routes.
        case(
            "renew after release",
            "POST",
            "/v1/leases/renew",
            me,
            Some(lease_op(RESOURCE, "worker-17", "8c9a0f0a-4", true)),
            409,
            error("LEASE_EXPIRED"),
        ),
        case(
            "release after release",
            "POST",
            "/v1/leases/release",
            me,
            Some(lease_op(RESOURCE, "worker-17", "8c9a0f0a-5", false)),
            409,
            error("LEASE_EXPIRED"),
        ),
        // milestone-8, "Fencing-token turnover": the next grant has a larger token, and the
        // record's version (a "monotonic state-machine version", architecture v1) goes on.
        case(
            "acquire after release",
            "POST",
            "/v1/leases/acquire",
            me,
            Some(acquire(RESOURCE, "worker-18", "8c9a0f0a-6")),
            200,
            vec![
                ("/fencing_token", Want::Above("token")),
                ("/created", Want::Is(json!(true))),
            ],
        ),
        case(
            "get after the new grant",
            "GET",
            "/v1/leases/acme/scheduler%2Fprimary",
            me,
            None,
            200,
            vec![
                ("/lease/status", Want::Is(json!("ACTIVE"))),
                ("/lease/holder_id", Want::Is(json!("worker-18"))),
                ("/lease/version", Want::Above("version_released")),
            ],
        ),
        // milestone-1: "absent leases return 200 with {"found":false,...}"; the view is
        // LeaseView.absent: the key, status ABSENT, empty ids, zero token and version.
        case(
            "get of a never-leased resource",
            "GET",
            "/v1/leases/acme/never-leased",
            me,
            None,
            200,
            vec![
                ("/found", Want::Is(json!(false))),
                ("/lease/tenant_id", Want::Is(json!(TENANT))),
                ("/lease/resource_id", Want::Is(json!("never-leased"))),
                ("/lease/lease_id", Want::Is(json!(""))),
                ("/lease/holder_id", Want::Is(json!(""))),
                ("/lease/status", Want::Is(json!("ABSENT"))),
                ("/lease/expiry_time", Want::Is(json!(""))),
                ("/lease/fencing_token", Want::Is(json!(0))),
                ("/lease/version", Want::Is(json!(0))),
            ],
        ),
        case(
            "renew of a never-leased resource",
            "POST",
            "/v1/leases/renew",
            me,
            Some(lease_op("never-leased", "worker-17", "n-1", true)),
            404,
            error("NOT_FOUND"),
        ),
        case(
            "list of a tenant with no leases",
            "GET",
            "/v1/tenants/acme/leases?filter_status=EXPIRED",
            me,
            None,
            200,
            vec![
                ("/leases", Want::Is(json!([]))),
                ("/next_page_token", Want::Is(json!(""))),
            ],
        ),
        // milestone-4, "Cross-tenant rejection".
        case(
            "acquire for another tenant",
            "POST",
            "/v1/leases/acquire",
            Who::Principal("tenant-b"),
            Some(acquire("resource-1", "holder-1", "req-9")),
            403,
            error("FORBIDDEN"),
        ),
        // LeaseRoutes.withPrincipal: both headers are required, else 401 UNAUTHORIZED.
        case(
            "acquire with only the tenant header",
            "POST",
            "/v1/leases/acquire",
            Who::TenantOnly(TENANT),
            Some(acquire("resource-1", "holder-1", "req-10")),
            401,
            error("UNAUTHORIZED"),
        ),
        case(
            "get with only the principal id header",
            "GET",
            "/v1/leases/acme/resource-1",
            Who::IdOnly,
            None,
            401,
            error("UNAUTHORIZED"),
        ),
        case(
            "get without principal headers",
            "GET",
            "/v1/leases/acme/resource-1",
            Who::Nobody,
            None,
            401,
            error("UNAUTHORIZED"),
        ),
        // A body that does not decode is 400 INVALID_ARGUMENT.
        case(
            "acquire without ttl_seconds",
            "POST",
            "/v1/leases/acquire",
            me,
            Some(
                json!({"tenant_id": TENANT, "resource_id": "r", "holder_id": "h",
                        "request_id": "bad-1"}),
            ),
            400,
            error("INVALID_ARGUMENT"),
        ),
    ];

    let url = cluster.http_url(1);
    // Readiness means every group has a leader; a new leader serves once its first entry of the
    // term is committed (its leader clock is ready), so the first example could meet NOT_LEADER
    // naming this very node. Wait until the examples' group serves a read.
    let principal = [
        ("X-Tenure-Principal-Id", "demo-user"),
        ("X-Tenure-Principal-Tenant", TENANT),
    ];
    let probe = format!("{url}/v1/leases/acme/scheduler%2Fprimary");
    wait_for(
        Duration::from_secs(15),
        "the examples' group to serve reads",
        || async {
            let (status, _, _) = http_request("GET", &probe, &principal, None).await.ok()?;
            (status == 200).then_some(())
        },
    )
    .await
    .unwrap();
    let mut vars: HashMap<&'static str, Value> = HashMap::new();
    let mut failures = Vec::new();
    for case in &cases {
        let mut path = case.path.to_string();
        for (name, value) in &vars {
            if let Value::String(text) = value {
                path = path.replace(&format!("${name}"), text);
            }
        }
        let headers: Vec<(&str, &str)> = match case.who {
            Who::Principal(tenant) => vec![
                ("X-Tenure-Principal-Id", "demo-user"),
                ("X-Tenure-Principal-Tenant", tenant),
            ],
            Who::TenantOnly(tenant) => vec![("X-Tenure-Principal-Tenant", tenant)],
            Who::IdOnly => vec![("X-Tenure-Principal-Id", "demo-user")],
            Who::Nobody => vec![],
        };
        let body = case
            .body
            .as_ref()
            .map(|body| serde_json::to_vec(&substitute(body, &vars)).unwrap());
        let (status, _, bytes) = http_request(case.method, &format!("{url}{path}"), &headers, body)
            .await
            .unwrap_or_else(|error| panic!("{}: {error}", case.name));
        let answer: Value = serde_json::from_slice(&bytes).unwrap_or_else(|error| {
            panic!(
                "{}: answer is not JSON ({error}): {}",
                case.name,
                String::from_utf8_lossy(&bytes)
            )
        });
        println!("{} -> {status} {answer}", case.name);
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            assert_eq!(
                status, case.status,
                "{}: HTTP status {status}, expected {}; answer {answer}",
                case.name, case.status
            );
            for (pointer, want) in &case.fields {
                check(case.name, pointer, want, &answer, &vars);
            }
        }));
        if let Err(panic) = outcome {
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .unwrap_or_else(|| "(no message)".into());
            failures.push(message);
        }
        for (name, pointer) in &case.capture {
            if let Some(value) = answer.pointer(pointer) {
                vars.insert(name, value.clone());
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} documented examples differ from Tenure:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}
