//! The gateway's unit tests: routes, error shapes, TTLs, extractors, limits, against a stub
//! service or a one-node cluster.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::cast_possible_truncation,
    clippy::result_large_err
)]

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::Mutex;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};
use tenure_core::{GroupId, ListPage};
use tenure_proto::client::{GetResult, LeaseResult, NodeAddress, RoutingTable};
use tokio::sync::oneshot;

use super::*;

const TOKEN: &str = "token-of-acme";
const DEFAULT_TIMEOUT: Duration = Duration::from_millis(5_000);

/// A scripted stand-in for the node.
struct Fake {
    tokens: HashMap<String, Principal>,
    insecure: bool,
    ready: bool,
    body_bytes_max: usize,
    groups: u32,
    /// Views per group (any tenant), in grant order.
    leases: Vec<Vec<LeaseView>>,
    /// Most views one native List page returns, whatever the page size asked.
    group_page_max: usize,
    /// Answers to lease operations and Get, in order.
    script: Mutex<VecDeque<Result<ResponseBody, WireError>>>,
    /// How long lease operations take.
    delay: Duration,
    calls: Mutex<Vec<(RequestContext, RequestBody)>>,
}

impl Default for Fake {
    fn default() -> Self {
        let mut tokens = HashMap::new();
        tokens.insert(
            TOKEN.to_owned(),
            Principal {
                principal_id: "svc-acme".into(),
                tenant_id: "acme".into(),
            },
        );
        Fake {
            tokens,
            insecure: false,
            ready: true,
            body_bytes_max: 1_024,
            groups: 3,
            leases: vec![Vec::new(); 3],
            group_page_max: 1_000,
            script: Mutex::new(VecDeque::new()),
            delay: Duration::ZERO,
            calls: Mutex::new(Vec::new()),
        }
    }
}

impl Fake {
    fn answer(self, result: Result<ResponseBody, WireError>) -> Self {
        self.script.lock().unwrap().push_back(result);
        self
    }

    fn calls(&self) -> Vec<(RequestContext, RequestBody)> {
        self.calls.lock().unwrap().clone()
    }

    fn lease_calls(&self) -> Vec<(RequestContext, RequestBody)> {
        self.calls()
            .into_iter()
            .filter(|(_, body)| !matches!(body, RequestBody::Routing))
            .collect()
    }

    fn list(&self, group_id: u32, request: &ListRequest) -> Result<ResponseBody, WireError> {
        let views: Vec<&LeaseView> = self.leases[group_id as usize]
            .iter()
            .filter(|view| view.key.tenant_id == request.tenant_id)
            .filter(|view| request.status.is_none_or(|status| view.status == status))
            .collect();
        let start: usize = match &request.page_token {
            None => 0,
            Some(text) => text
                .parse()
                .map_err(|_| WireError::new(ErrorCode::InvalidArgument, "bad inner token"))?,
        };
        let take = (request.page_size as usize).min(self.group_page_max);
        let end = (start + take).min(views.len());
        Ok(ResponseBody::List(ListPage {
            leases: views[start..end]
                .iter()
                .map(|view| (*view).clone())
                .collect(),
            next_page_token: (end < views.len()).then(|| end.to_string()),
        }))
    }
}

impl Backend for Fake {
    fn handle(
        &self,
        ctx: RequestContext,
        body: RequestBody,
    ) -> BoxFuture<'_, Result<ResponseBody, WireError>> {
        Box::pin(async move {
            self.calls.lock().unwrap().push((ctx, body.clone()));
            match body {
                RequestBody::Routing => Ok(ResponseBody::Routing(RoutingTable {
                    placement_version: 1,
                    slot_groups: (0..self.groups).collect(),
                    groups: self.groups,
                    nodes: Vec::new(),
                    leaders: Vec::new(),
                    nodes_version: 0,
                })),
                RequestBody::List { group_id, request } => self.list(group_id, &request),
                _ => {
                    tokio::time::sleep(self.delay).await;
                    let next = self.script.lock().unwrap().pop_front();
                    next.unwrap_or_else(|| {
                        Err(WireError::new(ErrorCode::Internal, "unscripted request"))
                    })
                }
            }
        })
    }

    fn authenticate_bearer(&self, token: &str) -> Result<Principal, WireError> {
        self.tokens
            .get(token)
            .cloned()
            .ok_or_else(|| WireError::new(ErrorCode::Unauthorized, "unknown bearer token"))
    }

    fn insecure_dev_mode(&self) -> bool {
        self.insecure
    }

    fn readiness(&self) -> Readiness {
        Readiness {
            ready: self.ready,
            groups: self.groups,
            groups_with_leader: if self.ready { self.groups } else { 0 },
            groups_led: 1,
            shutting_down: false,
            storage_failure: None,
        }
    }

    fn render_metrics(&self) -> String {
        "# TYPE tenure_requests_total counter\ntenure_requests_total 7\n".into()
    }

    fn request_timeout(&self) -> Duration {
        DEFAULT_TIMEOUT
    }

    fn http_body_bytes_max(&self) -> usize {
        self.body_bytes_max
    }

    fn http_body_read_timeout(&self) -> Duration {
        Duration::from_secs(5)
    }

    fn node_id(&self) -> u64 {
        7
    }

    fn fault_controls(&self) -> Option<Arc<FaultControls>> {
        None
    }
}

struct Harness {
    addr: SocketAddr,
    fake: Arc<Fake>,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    text: String,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_str(&self.text)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.text))
    }

    /// Asserts the contract's error shape and returns the body.
    fn error(&self, status: StatusCode, code: &str) -> Value {
        assert_eq!(self.status, status, "{}", self.text);
        let body = self.json();
        assert_eq!(body["code"], code, "{body}");
        assert!(body["message"].as_str().is_some_and(|m| !m.is_empty()));
        assert!(body["retryable"].is_boolean());
        assert!(body.get("leader_hint").is_some(), "{body}");
        assert!(
            self.headers[header::CONTENT_TYPE]
                .to_str()
                .unwrap()
                .starts_with("application/json")
        );
        body
    }
}

async fn start(fake: Fake) -> Harness {
    let fake = Arc::new(fake);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let app = router_with(fake.clone());
    let task = tokio::spawn(serve_router(
        listener,
        app,
        ServerLimits::default(),
        async move {
            let _ = stopped.await;
        },
    ));
    Harness {
        addr,
        fake,
        stop: Some(stop),
        task,
    }
}

impl Harness {
    async fn send(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Reply {
        let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
        let mut request = hyper::Request::builder()
            .method(method)
            .uri(format!("http://{}{path}", self.addr));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request
            .body(Full::new(Bytes::from(body.to_owned())))
            .unwrap();
        let response = client.request(request).await.unwrap();
        let status = response.status();
        let headers = response.headers().clone();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        Reply {
            status,
            headers,
            text: String::from_utf8(bytes.to_vec()).unwrap(),
        }
    }

    async fn post(&self, path: &str, body: &Value) -> Reply {
        self.send(
            "POST",
            path,
            &[
                ("authorization", &format!("Bearer {TOKEN}")),
                ("content-type", "application/json"),
            ],
            &body.to_string(),
        )
        .await
    }

    async fn get(&self, path: &str) -> Reply {
        self.send(
            "GET",
            path,
            &[("authorization", &format!("Bearer {TOKEN}"))],
            "",
        )
        .await
    }

    async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .expect("graceful shutdown finishes")
            .unwrap()
            .unwrap();
    }
}

fn lease_id() -> LeaseId {
    LeaseId {
        group_id: GroupId(3),
        sequence: 42,
    }
}

fn grant(created: bool) -> LeaseGrant {
    LeaseGrant {
        lease_id: lease_id(),
        fencing_token: 42,
        log_time_ms: 10_000,
        expires_at_ms: 40_000,
        ttl_ms: 30_000,
        created,
    }
}

fn lease_ok(reply: LeaseReply) -> Result<ResponseBody, WireError> {
    Ok(ResponseBody::Lease(LeaseResult {
        reply,
        replayed: false,
        group_id: 3,
        replay: None,
    }))
}

fn view(tenant: &str, resource: &str, sequence: u64, status: LeaseStatus) -> LeaseView {
    let active = status == LeaseStatus::Active;
    LeaseView {
        key: ResourceKey::new(tenant, resource),
        lease_id: LeaseId {
            group_id: GroupId(0),
            sequence,
        },
        holder_id: format!("holder-{sequence}"),
        status,
        fencing_token: sequence,
        expires_at_ms: 50_000,
        remaining_ttl_ms: if active { 20_000 } else { 0 },
        ttl_ms: 30_000,
        version: 1,
        session_id: None,
    }
}

fn acquire_body() -> Value {
    json!({
        "tenant_id": "acme",
        "resource_id": "db",
        "holder_id": "w1",
        "ttl_seconds": 1.5,
        "request_id": "r1",
    })
}

fn now_plus(ms: u64) -> String {
    rfc3339_millis(add_ms(SystemTime::now(), ms))
}

#[tokio::test]
async fn acquire_builds_the_request_and_maps_the_grant() {
    let harness = start(Fake::default().answer(lease_ok(LeaseReply::Acquired(grant(true))))).await;
    let before = now_plus(30_000);
    let reply = harness.post(ACQUIRE_PATH, &acquire_body()).await;
    let after = now_plus(30_000);
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    let body = reply.json();
    assert_eq!(body["lease_id"], "00000003-000000000000002a");
    assert_eq!(body["fencing_token"], 42);
    assert_eq!(body["created"], true);
    assert_eq!(body["ttl_ms"], 30_000);
    assert_eq!(body["replayed"], false);
    assert_eq!(body["group_id"], 3);
    assert!(body.get("renewed").is_none());
    let expiry = body["expiry_time"].as_str().unwrap();
    assert!(
        before.as_str() <= expiry && expiry <= after.as_str(),
        "{expiry}"
    );

    let calls = harness.fake.lease_calls();
    assert_eq!(calls.len(), 1);
    let (ctx, request) = &calls[0];
    assert!(ctx.flags.forward);
    assert!(!ctx.flags.stale_read);
    assert_eq!(ctx.principal.tenant_id, "acme");
    assert_eq!(ctx.principal.principal_id, "svc-acme");
    assert_eq!(ctx.timeout, DEFAULT_TIMEOUT);
    assert_eq!(
        request,
        &RequestBody::Lease(LeaseOp::Acquire(AcquireRequest {
            key: ResourceKey::new("acme", "db"),
            holder_id: "w1".into(),
            ttl_ms: 1_500,
            request_id: "r1".into(),
        }))
    );
    harness.shutdown().await;
}

#[tokio::test]
async fn renew_and_release_map_their_replies() {
    let receipt = tenure_core::ReleaseReceipt {
        lease_id: lease_id(),
        fencing_token: 42,
        released_at_ms: 12_345,
    };
    let fake = Fake::default()
        .answer(lease_ok(LeaseReply::Renewed(grant(false))))
        .answer(lease_ok(LeaseReply::Released(receipt)));
    let harness = start(fake).await;
    let renew = harness
        .post(
            RENEW_PATH,
            &json!({"tenant_id": "acme", "resource_id": "db", "holder_id": "w1",
                    "lease_id": "00000003-000000000000002a", "ttl_ms": 250,
                    "request_id": "r2"}),
        )
        .await;
    assert_eq!(renew.status, StatusCode::OK, "{}", renew.text);
    let body = renew.json();
    assert_eq!(body["renewed"], true);
    assert_eq!(body["lease_id"], "00000003-000000000000002a");
    assert_eq!(body["fencing_token"], 42);
    assert!(body.get("created").is_none());
    assert!(body["expiry_time"].as_str().unwrap().ends_with('Z'));

    let release = harness
        .post(
            RELEASE_PATH,
            &json!({"tenant_id": "acme", "resource_id": "db", "holder_id": "w1",
                    "lease_id": "00000003-000000000000002a", "request_id": "r3"}),
        )
        .await;
    assert_eq!(release.status, StatusCode::OK, "{}", release.text);
    let body = release.json();
    assert_eq!(body["released"], true);
    assert_eq!(body["fencing_token"], 42);
    assert_eq!(body["released_at_log_ms"], 12_345);
    assert_eq!(body["lease_id"], "00000003-000000000000002a");
    assert_eq!(body["expiry_time"].as_str().unwrap().len(), 24);

    let calls = harness.fake.lease_calls();
    assert_eq!(
        calls[0].1,
        RequestBody::Lease(LeaseOp::Renew(RenewRequest {
            key: ResourceKey::new("acme", "db"),
            lease_id: lease_id(),
            holder_id: "w1".into(),
            ttl_ms: 250,
            request_id: "r2".into(),
        }))
    );
    assert_eq!(
        calls[1].1,
        RequestBody::Lease(LeaseOp::Release(ReleaseRequest {
            key: ResourceKey::new("acme", "db"),
            lease_id: lease_id(),
            holder_id: "w1".into(),
            request_id: "r3".into(),
        }))
    );
    assert!(calls.iter().all(|(ctx, _)| ctx.flags.forward));
    harness.shutdown().await;
}

#[tokio::test]
async fn transfer_builds_the_request_and_maps_the_new_holders_grant() {
    let receipt = tenure_core::TransferReceipt {
        released: tenure_core::ReleaseReceipt {
            lease_id: LeaseId {
                group_id: tenure_core::GroupId(3),
                sequence: 41,
            },
            fencing_token: 41,
            released_at_ms: 12_345,
        },
        grant: grant(true),
    };
    let harness =
        start(Fake::default().answer(lease_ok(LeaseReply::Transferred(Box::new(receipt))))).await;
    let reply = harness
        .post(
            TRANSFER_PATH,
            &json!({"tenant_id": "acme", "resource_id": "db", "holder_id": "w1",
                    "lease_id": "00000003-0000000000000029", "new_holder_id": "w2",
                    "ttl_seconds": 2.5, "request_id": "r4"}),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    let body = reply.json();
    assert_eq!(body["lease_id"], "00000003-000000000000002a");
    assert_eq!(body["fencing_token"], 42);
    assert_eq!(body["holder_id"], "w2");
    assert_eq!(body["created"], true);
    assert_eq!(body["previous_lease_id"], "00000003-0000000000000029");
    assert_eq!(body["previous_fencing_token"], 41);
    assert!(body["expiry_time"].as_str().unwrap().ends_with('Z'));
    let calls = harness.fake.lease_calls();
    assert_eq!(
        calls[0].1,
        RequestBody::Lease(LeaseOp::Transfer(tenure_core::TransferRequest {
            key: ResourceKey::new("acme", "db"),
            lease_id: LeaseId {
                group_id: tenure_core::GroupId(3),
                sequence: 41,
            },
            holder_id: "w1".into(),
            new_holder_id: "w2".into(),
            ttl_ms: 2_500,
            request_id: "r4".into(),
        }))
    );
    // A body without the new holder is refused before anything is called.
    let missing = harness
        .post(
            TRANSFER_PATH,
            &json!({"tenant_id": "acme", "resource_id": "db", "holder_id": "w1",
                    "lease_id": "00000003-0000000000000029", "ttl_ms": 2_500,
                    "request_id": "r5"}),
        )
        .await;
    assert_eq!(missing.status, StatusCode::BAD_REQUEST, "{}", missing.text);
    assert_eq!(harness.fake.lease_calls().len(), 1);
    harness.shutdown().await;
}

#[tokio::test]
async fn check_fence_builds_the_request_and_maps_the_verdict() {
    let verdict = |current, status, latest: Option<u64>, remaining_ttl_ms| {
        Ok(ResponseBody::FenceChecked(
            tenure_proto::client::FenceCheckResult {
                verdict: tenure_core::FenceVerdict {
                    current,
                    status,
                    latest_fencing_token: latest,
                    remaining_ttl_ms,
                },
                log_time_ms: 77_000,
                group_id: 3,
            },
        ))
    };
    let harness = start(
        Fake::default()
            .answer(verdict(true, LeaseStatus::Active, Some(42), 1_500))
            .answer(verdict(false, LeaseStatus::Active, Some(43), 0))
            .answer(verdict(false, LeaseStatus::Absent, None, 0)),
    )
    .await;
    let check =
        |token: u64| json!({"tenant_id": "acme", "resource_id": "db", "fencing_token": token});
    let current = harness.post(CHECK_FENCE_PATH, &check(42)).await;
    assert_eq!(current.status, StatusCode::OK, "{}", current.text);
    let body = current.json();
    assert_eq!(body["current"], true);
    assert_eq!(body["fencing_token"], 42);
    assert_eq!(body["status"], "ACTIVE");
    assert_eq!(body["latest_fencing_token"], 42);
    assert_eq!(body["remaining_ttl_ms"], 1_500);
    assert_eq!(body["group_id"], 3);
    assert_eq!(body["log_time_ms"], 77_000);
    // Superseded: a newer grant holds the resource. Not an error: a verdict.
    let superseded = harness.post(CHECK_FENCE_PATH, &check(42)).await;
    assert_eq!(superseded.status, StatusCode::OK, "{}", superseded.text);
    assert_eq!(superseded.json()["current"], false);
    assert_eq!(superseded.json()["latest_fencing_token"], 43);
    let absent = harness.post(CHECK_FENCE_PATH, &check(7)).await;
    assert_eq!(absent.json()["status"], "ABSENT");
    assert_eq!(absent.json()["latest_fencing_token"], Value::Null);
    let calls = harness.fake.lease_calls();
    assert_eq!(
        calls[0].1,
        RequestBody::CheckFence {
            key: ResourceKey::new("acme", "db"),
            fencing_token: 42,
        }
    );
    // Never a stale read.
    assert!(!calls[0].0.flags.stale_read);
    // A token that is not a non-negative integer is refused before anything is called.
    let bad = harness
        .post(
            CHECK_FENCE_PATH,
            &json!({"tenant_id": "acme", "resource_id": "db", "fencing_token": "42"}),
        )
        .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{}", bad.text);
    assert_eq!(harness.fake.lease_calls().len(), 3);
    harness.shutdown().await;
}

#[tokio::test]
async fn session_routes_build_their_requests_and_shape_the_answers() {
    use tenure_core::{
        GroupId, SessionAcquireRequest, SessionGrant, SessionId, SessionOpenRequest,
        SessionReceipt, SessionRequest,
    };
    let session = SessionId(0xabc);
    let kept = |created| {
        Ok(ResponseBody::Lease(LeaseResult {
            reply: LeaseReply::SessionKept(SessionGrant {
                session_id: session,
                group_id: GroupId(2),
                log_time_ms: 10_000,
                expires_at_ms: 40_000,
                ttl_ms: 30_000,
                created,
                bound_leases: 5,
            }),
            replayed: false,
            group_id: 2,
            replay: None,
        }))
    };
    let closed = Ok(ResponseBody::Lease(LeaseResult {
        reply: LeaseReply::SessionClosed(SessionReceipt {
            session_id: session,
            group_id: GroupId(2),
            closed_at_ms: 12_000,
            leases_ended: 5,
        }),
        replayed: false,
        group_id: 2,
        replay: None,
    }));
    let acquired = Ok(ResponseBody::Lease(LeaseResult {
        reply: LeaseReply::Acquired(LeaseGrant {
            lease_id: LeaseId {
                group_id: GroupId(2),
                sequence: 9,
            },
            fencing_token: 9,
            log_time_ms: 11_000,
            expires_at_ms: 40_000,
            ttl_ms: 30_000,
            created: true,
        }),
        replayed: false,
        group_id: 2,
        replay: None,
    }));
    let harness = start(
        Fake::default()
            .answer(kept(true))
            .answer(kept(false))
            .answer(acquired)
            .answer(closed),
    )
    .await;
    let id = format!("{session}");
    let opened = harness
        .post(
            SESSION_OPEN_PATH,
            &json!({"tenant_id": "acme", "session_id": id, "owner_id": "w", "group_id": 2, "ttl_seconds": 30}),
        )
        .await;
    assert_eq!(opened.status, StatusCode::OK, "{}", opened.text);
    let body = opened.json();
    assert_eq!(body["session_id"], id.as_str());
    assert_eq!(body["created"], true);
    assert_eq!(body["remaining_ttl_ms"], 30_000);
    assert_eq!(body["bound_leases"], 5);
    let reference = json!({"tenant_id": "acme", "session_id": id, "owner_id": "w", "group_id": 2});
    let kept_alive = harness.post(SESSION_KEEPALIVE_PATH, &reference).await;
    assert_eq!(kept_alive.status, StatusCode::OK, "{}", kept_alive.text);
    assert_eq!(kept_alive.json()["created"], false);
    let acquire = harness
        .post(
            SESSION_ACQUIRE_PATH,
            &json!({"tenant_id": "acme", "resource_id": "db", "session_id": id, "holder_id": "w", "request_id": "r1"}),
        )
        .await;
    assert_eq!(acquire.status, StatusCode::OK, "{}", acquire.text);
    assert_eq!(acquire.json()["session_id"], id.as_str());
    assert_eq!(acquire.json()["fencing_token"], 9);
    assert_eq!(acquire.json()["group_id"], 2);
    let close = harness.post(SESSION_CLOSE_PATH, &reference).await;
    assert_eq!(close.status, StatusCode::OK, "{}", close.text);
    assert_eq!(close.json()["leases_ended"], 5);
    let calls = harness.fake.lease_calls();
    let request = SessionRequest {
        tenant_id: "acme".into(),
        group_id: GroupId(2),
        session_id: session,
        owner_id: "w".into(),
    };
    assert_eq!(
        calls[0].1,
        RequestBody::Lease(LeaseOp::SessionOpen(SessionOpenRequest {
            tenant_id: "acme".into(),
            group_id: GroupId(2),
            session_id: session,
            owner_id: "w".into(),
            ttl_ms: 30_000,
        }))
    );
    assert_eq!(
        calls[1].1,
        RequestBody::Lease(LeaseOp::SessionKeepAlive(request.clone()))
    );
    assert_eq!(
        calls[2].1,
        RequestBody::Lease(LeaseOp::AcquireInSession(SessionAcquireRequest {
            key: ResourceKey::new("acme", "db"),
            holder_id: "w".into(),
            session_id: session,
            request_id: "r1".into(),
        }))
    );
    assert_eq!(
        calls[3].1,
        RequestBody::Lease(LeaseOp::SessionClose(request))
    );
    // A session id that is not 32 hex digits is refused before anything is called.
    let bad = harness
        .post(
            SESSION_KEEPALIVE_PATH,
            &json!({"tenant_id": "acme", "session_id": "xyz", "owner_id": "w", "group_id": 2}),
        )
        .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{}", bad.text);
    // Another tenant's session: refused by the tenant check.
    let other = harness
        .post(
            SESSION_CLOSE_PATH,
            &json!({"tenant_id": "globex", "session_id": id, "owner_id": "w", "group_id": 2}),
        )
        .await;
    assert_eq!(other.status, StatusCode::FORBIDDEN, "{}", other.text);
    assert_eq!(harness.fake.lease_calls().len(), 4);
    harness.shutdown().await;
}

#[test]
fn ttl_seconds_convert_to_milliseconds_exactly() {
    let ms = |text: &str| seconds_to_ms(&serde_json::from_str(text).unwrap()).ok();
    assert_eq!(ms("30"), Some(30_000));
    assert_eq!(ms("1.5"), Some(1_500));
    assert_eq!(ms("0.25"), Some(250));
    assert_eq!(ms("0.001"), Some(1));
    assert_eq!(ms("1.005"), Some(1_005));
    assert_eq!(ms("1e-3"), Some(1));
    assert_eq!(ms("1.5e2"), Some(150_000));
    assert_eq!(ms("0"), Some(0));
    assert_eq!(ms("0.0"), Some(0));
    assert_eq!(ms("3600.000"), Some(3_600_000));
    assert_eq!(ms("0.0005"), None, "sub-millisecond");
    assert_eq!(ms("1.0001"), None, "sub-millisecond");
    assert_eq!(ms("-1"), None);
    assert_eq!(ms("-0.5"), None);
    assert_eq!(ms("1e300"), None);
    assert_eq!(
        ms("18446744073709551615"),
        None,
        "overflows u64 milliseconds"
    );
    assert_eq!(ms("1.9e16"), None, "overflows u64 milliseconds");
    assert_eq!(
        decimal_seconds_to_ms("18446744073709551.615"),
        Some(u64::MAX)
    );
    assert_eq!(decimal_seconds_to_ms("18446744073709551.616"), None);
    assert_eq!(decimal_seconds_to_ms("1e-400"), None);
    assert_eq!(decimal_seconds_to_ms("abc"), None);
    assert_eq!(decimal_seconds_to_ms(".5"), None);

    assert_eq!(ttl_from_json(None, Some(7)).unwrap(), 7);
    assert!(ttl_from_json(None, None).is_err());
    let one: serde_json::Number = serde_json::from_str("1").unwrap();
    assert!(ttl_from_json(Some(&one), Some(1_000)).is_err());
}

#[tokio::test]
async fn ttl_must_be_given_exactly_once_and_exactly() {
    let harness = start(Fake::default()).await;
    let cases = [
        json!({"tenant_id": "acme", "resource_id": "db", "holder_id": "w1", "request_id": "r"}),
        json!({"tenant_id": "acme", "resource_id": "db", "holder_id": "w1", "request_id": "r",
               "ttl_seconds": 1, "ttl_ms": 1000}),
        json!({"tenant_id": "acme", "resource_id": "db", "holder_id": "w1", "request_id": "r",
               "ttl_seconds": -3}),
        json!({"tenant_id": "acme", "resource_id": "db", "holder_id": "w1", "request_id": "r",
               "ttl_seconds": 0.0001}),
        json!({"tenant_id": "acme", "resource_id": "db", "holder_id": "w1", "request_id": "r",
               "ttl_ms": -5}),
        json!({"tenant_id": "acme", "resource_id": "db", "holder_id": "w1", "request_id": "r",
               "ttl_seconds": "30"}),
    ];
    for case in cases {
        let reply = harness.post(ACQUIRE_PATH, &case).await;
        let body = reply.error(StatusCode::BAD_REQUEST, "INVALID_ARGUMENT");
        assert_eq!(body["retryable"], false);
    }
    assert!(harness.fake.lease_calls().is_empty());
    harness.shutdown().await;
}

#[tokio::test]
async fn bad_bodies_get_the_contract_error_shape() {
    let harness = start(Fake::default()).await;
    let auth = format!("Bearer {TOKEN}");
    let json_headers = [
        ("authorization", auth.as_str()),
        ("content-type", "application/json"),
    ];
    for body in [
        "{",
        "not json",
        r#"{"tenant_id": "acme"}"#,
        r#"{"tenant_id": 5, "resource_id": "db", "holder_id": "w1", "ttl_ms": 1, "request_id": "r"}"#,
        "[]",
    ] {
        let reply = harness
            .send("POST", ACQUIRE_PATH, &json_headers, body)
            .await;
        let error = reply.error(StatusCode::BAD_REQUEST, "INVALID_ARGUMENT");
        assert!(
            error["message"].as_str().unwrap().contains("JSON"),
            "{error}"
        );
    }
    let missing = harness
        .send(
            "POST",
            ACQUIRE_PATH,
            &json_headers,
            r#"{"tenant_id": "acme", "resource_id": "db", "holder_id": "w1", "ttl_ms": 1}"#,
        )
        .await
        .error(StatusCode::BAD_REQUEST, "INVALID_ARGUMENT");
    assert!(missing["message"].as_str().unwrap().contains("request_id"));

    let valid = acquire_body().to_string();
    let text_plain = harness
        .send(
            "POST",
            ACQUIRE_PATH,
            &[
                ("authorization", auth.as_str()),
                ("content-type", "text/plain"),
            ],
            &valid,
        )
        .await;
    text_plain.error(StatusCode::UNSUPPORTED_MEDIA_TYPE, "INVALID_ARGUMENT");
    let no_type = harness
        .send(
            "POST",
            ACQUIRE_PATH,
            &[("authorization", auth.as_str())],
            &valid,
        )
        .await;
    no_type.error(StatusCode::UNSUPPORTED_MEDIA_TYPE, "INVALID_ARGUMENT");

    let mut big = acquire_body();
    big["holder_id"] = Value::String("h".repeat(4_000));
    let too_large = harness
        .send("POST", ACQUIRE_PATH, &json_headers, &big.to_string())
        .await
        .error(StatusCode::PAYLOAD_TOO_LARGE, "INVALID_ARGUMENT");
    assert!(too_large["message"].as_str().unwrap().contains("1024"));

    let bad_lease_id = harness
        .post(
            RELEASE_PATH,
            &json!({"tenant_id": "acme", "resource_id": "db", "holder_id": "w1",
                    "lease_id": "42", "request_id": "r"}),
        )
        .await
        .error(StatusCode::BAD_REQUEST, "INVALID_ARGUMENT");
    assert!(
        bad_lease_id["message"]
            .as_str()
            .unwrap()
            .contains("lease_id")
    );
    assert!(harness.fake.lease_calls().is_empty());
    harness.shutdown().await;
}

#[tokio::test]
async fn unknown_routes_and_wrong_methods_answer_in_json() {
    let harness = start(Fake::default()).await;
    let reply = harness.get("/v1/nope?x=1").await;
    let body = reply.error(StatusCode::NOT_FOUND, "NOT_FOUND");
    assert!(
        body["message"].as_str().unwrap().contains("GET /v1/nope"),
        "{body}"
    );

    let reply = harness.get(ACQUIRE_PATH).await;
    reply.error(StatusCode::METHOD_NOT_ALLOWED, "INVALID_ARGUMENT");
    assert!(
        reply.headers[header::ALLOW]
            .to_str()
            .unwrap()
            .contains("POST")
    );

    let reply = harness.send("DELETE", "/v1/leases/acme/db", &[], "").await;
    reply.error(StatusCode::METHOD_NOT_ALLOWED, "INVALID_ARGUMENT");
    let reply = harness.send("POST", HEALTHZ_PATH, &[], "").await;
    reply.error(StatusCode::METHOD_NOT_ALLOWED, "INVALID_ARGUMENT");
    harness.shutdown().await;
}

#[tokio::test]
async fn authentication_and_tenant_isolation() {
    let harness = start(Fake::default().answer(lease_ok(LeaseReply::Acquired(grant(true))))).await;
    let body = acquire_body().to_string();
    let json_type = ("content-type", "application/json");

    let none = harness
        .send("POST", ACQUIRE_PATH, &[json_type], &body)
        .await
        .error(StatusCode::UNAUTHORIZED, "UNAUTHORIZED");
    assert!(
        none["message"].as_str().unwrap().contains("Bearer"),
        "{none}"
    );

    for value in ["Bearer wrong", "Basic dXNlcjpwdw==", "Bearer", "Bearer  "] {
        harness
            .send(
                "POST",
                ACQUIRE_PATH,
                &[json_type, ("authorization", value)],
                &body,
            )
            .await
            .error(StatusCode::UNAUTHORIZED, "UNAUTHORIZED");
    }

    let headers_only = harness
        .send(
            "POST",
            ACQUIRE_PATH,
            &[
                json_type,
                (PRINCIPAL_TENANT_HEADER, "acme"),
                (PRINCIPAL_ID_HEADER, "me"),
            ],
            &body,
        )
        .await
        .error(StatusCode::UNAUTHORIZED, "UNAUTHORIZED");
    assert!(
        headers_only["message"]
            .as_str()
            .unwrap()
            .contains("insecure")
    );

    let auth = format!("bearer {TOKEN}");
    harness
        .send(
            "POST",
            ACQUIRE_PATH,
            &[
                json_type,
                ("authorization", auth.as_str()),
                ("X-Tenure-Principal-Tenant", "globex"),
            ],
            &body,
        )
        .await
        .error(StatusCode::FORBIDDEN, "FORBIDDEN");

    let mut other_tenant = acquire_body();
    other_tenant["tenant_id"] = json!("globex");
    harness
        .post(ACQUIRE_PATH, &other_tenant)
        .await
        .error(StatusCode::FORBIDDEN, "FORBIDDEN");
    harness
        .get("/v1/leases/globex/db")
        .await
        .error(StatusCode::FORBIDDEN, "FORBIDDEN");
    harness
        .get("/v1/tenants/globex/leases")
        .await
        .error(StatusCode::FORBIDDEN, "FORBIDDEN");
    harness
        .post(
            CHECK_FENCE_PATH,
            &json!({"tenant_id": "globex", "resource_id": "db", "fencing_token": 1}),
        )
        .await
        .error(StatusCode::FORBIDDEN, "FORBIDDEN");
    assert!(
        harness.fake.calls().is_empty(),
        "refused before the service"
    );

    let ok = harness
        .send(
            "POST",
            ACQUIRE_PATH,
            &[
                json_type,
                ("authorization", auth.as_str()),
                ("X-Tenure-Principal-Tenant", "acme"),
                ("X-Tenure-Principal-Id", "ignored"),
            ],
            &body,
        )
        .await;
    assert_eq!(ok.status, StatusCode::OK, "{}", ok.text);
    let calls = harness.fake.lease_calls();
    assert_eq!(calls[0].0.principal.principal_id, "svc-acme");
    harness.shutdown().await;
}

#[tokio::test]
async fn insecure_mode_trusts_principal_headers_only() {
    let fake = Fake {
        insecure: true,
        ..Fake::default()
    }
    .answer(lease_ok(LeaseReply::Acquired(grant(true))));
    let harness = start(fake).await;
    let body = acquire_body().to_string();
    let json_type = ("content-type", "application/json");
    harness
        .send("POST", ACQUIRE_PATH, &[json_type], &body)
        .await
        .error(StatusCode::UNAUTHORIZED, "UNAUTHORIZED");
    let with_id = harness
        .send(
            "POST",
            ACQUIRE_PATH,
            &[
                json_type,
                (PRINCIPAL_TENANT_HEADER, "acme"),
                (PRINCIPAL_ID_HEADER, "alice"),
            ],
            &body,
        )
        .await;
    assert_eq!(with_id.status, StatusCode::OK, "{}", with_id.text);
    let tenant_only = harness
        .send(
            "POST",
            ACQUIRE_PATH,
            &[json_type, (PRINCIPAL_TENANT_HEADER, "acme")],
            &body,
        )
        .await;
    // As Tenure: both principal headers are required.
    tenant_only.error(StatusCode::UNAUTHORIZED, "UNAUTHORIZED");
    harness
        .send(
            "POST",
            ACQUIRE_PATH,
            &[json_type, (PRINCIPAL_ID_HEADER, "alice")],
            &body,
        )
        .await
        .error(StatusCode::UNAUTHORIZED, "UNAUTHORIZED");
    harness
        .send(
            "POST",
            ACQUIRE_PATH,
            &[
                json_type,
                (PRINCIPAL_TENANT_HEADER, "globex"),
                (PRINCIPAL_ID_HEADER, "alice"),
            ],
            &body,
        )
        .await
        .error(StatusCode::FORBIDDEN, "FORBIDDEN");
    let principals: Vec<Principal> = harness
        .fake
        .lease_calls()
        .into_iter()
        .map(|(ctx, _)| ctx.principal)
        .collect();
    assert_eq!(
        principals,
        [Principal {
            principal_id: "alice".into(),
            tenant_id: "acme".into()
        },]
    );
    harness.shutdown().await;
}

#[tokio::test]
async fn service_errors_map_to_status_and_fields() {
    let already_held = WireError::from_lease_error(LeaseError::AlreadyHeld {
        holder_id: "w0".into(),
        remaining_ttl_ms: 1_234,
    });
    let mut rate_limited = WireError::new(ErrorCode::RateLimited, "slow down");
    rate_limited.retry_after_ms = Some(1_500);
    let mut not_leader = WireError::new(ErrorCode::NotLeader, "ask node 2");
    not_leader.leader_hint = Some(NodeAddress {
        node_id: 2,
        client_addr: "10.0.0.2:7401".into(),
        http_url: "http://10.0.0.2:7501".into(),
    });
    not_leader.placement_version = 4;
    let fake = Fake::default()
        .answer(Err(already_held))
        .answer(Err(rate_limited))
        .answer(Err(not_leader))
        .answer(Err(WireError::new(ErrorCode::Overloaded, "full")))
        .answer(Err(WireError::from_lease_error(LeaseError::LeaseExpired {
            lease_id: lease_id(),
        })));
    let harness = start(fake).await;

    let reply = harness.post(ACQUIRE_PATH, &acquire_body()).await;
    let body = reply.error(StatusCode::CONFLICT, "ALREADY_HELD");
    assert_eq!(body["holder_id"], "w0");
    assert_eq!(body["remaining_ttl_ms"], 1_234);
    assert_eq!(body["retryable"], false);
    assert_eq!(body["leader_hint"], Value::Null);
    assert!(body.get("retry_after_ms").is_none());

    let reply = harness.post(ACQUIRE_PATH, &acquire_body()).await;
    let body = reply.error(StatusCode::TOO_MANY_REQUESTS, "RATE_LIMITED");
    assert_eq!(body["retry_after_ms"], 1_500);
    assert_eq!(body["retryable"], true);
    assert_eq!(reply.headers[header::RETRY_AFTER], "2");

    let reply = harness.post(ACQUIRE_PATH, &acquire_body()).await;
    let body = reply.error(StatusCode::CONFLICT, "NOT_LEADER");
    assert_eq!(body["leader_hint"], "http://10.0.0.2:7501");
    assert_eq!(body["placement_version"], 4);
    assert_eq!(body["retryable"], true);

    let reply = harness.post(ACQUIRE_PATH, &acquire_body()).await;
    let body = reply.error(StatusCode::SERVICE_UNAVAILABLE, "OVERLOADED");
    assert_eq!(body["retry_after_ms"], RETRY_AFTER_MS_DEFAULT);
    assert_eq!(reply.headers[header::RETRY_AFTER], "1");

    let reply = harness.post(ACQUIRE_PATH, &acquire_body()).await;
    reply.error(StatusCode::CONFLICT, "LEASE_EXPIRED");
    harness.shutdown().await;
}

#[test]
fn every_code_has_an_error_status() {
    let expected = [
        (ErrorCode::InvalidArgument, 400),
        (ErrorCode::Unauthorized, 401),
        (ErrorCode::Forbidden, 403),
        (ErrorCode::NotFound, 404),
        (ErrorCode::AlreadyHeld, 409),
        (ErrorCode::LeaseExpired, 409),
        (ErrorCode::LeaseMismatch, 409),
        (ErrorCode::QuotaExceeded, 409),
        (ErrorCode::RateLimited, 429),
        (ErrorCode::Overloaded, 503),
        (ErrorCode::NotLeader, 409),
        (ErrorCode::Unavailable, 503),
        (ErrorCode::Internal, 500),
    ];
    assert_eq!(expected.len(), ErrorCode::ALL.len());
    for (code, status) in expected {
        assert_eq!(http_status(code).as_u16(), status, "{code}");
    }
}

#[tokio::test]
async fn get_reports_found_and_absent_leases() {
    let fake = Fake::default()
        .answer(Ok(ResponseBody::Get(GetResult {
            view: Some(view("acme", "a/b", 9, LeaseStatus::Active)),
            log_time_ms: 30_000,
            stale: true,
            group_id: 1,
        })))
        .answer(Ok(ResponseBody::Get(GetResult {
            view: None,
            log_time_ms: 30_000,
            stale: false,
            group_id: 1,
        })));
    let harness = start(fake).await;
    let before = now_plus(20_000);
    let reply = harness.get("/v1/leases/acme/a%2Fb?stale=true").await;
    let after = now_plus(20_000);
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    let body = reply.json();
    assert_eq!(body["found"], true);
    assert_eq!(body["stale"], true);
    let lease = &body["lease"];
    assert_eq!(lease["tenant_id"], "acme");
    assert_eq!(lease["resource_id"], "a/b");
    assert_eq!(lease["lease_id"], "00000000-0000000000000009");
    assert_eq!(lease["holder_id"], "holder-9");
    assert_eq!(lease["status"], "ACTIVE");
    assert_eq!(lease["fencing_token"], 9);
    // Token 9 in the high half, one change of this lease in the low half.
    assert_eq!(lease["version"], (9u64 << 32) + 1);
    let expiry = lease["expiry_time"].as_str().unwrap();
    assert!(
        before.as_str() <= expiry && expiry <= after.as_str(),
        "{expiry}"
    );

    let reply = harness.get("/v1/leases/acme/none").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    let body = reply.json();
    assert_eq!(body["found"], false);
    assert_eq!(
        body["lease"],
        json!({
            "tenant_id": "acme", "resource_id": "none", "lease_id": "", "holder_id": "",
            "status": "ABSENT", "expiry_time": "", "fencing_token": 0, "version": 0,
            "ttl_ms": 0, "remaining_ttl_ms": 0, "expires_at_log_ms": 0,
        })
    );

    let calls = harness.fake.lease_calls();
    assert_eq!(
        calls[0].1,
        RequestBody::Get {
            key: ResourceKey::new("acme", "a/b")
        }
    );
    assert!(calls[0].0.flags.stale_read && calls[0].0.flags.forward);
    assert!(!calls[1].0.flags.stale_read && calls[1].0.flags.forward);

    harness
        .get("/v1/leases/acme/db?stale=maybe")
        .await
        .error(StatusCode::BAD_REQUEST, "INVALID_ARGUMENT");
    harness.shutdown().await;
}

#[test]
fn inactive_views_estimate_their_expiry_in_the_past() {
    let arrived = UNIX_EPOCH + Duration::from_secs(1_000);
    let expired = view("acme", "db", 1, LeaseStatus::Expired);
    // Expired at log time 50 s, read at log time 53.5 s: 3.5 s before arrival.
    let json = lease_json(expired.clone(), arrived, Some(53_500));
    assert_eq!(json.expiry_time, "1970-01-01T00:16:36.500Z");
    let json = lease_json(expired, arrived, None);
    assert_eq!(json.expiry_time, "1970-01-01T00:16:40.000Z");
    let active = view("acme", "db", 1, LeaseStatus::Active);
    let json = lease_json(active, arrived, Some(30_000));
    assert_eq!(json.expiry_time, "1970-01-01T00:17:00.000Z");
}

fn list_fake() -> Fake {
    let mut leases = vec![Vec::new(); 3];
    for sequence in 1..=3 {
        leases[0].push(view(
            "acme",
            &format!("r{sequence}"),
            sequence,
            LeaseStatus::Active,
        ));
    }
    leases[0].push(view("globex", "x", 4, LeaseStatus::Active));
    leases[2].push(view("acme", "r4", 5, LeaseStatus::Expired));
    leases[2].push(view("acme", "r5", 6, LeaseStatus::Active));
    Fake {
        leases,
        group_page_max: 2,
        ..Fake::default()
    }
}

#[tokio::test]
async fn list_walks_every_group_page_by_page() {
    let harness = start(list_fake()).await;
    let mut seen = Vec::new();
    let mut token: Option<String> = None;
    let mut pages = 0;
    loop {
        let path = match &token {
            None => format!("{}?page_size=2", "/v1/tenants/acme/leases"),
            Some(token) => format!("/v1/tenants/acme/leases?page_size=2&page_token={token}"),
        };
        let reply = harness.get(&path).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
        let body = reply.json();
        let leases = body["leases"].as_array().unwrap();
        assert!(leases.len() <= 2);
        for lease in leases {
            assert_eq!(lease["tenant_id"], "acme");
            seen.push(lease["resource_id"].as_str().unwrap().to_owned());
        }
        pages += 1;
        assert!(pages < 10, "listing does not end");
        match &body["next_page_token"] {
            Value::String(next) if next.is_empty() => break,
            Value::String(next) => {
                assert!(next.starts_with('g'), "{next}");
                token = Some(next.clone());
            }
            other => panic!("bad token {other}"),
        }
    }
    assert_eq!(seen, ["r1", "r2", "r3", "r4", "r5"]);

    // One page holds everything with the default size; routing was asked once.
    let reply = harness.get("/v1/tenants/acme/leases").await;
    let body = reply.json();
    assert_eq!(body["leases"].as_array().unwrap().len(), 5);
    assert_eq!(body["next_page_token"], "");
    // filter_status=ANY is no filter (Tenure's enum { ANY, ACTIVE, EXPIRED, RELEASED }).
    let reply = harness
        .get("/v1/tenants/acme/leases?filter_status=ANY")
        .await;
    assert_eq!(reply.json()["leases"].as_array().unwrap().len(), 5);
    let routing_calls = harness
        .fake
        .calls()
        .iter()
        .filter(|(_, body)| matches!(body, RequestBody::Routing))
        .count();
    assert_eq!(routing_calls, 1);

    let reply = harness
        .get("/v1/tenants/acme/leases?filter_status=expired&stale=true")
        .await;
    let body = reply.json();
    assert_eq!(body["leases"].as_array().unwrap().len(), 1);
    assert_eq!(body["leases"][0]["status"], "EXPIRED");
    let last = harness.fake.calls().pop().unwrap();
    match last {
        (ctx, RequestBody::List { request, .. }) => {
            assert_eq!(request.status, Some(LeaseStatus::Expired));
            assert!(ctx.flags.stale_read && ctx.flags.forward);
        }
        other => panic!("unexpected {other:?}"),
    }
    harness.shutdown().await;
}

#[tokio::test]
async fn list_rejects_bad_queries() {
    let harness = start(list_fake()).await;
    for query in [
        "filter_status=ABSENT",
        "filter_status=bogus",
        "page_size=0",
        "page_size=abc",
        "page_size=-1",
        "page_token=garbage",
        "page_token=g9:",
        "page_token=gx:1",
    ] {
        harness
            .get(&format!("/v1/tenants/acme/leases?{query}"))
            .await
            .error(StatusCode::BAD_REQUEST, "INVALID_ARGUMENT");
    }
    harness.shutdown().await;
}

#[test]
fn list_cursor_round_trips() {
    let cursor = ListCursor {
        group: 12,
        inner: Some("abc:def".into()),
    };
    assert_eq!(cursor.render(), "g12:abc:def");
    assert_eq!(ListCursor::parse("g12:abc:def", 64).unwrap(), cursor);
    let start = ListCursor {
        group: 3,
        inner: None,
    };
    assert_eq!(ListCursor::parse(&start.render(), 64).unwrap(), start);
    assert!(ListCursor::parse("g64:", 64).is_err());
    assert!(ListCursor::parse("12:x", 64).is_err());
}

#[tokio::test]
async fn timeout_header_lowers_the_timeout_only() {
    let fake = Fake::default()
        .answer(lease_ok(LeaseReply::Acquired(grant(true))))
        .answer(lease_ok(LeaseReply::Acquired(grant(true))));
    let harness = start(fake).await;
    let auth = format!("Bearer {TOKEN}");
    let body = acquire_body().to_string();
    for value in ["250", "999999"] {
        let reply = harness
            .send(
                "POST",
                ACQUIRE_PATH,
                &[
                    ("authorization", auth.as_str()),
                    ("content-type", "application/json"),
                    (TIMEOUT_HEADER, value),
                ],
                &body,
            )
            .await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    }
    for value in ["0", "-1", "soon"] {
        harness
            .send(
                "POST",
                ACQUIRE_PATH,
                &[
                    ("authorization", auth.as_str()),
                    ("content-type", "application/json"),
                    (TIMEOUT_HEADER, value),
                ],
                &body,
            )
            .await
            .error(StatusCode::BAD_REQUEST, "INVALID_ARGUMENT");
    }
    let timeouts: Vec<Duration> = harness
        .fake
        .lease_calls()
        .into_iter()
        .map(|(ctx, _)| ctx.timeout)
        .collect();
    assert_eq!(timeouts, [Duration::from_millis(250), DEFAULT_TIMEOUT]);
    harness.shutdown().await;
}

#[tokio::test]
async fn a_service_that_never_answers_gets_unavailable() {
    let fake = Fake {
        delay: Duration::from_secs(30),
        ..Fake::default()
    };
    let harness = start(fake).await;
    let reply = harness
        .send(
            "POST",
            ACQUIRE_PATH,
            &[
                ("authorization", &format!("Bearer {TOKEN}")),
                ("content-type", "application/json"),
                (TIMEOUT_HEADER, "10"),
            ],
            &acquire_body().to_string(),
        )
        .await;
    let body = reply.error(StatusCode::SERVICE_UNAVAILABLE, "UNAVAILABLE");
    assert_eq!(body["retryable"], true);
    assert!(body["message"].as_str().unwrap().contains("request_id"));
    harness.shutdown().await;
}

#[tokio::test]
async fn operations_routes() {
    let harness = start(Fake::default()).await;
    let reply = harness.send("GET", HEALTHZ_PATH, &[], "").await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.json(), json!({"status": "ok", "node_id": 7}));

    let reply = harness.send("GET", READYZ_PATH, &[], "").await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.json()["ready"], true);
    assert_eq!(reply.json()["groups"], 3);

    let reply = harness.send("GET", METRICS_PATH, &[], "").await;
    assert_eq!(reply.status, StatusCode::OK);
    assert!(
        reply.headers[header::CONTENT_TYPE]
            .to_str()
            .unwrap()
            .starts_with("text/plain; version=0.0.4")
    );
    assert!(reply.text.contains("tenure_requests_total 7"));

    let reply = harness.send("GET", OPENAPI_PATH, &[], "").await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.headers[header::CONTENT_TYPE], "application/json");
    assert_eq!(reply.json()["openapi"], "3.0.3");
    harness.shutdown().await;

    let harness = start(Fake {
        ready: false,
        ..Fake::default()
    })
    .await;
    let reply = harness.send("GET", READYZ_PATH, &[], "").await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(reply.json()["ready"], false);
    assert_eq!(reply.json()["groups_with_leader"], 0);
    harness.shutdown().await;
}

#[tokio::test]
async fn openapi_documents_exactly_the_routes_served() {
    let doc: Value = serde_json::from_str(OPENAPI_JSON).unwrap();
    assert_eq!(doc["openapi"], "3.0.3");
    let paths = doc["paths"].as_object().unwrap();
    for (method, path) in ROUTES {
        assert!(
            paths.get(path).and_then(|item| item.get(method)).is_some(),
            "{method} {path} is not in openapi.json"
        );
    }
    let documented: usize = paths
        .values()
        .map(|item| item.as_object().unwrap().len())
        .sum();
    assert_eq!(
        documented,
        ROUTES.len(),
        "openapi.json documents routes not served"
    );
    let codes: Vec<&str> = doc["components"]["schemas"]["ErrorCode"]["enum"]
        .as_array()
        .unwrap()
        .iter()
        .map(|code| code.as_str().unwrap())
        .collect();
    let expected: Vec<&str> = ErrorCode::ALL.iter().map(|code| code.as_str()).collect();
    assert_eq!(codes, expected);

    // Every listed route is served by the router (not the not-found fallback).
    let harness = start(Fake::default()).await;
    for (method, path) in ROUTES {
        let concrete = path
            .replace("{tenant_id}", "acme")
            .replace("{resource_id}", "db");
        let reply = harness
            .send(&method.to_uppercase(), &concrete, &[], "")
            .await;
        let route_missing =
            reply.status == StatusCode::NOT_FOUND && reply.text.contains("no route for");
        assert!(!route_missing, "{method} {path}: {}", reply.text);
    }
    harness.shutdown().await;
}

#[test]
fn rfc3339_formatting() {
    let at = |ms: u64| rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms));
    assert_eq!(at(0), "1970-01-01T00:00:00.000Z");
    assert_eq!(at(951_782_400_000), "2000-02-29T00:00:00.000Z");
    assert_eq!(at(1_709_251_199_123), "2024-02-29T23:59:59.123Z");
    assert_eq!(at(1_000_000_000_000), "2001-09-09T01:46:40.000Z");
    assert_eq!(at(253_402_300_799_000), "9999-12-31T23:59:59.000Z");
    assert_eq!(
        rfc3339_millis(UNIX_EPOCH - Duration::from_secs(5)),
        "1970-01-01T00:00:00.000Z"
    );
    assert_eq!(
        rfc3339_millis(UNIX_EPOCH + Duration::from_secs(300_000_000_000)),
        "9999-12-31T23:59:59.999Z"
    );
}

#[test]
fn bearer_tokens_parse() {
    assert_eq!(bearer_token("Bearer abc"), Some("abc"));
    assert_eq!(bearer_token("bearer   abc "), Some("abc"));
    assert_eq!(bearer_token("Bearer"), None);
    assert_eq!(bearer_token("Basic abc"), None);
    assert_eq!(bearer_token("Bearer "), None);
}
