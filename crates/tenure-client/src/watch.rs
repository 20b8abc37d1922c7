//! Watching leases: [`Client::watch`] streams the ACQUIRED, RELEASED, EXPIRED and HANDED_OFF
//! events of a resource, a tenant or a key prefix, in each group's log order, resumable from a
//! cursor (the group log index delivered through, per group); [`Client::watch_poll`] is the one
//! request underneath.
//!
//! One poller task per group the selector spans (one group for a resource, every group for a
//! tenant or a prefix) long-polls that group (any replica may answer with `stale_read`; its
//! leader otherwise) and feeds a bounded channel: a consumer that stops reading stops the
//! polls, and dropping the [`Watch`] ends them. Events of different groups are not ordered with
//! each other (they are different logs); within a group they come in log order, whole entries
//! at a time, each followed by a [`WatchItem::Through`] marker the cursor advances on. A
//! watcher that falls behind the server's retained window gets [`WatchItem::Resync`] (the
//! events in between are lost: re-read the state) instead of a silent gap.
//!
//! Must not depend on: any server crate.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::Stream;
use tenure_core::{LeaseView, WatchEvent, WatchSelector};
use tenure_proto::client::{
    RequestBody, RequestFlags, ResponseBody, WATCH_EVENTS_PER_ANSWER_MAX, WATCH_WAIT_MS_MAX,
    WatchPage, WatchPoll,
};
use tokio::sync::mpsc;

use crate::{Client, ClientError};

/// Where a watch starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchFrom {
    /// From now: each group first yields [`WatchItem::Started`] with its current index (and,
    /// for a resource, its lease then).
    Now,
    /// After these indexes (a [`Watch::cursor`] saved earlier); a group missing from the map
    /// starts now.
    Cursor(BTreeMap<u32, u64>),
}

/// What a [`Watch`] yields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchItem {
    /// The watch started in `group_id` at `through_index` (for a resource: its lease then).
    Started {
        /// The group.
        group_id: u32,
        /// Events after this index follow.
        through_index: u64,
        /// For a resource selector, its lease as of `through_index`.
        current: Option<LeaseView>,
    },
    /// An event, in its group's log order.
    Event(WatchEvent),
    /// Every selected event of `group_id` up to `index` has been yielded.
    Through {
        /// The group.
        group_id: u32,
        /// The log index.
        index: u64,
    },
    /// The events of `group_id` between the cursor and `through_index` are no longer retained
    /// (the watcher fell behind, or the node restarted or installed a snapshot): re-read the
    /// state (`current` for a resource) and go on from `through_index`.
    Resync {
        /// The group.
        group_id: u32,
        /// Events after this index follow.
        through_index: u64,
        /// For a resource selector, its lease as of `through_index`.
        current: Option<LeaseView>,
    },
}

/// Options of a watch.
#[derive(Debug, Clone)]
pub struct WatchOptions {
    /// Let any replica answer (from its applied state: possibly behind the leader, never out of
    /// order). Default false: the group's leader.
    pub stale_read: bool,
    /// How long one poll may wait on the server for events (at most 30 s).
    pub poll_wait: Duration,
    /// Most events per poll (at most 256).
    pub events_per_poll_max: u32,
    /// Items buffered for the consumer before the polls pause.
    pub buffer_items: usize,
}

impl Default for WatchOptions {
    fn default() -> Self {
        WatchOptions {
            stale_read: false,
            poll_wait: Duration::from_secs(20),
            events_per_poll_max: WATCH_EVENTS_PER_ANSWER_MAX,
            buffer_items: 1_024,
        }
    }
}

/// A stream of [`WatchItem`]s (see the module documentation). An error that retrying cannot
/// help (for example UNAUTHORIZED) is yielded once and ends that group's polling.
#[derive(Debug)]
pub struct Watch {
    items: mpsc::Receiver<Result<WatchItem, ClientError>>,
    cursor: BTreeMap<u32, u64>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Watch {
    /// The index each group has been yielded through: resume with [`WatchFrom::Cursor`].
    pub fn cursor(&self) -> &BTreeMap<u32, u64> {
        &self.cursor
    }

    /// The next item (the same as the stream's next).
    pub async fn next_item(&mut self) -> Option<Result<WatchItem, ClientError>> {
        let item = self.items.recv().await;
        self.note(&item);
        item
    }

    fn note(&mut self, item: &Option<Result<WatchItem, ClientError>>) {
        match item {
            Some(Ok(
                WatchItem::Started {
                    group_id,
                    through_index,
                    ..
                }
                | WatchItem::Resync {
                    group_id,
                    through_index,
                    ..
                },
            )) => {
                self.cursor.insert(*group_id, *through_index);
            }
            Some(Ok(WatchItem::Through { group_id, index })) => {
                self.cursor.insert(*group_id, *index);
            }
            _ => {}
        }
    }
}

impl Stream for Watch {
    type Item = Result<WatchItem, ClientError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        let polled = this.items.poll_recv(cx);
        if let Poll::Ready(item) = &polled {
            this.note(item);
        }
        polled
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Pause after a retryable failure of a poll, doubling up to [`RETRY_PAUSE_MAX`].
const RETRY_PAUSE_MIN: Duration = Duration::from_millis(50);
const RETRY_PAUSE_MAX: Duration = Duration::from_secs(2);

impl Client {
    /// One watch poll of one group (see [`WatchPoll`]), to the group's leader or, with
    /// `stale_read`, any replica; retried (same poll) within the call timeout plus the wait.
    pub async fn watch_poll(
        &self,
        poll: WatchPoll,
        stale_read: bool,
    ) -> Result<WatchPage, ClientError> {
        let group = poll.group_id;
        let tenant = poll.selector.tenant_id().to_owned();
        let wait = Duration::from_millis(u64::from(poll.wait_ms));
        let flags = RequestFlags {
            stale_read,
            ..RequestFlags::default()
        };
        let deadline = crate::time::now() + wait + self.config().call_timeout;
        let attempt_timeout = self.config().attempt_timeout + wait;
        match self
            .call_with_attempts(
                Some(group),
                RequestBody::Watch(poll),
                flags,
                Some(&tenant),
                deadline,
                attempt_timeout,
            )
            .await?
        {
            ResponseBody::Watch(page) => Ok(page),
            _ => Err(ClientError::Protocol(
                "Watch answered with another kind".into(),
            )),
        }
    }

    /// Watches the events `selector` picks, from `from` (see the module documentation).
    pub async fn watch(
        &self,
        selector: WatchSelector,
        from: WatchFrom,
        options: WatchOptions,
    ) -> Result<Watch, ClientError> {
        selector
            .validate()
            .map_err(|error| ClientError::InvalidRequest(error.to_string()))?;
        let groups: Vec<u32> = match &selector {
            WatchSelector::Resource(key) => vec![self.group_of(key).await?],
            WatchSelector::Tenant(_) | WatchSelector::Prefix { .. } => {
                if self.routing().groups == 0 {
                    self.refresh_routing().await?;
                }
                (0..self.routing().groups).collect()
            }
        };
        let (items_tx, items) = mpsc::channel(options.buffer_items.max(1));
        let mut tasks = Vec::with_capacity(groups.len());
        for group_id in groups {
            let after = match &from {
                WatchFrom::Now => None,
                WatchFrom::Cursor(cursor) => cursor.get(&group_id).copied(),
            };
            let poller = GroupPoller {
                client: self.clone(),
                selector: selector.clone(),
                group_id,
                options: options.clone(),
                items: items_tx.clone(),
            };
            tasks.push(tokio::spawn(poller.run(after)));
        }
        Ok(Watch {
            items,
            cursor: BTreeMap::new(),
            tasks,
        })
    }
}

/// Polls one group for a [`Watch`].
struct GroupPoller {
    client: Client,
    selector: WatchSelector,
    group_id: u32,
    options: WatchOptions,
    items: mpsc::Sender<Result<WatchItem, ClientError>>,
}

impl GroupPoller {
    async fn run(self, mut after: Option<u64>) {
        let wait_ms = u32::try_from(self.options.poll_wait.as_millis())
            .unwrap_or(u32::MAX)
            .min(WATCH_WAIT_MS_MAX);
        let events_max = self
            .options
            .events_per_poll_max
            .clamp(1, WATCH_EVENTS_PER_ANSWER_MAX);
        let mut pause = RETRY_PAUSE_MIN;
        loop {
            let poll = WatchPoll {
                group_id: self.group_id,
                selector: self.selector.clone(),
                after_index: after,
                wait_ms: if after.is_some() { wait_ms } else { 0 },
                events_max,
            };
            let page = tokio::select! {
                page = self.client.watch_poll(poll, self.options.stale_read) => page,
                () = self.items.closed() => return,
            };
            let page = match page {
                Ok(page) => {
                    pause = RETRY_PAUSE_MIN;
                    page
                }
                Err(ClientError::Closed) => return,
                Err(error) if error.is_retryable() => {
                    let hinted = error.retry_after().unwrap_or(pause);
                    tokio::time::sleep(hinted.max(pause)).await;
                    pause = (pause * 2).min(RETRY_PAUSE_MAX);
                    continue;
                }
                Err(error) => {
                    let _ = self.items.send(Err(error)).await;
                    return;
                }
            };
            if !self.deliver(after, page, &mut after).await {
                return;
            }
        }
    }

    /// Sends one page's items; false when the watch is gone.
    async fn deliver(
        &self,
        asked_after: Option<u64>,
        page: WatchPage,
        after: &mut Option<u64>,
    ) -> bool {
        let mut items = Vec::with_capacity(page.events.len() + 1);
        let group_id = page.group_id;
        if asked_after.is_none() {
            items.push(WatchItem::Started {
                group_id,
                through_index: page.through_index,
                current: page.current,
            });
        } else if page.resync {
            items.push(WatchItem::Resync {
                group_id,
                through_index: page.through_index,
                current: page.current,
            });
        } else {
            // Never backwards: a replica behind the one that answered before has nothing new.
            if asked_after.is_some_and(|asked| page.through_index <= asked) {
                return true;
            }
            items.extend(page.events.into_iter().map(WatchItem::Event));
            items.push(WatchItem::Through {
                group_id,
                index: page.through_index,
            });
        }
        *after = Some(page.through_index);
        for item in items {
            if self.items.send(Ok(item)).await.is_err() {
                return false;
            }
        }
        true
    }
}
