//! The renewer: one task per client that keeps every auto-renewed [`crate::Lease`] alive.
//!
//! Each lease is due for renewal `renew_after_ppm` of its ttl after the send time of its last
//! confirmed acquire or renewal. When the earliest lease is due, every lease due within the
//! coalescing window (at most a sixth of its ttl) is renewed with it: renewals are grouped by
//! (group, tenant) into Batch requests of at most `batch_ops_max` operations, at most
//! `batches_inflight_max` of them in flight. Leases renewed in one batch share a send time, so
//! they stay due together: cohorts only merge, and holding N leases costs about
//! groups x cohorts requests per renewal period instead of N.
//!
//! The renewer also fires each lease's loss signal: when a renewal is refused, or when its safe
//! deadline less the loss-signal lead comes without a confirmed renewal.
//!
//! Must not depend on: connections (it calls the client).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use tenure_core::{LeaseId, LeaseOp, LeaseReply, RenewRequest};
use tokio::sync::{Semaphore, mpsc, oneshot};
use tracing::debug;

use crate::client::{Client, ClientInner};
use crate::error::ClientError;
use crate::lease::{LeaseShared, LeaseState, LossReason};

/// What the renewer is told.
pub(crate) enum RenewerCommand {
    /// Start watching (and, with `auto_renew`, renewing) a lease.
    Register {
        lease: Arc<LeaseShared>,
        auto_renew: bool,
    },
    /// Stop; with `release`, release the lease if it is still held.
    Unregister { id: u64, release: bool },
    /// A renewal batch finished.
    Done(Vec<(u64, RenewOutcome)>),
    /// The lease was released through this client (by any path): every handle of it is
    /// released.
    Released { lease_id: LeaseId },
    /// Release every held lease, then stop.
    Shutdown { done: oneshot::Sender<()> },
}

/// The outcome of one renewal.
pub(crate) enum RenewOutcome {
    /// Renewed; the request was first sent at `sent_at`, and the answer leaves `window_ttl_ms`
    /// to count the safe window from (the ttl, or for a replayed answer what was left of it).
    Renewed {
        sent_at: Instant,
        window_ttl_ms: u64,
    },
    /// The cluster refused it for good.
    Gone(ClientError),
    /// No answer or a retryable error: try again soon.
    Retry,
}

struct Entry {
    lease: Arc<LeaseShared>,
    next_renew_at: Instant,
    loss_at: Instant,
    in_flight: bool,
    failures: u32,
}

struct Renewer {
    weak: Weak<ClientInner>,
    entries: BTreeMap<u64, Entry>,
    /// Handles of each lease (usually one).
    by_lease: BTreeMap<LeaseId, Vec<u64>>,
    due: BTreeSet<(Instant, u64)>,
    deadlines: BTreeSet<(Instant, u64)>,
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
        due: BTreeSet::new(),
        deadlines: BTreeSet::new(),
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
        let due = if self.blocked {
            None
        } else {
            self.due.first().map(|(at, _)| *at)
        };
        match (loss, due) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
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

    fn set_counts(&self) {
        if let Some(inner) = self.weak.upgrade() {
            inner.leases_held.store(
                self.entries.len() as u64,
                std::sync::atomic::Ordering::Relaxed,
            );
        }
    }

    fn remove(&mut self, id: u64) -> Option<Entry> {
        let entry = self.entries.remove(&id)?;
        if let Some(ids) = self.by_lease.get_mut(&entry.lease.lease_id) {
            ids.retain(|other| *other != id);
            if ids.is_empty() {
                self.by_lease.remove(&entry.lease.lease_id);
            }
        }
        self.due.remove(&(entry.next_renew_at, id));
        self.deadlines.remove(&(entry.loss_at, id));
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
                let next_renew_at = sent_at + self.renew_after(&lease, &client);
                let loss_at = self.loss_at(&lease, &client);
                if auto_renew {
                    self.due.insert((next_renew_at, id));
                }
                self.deadlines.insert((loss_at, id));
                self.by_lease.entry(lease.lease_id).or_default().push(id);
                self.entries.insert(
                    id,
                    Entry {
                        lease,
                        next_renew_at,
                        loss_at,
                        in_flight: false,
                        failures: 0,
                    },
                );
                self.set_counts();
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
                entry.next_renew_at = sent_at + self.renew_after(&entry.lease, client);
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
        self.due.insert((entry.next_renew_at, id));
        self.deadlines.insert((entry.loss_at, id));
        self.by_lease
            .entry(entry.lease.lease_id)
            .or_default()
            .push(id);
        self.entries.insert(id, entry);
        self.set_counts();
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
        if self.blocked {
            return;
        }
        let Some(&(first_due, _)) = self.due.first() else {
            return;
        };
        if first_due > now {
            return;
        }
        let Some(client) = self.client() else {
            return;
        };
        let config = &client.config().renew;
        let horizon = now + config.coalesce_window;
        let mut picked: BTreeMap<(u32, String), Vec<u64>> = BTreeMap::new();
        for &(at, id) in self.due.range(..=(horizon, u64::MAX)) {
            let Some(entry) = self.entries.get(&id) else {
                continue;
            };
            let own_window = config
                .coalesce_window
                .min(Duration::from_millis(entry.lease.ttl_ms / 6));
            if at > now + own_window {
                continue;
            }
            picked
                .entry((entry.lease.group_id, entry.lease.key.tenant_id.clone()))
                .or_default()
                .push(id);
        }
        for ((group, tenant), ids) in picked {
            for chunk in ids.chunks(config.batch_ops_max) {
                let Ok(permit) = self.batches.clone().try_acquire_owned() else {
                    // Every batch slot is busy; resume when one finishes.
                    self.blocked = true;
                    return;
                };
                let mut leases = Vec::with_capacity(chunk.len());
                for &id in chunk {
                    if let Some(entry) = self.entries.get_mut(&id) {
                        self.due.remove(&(entry.next_renew_at, id));
                        entry.in_flight = true;
                        leases.push((entry.lease.clone(), entry.loss_at));
                    }
                }
                let batch_client = client.clone();
                let tenant = tenant.clone();
                tokio::spawn(renew_batch(batch_client, group, tenant, leases, permit));
            }
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
    let body = tenure_proto::client::RequestBody::Release(tenure_core::ReleaseRequest {
        key: lease.key.clone(),
        lease_id: lease.lease_id,
        holder_id: lease.holder_id.clone(),
        request_id: client.new_request_id(),
    });
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
