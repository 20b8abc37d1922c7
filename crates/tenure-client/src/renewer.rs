//! The renewer: one task per client that keeps every auto-renewed [`crate::Lease`] alive.
//!
//! Each lease is due for renewal `renew_after_ppm` of its ttl after the send time of its last
//! confirmed acquire or renewal. Due leases wait in one queue per (group, tenant) (the leases one
//! Batch request may carry), and the queues are ordered by their most urgent lease. Whenever a
//! batch slot is free (at most `batches_inflight_max` batches in flight), the queue holding the
//! most urgent lease sends one Batch request: its due leases, most urgent first, with the leases
//! of the same queue due within the coalescing window (at most a sixth of their ttl), up to
//! `batch_ops_max` operations. Leases renewed in one batch share a send time, so they stay due
//! together: cohorts only merge, and holding N leases costs about groups x cohorts requests per
//! renewal period instead of N.
//!
//! Scheduling costs O(log n) per lease renewed, whatever the number of leases held: a batch looks
//! at no more than `BATCH_SCAN_FACTOR` x `batch_ops_max` leases of its queue, and nothing walks
//! the whole set of due leases. (With a million leases held, a renewer that regrouped every due
//! lease each time a batch finished fell behind, and the further behind it was the more each
//! batch cost, until leases reached their loss time.)
//!
//! The renewer also fires each lease's loss signal: when a renewal is refused, or when its safe
//! deadline less the loss-signal lead comes without a confirmed renewal.
//!
//! Must not depend on: connections (it calls the client).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use tenure_core::{LeaseId, LeaseOp, LeaseReply, RenewRequest};
use tokio::sync::{Semaphore, mpsc};
use tracing::debug;

use crate::client::{Client, ClientInner};
use crate::error::ClientError;
use crate::handle::{LeaseShared, LeaseState, LossReason, RenewOutcome, RenewerCommand};

/// A batch looks at no more than this many times `batch_ops_max` queued leases (leases inside
/// the coalescing window but outside their own, shorter one are looked at and left).
const BATCH_SCAN_FACTOR: usize = 4;

struct Entry {
    lease: Arc<LeaseShared>,
    /// The lease's (group, tenant) queue.
    queue: usize,
    /// Whether the renewer renews it (else it only watches its deadline).
    auto_renew: bool,
    next_renew_at: Instant,
    loss_at: Instant,
    /// When the lease becomes at risk unless a renewal is confirmed first.
    at_risk_at: Instant,
    /// Whether it is at risk now.
    at_risk: bool,
    in_flight: bool,
    failures: u32,
}

/// The due leases of one (group, tenant): the leases one Batch request may carry.
struct DueQueue {
    group: u32,
    tenant: String,
    due: BTreeSet<(Instant, u64)>,
}

/// Due leases, one queue per (group, tenant), the queues ordered by their earliest due time.
#[derive(Default)]
struct DueQueues {
    queues: Vec<DueQueue>,
    /// Queue index by group, then tenant (looked up without allocating).
    index: HashMap<u32, HashMap<String, usize>>,
    /// `(earliest due time, queue)` of every non-empty queue.
    by_earliest: BTreeSet<(Instant, usize)>,
}

impl DueQueues {
    /// The queue of `(group, tenant)`, made on first use (queues are never removed: there are
    /// at most groups x tenants of them).
    fn queue_of(&mut self, group: u32, tenant: &str) -> usize {
        if let Some(&queue) = self.index.get(&group).and_then(|map| map.get(tenant)) {
            return queue;
        }
        let queue = self.queues.len();
        self.queues.push(DueQueue {
            group,
            tenant: tenant.to_owned(),
            due: BTreeSet::new(),
        });
        self.index
            .entry(group)
            .or_default()
            .insert(tenant.to_owned(), queue);
        queue
    }

    fn earliest(&self, queue: usize) -> Option<Instant> {
        self.queues
            .get(queue)
            .and_then(|q| q.due.first().map(|(at, _)| *at))
    }

    /// Runs `change` on one queue and keeps `by_earliest` in step with its earliest due time.
    fn update(&mut self, queue: usize, change: impl FnOnce(&mut BTreeSet<(Instant, u64)>)) {
        let before = self.earliest(queue);
        let Some(q) = self.queues.get_mut(queue) else {
            return;
        };
        change(&mut q.due);
        let after = self.earliest(queue);
        if before != after {
            if let Some(at) = before {
                self.by_earliest.remove(&(at, queue));
            }
            if let Some(at) = after {
                self.by_earliest.insert((at, queue));
            }
        }
    }

    fn insert(&mut self, queue: usize, at: Instant, id: u64) {
        self.update(queue, |due| {
            due.insert((at, id));
        });
    }

    fn remove(&mut self, queue: usize, at: Instant, id: u64) {
        self.update(queue, |due| {
            due.remove(&(at, id));
        });
    }

    /// The earliest due time of all leases, and its queue.
    fn first(&self) -> Option<(Instant, usize)> {
        self.by_earliest.first().copied()
    }
}

struct Renewer {
    weak: Weak<ClientInner>,
    entries: BTreeMap<u64, Entry>,
    /// Handles of each lease (usually one).
    by_lease: BTreeMap<LeaseId, Vec<u64>>,
    due: DueQueues,
    deadlines: BTreeSet<(Instant, u64)>,
    /// `(at_risk_at, id)` of the entries not at risk yet.
    risks: BTreeSet<(Instant, u64)>,
    /// Entries at risk now.
    at_risk: u64,
    batches: Arc<Semaphore>,
    blocked: bool,
}

pub(crate) async fn run_renewer(
    weak: Weak<ClientInner>,
    mut commands: mpsc::Receiver<RenewerCommand>,
) {
    let batches_max = match weak.upgrade() {
        Some(inner) => inner.config.renew.batches_inflight_max,
        None => return,
    };
    let mut renewer = Renewer {
        weak,
        entries: BTreeMap::new(),
        by_lease: BTreeMap::new(),
        due: DueQueues::default(),
        deadlines: BTreeSet::new(),
        risks: BTreeSet::new(),
        at_risk: 0,
        batches: Arc::new(Semaphore::new(batches_max)),
        blocked: false,
    };
    loop {
        let wake = renewer.next_wake();
        let command = match wake {
            Some(at) => tokio::select! {
                command = commands.recv() => Some(command),
                () = tokio::time::sleep_until(at.into()) => None,
            },
            None => Some(commands.recv().await),
        };
        match command {
            Some(None) => break,
            Some(Some(RenewerCommand::Shutdown { done })) => {
                renewer.shutdown().await;
                let _ = done.send(());
                break;
            }
            Some(Some(command)) => renewer.handle(command),
            None => {}
        }
        renewer.tick();
    }
    for entry in renewer.entries.values() {
        entry.lease.mark(LeaseState::Lost(LossReason::ClientClosed));
    }
}

impl Renewer {
    fn client(&self) -> Option<Client> {
        self.weak.upgrade().map(|inner| Client { inner })
    }

    fn next_wake(&self) -> Option<Instant> {
        let loss = self.deadlines.first().map(|(at, _)| *at);
        let risk = self.risks.first().map(|(at, _)| *at);
        let due = if self.blocked {
            None
        } else {
            self.due.first().map(|(at, _)| at)
        };
        [loss, risk, due].into_iter().flatten().min()
    }

    /// Halfway between the time the lease's renewal is due (counted from the last confirmed
    /// send, so retries do not move it) and its loss time.
    fn at_risk_at(&self, lease: &LeaseShared, client: &Client, loss_at: Instant) -> Instant {
        let last_sent_at = lease
            .timing
            .lock()
            .map_or_else(|p| p.into_inner().last_sent_at, |t| t.last_sent_at);
        let due = self.renew_at(lease, client, last_sent_at);
        match loss_at.checked_duration_since(due) {
            Some(margin) => due + margin / 2,
            None => loss_at,
        }
    }

    fn loss_at(&self, lease: &LeaseShared, client: &Client) -> Instant {
        let lead = client
            .config()
            .renew
            .loss_signal_lead
            .min(Duration::from_millis(lease.ttl_ms / 10));
        lease
            .safe_deadline()
            .checked_sub(lead)
            .unwrap_or_else(Instant::now)
    }

    fn renew_after(&self, lease: &LeaseShared, client: &Client) -> Duration {
        let ppm = u64::from(client.config().renew.renew_after_ppm);
        Duration::from_micros(lease.ttl_ms.saturating_mul(ppm) / 1_000)
    }

    /// When to renew a lease whose last confirmed acquire or renewal was sent at `sent_at`:
    /// `renew_after_ppm` of its ttl later, but never later than halfway through its current
    /// safe window. A replayed answer grants only what is left of the original window, which
    /// can be shorter than the renewal period: scheduled by the ttl alone, the renewal came
    /// after the loss signal.
    fn renew_at(&self, lease: &LeaseShared, client: &Client, sent_at: Instant) -> Instant {
        let by_ttl = sent_at + self.renew_after(lease, client);
        let window = lease.safe_deadline().saturating_duration_since(sent_at);
        by_ttl.min(sent_at + window / 2)
    }

    fn set_counts(&self) {
        if let Some(inner) = self.weak.upgrade() {
            inner.leases_held.store(
                self.entries.len() as u64,
                std::sync::atomic::Ordering::Relaxed,
            );
            inner
                .leases_at_risk
                .store(self.at_risk, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Files `entry` under `id` in every index (due queue, deadlines, risks, by lease).
    fn insert(&mut self, id: u64, entry: Entry) {
        if entry.auto_renew && !entry.in_flight {
            self.due.insert(entry.queue, entry.next_renew_at, id);
        }
        self.deadlines.insert((entry.loss_at, id));
        if entry.at_risk {
            self.at_risk += 1;
        } else if entry.auto_renew {
            // A handle nobody renews is not at risk of falling behind: it only has a deadline.
            self.risks.insert((entry.at_risk_at, id));
        }
        self.by_lease
            .entry(entry.lease.lease_id)
            .or_default()
            .push(id);
        self.entries.insert(id, entry);
        self.set_counts();
    }

    fn remove(&mut self, id: u64) -> Option<Entry> {
        let entry = self.entries.remove(&id)?;
        if let Some(ids) = self.by_lease.get_mut(&entry.lease.lease_id) {
            ids.retain(|other| *other != id);
            if ids.is_empty() {
                self.by_lease.remove(&entry.lease.lease_id);
            }
        }
        if entry.auto_renew && !entry.in_flight {
            self.due.remove(entry.queue, entry.next_renew_at, id);
        }
        self.deadlines.remove(&(entry.loss_at, id));
        if entry.at_risk {
            self.at_risk = self.at_risk.saturating_sub(1);
        } else {
            self.risks.remove(&(entry.at_risk_at, id));
        }
        self.set_counts();
        Some(entry)
    }

    fn handle(&mut self, command: RenewerCommand) {
        let Some(client) = self.client() else {
            return;
        };
        match command {
            RenewerCommand::Register { lease, auto_renew } => {
                let id = lease.id;
                let sent_at = lease
                    .timing
                    .lock()
                    .map_or_else(|p| p.into_inner().last_sent_at, |t| t.last_sent_at);
                let next_renew_at = self.renew_at(&lease, &client, sent_at);
                let loss_at = self.loss_at(&lease, &client);
                let at_risk_at = self.at_risk_at(&lease, &client, loss_at);
                let queue = self.due.queue_of(lease.group_id, &lease.key.tenant_id);
                self.insert(
                    id,
                    Entry {
                        lease,
                        queue,
                        auto_renew,
                        next_renew_at,
                        loss_at,
                        at_risk_at,
                        at_risk: false,
                        in_flight: false,
                        failures: 0,
                    },
                );
            }
            RenewerCommand::Unregister { id, release } => {
                if let Some(entry) = self.remove(id) {
                    if release && entry.lease.is_held() {
                        tokio::spawn(release_in_background(client, entry.lease));
                    }
                }
            }
            RenewerCommand::Done(outcomes) => {
                self.blocked = false;
                for (id, outcome) in outcomes {
                    self.finish(&client, id, outcome);
                }
            }
            RenewerCommand::Released { lease_id } => {
                let ids = self.by_lease.get(&lease_id).cloned().unwrap_or_default();
                for id in ids {
                    if let Some(entry) = self.remove(id) {
                        entry.lease.mark(LeaseState::Released);
                    }
                }
            }
            RenewerCommand::Shutdown { done } => {
                let _ = done.send(());
            }
        }
    }

    fn finish(&mut self, client: &Client, id: u64, outcome: RenewOutcome) {
        let Some(mut entry) = self.remove(id) else {
            return;
        };
        if !entry.lease.is_held() {
            // The handle saw its deadline pass first; a lost lease stays lost.
            return;
        }
        entry.in_flight = false;
        let now = crate::time::now();
        match outcome {
            RenewOutcome::Renewed {
                sent_at,
                window_ttl_ms,
            } => {
                let window = client.config().safety.safe_window(window_ttl_ms);
                if let Ok(mut timing) = entry.lease.timing.lock() {
                    timing.safe_deadline = timing.safe_deadline.max(sent_at + window);
                    timing.last_sent_at = timing.last_sent_at.max(sent_at);
                    timing.renewals += 1;
                }
                entry.failures = 0;
                entry.next_renew_at = self.renew_at(&entry.lease, client, sent_at);
            }
            RenewOutcome::Gone(error) => {
                let (code, message) = match &error {
                    ClientError::Server { code, message, .. } => (*code, message.clone()),
                    other => (tenure_core::ErrorCode::Internal, other.to_string()),
                };
                entry
                    .lease
                    .mark(LeaseState::Lost(LossReason::Rejected { code, message }));
                return;
            }
            RenewOutcome::Retry => {
                entry.failures += 1;
                let backoff = Duration::from_millis(50u64 << entry.failures.min(5)).min(
                    Duration::from_millis(entry.lease.ttl_ms / 10).max(Duration::from_millis(10)),
                );
                entry.next_renew_at = now + backoff;
            }
        }
        entry.loss_at = self.loss_at(&entry.lease, client);
        entry.at_risk_at = self.at_risk_at(&entry.lease, client, entry.loss_at);
        // A renewal that moved the schedule past now ends the risk; a failed one, or a
        // confirmed one that did not move it (a replay with a short window), does not.
        if entry.at_risk && entry.at_risk_at > now {
            entry.at_risk = false;
            entry
                .lease
                .at_risk
                .store(false, std::sync::atomic::Ordering::Release);
        }
        self.insert(id, entry);
    }

    fn tick(&mut self) {
        let now = crate::time::now();
        // Loss signals first: a lease past its loss time is never renewed again.
        while let Some(&(at, id)) = self.deadlines.first() {
            if at > now {
                break;
            }
            if let Some(entry) = self.remove(id) {
                debug!(lease = %entry.lease.lease_id, "no renewal confirmed before the safe deadline");
                entry
                    .lease
                    .mark(LeaseState::Lost(LossReason::DeadlineWithoutRenewal));
            }
        }
        // Then leases whose renewal is overdue: at risk until one is confirmed. The counts are
        // published before the handles' flags, so a handle seen at risk is already counted.
        let mut became_at_risk = Vec::new();
        while let Some(&(at, id)) = self.risks.first() {
            if at > now {
                break;
            }
            self.risks.remove(&(at, id));
            if let Some(entry) = self.entries.get_mut(&id) {
                entry.at_risk = true;
                self.at_risk += 1;
                became_at_risk.push(entry.lease.clone());
            }
        }
        if !became_at_risk.is_empty() {
            if let Some(inner) = self.weak.upgrade() {
                inner.counters.leases_at_risk_total.fetch_add(
                    became_at_risk.len() as u64,
                    std::sync::atomic::Ordering::Relaxed,
                );
            }
            self.set_counts();
            debug!(
                leases = became_at_risk.len(),
                at_risk = self.at_risk,
                "renewals overdue: leases at risk"
            );
            for lease in became_at_risk {
                lease
                    .at_risk
                    .store(true, std::sync::atomic::Ordering::Release);
            }
        }
        if self.blocked {
            return;
        }
        let Some(client) = self.client() else {
            return;
        };
        let config = &client.config().renew;
        // One batch per free slot, each from the queue holding the most urgent lease.
        while let Some((first_due, queue)) = self.due.first() {
            if first_due > now {
                return;
            }
            let Ok(permit) = self.batches.clone().try_acquire_owned() else {
                // Every batch slot is busy; resume when one finishes.
                self.blocked = true;
                return;
            };
            let mut picked = Vec::with_capacity(config.batch_ops_max.min(64));
            // Queued ids without an entry (never expected: the two are changed together) are
            // dropped from the queue, so the loop always makes progress.
            let mut stale = Vec::new();
            let horizon = now + config.coalesce_window;
            let scan_max = config.batch_ops_max.saturating_mul(BATCH_SCAN_FACTOR);
            if let Some(q) = self.due.queues.get(queue) {
                for &(at, id) in q.due.range(..=(horizon, u64::MAX)).take(scan_max) {
                    if picked.len() >= config.batch_ops_max {
                        break;
                    }
                    let Some(entry) = self.entries.get(&id) else {
                        stale.push((at, id));
                        continue;
                    };
                    let own_window = config
                        .coalesce_window
                        .min(Duration::from_millis(entry.lease.ttl_ms / 6));
                    if at <= now + own_window {
                        picked.push((at, id));
                    }
                }
            }
            let (group, tenant) = match self.due.queues.get(queue) {
                Some(q) => (q.group, q.tenant.clone()),
                None => return,
            };
            self.due.update(queue, |due| {
                for key in picked.iter().chain(&stale) {
                    due.remove(key);
                }
            });
            let mut leases = Vec::with_capacity(picked.len());
            for &(_, id) in &picked {
                if let Some(entry) = self.entries.get_mut(&id) {
                    entry.in_flight = true;
                    leases.push((entry.lease.clone(), entry.loss_at));
                }
            }
            if leases.is_empty() {
                // Only stale ids were due in this queue; they are gone now.
                drop(permit);
                continue;
            }
            tokio::spawn(renew_batch(client.clone(), group, tenant, leases, permit));
        }
    }

    async fn shutdown(&mut self) {
        let Some(client) = self.client() else {
            return;
        };
        let ids: Vec<u64> = self.entries.keys().copied().collect();
        let mut releases = Vec::new();
        for id in ids {
            if let Some(entry) = self.remove(id) {
                if entry.lease.is_held() {
                    releases.push(tokio::spawn(release_in_background(
                        client.clone(),
                        entry.lease.clone(),
                    )));
                }
                entry.lease.mark(LeaseState::Lost(LossReason::ClientClosed));
            }
        }
        for release in releases {
            let _ = release.await;
        }
    }
}

async fn release_in_background(client: Client, lease: Arc<LeaseShared>) {
    let deadline = crate::time::now() + client.config().attempt_timeout;
    let body =
        tenure_proto::client::RequestBody::Lease(LeaseOp::Release(tenure_core::ReleaseRequest {
            key: lease.key.clone(),
            lease_id: lease.lease_id,
            holder_id: lease.holder_id.clone(),
            request_id: client.new_request_id(),
        }));
    let result = client
        .call_until(
            Some(lease.group_id),
            body,
            Default::default(),
            Some(&lease.key.tenant_id),
            deadline,
        )
        .await;
    lease.mark(LeaseState::Released);
    if let Err(error) = result {
        debug!(lease = %lease.lease_id, "background release failed: {error}");
    }
}

/// Renews one batch and reports to the renewer. The batch slot (`permit`) is given back before
/// the report, so the renewer never sees a finished batch still holding its slot.
async fn renew_batch(
    client: Client,
    group: u32,
    tenant: String,
    leases: Vec<(Arc<LeaseShared>, Instant)>,
    permit: tokio::sync::OwnedSemaphorePermit,
) {
    let sent_at = crate::time::now();
    // No point in an answer after the first lease's loss time.
    let deadline = leases
        .iter()
        .map(|(_, loss_at)| *loss_at)
        .min()
        .unwrap_or(sent_at)
        .min(sent_at + client.config().call_timeout)
        .max(sent_at + Duration::from_millis(1));
    let ops = leases
        .iter()
        .map(|(lease, _)| {
            LeaseOp::Renew(RenewRequest {
                key: lease.key.clone(),
                lease_id: lease.lease_id,
                holder_id: lease.holder_id.clone(),
                ttl_ms: lease.ttl_ms,
                request_id: client.new_request_id(),
            })
        })
        .collect();
    client
        .inner
        .counters
        .renew_batches
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let answer = client
        .call_until(
            Some(group),
            tenure_proto::client::RequestBody::Batch { ops },
            Default::default(),
            Some(&tenant),
            deadline,
        )
        .await;
    let outcomes: Vec<(u64, RenewOutcome)> = match answer {
        Ok(tenure_proto::client::ResponseBody::Batch(results)) if results.len() == leases.len() => {
            leases
                .iter()
                .zip(results)
                .map(|((lease, _), result)| {
                    let outcome = match result {
                        Ok(tenure_proto::client::LeaseResult {
                            reply: LeaseReply::Renewed(grant),
                            replayed,
                            replay,
                            ..
                        }) => {
                            client
                                .inner
                                .counters
                                .renewals
                                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            RenewOutcome::Renewed {
                                sent_at,
                                window_ttl_ms: crate::client::replayed_window_ttl_ms(
                                    &grant, replayed, replay,
                                ),
                            }
                        }
                        Ok(_) => RenewOutcome::Retry,
                        Err(error) => {
                            let error = ClientError::from_wire(error);
                            if error.is_lease_gone() {
                                RenewOutcome::Gone(error)
                            } else {
                                RenewOutcome::Retry
                            }
                        }
                    };
                    (lease.id, outcome)
                })
                .collect()
        }
        Ok(_) => leases
            .iter()
            .map(|(l, _)| (l.id, RenewOutcome::Retry))
            .collect(),
        Err(error) => {
            // An error for the whole batch says nothing about any one lease (a batch larger than
            // the group allows, say): retry each soon; a lease whose renewals keep failing
            // reaches its loss time and is reported lost then.
            debug!(group, "renewal batch of {} failed: {error}", leases.len());
            leases
                .iter()
                .map(|(l, _)| (l.id, RenewOutcome::Retry))
                .collect()
        }
    };
    drop(permit);
    let _ = client
        .inner
        .renewer
        .send(RenewerCommand::Done(outcomes))
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn due_queues_order_queues_by_their_most_urgent_lease() {
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        let mut due = DueQueues::default();
        let group_0 = due.queue_of(0, "tenant-a");
        let group_9 = due.queue_of(9, "tenant-a");
        let other_tenant = due.queue_of(0, "tenant-b");
        assert_eq!(due.queue_of(9, "tenant-a"), group_9, "a queue is made once");
        assert_eq!(due.first(), None);
        due.insert(group_0, at(300), 1);
        due.insert(group_0, at(100), 2);
        due.insert(group_9, at(50), 3);
        due.insert(other_tenant, at(200), 4);
        // The most overdue lease decides which batch goes first, not the group's id.
        assert_eq!(due.first(), Some((at(50), group_9)));
        due.remove(group_9, at(50), 3);
        assert_eq!(due.first(), Some((at(100), group_0)));
        due.update(group_0, |queue| {
            queue.remove(&(at(100), 2));
        });
        assert_eq!(due.first(), Some((at(200), other_tenant)));
        due.remove(other_tenant, at(200), 4);
        assert_eq!(due.first(), Some((at(300), group_0)));
        due.remove(group_0, at(300), 1);
        assert_eq!(due.first(), None);
        assert!(due.by_earliest.is_empty());
        // Removing what is not there changes nothing.
        due.remove(group_0, at(300), 1);
        assert_eq!(due.first(), None);
    }
}
