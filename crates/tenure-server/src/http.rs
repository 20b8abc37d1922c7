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
//! | GET | `/v1/leases/{tenant_id}/{resource_id}` | `?stale=true` | `{found, lease}` |
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
    AcquireRequest, ErrorCode, LeaseError, LeaseGrant, LeaseId, LeaseReply, LeaseStatus, LeaseView,
    ListRequest, ReleaseRequest, RenewRequest, ReplayState, ResourceKey,
};
use tenure_proto::client::{
    Principal, RequestBody, RequestFlags, ResponseBody, TOKEN_BYTES_MAX, WireError,
};

use crate::auth;
use crate::fault_control::{FaultControls, FaultSettings};
use crate::service::{Readiness, RequestContext, Service};

mod server;

pub use server::{ServerLimits, StallIo, serve_router};

/// `POST`: acquire a lease.
pub const ACQUIRE_PATH: &str = "/v1/leases/acquire";
/// `POST`: renew a lease.
pub const RENEW_PATH: &str = "/v1/leases/renew";
/// `POST`: release a lease.
pub const RELEASE_PATH: &str = "/v1/leases/release";
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
/// `GET`/`POST`: the fault knobs of a node started with `[testing] fault_control` (tests only,
/// not part of the API: every other node answers 404). `POST` takes a
/// [`crate::fault_control::FaultSettings`]; both answer the
/// [`crate::fault_control::FaultState`].
pub const TESTING_FAULTS_PATH: &str = "/testing/faults";

/// Every route of [`router`] as `(method, path)`, paths in axum/OpenAPI template syntax.
pub const ROUTES: [(&str, &str); 9] = [
    ("post", ACQUIRE_PATH),
    ("post", RENEW_PATH),
    ("post", RELEASE_PATH),
    ("get", GET_LEASE_PATH),
    ("get", LIST_LEASES_PATH),
    ("get", HEALTHZ_PATH),
    ("get", READYZ_PATH),
    ("get", METRICS_PATH),
    ("get", OPENAPI_PATH),
];

/// The OpenAPI 3.0.3 document served at [`OPENAPI_PATH`].
pub const OPENAPI_JSON: &str = include_str!("../openapi.json");

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
        .route(GET_LEASE_PATH, get(get_lease))
        .route(LIST_LEASES_PATH, get(list_leases))
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

// ---------------------------------------------------------------------------------------------
// Errors

/// An error answer: a contract error and the HTTP status it goes out with.
#[derive(Debug, thiserror::Error)]
#[error("{status}: {error}")]
struct ApiError {
    status: StatusCode,
    /// Boxed: a `WireError` is large and every fallible helper here returns an `ApiError`.
    error: Box<WireError>,
}

impl ApiError {
    fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError::from(WireError::new(code, message))
    }

    fn with_status(status: StatusCode, code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            error: Box::new(WireError::new(code, message)),
        }
    }
}

impl From<WireError> for ApiError {
    fn from(error: WireError) -> Self {
        ApiError {
            status: http_status(error.code),
            error: Box::new(error),
        }
    }
}

fn invalid(message: impl Into<String>) -> ApiError {
    ApiError::new(ErrorCode::InvalidArgument, message)
}

fn unauthorized(message: impl Into<String>) -> ApiError {
    ApiError::new(ErrorCode::Unauthorized, message)
}

fn unexpected(op: &str, response: &ResponseBody) -> ApiError {
    let kind = response.kind_name();
    ApiError::new(
        ErrorCode::Internal,
        format!("the service answered {op} with an unexpected {kind} response"),
    )
}

#[derive(Serialize)]
struct ErrorJson<'a> {
    code: &'static str,
    message: &'a str,
    retryable: bool,
    leader_hint: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    retry_after_ms: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    holder_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    remaining_ttl_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    placement_version: Option<u64>,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let error = &self.error;
        let retry_after_ms = matches!(error.code, ErrorCode::RateLimited | ErrorCode::Overloaded)
            .then(|| error.retry_after_ms.unwrap_or(RETRY_AFTER_MS_DEFAULT));
        let (holder_id, remaining_ttl_ms) = match &error.lease_error {
            Some(LeaseError::AlreadyHeld {
                holder_id,
                remaining_ttl_ms,
            }) => (Some(holder_id.as_str()), Some(*remaining_ttl_ms)),
            _ => (None, None),
        };
        let body = ErrorJson {
            code: error.code.as_str(),
            message: &error.message,
            retryable: error.retryable,
            leader_hint: error
                .leader_hint
                .as_ref()
                .map(|node| node.http_url.as_str())
                .filter(|url| !url.is_empty()),
            retry_after_ms,
            holder_id,
            remaining_ttl_ms,
            placement_version: (error.placement_version != 0).then_some(error.placement_version),
        };
        if self.status.is_server_error() {
            tracing::debug!(status = %self.status, error = %self.error, "http: request failed");
        }
        let mut response = (self.status, axum::Json(body)).into_response();
        if let Some(ms) = retry_after_ms {
            let seconds = u64::from(ms).div_ceil(1_000);
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}

async fn route_not_found(method: Method, uri: Uri) -> ApiError {
    ApiError::new(
        ErrorCode::NotFound,
        format!("no route for {method} {}", uri.path()),
    )
}

async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::with_status(
        StatusCode::METHOD_NOT_ALLOWED,
        ErrorCode::InvalidArgument,
        format!(
            "method {method} is not allowed on {} (see the Allow header)",
            uri.path()
        ),
    )
}

// ---------------------------------------------------------------------------------------------
// Extractors that answer in the contract's error shape

/// Who asks and how long they wait.
struct Caller {
    principal: Principal,
    /// True when the principal was claimed by headers without authentication (insecure
    /// development mode); forwarded requests say so and secure nodes refuse them.
    claimed: bool,
    timeout: Duration,
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let backend = state.backend();
        let principal = authenticate(&parts.headers, backend)?;
        let claimed = !parts.headers.contains_key(header::AUTHORIZATION);
        let timeout = request_timeout(&parts.headers, backend.request_timeout())?;
        Ok(Caller {
            principal,
            claimed,
            timeout,
        })
    }
}

fn header_text<'a>(headers: &'a HeaderMap, name: &str) -> Result<Option<&'a str>, ApiError> {
    match headers.get(name) {
        None => Ok(None),
        Some(value) => value
            .to_str()
            .map(|text| Some(text.trim()))
            .map_err(|_| invalid(format!("header {name} is not visible ASCII"))),
    }
}

fn authenticate(headers: &HeaderMap, backend: &dyn Backend) -> Result<Principal, ApiError> {
    let claimed_tenant = header_text(headers, PRINCIPAL_TENANT_HEADER)?;
    let claimed_id = header_text(headers, PRINCIPAL_ID_HEADER)?;
    if let Some(value) = headers.get(header::AUTHORIZATION) {
        let value = value
            .to_str()
            .map_err(|_| unauthorized("the Authorization header is not visible ASCII"))?;
        let token = bearer_token(value)
            .ok_or_else(|| unauthorized("expected an Authorization header `Bearer <token>`"))?;
        if token.len() > TOKEN_BYTES_MAX {
            return Err(unauthorized(format!(
                "the bearer token is longer than {TOKEN_BYTES_MAX} bytes"
            )));
        }
        let principal = backend.authenticate_bearer(token)?;
        if let Some(tenant) = claimed_tenant {
            if tenant != principal.tenant_id {
                return Err(ApiError::new(
                    ErrorCode::Forbidden,
                    format!(
                        "X-Tenure-Principal-Tenant {tenant:?} does not match the token's tenant \
                         {:?}",
                        principal.tenant_id
                    ),
                ));
            }
        }
        return Ok(principal);
    }
    if backend.insecure_dev_mode() {
        // As Tenure: both headers, non-empty, or UNAUTHORIZED.
        return match (claimed_id, claimed_tenant) {
            (Some(id), Some(tenant)) if !id.is_empty() && !tenant.is_empty() => Ok(Principal {
                principal_id: id.to_owned(),
                tenant_id: tenant.to_owned(),
            }),
            _ => Err(unauthorized(
                "no credentials: send `Authorization: Bearer <token>`, or (insecure development \
                 mode) both headers X-Tenure-Principal-Id and X-Tenure-Principal-Tenant",
            )),
        };
    }
    if claimed_tenant.is_some() || claimed_id.is_some() {
        return Err(unauthorized(
            "principal headers are trusted only in insecure development mode: send \
             `Authorization: Bearer <token>`",
        ));
    }
    Err(unauthorized(
        "no credentials: send `Authorization: Bearer <token>`",
    ))
}

/// The token of `Bearer <token>` (scheme case-insensitive), if that is the header's form.
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

fn request_timeout(headers: &HeaderMap, default: Duration) -> Result<Duration, ApiError> {
    let Some(text) = header_text(headers, TIMEOUT_HEADER)? else {
        return Ok(default);
    };
    match text.parse::<u64>() {
        Ok(ms) if ms > 0 => Ok(default.min(Duration::from_millis(ms))),
        _ => Err(invalid(format!(
            "header X-Tenure-Timeout-Ms must be a positive integer of milliseconds, not {text:?}"
        ))),
    }
}

/// A JSON body; rejections in the contract's error shape.
struct JsonBody<T>(T);

impl<T: DeserializeOwned> FromRequest<AppState> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
        let read = axum::Json::<T>::from_request(req, state);
        match with_body_timeout(state, read).await? {
            Ok(axum::Json(value)) => Ok(JsonBody(value)),
            Err(rejection) => Err(json_rejection(
                &rejection,
                state.backend().http_body_bytes_max(),
            )),
        }
    }
}

/// A request body, read within the body read timeout.
struct BodyBytes(axum::body::Bytes);

impl FromRequest<AppState> for BodyBytes {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
        let read = axum::body::Bytes::from_request(req, state);
        match with_body_timeout(state, read).await? {
            Ok(bytes) => Ok(BodyBytes(bytes)),
            Err(rejection) => Err(ApiError::with_status(
                rejection.status(),
                ErrorCode::InvalidArgument,
                format!("reading the request body: {}", rejection.body_text()),
            )),
        }
    }
}

/// Runs a body read, bounded by the body read timeout (`408`, and hyper closes the connection
/// since the body was not read to its end).
async fn with_body_timeout<T>(
    state: &AppState,
    read: impl Future<Output = T>,
) -> Result<T, ApiError> {
    let limit = state.backend().http_body_read_timeout();
    tokio::time::timeout(limit, read).await.map_err(|_| {
        ApiError::with_status(
            StatusCode::REQUEST_TIMEOUT,
            ErrorCode::InvalidArgument,
            format!(
                "the request body did not arrive within {} ms",
                limit.as_millis()
            ),
        )
    })
}

fn json_rejection(rejection: &JsonRejection, body_bytes_max: usize) -> ApiError {
    let status = rejection.status();
    let text = rejection.body_text();
    match (rejection, status) {
        (_, StatusCode::PAYLOAD_TOO_LARGE) => ApiError::with_status(
            StatusCode::PAYLOAD_TOO_LARGE,
            ErrorCode::InvalidArgument,
            format!("the request body exceeds the limit of {body_bytes_max} bytes"),
        ),
        (JsonRejection::MissingJsonContentType(_), _) => ApiError::with_status(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ErrorCode::InvalidArgument,
            "expected `Content-Type: application/json`",
        ),
        _ => invalid(format!("invalid JSON body: {text}")),
    }
}

/// Path parameters; rejections in the contract's error shape.
struct PathParams<T>(T);

impl<T: DeserializeOwned + Send> FromRequestParts<AppState> for PathParams<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        Path::<T>::from_request_parts(parts, state)
            .await
            .map(|Path(value)| PathParams(value))
            .map_err(|rejection| invalid(format!("invalid path: {}", rejection.body_text())))
    }
}

/// A query string; rejections in the contract's error shape.
struct QueryParams<T>(T);

impl<T: DeserializeOwned> FromRequestParts<AppState> for QueryParams<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        Query::<T>::from_request_parts(parts, state)
            .await
            .map(|Query(value)| QueryParams(value))
            .map_err(|rejection| invalid(format!("invalid query: {}", rejection.body_text())))
    }
}

// ---------------------------------------------------------------------------------------------
// Request and response bodies

#[derive(Deserialize)]
struct AcquireJson {
    tenant_id: String,
    resource_id: String,
    holder_id: String,
    #[serde(default)]
    ttl_seconds: Option<serde_json::Number>,
    #[serde(default)]
    ttl_ms: Option<u64>,
    request_id: String,
}

#[derive(Deserialize)]
struct RenewJson {
    tenant_id: String,
    resource_id: String,
    lease_id: String,
    holder_id: String,
    #[serde(default)]
    ttl_seconds: Option<serde_json::Number>,
    #[serde(default)]
    ttl_ms: Option<u64>,
    request_id: String,
}

#[derive(Deserialize)]
struct ReleaseJson {
    tenant_id: String,
    resource_id: String,
    lease_id: String,
    holder_id: String,
    request_id: String,
}

#[derive(Deserialize)]
struct GetQuery {
    #[serde(default)]
    stale: Option<bool>,
}

#[derive(Deserialize)]
struct ListQuery {
    #[serde(default)]
    page_size: Option<u32>,
    #[serde(default)]
    page_token: Option<String>,
    #[serde(default)]
    filter_status: Option<String>,
    #[serde(default)]
    stale: Option<bool>,
}

#[derive(Serialize)]
struct GrantJson {
    lease_id: String,
    expiry_time: String,
    fencing_token: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    created: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    renewed: Option<bool>,
    ttl_ms: u64,
    /// What is left of the grant as of the answer: `ttl_ms` for a fresh one, the remaining ttl
    /// of the original grant for a replay (zero once its lease ended).
    remaining_ttl_ms: u64,
    /// For a replay: where the original grant's lease stands (`ACTIVE`, `EXPIRED`, `RELEASED`,
    /// `SUPERSEDED`).
    #[serde(skip_serializing_if = "Option::is_none")]
    replay_status: Option<&'static str>,
    log_time_ms: u64,
    expires_at_log_ms: u64,
    replayed: bool,
    group_id: u32,
}

#[derive(Serialize)]
struct ReleasedJson {
    lease_id: String,
    released: bool,
    expiry_time: String,
    fencing_token: u64,
    released_at_log_ms: u64,
    replayed: bool,
    group_id: u32,
}

#[derive(Serialize)]
struct LeaseJson {
    tenant_id: String,
    resource_id: String,
    lease_id: String,
    holder_id: String,
    status: &'static str,
    expiry_time: String,
    fencing_token: u64,
    version: u64,
    ttl_ms: u64,
    remaining_ttl_ms: u64,
    expires_at_log_ms: u64,
}

#[derive(Serialize)]
struct GetJson {
    found: bool,
    /// For a resource without a lease record: Tenure's absent view (status `ABSENT`).
    lease: LeaseJson,
    stale: bool,
    group_id: u32,
    log_time_ms: u64,
}

#[derive(Serialize)]
struct ListJson {
    leases: Vec<LeaseJson>,
    /// `""` when the listing is complete (as Tenure).
    next_page_token: String,
}

fn grant_json(
    grant: LeaseGrant,
    arrived: SystemTime,
    replay: (bool, Option<ReplayState>),
    group_id: u32,
    renewed: bool,
) -> GrantJson {
    let (replayed, replay) = replay;
    // A replay reports what is left of the original grant as of the retry's log time (contract
    // 3.4), so an exact retry shows the original expiry (up to the wall-clock mapping), or an
    // earlier one once the lease ended; never a full ttl counted from now.
    let (expiry, remaining_ttl_ms) = match replay {
        Some(replay) => (
            wall_clock_of(arrived, replay.expires_at_ms, replay.answered_at_ms),
            replay.remaining_ttl_ms,
        ),
        None => {
            let remaining = grant.expires_at_ms.saturating_sub(grant.log_time_ms);
            (add_ms(arrived, remaining), remaining)
        }
    };
    GrantJson {
        lease_id: grant.lease_id.to_string(),
        expiry_time: rfc3339_millis(expiry),
        remaining_ttl_ms,
        replay_status: replay.map(|replay| replay.status.as_str()),
        fencing_token: grant.fencing_token,
        created: (!renewed).then_some(grant.created),
        renewed: renewed.then_some(true),
        ttl_ms: grant.ttl_ms,
        log_time_ms: grant.log_time_ms,
        expires_at_log_ms: grant.expires_at_ms,
        replayed,
        group_id,
    }
}

/// A view as JSON. `log_time_ms` is the log time the view was computed at, when known.
fn lease_json(view: LeaseView, arrived: SystemTime, log_time_ms: Option<u64>) -> LeaseJson {
    let expiry = if view.status == LeaseStatus::Active {
        add_ms(arrived, view.remaining_ttl_ms)
    } else {
        let since_expiry = log_time_ms.map_or(0, |now| now.saturating_sub(view.expires_at_ms));
        arrived
            .checked_sub(Duration::from_millis(since_expiry))
            .unwrap_or(arrived)
    };
    LeaseJson {
        tenant_id: view.key.tenant_id,
        resource_id: view.key.resource_id,
        lease_id: view.lease_id.to_string(),
        holder_id: view.holder_id,
        status: view.status.as_str(),
        expiry_time: rfc3339_millis(expiry),
        fencing_token: view.fencing_token,
        version: record_version(view.fencing_token, view.version),
        ttl_ms: view.ttl_ms,
        remaining_ttl_ms: view.remaining_ttl_ms,
        expires_at_log_ms: view.expires_at_ms,
    }
}

/// Tenure's view of a resource that has no lease record: its key, status `ABSENT`, empty lease id,
/// holder and expiry time, zero fencing token and version.
fn absent_lease_json(key: &ResourceKey) -> LeaseJson {
    LeaseJson {
        tenant_id: key.tenant_id.clone(),
        resource_id: key.resource_id.clone(),
        lease_id: String::new(),
        holder_id: String::new(),
        status: LeaseStatus::Absent.as_str(),
        expiry_time: String::new(),
        fencing_token: 0,
        version: 0,
        ttl_ms: 0,
        remaining_ttl_ms: 0,
        expires_at_log_ms: 0,
    }
}

/// The record version Tenure clients see: it only increases along a resource's life, across
/// grants (Tenure's "monotonic state-machine version for the record"). The native view counts
/// the changes of one lease (1 at grant, +1 per renewal and for the release), and a new grant
/// has a larger fencing token than every earlier grant of the resource, even after its old
/// record was garbage-collected or moved; so the token in the high 32 bits and the per-lease
/// count in the low 32 bits order every change of the resource. (Exact while tokens stay below
/// 2^32; beyond that the value saturates.)
fn record_version(fencing_token: u64, lease_version: u64) -> u64 {
    let changes = lease_version.min(u64::from(u32::MAX));
    fencing_token
        .checked_mul(1 << 32)
        .and_then(|high| high.checked_add(changes))
        .unwrap_or(u64::MAX)
}

fn add_ms(time: SystemTime, ms: u64) -> SystemTime {
    time.checked_add(Duration::from_millis(ms)).unwrap_or(time)
}

/// The wall-clock time of log time `at_ms`, given that log time `now_ms` is `arrived`.
fn wall_clock_of(arrived: SystemTime, at_ms: u64, now_ms: u64) -> SystemTime {
    if at_ms >= now_ms {
        add_ms(arrived, at_ms - now_ms)
    } else {
        arrived
            .checked_sub(Duration::from_millis(now_ms - at_ms))
            .unwrap_or(arrived)
    }
}

/// `time` as RFC 3339 UTC with millisecond precision, e.g. `2024-02-29T23:59:59.123Z`.
/// Times before 1970 are shown as the epoch.
fn rfc3339_millis(time: SystemTime) -> String {
    let since_epoch = time.duration_since(UNIX_EPOCH).unwrap_or_default();
    let seconds = since_epoch.as_secs();
    let millis = since_epoch.subsec_millis();
    let (year, month, day) = civil_from_days(seconds / 86_400);
    let second_of_day = seconds % 86_400;
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        second_of_day / 3_600,
        second_of_day % 3_600 / 60,
        second_of_day % 60
    )
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (H. Hinnant's algorithm).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let day_of_era = z % 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 {
        month_index + 3
    } else {
        month_index - 9
    };
    let year = year_of_era + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

// ---------------------------------------------------------------------------------------------
// TTLs

/// The ttl in milliseconds from exactly one of `ttl_seconds` and `ttl_ms`.
fn ttl_from_json(
    ttl_seconds: Option<&serde_json::Number>,
    ttl_ms: Option<u64>,
) -> Result<u64, ApiError> {
    match (ttl_seconds, ttl_ms) {
        (Some(_), Some(_)) => Err(invalid(
            "give exactly one of ttl_seconds and ttl_ms, not both",
        )),
        (None, None) => Err(invalid("ttl_seconds (or ttl_ms) is required")),
        (None, Some(ms)) => Ok(ms),
        (Some(seconds), None) => seconds_to_ms(seconds),
    }
}

/// Converts a JSON number of seconds to milliseconds exactly.
fn seconds_to_ms(seconds: &serde_json::Number) -> Result<u64, ApiError> {
    let too_large = || invalid(format!("ttl_seconds {seconds} is too large"));
    if let Some(whole) = seconds.as_u64() {
        return whole.checked_mul(1_000).ok_or_else(too_large);
    }
    let value = seconds.as_f64().unwrap_or(f64::NAN);
    if !value.is_finite() || value < 0.0 || seconds.is_i64() {
        return Err(invalid(format!(
            "ttl_seconds must be a non-negative number, not {seconds}"
        )));
    }
    if value == 0.0 {
        return Ok(0);
    }
    decimal_seconds_to_ms(&seconds.to_string()).ok_or_else(|| {
        invalid(format!(
            "ttl_seconds {seconds} is not a whole number of milliseconds or is too large \
             (ttls are never rounded; use ttl_ms)"
        ))
    })
}

/// `text` (`digits[.digits][e[+-]digits]`) times 1000, if that is an integer that fits a u64.
fn decimal_seconds_to_ms(text: &str) -> Option<u64> {
    let (mantissa_text, exponent) = match text.split_once(['e', 'E']) {
        Some((mantissa, exponent)) => (mantissa, exponent.parse::<i64>().ok()?),
        None => (text, 0),
    };
    let (whole, fraction) = mantissa_text.split_once('.').unwrap_or((mantissa_text, ""));
    if whole.is_empty()
        || !whole
            .bytes()
            .chain(fraction.bytes())
            .all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let digits = format!("{whole}{fraction}");
    let digits = digits.trim_start_matches('0');
    if digits.is_empty() {
        return Some(0);
    }
    if digits.len() > 38 {
        return None;
    }
    let mut mantissa: u128 = digits.parse().ok()?;
    let mut scale = exponent
        .checked_add(3)?
        .checked_sub(i64::try_from(fraction.len()).ok()?)?;
    while scale < 0 && mantissa % 10 == 0 {
        mantissa /= 10;
        scale += 1;
    }
    if scale < 0 {
        return None;
    }
    for _ in 0..scale {
        mantissa = mantissa.checked_mul(10)?;
        if mantissa > u128::from(u64::MAX) {
            return None;
        }
    }
    u64::try_from(mantissa).ok()
}

fn parse_lease_id(text: &str) -> Result<LeaseId, ApiError> {
    LeaseId::from_str(text).map_err(|error| ApiError::from(WireError::from_lease_error(error)))
}

fn parse_status_filter(text: Option<&str>) -> Result<Option<LeaseStatus>, ApiError> {
    let Some(text) = text.map(str::trim).filter(|text| !text.is_empty()) else {
        return Ok(None);
    };
    if text.eq_ignore_ascii_case("ANY") {
        return Ok(None);
    }
    [
        LeaseStatus::Active,
        LeaseStatus::Expired,
        LeaseStatus::Released,
    ]
    .into_iter()
    .find(|status| status.as_str().eq_ignore_ascii_case(text))
    .map(Some)
    .ok_or_else(|| {
        invalid(format!(
            "filter_status must be ANY, ACTIVE, EXPIRED or RELEASED, not {text:?}"
        ))
    })
}

// ---------------------------------------------------------------------------------------------
// Lease routes

async fn acquire(
    State(state): State<AppState>,
    caller: Caller,
    JsonBody(body): JsonBody<AcquireJson>,
) -> Result<Response, ApiError> {
    let arrived = SystemTime::now();
    auth::check_tenant(&caller.principal, &body.tenant_id)?;
    let ttl_ms = ttl_from_json(body.ttl_seconds.as_ref(), body.ttl_ms)?;
    let request = AcquireRequest {
        key: ResourceKey::new(body.tenant_id, body.resource_id),
        holder_id: body.holder_id,
        ttl_ms,
        request_id: body.request_id,
    };
    grant_call(
        &state,
        &caller,
        RequestBody::Acquire(request),
        false,
        arrived,
    )
    .await
}

/// Calls the service with an Acquire (`renewed == false`) or a Renew and shapes the grant.
async fn grant_call(
    state: &AppState,
    caller: &Caller,
    body: RequestBody,
    renewed: bool,
    arrived: SystemTime,
) -> Result<Response, ApiError> {
    let op = body.op_name();
    match state.call(caller, false, body).await? {
        ResponseBody::Lease(result) => match (result.reply, renewed) {
            (LeaseReply::Acquired(grant), false) | (LeaseReply::Renewed(grant), true) => {
                Ok(axum::Json(grant_json(
                    grant,
                    arrived,
                    (result.replayed, result.replay),
                    result.group_id,
                    renewed,
                ))
                .into_response())
            }
            _ => Err(ApiError::new(
                ErrorCode::Internal,
                format!("the service answered {op} with another operation's reply"),
            )),
        },
        other => Err(unexpected(op, &other)),
    }
}

async fn renew(
    State(state): State<AppState>,
    caller: Caller,
    JsonBody(body): JsonBody<RenewJson>,
) -> Result<Response, ApiError> {
    let arrived = SystemTime::now();
    auth::check_tenant(&caller.principal, &body.tenant_id)?;
    let ttl_ms = ttl_from_json(body.ttl_seconds.as_ref(), body.ttl_ms)?;
    let request = RenewRequest {
        key: ResourceKey::new(body.tenant_id, body.resource_id),
        lease_id: parse_lease_id(&body.lease_id)?,
        holder_id: body.holder_id,
        ttl_ms,
        request_id: body.request_id,
    };
    grant_call(&state, &caller, RequestBody::Renew(request), true, arrived).await
}

async fn release(
    State(state): State<AppState>,
    caller: Caller,
    JsonBody(body): JsonBody<ReleaseJson>,
) -> Result<Response, ApiError> {
    let arrived = SystemTime::now();
    auth::check_tenant(&caller.principal, &body.tenant_id)?;
    let request = ReleaseRequest {
        key: ResourceKey::new(body.tenant_id, body.resource_id),
        lease_id: parse_lease_id(&body.lease_id)?,
        holder_id: body.holder_id,
        request_id: body.request_id,
    };
    match state
        .call(&caller, false, RequestBody::Release(request))
        .await?
    {
        ResponseBody::Lease(result) => match result.reply {
            LeaseReply::Released(receipt) => Ok(axum::Json(ReleasedJson {
                lease_id: receipt.lease_id.to_string(),
                released: true,
                // A replay shows when the release happened, not when it was retried.
                expiry_time: rfc3339_millis(result.replay.map_or(arrived, |replay| {
                    wall_clock_of(arrived, replay.expires_at_ms, replay.answered_at_ms)
                })),
                fencing_token: receipt.fencing_token,
                released_at_log_ms: receipt.released_at_ms,
                replayed: result.replayed,
                group_id: result.group_id,
            })
            .into_response()),
            _ => Err(ApiError::new(
                ErrorCode::Internal,
                "the service answered release with another operation's reply",
            )),
        },
        other => Err(unexpected("release", &other)),
    }
}

async fn get_lease(
    State(state): State<AppState>,
    caller: Caller,
    PathParams((tenant_id, resource_id)): PathParams<(String, String)>,
    QueryParams(query): QueryParams<GetQuery>,
) -> Result<Response, ApiError> {
    let arrived = SystemTime::now();
    auth::check_tenant(&caller.principal, &tenant_id)?;
    let key = ResourceKey::new(tenant_id, resource_id);
    let body = RequestBody::Get { key: key.clone() };
    match state
        .call(&caller, query.stale.unwrap_or(false), body)
        .await?
    {
        ResponseBody::Get(result) => {
            let log_time_ms = result.log_time_ms;
            let found = result.view.is_some();
            let lease = match result.view {
                Some(view) => lease_json(view, arrived, Some(log_time_ms)),
                None => absent_lease_json(&key),
            };
            Ok(axum::Json(GetJson {
                found,
                lease,
                stale: result.stale,
                group_id: result.group_id,
                log_time_ms,
            })
            .into_response())
        }
        other => Err(unexpected("get", &other)),
    }
}

/// A position in a cross-group listing: `g<group>:<inner token>`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ListCursor {
    group: u32,
    inner: Option<String>,
}

impl ListCursor {
    fn parse(text: &str, groups: u32) -> Result<Self, ApiError> {
        let bad = || {
            invalid(format!(
                "page_token {text:?} is not a token this API returned"
            ))
        };
        let (group, inner) = text
            .strip_prefix('g')
            .and_then(|rest| rest.split_once(':'))
            .ok_or_else(bad)?;
        let group = group.parse::<u32>().map_err(|_| bad())?;
        if group >= groups {
            return Err(bad());
        }
        Ok(ListCursor {
            group,
            inner: (!inner.is_empty()).then(|| inner.to_owned()),
        })
    }

    fn render(&self) -> String {
        format!("g{}:{}", self.group, self.inner.as_deref().unwrap_or(""))
    }
}

async fn list_leases(
    State(state): State<AppState>,
    caller: Caller,
    PathParams(tenant_id): PathParams<String>,
    QueryParams(query): QueryParams<ListQuery>,
) -> Result<Response, ApiError> {
    let arrived = SystemTime::now();
    auth::check_tenant(&caller.principal, &tenant_id)?;
    let page_size = query.page_size.unwrap_or(LIST_PAGE_SIZE_DEFAULT);
    if page_size == 0 {
        return Err(invalid("page_size must be at least 1"));
    }
    let status = parse_status_filter(query.filter_status.as_deref())?;
    let stale = query.stale.unwrap_or(false);
    let groups = state.groups(&caller).await?;
    let mut cursor = match query.page_token.as_deref().map(str::trim) {
        None | Some("") => ListCursor {
            group: 0,
            inner: None,
        },
        Some(text) => ListCursor::parse(text, groups)?,
    };
    let wanted = usize::try_from(page_size).unwrap_or(usize::MAX);
    let calls_max = usize::try_from(groups)
        .unwrap_or(usize::MAX)
        .saturating_add(LIST_GROUP_CALLS_MAX);
    let mut leases = Vec::new();
    let mut calls = 0usize;
    let next_page_token = loop {
        if cursor.group >= groups {
            break String::new();
        }
        if leases.len() >= wanted || calls >= calls_max {
            break cursor.render();
        }
        calls += 1;
        let remaining = u32::try_from(wanted.saturating_sub(leases.len())).unwrap_or(page_size);
        let body = RequestBody::List {
            group_id: cursor.group,
            request: ListRequest {
                tenant_id: tenant_id.clone(),
                page_size: remaining,
                page_token: cursor.inner.take(),
                status,
            },
        };
        let page = match state.call(&caller, stale, body).await? {
            ResponseBody::List(page) => page,
            other => return Err(unexpected("list", &other)),
        };
        leases.extend(
            page.leases
                .into_iter()
                .map(|view| lease_json(view, arrived, None)),
        );
        match page.next_page_token {
            Some(inner) => cursor.inner = Some(inner),
            None => {
                cursor.group += 1;
                cursor.inner = None;
            }
        }
    };
    Ok(axum::Json(ListJson {
        leases,
        next_page_token,
    })
    .into_response())
}

// ---------------------------------------------------------------------------------------------
// Operations routes

async fn healthz(State(state): State<AppState>) -> Response {
    axum::Json(serde_json::json!({
        "status": "ok",
        "node_id": state.backend().node_id(),
    }))
    .into_response()
}

/// The node's fault knobs, or the 404 every unknown route gets.
fn fault_controls_of(state: &AppState, method: Method) -> Result<Arc<FaultControls>, ApiError> {
    state.backend().fault_controls().ok_or_else(|| {
        ApiError::new(
            ErrorCode::NotFound,
            format!("no route for {method} {TESTING_FAULTS_PATH}"),
        )
    })
}

// `/testing/*` answers only authenticated callers (the `Caller` extractor: a bearer token, or in
// insecure development mode the principal headers), as every lease route does.
async fn testing_faults(
    State(state): State<AppState>,
    _caller: Caller,
) -> Result<Response, ApiError> {
    let controls = fault_controls_of(&state, Method::GET)?;
    Ok(axum::Json(controls.state()).into_response())
}

async fn set_testing_faults(
    State(state): State<AppState>,
    _caller: Caller,
    BodyBytes(body): BodyBytes,
) -> Result<Response, ApiError> {
    let controls = fault_controls_of(&state, Method::POST)?;
    let settings: FaultSettings = serde_json::from_slice(&body).map_err(|error| {
        ApiError::new(
            ErrorCode::InvalidArgument,
            format!("fault settings: {error}"),
        )
    })?;
    let applied = controls
        .apply(&settings)
        .map_err(|error| ApiError::new(ErrorCode::InvalidArgument, error))?;
    tracing::warn!(?settings, "fault injection changed");
    Ok(axum::Json(applied).into_response())
}

async fn readyz(State(state): State<AppState>) -> Response {
    let readiness = state.backend().readiness();
    let status = if readiness.ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, axum::Json(readiness)).into_response()
}

async fn metrics(State(state): State<AppState>) -> Response {
    (
        [(header::CONTENT_TYPE, METRICS_CONTENT_TYPE)],
        state.backend().render_metrics(),
    )
        .into_response()
}

async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI_JSON).into_response()
}

#[cfg(test)]
mod tests {
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
        async fn send(
            &self,
            method: &str,
            path: &str,
            headers: &[(&str, &str)],
            body: &str,
        ) -> Reply {
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
        let harness =
            start(Fake::default().answer(lease_ok(LeaseReply::Acquired(grant(true))))).await;
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
            &RequestBody::Acquire(AcquireRequest {
                key: ResourceKey::new("acme", "db"),
                holder_id: "w1".into(),
                ttl_ms: 1_500,
                request_id: "r1".into(),
            })
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
            RequestBody::Renew(RenewRequest {
                key: ResourceKey::new("acme", "db"),
                lease_id: lease_id(),
                holder_id: "w1".into(),
                ttl_ms: 250,
                request_id: "r2".into(),
            })
        );
        assert_eq!(
            calls[1].1,
            RequestBody::Release(ReleaseRequest {
                key: ResourceKey::new("acme", "db"),
                lease_id: lease_id(),
                holder_id: "w1".into(),
                request_id: "r3".into(),
            })
        );
        assert!(calls.iter().all(|(ctx, _)| ctx.flags.forward));
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
        let harness =
            start(Fake::default().answer(lease_ok(LeaseReply::Acquired(grant(true))))).await;
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
    }

    #[test]
    fn bearer_tokens_parse() {
        assert_eq!(bearer_token("Bearer abc"), Some("abc"));
        assert_eq!(bearer_token("bearer   abc "), Some("abc"));
        assert_eq!(bearer_token("Bearer"), None);
        assert_eq!(bearer_token("Basic abc"), None);
        assert_eq!(bearer_token("Bearer "), None);
    }
}
