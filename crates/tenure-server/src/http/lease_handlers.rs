//! Handlers of the lease routes (acquire, renew, release, transfer, get, list, check-fence):
//! decode, call the request path, encode.
//!
//! Must not depend on: the node's internals (only the request path's `Service`).

use super::*;

pub(super) async fn acquire(
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
        RequestBody::Lease(LeaseOp::Acquire(request)),
        false,
        arrived,
    )
    .await
}

/// Calls the service with an Acquire (`renewed == false`) or a Renew and shapes the grant.
pub(super) async fn grant_call(
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

pub(super) async fn renew(
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
    grant_call(
        &state,
        &caller,
        RequestBody::Lease(LeaseOp::Renew(request)),
        true,
        arrived,
    )
    .await
}

pub(super) async fn release(
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
        .call(
            &caller,
            false,
            RequestBody::Lease(LeaseOp::Release(request)),
        )
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

pub(super) async fn transfer(
    State(state): State<AppState>,
    caller: Caller,
    JsonBody(body): JsonBody<TransferJson>,
) -> Result<Response, ApiError> {
    let arrived = SystemTime::now();
    auth::check_tenant(&caller.principal, &body.tenant_id)?;
    let ttl_ms = ttl_from_json(body.ttl_seconds.as_ref(), body.ttl_ms)?;
    let request = TransferRequest {
        key: ResourceKey::new(body.tenant_id, body.resource_id),
        lease_id: parse_lease_id(&body.lease_id)?,
        holder_id: body.holder_id,
        new_holder_id: body.new_holder_id.clone(),
        ttl_ms,
        request_id: body.request_id,
    };
    match state
        .call(
            &caller,
            false,
            RequestBody::Lease(LeaseOp::Transfer(request)),
        )
        .await?
    {
        ResponseBody::Lease(result) => match result.reply {
            LeaseReply::Transferred(receipt) => Ok(axum::Json(TransferredJson {
                grant: grant_json(
                    receipt.grant,
                    arrived,
                    (result.replayed, result.replay),
                    result.group_id,
                    false,
                ),
                holder_id: body.new_holder_id,
                previous_lease_id: receipt.released.lease_id.to_string(),
                previous_fencing_token: receipt.released.fencing_token,
            })
            .into_response()),
            _ => Err(ApiError::new(
                ErrorCode::Internal,
                "the service answered transfer with another operation's reply",
            )),
        },
        other => Err(unexpected("transfer", &other)),
    }
}

pub(super) async fn get_lease(
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

/// `POST /v1/leases/check-fence`: whether a fencing token is the resource's current active
/// grant, answered linearizably by the group's leader (never from a follower's state).
pub(super) async fn check_fence(
    State(state): State<AppState>,
    caller: Caller,
    JsonBody(body): JsonBody<CheckFenceJson>,
) -> Result<Response, ApiError> {
    auth::check_tenant(&caller.principal, &body.tenant_id)?;
    let request = RequestBody::CheckFence {
        key: ResourceKey::new(body.tenant_id, body.resource_id),
        fencing_token: body.fencing_token,
    };
    match state.call(&caller, false, request).await? {
        ResponseBody::FenceChecked(result) => {
            let verdict = result.verdict;
            Ok(axum::Json(FenceCheckJson {
                current: verdict.current,
                fencing_token: body.fencing_token,
                status: verdict.status.as_str(),
                latest_fencing_token: verdict.latest_fencing_token,
                remaining_ttl_ms: verdict.remaining_ttl_ms,
                group_id: result.group_id,
                log_time_ms: result.log_time_ms,
            })
            .into_response())
        }
        other => Err(unexpected("check-fence", &other)),
    }
}

/// A position in a cross-group listing: `g<group>:<inner token>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ListCursor {
    pub(super) group: u32,
    pub(super) inner: Option<String>,
}

impl ListCursor {
    pub(super) fn parse(text: &str, groups: u32) -> Result<Self, ApiError> {
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

    pub(super) fn render(&self) -> String {
        format!("g{}:{}", self.group, self.inner.as_deref().unwrap_or(""))
    }
}

pub(super) async fn list_leases(
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
