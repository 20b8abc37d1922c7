//! Queued waits: the AcquireWait calls parked on this node until a later applied entry ends
//! their wait (a hand-off grants the resource, the wait passes, it is cancelled, or its waiter
//! is found dead), or until their park time runs out.
//!
//! A call registers before it proposes (so a hand-off applied before the proposer even sees
//! the `Queued` answer is not missed), and the registry watches every entry this node applies,
//! as leader or follower (through `crate::watch::AppliedFeed`, the storage's apply observer): a call parked on a node that
//! lost the leadership meanwhile is still answered when the node applies the hand-off. A call
//! whose park time ends first is answered with its queue position, and its client retries the
//! same request id (which finds the grant, the end of the wait, or the position again).
//!
//! Bounded: at most [`PARKED_WAITS_MAX`] calls are parked per node, and
//! [`PARKED_PER_WAIT_MAX`] per wait (the oldest leaves for a newer retry); beyond, a queued call
//! is answered with its position at once. Nothing here is replicated state: losing it (a restart)
//! costs a retry, never a grant.
//!
//! Must not depend on: the transport or the request path (it only sees applied outputs).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tenure_core::{ApplyOutput, LeaseError, LeaseReply};
use tokio::sync::oneshot;

use crate::metrics as m;

/// Most calls parked on one node at once.
pub(crate) const PARKED_WAITS_MAX: usize = 65_536;

/// Most calls parked on one wait (one request id): a client retrying it while earlier attempts
/// are still parked cannot pile calls up. Beyond it the oldest is answered at once (with the
/// position) to make room. (The waits themselves are bounded per resource and per tenant by the
/// state machine, so this bounds every tenant's parked calls too.)
pub(crate) const PARKED_PER_WAIT_MAX: usize = 4;

/// What a parked call is answered with: the grant a hand-off made, or why its wait ended.
pub(crate) type WaitAnswer = Result<LeaseReply, LeaseError>;

/// A queued wait, as the state machine names it: the group, the resource and the request id of
/// its AcquireWait.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct WaitKey {
    pub(crate) group: u32,
    pub(crate) tenant_id: String,
    pub(crate) resource_id: String,
    pub(crate) request_id: String,
}

type Parked = Vec<(u64, oneshot::Sender<WaitAnswer>)>;

/// The calls parked on this node (see the module documentation).
#[derive(Debug, Default)]
pub(crate) struct WaitRegistry {
    parked: Mutex<HashMap<WaitKey, Parked>>,
    count: AtomicUsize,
    next_id: AtomicU64,
}

fn lock(map: &Mutex<HashMap<WaitKey, Parked>>) -> MutexGuard<'_, HashMap<WaitKey, Parked>> {
    map.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl WaitRegistry {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(WaitRegistry::default())
    }

    /// Registers a call that may be parked on `key`; `None` when the node's bound is reached
    /// (the call is then answered with its position at once).
    pub(crate) fn register(self: &Arc<Self>, key: WaitKey) -> Option<Registration> {
        let mut parked = lock(&self.parked);
        if self.count.load(Ordering::Relaxed) >= PARKED_WAITS_MAX {
            return None;
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (sender, receiver) = oneshot::channel();
        let calls = parked.entry(key.clone()).or_default();
        if calls.len() >= PARKED_PER_WAIT_MAX {
            // Dropping its sender ends the oldest call's park (it answers with the position).
            calls.remove(0);
            self.count.fetch_sub(1, Ordering::Relaxed);
        }
        calls.push((id, sender));
        let count = self.count.fetch_add(1, Ordering::Relaxed) + 1;
        ::metrics::gauge!(m::WAITS_PARKED).set(count as f64);
        Some(Registration {
            registry: Arc::clone(self),
            key,
            id,
            receiver: Some(receiver),
        })
    }

    fn unregister(&self, key: &WaitKey, id: u64) {
        let mut parked = lock(&self.parked);
        let Some(calls) = parked.get_mut(key) else {
            return;
        };
        let before = calls.len();
        calls.retain(|(call, _)| *call != id);
        let removed = before - calls.len();
        if calls.is_empty() {
            parked.remove(key);
        }
        let count = self.count.fetch_sub(removed, Ordering::Relaxed) - removed;
        ::metrics::gauge!(m::WAITS_PARKED).set(count as f64);
    }

    /// Calls parked now.
    #[cfg(test)]
    pub(crate) fn parked(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }
}

impl WaitRegistry {
    /// What applying an entry of `group` produced (every replica's applies reach here through
    /// `crate::watch::AppliedFeed`): answers the calls parked on the waits it ended.
    pub(crate) fn observe(&self, group: u32, output: &ApplyOutput) {
        if output.waits_ended.is_empty() {
            return;
        }
        for ended in &output.waits_ended {
            if ended.outcome.is_ok() {
                ::metrics::counter!(m::WAIT_HAND_OFFS_TOTAL).increment(1);
            }
        }
        if self.count.load(Ordering::Relaxed) == 0 {
            return;
        }
        let mut parked = lock(&self.parked);
        for ended in &output.waits_ended {
            let key = WaitKey {
                group,
                tenant_id: ended.tenant_id.to_string(),
                resource_id: ended.resource_id.to_string(),
                request_id: ended.request_id.to_string(),
            };
            let Some(calls) = parked.remove(&key) else {
                continue;
            };
            self.count.fetch_sub(calls.len(), Ordering::Relaxed);
            for (_, sender) in calls {
                // A call that stopped waiting dropped its receiver: nothing to answer.
                let _ = sender.send(ended.outcome.clone());
            }
        }
        ::metrics::gauge!(m::WAITS_PARKED).set(self.count.load(Ordering::Relaxed) as f64);
    }
}

/// One call's registration; dropping it unregisters the call.
#[derive(Debug)]
pub(crate) struct Registration {
    registry: Arc<WaitRegistry>,
    key: WaitKey,
    id: u64,
    receiver: Option<oneshot::Receiver<WaitAnswer>>,
}

impl Registration {
    /// Waits up to `park` for the wait's end. `None` when the park time ran out first.
    pub(crate) async fn wait(&mut self, park: std::time::Duration) -> Option<WaitAnswer> {
        let receiver = self.receiver.as_mut()?;
        match tokio::time::timeout(park, receiver).await {
            Ok(Ok(answer)) => {
                self.receiver = None;
                Some(answer)
            }
            Ok(Err(_)) | Err(_) => None,
        }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        if self.receiver.is_some() {
            self.registry.unregister(&self.key, self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use std::time::Duration;
    use tenure_core::{CommandResult, GroupId, LeaseGrant, LeaseId, WaitEndReason, WaitEnded};

    fn key(request: &str) -> WaitKey {
        WaitKey {
            group: 3,
            tenant_id: "t".into(),
            resource_id: "r".into(),
            request_id: request.into(),
        }
    }

    fn output(request: &str, outcome: WaitAnswer) -> ApplyOutput {
        ApplyOutput {
            log_time_ms: 10,
            result: CommandResult::Expire { more_due: false },
            reclaimed: Vec::new(),
            superseded: Vec::new(),
            waits_ended: vec![WaitEnded {
                tenant_id: "t".into(),
                resource_id: "r".into(),
                holder_id: "h".into(),
                request_id: request.into(),
                queued_at_ms: 1,
                wait_until_ms: 100,
                outcome,
                previous_fencing_token: None,
            }],
        }
    }

    #[tokio::test]
    async fn one_wait_parks_a_bounded_number_of_calls_the_oldest_leaving_first() {
        let registry = WaitRegistry::new();
        let mut calls: Vec<Registration> = (0..PARKED_PER_WAIT_MAX)
            .map(|_| registry.register(key("a")).unwrap())
            .collect();
        assert_eq!(registry.parked(), PARKED_PER_WAIT_MAX);
        // One more retry of the same wait: the oldest call is answered at once (its position).
        let _newest = registry.register(key("a")).unwrap();
        assert_eq!(registry.parked(), PARKED_PER_WAIT_MAX);
        assert_eq!(calls[0].wait(Duration::from_secs(5)).await, None);
        drop(calls.remove(0));
        assert_eq!(registry.parked(), PARKED_PER_WAIT_MAX);
        drop(calls);
        assert_eq!(registry.parked(), 1);
    }

    #[tokio::test]
    async fn an_applied_end_answers_every_call_parked_on_it_and_only_those() {
        let registry = WaitRegistry::new();
        let mut first = registry.register(key("a")).unwrap();
        let mut retry = registry.register(key("a")).unwrap();
        let mut other = registry.register(key("b")).unwrap();
        assert_eq!(registry.parked(), 3);
        let grant = LeaseReply::Acquired(LeaseGrant {
            lease_id: LeaseId {
                group_id: GroupId(3),
                sequence: 7,
            },
            fencing_token: 7,
            log_time_ms: 10,
            expires_at_ms: 1_010,
            ttl_ms: 1_000,
            created: true,
        });
        registry.observe(3, &output("a", Ok(grant.clone())));
        // Another group's entry with the same names is not this wait.
        registry.observe(4, &output("b", Ok(grant.clone())));
        assert_eq!(
            first.wait(Duration::from_secs(1)).await,
            Some(Ok(grant.clone()))
        );
        assert_eq!(retry.wait(Duration::from_secs(1)).await, Some(Ok(grant)));
        assert_eq!(other.wait(Duration::from_millis(20)).await, None);
        assert_eq!(registry.parked(), 1);
        drop(other);
        assert_eq!(registry.parked(), 0);
        let ended = Err(LeaseError::WaitEnded {
            reason: WaitEndReason::TimedOut,
        });
        // Nobody parked: nothing to answer, nothing kept.
        registry.observe(3, &output("a", ended));
        assert_eq!(registry.parked(), 0);
    }
}
