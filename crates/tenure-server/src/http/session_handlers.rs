//! Handlers of the session routes (not in Tenure v1: tenure's own): open, keep-alive and close
//! a session's record in one group, and acquire a resource bound to a session. A session is
//! kept per group (contract, sessions section), so the record routes name the group; the
//! acquire route answers which group the lease is in (its `group_id`), and a client opens the
//! session there first.
//!
//! Must not depend on: the node's internals (only the request path's `Service`).

use super::*;

pub(super) async fn session_open(
    State(state): State<AppState>,
    caller: Caller,
    JsonBody(body): JsonBody<SessionOpenJson>,
) -> Result<Response, ApiError> {
    let arrived = SystemTime::now();
    auth::check_tenant(&caller.principal, &body.tenant_id)?;
    let ttl_ms = ttl_from_json(body.ttl_seconds.as_ref(), body.ttl_ms)?;
    let request = SessionOpenRequest {
        tenant_id: body.tenant_id,
        group_id: GroupId(body.group_id),
        session_id: parse_session_id(&body.session_id)?,
        owner_id: body.owner_id,
        ttl_ms,
    };
    session_call(
        &state,
        &caller,
        RequestBody::Lease(LeaseOp::SessionOpen(request)),
        arrived,
    )
    .await
}

pub(super) async fn session_keepalive(
    State(state): State<AppState>,
    caller: Caller,
    JsonBody(body): JsonBody<SessionRefJson>,
) -> Result<Response, ApiError> {
    let arrived = SystemTime::now();
    auth::check_tenant(&caller.principal, &body.tenant_id)?;
    let request = session_request(body)?;
    session_call(
        &state,
        &caller,
        RequestBody::Lease(LeaseOp::SessionKeepAlive(request)),
        arrived,
    )
    .await
}

pub(super) async fn session_close(
    State(state): State<AppState>,
    caller: Caller,
    JsonBody(body): JsonBody<SessionRefJson>,
) -> Result<Response, ApiError> {
    auth::check_tenant(&caller.principal, &body.tenant_id)?;
    let request = session_request(body)?;
    let op = "session close";
    match state
        .call(
            &caller,
            false,
            RequestBody::Lease(LeaseOp::SessionClose(request)),
        )
        .await?
    {
        ResponseBody::Lease(result) => match result.reply {
            LeaseReply::SessionClosed(receipt) => Ok(axum::Json(SessionClosedJson {
                session_id: receipt.session_id.to_string(),
                group_id: receipt.group_id.0,
                closed: true,
                closed_at_log_ms: receipt.closed_at_ms,
                leases_ended: receipt.leases_ended,
            })
            .into_response()),
            _ => Err(ApiError::new(
                ErrorCode::Internal,
                format!("the service answered {op} with another operation's reply"),
            )),
        },
        other => Err(unexpected(op, &other)),
    }
}

/// `POST /v1/sessions/acquire`: the grant of a lease bound to the session (the acquire
/// answer's fields, with `session_id`); its `expiry_time` is the session record's.
pub(super) async fn session_acquire(
    State(state): State<AppState>,
    caller: Caller,
    JsonBody(body): JsonBody<SessionAcquireJson>,
) -> Result<Response, ApiError> {
    let arrived = SystemTime::now();
    auth::check_tenant(&caller.principal, &body.tenant_id)?;
    let session_id = parse_session_id(&body.session_id)?;
    let request = SessionAcquireRequest {
        key: ResourceKey::new(body.tenant_id, body.resource_id),
        holder_id: body.holder_id,
        session_id,
        request_id: body.request_id,
    };
    let body = RequestBody::Lease(LeaseOp::AcquireInSession(request));
    let op = body.op_name();
    match state.call(&caller, false, body).await? {
        ResponseBody::Lease(result) => match result.reply {
            LeaseReply::Acquired(grant) => {
                let mut json = grant_json(
                    grant,
                    arrived,
                    (result.replayed, result.replay),
                    result.group_id,
                    false,
                );
                json.session_id = Some(session_id.to_string());
                Ok(axum::Json(json).into_response())
            }
            _ => Err(ApiError::new(
                ErrorCode::Internal,
                format!("the service answered {op} with another operation's reply"),
            )),
        },
        other => Err(unexpected(op, &other)),
    }
}

fn parse_session_id(text: &str) -> Result<SessionId, ApiError> {
    SessionId::from_str(text).map_err(|error| {
        ApiError::new(
            ErrorCode::InvalidArgument,
            format!("invalid argument: session_id: {error}"),
        )
    })
}

fn session_request(body: SessionRefJson) -> Result<SessionRequest, ApiError> {
    Ok(SessionRequest {
        session_id: parse_session_id(&body.session_id)?,
        tenant_id: body.tenant_id,
        group_id: GroupId(body.group_id),
        owner_id: body.owner_id,
    })
}

/// Calls the service with an open or a keep-alive and shapes the session record's state.
async fn session_call(
    state: &AppState,
    caller: &Caller,
    body: RequestBody,
    arrived: SystemTime,
) -> Result<Response, ApiError> {
    let op = body.op_name();
    match state.call(caller, false, body).await? {
        ResponseBody::Lease(result) => match result.reply {
            LeaseReply::SessionKept(grant) => {
                let remaining = grant.expires_at_ms.saturating_sub(grant.log_time_ms);
                Ok(axum::Json(SessionJson {
                    session_id: grant.session_id.to_string(),
                    group_id: grant.group_id.0,
                    created: grant.created,
                    ttl_ms: grant.ttl_ms,
                    remaining_ttl_ms: remaining,
                    expiry_time: rfc3339_millis(add_ms(arrived, remaining)),
                    log_time_ms: grant.log_time_ms,
                    expires_at_log_ms: grant.expires_at_ms,
                    bound_leases: grant.bound_leases,
                })
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
