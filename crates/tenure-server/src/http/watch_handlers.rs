//! `GET /v1/tenants/{tenant_id}/watch`: a tenant's, a resource's (`?resource=`) or a prefix's
//! (`?prefix=`) lease events as server-sent events, each group's in log order. Every event
//! (`ACQUIRED`, `RELEASED`, `EXPIRED`, `HANDED_OFF`) carries its group and log index; after each
//! page of a group comes a `through` event whose SSE id is the stream's cursor (`GROUP:INDEX,...`),
//! so that a reconnecting `EventSource` resumes with `Last-Event-ID` (or `?after=`) exactly after
//! what it saw. A watcher whose cursor is older than a node's retained events gets a `resync`
//! event (with the resource's lease then) instead of a silent gap.
//!
//! One task per group the selector spans long-polls the request path (`WatchPoll`) and feeds a
//! bounded channel: a client that stops reading stops the polls, a closed connection ends them.
//!
//! Must not depend on: the node's internals (only the request path's `Service`).

use std::collections::BTreeMap;
use std::convert::Infallible;

use axum::response::sse::{Event, KeepAlive, Sse};
use tenure_core::{GroupId, PlacementMap, WatchSelector};
use tenure_proto::client::{WATCH_EVENTS_PER_ANSWER_MAX, WATCH_WAIT_MS_MAX, WatchPage, WatchPoll};
use tokio::sync::mpsc;

use super::*;

/// Query of the watch route.
#[derive(Debug, Deserialize)]
pub(super) struct WatchQuery {
    resource: Option<String>,
    prefix: Option<String>,
    after: Option<String>,
    stale: Option<bool>,
}

/// Events buffered per stream before its polls pause.
const SSE_BUFFER_EVENTS: usize = 512;
/// Longest cursor accepted, in bytes.
const CURSOR_BYTES_MAX: usize = 16 * 1024;
/// Pause after a retryable refusal of a poll.
const RETRY_PAUSE: Duration = Duration::from_millis(250);
/// Below this poll wait, empty answers are paced by [`RETRY_PAUSE`].
const POLL_WAIT_MS_PACED: u32 = 1_000;
/// Time kept from the caller's timeout for the answer of a parked poll.
const POLL_ANSWER_MARGIN: Duration = Duration::from_millis(500);

pub(super) async fn watch_events(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    PathParams(tenant_id): PathParams<String>,
    QueryParams(query): QueryParams<WatchQuery>,
) -> Result<Response, ApiError> {
    auth::check_tenant(&caller.principal, &tenant_id)?;
    let selector = match (query.resource, query.prefix) {
        (Some(_), Some(_)) => return Err(invalid("give resource or prefix, not both")),
        (Some(resource_id), None) => {
            WatchSelector::Resource(ResourceKey::new(tenant_id, resource_id))
        }
        (None, Some(prefix)) => WatchSelector::Prefix { tenant_id, prefix },
        (None, None) => WatchSelector::Tenant(tenant_id),
    };
    selector
        .validate()
        .map_err(|error| invalid(error.to_string()))?;
    let last_event_id = headers
        .get("last-event-id")
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned);
    let cursor = parse_cursor(last_event_id.or(query.after).as_deref().unwrap_or(""))?;
    let stale = query.stale.unwrap_or(false);
    let groups: Vec<u32> = match &selector {
        WatchSelector::Resource(key) => vec![resource_group(&state, &caller, key).await?],
        WatchSelector::Tenant(_) | WatchSelector::Prefix { .. } => {
            (0..state.groups(&caller).await?).collect()
        }
    };
    let wait_ms = caller
        .timeout
        .saturating_sub(POLL_ANSWER_MARGIN)
        .as_millis()
        .min(u128::from(WATCH_WAIT_MS_MAX));
    let wait_ms = u32::try_from(wait_ms).unwrap_or(WATCH_WAIT_MS_MAX);
    let (events, received) = mpsc::channel::<Event>(SSE_BUFFER_EVENTS);
    let shared_cursor = Arc::new(std::sync::Mutex::new(cursor.clone()));
    for group_id in groups {
        let poller = GroupPoller {
            state: state.clone(),
            caller: Caller {
                principal: caller.principal.clone(),
                claimed: caller.claimed,
                timeout: caller.timeout,
            },
            selector: selector.clone(),
            group_id,
            stale,
            wait_ms,
            events: events.clone(),
            cursor: Arc::clone(&shared_cursor),
        };
        tokio::spawn(poller.run(cursor.get(&group_id).copied()));
    }
    let stream = futures_util::stream::unfold(received, |mut received| async move {
        let event = received.recv().await?;
        Some((Ok::<_, Infallible>(event), received))
    });
    Ok(Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response())
}

/// The group of a resource, from the cluster's current placement map.
async fn resource_group(
    state: &AppState,
    caller: &Caller,
    key: &ResourceKey,
) -> Result<u32, ApiError> {
    match state.call(caller, false, RequestBody::Routing).await? {
        ResponseBody::Routing(table) => {
            let slots = table.slot_groups.into_iter().map(GroupId).collect();
            let map = PlacementMap::from_slots(table.placement_version, slots)
                .map_err(|error| ApiError::new(ErrorCode::Internal, error.to_string()))?;
            Ok(map.group_of(&key.tenant_id, &key.resource_id).0)
        }
        other => Err(unexpected("routing", &other)),
    }
}

/// A cursor `GROUP:INDEX,...` (empty: from now), bounded in length.
fn parse_cursor(text: &str) -> Result<BTreeMap<u32, u64>, ApiError> {
    if text.len() > CURSOR_BYTES_MAX {
        return Err(invalid(format!(
            "the cursor is longer than {CURSOR_BYTES_MAX} bytes"
        )));
    }
    tenure_core::parse_watch_cursor(text).map_err(invalid)
}

/// Long-polls one group for one SSE stream.
struct GroupPoller {
    state: AppState,
    caller: Caller,
    selector: WatchSelector,
    group_id: u32,
    stale: bool,
    wait_ms: u32,
    events: mpsc::Sender<Event>,
    cursor: Arc<std::sync::Mutex<BTreeMap<u32, u64>>>,
}

impl GroupPoller {
    async fn run(self, mut after: Option<u64>) {
        loop {
            let poll = WatchPoll {
                group_id: self.group_id,
                selector: self.selector.clone(),
                after_index: after,
                wait_ms: if after.is_some() { self.wait_ms } else { 0 },
                events_max: WATCH_EVENTS_PER_ANSWER_MAX,
            };
            let answer = tokio::select! {
                answer = self.state.call(&self.caller, self.stale, RequestBody::Watch(poll)) => answer,
                () = self.events.closed() => return,
            };
            let page = match answer {
                Ok(ResponseBody::Watch(page)) => page,
                Ok(other) => {
                    let _ = self.send_error(&unexpected("watch", &other)).await;
                    return;
                }
                Err(error) if error.error.retryable => {
                    let pause = error
                        .error
                        .retry_after_ms
                        .map_or(RETRY_PAUSE, |ms| Duration::from_millis(u64::from(ms)));
                    tokio::time::sleep(pause.max(RETRY_PAUSE)).await;
                    continue;
                }
                Err(error) => {
                    let _ = self.send_error(&error).await;
                    return;
                }
            };
            let empty = page.events.is_empty();
            match self.deliver(after, page).await {
                Some(through) => after = Some(through),
                None => return,
            }
            // A caller's timeout too short to park a poll: pace the polls instead.
            if empty && self.wait_ms < POLL_WAIT_MS_PACED {
                tokio::time::sleep(RETRY_PAUSE).await;
            }
        }
    }

    /// Sends one page as SSE events; the index it covers through, or `None` when the stream is
    /// gone.
    async fn deliver(&self, asked_after: Option<u64>, page: WatchPage) -> Option<u64> {
        let arrived = SystemTime::now();
        let group_id = page.group_id;
        let through = page.through_index;
        if asked_after.is_some_and(|asked| through <= asked) && !page.resync {
            // A replica behind the one that answered before: nothing new.
            return Some(asked_after.unwrap_or(through));
        }
        let marker = if asked_after.is_none() {
            Some("started")
        } else if page.resync {
            Some("resync")
        } else {
            None
        };
        if marker.is_none() {
            for event in page.events {
                let data = serde_json::json!({
                    "group_id": event.group_id,
                    "index": event.index,
                    "log_time_ms": event.log_time_ms,
                    "tenant_id": event.key.tenant_id,
                    "resource_id": event.key.resource_id,
                    "fencing_token": event.kind.fencing_token(),
                    "detail": event.kind,
                });
                let sse = Event::default()
                    .event(event.kind.as_str())
                    .data(data.to_string());
                self.events.send(sse).await.ok()?;
            }
        }
        let id = {
            let mut cursor = self
                .cursor
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            cursor.insert(group_id, through);
            tenure_core::render_watch_cursor(&cursor)
        };
        let current = page
            .current
            .map(|view| serde_json::to_value(lease_json(view, arrived, Some(through))).ok())
            .unwrap_or(None);
        let data = serde_json::json!({
            "group_id": group_id,
            "through_index": through,
            "current": current,
        });
        let sse = Event::default()
            .event(marker.unwrap_or("through"))
            .id(id)
            .data(data.to_string());
        self.events.send(sse).await.ok()?;
        Some(through)
    }

    async fn send_error(&self, error: &ApiError) -> Result<(), mpsc::error::SendError<Event>> {
        let data = serde_json::json!({
            "code": error.error.code.as_str(),
            "message": error.error.message,
            "retryable": error.error.retryable,
        });
        self.events
            .send(Event::default().event("error").data(data.to_string()))
            .await
    }
}
