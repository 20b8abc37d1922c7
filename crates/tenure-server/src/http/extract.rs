//! Extractors that answer in the contract's error shape (JSON bodies, paths, queries, the
//! principal from the bearer token or, in development mode, the principal headers).
//!
//! Must not depend on: the node's internals (only the request path's `Service`).

use super::*;

/// Who asks and how long they wait.
pub(super) struct Caller {
    pub(super) principal: Principal,
    /// True when the principal was claimed by headers without authentication (insecure
    /// development mode); forwarded requests say so and secure nodes refuse them.
    pub(super) claimed: bool,
    pub(super) timeout: Duration,
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

pub(super) fn header_text<'a>(
    headers: &'a HeaderMap,
    name: &str,
) -> Result<Option<&'a str>, ApiError> {
    match headers.get(name) {
        None => Ok(None),
        Some(value) => value
            .to_str()
            .map(|text| Some(text.trim()))
            .map_err(|_| invalid(format!("header {name} is not visible ASCII"))),
    }
}

pub(super) fn authenticate(
    headers: &HeaderMap,
    backend: &dyn Backend,
) -> Result<Principal, ApiError> {
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
pub(super) fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

pub(super) fn request_timeout(
    headers: &HeaderMap,
    default: Duration,
) -> Result<Duration, ApiError> {
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
pub(super) struct JsonBody<T>(pub(super) T);

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
pub(super) struct BodyBytes(pub(super) axum::body::Bytes);

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
pub(super) async fn with_body_timeout<T>(
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

pub(super) fn json_rejection(rejection: &JsonRejection, body_bytes_max: usize) -> ApiError {
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
pub(super) struct PathParams<T>(pub(super) T);

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
pub(super) struct QueryParams<T>(pub(super) T);

impl<T: DeserializeOwned> FromRequestParts<AppState> for QueryParams<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        Query::<T>::from_request_parts(parts, state)
            .await
            .map(|Query(value)| QueryParams(value))
            .map_err(|rejection| invalid(format!("invalid query: {}", rejection.body_text())))
    }
}
