//! The contract's error shape over HTTP: `ApiError`, the status of each code, retry hints.
//!
//! Must not depend on: the node's internals (only the request path's `Service`).

use super::*;

/// An error answer: a contract error and the HTTP status it goes out with.
#[derive(Debug, thiserror::Error)]
#[error("{status}: {error}")]
pub(super) struct ApiError {
    pub(super) status: StatusCode,
    /// Boxed: a `WireError` is large and every fallible helper here returns an `ApiError`.
    pub(super) error: Box<WireError>,
}

impl ApiError {
    pub(super) fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError::from(WireError::new(code, message))
    }

    pub(super) fn with_status(
        status: StatusCode,
        code: ErrorCode,
        message: impl Into<String>,
    ) -> Self {
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

pub(super) fn invalid(message: impl Into<String>) -> ApiError {
    ApiError::new(ErrorCode::InvalidArgument, message)
}

pub(super) fn unauthorized(message: impl Into<String>) -> ApiError {
    ApiError::new(ErrorCode::Unauthorized, message)
}

pub(super) fn unexpected(op: &str, response: &ResponseBody) -> ApiError {
    let kind = response.kind_name();
    ApiError::new(
        ErrorCode::Internal,
        format!("the service answered {op} with an unexpected {kind} response"),
    )
}

#[derive(Serialize)]
pub(super) struct ErrorJson<'a> {
    pub(super) code: &'static str,
    pub(super) message: &'a str,
    pub(super) retryable: bool,
    pub(super) leader_hint: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) retry_after_ms: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) holder_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) remaining_ttl_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) placement_version: Option<u64>,
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

pub(super) async fn route_not_found(method: Method, uri: Uri) -> ApiError {
    ApiError::new(
        ErrorCode::NotFound,
        format!("no route for {method} {}", uri.path()),
    )
}

pub(super) async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::with_status(
        StatusCode::METHOD_NOT_ALLOWED,
        ErrorCode::InvalidArgument,
        format!(
            "method {method} is not allowed on {} (see the Allow header)",
            uri.path()
        ),
    )
}
