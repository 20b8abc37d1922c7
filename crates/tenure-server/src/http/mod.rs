//! The HTTP gateway: the Tenure v1 JSON API (contract section 7) plus health, readiness,
//! Prometheus metrics and the OpenAPI document, served with axum.
//!
//! Every lease route turns its JSON into one [`RequestBody`] and calls [`Service::handle`] with
//! `flags.forward = true`, so any node accepts any request and forwards it to the key's group
//! leader. The gateway itself holds no lease state and makes no decision beyond parsing,
//! authentication and the tenant check; the service checks everything again.
//!
//! Must not depend on: Raft, storage or the groups. This module only calls [`Service`] (through
//! the private `Backend` trait, which unit tests implement with a fake).
//!
//! # Routes
//!
//! | method | path | body / query | answer |
//! |---|---|---|---|
//! | POST | `/v1/leases/acquire` | `{tenant_id, resource_id, holder_id, ttl_seconds \| ttl_ms, request_id}` | `{lease_id, expiry_time, fencing_token, created, ...}` |
//! | POST | `/v1/leases/renew` | `{tenant_id, resource_id, lease_id, holder_id, ttl_seconds \| ttl_ms, request_id}` | `{lease_id, expiry_time, fencing_token, renewed, ...}` |
//! | POST | `/v1/leases/release` | `{tenant_id, resource_id, lease_id, holder_id, request_id}` | `{lease_id, released, expiry_time, fencing_token, ...}` |
//! | POST | `/v1/leases/transfer` | `{tenant_id, resource_id, lease_id, holder_id, new_holder_id, ttl_seconds \| ttl_ms, request_id}` | the new holder's grant `{lease_id, expiry_time, fencing_token, holder_id, previous_lease_id, previous_fencing_token, ...}` |
//! | GET | `/v1/leases/{tenant_id}/{resource_id}` | `?stale=true` | `{found, lease}` |
//! | POST | `/v1/leases/check-fence` | `{tenant_id, resource_id, fencing_token}` | `{current, fencing_token, status, latest_fencing_token, remaining_ttl_ms, group_id, log_time_ms}` |
//! | POST | `/v1/sessions/open` | `{tenant_id, session_id, owner_id, group_id, ttl_seconds \| ttl_ms}` | `{session_id, group_id, created, ttl_ms, remaining_ttl_ms, expiry_time, bound_leases, ...}` |
//! | POST | `/v1/sessions/keepalive` | `{tenant_id, session_id, owner_id, group_id}` | as open |
//! | POST | `/v1/sessions/close` | `{tenant_id, session_id, owner_id, group_id}` | `{session_id, group_id, closed, closed_at_log_ms, leases_ended}` |
//! | POST | `/v1/sessions/acquire` | `{tenant_id, resource_id, session_id, holder_id, request_id}` | the acquire answer with `session_id` (the lease's `group_id` is where the session must be open) |
//! | GET | `/v1/tenants/{tenant_id}/leases` | `?page_size=&page_token=&filter_status=&stale=` | `{leases, next_page_token}` |
//! | GET | `/healthz` | | `{status: "ok", node_id}` |
//! | GET | `/readyz` | | the [`Readiness`] JSON, 200 when ready, else 503 |
//! | GET | `/metrics` | | Prometheus text format 0.0.4 |
//! | GET | `/openapi.json` | | the OpenAPI 3.0.3 document of this API |
//!
//! # TTLs
//!
//! Exactly one of `ttl_seconds` (a JSON number, fractions allowed) and `ttl_ms` (an integer) is
//! required. `ttl_seconds` is converted to milliseconds exactly, from the shortest decimal form
//! of the number: a value that is negative or not a whole number of milliseconds is
//! `INVALID_ARGUMENT` (a ttl is never rounded). The bounds are checked by the group.
//!
//! # `expiry_time`
//!
//! Expiry is decided by log time (contract section 4), which has no relation to any wall clock.
//! `expiry_time` is an RFC 3339 UTC timestamp with millisecond precision *estimated* as this
//! node's wall clock when the request arrived plus the lease's remaining log time: `expires_at -
//! log_time` for a grant or renewal, `remaining_ttl_ms` for an active lease read by Get or List.
//! Counting from the arrival makes the estimate early rather than late. For an inactive lease
//! (expired or released) it is the arrival time, or for Get the arrival time minus the log time
//! elapsed since its expiry. For a replayed request (`replayed: true`) the estimate is counted
//! from the retry, not from the original request: clients should count from their first attempt.
//!
//! # Listing across groups
//!
//! A tenant's leases are spread over all groups, and the native List is per group. The gateway
//! walks groups `0..groups` in order, filling the page from each group's native pages. Its
//! `next_page_token` is `g<group>:<inner>`: the group (decimal) to continue in and that group's
//! own page token (empty to start the group from its beginning); `""` when the listing is
//! complete (as Tenure). A page may hold fewer than `page_size` leases (even none) while the
//! token is not empty. `filter_status` is `ANY` (or absent), `ACTIVE`, `EXPIRED` or `RELEASED`. At most [`LIST_GROUP_CALLS_MAX`] per-group calls are made per request.
//!
//! # Authentication
//!
//! `Authorization: Bearer <token>` is resolved by the service's authenticator. With a token, a
//! `X-Tenure-Principal-Tenant` header, if present, must name the token's tenant (else
//! `FORBIDDEN`); `X-Tenure-Principal-Id` is ignored. Without a token the principal headers are
//! trusted only in insecure development mode, where both are required and non-empty, as Tenure
//! requires them; otherwise the answer is `UNAUTHORIZED`. A principal may only touch its own tenant (`FORBIDDEN`). Health, readiness,
//! metrics and the OpenAPI document need no credentials.
//!
//! # Errors
//!
//! Every error, including bad JSON, a wrong content type, an oversized body, an unknown route and
//! a wrong method, is `{code, message, retryable, leader_hint}` (`leader_hint` is the leader's
//! HTTP URL or `null`), with `retry_after_ms` (and a `Retry-After` header in whole seconds,
//! rounded up) for `RATE_LIMITED` and `OVERLOADED`, `holder_id` and `remaining_ttl_ms` for
//! `ALREADY_HELD`, and `placement_version` when the node reported one. The HTTP status follows
//! the code ([`http_status`]).
//!
//! # Timeouts
//!
//! A request waits at most the node's request timeout, or less when the
//! `X-Tenure-Timeout-Ms` header asks for less (a positive integer; larger values are capped).

use std::future::Future;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::extract::rejection::JsonRejection;
use axum::extract::{DefaultBodyLimit, FromRequest, FromRequestParts, Path, Query, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures_util::future::BoxFuture;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tenure_core::{
    AcquireRequest, ErrorCode, GroupId, LeaseError, LeaseGrant, LeaseId, LeaseOp, LeaseReply,
    LeaseStatus, LeaseView, ListRequest, ReleaseRequest, RenewRequest, ReplayState, ResourceKey,
    SessionAcquireRequest, SessionId, SessionOpenRequest, SessionRequest, TransferRequest,
};
use tenure_proto::client::{
    Principal, RequestBody, RequestFlags, ResponseBody, TOKEN_BYTES_MAX, WireError,
};

use crate::auth;
use crate::fault_control::{FaultControls, FaultSettings};
use crate::request::{RequestContext, Service};
use crate::shared::Readiness;

mod errors;
mod extract;
mod json;
mod lease_handlers;
mod ops_handlers;
mod server;
mod session_handlers;
mod ttl;
mod watch_handlers;

use errors::*;
use extract::*;
use json::*;
use lease_handlers::*;
use ops_handlers::*;
use session_handlers::*;
use ttl::*;
use watch_handlers::watch_events;

pub use server::{ServerLimits, StallIo, serve_router};

/// `POST`: acquire a lease.
pub const ACQUIRE_PATH: &str = "/v1/leases/acquire";
/// `POST`: renew a lease.
pub const RENEW_PATH: &str = "/v1/leases/renew";
/// `POST`: release a lease.
pub const RELEASE_PATH: &str = "/v1/leases/release";
/// `POST`: hand a lease to a new holder in one step (not in Tenure v1: tenure's own route).
pub const TRANSFER_PATH: &str = "/v1/leases/transfer";
/// `POST`: whether a fencing token is its resource's current active grant (not in Tenure v1:
/// tenure's own route).
pub const CHECK_FENCE_PATH: &str = "/v1/leases/check-fence";
/// `POST`: open a session's record in one group (not in Tenure v1: tenure's own route).
pub const SESSION_OPEN_PATH: &str = "/v1/sessions/open";
/// `POST`: keep a session's record in one group alive.
pub const SESSION_KEEPALIVE_PATH: &str = "/v1/sessions/keepalive";
/// `POST`: close a session's record in one group (its leases end).
pub const SESSION_CLOSE_PATH: &str = "/v1/sessions/close";
/// `POST`: acquire a resource bound to a session.
pub const SESSION_ACQUIRE_PATH: &str = "/v1/sessions/acquire";
/// `GET`: a resource's lease.
pub const GET_LEASE_PATH: &str = "/v1/leases/{tenant_id}/{resource_id}";
/// `GET`: a tenant's leases, paged.
pub const LIST_LEASES_PATH: &str = "/v1/tenants/{tenant_id}/leases";
/// `GET`: liveness.
pub const HEALTHZ_PATH: &str = "/healthz";
/// `GET`: readiness.
pub const READYZ_PATH: &str = "/readyz";
/// `GET`: Prometheus metrics.
pub const METRICS_PATH: &str = "/metrics";
/// `GET`: the OpenAPI document.
pub const OPENAPI_PATH: &str = "/openapi.json";
/// `GET`: a tenant's (or, with `?resource=` or `?prefix=`, fewer) lease events as server-sent
/// events, resumable with `Last-Event-ID` or `?after=GROUP:INDEX,...`.
pub const WATCH_PATH: &str = "/v1/tenants/{tenant_id}/watch";
/// `GET`/`POST`: the fault knobs of a node started with `[testing] fault_control` (tests only,
/// not part of the API: every other node answers 404). `POST` takes a
/// [`crate::fault_control::FaultSettings`]; both answer the
/// [`crate::fault_control::FaultState`].
pub const TESTING_FAULTS_PATH: &str = "/testing/faults";

/// Every route of [`router`] as `(method, path)`, paths in axum/OpenAPI template syntax.
pub const ROUTES: [(&str, &str); 16] = [
    ("post", ACQUIRE_PATH),
    ("post", RENEW_PATH),
    ("post", RELEASE_PATH),
    ("post", TRANSFER_PATH),
    ("post", CHECK_FENCE_PATH),
    ("post", SESSION_OPEN_PATH),
    ("post", SESSION_KEEPALIVE_PATH),
    ("post", SESSION_CLOSE_PATH),
    ("post", SESSION_ACQUIRE_PATH),
    ("get", GET_LEASE_PATH),
    ("get", LIST_LEASES_PATH),
    ("get", WATCH_PATH),
    ("get", HEALTHZ_PATH),
    ("get", READYZ_PATH),
    ("get", METRICS_PATH),
    ("get", OPENAPI_PATH),
];

/// The OpenAPI 3.0.3 document served at [`OPENAPI_PATH`].
pub const OPENAPI_JSON: &str = include_str!("../../openapi.json");

/// Header naming the principal (trusted only in insecure development mode).
pub const PRINCIPAL_ID_HEADER: &str = "x-tenure-principal-id";
/// Header naming the principal's tenant (with a token: must match the token's tenant).
pub const PRINCIPAL_TENANT_HEADER: &str = "x-tenure-principal-tenant";
/// Header lowering the request timeout, in milliseconds.
pub const TIMEOUT_HEADER: &str = "x-tenure-timeout-ms";

/// List page size when the query gives none.
pub const LIST_PAGE_SIZE_DEFAULT: u32 = 100;
/// Per-group List calls one `GET /v1/tenants/{tenant_id}/leases` makes at most, beyond one per
/// group (a group may answer a short page when it hits its scan limit).
pub const LIST_GROUP_CALLS_MAX: usize = 64;

/// `retry_after_ms` reported for `RATE_LIMITED` and `OVERLOADED` when the service gave none.
const RETRY_AFTER_MS_DEFAULT: u32 = 1_000;
/// Extra wait beyond the request timeout before the gateway gives up on the service itself (the
/// service enforces the timeout; this only guarantees an answer).
const TIMEOUT_GRACE: Duration = Duration::from_secs(1);
/// Content type of the Prometheus text exposition format.
const METRICS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The HTTP status of an error code.
pub fn http_status(code: ErrorCode) -> StatusCode {
    match code {
        ErrorCode::InvalidArgument => StatusCode::BAD_REQUEST,
        ErrorCode::Unauthorized => StatusCode::UNAUTHORIZED,
        ErrorCode::Forbidden => StatusCode::FORBIDDEN,
        ErrorCode::NotFound => StatusCode::NOT_FOUND,
        // Tenure answers every ownership conflict, a quota refusal and NOT_LEADER with 409.
        ErrorCode::AlreadyHeld
        | ErrorCode::LeaseMismatch
        | ErrorCode::LeaseExpired
        | ErrorCode::QuotaExceeded
        | ErrorCode::NotLeader => StatusCode::CONFLICT,
        ErrorCode::RateLimited => StatusCode::TOO_MANY_REQUESTS,
        ErrorCode::Overloaded | ErrorCode::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        ErrorCode::Internal => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// The gateway's routes, bound to `service`.
pub fn router(service: Service) -> Router {
    router_with(Arc::new(service))
}

/// Serves [`router`] on `listener` until `shutdown` completes, then finishes the requests in
/// flight and returns. The connection caps and timeouts come from the node's `[limits]`
/// ([`ServerLimits::from_config`]).
pub async fn serve(
    listener: tokio::net::TcpListener,
    service: Service,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let limits = ServerLimits::from_config(&service.inner.config.limits);
    serve_router(listener, router(service), limits, shutdown).await
}

/// What the gateway needs of the node: [`Service`] in production, a fake in unit tests.
trait Backend: Send + Sync + 'static {
    fn handle(
        &self,
        ctx: RequestContext,
        body: RequestBody,
    ) -> BoxFuture<'_, Result<ResponseBody, WireError>>;
    // The signature of `Authenticator::authenticate_bearer`.
    #[allow(clippy::result_large_err)]
    fn authenticate_bearer(&self, token: &str) -> Result<Principal, WireError>;
    fn insecure_dev_mode(&self) -> bool;
    fn readiness(&self) -> Readiness;
    fn render_metrics(&self) -> String;
    fn request_timeout(&self) -> Duration;
    fn http_body_bytes_max(&self) -> usize;
    fn http_body_read_timeout(&self) -> Duration;
    fn node_id(&self) -> u64;
    fn fault_controls(&self) -> Option<Arc<FaultControls>>;
}

impl Backend for Service {
    fn handle(
        &self,
        ctx: RequestContext,
        body: RequestBody,
    ) -> BoxFuture<'_, Result<ResponseBody, WireError>> {
        Box::pin(Service::handle(self, ctx, body))
    }

    fn authenticate_bearer(&self, token: &str) -> Result<Principal, WireError> {
        self.authenticator().authenticate_bearer(token)
    }

    fn insecure_dev_mode(&self) -> bool {
        self.authenticator().insecure_dev_mode()
    }

    fn readiness(&self) -> Readiness {
        Service::readiness(self)
    }

    fn render_metrics(&self) -> String {
        Service::render_metrics(self)
    }

    fn request_timeout(&self) -> Duration {
        Service::request_timeout(self)
    }

    fn http_body_bytes_max(&self) -> usize {
        Service::http_body_bytes_max(self)
    }

    fn http_body_read_timeout(&self) -> Duration {
        Duration::from_millis(self.inner.config.limits.http_body_read_timeout_ms)
    }

    fn node_id(&self) -> u64 {
        Service::node_id(self)
    }

    fn fault_controls(&self) -> Option<Arc<FaultControls>> {
        Service::fault_controls(self)
    }
}

struct Shared {
    backend: Arc<dyn Backend>,
    /// Number of groups, learned from the first successful Routing call (fixed per cluster).
    groups: tokio::sync::OnceCell<u32>,
}

#[derive(Clone)]
struct AppState(Arc<Shared>);

impl AppState {
    fn backend(&self) -> &dyn Backend {
        self.0.backend.as_ref()
    }

    /// Calls the service for `caller`, bounded by the caller's timeout.
    async fn call(
        &self,
        caller: &Caller,
        stale_read: bool,
        body: RequestBody,
    ) -> Result<ResponseBody, ApiError> {
        let ctx = RequestContext {
            principal: caller.principal.clone(),
            flags: RequestFlags {
                forward: true,
                stale_read,
                principal_claimed: caller.claimed,
            },
            timeout: caller.timeout,
            peer_node: None,
            peer_cert_sha256: None,
        };
        let op = body.op_name();
        let wait = caller.timeout.saturating_add(TIMEOUT_GRACE);
        match tokio::time::timeout(wait, self.backend().handle(ctx, body)).await {
            Ok(Ok(response)) => Ok(response),
            Ok(Err(error)) => Err(ApiError::from(error)),
            Err(_) => Err(ApiError::from(WireError::new(
                ErrorCode::Unavailable,
                format!(
                    "{op} got no answer within {} ms; its outcome is unknown, retry with the \
                     same request_id",
                    caller.timeout.as_millis()
                ),
            ))),
        }
    }

    /// The number of groups (asks the service once).
    async fn groups(&self, caller: &Caller) -> Result<u32, ApiError> {
        self.0
            .groups
            .get_or_try_init(|| async {
                match self.call(caller, false, RequestBody::Routing).await? {
                    ResponseBody::Routing(table) => Ok(table.groups),
                    other => Err(unexpected("routing", &other)),
                }
            })
            .await
            .copied()
    }
}

fn router_with(backend: Arc<dyn Backend>) -> Router {
    let body_limit = backend.http_body_bytes_max();
    let state = AppState(Arc::new(Shared {
        backend,
        groups: tokio::sync::OnceCell::new(),
    }));
    Router::new()
        .route(ACQUIRE_PATH, post(acquire))
        .route(RENEW_PATH, post(renew))
        .route(RELEASE_PATH, post(release))
        .route(TRANSFER_PATH, post(transfer))
        .route(CHECK_FENCE_PATH, post(check_fence))
        .route(SESSION_OPEN_PATH, post(session_open))
        .route(SESSION_KEEPALIVE_PATH, post(session_keepalive))
        .route(SESSION_CLOSE_PATH, post(session_close))
        .route(SESSION_ACQUIRE_PATH, post(session_acquire))
        .route(GET_LEASE_PATH, get(get_lease))
        .route(LIST_LEASES_PATH, get(list_leases))
        .route(WATCH_PATH, get(watch_events))
        .route(HEALTHZ_PATH, get(healthz))
        .route(READYZ_PATH, get(readyz))
        .route(METRICS_PATH, get(metrics))
        .route(OPENAPI_PATH, get(openapi))
        .route(
            TESTING_FAULTS_PATH,
            get(testing_faults).post(set_testing_faults),
        )
        .fallback(route_not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(body_limit))
        .with_state(state)
}

#[cfg(test)]
mod tests;
