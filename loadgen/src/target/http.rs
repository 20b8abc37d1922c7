//! The `tenure-http` target: the Tenure v1 HTTP routes over HTTP/1.1 with keep-alive
//! connections, spread round-robin over the nodes (any node answers; followers forward to the
//! group's leader, as for a Tenure HTTP client that knows nothing of groups).
//!
//! Credentials: `Authorization: Bearer <token>`, or in insecure development mode the
//! `X-Tenure-Principal-*` headers.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};

use super::{HeldLease, LeaseRef, OpError};

/// Largest response body read (a lease answer is far smaller).
const RESPONSE_BYTES_MAX: usize = 1 << 20;

/// How the HTTP target authenticates.
#[derive(Debug, Clone)]
pub enum HttpCredentials {
    /// `Authorization: Bearer <token>`.
    Token(String),
    /// Development mode: the principal named in headers.
    InsecureDev {
        /// `X-Tenure-Principal-Id`.
        principal_id: String,
    },
}

/// HTTP/1.1 client of the Tenure v1 routes.
pub struct HttpTarget {
    client: HyperClient<HttpConnector, Full<Bytes>>,
    base_urls: Vec<String>,
    next_node: AtomicUsize,
    tenant: String,
    credentials: HttpCredentials,
    request_prefix: String,
    next_request: AtomicU64,
}

impl HttpTarget {
    /// A client of the nodes at `base_urls` (`http://host:port`).
    pub fn new(
        base_urls: Vec<String>,
        tenant: String,
        credentials: HttpCredentials,
        run_tag: u32,
    ) -> Result<Self, OpError> {
        if base_urls.is_empty() {
            return Err(OpError::new("CONFIG", "no HTTP endpoint given"));
        }
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let client = HyperClient::builder(TokioExecutor::new())
            .pool_max_idle_per_host(4096)
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector);
        Ok(HttpTarget {
            client,
            base_urls: base_urls
                .into_iter()
                .map(|url| url.trim_end_matches('/').to_owned())
                .collect(),
            next_node: AtomicUsize::new(0),
            tenant,
            credentials,
            request_prefix: format!("lg{run_tag:08x}"),
            next_request: AtomicU64::new(0),
        })
    }

    fn request_id(&self) -> String {
        let sequence = self.next_request.fetch_add(1, Ordering::Relaxed);
        format!("{}-{sequence}", self.request_prefix)
    }

    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, OpError> {
        let node = self.next_node.fetch_add(1, Ordering::Relaxed) % self.base_urls.len();
        let uri = format!("{}{path}", self.base_urls[node]);
        let mut builder = Request::builder()
            .method(method)
            .uri(&uri)
            .header("content-type", "application/json");
        builder = match &self.credentials {
            HttpCredentials::Token(token) => {
                builder.header("authorization", format!("Bearer {token}"))
            }
            HttpCredentials::InsecureDev { principal_id } => builder
                .header("x-tenure-principal-id", principal_id.as_str())
                .header("x-tenure-principal-tenant", self.tenant.as_str()),
        };
        let body = body
            .map(|value| Bytes::from(value.to_string()))
            .unwrap_or_default();
        let request = builder
            .body(Full::new(body))
            .map_err(|error| OpError::new("INVALID_REQUEST", error.to_string()))?;
        // No timeout here: `Target` bounds the whole operation.
        let response = self
            .client
            .request(request)
            .await
            .map_err(|error| OpError::new("UNREACHABLE", format!("{uri}: {error}")))?;
        let status = response.status();
        let limited = http_body_util::Limited::new(response.into_body(), RESPONSE_BYTES_MAX);
        let bytes = limited
            .collect()
            .await
            .map_err(|error| OpError::new("PROTOCOL", format!("{uri}: body: {error}")))?
            .to_bytes();
        let value: Value = serde_json::from_slice(&bytes).map_err(|error| {
            OpError::new("PROTOCOL", format!("{uri}: {status}: not JSON: {error}"))
        })?;
        if status == StatusCode::OK {
            Ok(value)
        } else {
            let code = value
                .get("code")
                .and_then(Value::as_str)
                .unwrap_or("HTTP_ERROR")
                .to_owned();
            let message = value
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            Err(OpError::new(code, message))
        }
    }

    pub(super) async fn acquire(
        &self,
        resource: &str,
        holder: &str,
        ttl: Duration,
    ) -> Result<HeldLease, OpError> {
        let body = json!({
            "tenant_id": self.tenant,
            "resource_id": resource,
            "holder_id": holder,
            "ttl_ms": u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
            "request_id": self.request_id(),
        });
        let answer = self
            .call(Method::POST, "/v1/leases/acquire", Some(body))
            .await?;
        let lease_id = answer
            .get("lease_id")
            .and_then(Value::as_str)
            .ok_or_else(|| OpError::new("PROTOCOL", "acquire answer without lease_id"))?;
        Ok(HeldLease {
            resource: resource.to_owned(),
            holder: holder.to_owned(),
            lease: LeaseRef::Text(lease_id.to_owned()),
            fencing_token: answer
                .get("fencing_token")
                .and_then(Value::as_u64)
                .unwrap_or(0),
        })
    }

    pub(super) async fn renew(&self, lease: &HeldLease, ttl: Duration) -> Result<(), OpError> {
        let LeaseRef::Text(lease_id) = &lease.lease else {
            return Err(OpError::new("INVALID_REQUEST", "not an HTTP lease"));
        };
        let body = json!({
            "tenant_id": self.tenant,
            "resource_id": lease.resource,
            "lease_id": lease_id,
            "holder_id": lease.holder,
            "ttl_ms": u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
            "request_id": self.request_id(),
        });
        self.call(Method::POST, "/v1/leases/renew", Some(body))
            .await
            .map(drop)
    }

    pub(super) async fn release(&self, lease: &HeldLease) -> Result<(), OpError> {
        let LeaseRef::Text(lease_id) = &lease.lease else {
            return Err(OpError::new("INVALID_REQUEST", "not an HTTP lease"));
        };
        let body = json!({
            "tenant_id": self.tenant,
            "resource_id": lease.resource,
            "lease_id": lease_id,
            "holder_id": lease.holder,
            "request_id": self.request_id(),
        });
        self.call(Method::POST, "/v1/leases/release", Some(body))
            .await
            .map(drop)
    }

    pub(super) async fn get(&self, resource: &str) -> Result<bool, OpError> {
        let path = format!("/v1/leases/{}/{resource}", self.tenant);
        let answer = self.call(Method::GET, &path, None).await?;
        Ok(answer
            .get("lease")
            .and_then(|lease| lease.get("status"))
            .and_then(Value::as_str)
            == Some("ACTIVE"))
    }
}
