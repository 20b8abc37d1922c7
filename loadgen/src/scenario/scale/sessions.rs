//! The scale run's sessions, kept alive by the load generator itself so that its memory does not
//! grow with the leases: a [`SessionSet`] knows only its sessions' ids and the (tenant, group)
//! records they have, never the leases bound to them (the client library's [`tenure_client::Session`]
//! keeps every lease it acquired, a few hundred bytes each, which at ten million leases is
//! gigabytes of load generator). Records are opened, kept alive and ended with `Batch` requests
//! of at most [`OPS_PER_BATCH`] operations of one (tenant, group), every record of the set at once
//! per round, one round per third of the ttl; each keep-alive's answer says how many leases are
//! bound to its record, which is how the run counts the session leases it holds.
//!
//! Must not depend on: any server crate; only the client library and the core's plain operation
//! types (`tenure_core::LeaseOp`), as any client building its own batches would.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tenure_client::{Client, ClientError, SessionId};
use tenure_core::{GroupId, LeaseOp, LeaseReply, SessionOpenRequest, SessionRequest};

/// Operations in one Batch request at most (the proposer's default entry size).
pub(super) const OPS_PER_BATCH: usize = 256;
/// Batch requests of one set in flight at once.
const BATCHES_INFLIGHT: usize = 16;
/// Pause before a failed Batch (every attempt of the client's own retries used up) is sent again.
const RETRY_PAUSE: Duration = Duration::from_millis(250);
/// Bound of one Batch call, its retries included.
const BATCH_TIMEOUT: Duration = Duration::from_secs(10);

/// The records of one (tenant, group) a Batch carries.
#[derive(Debug, Clone)]
struct Chunk {
    tenant: usize,
    group: u32,
    sessions: Vec<SessionId>,
}

/// What the keep-alives saw, shared with the reports.
#[derive(Debug, Default, Clone)]
pub(super) struct KeepAliveStats {
    /// Keep-alive Batch requests sent (the client's own retries not counted).
    pub batches: u64,
    /// Keep-alives confirmed.
    pub confirmed: u64,
    /// Keep-alives refused, by code.
    pub refused: BTreeMap<String, u64>,
    /// Rounds completed.
    pub rounds: u64,
    /// Chunks of records not confirmed within their round (retried until the next).
    pub late_chunks: u64,
    /// Leases bound to the records, summed over the last completed round's answers.
    pub last_round_bound_leases: u64,
    /// Records confirmed in the last completed round.
    pub last_round_records: u64,
}

/// A set of sessions of one ttl and owner, spread over tenants, with a record in every group.
pub(super) struct SessionSet {
    name: &'static str,
    ttl: Duration,
    owner: String,
    tenants: Vec<String>,
    ids: Vec<SessionId>,
    chunks: Vec<Chunk>,
    stats: Arc<Mutex<KeepAliveStats>>,
}

/// The keep-alive loop of a set; stopped by [`Keeper::stop`] (or aborted when dropped).
pub(super) struct Keeper {
    stop: Arc<AtomicBool>,
    wake: Arc<tokio::sync::Notify>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Drop for Keeper {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

impl Keeper {
    /// Stops the loop: no keep-alive is sent after this returns (one in flight is answered or
    /// abandoned first, within a second).
    pub(super) async fn stop(mut self) {
        self.stop.store(true, Ordering::Release);
        self.wake.notify_one();
        if let Some(mut task) = self.task.take()
            && tokio::time::timeout(Duration::from_secs(1), &mut task)
                .await
                .is_err()
        {
            task.abort();
            let _ = task.await;
        }
    }
}

/// When one last keep-alive was sent to every record of a set, and what came back.
#[derive(Debug, Clone)]
pub(super) struct EndWindow {
    /// The first of them was sent.
    pub earliest: Instant,
    /// The last answer arrived.
    pub latest: Instant,
    /// Records whose keep-alive was refused or not answered.
    pub refused: u64,
    /// Leases bound to the records, from the answers.
    pub bound_leases: u64,
    /// Some of the refusals.
    pub errors: Vec<String>,
}

/// The outcome of one Batch of one chunk: records confirmed, leases bound to them, refusals.
struct ChunkOutcome {
    confirmed: u64,
    bound: u64,
    refused: Vec<String>,
}

impl SessionSet {
    /// A set of `sessions` sessions (session `j` of tenant `tenants[j % tenants.len()]`), each
    /// with a record in every one of `groups` groups. Nothing is sent.
    pub(super) fn new(
        name: &'static str,
        tag: u32,
        code: u8,
        tenants: Vec<String>,
        sessions: u64,
        groups: u32,
        ttl: Duration,
    ) -> Self {
        let ids: Vec<SessionId> = (0..sessions)
            .map(|j| {
                SessionId((u128::from(tag) << 64) | (u128::from(code) << 48) | u128::from(j + 1))
            })
            .collect();
        let mut chunks = Vec::new();
        let tenant_count = tenants.len().max(1);
        for tenant in 0..tenants.len() {
            let mine: Vec<SessionId> = ids
                .iter()
                .enumerate()
                .filter(|(j, _)| j % tenant_count == tenant)
                .map(|(_, id)| *id)
                .collect();
            for group in 0..groups {
                for part in mine.chunks(OPS_PER_BATCH) {
                    chunks.push(Chunk {
                        tenant,
                        group,
                        sessions: part.to_vec(),
                    });
                }
            }
        }
        SessionSet {
            name,
            ttl,
            owner: format!("lg{tag:08x}"),
            tenants,
            ids,
            chunks,
            stats: Arc::new(Mutex::new(KeepAliveStats::default())),
        }
    }

    /// The owner of every session of the set (the holder of its leases).
    pub(super) fn owner(&self) -> &str {
        &self.owner
    }

    /// Session `j` and its tenant.
    pub(super) fn session(&self, j: u64) -> Option<(SessionId, &str)> {
        let index = usize::try_from(j).ok()?;
        let id = *self.ids.get(index)?;
        let tenant = self.tenants.get(index % self.tenants.len().max(1))?;
        Some((id, tenant.as_str()))
    }

    /// (session, group) records of the set.
    pub(super) fn records(&self) -> u64 {
        self.chunks
            .iter()
            .map(|chunk| chunk.sessions.len() as u64)
            .sum()
    }

    /// What the keep-alives saw so far.
    pub(super) fn stats(&self) -> KeepAliveStats {
        self.stats
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Opens every record (SessionOpen, batched), retrying a failed Batch until `deadline`;
    /// returns (records opened, refusals by code).
    pub(super) async fn open(
        &self,
        client: &Client,
        deadline: Instant,
    ) -> (u64, BTreeMap<String, u64>) {
        let ttl_ms = u64::try_from(self.ttl.as_millis()).unwrap_or(u64::MAX);
        let outcomes = self
            .send_all(
                client,
                deadline,
                BATCHES_INFLIGHT,
                move |tenant, group, session_id, owner| {
                    LeaseOp::SessionOpen(SessionOpenRequest {
                        tenant_id: tenant.to_owned(),
                        group_id: GroupId(group),
                        session_id,
                        owner_id: owner.to_owned(),
                        ttl_ms,
                    })
                },
            )
            .await;
        let mut opened = 0;
        let mut refused = BTreeMap::new();
        for outcome in outcomes {
            opened += outcome.confirmed;
            for code in outcome.refused {
                *refused.entry(code).or_insert(0) += 1;
            }
        }
        (opened, refused)
    }

    /// Starts keeping every record alive: one round of keep-alives per third of the ttl, the
    /// first a third of the ttl from now.
    pub(super) fn keep_alive(self: &Arc<Self>, client: &Client) -> Keeper {
        let stop = Arc::new(AtomicBool::new(false));
        let wake = Arc::new(tokio::sync::Notify::new());
        let set = self.clone();
        let client = client.clone();
        let task = tokio::spawn({
            let (stop, wake) = (stop.clone(), wake.clone());
            async move {
                let period = set.ttl / 3;
                let mut next = Instant::now() + period;
                loop {
                    tokio::select! {
                        () = tokio::time::sleep_until(next.into()) => {}
                        () = wake.notified() => {}
                    }
                    if stop.load(Ordering::Acquire) {
                        return;
                    }
                    let round_end = next + period;
                    let outcomes = set
                        .send_all(&client, round_end, BATCHES_INFLIGHT, keepalive_op)
                        .await;
                    let mut stats = set.stats.lock().unwrap_or_else(PoisonError::into_inner);
                    stats.rounds += 1;
                    stats.last_round_bound_leases = outcomes.iter().map(|o| o.bound).sum();
                    stats.last_round_records = outcomes.iter().map(|o| o.confirmed).sum();
                    for outcome in &outcomes {
                        stats.confirmed += outcome.confirmed;
                        for code in &outcome.refused {
                            *stats.refused.entry(code.clone()).or_insert(0) += 1;
                        }
                    }
                    drop(stats);
                    next = round_end;
                    if Instant::now() >= next {
                        // A round that took longer than its period: the next starts at once.
                        next = Instant::now();
                    }
                }
            }
        });
        Keeper {
            stop,
            wake,
            task: Some(task),
        }
    }

    /// Sends one keep-alive to every record at the same moment (the keep-alive loop must be
    /// stopped first): every record then expires one ttl after its keep-alive was applied.
    pub(super) async fn last_keepalive(&self, client: &Client, deadline: Instant) -> EndWindow {
        let earliest = Instant::now();
        let all_at_once = self.chunks.len().max(1);
        let outcomes = self
            .send_all(client, deadline, all_at_once, keepalive_op)
            .await;
        let mut window = EndWindow {
            earliest,
            latest: Instant::now(),
            refused: 0,
            bound_leases: 0,
            errors: Vec::new(),
        };
        for outcome in outcomes {
            window.bound_leases += outcome.bound;
            window.refused += outcome.refused.len() as u64;
            for code in outcome.refused {
                if window.errors.len() < 10 {
                    window.errors.push(code);
                }
            }
        }
        window
    }

    /// Sends `op` for every record, one Batch per chunk, `inflight` Batches at once; a Batch that fails whole is sent
    /// again after [`RETRY_PAUSE`] until `deadline`. Records of a chunk never answered count as
    /// refused (`UNANSWERED`).
    async fn send_all<F>(
        &self,
        client: &Client,
        deadline: Instant,
        inflight: usize,
        op: F,
    ) -> Vec<ChunkOutcome>
    where
        F: Fn(&str, u32, SessionId, &str) -> LeaseOp + Send + Sync + Clone + 'static,
    {
        let semaphore = Arc::new(tokio::sync::Semaphore::new(inflight.max(1)));
        let mut calls = tokio::task::JoinSet::new();
        for chunk in &self.chunks {
            let ops: Vec<LeaseOp> = chunk
                .sessions
                .iter()
                .map(|&session_id| {
                    op(
                        &self.tenants[chunk.tenant],
                        chunk.group,
                        session_id,
                        &self.owner,
                    )
                })
                .collect();
            let (client, semaphore, stats) =
                (client.clone(), semaphore.clone(), self.stats.clone());
            let records = chunk.sessions.len();
            calls.spawn(async move {
                let Ok(_permit) = semaphore.acquire_owned().await else {
                    return unanswered(records);
                };
                loop {
                    stats.lock().unwrap_or_else(PoisonError::into_inner).batches += 1;
                    let answer = tokio::time::timeout(BATCH_TIMEOUT, client.batch(ops.clone()))
                        .await
                        .unwrap_or_else(|_| {
                            Err(ClientError::InvalidRequest("the batch timed out".into()))
                        });
                    if let Ok(results) = answer {
                        return outcome_of(results);
                    }
                    if Instant::now() + RETRY_PAUSE >= deadline {
                        stats
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .late_chunks += 1;
                        return unanswered(records);
                    }
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
            });
        }
        let mut outcomes = Vec::with_capacity(self.chunks.len());
        while let Some(joined) = calls.join_next().await {
            if let Ok(outcome) = joined {
                outcomes.push(outcome);
            }
        }
        outcomes
    }

    /// The set's figures for the report.
    pub(super) fn figures(&self) -> Value {
        let stats = self.stats();
        json!({
            "name": self.name,
            "sessions": self.ids.len(),
            "tenants": self.tenants.len(),
            "records": self.records(),
            "ttl_ms": u64::try_from(self.ttl.as_millis()).unwrap_or(u64::MAX),
            "keepalive_batches": stats.batches,
            "keepalives_confirmed": stats.confirmed,
            "keepalives_refused": stats.refused,
            "keepalive_rounds": stats.rounds,
            "late_chunks": stats.late_chunks,
            "last_round_bound_leases": stats.last_round_bound_leases,
            "last_round_records": stats.last_round_records,
        })
    }
}

fn keepalive_op(tenant: &str, group: u32, session_id: SessionId, owner: &str) -> LeaseOp {
    LeaseOp::SessionKeepAlive(SessionRequest {
        tenant_id: tenant.to_owned(),
        group_id: GroupId(group),
        session_id,
        owner_id: owner.to_owned(),
    })
}

fn unanswered(records: usize) -> ChunkOutcome {
    ChunkOutcome {
        confirmed: 0,
        bound: 0,
        refused: vec!["UNANSWERED".to_owned(); records],
    }
}

fn outcome_of(results: Vec<Result<tenure_client::LeaseResult, ClientError>>) -> ChunkOutcome {
    let mut outcome = ChunkOutcome {
        confirmed: 0,
        bound: 0,
        refused: Vec::new(),
    };
    for result in results {
        match result {
            Ok(result) => match result.reply {
                LeaseReply::SessionKept(grant) => {
                    outcome.confirmed += 1;
                    outcome.bound += grant.bound_leases;
                }
                _ => outcome.refused.push("UNEXPECTED_REPLY".to_owned()),
            },
            Err(error) => outcome.refused.push(error.code_str().to_owned()),
        }
    }
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_spread_over_tenants_and_chunks_stay_in_one_tenant_and_group() {
        let tenants = vec!["a".to_owned(), "b".to_owned()];
        let set = SessionSet::new("main", 7, b's', tenants, 600, 4, Duration::from_secs(30));
        // 300 sessions per tenant in 4 groups: chunks of 256 and 44.
        assert_eq!(set.records(), 600 * 4);
        assert_eq!(set.chunks.len(), 2 * 4 * 2);
        assert!(set.chunks.iter().all(|c| c.sessions.len() <= OPS_PER_BATCH));
        let (first, tenant) = set.session(0).unwrap();
        assert_eq!(tenant, "a");
        assert_eq!(set.session(1).unwrap().1, "b");
        assert!(set.session(600).is_none());
        // Ids are distinct, and distinct from another set's of the same run.
        let other = SessionSet::new("storm", 7, b'e', vec!["c".into()], 600, 4, set.ttl);
        assert_ne!(other.session(0).unwrap().0, first);
        let mut ids: Vec<_> = set.ids.clone();
        ids.sort_unstable_by_key(|id| id.0);
        ids.dedup();
        assert_eq!(ids.len(), 600);
        // A chunk names only its tenant's sessions.
        for chunk in &set.chunks {
            for id in &chunk.sessions {
                let j = set.ids.iter().position(|x| x == id).unwrap();
                assert_eq!(j % 2, chunk.tenant);
            }
        }
    }
}
