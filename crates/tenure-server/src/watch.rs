//! Watches: the recent events of every group this node hosts a replica of, kept in a bounded
//! ring per group, and the polls that read them (`RequestBody::Watch`), held open until a
//! selected event arrives or their wait ends.
//!
//! Every entry the node applies, as leader or follower, reaches [`AppliedFeed`] (the storage's
//! apply observer), which answers parked AcquireWait calls (`crate::waits`) and records the
//! entry's events (`tenure_core::events_of`, the same on every replica) in the group's ring.
//! A ring knows the range of indexes it covers completely: from the first index it saw after
//! the node started (or after a jump: a snapshot install skips entries) to the last applied
//! one. It keeps at most [`EVENTS_RETAINED_PER_GROUP`] events; the oldest entries' events
//! leave first, and the covered range starts after them. A poll asking for events before the
//! covered range is answered `resync` (never with a silent gap).
//!
//! Bounded: the rings ([`EVENTS_RETAINED_PER_GROUP`] events per hosted group), the polls held
//! open at once per node ([`PARKED_POLLS_MAX`]; beyond, `OVERLOADED` with a retry hint), the
//! events per answer and the wait per poll (`tenure_proto::client`). Nothing here is
//! replicated: losing it (a restart) costs a watcher a resync, never a wrong event.
//!
//! Must not depend on: the transport or the request path (it sees applied entries only).

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use dashmap::DashMap;
use tenure_core::{ApplyOutput, Entry, ErrorCode, NegativeControl, WatchEvent, WatchSelector};
use tenure_proto::client::{WATCH_EVENTS_PER_ANSWER_MAX, WireError};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::metrics as m;
use crate::waits::WaitRegistry;

/// Events a group's ring keeps at most (whole entries leave first).
pub(crate) const EVENTS_RETAINED_PER_GROUP: usize = 4_096;

/// Polls held open on one node at once at most.
pub(crate) const PARKED_POLLS_MAX: usize = 16_384;

/// Retry hint of a poll refused because [`PARKED_POLLS_MAX`] were held.
const PARKED_POLLS_RETRY_AFTER_MS: u32 = 1_000;

/// The storage's apply observer of every replica on this node: feeds the parked waits and the
/// watch rings.
pub(crate) struct AppliedFeed {
    pub(crate) waits: Arc<WaitRegistry>,
    pub(crate) watches: Arc<WatchHub>,
}

impl tenure_storage::ApplyObserver for AppliedFeed {
    fn applied(&self, group: u32, index: u64, applied: Option<(&Entry, &ApplyOutput)>) {
        if let Some((_, output)) = applied {
            self.waits.observe(group, output);
        }
        self.watches.observe(group, index, applied);
    }
}

/// One group's retained events.
#[derive(Debug)]
struct Ring {
    /// The first index whose entry's events are all retained (every later applied index too).
    covered_from: u64,
    /// The last applied index seen (0: none yet).
    applied_through: u64,
    /// Retained events, in log order.
    events: VecDeque<WatchEvent>,
    /// Wakes the polls of this group: the last applied index seen.
    notify: watch::Sender<u64>,
}

impl Ring {
    fn new() -> Self {
        Ring {
            covered_from: 0,
            applied_through: 0,
            events: VecDeque::new(),
            notify: watch::Sender::new(0),
        }
    }
}

/// What a poll found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Found {
    /// Events after the poll's index, through `through_index` (possibly none, when the wait
    /// ended first).
    Events {
        events: Vec<WatchEvent>,
        through_index: u64,
    },
    /// The poll's index is before the retained range: resume after `through_index`.
    Resync { through_index: u64 },
}

/// The rings of every group hosted here and the polls on them (see the module documentation).
#[derive(Debug, Default)]
pub(crate) struct WatchHub {
    /// Per group (a shard lock each, not one lock for all: every replica's apply reaches here
    /// for every entry).
    rings: DashMap<u32, Ring>,
    parked: AtomicUsize,
    /// A guarantee broken on purpose (test builds only; see `tenure_core::NegativeControl`).
    negative_control: NegativeControl,
    /// Events seen, for [`NegativeControl::WatchDropsEvents`].
    events_seen: AtomicU64,
}

impl WatchHub {
    #[cfg(test)]
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(WatchHub::default())
    }

    /// A hub that breaks `negative_control` if it is a watch control (test builds only).
    pub(crate) fn with_negative_control(negative_control: NegativeControl) -> Arc<Self> {
        Arc::new(WatchHub {
            negative_control,
            ..WatchHub::default()
        })
    }

    /// The entry at `index` of `group` was applied (see [`AppliedFeed`]).
    pub(crate) fn observe(&self, group: u32, index: u64, applied: Option<(&Entry, &ApplyOutput)>) {
        let mut events = match applied {
            Some((entry, output)) => tenure_core::events_of(group, index, entry, output),
            None => Vec::new(),
        };
        if self
            .negative_control
            .breaks(NegativeControl::WatchDropsEvents)
        {
            events.retain(|_| self.events_seen.fetch_add(1, Ordering::Relaxed) % 7 != 6);
        }
        let mut ring = self.rings.entry(group).or_insert_with(Ring::new);
        if ring.applied_through == 0 || index != ring.applied_through + 1 {
            // The first entry seen, or a jump (a snapshot install): nothing before is covered.
            if ring.applied_through != 0 {
                ::metrics::counter!(m::WATCH_RING_RESETS_TOTAL).increment(1);
            }
            ring.events.clear();
            ring.covered_from = index;
        }
        ring.applied_through = index;
        if !events.is_empty() {
            ::metrics::counter!(m::WATCH_EVENTS_TOTAL).increment(events.len() as u64);
            // Room first, then the new events: the ring never holds more than its bound (but
            // for one entry larger than the ring, kept whole; its size is bounded by the entry's
            // own bounds), so its buffer, allocated at the bound with the group's first event,
            // does not grow. Growing by doubling copied a ring whole as it filled: a node just
            // restarted grew all 64 in an expiry storm's first second
            // (`bench/results/2026-12-07/storm-watch-ring/`).
            if ring.events.capacity() == 0 {
                ring.events.reserve_exact(EVENTS_RETAINED_PER_GROUP);
            }
            while ring.events.len() + events.len() > EVENTS_RETAINED_PER_GROUP {
                // Whole entries leave: the oldest entry's every event, and with it its index.
                // An empty ring leaves the loop here: the entry alone is larger than the ring.
                let Some(oldest) = ring.events.front().map(|event| event.index) else {
                    break;
                };
                while ring
                    .events
                    .front()
                    .is_some_and(|event| event.index == oldest)
                {
                    ring.events.pop_front();
                }
                ring.covered_from = ring.covered_from.max(oldest + 1);
            }
            ring.events.extend(events);
        }
        ring.notify.send_replace(index);
    }

    /// Drops `group`'s ring (its replica left this node): a poll parked on it wakes and parks
    /// again on a new, empty ring until its wait ends.
    pub(crate) fn forget(&self, group: u32) {
        self.rings.remove(&group);
    }

    /// Looks once: the selected events after `after_index` (at most `events_max`, whole
    /// entries), `None` when there are none yet, or a resync.
    fn look(
        &self,
        group: u32,
        selector: &WatchSelector,
        after_index: u64,
        events_max: usize,
    ) -> (Option<Found>, u64, watch::Receiver<u64>) {
        let ring = self.rings.entry(group).or_insert_with(Ring::new);
        let receiver = ring.notify.subscribe();
        let applied = ring.applied_through;
        if applied == 0 || after_index >= applied {
            // Nothing applied after the index yet (or this replica is behind the watcher).
            return (None, applied, receiver);
        }
        if after_index + 1 < ring.covered_from {
            return (
                Some(Found::Resync {
                    through_index: applied,
                }),
                applied,
                receiver,
            );
        }
        let start = ring
            .events
            .partition_point(|event| event.index <= after_index);
        let mut events = Vec::new();
        let mut through_index = applied;
        let mut last_index = None;
        for event in ring.events.range(start..) {
            if !selector.matches(&event.key) {
                continue;
            }
            if events.len() >= events_max && last_index != Some(event.index) {
                // Full: end at the previous entry's end.
                through_index = event.index - 1;
                break;
            }
            last_index = Some(event.index);
            events.push(event.clone());
        }
        if events.is_empty() {
            return (None, applied, receiver);
        }
        (
            Some(Found::Events {
                events,
                through_index,
            }),
            applied,
            receiver,
        )
    }

    /// Waits up to `wait` for the selected events of `group` after `after_index`.
    pub(crate) async fn poll(
        &self,
        group: u32,
        selector: &WatchSelector,
        after_index: u64,
        events_max: u32,
        wait: Duration,
    ) -> Result<Found, WireError> {
        let events_max = events_max.clamp(1, WATCH_EVENTS_PER_ANSWER_MAX) as usize;
        let deadline = Instant::now() + wait;
        let mut cursor = after_index;
        let mut parked: Option<ParkedPoll<'_>> = None;
        loop {
            let (found, applied, mut receiver) = self.look(group, selector, cursor, events_max);
            if let Some(found) = found {
                return Ok(found);
            }
            // Nothing selected through `applied`: go on from there (so the events looked at
            // may leave the ring without forcing a resync).
            cursor = cursor.max(applied);
            if Instant::now() >= deadline {
                return Ok(Found::Events {
                    events: Vec::new(),
                    through_index: cursor,
                });
            }
            if parked.is_none() {
                parked = Some(ParkedPoll::enter(&self.parked)?);
            }
            if receiver.borrow_and_update().eq(&applied) {
                let _ = tokio::time::timeout_at(deadline, receiver.changed()).await;
            }
        }
    }
}

/// A poll held open: counted against [`PARKED_POLLS_MAX`] while it lives.
struct ParkedPoll<'a> {
    count: &'a AtomicUsize,
}

impl<'a> ParkedPoll<'a> {
    fn enter(count: &'a AtomicUsize) -> Result<Self, WireError> {
        let before = count.fetch_add(1, Ordering::Relaxed);
        if before >= PARKED_POLLS_MAX {
            count.fetch_sub(1, Ordering::Relaxed);
            let mut error = WireError::new(
                ErrorCode::Overloaded,
                format!("{PARKED_POLLS_MAX} watch polls are held open on this node"),
            );
            error.retryable = true;
            error.retry_after_ms = Some(PARKED_POLLS_RETRY_AFTER_MS);
            return Err(error);
        }
        ::metrics::gauge!(m::WATCH_POLLS_PARKED).set((before + 1) as f64);
        Ok(ParkedPoll { count })
    }
}

impl Drop for ParkedPoll<'_> {
    fn drop(&mut self) {
        let after = self.count.fetch_sub(1, Ordering::Relaxed) - 1;
        ::metrics::gauge!(m::WATCH_POLLS_PARKED).set(after as f64);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use tenure_core::{
        AcquireRequest, Command, CommandResult, GroupId, LeaseGrant, LeaseId, LeaseOp,
        LeaseOutcome, LeaseReply, ResourceKey, WatchEventKind,
    };

    fn acquire(resource: &str, token: u64) -> (Entry, ApplyOutput) {
        let entry = Entry {
            log_time_ms: 100,
            command: Command::Lease(LeaseOp::Acquire(AcquireRequest {
                key: ResourceKey::new("t", resource),
                holder_id: "h".into(),
                ttl_ms: 1_000,
                request_id: format!("r{token}"),
            })),
        };
        let output = ApplyOutput {
            log_time_ms: 100,
            result: CommandResult::Lease(LeaseOutcome {
                result: Ok(LeaseReply::Acquired(LeaseGrant {
                    lease_id: LeaseId {
                        group_id: GroupId(1),
                        sequence: token,
                    },
                    fencing_token: token,
                    log_time_ms: 100,
                    expires_at_ms: 1_100,
                    ttl_ms: 1_000,
                    created: true,
                })),
                replayed: false,
                replay: None,
            }),
            reclaimed: Vec::new(),
            superseded: Vec::new(),
            waits_ended: Vec::new(),
        };
        (entry, output)
    }

    fn feed(hub: &WatchHub, index: u64, resource: &str) {
        let (entry, output) = acquire(resource, index);
        hub.observe(1, index, Some((&entry, &output)));
    }

    fn tokens(found: &Found) -> Vec<u64> {
        match found {
            Found::Events { events, .. } => events.iter().map(|e| e.kind.fencing_token()).collect(),
            Found::Resync { .. } => panic!("resync"),
        }
    }

    #[tokio::test]
    async fn polls_see_selected_events_in_order_and_resume_from_an_index() {
        let hub = WatchHub::new();
        let a = WatchSelector::Resource(ResourceKey::new("t", "a"));
        for index in 1..=6 {
            feed(&hub, index, if index % 2 == 0 { "a" } else { "b" });
        }
        hub.observe(1, 7, None);
        let found = hub.poll(1, &a, 0, 100, Duration::ZERO).await.unwrap();
        assert_eq!(tokens(&found), vec![2, 4, 6]);
        let Found::Events { through_index, .. } = found else {
            unreachable!()
        };
        assert_eq!(through_index, 7);
        // Resuming after index 4 sees only 6.
        let found = hub.poll(1, &a, 4, 100, Duration::ZERO).await.unwrap();
        assert_eq!(tokens(&found), vec![6]);
        let found = hub.poll(1, &a, 0, 1, Duration::ZERO).await.unwrap();
        assert_eq!(tokens(&found), vec![2]);
        let Found::Events { through_index, .. } = found else {
            unreachable!()
        };
        assert_eq!(
            through_index, 3,
            "a full answer ends before the next selected entry"
        );
        // Nothing new: an empty answer through the last index once the wait ends.
        let found = hub
            .poll(1, &a, 7, 100, Duration::from_millis(10))
            .await
            .unwrap();
        assert_eq!(
            found,
            Found::Events {
                events: Vec::new(),
                through_index: 7
            }
        );
        assert_eq!(hub.parked.load(Ordering::Relaxed), 0);
    }

    #[tokio::test]
    async fn a_parked_poll_wakes_on_the_next_selected_event() {
        let hub = WatchHub::new();
        feed(&hub, 1, "a");
        let a = WatchSelector::Resource(ResourceKey::new("t", "a"));
        let waiter = {
            let hub = hub.clone();
            let a = a.clone();
            tokio::spawn(async move { hub.poll(1, &a, 1, 10, Duration::from_secs(10)).await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        feed(&hub, 2, "b");
        feed(&hub, 3, "a");
        let found = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(tokens(&found), vec![3]);
    }

    /// One entry at `index` applying an acquire of "a" that also reclaimed `reclaimed` leases:
    /// one ACQUIRED and `reclaimed` EXPIRED events.
    fn entry_with_reclaims(index: u64, reclaimed: u64) -> (Entry, ApplyOutput) {
        let (entry, mut output) = acquire("a", index);
        output.reclaimed = (0..reclaimed)
            .map(|n| tenure_core::ReclaimedLease {
                tenant_id: "t".into(),
                resource_id: format!("x{index}-{n}").into(),
                lease_id: LeaseId {
                    group_id: GroupId(1),
                    sequence: index * 10_000 + n,
                },
                fencing_token: n,
                expires_at_ms: 50,
                session_id: None,
            })
            .collect();
        (entry, output)
    }

    /// The ring's buffer is allocated with the group's first event, at its bound, and never
    /// grows: room is made before an entry's events go in. Only an entry larger than the ring
    /// (kept whole) grows it. A ring with no event allocates nothing, and a forgotten ring is
    /// gone.
    #[tokio::test]
    async fn a_full_ring_makes_room_first_and_never_grows_its_buffer() {
        let hub = WatchHub::new();
        hub.observe(1, 1, None);
        assert_eq!(hub.rings.get(&1).unwrap().events.capacity(), 0);
        feed(&hub, 2, "a");
        let capacity = hub.rings.get(&1).unwrap().events.capacity();
        assert!(capacity >= EVENTS_RETAINED_PER_GROUP);
        // Entries of three events each, well past the bound.
        let last = EVENTS_RETAINED_PER_GROUP as u64;
        for index in 3..=last {
            let (entry, output) = entry_with_reclaims(index, 2);
            hub.observe(1, index, Some((&entry, &output)));
            let ring = hub.rings.get(&1).unwrap();
            assert!(ring.events.len() <= EVENTS_RETAINED_PER_GROUP);
            assert_eq!(ring.events.capacity(), capacity, "grew at index {index}");
            let front = ring.events.front().map_or(0, |event| event.index);
            assert!(front >= ring.covered_from);
            let front_events = ring.events.iter().filter(|e| e.index == front).count();
            assert_eq!(
                front_events,
                if front == 2 { 1 } else { 3 },
                "whole entries only"
            );
        }
        let all = WatchSelector::Tenant("t".into());
        let found = hub
            .poll(1, &all, last - 1, 10, Duration::ZERO)
            .await
            .unwrap();
        assert_eq!(tokens(&found).len(), 3, "the newest entry's three events");

        // An entry larger than the ring is kept whole, alone; the next entry replaces it.
        let big = EVENTS_RETAINED_PER_GROUP as u64 + 10;
        let (entry, output) = entry_with_reclaims(last + 1, big);
        hub.observe(1, last + 1, Some((&entry, &output)));
        {
            let ring = hub.rings.get(&1).unwrap();
            assert_eq!(ring.events.len() as u64, big + 1);
            assert_eq!(ring.covered_from, last + 1);
        }
        assert_eq!(
            hub.poll(1, &all, last - 1, 10, Duration::ZERO)
                .await
                .unwrap(),
            Found::Resync {
                through_index: last + 1
            }
        );
        feed(&hub, last + 2, "a");
        {
            let ring = hub.rings.get(&1).unwrap();
            assert_eq!(ring.events.len(), 1);
            assert_eq!(ring.covered_from, last + 2);
        }

        hub.forget(1);
        assert!(hub.rings.get(&1).is_none());
    }

    /// A ring's buffer is at most `EVENTS_RETAINED_PER_GROUP` of these (the memory every group
    /// with an event holds on every node hosting it; ARCHITECTURE's `watch` row quotes it).
    #[test]
    fn a_watch_event_is_at_most_176_bytes() {
        assert!(
            std::mem::size_of::<WatchEvent>() <= 176,
            "{} bytes",
            std::mem::size_of::<WatchEvent>()
        );
    }

    #[tokio::test]
    async fn a_poll_behind_the_retained_range_or_across_a_jump_is_told_to_resync() {
        let hub = WatchHub::new();
        let all = WatchSelector::Tenant("t".into());
        let total = EVENTS_RETAINED_PER_GROUP as u64 + 10;
        for index in 1..=total {
            feed(&hub, index, "a");
        }
        assert_eq!(
            hub.poll(1, &all, 5, 10, Duration::ZERO).await.unwrap(),
            Found::Resync {
                through_index: total
            }
        );
        // The oldest retained index still answers.
        let found = hub.poll(1, &all, 10, 1, Duration::ZERO).await.unwrap();
        assert_eq!(tokens(&found), vec![11]);
        // A jump (a snapshot install skipped entries): everything before is gone.
        feed(&hub, total + 100, "a");
        assert_eq!(
            hub.poll(1, &all, total, 10, Duration::ZERO).await.unwrap(),
            Found::Resync {
                through_index: total + 100
            }
        );
        let found = hub
            .poll(1, &all, total + 99, 10, Duration::ZERO)
            .await
            .unwrap();
        assert_eq!(tokens(&found), vec![total + 100]);
        let Found::Events { events, .. } = found else {
            unreachable!()
        };
        assert!(matches!(events[0].kind, WatchEventKind::Acquired { .. }));
    }
}
